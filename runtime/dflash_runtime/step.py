"""One draft step as plain functions of the draft (`d`, a DFlashDraft), so that torch.compile captures it whole
(docs/formats.md sections 1 and 5; batch 1, H draft hidden, A*Ht context width, B block, P proposing slots,
V target vocab):
    write_context: features [n, A*Ht] --fc, hidden_norm--> ctx [n, H] --k/v per layer, RoPE--> cache rows
    draft_step: ids [B] --target embedding--> x [B, H] --block_forward: layers attend to cache + block-->
                hidden [B, H] --the proposing rows [P, H], block_logits--> logits [P, V] --the head's outputs-->
Positions are ints when run eagerly and 0-dim long tensors in the compiled step, where nothing the graph
specialises on changes from one step to the next. kv_lo/kv_hi: the cache rows attended (eager: just the
visible span; compiled: the whole cache, masked).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from . import dflash2
from .rope import apply_rope, rope_tables


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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm: statistics in float32, weight applied in the input dtype."""
    dtype = x.dtype
    x32 = x.float()
    x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x32.to(dtype)


def _later(a, b):
    return torch.maximum(a, b) if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor) else max(a, b)


def write_context(d, features: torch.Tensor, start) -> None:
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


def block_forward(d, x: torch.Tensor, start, ctx_first, kv_lo, kv_hi: int,
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


def block_logits(d, hidden: torch.Tensor, target_lm_head: Callable[[torch.Tensor], torch.Tensor]
                 ) -> torch.Tensor:
    """hidden [n, H] -> float32 logits [n, V] over the TARGET vocab (ids outside a pruned vocab get -inf)."""
    if d.lm_head is None:
        weight = getattr(target_lm_head, "weight", None)
        return target_lm_head(hidden.to(weight.dtype if weight is not None else hidden.dtype)).float()
    draft_logits = F.linear(hidden, d.lm_head).float()  # [n, Vd]
    full = torch.full((hidden.shape[0], d.spec.vocab_size), float("-inf"), device=hidden.device)
    full[:, d.draft_to_target] = draft_logits
    return full


def draft_step(d, ids: torch.Tensor, start, ctx_first, kv_lo, kv_hi: int,
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


def draft_step_walk(d, ids: torch.Tensor, start, ctx_first, kv_lo, kv_hi: int,
                    embed: Callable[[torch.Tensor], torch.Tensor], lm_head: Callable[[torch.Tensor], torch.Tensor]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """draft_step followed by the head's greedy walk (dflash2's selector, DSpark's Markov head), in one graph when
    compiled: the walk's slots, one after another, are many small kernels that would otherwise be launched one by
    one after the step's graph. -> the head's pick (ids [P], logits [P, V], confidences [P] or None)."""
    outputs = draft_step(d, ids, start, ctx_first, kv_lo, kv_hi, embed, lm_head)
    return d.head.pick(ids[0], outputs, temperature=0.0, generator=None)


STEP_FUNCTIONS = {"step": draft_step, "step_walk": draft_step_walk, "context": write_context}
