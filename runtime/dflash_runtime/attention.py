"""Attention for one DFlash draft layer: block queries over [context ; block] keys.

Visibility (docs/formats.md section 5), for block query j of a block whose anchor sits at position s:
- context: cached positions >= `ctx_first` (0, or the first position inside a sliding window or
  draft window); the model computes `ctx_first` once per step, so it is the same for every query
  of the block (speculators' training mask is anchor-relative: positions >= s - sliding_window);
- block: all B slots (non-causal) or slots <= j (causal, aligned to the block, not top-left).
`query_window` W (optional) instead limits each query to the W keys ending at its own position,
the sliding window vLLM, SGLang and z-lab apply (validate --engine runs it; training is anchor-relative).

Every backend computes the same function; `eager` is the reference the others are tested against.
Tensors: q [1, nH, B, d]; k, v [1, nKV, L, d]: key rows [0, block_at) are context (visible from
`ctx_first` <= block_at on), rows [block_at, block_at + B) the block, rows after it unused (the free
rows of a preallocated cache: never visible). `block_at` defaults to L - B (context, then block).
`ctx_first` and `block_at` are ints, or 0-dim integer tensors inside the compiled draft step (one
graph serves every step). The output is [1, nH, B, d]. GQA: nH is a multiple of nKV.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from dflash_convert.errors import DFlashError

from . import BACKEND_NAMES


def visible_mask(ctx_len, block_len: int, causal: bool, ctx_first, device, kv_len: int | None = None,
                 query_window: int | None = None) -> torch.Tensor:
    """Bool [B, L]: True where block query j may look (L = kv_len, default ctx_len + B). Built
    explicitly because SDPA's `is_causal` aligns the triangle top-left when query and key lengths
    differ. Query j sees keys ctx_first .. ctx_len + j (causal) or .. ctx_len + B - 1 (not), and
    with `query_window` W none before ctx_len + j - (W - 1)."""
    kv_len = ctx_len + block_len if kv_len is None else kv_len
    key = torch.arange(kv_len, device=device)[None, :]  # [1, L]
    slot = torch.arange(block_len, device=device)[:, None]  # [B, 1]
    last = slot + ctx_len if causal else ctx_len + (block_len - 1)  # [B, 1] or a scalar
    mask = (key >= ctx_first) & (key <= last)
    if query_window is not None:
        mask = mask & (key > slot + ctx_len - query_window)
    return mask


def _block_at(q, k, block_at):
    return k.shape[2] - q.shape[2] if block_at is None else block_at


def eager_attention(q, k, v, *, scale: float, causal: bool, ctx_first, block_at=None,
                    query_window: int | None = None) -> torch.Tensor:
    """The reference: explicit scores, mask, float32 softmax (as transformers' eager path)."""
    n_heads, n_kv = q.shape[1], k.shape[1]
    block_at = _block_at(q, k, block_at)
    k = k.repeat_interleave(n_heads // n_kv, dim=1)  # [1, nH, L, d]
    v = v.repeat_interleave(n_heads // n_kv, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale  # [1, nH, B, L]
    mask = visible_mask(block_at, q.shape[2], causal, ctx_first, q.device, kv_len=k.shape[2],
                        query_window=query_window)
    scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.matmul(probs, v)  # [1, nH, B, d]


def sdpa_attention(q, k, v, *, scale: float, causal: bool, ctx_first, block_at=None,
                   query_window: int | None = None) -> torch.Tensor:
    block_at = _block_at(q, k, block_at)
    mask = None
    plain = (isinstance(ctx_first, int) and ctx_first == 0 and isinstance(block_at, int)
             and block_at + q.shape[2] == k.shape[2] and query_window is None)
    if causal or not plain:  # the plain non-causal block (all keys visible) needs no mask at all
        mask = visible_mask(block_at, q.shape[2], causal, ctx_first, q.device, kv_len=k.shape[2],
                            query_window=query_window)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale,
                                          enable_gqa=q.shape[1] != k.shape[1])


FLEX_BLOCK = 128  # FlexAttention's tile (query rows x key rows)


def flex_attention(q, k, v, *, scale: float, causal: bool, ctx_first, block_at=None,
                   query_window: int | None = None) -> torch.Tensor:
    """FlexAttention with a mask_mod equal to `visible_mask`. Eager here; inside the compiled draft
    step it is compiled with the step (its scalars are tensors there, so the kernel is reused).
    Every key tile is marked partial (mask_mod applied everywhere): a block of B <= 128 queries is
    one tile row, and building the mask needs no vmap (create_block_mask), which keeps it traceable."""
    from torch.nn.attention.flex_attention import BlockMask
    from torch.nn.attention.flex_attention import flex_attention as flex

    block_len, kv_len = q.shape[2], k.shape[2]
    block_at = _block_at(q, k, block_at)
    block_end = block_at + (block_len - 1)

    def mask_mod(b, h, q_idx, kv_idx):
        ok = (kv_idx >= ctx_first) & (kv_idx <= (q_idx + block_at if causal else block_end))
        return ok if query_window is None else ok & (kv_idx > q_idx + block_at - query_window)

    q_tiles, kv_tiles = -(-block_len // FLEX_BLOCK), -(-kv_len // FLEX_BLOCK)
    kv_num_blocks = torch.full((1, 1, q_tiles), kv_tiles, dtype=torch.int32, device=q.device)
    kv_indices = torch.arange(kv_tiles, dtype=torch.int32, device=q.device).expand(1, 1, q_tiles, kv_tiles)
    block_mask = BlockMask.from_kv_blocks(kv_num_blocks, kv_indices.contiguous(), BLOCK_SIZE=FLEX_BLOCK,
                                          mask_mod=mask_mod, seq_lengths=(block_len, kv_len), compute_q_blocks=False)
    return flex(q, k, v, block_mask=block_mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])


@torch.compiler.disable  # its key slice needs host ints: in a compiled step this call runs eagerly
def flash_attn_attention(q, k, v, *, scale: float, causal: bool, ctx_first, block_at=None,
                         query_window: int | None = None) -> torch.Tensor:
    """flash-attn 2 on the visible key rows [ctx_first, block_at + B): its causal mask is bottom-right
    aligned (query j sees keys <= L' - B + j of the L' it is given), which is exactly the causal block;
    a `query_window` is its own (bottom-right aligned) left window."""
    from flash_attn import flash_attn_func

    block_len = q.shape[2]
    end = int(_block_at(q, k, block_at)) + block_len
    first = int(ctx_first)
    k, v = k[:, :, first:end], v[:, :, first:end]
    window = (-1, -1) if query_window is None else (query_window - 1, -1)
    out = flash_attn_func(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                          softmax_scale=scale, causal=causal, window_size=window)  # [1, B, nH, d]
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
