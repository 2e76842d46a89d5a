"""Attention for one DFlash draft layer: block queries over [context ; block] keys.

Visibility (FORMATS.md 6.4), for block query j of a block whose anchor sits at position s:
- context: cached positions >= `ctx_first` (0, or the first position inside a sliding window or
  draft window); the model computes `ctx_first` once per step, so it is the same for every query
  of the block (speculators' training mask is anchor-relative: positions >= s - sliding_window);
- block: all B slots (non-causal) or slots <= j (causal, aligned to the block, not top-left).

Every backend computes the same function; `eager` is the reference the others are tested against.
Tensors: q [1, nH, B, d]; k, v [1, nKV, T + B, d] (T cached context rows, then the block); the
output is [1, nH, B, d]. GQA: nH is a multiple of nKV.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from dflash_convert.errors import DFlashError

from . import BACKEND_NAMES


def visible_mask(ctx_len: int, block_len: int, causal: bool, ctx_first: int, device) -> torch.Tensor:
    """Bool [B, T + B]: True where block query j may look. Built explicitly because SDPA's
    `is_causal` aligns the triangle top-left when query and key lengths differ."""
    key = torch.arange(ctx_len + block_len, device=device)[None, :]  # [1, T+B]
    query = torch.arange(block_len, device=device)[:, None] + ctx_len  # [B, 1] index of slot j among keys
    is_ctx = key < ctx_len
    ctx_ok = is_ctx & (key >= ctx_first)
    block_ok = ~is_ctx & ((key <= query) if causal else torch.ones_like(key, dtype=torch.bool))
    return ctx_ok | block_ok


def eager_attention(q, k, v, *, scale: float, causal: bool, ctx_first: int) -> torch.Tensor:
    """The reference: explicit scores, mask, float32 softmax (as transformers' eager path)."""
    n_heads, n_kv = q.shape[1], k.shape[1]
    block_len, ctx_len = q.shape[2], k.shape[2] - q.shape[2]
    k = k.repeat_interleave(n_heads // n_kv, dim=1)  # [1, nH, T+B, d]
    v = v.repeat_interleave(n_heads // n_kv, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [1, nH, B, T+B]
    mask = visible_mask(ctx_len, block_len, causal, ctx_first, q.device)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)  # [1, nH, B, d]


def sdpa_attention(q, k, v, *, scale: float, causal: bool, ctx_first: int) -> torch.Tensor:
    block_len, ctx_len = q.shape[2], k.shape[2] - q.shape[2]
    mask = None
    if causal or ctx_first > 0:  # the plain non-causal block needs no mask at all
        mask = visible_mask(ctx_len, block_len, causal, ctx_first, q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


_compiled_flex = None
FLEX_KV_BUCKET = 128  # compiled flex: context padded to a multiple of this, so shapes (and compiles) repeat


def flex_attention(q, k, v, *, scale: float, causal: bool, ctx_first: int, compile: bool = False) -> torch.Tensor:
    """FlexAttention with a mask_mod equal to `visible_mask`; eager by default. With `compile=True`
    the context is zero-padded to a multiple of FLEX_KV_BUCKET (pad keys are masked) and the mask's
    scalars are tensors, so one compiled kernel serves many steps (compiling costs seconds)."""
    global _compiled_flex
    from torch.nn.attention.flex_attention import create_block_mask
    from torch.nn.attention.flex_attention import flex_attention as flex

    block_len, ctx_len = q.shape[2], k.shape[2] - q.shape[2]
    pad = (-ctx_len) % FLEX_KV_BUCKET if compile else 0
    if pad:
        zeros = k.new_zeros(k.shape[0], k.shape[1], pad, k.shape[3])
        k = torch.cat([k[:, :, :ctx_len], zeros, k[:, :, ctx_len:]], dim=2)
        v = torch.cat([v[:, :, :ctx_len], zeros, v[:, :, ctx_len:]], dim=2)
    n_ctx = torch.tensor(ctx_len, device=q.device)  # tensors, not ints: a compiled mask_mod must not specialise
    first = torch.tensor(ctx_first, device=q.device)
    block_at = ctx_len + pad  # key index of block slot 0

    def mask_mod(b, h, q_idx, kv_idx):
        ctx_ok = (kv_idx < n_ctx) & (kv_idx >= first)
        in_block = kv_idx >= block_at
        block_ok = in_block & (kv_idx <= q_idx + block_at) if causal else in_block
        return ctx_ok | block_ok

    block_mask = create_block_mask(mask_mod, None, None, block_len, block_at + block_len, device=q.device)
    fn = flex
    if compile:
        if _compiled_flex is None:
            _compiled_flex = torch.compile(flex, dynamic=False)
        fn = _compiled_flex
    return fn(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


def flash_attn_attention(q, k, v, *, scale: float, causal: bool, ctx_first: int) -> torch.Tensor:
    """flash-attn 2: its causal mask is bottom-right aligned (query j sees keys <= T + j), which is
    exactly the causal block; the context window is applied by slicing the keys."""
    from flash_attn import flash_attn_func

    k, v = k[:, :, ctx_first:], v[:, :, ctx_first:]
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                          softmax_scale=scale, causal=causal)  # [1, B, nH, d]
    return out.transpose(1, 2)


@dataclass(frozen=True)
class Backend:
    """What one attention implementation can serve."""

    name: str
    fn: Callable
    non_causal: bool
    causal: bool
    sliding_window: bool
    devices: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    requires: str | None = None  # importable module the backend needs

    def available(self) -> bool:
        if self.requires and importlib.util.find_spec(self.requires) is None:
            return False
        if self.devices == ("cuda",) and not torch.cuda.is_available():
            return False
        return True

    def why_not(self, layer_causal: list[bool], sliding: bool, device: str, dtype: torch.dtype) -> str | None:
        """None when this backend serves the draft, else the first reason it cannot."""
        if self.requires and importlib.util.find_spec(self.requires) is None:
            return f"package {self.requires!r} is not installed"
        if device not in self.devices:
            return f"runs on {'/'.join(self.devices)} only, not {device}"
        if dtype not in self.dtypes:
            return f"does not support {str(dtype).removeprefix('torch.')}"
        if not self.non_causal and not all(layer_causal):
            return "has no non-causal (bidirectional) block attention"
        if not self.causal and any(layer_causal):
            return "has no causal block attention"
        if sliding and not self.sliding_window:
            return "has no sliding-window attention"
        if not self.available():
            return "is not available on this machine"
        return None


ALL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BACKENDS: dict[str, Backend] = {
    "flash_attn": Backend("flash_attn", flash_attn_attention, non_causal=True, causal=True, sliding_window=True,
                          devices=("cuda",), dtypes=(torch.bfloat16, torch.float16), requires="flash_attn"),
    "sdpa": Backend("sdpa", sdpa_attention, non_causal=True, causal=True, sliding_window=True,
                    devices=("cpu", "cuda"), dtypes=ALL_DTYPES),
    "flex": Backend("flex", flex_attention, non_causal=True, causal=True, sliding_window=True,
                    devices=("cpu", "cuda"), dtypes=ALL_DTYPES),
    "eager": Backend("eager", eager_attention, non_causal=True, causal=True, sliding_window=True,
                     devices=("cpu", "cuda"), dtypes=ALL_DTYPES),
}
AUTO_ORDER = BACKEND_NAMES  # fastest first


def select_backend(name: str, layer_causal: list[bool], sliding: bool, device, dtype: torch.dtype) -> str:
    """The backend to run a draft with: `name` if it serves every layer, or the best for `auto`."""
    device = torch.device(device).type
    if name == "auto":
        for candidate in AUTO_ORDER:
            if candidate in BACKENDS and BACKENDS[candidate].why_not(layer_causal, sliding, device, dtype) is None:
                return candidate
        raise DFlashError(f"no attention backend serves this draft on {device} {dtype}")
    if name not in BACKENDS:
        raise DFlashError(f"unknown attention backend {name!r}; choose from auto, {', '.join(BACKENDS)}")
    reason = BACKENDS[name].why_not(layer_causal, sliding, device, dtype)
    if reason is None:
        return name
    capable = [b for b in BACKENDS if BACKENDS[b].why_not(layer_causal, sliding, device, dtype) is None]
    mode = ("causal" if all(layer_causal) else "non-causal" if not any(layer_causal) else "mixed causal/non-causal")
    raise DFlashError(f"attention backend {name!r} cannot run this {mode} draft on {device}: it {reason}; "
                      f"backends that can: {', '.join(capable) or 'none'}")
