"""checkpoint_checks / target_checks on drafts saved by speculators 0.9.0 itself, and on broken copies:
each broken copy must fail (or warn) with the check that names its problem."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from dflash_convert.format import mapping
from dflash_convert.io.checkpoint import open_checkpoint
from dflash_convert.io.reading import read_json
from dflash_convert.validate.static import checkpoint_checks, target_checks
from factories import copy_draft


def by_name(checks):
    return {c.name: c for c in checks}


def failing(checks):
    return sorted(c.name for c in checks if c.status == "fail")


@pytest.mark.parametrize("kind", ["full", "pruned", "legacy", "legacy_pruned", "mixed", "non_causal", "all_full",
                                  "last_layer", "dflash2"])
def test_real_speculators_drafts_pass(speculators_drafts, kind):
    checks = checkpoint_checks(open_checkpoint(speculators_drafts[kind]), scan=True)
    assert failing(checks) == []
    named = by_name(checks)
    assert named["fc_width"].status == "pass" and named["missing_tensors"].status == "pass"
    assert named["dtype"].status == "warn"  # factories save fp32: drafts should ship bf16
    if "pruned" in kind:
        assert named["d2t_range"].status == "pass" and named["t2d_consistency"].status == "pass"
    assert named["causality"].status == ("warn" if kind == "mixed" else "pass")


def test_converted_hf_draft_passes_and_target_checks(speculators_drafts, tiny_target, tmp_path, cli):
    out = tmp_path / "hf"
    assert cli("convert", speculators_drafts["pruned"], "-o", out, "--verifier", tiny_target).code == 0
    ckpt = open_checkpoint(out)
    checks = checkpoint_checks(ckpt)
    assert failing(checks) == [] and by_name(checks)["target_layer_ids_range"].status == "pass"
    info = mapping.target_info(read_json(tiny_target / "config.json"), "tiny")
    t = by_name(target_checks(ckpt.spec, info, ckpt=ckpt))
    assert {n: c.status for n, c in t.items()} == {
        "target_hidden_size": "pass", "target_layer_ids_in_target": "pass", "target_num_layers": "pass",
        "target_vocab_size": "pass", "target_mask_token_id": "pass", "target_mask_token_id_special": "pass",
        "target_draft_vocab": "pass",
        "target_d2t_range": "pass"}


def _fail_with(path, name, *, scan=False, status="fail"):
    checks = checkpoint_checks(open_checkpoint(path), scan=scan)
    c = by_name(checks)[name]
    assert c.status == status, (name, c)
    return c


def test_fc_of_the_wrong_width(speculators_drafts, tmp_path):
    import torch

    def widen(t):
        t["fc.weight"] = torch.cat([t["fc.weight"], t["fc.weight"][:, :64]], dim=1)

    c = _fail_with(copy_draft(speculators_drafts["full"], tmp_path / "d", edit_tensors=widen), "fc_width")
    assert c.value == [64, 256] and c.threshold == [64, 192] and "made for 4 ids" in c.message
    # the same mismatch from the config side: one id dropped
    spec = open_checkpoint(speculators_drafts["full"]).spec
    c = _fail_with(copy_draft(speculators_drafts["full"], tmp_path / "e", spec_update={"target_layer_ids": [0, 3]}),
                   "fc_width")
    assert "fc.weight" in c.message and "2 target ids" in c.message and spec.target_layer_ids == [0, 3, 5]


def test_attention_rows_missing_and_unknown_tensors(speculators_drafts, tmp_path):
    import torch

    def damage(t):
        t["layers.1.self_attn.k_proj.weight"] = t["layers.1.self_attn.k_proj.weight"][:16].clone()
        del t["layers.0.mlp.up_proj.weight"]
        t["layers.0.mlp.extra_proj.weight"] = torch.zeros(4, 4)

    d = copy_draft(speculators_drafts["full"], tmp_path / "d", edit_tensors=damage)
    checks = by_name(checkpoint_checks(open_checkpoint(d)))
    assert checks["attention_shapes"].status == "fail"
    assert "layers.1.self_attn.k_proj.weight [16, 64] != [32, 64]" in checks["attention_shapes"].message
    assert checks["missing_tensors"].value == ["layers.0.mlp.up_proj.weight"]
    assert checks["unexpected_tensors"].value == ["layers.0.mlp.extra_proj.weight"]


def test_target_ids_out_of_order(speculators_drafts, tmp_path):
    # (duplicate, negative or out-of-range ids are refused when the config is read: test_hostile_configs)
    d = copy_draft(speculators_drafts["full"], tmp_path / "d", spec_update={"target_layer_ids": [5, 3, 0]})
    c = _fail_with(d, "target_layer_ids")
    assert "increasing" in c.message and c.value == [5, 3, 0]


def test_mask_token_equal_to_eos(speculators_drafts, tiny_target, tmp_path):
    # (a mask id outside the vocab is refused when the config is read: test_hostile_configs)
    info = mapping.target_info(read_json(tiny_target / "config.json"), "tiny")
    for mask, status in ((info.eos_token_ids[0], "fail"), (info.pad_token_id, "warn")):
        spec = open_checkpoint(speculators_drafts["full"]).spec.model_copy(update={"mask_token_id": mask})
        c = by_name(target_checks(spec, info))["target_mask_token_id_special"]
        assert c.status == status and str(mask) in c.message


def test_pruned_draft_without_d2t_fails(speculators_drafts, tmp_path):
    def drop(t):
        del t["d2t"], t["t2d"]

    c = _fail_with(copy_draft(speculators_drafts["pruned"], tmp_path / "d", edit_tensors=drop), "vocab_map")
    assert "`d2t` missing" in c.message and "collapses" in c.message


def test_pruned_lm_head_in_a_config_claiming_full_vocab(speculators_drafts, tmp_path):
    d = copy_draft(speculators_drafts["pruned"], tmp_path / "d", spec_update={"draft_vocab_size": None},
                   edit_tensors=lambda t: t.pop("d2t"))
    assert "`d2t` missing" in _fail_with(d, "vocab_map").message


def test_d2t_out_of_range_and_t2d_inconsistent(speculators_drafts, tmp_path):
    def corrupt(t):
        t["d2t"][-1] += 100  # last draft id now maps past the vocab
        t["t2d"][t["t2d"].nonzero()[0]] = False  # one id fewer marked

    d = copy_draft(speculators_drafts["pruned"], tmp_path / "d", edit_tensors=corrupt)
    c = _fail_with(d, "d2t_range")
    assert c.value[1] >= 512 and "outside the target vocab" in c.message
    assert "marks 127 ids" in _fail_with(d, "t2d_consistency").message


def test_mixed_dtypes_warn(speculators_drafts, tmp_path):
    def half(t):
        t["norm.weight"] = t["norm.weight"].bfloat16()

    d = copy_draft(speculators_drafts["full"], tmp_path / "d", edit_tensors=half)
    assert "norm.weight" in _fail_with(d, "dtype", status="warn").message


def test_training_only_tensors_in_an_hf_checkpoint_warn(speculators_drafts, tmp_path, cli):
    import torch

    out = tmp_path / "hf"
    assert cli("convert", speculators_drafts["full"], "-o", out).code == 0
    d = copy_draft(out, tmp_path / "d", edit_tensors=lambda t: t.update({"verifier_norm.weight": torch.ones(64)}))
    assert _fail_with(d, "training_only_tensors", status="warn").value == ["verifier_norm.weight"]


def test_scan_finds_nan_and_zero_tensors(speculators_drafts, tmp_path):
    def spoil(t):
        t["layers.1.mlp.down_proj.weight"][3, 5] = float("nan")
        t["layers.0.self_attn.o_proj.weight"].zero_()

    d = copy_draft(speculators_drafts["full"], tmp_path / "d", edit_tensors=spoil)
    assert failing(checkpoint_checks(open_checkpoint(d))) == []  # header-only checks cannot see values
    assert "layers.1.mlp.down_proj.weight (1 of" in _fail_with(d, "finite_values", scan=True).message
    assert _fail_with(d, "degenerate_values", scan=True).value == ["layers.0.self_attn.o_proj.weight"]


def test_target_with_a_different_hidden_size(speculators_drafts, tiny_target):
    raw = read_json(tiny_target / "config.json")
    info = mapping.target_info({**raw, "hidden_size": 128, "num_hidden_layers": 4}, "other")
    t = by_name(target_checks(open_checkpoint(speculators_drafts["full"]).spec, info))
    assert t["target_hidden_size"].status == "fail" and t["target_hidden_size"].threshold == 128
    assert t["target_layer_ids_in_target"].status == "fail" and "[5]" in t["target_layer_ids_in_target"].message


def test_checks_without_scan_do_not_import_torch(speculators_drafts):
    import subprocess

    code = ("import sys; from dflash_convert.io.checkpoint import open_checkpoint; "
            "from dflash_convert.validate.static import checkpoint_checks; "
            f"checkpoint_checks(open_checkpoint({str(speculators_drafts['legacy_pruned'])!r})); "
            "assert 'torch' not in sys.modules")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_tensor_stored_in_two_shards(speculators_drafts, tmp_path, cli):
    from safetensors.torch import load_file, save_file

    from dflash_convert.validate.static import duplicate_tensors_check

    d = tmp_path / "sharded"
    shutil.copytree(speculators_drafts["full"], d)
    tensors = load_file(d / "model.safetensors")
    (d / "model.safetensors").unlink()
    names = sorted(tensors)
    first, second = names[: len(names) // 2], names[len(names) // 2:] + ["fc.weight"]
    save_file({n: tensors[n] for n in first}, d / "model-00001-of-00002.safetensors", metadata={"format": "pt"})
    save_file({n: tensors[n] for n in second}, d / "model-00002-of-00002.safetensors", metadata={"format": "pt"})
    weight_map = {n: "model-00001-of-00002.safetensors" for n in first}
    weight_map.update({n: "model-00002-of-00002.safetensors" for n in second if n not in weight_map})
    (d / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    c = duplicate_tensors_check(d)
    assert c.status == "fail" and "fc.weight (model-00001-of-00002.safetensors and model-00002" in c.message
    r = cli("validate", d, "--json")
    assert r.code == 3 and [x["name"] for x in r.json()["checks"] if x["status"] == "fail"] == ["duplicate_tensors"]
    assert duplicate_tensors_check(speculators_drafts["full"]).status == "pass"


def test_verifier_warns_when_the_draft_names_another_target(cli, tmp_path):
    """The bundled draft names examples/pair/target; validated against a copy of that config elsewhere under
    another name (a model of the same shape), `verifier` warns naming both; against the named target, a copy in
    a folder of the same name, or the Hub cache's folder of a Hub id, it passes."""
    from types import SimpleNamespace

    from dflash_convert.validate.static import verifier_against

    lookalike = tmp_path / "lookalike-target"
    lookalike.mkdir()
    shutil.copy("examples/pair/target/config.json", lookalike)
    r = cli("validate", "examples/pair/draft", "--target", lookalike, "--levels", "static", "--json")
    check = by_name_json(r.json())["verifier"]
    assert check["status"] == "warn" and "examples/pair/target" in check["message"] and str(lookalike) in \
        check["message"], check
    spec = SimpleNamespace(verifier=SimpleNamespace(name_or_path="Qwen/Qwen3-8B"))
    cached = tmp_path / "hub" / "models--Qwen--Qwen3-8B" / "snapshots" / "abc"
    assert verifier_against(spec, "Qwen/Qwen3-8B").status == "pass"
    assert verifier_against(spec, str(cached), cached).status == "pass"
    assert verifier_against(spec, "/models/qwen3-8b").status == "pass"
    assert verifier_against(spec, "/models/Llama-3-8B").status == "warn"
    r = cli("validate", "examples/pair/draft", "--target", "examples/pair/target", "--levels", "static", "--json")
    assert by_name_json(r.json())["verifier"]["status"] == "pass"


def by_name_json(report):
    return {c["name"]: c for c in report["checks"]}
