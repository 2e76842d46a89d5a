"""The DFlash draft in plain PyTorch (FORMATS.md 6.2-6.4), loaded from either checkpoint format.

Data flow of one step, batch 1 (H draft hidden, A*Ht context width, B block, V target vocab):
    features [T, A*Ht] --fc, hidden_norm--> ctx [T, H] --k/v per layer, RoPE--> context K/V cache
    [anchor, MASK * (B-1)] --target embedding--> x [B, H] --layers (attend to cache + block)-->
    norm --target lm_head (or own pruned lm_head scattered through d2t)--> logits [B, V]
Only context K/V are kept between steps; block K/V are recomputed each step.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from dflash_convert import catalogue, compat, mapping
from dflash_convert.checkpoint import Checkpoint, open_checkpoint
from dflash_convert.configs import DraftSpec
from dflash_convert.errors import DFlashError

from .attention import BACKENDS, select_backend

SUPPORTED_ROPE = ("linear", "llama3", "yarn")  # static scalings; dynamic ones change with length


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
        raise DFlashError(f"RoPE type {kind!r} is not supported by the runtime "
                          f"(supported: default, {', '.join(SUPPORTED_ROPE)})")
    from transformers import Qwen3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = Qwen3Config(**{k: v for k, v in spec.decoder.items() if k != "model_type"})
    inv_freq, scale = ROPE_INIT_FUNCTIONS[kind](config, "cpu")
    return inv_freq.float(), float(scale)


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


class DFlashDraft:
    """A loaded draft plus its per-layer context K/V cache (batch 1)."""

    def __init__(self, spec: DraftSpec, tensors: dict[str, torch.Tensor], *, layer_causal: list[bool], backend: str,
                 device, dtype: torch.dtype, compile: bool = False):
        self.spec = spec
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
        self._attend_kwargs = {"compile": True} if backend == "flex" and compile else {}
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
            ))
        # Pruned vocab: own lm_head [Vd, H] and the draft -> target id map built from d2t.
        self.lm_head = tensors.get(name("lm_head")) if spec.is_pruned_vocab else None
        self.draft_to_target = None
        if self.lm_head is not None:
            ids = catalogue.d2t_target_ids(tensors[name("d2t")].cpu().numpy())
            self.draft_to_target = torch.from_numpy(ids).to(self.lm_head.device)  # [Vd]
        inv_freq, self.rope_scale = rope_inv_freq(spec)
        self.inv_freq = inv_freq.to(self.device)  # [d/2] float32
        self.reset()

    def with_backend(self, name: str, *, compile: bool = False) -> "DFlashDraft":
        """The same draft (weights shared; context cache shared until either side changes it)
        attending with another backend, checked against the capability table."""
        sliding = any(layer.sliding_window is not None for layer in self.layers)
        name = select_backend(name, self.layer_causal, sliding, self.device, self.dtype)
        other = copy.copy(self)
        other.backend = name
        other._attend = BACKENDS[name].fn
        other._attend_kwargs = {"compile": True} if name == "flex" and compile else {}
        return other

    # ------------------------------------------------------------------ context cache

    def reset(self) -> None:
        """Forget all context (a new sequence)."""
        empty = torch.empty(1, self.n_kv, 0, self.head_dim, device=self.device, dtype=self.dtype)
        self.cache_k = [empty] * len(self.layers)  # per layer [1, nKV, T, d], post-RoPE
        self.cache_v = [empty] * len(self.layers)
        self.ctx_start = 0  # position of cache row 0
        self.ctx_end = 0  # position after the last cached row

    @property
    def context_len(self) -> int:
        return self.ctx_end - self.ctx_start

    def _rope(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """x [1, heads, n, d] rotated by positions [n] (neox rotate_half, HF Qwen3 numerics)."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]  # [n, d/2]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scale).to(x.dtype)
        sin = (emb.sin() * self.rope_scale).to(x.dtype)
        return x * cos + rotate_half(x) * sin

    @torch.inference_mode()
    def fuse_context(self, features: torch.Tensor) -> torch.Tensor:
        """features [T, A*Ht] (target states at target_layer_ids, in id order) -> ctx [T, H]."""
        return rms_norm(F.linear(features.to(self.device, self.dtype), self.fc), self.hidden_norm, self.eps)

    @torch.inference_mode()
    def add_context(self, features: torch.Tensor, start: int | None = None) -> None:
        """Append committed tokens' features [T, A*Ht] at positions start.. (default: right after the cache)."""
        start = self.ctx_end if start is None else start
        if start != self.ctx_end and self.context_len:
            raise DFlashError(f"context must be contiguous: cache ends at {self.ctx_end}, got features from {start}")
        if not self.context_len:
            self.ctx_start = start
        n = features.shape[0]
        ctx = self.fuse_context(features)  # [T, H]
        positions = torch.arange(start, start + n, device=self.device)
        for i, layer in enumerate(self.layers):
            k = F.linear(ctx, layer.k_proj, layer.k_bias).view(1, n, self.n_kv, self.head_dim)
            k = rms_norm(k, layer.k_norm, self.eps).transpose(1, 2)  # [1, nKV, T, d]
            v = F.linear(ctx, layer.v_proj, layer.v_bias).view(1, n, self.n_kv, self.head_dim).transpose(1, 2)
            self.cache_k[i] = torch.cat([self.cache_k[i], self._rope(k, positions)], dim=2)
            self.cache_v[i] = torch.cat([self.cache_v[i], v], dim=2)
        self.ctx_end = start + n

    def keep_last_context(self, n: int) -> None:
        """Drop all but the last n cached context rows (a draft window never looks further back)."""
        drop = self.context_len - n
        if drop > 0:
            self.cache_k = [k[:, :, drop:] for k in self.cache_k]
            self.cache_v = [v[:, :, drop:] for v in self.cache_v]
            self.ctx_start += drop

    # ------------------------------------------------------------------ block forward

    @torch.inference_mode()
    def block_hidden(self, x: torch.Tensor, start: int, draft_window: int | None = None) -> torch.Tensor:
        """x [B, H] embedded block at positions start..start+B-1 -> final-normed hidden [B, H].

        The block attends to the cached context (limited to positions >= start - window for
        sliding layers and for a draft window) and to itself (causally or not, per layer)."""
        n = x.shape[0]
        x = x.to(self.dtype)
        positions = torch.arange(start, start + n, device=self.device)
        for i, layer in enumerate(self.layers):
            windows = [w for w in (layer.sliding_window, draft_window) if w is not None]
            first_visible = start - min(windows) if windows else self.ctx_start
            ctx_first = min(max(0, first_visible - self.ctx_start), self.context_len)
            h = rms_norm(x, layer.input_layernorm, self.eps)
            q = F.linear(h, layer.q_proj, layer.q_bias).view(1, n, self.n_heads, self.head_dim)
            q = self._rope(rms_norm(q, layer.q_norm, self.eps).transpose(1, 2), positions)  # [1, nH, B, d]
            k = F.linear(h, layer.k_proj, layer.k_bias).view(1, n, self.n_kv, self.head_dim)
            k = self._rope(rms_norm(k, layer.k_norm, self.eps).transpose(1, 2), positions)  # [1, nKV, B, d]
            v = F.linear(h, layer.v_proj, layer.v_bias).view(1, n, self.n_kv, self.head_dim).transpose(1, 2)
            k = torch.cat([self.cache_k[i], k], dim=2)  # [1, nKV, T+B, d]
            v = torch.cat([self.cache_v[i], v], dim=2)
            o = self._attend(q, k, v, scale=self.scale, causal=layer.causal, ctx_first=ctx_first,
                             **self._attend_kwargs)  # [1, nH, B, d]
            x = x + F.linear(o.transpose(1, 2).reshape(n, -1), layer.o_proj, layer.o_bias)
            h = rms_norm(x, layer.post_attention_layernorm, self.eps)
            x = x + F.linear(self.act(F.linear(h, layer.gate_proj)) * F.linear(h, layer.up_proj), layer.down_proj)
        return rms_norm(x, self.norm, self.eps)

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, target_lm_head: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """hidden [n, H] -> logits [n, V] over the TARGET vocab (ids outside a pruned vocab get -inf)."""
        if self.lm_head is None:
            weight = getattr(target_lm_head, "weight", None)
            return target_lm_head(hidden.to(weight.dtype if weight is not None else hidden.dtype)).float()
        draft_logits = F.linear(hidden, self.lm_head).float()  # [n, Vd]
        full = torch.full((hidden.shape[0], self.spec.vocab_size), float("-inf"), device=hidden.device)
        full[:, self.draft_to_target] = draft_logits
        return full

    @torch.inference_mode()
    def propose(self, anchor_id: int, start: int, *, embed: Callable[[torch.Tensor], torch.Tensor],
                lm_head: Callable[[torch.Tensor], torch.Tensor], block_size: int | None = None,
                draft_window: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Draft B-1 tokens after `anchor_id` at position `start` (the cache must hold the context up
        to start-1). Returns (greedy ids [B-1], logits [B-1, V])."""
        block_size = block_size or self.block_size
        ids = torch.full((block_size,), self.mask_token_id, dtype=torch.long, device=self.device)
        ids[0] = anchor_id
        hidden = self.block_hidden(embed(ids), start, draft_window)  # [B, H]
        logits = self.logits(hidden[1:], lm_head)  # [B-1, V]; slot 0's output is discarded
        return logits.argmax(dim=-1), logits


# ---------------------------------------------------------------------- loading

def resolve_layer_causal(spec: DraftSpec, causal: bool | None) -> list[bool]:
    """Per-layer causality: the checkpoint's (FORMATS.md 6.4), or one explicit flag for all layers."""
    return [bool(causal)] * spec.num_layers if causal is not None else list(spec.layer_causal)


def _check_runnable(spec: DraftSpec, file: str) -> None:
    if spec.variant != "dflash":
        raise DFlashError(f"{spec.variant} drafts are not supported by the runtime: their extra modules "
                          "(local convolutions, candidate selector) are not specified; only dflash runs", file=file)
    try:
        mapping.check_complete(spec)  # block size, mask id and target ids: what every engine needs
    except DFlashError as exc:
        raise DFlashError(str(exc), file=file) from None
    unsupported = mapping.non_qwen3_features(spec)
    if unsupported:
        raise DFlashError(f"config sets {', '.join(unsupported)}: the runtime implements the plain Qwen3 layer math "
                          "only, so its logits would not be this draft's", file=file)
    if rope_kind(spec) not in ("default", *SUPPORTED_ROPE):
        raise DFlashError(f"RoPE type {rope_kind(spec)!r} is not supported by the runtime "
                          f"(supported: default, {', '.join(SUPPORTED_ROPE)})", file=file)
    compat.raise_first_failure([compat.mask_range_check(spec.mask_token_id, spec.vocab_size,
                                                        source="the draft config")], file=file)


def load_draft(source: str | Path | Checkpoint, *, device="cpu", dtype: torch.dtype = torch.float32,
               backend: str = "auto", causal: bool | None = None, compile: bool = False) -> DFlashDraft:
    """Load a draft from a checkpoint directory (either format) or an opened Checkpoint.

    Tensors are read one at a time from their byte ranges and cast to `dtype` on `device`.
    `causal` overrides every layer's causality; `compile` compiles FlexAttention (backend flex).
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
    for tensor in catalogue.expected_shapes(spec):
        t = ckpt.load_tensor(tensor, str(device))
        tensors[tensor] = t.to(dtype) if t.is_floating_point() else t  # d2t stays integer
    if spec.is_pruned_vocab:
        ckpt.d2t_target_ids()  # raises on ids outside the target vocab or repeated
    return DFlashDraft(spec, tensors, layer_causal=layer_causal, backend=name, device=device, dtype=dtype,
                       compile=compile)


def warn_block_size(draft: DFlashDraft, block_size: int) -> None:
    if block_size != draft.block_size:
        warnings.warn(f"run-time block size {block_size} differs from the draft's trained block size "
                      f"{draft.block_size}; acceptance may differ from a deployment at the trained size",
                      stacklevel=3)
