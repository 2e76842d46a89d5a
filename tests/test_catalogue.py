"""The tensor catalogue and the dtype table are the single source of their facts: checked against
drafts saved by speculators itself, against torch and against what safetensors writes."""

from __future__ import annotations

import json
import math
import struct
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from dflash_convert.format import catalogue
from dflash_convert.io.checkpoint import open_checkpoint
from dflash_convert.format.dtypes import CAST_TARGETS, DTYPES, torch_dtype
from dflash_convert.errors import DFlashError

KINDS = ["full", "pruned", "legacy", "legacy_pruned", "mixed", "non_causal", "all_full", "last_layer", "dflash2"]


@pytest.mark.parametrize("kind", KINDS)
def test_catalogue_sizes_every_tensor_speculators_saves(speculators_drafts, kind):
    """Every tensor of every fixture variant is in the catalogue with the shape the spec gives it, and
    every tensor the catalogue requires is there: no other table is consulted."""
    ckpt = open_checkpoint(speculators_drafts[kind])
    spec = ckpt.spec
    for name, info in ckpt.tensors.items():
        rule = catalogue.rule_for(name, spec.variant)
        assert rule is not None, name
        want = rule.shape(spec)
        assert want is None and spec.variant == "dflash2" or tuple(info.shape) == want, (name, info.shape, want)
    expected = catalogue.expected_shapes(spec)
    assert {n: tuple(ckpt.tensors[n].shape) for n in expected} == expected
    assert catalogue.tensor_problems(spec, {n: i.shape for n, i in ckpt.tensors.items()}) == []
    # what conversion keeps is what the catalogue says a draft of this spec needs (plus dflash2 extras)
    kept = {n for n in ckpt.tensors
            if catalogue.tensor_action(catalogue.rule_for(n), "hf", spec.is_pruned_vocab) == "keep"}
    assert set(expected) <= kept and all(catalogue.rule_for(n).variants == ("dflash2",) for n in kept - set(expected))


def test_per_layer_names_and_keys():
    assert catalogue.name("q_proj", 3) == "layers.3.self_attn.q_proj.weight"
    assert catalogue.rule_for("layers.12.mlp.down_proj.weight").key == "down_proj"
    assert catalogue.rule_for("layers.x.mlp.down_proj.weight") is None  # the index is a number
    assert catalogue.rule_for("layers.0.mlp_conv.base_kernel", "dflash") is None
    assert catalogue.rule_for("layers.0.mlp_conv.base_kernel", "dflash2").variants == ("dflash2",)
    assert catalogue.canonical_name("model.layers.0.input_layernorm.weight") == "layers.0.input_layernorm.weight"
    assert catalogue.canonical_name("model.unknown") == "model.unknown"
    assert len({t.key for t in catalogue.entries()}) == len(catalogue.entries())


def test_tensor_set_validator_names_each_problem(speculators_drafts):
    ckpt = open_checkpoint(speculators_drafts["full"])
    spec = ckpt.spec
    have = {n: i.shape for n, i in ckpt.tensors.items()}
    assert catalogue.tensor_problems(spec, have) == []
    broken = dict(have)
    broken["layers.2.mlp.up_proj.weight"] = have["layers.0.mlp.up_proj.weight"]  # a layer the config lacks
    del broken["hidden_norm.weight"]
    broken["layers.0.self_attn.q_norm.weight"] = (3,)
    problems = catalogue.tensor_problems(spec, broken)
    assert [(p.kind, p.tensor, p.check) for p in problems] == [
        ("unexpected", "layers.2.mlp.up_proj.weight", "unexpected_tensors"),
        ("missing", "hidden_norm.weight", "missing_tensors"),
        ("shape", "layers.0.self_attn.q_norm.weight", "tensor_shapes")]
    assert "num_hidden_layers=2" in problems[0].message and "[3], expected [16]" in problems[2].message


def test_runtime_loads_exactly_the_catalogue_tensors(speculators_drafts):
    from dflash_runtime import load_draft

    for kind in ("pruned", "full"):
        draft = load_draft(speculators_drafts[kind])
        spec = draft.spec
        assert list(draft.fc.shape) == list(catalogue.expected_shapes(spec)[catalogue.name("fc")])
        if spec.is_pruned_vocab:
            ckpt = open_checkpoint(speculators_drafts[kind])
            assert draft.draft_to_target.tolist() == ckpt.d2t_target_ids().tolist()
            assert draft.lm_head.shape == (spec.draft_vocab_size, spec.hidden_size)
        else:
            assert draft.lm_head is None and draft.draft_to_target is None


def test_benchmark_shapes_come_from_the_catalogue():
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import _shapes

    from dflash_convert.format.mapping import spec_from_config

    shapes = dict(_shapes.draft_shapes(2))
    spec = spec_from_config(_shapes.config("speculators", 2))
    assert shapes == catalogue.expected_shapes(spec)
    assert shapes["fc.weight"] == (_shapes.H, 5 * _shapes.H) and len(shapes) == 3 + 2 * 11
    assert _shapes.size_bytes(2) == 2 * sum(math.prod(s) for s in shapes.values())


# ----------------------------------------------------------------------------- dtype table

def _safetensors_code(dtype: torch.dtype) -> str:
    from safetensors.torch import save

    raw = save({"x": torch.zeros(16, dtype=torch.uint8).view(dtype)})
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + n])["x"]["dtype"]


@pytest.mark.parametrize("code", sorted(DTYPES))
def test_dtype_table_agrees_with_torch_numpy_and_safetensors(code):
    d = DTYPES[code]
    t = torch_dtype(code)
    assert _safetensors_code(t) == code  # the code safetensors itself writes for this torch dtype
    assert t.itemsize == d.itemsize and t.is_floating_point == d.is_float and (t == torch.bool) == (d.kind == "bool")
    if d.numpy:
        assert np.dtype(d.numpy).itemsize == d.itemsize
    if not d.is_float:
        return
    # the raw-bit NaN/Inf test flags exactly the non-finite values torch produces in this dtype
    values = torch.tensor([0.0, 1.0, -2.5, 0.125, 3.0, float("nan"), float("inf"), float("-inf")])
    cast = values.to(t)
    bits = cast.view(torch.uint8).numpy().view(d.bits)
    flagged = (bits & d.nan_mask) == d.nan_value
    assert flagged.tolist() == (~torch.isfinite(cast.float())).tolist()
    if d.zero_mask is not None:
        assert ((bits & d.zero_mask) == 0).tolist() == (cast.float() == 0).tolist()
    else:
        assert not (cast.float() == 0).any()


def test_cast_targets_are_the_runtime_dtypes():
    from dflash_runtime import resolve_dtype

    assert list(CAST_TARGETS) == ["float32", "bfloat16", "float16"]
    for name, code in CAST_TARGETS.items():
        assert resolve_dtype(name) is torch_dtype(code) is resolve_dtype(DTYPES[code].short)


def _write_e8m0_draft(src: Path, dst: Path) -> Path:
    """A copy of a draft whose final norm is stored as F8_E8M0 (an exponent-only float8)."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    tensors["norm.weight"] = tensors["norm.weight"].abs().clamp_min(0.5).to(torch.float8_e8m0fnu)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_f8_e8m0_loads_and_a_dtype_torch_lacks_is_one_line(speculators_drafts, tmp_path, monkeypatch):
    d = _write_e8m0_draft(speculators_drafts["full"], tmp_path / "e8m0")
    ckpt = open_checkpoint(d)
    assert ckpt.tensors["norm.weight"].dtype == "F8_E8M0"
    assert ckpt.load_tensor("norm.weight").dtype == torch.float8_e8m0fnu  # torch 2.13 has it
    monkeypatch.delattr(torch, "float8_e8m0fnu")  # an older torch
    with pytest.raises(DFlashError) as exc:
        ckpt.load_tensor("norm.weight")
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(str(d / "model.safetensors"))
    assert "tensor `norm.weight`: dtype F8_E8M0 has no torch equivalent in torch" in msg


def test_f8_e8m0_through_the_cli(speculators_drafts, tmp_path, cli, monkeypatch):
    d = _write_e8m0_draft(speculators_drafts["full"], tmp_path / "e8m0")
    r = cli("inspect", d, "--scan", "--json")
    assert r.code == 0 and {"F32", "F8_E8M0"} == set(r.json()["dtype"])
    out = tmp_path / "out"
    assert cli("convert", d, "-o", out, "--dtype", "bfloat16").code == 0  # e8m0 kept as is, f32 cast
    assert open_checkpoint(out).tensors["norm.weight"].dtype == "F8_E8M0"
    monkeypatch.delattr(torch, "float8_e8m0fnu")
    r = cli("validate", d, "--levels", "static,numeric", "--json")
    assert r.code == 3 and "norm.weight`: dtype F8_E8M0 has no torch equivalent" in r.out


# ----------------------------------------------------------------------------- draft/target compatibility

def test_hidden_size_mismatch_fails_static_convert_and_runtime_alike(tiny_target, tmp_path, cli):
    """A draft whose target_hidden_size matches the target but whose own hidden size does not: the
    block is embedded with the target's table, so it cannot run. Static validation, conversion with
    --verifier and the runtime refuse it with the one rule (compat's target_hidden_size)."""
    from safetensors.torch import load_file, save_file

    from dflash_convert.io.reading import read_json
    from dflash_convert.validate.static import target_checks
    from dflash_convert.format.mapping import target_info
    from dflash_runtime import check_pair, load_draft, load_target
    from runtime_helpers import write_hf_draft

    d = write_hf_draft(tmp_path / "d", hidden=32, target_ids=(0, 3, 7))
    cfg = json.loads((d / "config.json").read_text())
    cfg["target_hidden_size"] = 64  # the tiny target's hidden size; fc is sized for it
    (d / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(d / "model.safetensors")
    tensors["fc.weight"] = torch.randn(32, 3 * 64) * 0.05
    save_file(tensors, d / "model.safetensors", metadata={"format": "pt"})

    spec = open_checkpoint(d).spec
    static = {c.name: c for c in target_checks(spec, target_info(read_json(tiny_target / "config.json"), "t"))}
    assert static["target_hidden_size"].status == "fail" and "hidden size is 32" in static["target_hidden_size"].message
    r = cli("validate", d, "--target", tiny_target, "--levels", "static", "--json")
    assert r.code == 3 and "target_hidden_size" in [c["name"] for c in r.json()["checks"] if c["status"] == "fail"]

    with pytest.raises(DFlashError, match="the draft's hidden size is 32") as runtime:
        check_pair(load_draft(d), load_target(tiny_target))
    assert static["target_hidden_size"].message.split("; ", 1)[1] == str(runtime.value).split("; ", 1)[1]
    out = tmp_path / "out"
    r = cli("convert", d, "-o", out, "--verifier", tiny_target)
    assert r.code == 1 and "the draft's hidden size is 32" in r.err and not out.exists()


def test_convert_with_verifier_checks_the_mask_against_eos_and_pad(speculators_drafts, tiny_target, tmp_path, cli):
    from dflash_convert.io.reading import read_json

    raw = read_json(tiny_target / "config.json")
    out = tmp_path / "eos"
    r = cli("convert", speculators_drafts["full"], "-o", out, "--verifier", tiny_target,
            "--mask-token-id", raw["eos_token_id"])
    assert r.code == 1 and f"mask_token_id {raw['eos_token_id']} is the eos token" in r.err and not out.exists()
    out = tmp_path / "pad"
    r = cli("convert", speculators_drafts["full"], "-o", out, "--verifier", tiny_target,
            "--mask-token-id", raw["pad_token_id"], "--json")
    assert r.code == 0
    record = json.loads((out / "conversion.json").read_text())
    assert any(f"mask_token_id {raw['pad_token_id']} is the pad token" in w for w in record["warnings"])
