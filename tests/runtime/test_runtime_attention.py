"""Attention backends: each computes eager's function for every mask the drafts use; the capability
table refuses what a backend cannot serve and names the ones that can; masks mean what 6.4 says."""

from __future__ import annotations

import pytest
import torch

from dflash_convert.errors import DFlashError
from dflash_runtime import attention, load_draft
from dflash_runtime.attention import ALL_DTYPES, BACKENDS, Backend, select_backend, visible_mask
from runtime_helpers import (DEVICES, close, one_torch_thread, our_block_logits, speculators_draft,  # noqa: F401
                             stand_in_flash_attn_func, target_context)

RUNNABLE = [name for name, b in BACKENDS.items() if b.why_not([True], True, "cpu", torch.float32) is None]
TOL = {torch.float32: 2e-6, torch.bfloat16: 2e-2}


def test_visible_mask_is_block_aligned_not_top_left():
    m = visible_mask(ctx_len=4, block_len=3, causal=True, ctx_first=1, device="cpu").int()
    assert m.tolist() == [[0, 1, 1, 1, 1, 0, 0],
                          [0, 1, 1, 1, 1, 1, 0],
                          [0, 1, 1, 1, 1, 1, 1]]
    assert visible_mask(4, 3, False, 0, "cpu").all()


def runnable(device: str, dtype: torch.dtype) -> list[str]:
    """Backends that serve every layer kind on this device and dtype (flash_attn: installed, CUDA, 16-bit)."""
    return [name for name, b in BACKENDS.items() if b.why_not([True], True, device, dtype) is None]


def qkv(T, B, nH, nKV, d, dtype, device, extra=0, seed=0):
    """q [1, nH, B, d]; k, v [1, nKV, T + B + extra, d] (extra: free rows after the block, as in a static cache)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, nH, B, d, generator=g).to(device, dtype),
            torch.randn(1, nKV, T + B + extra, d, generator=g).to(device, dtype),
            torch.randn(1, nKV, T + B + extra, d, generator=g).to(device, dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("causal,ctx_first,extra", [(False, 0, 0), (True, 0, 0), (False, 9, 0), (True, 9, 0),
                                                    (True, 40, 0), (False, 0, 24), (True, 9, 24)])
def test_backends_agree_with_eager(device, dtype, causal, ctx_first, extra):
    T, B, d = 40, 16, 32
    q, k, v = qkv(T, B, 8, 2, d, dtype, device, extra)
    block_at = T if extra else None
    ref = attention.eager_attention(q, k, v, scale=d ** -0.5, causal=causal, ctx_first=ctx_first,
                                    block_at=block_at).float()
    names = runnable(device, dtype)
    assert len(names) >= 3  # eager, sdpa, flex everywhere (+ flash_attn on CUDA where installed)
    for name in names:
        out = BACKENDS[name].fn(q, k, v, scale=d ** -0.5, causal=causal, ctx_first=ctx_first, block_at=block_at)
        assert out.shape == q.shape and out.dtype == dtype
        assert (out.float() - ref).abs().max() <= TOL[dtype] * max(1.0, ref.abs().max()), name
    if extra:  # the free rows after the block are never seen: changing them changes nothing
        k2, v2 = k.clone(), v.clone()
        k2[:, :, T + B:], v2[:, :, T + B:] = 7.0, -7.0
        for name in names:
            assert torch.equal(BACKENDS[name].fn(q, k2, v2, scale=d ** -0.5, causal=causal, ctx_first=ctx_first,
                                                 block_at=block_at),
                               BACKENDS[name].fn(q, k, v, scale=d ** -0.5, causal=causal, ctx_first=ctx_first,
                                                 block_at=block_at)), name


def test_auto_and_explicit_selection():
    assert select_backend("auto", [False, True], True, "cpu", torch.float32) == "sdpa"
    assert select_backend("flex", [True], False, "cpu", torch.bfloat16) == "flex"
    with pytest.raises(DFlashError, match="backend 'flash_attn' cannot run this non-causal draft on cpu: .*"
                                          "backends that can: sdpa, flex, eager"):
        select_backend("flash_attn", [False, False], False, "cpu", torch.bfloat16)
    with pytest.raises(DFlashError, match="unknown attention backend 'xformers'"):
        select_backend("xformers", [True], False, "cpu", torch.float32)


def test_backend_without_non_causal_support_is_refused_for_non_causal_layers(monkeypatch):
    causal_only = Backend("causal_only", attention.sdpa_attention, non_causal=False, causal=True,
                          sliding_window=True, devices=("cpu",), dtypes=(torch.float32,))
    monkeypatch.setitem(BACKENDS, "causal_only", causal_only)
    assert select_backend("causal_only", [True, True], True, "cpu", torch.float32) == "causal_only"
    with pytest.raises(DFlashError, match="cannot run this mixed causal/non-causal draft on cpu: it has no "
                                          "non-causal .*backends that can: sdpa, flex, eager"):
        select_backend("causal_only", [False, True], True, "cpu", torch.float32)


@pytest.fixture(scope="session")
def attention_drafts(speculators_drafts, tiny_target):
    return {"non_causal": speculators_drafts["non_causal"], "causal": speculators_drafts["full"],
            "mixed": speculators_drafts["mixed"],
            "sliding": speculators_draft(tiny_target, "window4", sliding_window=4, draft_vocab=200)}


@pytest.fixture(scope="session")
def context(runtime_target, attention_drafts):
    """Target features of 24 random tokens (all drafts here use the same ids)."""
    target = runtime_target
    draft = load_draft(attention_drafts["causal"])
    _, features, block = target_context(target, draft, 24, seed=5)
    return target, features, block


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["non_causal", "causal", "mixed", "sliding"])
def test_every_backend_runs_every_draft_like_eager(kind, device, attention_drafts, context):
    """Against the fp32 eager draft on the CPU, within REL_TOL of the dtype (runtime_helpers)."""
    target, features, block = context
    ref = our_block_logits(load_draft(attention_drafts[kind], backend="eager"), target, features, block)
    for dtype in (torch.float32, torch.bfloat16):
        for name in runnable(device, dtype):
            if dtype == torch.float32:
                draft = load_draft(attention_drafts[kind], backend=name, dtype=dtype, device=device)
            else:  # the same weights, switched backend
                draft = load_draft(attention_drafts[kind], backend="eager", dtype=dtype, device=device).with_backend(name)
            assert draft.backend == name
            draft.reset()
            draft.add_context(features.to(device), 0)
            hidden = draft.block_hidden(target.embed(block).to(device), features.shape[0])
            out = draft.logits(hidden.cpu() if draft.lm_head is None else hidden, target.lm_head)
            assert close(out, ref, dtype), (name, dtype)


def test_causal_and_non_causal_differ_exactly_where_they_should(attention_drafts, context):
    """Slot j of a causal block sees slots <= j only: changing the last slot's token changes no
    earlier slot; in a non-causal block it changes every slot."""
    target, features, block = context
    other = block.clone()
    other[-1] = 7
    causal, bidir = load_draft(attention_drafts["causal"], causal=True), load_draft(attention_drafts["causal"],
                                                                                   causal=False)
    c1, c2 = our_block_logits(causal, target, features, block), our_block_logits(causal, target, features, other)
    b1, b2 = our_block_logits(bidir, target, features, block), our_block_logits(bidir, target, features, other)
    assert torch.equal(c1[:-1], c2[:-1]) and not torch.allclose(c1[-1], c2[-1], atol=1e-4)
    assert ((b1 - b2).abs().amax(dim=-1) > 1e-4).all()
    assert ((c1 - b1).abs().amax(dim=-1)[:-1] > 1e-4).all()


def test_sliding_window_limits_the_visible_context(attention_drafts, context):
    """Window 4, anchor at s = 24: context positions >= 20 are seen, 19 and before are not."""
    target, features, block = context
    draft = load_draft(attention_drafts["sliding"])
    assert [l.sliding_window for l in draft.layers] == [4, 4]
    ref = our_block_logits(draft, target, features, block)
    early = features.clone()
    early[:20] = torch.randn_like(early[:20])
    assert torch.equal(our_block_logits(draft, target, early, block), ref)
    edge = features.clone()
    edge[20] = torch.randn_like(edge[20])
    assert not torch.allclose(our_block_logits(draft, target, edge, block), ref, atol=1e-4)
    # the same draft with its window lifted does see position 19
    wide = load_draft(attention_drafts["causal"])
    assert not torch.allclose(our_block_logits(wide, target, early, block),
                              our_block_logits(wide, target, features, block), atol=1e-4)


def test_draft_window_limits_the_visible_context(attention_drafts, context):
    target, features, block = context
    draft = load_draft(attention_drafts["non_causal"])

    def run(feats, window):
        draft.reset()
        draft.add_context(feats, 0)
        return draft.logits(draft.block_hidden(target.embed(block), 24, draft_window=window), target.lm_head)

    ref = run(features, 6)
    early = features.clone()
    early[:18] = torch.randn_like(early[:18])
    assert torch.equal(run(early, 6), ref)
    assert not torch.allclose(run(early, None), run(features, None), atol=1e-4)
    draft.keep_last_context(6)  # trimming the cache to the window changes nothing
    assert len(draft.cache) == 6
    trimmed = draft.logits(draft.block_hidden(target.embed(block), 24, draft_window=6), target.lm_head)
    assert torch.allclose(trimmed, run(features, 6), atol=1e-6)  # (masked vs sliced SDPA: last-bit noise)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_flex_with_tensor_scalars_equals_eager(device):
    """As inside the compiled draft step: the whole static cache as keys, the mask's positions as
    0-dim tensors; one compile serves different positions."""
    torch._dynamo.reset()  # the other device's parameter compiled this function already
    flex = torch.compile(attention.flex_attention, dynamic=False, fullgraph=True)
    q, k, v = qkv(40, 8, 4, 2, 16, torch.float32, device, extra=80, seed=1)
    with torch._dynamo.config.patch(recompile_limit=1, fail_on_recompile_limit_hit=True):
        for block_at, causal, ctx_first in ((40, True, 0), (75, True, 30), (60, True, 59)):
            kw = dict(scale=0.25, causal=causal)
            ref = attention.eager_attention(q, k, v, ctx_first=ctx_first, block_at=block_at, **kw)
            out = flex(q, k, v, ctx_first=torch.tensor(ctx_first, device=device),
                       block_at=torch.tensor(block_at, device=device), **kw)
            assert torch.allclose(out, ref, atol=1e-5), (block_at, ctx_first)


# ----------------------------------------------------------------------------- flash-attn, on CPU too


@pytest.fixture
def stand_in_flash_attn(monkeypatch):
    """A `flash_attn` module on CPU with the real one's masking contract, and the backend allowed on CPU."""
    import importlib.machinery
    import sys
    import types

    module = types.ModuleType("flash_attn")
    module.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
    module.flash_attn_func = stand_in_flash_attn_func
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    real = BACKENDS["flash_attn"]
    monkeypatch.setitem(BACKENDS, "flash_attn", Backend("flash_attn", real.fn, non_causal=real.non_causal,
                                                        causal=real.causal, sliding_window=real.sliding_window,
                                                        devices=("cpu",), dtypes=ALL_DTYPES, requires="flash_attn"))


def test_stand_in_has_flash_attn_bottom_right_causal_alignment():
    q, k, v = (torch.randn(1, n, 1, 4) for n in (2, 5, 5))
    out = stand_in_flash_attn_func(q, k, v, causal=True)
    # query 0 sits at key 3 (of 0..4): it sees keys 0..3, so key 4 cannot move it; query 1 sees key 4
    v2 = v.clone()
    v2[:, 4] += 1
    moved = stand_in_flash_attn_func(q, k, v2, causal=True)
    assert torch.equal(out[:, 0], moved[:, 0]) and not torch.equal(out[:, 1], moved[:, 1])


@pytest.mark.parametrize("causal,ctx_first,extra", [(False, 0, 0), (True, 0, 0), (False, 9, 0), (True, 9, 24),
                                                    (True, 40, 0), (False, 13, 24)])
def test_flash_attn_path_equals_eager(stand_in_flash_attn, causal, ctx_first, extra):
    """The flash-attn backend's key slicing (context window, free rows after the block) on CPU."""
    T, B, d = 40, 16, 32
    q, k, v = qkv(T, B, 8, 2, d, torch.float32, "cpu", extra)
    kw = dict(scale=d ** -0.5, causal=causal, block_at=T if extra else None)
    ref = attention.eager_attention(q, k, v, ctx_first=ctx_first, **kw)
    out = attention.flash_attn_attention(q, k, v, ctx_first=torch.tensor(ctx_first), **kw)
    assert torch.allclose(out, ref, atol=1e-5)


@pytest.mark.parametrize("kind", ["causal", "mixed", "sliding"])
def test_draft_with_flash_attn_backend_runs_like_eager(stand_in_flash_attn, kind, attention_drafts, context):
    target, features, block = context
    ref = our_block_logits(load_draft(attention_drafts[kind], backend="eager"), target, features, block)
    draft = load_draft(attention_drafts[kind], backend="flash_attn")
    assert draft.backend == "flash_attn"
    assert close(our_block_logits(draft, target, features, block), ref, torch.float32)
