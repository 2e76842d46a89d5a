"""The cost of one decode step on a GPU, plain and speculative, from the models' facts.

A step is one or two passes (the draft's, then the target's verify of K+1 tokens per sequence; a plain step
is the target's pass over one token per sequence). Each pass reads bytes (weights at their stored width,
the experts its tokens route to, the KV cache at the context length, linear-attention state, the lm_head)
and does FLOPs (2 per active weight per token, attention over the context); it takes the longer of
bytes / effective bandwidth and FLOPs / effective peak, plus its tensor-parallel all-reduces. The step
adds the engine's fixed cost (scheduling, launches, sampling; the speculative step's rejection and
bookkeeping on top), and the expected cost of admissions: in a closed loop of `batch` sequences each
`output_len` tokens long, a step admits on average a = batch x t / output_len new requests (t: tokens a step
commits per sequence, 1 plain, tau speculative); arriving at random, several sharing one step, a step is "mixed"
(the new requests' prefill beside the running decodes) with probability 1 - exp(-a), and a mixed step costs the
engine's admission constant more (it leaves the uniform-batch CUDA graph, vllm#45237); and each admitted request
runs its own prefill (prefill_pass: its prompt's tokens through the target), a x that pass's time per step. A
request's first token comes from its prefill, so its decode steps commit at most output_len - 1 tokens: a step commits
per sequence at most what a request has left (committed_per_step). The effective rates and
fixed costs are an engine's calibrated constants (calibration.py), the peaks the GPU table's (gpus.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from dflash_convert.predict.facts import ModelFacts
from dflash_convert.predict.gpus import GPU

# One small all-reduce on NVLink-class links, as measured alone: sglang#2904's H100 table puts vLLM's and SGLang's
# custom all-reduce kernels at 5.7 to 11.8 us for 4-32 KB messages at TP 2 to 8 (docs/performance.md)
ALLREDUCE_LATENCY_S = 8e-6
ACTIVATION_BYTES = 2  # bf16 activations crossing an all-reduce


@dataclass(frozen=True)
class EngineConstants:
    """What an engine reaches of a GPU's datasheet and what a step costs it regardless of size."""

    bandwidth_efficiency: float  # of the datasheet memory bandwidth
    compute_efficiency: float  # of the datasheet dense peak
    fixed_step_s: float  # every step: scheduling, launch, sampling
    speculative_step_s: float  # a speculative step on top: the draft's launch, rejection, bookkeeping
    # a plain step that admits a request costs this more, beyond the admitted prefills themselves (prefill_pass): the
    # mixed step leaving the uniform-batch CUDA graph, the scheduler's work
    admission_s: float = 0.0
    speculative_admission_s: float = 0.0  # the same for a speculative step
    # each all-reduce of a TP > 1 pass costs this on top of ALLREDUCE_LATENCY_S and its bytes: what the TP cases
    # leave unexplained per all-reduce (the GPUs waiting on each other, the engine's TP overheads), fitted
    allreduce_extra_s: float = 0.0


def mixed_share(admitted: float) -> float:
    """The probability that a step admits at least one request when it admits `admitted` on average, arrivals at
    random (Poisson): 1 - exp(-a). Several admissions in one step share it, so this never passes 1."""
    return 1.0 - math.exp(-admitted)


def committed_per_step(tau: float, output_len: float | None) -> float:
    """The tokens a step commits per sequence: tau, capped at what a request has left to decode. A request's first
    token comes from its prefill, so its decode steps commit at most output_len - 1 tokens; a step commits at least
    one (the target's own). So min(tau, max(1, output_len - 1)): an output of 1 or 2 tokens gains nothing from
    speculation, and tau counts in full only where output_len >= tau + 1. No output length (a pass alone): tau."""
    if not output_len:
        return tau
    return min(tau, max(1.0, output_len - 1.0))


def admission_cost(constants: EngineConstants, *, batch: int, output_len: float | None, tokens_per_step: float,
                   speculative: bool, prefill_s: float = 0.0) -> float:
    """The expected seconds a step spends on admissions: it admits a = batch x tokens_per_step / output_len requests
    on average; mixed_share(a) times the engine's admission constant (per mixed step), plus a x `prefill_s` (each
    admitted request runs its own prefill, prefill_pass). No output length (a pass measured alone, no requests
    arriving): none."""
    if not output_len:
        return 0.0
    extra = constants.speculative_admission_s if speculative else constants.admission_s
    admitted = batch * tokens_per_step / output_len
    return mixed_share(admitted) * extra + admitted * prefill_s


@dataclass(frozen=True)
class Pass:
    """One forward pass: the bytes it reads by term, its FLOPs, its all-reduce time and its resulting time."""

    bytes_by_term: dict[str, float]
    flops: float
    allreduce_s: float
    memory_s: float
    compute_s: float

    @property
    def seconds(self) -> float:
        return max(self.memory_s, self.compute_s) + self.allreduce_s


@dataclass(frozen=True)
class Step:
    passes: tuple[Pass, ...]
    fixed_s: float
    admissions_s: float = 0.0  # the expected cost of the requests a step admits (admission_cost)

    @property
    def seconds(self) -> float:
        return sum(p.seconds for p in self.passes) + self.fixed_s + self.admissions_s

    @property
    def bound(self) -> str:
        """Which term the step's time is mostly: compute (a pass over its byte time), a byte term, all-reduce,
        the engine's fixed cost or admissions."""
        shares: dict[str, float] = {"fixed cost": self.fixed_s, "admissions": self.admissions_s}
        for p in self.passes:
            shares["all-reduce"] = shares.get("all-reduce", 0.0) + p.allreduce_s
            if p.compute_s > p.memory_s:
                shares["compute"] = shares.get("compute", 0.0) + p.compute_s
                continue
            total = sum(p.bytes_by_term.values()) or 1.0
            for term, b in p.bytes_by_term.items():
                shares[term] = shares.get(term, 0.0) + p.memory_s * b / total
        return max(shares, key=shares.get)


def _pass(bytes_by_term: dict[str, float], flops: float, *, gpu: GPU, compute: str, constants: EngineConstants,
          tp: int, tokens: int, hidden: int, layers: int, attention_flops: float = 0.0) -> Pass:
    """`flops`: the weights' matmuls, at `compute`'s peak; `attention_flops`: attention over the bf16 KV cache, at
    the bf16 peak whatever the weights' type (a w8a8 checkpoint's fp8 is its linear layers')."""
    memory_s = sum(bytes_by_term.values()) / tp / (gpu.memory_bandwidth_gbps * 1e9 * constants.bandwidth_efficiency)
    compute_s = (flops / gpu.peak_tflops(compute) + attention_flops / gpu.peak_tflops("bf16")) / tp / (
        1e12 * constants.compute_efficiency)
    flops += attention_flops
    allreduce_s = 0.0
    if tp > 1:  # two per layer (after attention, after the MLP), a ring's 2 (tp-1)/tp of the message each
        message = tokens * hidden * ACTIVATION_BYTES
        allreduce_s = 2 * layers * (ALLREDUCE_LATENCY_S + constants.allreduce_extra_s
                                    + 2 * (tp - 1) / tp * message / (gpu.link_gbps * 1e9))
    return Pass(bytes_by_term, flops, allreduce_s, memory_s, compute_s)


def attention_context(m: ModelFacts, context: float) -> float:
    """Positions one token attends over, summed over the layers (sliding layers see at most their window)."""
    full = m.full_layers - m.sliding_layers
    return full * context + m.sliding_layers * min(context, m.sliding_window or context)


def target_pass(m: ModelFacts, *, batch: int, tokens_per_seq: int, context: float, gpu: GPU,
                constants: EngineConstants, tp: int) -> Pass:
    """The target's forward over `tokens_per_seq` tokens of each of `batch` sequences at `context` cached."""
    n = batch * tokens_per_seq
    cached = attention_context(m, context)
    terms = {
        "weights": m.dense_params * m.weight_bytes,
        "experts": m.moe_layers * m.distinct_experts(n) * m.expert_params * m.expert_weight_bytes,
        # the KV cache read once per sequence per step; linear-attention state read, and written per verified
        # token (the engines keep each position's state so that a rejection can roll back to it). Scaled so that,
        # divided by TP, it is what one GPU reads: a cache not split over all TP GPUs (MLA's latent, KV heads fewer
        # than TP) is read whole on each of the GPUs it is copied to
        "KV cache": batch * (cached * m.kv_bytes_per_token * tp / m.kv_shards(tp)
                             + m.linear_layers * m.linear_state_bytes * (1 + tokens_per_seq) * tp / m.state_shards(tp)),
        "lm_head": m.vocab * m.hidden * 2.0,  # lm_heads are kept in bf16 by the quantization schemes read here
    }
    active = m.dense_params + m.moe_layers * m.top_k * m.expert_params + m.vocab * m.hidden
    attention = n * cached * m.attention_flops_per_position
    return _pass(terms, 2 * n * active, gpu=gpu, compute=m.compute, constants=constants, tp=tp,
                 tokens=n, hidden=m.hidden, layers=m.layers, attention_flops=attention)


def prefill_pass(m: ModelFacts, *, input_len: int, gpu: GPU, constants: EngineConstants, tp: int) -> Pass:
    """One admitted request's prefill: the target's pass over its `input_len` prompt tokens (each attending over
    input_len / 2 positions on average), the weights and the experts they route to read, their KV written, the
    linear-attention state written once (a prefill keeps no per-position state), the logits of the last token
    only. The longer of its bytes and its FLOPs, as any pass."""
    n = input_len
    attended = attention_context(m, input_len / 2)
    terms = {
        "weights": m.dense_params * m.weight_bytes,
        "experts": m.moe_layers * m.distinct_experts(n) * m.expert_params * m.expert_weight_bytes,
        "KV cache": n * m.kv_bytes_per_token * tp / m.kv_shards(tp)
        + m.linear_layers * m.linear_state_bytes * tp / m.state_shards(tp),
        "lm_head": m.vocab * m.hidden * 2.0,
    }
    active = m.dense_params + m.moe_layers * m.top_k * m.expert_params
    return _pass(terms, 2 * n * active + 2 * m.vocab * m.hidden, gpu=gpu, compute=m.compute, constants=constants,
                 tp=tp, tokens=n, hidden=m.hidden, layers=m.layers,
                 attention_flops=n * attended * m.attention_flops_per_position)


def _prefill_s(m: ModelFacts, input_len: int, gpu: GPU, constants: EngineConstants, tp: int) -> float:
    return prefill_pass(m, input_len=input_len, gpu=gpu, constants=constants, tp=tp).seconds if input_len else 0.0


def draft_pass(d: ModelFacts, target: ModelFacts, *, batch: int, k: int, tau: float, context: float, gpu: GPU,
               constants: EngineConstants, tp: int) -> Pass:
    """The draft's forward over its block of K+1 slots per sequence, its context cache at `context`, the target
    features of the tau tokens the last step committed, and the logits of its K proposals."""
    n = batch * (k + 1)
    rows = d.lm_head_rows or target.vocab
    terms = {
        "draft": d.dense_params * d.weight_bytes + rows * target.hidden * 2.0
        + batch * tau * d.context_features * ACTIVATION_BYTES,
        "KV cache": batch * attention_context(d, context) * d.kv_bytes_per_token * tp / d.kv_shards(tp),
    }
    flops = 2 * n * d.dense_params + 2 * batch * k * rows * target.hidden
    return _pass(terms, flops, gpu=gpu, compute=d.compute, constants=constants, tp=tp, tokens=n, hidden=d.hidden,
                 layers=d.layers, attention_flops=n * attention_context(d, context) * d.attention_flops_per_position)


def plain_step(m: ModelFacts, *, batch: int, context: float, gpu: GPU, constants: EngineConstants,
               tp: int = 1, output_len: float | None = None, input_len: int = 0) -> Step:
    """`output_len`: each request's output tokens, for the admissions (none counted without it); `input_len`: its
    prompt tokens, the prefill each admission runs (none without it)."""
    return Step((target_pass(m, batch=batch, tokens_per_seq=1, context=context, gpu=gpu, constants=constants,
                             tp=tp),), constants.fixed_step_s,
                admission_cost(constants, batch=batch, output_len=output_len, tokens_per_step=1, speculative=False,
                               prefill_s=_prefill_s(m, input_len, gpu, constants, tp)))


def speculative_step(m: ModelFacts, d: ModelFacts, *, batch: int, k: int, tau: float, context: float, gpu: GPU,
                     constants: EngineConstants, tp: int = 1, output_len: float | None = None,
                     input_len: int = 0) -> Step:
    """A step commits tau tokens per sequence (committed_per_step: at most what a request has left), so it meets
    that many times a plain step's admissions."""
    return Step((draft_pass(d, m, batch=batch, k=k, tau=tau, context=context, gpu=gpu, constants=constants, tp=tp),
                 target_pass(m, batch=batch, tokens_per_seq=k + 1, context=context, gpu=gpu, constants=constants,
                             tp=tp)),
                constants.fixed_step_s + constants.speculative_step_s,
                admission_cost(constants, batch=batch, output_len=output_len,
                               tokens_per_step=committed_per_step(tau, output_len), speculative=True,
                               prefill_s=_prefill_s(m, input_len, gpu, constants, tp)))
