"""The DFlash draft in plain PyTorch (docs/formats.md sections 1 and 5), loaded from either checkpoint format.

Data flow of one step, batch 1 (H draft hidden, A*Ht context width, B block, V target vocab):
    features [T, A*Ht] --fc, hidden_norm--> ctx [T, H] --k/v per layer, RoPE--> context K/V cache
    [anchor, MASK * (B-1)] --target embedding--> x [B, H] --layers (attend to cache + block)-->
    norm --target lm_head (or own pruned lm_head scattered through d2t)--> logits [B, V]
Only context K/V are kept between steps; block K/V are recomputed each step.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from dflash_convert.format import catalogue, compat, mapping
from dflash_convert.io.checkpoint import Checkpoint, open_checkpoint
from dflash_convert.format.configs import DraftSpec
from dflash_convert.errors import DFlashError, NotRunnable

from . import dflash2, heads
from .attention import BACKENDS, select_backend
from .quantized import dequantized_weights

# scaled RoPE types (transformers' names): static ones fix their frequencies; "dynamic" (NTK) and
# "longrope" choose them by the sequence length a step reaches (LengthRope)
SUPPORTED_ROPE = ("linear", "llama3", "yarn", "dynamic", "longrope")


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm: statistics in float32, weight applied in the input dtype."""
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope_kind(spec: DraftSpec) -> str:
    scaling = spec.rope_scaling or {}
    return scaling.get("rope_type") or scaling.get("type") or "default"


def rope_inv_freq(spec: DraftSpec) -> tuple[torch.Tensor, float]:
    """Inverse frequencies [d/2] and the cos/sin scale (1.0 unless a scaled RoPE says otherwise)."""
    d = spec.head_dim
    scaling = spec.rope_scaling
    if scaling is None:
        return 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float) / d)), 1.0
    kind = rope_kind(spec)
    if kind not in SUPPORTED_ROPE:
        raise NotRunnable(f"RoPE type {kind!r} is not supported by the runtime "
                          f"(supported: default, {', '.join(SUPPORTED_ROPE)})")
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = Qwen3Config(**{k: v for k, v in spec.decoder.items() if k != "model_type"})
    inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    return inv_freq.float(), float(scale)


@dataclass
class LengthRope:
    """Frequencies chosen by the sequence length a draft step reaches, as transformers' rotary embedding
    chooses them per call (dynamic_rope_update): one length per step, the block's end; context rows are
    rotated with the length of the step that first reads them (z-lab computes them in that step's call).
    "dynamic": NTK base theta * (factor * L / M - (factor - 1)) ** (d / (d - 2)) once L passes
    max_position_embeddings M; "longrope": the long factors once L passes original_max_position_embeddings."""
    kind: str
    threshold: int  # the length up to which the unscaled frequencies hold
    short: torch.Tensor  # [d/2] those frequencies
    long: torch.Tensor | None = None  # [d/2] longrope's long-factor frequencies
    theta: float = 10000.0
    factor: float = 1.0

    @classmethod
    def of(cls, spec: DraftSpec) -> "LengthRope | None":
        kind = rope_kind(spec)
        if kind not in ("dynamic", "longrope"):
            return None
        from transformers import Qwen3Config
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

        config = Qwen3Config(**{k: v for k, v in spec.decoder.items() if k != "model_type"})
        params = config.rope_parameters
        init = ROPE_INIT_FUNCTIONS[kind]
        if kind == "dynamic":
            return cls(kind, config.max_position_embeddings, init(config, "cpu")[0].float(),
                       theta=float(params["rope_theta"]), factor=float(params["factor"]))
        threshold = int(params["original_max_position_embeddings"])
        return cls(kind, threshold, init(config, "cpu", seq_len=threshold)[0].float(),
                   long=init(config, "cpu", seq_len=threshold + 1)[0].float())

    def to(self, device) -> "LengthRope":
        return LengthRope(self.kind, self.threshold, self.short.to(device),
                          None if self.long is None else self.long.to(device), self.theta, self.factor)

    def inv_freq(self, length) -> torch.Tensor:
        """[d/2] for a step reaching `length` positions (an int or a 0-d tensor: compiled steps pass one)."""
        length = torch.as_tensor(length, device=self.short.device)
        if self.kind == "longrope":
            return torch.where(length > self.threshold, self.long, self.short)
        dim = 2 * self.short.numel()
        length = torch.clamp(length.long(), min=self.threshold)  # float32 from here, as transformers' per-call path
        base = self.theta * ((self.factor * length / self.threshold) - (self.factor - 1)) ** (dim / (dim - 2))
        exponents = torch.arange(0, dim, 2, dtype=torch.int64, device=self.short.device).float() / dim
        return 1.0 / (base ** exponents)


@dataclass
class DraftLayer:
    """Weights of one decoder layer ([out, in] as stored) and its attention mode; the weight fields are
    named by their catalogue keys."""

    input_layernorm: torch.Tensor  # [H]
    post_attention_layernorm: torch.Tensor  # [H]
    q_proj: torch.Tensor  # [nH*d, H]
    k_proj: torch.Tensor  # [nKV*d, H]
    v_proj: torch.Tensor  # [nKV*d, H]
    o_proj: torch.Tensor  # [H, nH*d]
    q_norm: torch.Tensor  # [d]
    k_norm: torch.Tensor  # [d]
    gate_proj: torch.Tensor  # [I, H]
    up_proj: torch.Tensor  # [I, H]
    down_proj: torch.Tensor  # [H, I]
    q_bias: torch.Tensor | None
    k_bias: torch.Tensor | None
    v_bias: torch.Tensor | None
    o_bias: torch.Tensor | None
    causal: bool
    sliding_window: int | None  # visible context positions >= anchor - sliding_window
    index: int  # its place in the draft: the context cache layer it reads and writes
    attention_conv: dflash2.Conv | None = None  # dflash2: convolutions around attention and the MLP
    mlp_conv: dflash2.Conv | None = None


CACHE_ROUND = 256  # cache rows are allocated in multiples of this (fewer distinct shapes to compile)


class ContextCache:
    """The draft's context K/V (batch 1): one preallocated pair of tensors per layer, written by index.

    Row p holds position p. Context [start, end) is valid; rows from end on are free, and a step's
    block writes its own K/V there as scratch. Dropping old context (a draft window) only moves
    start: nothing is copied. The cache grows by reallocation only when a caller goes past it; the
    new tensors replace the old ones in `k` and `v`, so every draft sharing this cache (the backend
    variants of one draft) reads and writes the same rows."""

    def __init__(self, num_layers: int, n_kv: int, head_dim: int, *, device, dtype: torch.dtype):
        self.num_layers, self.n_kv, self.head_dim = num_layers, n_kv, head_dim
        self.device, self.dtype = torch.device(device), dtype
        self.k: list[torch.Tensor] = []  # per layer [1, nKV, capacity, d], post-RoPE, row = position
        self.v: list[torch.Tensor] = []
        self.static = False  # compiled steps read the tensors in place: reallocated ones are marked too
        self.block = 0  # rows past the context a compiled step writes (its block size)
        self.start = 0  # first valid context position (rows before it are dropped or never written)
        self.end = 0  # position after the last cached row

    @property
    def capacity(self) -> int:
        return self.k[0].shape[2] if self.k else 0

    def __len__(self) -> int:
        """Context positions held."""
        return self.end - self.start

    @torch.inference_mode()
    def reset(self, max_len: int | None = None) -> None:
        """Forget all context; `max_len`: positions the run will reach, so the rows are allocated once."""
        if max_len is not None and max_len > self.capacity:
            self.grow(max_len, keep=False)
        for t in (*self.k, *self.v):
            t.zero_()  # in place (static addresses); free rows must stay finite: masked keys still meet q
        self.start = self.end = 0

    @torch.inference_mode()
    def grow(self, needed: int, keep: bool = True) -> None:
        """Reallocate to at least `needed` rows (rounded up, at least doubling), keeping the context when `keep`."""
        size = -(-max(needed, 2 * self.capacity) // CACHE_ROUND) * CACHE_ROUND
        old = self.capacity
        new = []
        for t_old in (*self.k, *self.v) if old else [None] * (2 * self.num_layers):
            t = torch.zeros(1, self.n_kv, size, self.head_dim, device=self.device, dtype=self.dtype)
            if keep and old:
                t[:, :, :old] = t_old
            if self.static:
                torch._dynamo.mark_static_address(t)
            new.append(t)
        self.k, self.v = new[:self.num_layers], new[self.num_layers:]

    def mark_static(self) -> None:
        """Compiled steps read and write the cache in place (CUDA graphs need fixed addresses)."""
        self.static = True
        for t in (*self.k, *self.v):
            torch._dynamo.mark_static_address(t)

    def keep_last(self, n: int) -> None:
        """Forget all but the last n context positions."""
        self.start = max(self.start, self.end - n)

    def write(self, layer: int, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [1, nKV, n, d] of positions [n] into layer's rows at those positions."""
        self.k[layer].index_copy_(2, positions, k)
        self.v[layer].index_copy_(2, positions, v)

    def rows(self, layer: int, lo, hi) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer's K, V rows [lo, hi): views [1, nKV, hi-lo, d]."""
        return self.k[layer][:, :, lo:hi], self.v[layer][:, :, lo:hi]


class DFlashDraft:
    """A loaded draft, attending with one backend, over its context cache (`cache`, a ContextCache).

    compile=True runs the decode step (`propose`) and small context additions through
    torch.compile'd plain functions (`draft_step`, `write_context`) with fixed shapes per block
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
        self.block_size = spec.block_size
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
        self.layers: list[DraftLayer] = []
        for i in range(spec.num_layers):
            sliding = spec.layer_types[i] == "sliding_attention"
            self.layers.append(DraftLayer(  # biases are None unless the config has attention_bias
                **{key: tensors[name(key, i)] if catalogue.BY_KEY[key].needed(spec) else None
                   for key in catalogue.LAYER_KEYS},
                causal=self.layer_causal[i],
                sliding_window=spec.sliding_window if sliding else None,
                index=i,
            ))
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

    def proposals(self, block_size: int | None = None) -> int:
        """How many tokens a block of `block_size` slots proposes: all of them when the anchor's slot predicts
        (dspark's sample_from_anchor), else all but the anchor's."""
        block_size = block_size or self.block_size
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
        outputs = self._step(anchor_id, start, embed=embed, lm_head=lm_head, block_size=block_size,
                             draft_window=draft_window)
        picked, logits, self.last_confidence = self.head.pick(torch.as_tensor(anchor_id, device=self.device),
                                                              outputs, temperature=temperature, generator=generator)
        return picked, logits

    def _step(self, anchor_id: int, start: int, *, embed, lm_head, block_size: int | None,
              draft_window: int | None) -> tuple[torch.Tensor, ...]:
        """The compiled (or eager) step: the head's outputs (draft_step)."""
        block_size = block_size or self.block_size
        first = self._block_start(start, block_size, draft_window)
        ids = torch.full((block_size,), self.mask_token_id, dtype=torch.long, device=self.device)
        ids[0] = anchor_id
        if self.compile and block_size == self.cache.block:
            self._start.fill_(start)
            self._ctx_first.fill_(first)
            # the whole cache is attended (masked): a fixed shape, so no recompiles as context grows
            outputs = self._compiled("step")(self, ids, self._start, self._ctx_first, 0, self.cache.capacity,
                                             embed, lm_head)
            if self.device.type == "cuda":  # CUDA graph outputs are overwritten by the next replay
                return tuple(t.clone() for t in outputs)
            return outputs
        return draft_step(self, ids, start, first, first, start + block_size, embed, lm_head)


# ---------------------------------------------------------------------- the step, as plain functions
# Positions are ints when run eagerly and 0-dim long tensors in the compiled step, where nothing
# the graph specialises on changes from one step to the next. kv_lo/kv_hi: the cache rows attended
# (eager: just the visible span; compiled: the whole cache, masked).


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, scale: float, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [n, d] for positions [n] (HF Qwen3 numerics: float32 angles, cast to the model dtype)."""
    freqs = positions.float()[:, None] * inv_freq[None, :]  # [n, d/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    return (emb.cos() * scale).to(dtype), (emb.sin() * scale).to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [1, heads, n, d] rotated (neox rotate_half) by tables [n, d]."""
    return x * cos + rotate_half(x) * sin


def _later(a, b):
    return torch.maximum(a, b) if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) else max(a, b)


def write_context(d: DFlashDraft, features: torch.Tensor, start) -> None:
    """features [n, A*Ht] of positions start..start+n-1 -> each layer's K/V written into cache rows start.."""
    n = features.shape[0]
    ctx = rms_norm(F.linear(features, d.fc), d.hidden_norm, d.eps)  # [n, H]
    positions = torch.arange(n, device=ctx.device) + start  # [n]
    inv_freq = d.inv_freq if d.length_rope is None else d.length_rope.inv_freq(start + n + d.cache.block)
    cos, sin = rope_tables(positions, inv_freq, d.rope_scale, ctx.dtype)  # [n, d] each, shared by the layers
    for layer in d.layers:
        k = F.linear(ctx, layer.k_proj, layer.k_bias).view(1, n, d.n_kv, d.head_dim)
        k = apply_rope(rms_norm(k, layer.k_norm, d.eps).transpose(1, 2), cos, sin)  # [1, nKV, n, d]
        v = F.linear(ctx, layer.v_proj, layer.v_bias).view(1, n, d.n_kv, d.head_dim).transpose(1, 2)
        d.cache.write(layer.index, positions, k, v)


def block_forward(d: DFlashDraft, x: torch.Tensor, start, ctx_first, kv_lo, kv_hi: int,
                  layers: list[DraftLayer] | None = None) -> torch.Tensor:
    """x [B, H] at positions start..start+B-1 -> final-normed hidden [B, H]. The block's K/V go to
    cache rows start.. (free rows) and it attends to rows [kv_lo, kv_hi) under the 6.4 mask: context
    from ctx_first on (the cache's first row, or a draft window's), later still in sliding layers.
    `layers`: a subset of the draft's layers to run (default all)."""
    n = x.shape[0]
    x = x.to(d.dtype)
    positions = torch.arange(n, device=x.device) + start  # [B]
    inv_freq = d.inv_freq if d.length_rope is None else d.length_rope.inv_freq(start + n)
    cos, sin = rope_tables(positions, inv_freq, d.rope_scale, x.dtype)  # [B, d] each, shared by the layers
    for layer in d.layers if layers is None else layers:
        per_query = layer.sliding_window is not None and d.window_per_query
        first = ctx_first if layer.sliding_window is None or per_query else \
            _later(ctx_first, start - layer.sliding_window)
        window = {"query_window": layer.sliding_window} if per_query else {}
        h = rms_norm(x, layer.input_layernorm, d.eps)
        if layer.attention_conv is not None:  # dflash2: the input side convolved, the output side's taps kept
            h, taps = dflash2.conv_prepare(layer.attention_conv, h, n)
        q = F.linear(h, layer.q_proj, layer.q_bias).view(1, n, d.n_heads, d.head_dim)
        q = apply_rope(rms_norm(q, layer.q_norm, d.eps).transpose(1, 2), cos, sin)  # [1, nH, B, d]
        k = F.linear(h, layer.k_proj, layer.k_bias).view(1, n, d.n_kv, d.head_dim)
        k = apply_rope(rms_norm(k, layer.k_norm, d.eps).transpose(1, 2), cos, sin)  # [1, nKV, B, d]
        v = F.linear(h, layer.v_proj, layer.v_bias).view(1, n, d.n_kv, d.head_dim).transpose(1, 2)
        d.cache.write(layer.index, positions, k, v)
        o = d._attend(q, *d.cache.rows(layer.index, kv_lo, kv_hi), scale=d.scale, causal=layer.causal,
                      ctx_first=first - kv_lo, block_at=start - kv_lo, **window)  # [1, nH, B, d]
        o = F.linear(o.transpose(1, 2).reshape(n, -1), layer.o_proj, layer.o_bias)
        x = x + (o if layer.attention_conv is None else dflash2.conv_finish(layer.attention_conv, o, taps, n))
        h = rms_norm(x, layer.post_attention_layernorm, d.eps)
        if layer.mlp_conv is not None:
            h, taps = dflash2.conv_prepare(layer.mlp_conv, h, n)
        m = F.linear(d.act(F.linear(h, layer.gate_proj)) * F.linear(h, layer.up_proj), layer.down_proj)
        x = x + (m if layer.mlp_conv is None else dflash2.conv_finish(layer.mlp_conv, m, taps, n))
    return rms_norm(x, d.norm, d.eps)


def block_logits(d: DFlashDraft, hidden: torch.Tensor, target_lm_head: Callable[[torch.Tensor], torch.Tensor]
                 ) -> torch.Tensor:
    """hidden [n, H] -> float32 logits [n, V] over the TARGET vocab (ids outside a pruned vocab get -inf)."""
    if d.lm_head is None:
        weight = getattr(target_lm_head, "weight", None)
        return target_lm_head(hidden.to(weight.dtype if weight is not None else hidden.dtype)).float()
    draft_logits = F.linear(hidden, d.lm_head).float()  # [n, Vd]
    full = torch.full((hidden.shape[0], d.spec.vocab_size), float("-inf"), device=hidden.device)
    full[:, d.draft_to_target] = draft_logits
    return full


def draft_step(d: DFlashDraft, ids: torch.Tensor, start, ctx_first, kv_lo, kv_hi: int,
               embed: Callable[[torch.Tensor], torch.Tensor], lm_head: Callable[[torch.Tensor], torch.Tensor]
               ) -> tuple[torch.Tensor, ...]:
    """ids [B] (anchor, then mask ids) -> the head's outputs from the P proposing slots' final-normed hidden
    [P, H] and float32 logits [P, V]: slots 1..B-1 (slot 0's output is discarded), or all B slots when the
    anchor's slot predicts (dspark)."""
    x = embed(ids)  # [B, H]
    if d.mask_embedding is not None:
        x = torch.where((ids == d.mask_token_id)[:, None], d.mask_embedding.to(x.dtype), x)
    if d.head.embed_scale != 1.0:
        x = x * d.head.embed_scale
    hidden = block_forward(d, x, start, ctx_first, kv_lo, kv_hi)  # [B, H]
    rows = hidden if d.head.anchor_predicts else hidden[1:]  # [P, H] the proposing slots
    return d.head.outputs(rows, block_logits(d, rows, lm_head))


STEP_FUNCTIONS = {"step": draft_step, "context": write_context}


# ---------------------------------------------------------------------- loading

def resolve_layer_causal(spec: DraftSpec, causal: bool | None) -> list[bool]:
    """Per-layer causality: the checkpoint's (docs/formats.md section 5), or one explicit flag for all layers."""
    return [bool(causal)] * spec.num_layers if causal is not None else list(spec.layer_causal)


def _check_runnable(spec: DraftSpec, file: str) -> None:
    if spec.variant not in heads.KINDS:
        raise NotRunnable(f"{spec.variant} drafts are not supported by the runtime", file=file)
    try:
        mapping.check_complete(spec)  # block size, mask id and target ids: what every engine needs
    except DFlashError as exc:
        raise DFlashError(str(exc), file=file) from None
    applied = heads.KINDS[spec.variant].applies  # any other non-neutral family key is refused
    unsupported = [f for f in mapping.non_qwen3_features(spec) if f.partition("=")[0] not in applied]
    if unsupported:
        raise NotRunnable(f"config sets {', '.join(unsupported)}: the runtime implements the plain Qwen3 layer math "
                          "only, so its logits would not be this draft's", file=file)
    if rope_kind(spec) not in ("default", *SUPPORTED_ROPE):
        raise NotRunnable(f"RoPE type {rope_kind(spec)!r} is not supported by the runtime "
                          f"(supported: default, {', '.join(SUPPORTED_ROPE)})", file=file)
    compat.raise_first_failure([compat.mask_range_check(spec.mask_token_id, spec.vocab_size,
                                                        source="the draft config")], file=file)


def load_draft(source: str | Path | Checkpoint, *, device="cpu", dtype: torch.dtype = torch.float32,
               backend: str = "auto", causal: bool | None = None, compile: bool = False,
               window_per_query: bool = False, mask_embedding: torch.Tensor | None = None) -> DFlashDraft:
    """Load a draft from a checkpoint directory (either format) or an opened Checkpoint.

    Tensors are read one at a time from their byte ranges and cast to `dtype` on `device`.
    `causal` overrides every layer's causality; `compile` runs the decode step through torch.compile
    (CUDA graphs on CUDA; the first step of each shape compiles, which takes seconds to minutes).
    `window_per_query` gives sliding layers the serving engines' per-query window instead of training's.
    `mask_embedding` [H] embeds the mask slots, as vLLM and SGLang do with a draft's mask_embedding.pt (loaded by
    the caller, who consents to unpickling it: Checkpoint.load_mask_embedding).
    """
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DFlashError("device cuda was asked for, but CUDA is not available on this machine")
    ckpt = source if isinstance(source, Checkpoint) else open_checkpoint(source)
    spec = ckpt.spec
    file = str(ckpt.config_file)
    _check_runnable(spec, file)
    layer_causal = resolve_layer_causal(spec, causal)
    sliding = any(t == "sliding_attention" for t in spec.layer_types) and spec.sliding_window is not None
    name = select_backend(backend, layer_causal, sliding, device, dtype)
    ckpt.check_tensors(spec)
    tensors: dict[str, torch.Tensor] = {}
    dequantized = dequantized_weights(ckpt, str(device))  # a quantized draft: compressed-tensors decompresses
    for tensor in catalogue.expected_shapes(spec):
        t = dequantized.pop(tensor) if tensor in dequantized else ckpt.load_tensor(tensor, str(device))
        tensors[tensor] = t.to(dtype) if t.is_floating_point() else t  # d2t stays integer
    if spec.is_pruned_vocab:
        ckpt.d2t_target_ids()  # raises on ids outside the target vocab or repeated
    return DFlashDraft(spec, tensors, layer_causal=layer_causal, backend=name, device=device, dtype=dtype,
                       compile=compile, window_per_query=window_per_query,
                       mask_embedding=mask_embedding)


def warn_block_size(draft: DFlashDraft, block_size: int) -> None:
    if block_size != draft.block_size:
        warnings.warn(f"run-time block size {block_size} differs from the draft's trained block size "
                      f"{draft.block_size}; acceptance may differ from a deployment at the trained size",
                      stacklevel=3)
