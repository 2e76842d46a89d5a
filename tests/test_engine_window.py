"""The serving engines' sliding window (the W keys ending at each query) in the runtime, which
`validate --engine` runs; training's window is anchor-relative (every slot sees positions >= anchor - W)."""

from __future__ import annotations

import pytest
import torch

from dflash_runtime.attention import eager_attention, flex_attention, sdpa_attention, visible_mask


def reference_mask(ctx_len: int, block_len: int, causal: bool, ctx_first: int, window: int) -> torch.Tensor:
    """Written from positions: the query of slot j sits at key index ctx_len + j; it sees keys from
    ctx_first on, none after itself when causal (the whole block when not), none W or more behind it."""
    rows = []
    for j in range(block_len):
        q = ctx_len + j
        rows.append([ctx_first <= k and (k <= q if causal else k < ctx_len + block_len) and q - k < window
                     for k in range(ctx_len + block_len)])
    return torch.tensor(rows)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window,ctx_first", [(3, 0), (6, 2), (40, 0)])
def test_query_window_mask(causal, window, ctx_first):
    got = visible_mask(10, 5, causal, ctx_first, "cpu", query_window=window)
    assert torch.equal(got, reference_mask(10, 5, causal, ctx_first, window))


@pytest.mark.parametrize("causal", [True, False])
def test_backends_agree_on_the_query_window(causal):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 5, 16, generator=g)
    k, v = torch.randn(1, 2, 17, 16, generator=g), torch.randn(1, 2, 17, 16, generator=g)
    kw = dict(scale=0.25, causal=causal, ctx_first=1, query_window=6)
    ref = eager_attention(q, k, v, **kw)
    assert not torch.allclose(ref, eager_attention(q, k, v, scale=0.25, causal=causal, ctx_first=1))
    for fn in (sdpa_attention, flex_attention):
        assert torch.allclose(fn(q, k, v, **kw), ref, atol=1e-5), fn.__name__


@pytest.mark.parametrize("causal", [True, False])
def test_flash_attn_gets_the_query_window_as_its_left_window(causal, monkeypatch):
    """flash-attn's own window_size (bottom-right aligned), through a CPU stand-in with its masking contract."""
    import importlib.machinery
    import sys
    import types

    from runtime_helpers import stand_in_flash_attn_func

    from dflash_runtime.attention import flash_attn_attention

    module = types.ModuleType("flash_attn")
    module.__spec__ = importlib.machinery.ModuleSpec("flash_attn", None)
    module.flash_attn_func = stand_in_flash_attn_func
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 4, 5, 16, generator=g)
    k, v = torch.randn(1, 2, 17, 16, generator=g), torch.randn(1, 2, 17, 16, generator=g)
    kw = dict(scale=0.25, causal=causal, ctx_first=2, query_window=6)
    assert torch.allclose(flash_attn_attention(q, k, v, **kw), eager_attention(q, k, v, **kw), atol=1e-5)


def test_draft_with_per_query_window(tiny_target, tmp_path):
    """A causal sliding draft, window W, context longer than W: slot 0 under the engines' window sees the
    same keys as under training's window W - 1 (its query is the anchor), so their outputs are equal; the
    last slot sees fewer context positions than training gives it, so its output moves."""
    from factories import make_speculators_draft

    from dflash_runtime.draft_load import load_draft

    W, T, B = 5, 12, 4
    path = make_speculators_draft(tmp_path / "w5", tiny_target, sliding_window=W, block_size=B)
    served = load_draft(path, backend="eager", window_per_query=True)
    trained = load_draft(path, backend="eager")
    shorter = load_draft(path, backend="eager")
    for layer in shorter.layers:
        layer.sliding_window = W - 1
    g = torch.Generator().manual_seed(1)
    features = torch.randn(T, served.fc.shape[1], generator=g)
    x = torch.randn(B, served.fc.shape[0], generator=g) * 0.02
    out = {}
    for name, d in (("served", served), ("trained", trained), ("shorter", shorter)):
        d.reset()
        d.add_context(features, 0)
        out[name] = d.block_hidden(x, T)
    assert torch.allclose(out["served"][0], out["shorter"][0], atol=1e-6)
    assert not torch.allclose(out["served"][-1], out["trained"][-1], atol=1e-4)
    assert torch.allclose(served.with_backend("sdpa").block_hidden(x, T), out["served"], atol=1e-5)
