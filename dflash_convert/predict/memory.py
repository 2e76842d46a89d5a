"""Does the deployment fit on the GPU? The memory one GPU of a tensor-parallel group holds, from the facts.

What a serving engine keeps resident per GPU: the target's weights at their stored width, the draft's weights
(its layers, its projection of the target's features, its own lm_head rows; it reads the target's embedding and
lm_head), and the KV cache of `concurrency` sequences at their full length (input + output), the target's and
the draft's, weights divided by the tensor-parallel size, caches split as the engine splits them (an MLA latent
whole on every GPU, KV heads fewer than the TP size copied), and, speculating K tokens, a hybrid target's K more
linear-attention state slots per sequence. It is a lower bound: activations, CUDA graphs and the engine's own
buffers come on top, which is why the engines leave headroom (`USABLE_FRACTION`). A deployment whose lower bound
exceeds the usable memory does not fit; one under it may still not, by the engine's own margins.
"""

from __future__ import annotations

from dataclasses import dataclass

from dflash_convert.predict.cost import ACTIVATION_BYTES, attention_context
from dflash_convert.predict.facts import ModelFacts
from dflash_convert.predict.gpus import GPU

# The share of a GPU's memory an engine fills with weights and cache: vLLM's gpu_memory_utilization defaults to
# 0.9, the rest left to activations and the CUDA context. SGLang picks its own share (mem_fraction_static) from
# the GPU and the TP size; the same 0.9 stands for it here.
USABLE_FRACTION = 0.9
GB = 1e9  # what is needed is printed in 10^9 bytes; a GPU's nominal GB are GiB (gpus.NOMINAL_GB_BYTES)


def target_weight_bytes(m: ModelFacts) -> float:
    """Every weight the target stores: the decoder (all its experts), the embedding, the lm_head unless tied."""
    experts = m.moe_layers * m.experts * m.expert_params * m.expert_weight_bytes
    embedding = m.vocab * m.hidden * ACTIVATION_BYTES  # embeddings and lm_heads are kept in bf16
    return m.dense_params * m.weight_bytes + experts + embedding * (1 if m.tied_embeddings else 2)


def draft_weight_bytes(d: ModelFacts, target: ModelFacts) -> float:
    """The draft's own weights: its layers and feature projection, and its lm_head rows when it has its own."""
    return d.dense_params * d.weight_bytes + d.lm_head_rows * target.hidden * ACTIVATION_BYTES


def cache_bytes(m: ModelFacts, *, batch: int, tokens: int, tp: int = 1) -> float:
    """What one of `tp` GPUs holds of the KV cache of `batch` sequences of `tokens` positions (sliding layers at
    most their window; split over at most `kv_shards` GPUs: an MLA latent whole on each) and of one
    linear-attention state per sequence and layer."""
    return batch * (attention_context(m, tokens) * m.kv_bytes_per_token / m.kv_shards(tp)
                    + m.linear_layers * m.linear_state_bytes / m.state_shards(tp))


def speculative_state_bytes(m: ModelFacts, *, batch: int, k: int, tp: int = 1) -> float:
    """The linear-attention state slots a speculating engine keeps on top of each sequence's one: vLLM holds K+1
    per request (the state after each verified token, so that a rejection rolls back to it; docs/performance.md),
    so K more per sequence and layer, on one of `tp` GPUs."""
    return batch * k * m.linear_layers * m.linear_state_bytes / m.state_shards(tp)


@dataclass(frozen=True)
class MemoryNeed:
    """Bytes one GPU holds, by part, against what it has."""

    target_weights: float
    draft_weights: float
    target_cache: float
    draft_cache: float
    gpu_bytes: float  # 0: the GPU's memory is not known (a --gpu-spec without mem=)
    speculative_states: float = 0.0  # a hybrid target's K more linear-attention state slots per sequence

    @property
    def plain(self) -> float:
        return self.target_weights + self.target_cache

    @property
    def speculative(self) -> float:
        return self.plain + self.draft_weights + self.draft_cache + self.speculative_states

    @property
    def usable(self) -> float:
        return self.gpu_bytes * USABLE_FRACTION

    def fits(self, need: float) -> bool | None:
        return None if not self.gpu_bytes else need <= self.usable

    def refusal(self, need: float) -> str:
        """The verdict where `need` does not fit."""
        return (f"does not fit: needs {need / GB:.1f} GB per GPU, has {self.usable / GB:.1f} "
                f"({USABLE_FRACTION:.0%} of {self.gpu_bytes / GB:.1f} GB: the nominal GB as GiB)")


def memory_need(target: ModelFacts, draft: ModelFacts, gpu: GPU, *, batch: int, tokens: int,
                tp: int = 1, k: int = 0) -> MemoryNeed:
    """What one of `tp` GPUs holds serving `batch` sequences of `tokens` positions (input + output), speculating
    `k` tokens a step (it sets the state slots a hybrid target keeps; 0: none beyond the plain deployment's)."""
    return MemoryNeed(target_weights=target_weight_bytes(target) / tp, draft_weights=draft_weight_bytes(draft, target)
                      / tp, target_cache=cache_bytes(target, batch=batch, tokens=tokens, tp=tp),
                      draft_cache=cache_bytes(draft, batch=batch, tokens=tokens, tp=tp), gpu_bytes=gpu.memory_bytes,
                      speculative_states=speculative_state_bytes(target, batch=batch, k=k, tp=tp))
