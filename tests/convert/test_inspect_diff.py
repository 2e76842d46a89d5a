"""inspect and diff on real speculators drafts and their conversions."""

from __future__ import annotations

import json
import shutil

from factories import read_config


def test_inspect_speculators_and_hf(cli, speculators_drafts, tmp_path):
    r = cli("inspect", speculators_drafts["pruned"], "--engine", "vllm", "--json")  # vLLM serves a pruned vocab
    assert r.code == 0, r.err
    info = r.json()
    assert info["format"] == "speculators" and info["variant"] == "dflash"
    assert info["target_layer_ids"] == [0, 3, 5] and info["aux_hidden_state_layer_ids"] == [1, 4, 6]
    assert info["block_size"] == 8 and info["speculative_tokens"] == 7
    assert info["mask_token_id"] == 511
    assert info["layer_causal"] == [True, True]
    assert info["vocab_size"] == 512 and info["draft_vocab_size"] == 128
    assert {t["name"] for t in info["tensors"]} >= {"d2t", "t2d", "lm_head.weight", "fc.weight"}
    # parameters an engine loads: body + pruned lm_head (+ d2t), not t2d
    assert info["parameters"] == sum(
        __import__("math").prod(t["shape"]) for t in info["tensors"] if t["name"] != "t2d")
    hf = tmp_path / "hf"
    assert cli("convert", speculators_drafts["mixed"], "-o", hf).code == 0
    info = cli("inspect", hf, "--json").json()
    assert info["format"] == "hf" and info["layer_causal"] == [False, True] and info["causal_flag"] is None


def test_inspect_reports_problems_and_exits_3(cli, speculators_drafts, tmp_path):
    src = tmp_path / "src"
    shutil.copytree(speculators_drafts["full"], src)
    cfg = read_config(src)
    cfg["aux_hidden_state_layer_ids"] = [7, 2, 5]  # valid ids, captured in another order than listed
    (src / "config.json").write_text(json.dumps(cfg))
    r = cli("inspect", src, "--json")
    assert r.code == 3
    problems = r.json()["problems"]
    assert any(p["status"] == "fail" and p["name"] == "target_layer_ids" for p in problems)
    r = cli("inspect", src)
    assert r.code == 3 and "FAIL" in r.out and "increasing" in r.out and r.err == ""


def test_inspect_scan_finds_nan(cli, speculators_drafts, tmp_path):
    import torch
    from safetensors.torch import load_file, save_file

    src = tmp_path / "src"
    shutil.copytree(speculators_drafts["full"], src)
    t = load_file(src / "model.safetensors")
    t["norm.weight"][0] = float("nan")
    save_file(t, src / "model.safetensors", metadata={"format": "pt"})
    assert cli("inspect", src, "--json").code == 0  # headers only: values not read
    r = cli("inspect", src, "--scan", "--json")
    assert r.code == 3
    assert any("norm.weight" in (p["message"] or "") for p in r.json()["problems"])


def test_diff_across_formats_and_differences(cli, speculators_drafts, tmp_path):
    hf = tmp_path / "hf"
    assert cli("convert", speculators_drafts["pruned"], "-o", hf).code == 0
    r = cli("diff", speculators_drafts["pruned"], hf, "--json")
    assert r.code == 0, r.err
    d = r.json()
    assert d["equivalent"] and d["format_a"] == "speculators" and d["format_b"] == "hf"
    assert "a:t2d" in d["ignored_tensors"]  # dropped by design, not a difference
    # an off-by-one id is a config difference, across formats
    cfg = read_config(hf)
    cfg["dflash_config"]["target_layer_ids"] = [1, 4, 6]
    (hf / "config.json").write_text(json.dumps(cfg))
    d = cli("diff", speculators_drafts["pruned"], hf, "--json")
    assert d.code == 3 and d.json()["config_differences"]["target_layer_ids"] == {"a": [0, 3, 5], "b": [1, 4, 6]}
    # a changed tensor reports its max abs difference; a tolerance can accept it
    bf = tmp_path / "bf16"
    assert cli("convert", speculators_drafts["pruned"], "-o", bf, "--dtype", "bfloat16").code == 0
    d = cli("diff", speculators_drafts["pruned"], bf, "--json")
    assert d.code == 3
    fc = d.json()["tensors"]["fc.weight"]
    assert fc["status"] == "differs" and 0 < fc["max_abs_diff"] < 1e-2
    assert cli("diff", speculators_drafts["pruned"], bf, "--tolerance", "0.05").code == 0  # bf16 rounding of weights near 1


def test_an_engine_view_that_errs_is_a_problem(cli, speculators_drafts, tmp_path):
    """A pruned-vocab draft: SGLang and z-lab's loader do not serve its vocab as trained (an ERROR in their
    views). That is a problem like any other: a FAIL line, the verdict line, `ok`/`problems` in the JSON and
    exit 3; the engine that serves it as trained (vLLM) passes. `convert` warns about it."""
    r = cli("inspect", speculators_drafts["pruned"])
    lines = r.out.splitlines()
    assert r.code == 3 and "FAILED: 2 failed" in lines[-1] and "no problems found" not in r.out, r.out
    assert any(line.startswith("FAIL engine_view.sglang: SGLang, by 0.5.23's rules as converted: DIFFERS") for line in lines), r.out
    info = cli("inspect", speculators_drafts["pruned"], "--json").json()
    assert info["ok"] is False and {"engine_view.sglang", "engine_view.zlab"} <= {p["name"] for p in info["problems"]}
    assert cli("inspect", speculators_drafts["pruned"], "--engine", "vllm").code == 0
    converted = cli("convert", speculators_drafts["pruned"], "-o", tmp_path / "hf")
    assert converted.code == 0 and "inspect's engine_view.sglang check" in converted.err, converted.err


def test_inspect_vllm_on_the_old_speculative_tokens_convention(cli, speculators_drafts, tmp_path):
    """A pre-2026-04-21 speculators config (speculative_tokens = block_size): read (a warning), and `inspect
    --engine vllm` says vLLM drafts one slot past the block and to pass num_speculative_tokens: a failed engine
    view (exit 3), as any engine that serves the draft otherwise than trained."""
    src = tmp_path / "old"
    shutil.copytree(speculators_drafts["full"], src)
    cfg = read_config(src)
    cfg.pop("sample_from_anchor", None)
    cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = cfg["block_size"]
    (src / "config.json").write_text(json.dumps(cfg))
    r = cli("inspect", src, "--engine", "vllm")
    assert r.code == 3, r.err  # `vllm serve DRAFT` would draft one slot past the block: an engine view that errs
    assert "FAIL engine_view.vllm-speculators" in r.out
    assert "WARN speculative_tokens" in r.out and "PR #456" in r.out
    assert "drafts blocks of 9 (speculative_tokens + 1) instead of 8" in r.out
    assert "pass num_speculative_tokens=7 explicitly in --speculative-config" in r.out
    info = cli("inspect", src, "--json").json()
    assert {"speculative_tokens", "engine_view.vllm-speculators"} <= {p["name"] for p in info["problems"]}
    assert not info["ok"]


def test_diff_lists_provenance_apart_and_counts_it_only_with_strict(cli, tmp_path):
    """A source against its own conversion made with --verifier (the verifier it names rewritten): equivalent, the
    verifier listed as a metadata difference; --strict counts it (exit 3)."""
    from pathlib import Path

    pair = Path(__file__).resolve().parents[2] / "examples" / "pair"
    out = tmp_path / "hf"
    assert cli("convert", pair / "draft", "-o", out, "--verifier", str(pair / "target")).code == 0
    r = cli("diff", pair / "draft", out, "--json")
    assert r.code == 0, r.out
    report = r.json()
    assert report["equivalent"] and report["config_differences"] == {}
    assert report["metadata_differences"]["verifier"]["b"] == str(pair / "target")
    text = cli("diff", pair / "draft", out)
    assert text.code == 0 and "  metadata verifier: " in text.out and "(not counted)" in text.out, text.out
    strict = cli("diff", pair / "draft", out, "--strict", "--json")
    assert strict.code == 3 and not strict.json()["equivalent"]
