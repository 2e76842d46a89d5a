"""Errors that say the fix: a draft and target given the other way round, a misspelled config key, a block size
the config leaves out but its speculative_tokens gives away. Each one line, with its documented exit code."""

from __future__ import annotations

import json
from pathlib import Path

from factories import copy_with_config

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "examples" / "pair"


def _one_line(r) -> str:
    lines = r.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), r.err
    return lines[0]


def test_validate_with_draft_and_target_swapped_says_so(cli, tmp_path, monkeypatch):
    """The target given as the checkpoint and the draft as --target: exit 2 before anything is read, the command
    written the right way round (as push says it for its arguments: one function)."""
    monkeypatch.setattr("dflash_convert.validate.run.validate", lambda *a, **k: (_ for _ in ()).throw(
        AssertionError("ran")))
    r = cli("validate", PAIR / "target", "--target", PAIR / "draft", "--json")
    assert r.code == 2, r.err
    assert _one_line(r) == (f"Error: the arguments look swapped: {PAIR / 'target'} is no DFlash draft and --target "
                            f"{PAIR / 'draft'} is one; validate takes the draft first: dflash-convert validate "
                            f"{PAIR / 'draft'} --target {PAIR / 'target'}")
    assert json.loads(r.out)["error"]["exit_code"] == 2
    monkeypatch.undo()  # the right way round is not refused
    assert cli("validate", PAIR / "draft", "--target", PAIR / "target", "--levels", "static", "-q").code == 0


def _hf_draft(cli, tmp_path) -> Path:
    r = cli("convert", PAIR / "draft", "-o", tmp_path / "hf")
    assert r.code == 0, r.err
    return tmp_path / "hf"


def test_a_misspelled_config_key_gets_a_did_you_mean(cli, tmp_path):
    """`mask_token_idd` in dflash_config and `is_casual` at the top level: no engine reads either. validate warns
    with the key meant (the config models' own names and the family key table), and the error for the key then
    missing names the misspelling."""
    def misspell(c):
        c["dflash_config"]["mask_token_idd"] = c["dflash_config"].pop("mask_token_id")
        c["is_casual"] = c.pop("is_causal")

    draft = copy_with_config(_hf_draft(cli, tmp_path), tmp_path / "typo", misspell)
    r = cli("validate", draft, "--levels", "static", "--json")
    assert r.code == 3, r.err
    warned = next(c for c in r.json()["checks"] if c["name"] == "config_keys")
    assert warned["status"] == "warn"
    assert "`is_casual` is a key no engine reads: did you mean `is_causal`?" in warned["message"]
    assert "`dflash_config.mask_token_idd` is a key no engine reads: did you mean `dflash_config.mask_token_id`?" \
        in warned["message"]
    r = cli("convert", draft, "-o", tmp_path / "out")
    assert r.code == 1 and _one_line(r).endswith(
        "config has no `mask_token_id` (pass --mask-token-id; the config has `dflash_config.mask_token_idd`: did you "
        "mean `dflash_config.mask_token_id`?)"), r.err
    # a speculators config: top level and the decoder section; a clean config has none
    spec = copy_with_config(PAIR / "draft", tmp_path / "typo-spec", lambda c: c["transformer_layer_config"].update(
        rms_norm_epss=c["transformer_layer_config"].pop("rms_norm_eps")))
    warned = next(c for c in cli("validate", spec, "--levels", "static", "--json").json()["checks"]
                  if c["name"] == "config_keys")
    assert "did you mean `transformer_layer_config.rms_norm_eps`?" in warned["message"]
    assert "config_keys" not in {c["name"] for c in cli("validate", PAIR / "draft", "--levels", "static",
                                                        "--json").json()["checks"]}


def test_a_missing_block_size_suggests_the_one_speculative_tokens_implies(cli, tmp_path):
    """block_size absent, speculative_tokens 15: the error suggests --block-size 16, and that flag then works (the
    block the config does not state is supplied, for validate and convert alike)."""
    draft = copy_with_config(PAIR / "draft", tmp_path / "nob", lambda c: c.pop("block_size"))
    r = cli("validate", draft, "--levels", "static")
    assert r.code == 1 and "pass --block-size 16 (or write \"block_size\": 16 in config.json)" in _one_line(r), r.err
    r = cli("validate", draft, "--levels", "static", "--block-size", "16", "--json")
    assert r.code == 0 and next(c for c in r.json()["checks"] if c["name"] == "block_size")["value"] == 16, r.err
    r = cli("convert", draft, "-o", tmp_path / "hf", "--block-size", "16")
    assert r.code == 0 and json.loads((tmp_path / "hf" / "config.json").read_text())["block_size"] == 16, r.err
