"""The DFlash draft in plain PyTorch (docs/formats.md sections 1 and 5), over its context cache, with its kind's head.

Data flow of one step, batch 1 (H draft hidden, A*Ht context width, B block, P proposing slots, V target vocab):
    features [T, A*Ht] --fc, hidden_norm--> ctx [T, H] --k/v per layer, RoPE--> context K/V cache
    [anchor, MASK * (B-1)] --target embedding--> x [B, H] --layers (attend to cache + block)-->
    norm --target lm_head (or own pruned lm_head scattered through d2t)--> logits [P, V] --head--> ids [P]
Only context K/V are kept between steps; block K/V are recomputed each step. The step's math is step.py's; the
draft holds the weights, the cache and the compiled step functions, and runs them.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from dflash_convert.errors import DFlashError
from dflash_convert.format import catalogue
from dflash_convert.format.configs import DraftSpec

from . import heads
from .attention import BACKENDS, select_backend
from .context_cache import ContextCache
from .rope import LengthRope, rope_inv_freq
from .step import STEP_FUNCTIONS, DraftLayer, block_forward, block_logits, write_context


class DFlashDraft:
    """A loaded draft, attending with one backend, over its context cache (`cache`, a ContextCache).

    compile=True runs the decode step (`propose`) and small context additions through
    torch.compile'd plain functions (`draft_step`, `draft_step_walk`, `write_context`) with fixed shapes per block
    size, so one graph serves every step; on CUDA with mode "reduce-overhead" (CUDA graphs).
    `with_backend` gives the same draft with another backend: built over the same weights and the
    same cache (`cache=`), which both then read and write."""

    def __init__(self, spec: DraftSpec, tensors: dict[str, torch.Tensor], *, layer_causal: list[bool], backend: str,
                 device, dtype: torch.dtype, compile: bool = False, window_per_query: bool = False,
                 mask_embedding: torch.Tensor | None = None, cache: ContextCache | None = None):
        self.spec = spec
        self.tensors = tensors  # by stored name, on device in dtype: what the fields below point into
        # a trained mask embedding [H] (mask_embedding.pt): mask slots get it instead of the target's row of
        # mask_token_id, as vLLM and SGLang serve such a draft
        self.mask_embedding = None if mask_embedding is None else mask_embedding.to(device=device, dtype=dtype)
        # Sliding layers: the trained window is anchor-relative (every slot sees positions >= anchor - W);
        # serving engines give each query the W keys ending at it (validate --engine runs that).
        self.window_per_query = window_per_query
        self.layer_causal = list(layer_causal)
        self.backend = backend
        self.device = torch.device(device)
        self.dtype = dtype
        self.block_size = spec.block_size  # the trained block: what a run uses unless it asks for another (run_block)
        self.mask_token_id = spec.mask_token_id
        self.target_layer_ids = list(spec.target_layer_ids)
        self.eps = spec.rms_norm_eps
        self.n_heads, self.n_kv, self.head_dim = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.scale = self.head_dim ** -0.5
        self._attend = BACKENDS[backend].fn
        if spec.hidden_act == "silu":  # Qwen3's; importing transformers.activations costs seconds
            self.act = F.silu
        else:
            from transformers.activations import ACT2FN

            self.act = ACT2FN[spec.hidden_act]
        name = catalogue.name  # tensor names by catalogue key
        self.fc = tensors[name("fc")]  # [H, A*Ht]
        self.hidden_norm = tensors[name("hidden_norm")]  # [H]
        self.norm = tensors[name("norm")]  # [H]
        self.layers = _layers(spec, tensors, self.layer_causal)
        # Pruned vocab: own lm_head [Vd, H] and the draft -> target id map built from d2t.
        self.lm_head = tensors.get(name("lm_head")) if spec.is_pruned_vocab else None
        self.draft_to_target = None
        if self.lm_head is not None:
            ids = catalogue.d2t_target_ids(tensors[name("d2t")].cpu().numpy())
            self.draft_to_target = torch.from_numpy(ids).to(self.lm_head.device)  # [Vd]
        self.head: heads.Head = heads.KINDS[spec.variant].load(self)  # what the draft's kind adds (heads.py)
        self.last_confidence: torch.Tensor | None = None  # [P] a confidence head's estimates of the last block
        inv_freq, self.rope_scale = rope_inv_freq(spec)
        self.inv_freq = inv_freq.to(self.device)  # [d/2] float32
        self.length_rope = LengthRope.of(spec)  # dynamic / longrope: frequencies by step length
        if self.length_rope is not None:
            self.length_rope = self.length_rope.to(self.device)
        if cache is None:
            cache = ContextCache(spec.num_layers, self.n_kv, self.head_dim, device=self.device, dtype=dtype)
            cache.block = self.block_size
        self.cache = cache
        self.compile = False
        self._compiled_fns: dict[str, Callable] = {}
        if compile:
            self._enable_compile()

    def run_block(self, block_size: int | None = None) -> int:
        """The block a run uses: `block_size` where the caller resolved one (engines let a deployment choose it),
        else the trained block. The runtime's one fallback to the trained block: every default below reads it."""
        return self.block_size if block_size is None else block_size

    def proposals(self, block_size: int | None = None) -> int:
        """How many tokens a block of `block_size` slots (default: run_block's) proposes: all of them when the
        anchor's slot predicts (dspark's sample_from_anchor), else all but the anchor's."""
        block_size = self.run_block(block_size)
        return block_size if self.anchor_predicts else block_size - 1

    @property
    def anchor_predicts(self) -> bool:
        """Whether the anchor's slot proposes too (the head's; dspark's sample_from_anchor)."""
        return self.head.anchor_predicts

    @property
    def walks(self) -> bool:
        """Whether propose samples its proposals itself at temperature > 0 (slot by slot, each after the previous
        pick); otherwise its ids are greedy and a sampling caller draws each slot from the logits."""
        return self.head.walks

    def with_backend(self, name: str, *, compile: bool | None = None) -> "DFlashDraft":
        """The same draft attending with another backend, checked against the capability table: built
        over the same weights and context cache; `compile` None keeps this draft's setting."""
        sliding = any(layer.sliding_window is not None for layer in self.layers)
        name = select_backend(name, self.layer_causal, sliding, self.device, self.dtype)
        return DFlashDraft(self.spec, self.tensors, layer_causal=self.layer_causal, backend=name, device=self.device,
                           dtype=self.dtype, compile=self.compile if compile is None else compile,
                           window_per_query=self.window_per_query, mask_embedding=self.mask_embedding,
                           cache=self.cache)

    def _enable_compile(self) -> None:
        """Mark every tensor the step reads as static (CUDA graphs then read them in place instead of
        copying them in before each replay) and make the scalars the step takes as tensors."""
        if self.backend == "flex" and self.device.type == "cpu":
            # inductor's CPU FlexAttention template cannot fuse what follows it in the step (torch 2.13)
            raise DFlashError("the compiled draft step cannot use FlexAttention on CPU; use --backend sdpa or eager "
                              "with --compile (compiled flex runs on CUDA)")
        self.compile = True
        # every weight (the head's included) is one of self.tensors; the rest are derived at load
        for t in (*self.tensors.values(), self.inv_freq, self.draft_to_target, self.mask_embedding):
            if t is not None:
                torch._dynamo.mark_static_address(t)
        self.cache.mark_static()
        self._start = torch.zeros((), dtype=torch.long, device=self.device)  # block / context start position
        self._ctx_first = torch.zeros((), dtype=torch.long, device=self.device)  # first visible context position
        for t in (self._start, self._ctx_first):
            torch._dynamo.mark_static_address(t)
        self._features = None  # [C, A*Ht] padded context rows, allocated on first use

    def _compiled(self, name: str) -> Callable:
        fn = self._compiled_fns.get(name)
        if fn is None:
            # fullgraph: the step must be captured whole; flash-attn's host-int slicing cannot be
            mode = "reduce-overhead" if self.device.type == "cuda" else None
            fn = torch.compile(STEP_FUNCTIONS[name], dynamic=False, fullgraph=self.backend != "flash_attn", mode=mode)
            self._compiled_fns[name] = fn
        return fn

    # ------------------------------------------------------------------ context

    def reset(self, max_len: int | None = None, block_size: int | None = None) -> None:
        """Forget all context (a new sequence). `max_len`: positions the run will reach, its last block
        included, so the cache is allocated once; `block_size`: the block the compiled step serves."""
        if block_size is not None:
            self.cache.block = block_size
        self.cache.reset(max_len)

    @torch.inference_mode()
    def add_context(self, features: torch.Tensor, start: int | None = None) -> None:
        """Append committed tokens' features [T, A*Ht] at positions start.. (default: right after the cache)."""
        cache = self.cache
        start = cache.end if start is None else start
        if start != cache.end and len(cache):
            raise DFlashError(f"context must be contiguous: cache ends at {cache.end}, got features from {start}")
        if not len(cache):
            cache.start = start
        n = features.shape[0]
        features = features.to(self.device, self.dtype)
        chunk = cache.block
        if self.compile and n <= chunk:  # a decode step's new rows: padded to one shape, compiled
            if start + chunk > cache.capacity:
                cache.grow(start + chunk)
            if self._features is None or self._features.shape != (chunk, features.shape[1]):
                self._features = torch.zeros(chunk, features.shape[1], device=self.device, dtype=self.dtype)
                torch._dynamo.mark_static_address(self._features)
            self._features[:n] = features  # rows n.. hold earlier rows: finite, written past cache.end, unused
            self._start.fill_(start)
            self._compiled("context")(self, self._features, self._start)
        else:
            if start + n > cache.capacity:
                cache.grow(start + n)
            write_context(self, features, start)
        cache.end = start + n

    def keep_last_context(self, n: int) -> None:
        """Forget all but the last n context positions (a draft window never looks further back)."""
        self.cache.keep_last(n)

    # ------------------------------------------------------------------ block forward

    def _block_start(self, start: int, block_len: int, draft_window: int | None) -> int:
        """Check that the block follows the context; returns the first context position it may see."""
        cache = self.cache
        if len(cache) and start != cache.end:
            raise DFlashError(f"the block must follow the context: cache ends at {cache.end}, block at {start}")
        if start + block_len > cache.capacity:
            cache.grow(start + block_len)
        first = cache.start if len(cache) else start
        return first if draft_window is None else max(first, start - draft_window)

    @torch.inference_mode()
    def block_hidden(self, x: torch.Tensor, start: int, draft_window: int | None = None, *,
                     layers: Sequence[int] | None = None) -> torch.Tensor:
        """x [B, H] embedded block at positions start..start+B-1 -> final-normed hidden [B, H] (eager).

        The block attends to the cached context (limited to positions >= start - window for
        sliding layers and for a draft window) and to itself (causally or not, per layer).
        `layers`: run only these layers (each with its own cache rows), e.g. one, to probe it alone."""
        first = self._block_start(start, x.shape[0], draft_window)
        chosen = None if layers is None else [self.layers[i] for i in layers]
        return block_forward(self, x.to(self.device), start, first, first, start + x.shape[0], chosen)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, target_lm_head: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """hidden [n, H] -> logits [n, V] over the TARGET vocab (ids outside a pruned vocab get -inf)."""
        return block_logits(self, hidden, target_lm_head)

    @torch.inference_mode()
    def propose(self, anchor_id: int, start: int, *, embed: Callable[[torch.Tensor], torch.Tensor],
                lm_head: Callable[[torch.Tensor], torch.Tensor], block_size: int | None = None,
                draft_window: int | None = None, temperature: float = 0.0,
                generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft P = proposals(B) tokens after `anchor_id` at position `start` (the cache must hold the context
        up to start-1). Returns (ids [P], logits [P, V]). A draft that `walks` (dflash2's selector, dspark's
        Markov head: heads.py) picks slot by slot, each after the previous pick, sampled at `temperature` with
        `generator` when it is > 0, and its logits are what each slot was drawn from (dflash2: the walk's
        realized scores, -inf outside the k candidates; dspark: base + Markov bias); any other draft's ids are
        greedy, whatever the temperature. A confidence head's estimates are left in `last_confidence` [P]."""
        if self.head.walks and temperature <= 0:  # the greedy walk runs with the step (compiled with it)
            picked, logits, self.last_confidence = self._step(anchor_id, start, embed=embed, lm_head=lm_head,
                                                              block_size=block_size, draft_window=draft_window,
                                                              function="step_walk")
            return picked, logits
        outputs = self._step(anchor_id, start, embed=embed, lm_head=lm_head, block_size=block_size,
                             draft_window=draft_window)
        picked, logits, self.last_confidence = self.head.pick(torch.as_tensor(anchor_id, device=self.device),
                                                              outputs, temperature=temperature, generator=generator)
        return picked, logits

    def _step(self, anchor_id: int, start: int, *, embed, lm_head, block_size: int | None,
              draft_window: int | None, function: str = "step") -> tuple[torch.Tensor | None, ...]:
        """The compiled (or eager) step: the head's outputs (draft_step), or with function="step_walk" the
        head's greedy pick (draft_step_walk)."""
        block_size = self.run_block(block_size)
        first = self._block_start(start, block_size, draft_window)
        ids = torch.full((block_size,), self.mask_token_id, dtype=torch.long, device=self.device)
        ids[0] = anchor_id
        if self.compile and block_size == self.cache.block:
            self._start.fill_(start)
            self._ctx_first.fill_(first)
            # the whole cache is attended (masked): a fixed shape, so no recompiles as context grows
            outputs = self._compiled(function)(self, ids, self._start, self._ctx_first, 0, self.cache.capacity,
                                               embed, lm_head)
            if self.device.type == "cuda":  # CUDA graph outputs are overwritten by the next replay
                return tuple(None if t is None else t.clone() for t in outputs)
            return outputs
        return STEP_FUNCTIONS[function](self, ids, start, first, first, start + block_size, embed, lm_head)


def _layers(spec: DraftSpec, tensors: dict[str, torch.Tensor], layer_causal: list[bool]) -> list[DraftLayer]:
    """Each decoder layer's weights (by catalogue key) and attention mode."""
    name = catalogue.name
    layers = []
    for i in range(spec.num_layers):
        sliding = spec.layer_types[i] == "sliding_attention"
        layers.append(DraftLayer(  # biases are None unless the config has attention_bias
            **{key: tensors[name(key, i)] if catalogue.BY_KEY[key].needed(spec) else None
               for key in catalogue.LAYER_KEYS},
            causal=layer_causal[i],
            sliding_window=spec.sliding_window if sliding else None,
            index=i,
        ))
    return layers
