"""`verifier_*` tensors (training-only copies of the target's lm_head and norm) through convert.

speculators drafts may carry verifier_lm_head.weight / verifier_norm.weight. The tensor rules drop
them in both directions (engines use the target's own); they are sized when present.
"""

from __future__ import annotations

import json
import shutil

import pytest


def with_verifier_copies(src, dst, *, norm_shape=None):
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    t = load_file(dst / "model.safetensors")
    hidden = t["norm.weight"].shape[0]
    cfg = json.loads((dst / "config.json").read_text())
    rows = t["lm_head.weight"].shape[0] if "lm_head.weight" in t else cfg.get(
        "transformer_layer_config", cfg)["vocab_size"]
    t["verifier_norm.weight"] = torch.full(norm_shape or (hidden,), 3.0)
    t["verifier_lm_head.weight"] = torch.randn(rows, hidden)
    save_file(t, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("draft", ["full", "pruned"])
@pytest.mark.parametrize("to", ["hf", "speculators"])
def test_verifier_copies_are_dropped(cli, speculators_drafts, tmp_path, draft, to):
    from safetensors import safe_open

    src = with_verifier_copies(speculators_drafts[draft], tmp_path / "src")
    out = tmp_path / "out"
    r = cli("convert", src, "-o", out, "--to", to)
    assert r.code == 0, r.err
    with safe_open(str(out / "model.safetensors"), "np") as f:
        names = set(f.keys())
    assert not {n for n in names if n.startswith("verifier_")}, names
    record = json.loads((out / "conversion.json").read_text())
    for name in ("verifier_norm.weight", "verifier_lm_head.weight"):
        assert name in record["tensors_dropped"] and "verifier" in record["tensors_dropped"][name]
    assert cli("diff", speculators_drafts[draft], out).code == 0  # nothing else changed


def test_verifier_copies_in_an_hf_checkpoint_are_dropped(cli, speculators_drafts, tmp_path):
    from safetensors import safe_open

    hf = tmp_path / "hf"
    assert cli("convert", speculators_drafts["full"], "-o", hf).code == 0
    src = with_verifier_copies(hf, tmp_path / "src")
    out = tmp_path / "out"
    r = cli("convert", src, "-o", out)
    assert r.code == 0, r.err
    with safe_open(str(out / "model.safetensors"), "np") as f:
        assert not [n for n in f.keys() if n.startswith("verifier_")]


def test_missized_verifier_copy_is_refused(cli, speculators_drafts, tmp_path):
    src = with_verifier_copies(speculators_drafts["full"], tmp_path / "src", norm_shape=(7,))
    out = tmp_path / "out"
    r = cli("convert", src, "-o", out)
    assert r.code == 1 and "verifier_norm.weight" in r.err and "[7]" in r.err, r.err
    assert not out.exists()
