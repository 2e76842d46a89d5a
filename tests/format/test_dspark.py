"""DSpark drafts (speculators `dspark`): both formats, bit-exact round trips, the keys engines read, inspect.

Fixtures are saved by speculators 0.9.0's own DSparkDraftModel (tests/conftest.py `family_drafts`): vanilla,
gated and rnn Markov heads, a confidence head over [hidden; Markov] or hidden alone or none, a bonus anchor
(sample_from_anchor false) and a pruned vocabulary. The HF layout is the one vLLM 0.33's and SGLang 0.5.23's
Qwen3DSparkModel load: the same tensor names, the DSpark keys at the top level of config.json.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factories import (assert_bit_identical, assert_hf_round_trip_is_bit_exact, copy_with_config, read_config,
                       tensors_of)
from processes import needs_vllm
from dflash_convert.format import keys

DSPARK = ["dspark", "dspark_gated", "dspark_rnn", "dspark_plain_conf", "dspark_no_conf", "dspark_bonus_anchor",
          "dspark_pruned"]
KEYS = ("sample_from_anchor", "markov_rank", "markov_head_type", "enable_confidence_head",
        "confidence_head_with_markov")

pytestmark = pytest.mark.usefixtures("one_timing_round")  # no test here reads the speedup


@pytest.mark.parametrize("name", DSPARK)
def test_speculators_hf_speculators_is_bit_exact(cli, family_drafts, tmp_path, name):
    src, hf, back = family_drafts[name], tmp_path / "hf", tmp_path / "back"
    assert cli("convert", src, "-o", hf).code == 0
    assert cli("convert", hf, "-o", back).code == 0
    a, h, b = tensors_of(src), tensors_of(hf), tensors_of(back)
    assert set(a) == set(b)  # a pruned draft's t2d comes back, rebuilt from d2t
    assert_bit_identical(a, b)
    assert set(h) == set(a) - {"t2d"}  # vLLM skips t2d; every Markov / confidence tensor ships
    assert_bit_identical(a, h, set(h))
    ca, cb = read_config(src), read_config(back)
    for key in (*KEYS, "speculators_model_type", "architectures", "block_size", "speculators_config",
                "aux_hidden_state_layer_ids", "mask_token_id", "draft_vocab_size", "transformer_layer_config"):
        assert ca[key] == cb[key], key
    cfg = read_config(hf)
    assert cfg["architectures"] == ["Qwen3DSparkModel"]
    assert {k: cfg[k] for k in KEYS} == {k: ca[k] for k in KEYS}  # top level, where vLLM reads them
    assert cli("diff", src, hf).code == 0 and cli("diff", src, back).code == 0


@pytest.mark.parametrize("name", ["dspark", "dspark_rnn", "dspark_pruned"])
def test_hf_speculators_hf_is_bit_exact(cli, family_drafts, tmp_path, name):
    assert_hf_round_trip_is_bit_exact(cli, family_drafts[name], tmp_path)


def test_speculators_loads_our_output_with_exactly_our_tensors(cli, family_drafts, tmp_path):
    """speculators' own SpeculatorModel.from_pretrained builds the same DSpark heads from what we write."""
    import torch
    from speculators.model import SpeculatorModel

    for name in ("dspark_gated", "dspark_plain_conf", "dspark_bonus_anchor", "dspark_pruned"):
        hf, spec = tmp_path / f"{name}-hf", tmp_path / f"{name}-spec"
        assert cli("convert", family_drafts[name], "-o", hf).code == 0
        assert cli("convert", hf, "-o", spec).code == 0
        model = SpeculatorModel.from_pretrained(str(spec))
        assert type(model).__name__ == "DSparkDraftModel"
        theirs = read_config(family_drafts[name])
        assert {k: getattr(model.config, k) for k in KEYS} == {k: theirs[k] for k in KEYS}
        state = model.state_dict()
        for k, v in tensors_of(spec).items():
            assert torch.equal(state[k], v), k


def test_hf_output_reads_as_the_engines_read_it(cli, family_drafts, tmp_path):
    """transformers' AutoConfig (through which vLLM and SGLang load an HF draft config) exposes the DSpark keys as
    the attributes vLLM's Qwen3DSparkModel reads (getattr(config, 'markov_rank'), ...)."""
    from transformers import AutoConfig

    out = tmp_path / "hf"
    assert cli("convert", family_drafts["dspark_plain_conf"], "-o", out).code == 0
    cfg = AutoConfig.from_pretrained(out)
    assert cfg.architectures == ["Qwen3DSparkModel"]
    assert (cfg.markov_rank, cfg.markov_head_type, cfg.enable_confidence_head, cfg.confidence_head_with_markov,
            cfg.sample_from_anchor) == (16, "vanilla", True, False, True)
    assert cfg.block_size == 8 and cfg.dflash_config["target_layer_ids"] == [0, 3, 5]


def test_keys_nested_in_dflash_config_are_read_and_written_where_vllm_reads_them(cli, family_drafts, tmp_path):
    """Published DSpark drafts may nest markov_rank / markov_head_type in dflash_config (SGLang reads there first);
    vLLM reads only the top level: inspect says so, convert writes them at the top level."""
    hf = tmp_path / "hf"
    assert cli("convert", family_drafts["dspark"], "-o", hf).code == 0

    def nest(cfg):
        cfg["dflash_config"].update(markov_rank=cfg.pop("markov_rank"), markov_head_type=cfg.pop("markov_head_type"))
    src = copy_with_config(hf, tmp_path / "nested", nest)
    r = cli("inspect", src, "--engine", "vllm")
    assert "vLLM reads markov_rank only at the top level" in r.out, r.out
    assert cli("convert", src, "-o", tmp_path / "out", "--to", "hf").code == 0
    assert read_config(tmp_path / "out")["markov_rank"] == 16
    assert cli("diff", hf, src).code == 0
    both = copy_with_config(hf, tmp_path / "both", lambda c: c["dflash_config"].update(markov_rank=8))
    r = cli("convert", both, "-o", tmp_path / "out2")
    assert r.code == 1 and "markov_rank" in r.err and "dflash_config.markov_rank" in r.err, r.err


@pytest.mark.parametrize("key, value", [("markov_head_type", "gated"), ("sample_from_anchor", False),
                                        ("enable_confidence_head", False), ("confidence_head_with_markov", False)])
def test_diff_counts_a_dspark_key(cli, family_drafts, tmp_path, key, value):
    def edit(cfg):
        cfg[key] = value
        if key == "sample_from_anchor":  # the bonus anchor drafts one slot fewer: speculators' own rule
            cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = cfg["block_size"] - 1
    other = copy_with_config(family_drafts["dspark"], tmp_path / "other", edit)
    r = cli("diff", family_drafts["dspark"], other, "--json")
    assert r.code == 3 and key in r.json()["config_differences"], r.out[-1500:]


def test_absent_keys_take_speculators_defaults_and_hf_keys_it_cannot_state_are_refused(cli, family_drafts, tmp_path):
    """speculators fills its class defaults (markov_rank 256, anchor drafting, ...); an HF config without
    enable_confidence_head cannot become a speculators config stating it (vLLM reads absent as false, speculators
    as true): refused naming the key, nothing written."""
    from dflash_convert.io.checkpoint import open_checkpoint

    src = copy_with_config(family_drafts["dspark"], tmp_path / "src", lambda c: [c.pop(k) for k in KEYS[1:]])
    spec = open_checkpoint(src).spec
    assert spec.variant == "dspark" and spec.variant_fields == {
        "sample_from_anchor": True, "markov_rank": 256, "markov_head_type": "vanilla",
        "enable_confidence_head": True, "confidence_head_with_markov": True}
    hf = tmp_path / "hf"
    assert cli("convert", family_drafts["dspark"], "-o", hf).code == 0
    bare = copy_with_config(hf, tmp_path / "bare", lambda c: c.pop("enable_confidence_head"))
    r = cli("convert", bare, "-o", tmp_path / "spec")
    assert r.code == 1 and "enable_confidence_head" in r.err and not (tmp_path / "spec").exists(), r.err


# ----------------------------------------------------------------------------- inspect sees DSpark

def test_a_dspark_without_its_heads_names_them(cli, family_drafts, tmp_path):
    from factories import copy_draft

    def drop(tensors):
        for n in [n for n in tensors if n.startswith(("markov_head.", "confidence_head."))]:
            del tensors[n]
    bad = copy_draft(family_drafts["dspark_gated"], tmp_path / "bad", edit_tensors=drop)
    r = cli("inspect", bad, "--json")
    assert r.code == 3, r.err
    missing = r.failed_checks()["missing_tensors"]
    assert "markov_head.markov_w1.weight" in missing, missing


@pytest.mark.parametrize("name, update, check, needle", [
    ("dspark", {"markov_rank": 8}, "family_shapes", "markov_head.markov_w1.weight"),  # saved with rank 16
    ("dspark", {"confidence_head_with_markov": False}, "family_shapes", "confidence_head.proj.weight"),
    ("dspark_gated", {"markov_head_type": "vanilla"}, "family_shapes", "markov_head.gate_proj.weight"),
    ("dspark_no_conf", {"enable_confidence_head": True}, "missing_tensors", "confidence_head.proj.weight"),
    ("dspark", {"markov_head_type": "lstm"}, "family_config", "markov_head_type is vanilla, gated or rnn"),
    ("dspark", {"markov_rank": 0}, "family_config", "markov_rank is a positive integer"),
])
def test_a_dspark_whose_keys_disagree_with_its_tensors_fails_naming_both(cli, family_drafts, tmp_path, name, update,
                                                                        check, needle):
    src = copy_with_config(family_drafts[name], tmp_path / "src", lambda c: c.update(update))
    r = cli("inspect", src, "--json")
    assert r.code == 3, (r.code, r.err)
    assert check in r.failed_checks() and needle in r.failed_checks()[check], r.failed_checks()


def test_inspect_says_which_engine_serves_which_dspark(cli, family_drafts):
    r = cli("inspect", family_drafts["dspark"], "--engine", "vllm")
    assert r.code == 0, r.err
    assert "vLLM (speculators format), by 0.33.0's rules: as trained (V2 model runner only)" in r.out, r.out
    assert "Model Runner V1 does not support: dspark speculative decoding" in r.out
    r = cli("inspect", family_drafts["dspark_rnn"], "--engine", "vllm")
    assert "does not load" in r.out and "vanilla Markov head only" in r.out, r.out
    r = cli("inspect", family_drafts["dspark_rnn"], "--engine", "sglang")
    assert "SGLang, by 0.5.23's rules (as converted by `convert --to hf`): as trained" in r.out, r.out
    r = cli("inspect", family_drafts["dspark_no_conf"], "--engine", "sglang")
    assert "does not load" in r.out and "confidence head" in r.out, r.out


def test_an_rnn_head_with_a_bonus_anchor_warns_for_sglang_only(cli, family_drafts, tmp_path):
    """An rnn Markov head trained with sample_from_anchor false: SGLang starts the recurrence at slot 1 from a zero
    state where speculators trained it from the anchor's slot 0, a warning of SGLang's view (the draft loads; exit
    0), named by the field; the same head with the anchor proposing, and a vanilla head with a bonus anchor, have
    none."""
    from dflash_convert.format.engine_views import checkpoint_views
    from dflash_convert.io.checkpoint import open_checkpoint

    def bonus_anchor(cfg):
        cfg["sample_from_anchor"] = False  # the anchor is the bonus token: the block is it and one fewer proposal
        cfg["speculators_config"]["proposal_methods"][0]["speculative_tokens"] = cfg["block_size"] - 1

    bonus = copy_with_config(family_drafts["dspark_rnn"], tmp_path / "rnn_bonus", bonus_anchor)
    sglang, = checkpoint_views(open_checkpoint(bonus), "sglang")
    start = [d for d in sglang.divergences if d.field == "markov_head_type"]
    assert sglang.loads and [(d.severity, d.trained, d.applied) for d in start] == [
        ("warning", "rnn from slot 0", "rnn from slot 1")]
    assert "zero state" in start[0].consequence and "sample_from_anchor true" in start[0].fix
    for other in ("dspark_rnn", "dspark_bonus_anchor"):
        view, = checkpoint_views(open_checkpoint(family_drafts[other]), "sglang")
        assert not [d for d in view.divergences if d.field == "markov_head_type"], other
    r = cli("inspect", bonus, "--engine", "sglang", "--json")
    assert r.code == 0, r.err
    said = r.json()["engines"][0]["divergences"]
    assert [d["severity"] for d in said if d["field"] == "markov_head_type"] == ["warning"], said


def test_the_line_validate_gives_for_vllm_on_cpu(family_drafts):
    from dflash_convert.format.engine_views import vllm_cannot_serve_here
    from dflash_convert.io.checkpoint import open_checkpoint

    line = vllm_cannot_serve_here(open_checkpoint(family_drafts["dspark"]).spec)
    assert "Model Runner V1 does not support: dspark speculative decoding" in line and "\n" not in line
    assert "candidate-head" in vllm_cannot_serve_here(open_checkpoint(family_drafts["dflash2"]).spec)


# ----------------------------------------------------------------------------- every DSpark key survives or stops

VALUES = st.one_of(st.none(), st.booleans(), st.integers(-2, 40), st.sampled_from(["vanilla", "gated", "rnn", "x"]))


@settings(max_examples=30, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(KEYS), value=VALUES)
def test_any_dspark_key_value_round_trips_or_stops_by_name(family_drafts, tmp_path_factory, name, value):
    """Any value of any DSpark key: speculators -> HF -> speculators keeps every key's value, or a command stops
    naming the key (a value that does not fit the tensors stops at the tensor it sizes)."""
    from dflash_convert.convert.conversion import convert
    from dflash_convert.errors import DFlashError
    from dflash_convert.io.checkpoint import open_checkpoint

    tmp = tmp_path_factory.mktemp("dsk")
    src = copy_with_config(family_drafts["dspark"], tmp / "src", lambda c: c.update({name: value}))
    try:
        before = open_checkpoint(src).spec.variant_fields
        convert(src, tmp / "hf")
        convert(tmp / "hf", tmp / "back")
    except DFlashError as exc:
        said = str(exc)
        assert name in said or "markov_head." in said or "confidence_head." in said, said
        return
    assert open_checkpoint(tmp / "hf").spec.variant_fields == before
    assert open_checkpoint(tmp / "back").spec.variant_fields == before
    after = open_checkpoint(tmp / "back").spec.variant_fields
    assert keys.effective("dspark", before) == keys.effective("dspark", after)


# ----------------------------------------------------------------------------- vLLM's own config reader

VLLM_READS = """
import json, sys
from vllm.transformers_utils.configs.speculators.base import SpeculatorsConfig
print(json.dumps(SpeculatorsConfig.extract_transformers_pre_trained_config(json.load(open(sys.argv[1])))))
"""


@needs_vllm
@pytest.mark.parametrize("name", ["dspark_plain_conf", "dspark_bonus_anchor", "dspark_pruned"])
def test_vllm_reads_the_speculators_draft_as_our_hf_config_says(cli, family_drafts, tmp_path, name):
    """vLLM's own speculators reader (SpeculatorsConfig, the installed vLLM) turns the draft's config into the
    HF config it serves; every DSpark key and the layout of our HF output agree with it."""
    import subprocess

    from processes import VLLM_PYTHON
    hf = tmp_path / "hf"
    assert cli("convert", family_drafts[name], "-o", hf).code == 0
    run = subprocess.run([VLLM_PYTHON, "-c", VLLM_READS, str(family_drafts[name] / "config.json")],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    theirs, ours = json.loads(run.stdout.strip().splitlines()[-1]), read_config(hf)
    assert theirs["architectures"] == ours["architectures"] == ["Qwen3DSparkModel"]
    for key in (*KEYS, "block_size", "mask_token_id", "draft_vocab_size"):
        want = ours.get(key, ours["dflash_config"].get(key))
        if key == "draft_vocab_size" and want is None:  # we write it only for a pruned vocabulary
            want = ours["vocab_size"]
        assert theirs[key] == want, key
    assert theirs["target_layer_ids"] == ours["dflash_config"]["target_layer_ids"]
    assert theirs["dspark_bonus_anchor"] is (not ours["sample_from_anchor"])


def test_model_card_serves_dspark_with_its_own_method_and_counts(family_drafts):
    """The card's commands: vLLM method dspark with num_speculative_tokens = tokens drafted per block (block_size
    when the anchor drafts, one fewer with a bonus anchor); SGLang DSPARK with gamma + 1 draft tokens."""
    from dflash_convert.hub.card import model_card
    from dflash_convert.io.checkpoint import open_checkpoint

    card = model_card(open_checkpoint(family_drafts["dspark"]).spec, repo_id="org/d")
    assert '"method": "dspark", "model": "org/d", "num_speculative_tokens": 8' in card
    assert "--speculative-algorithm DSPARK" in card and "--speculative-num-draft-tokens 9" in card
    assert "up to 8 speculative tokens per step" in card
    card = model_card(open_checkpoint(family_drafts["dspark_bonus_anchor"]).spec, repo_id="org/d")
    assert '"num_speculative_tokens": 7' in card and "up to 7 speculative tokens per step" in card


def test_validate_says_in_one_line_why_vllm_cannot_serve_a_family_draft_here(cli, family_drafts, tiny_target):
    """Without a GPU vLLM runs its V1 model runner only: validate --engine vllm --engine-python keeps the emulation's
    verdict and says why real vLLM is not run (the interpreter is never started: any executable will do)."""
    import sys

    r = cli("validate", family_drafts["dflash2"], "--target", tiny_target, "--levels", "end_to_end", "--threads", "1",
            "--max-new-tokens", "8", "--sampling", "greedy", "--engine", "vllm", "--engine-python", sys.executable,
            "--json")
    assert r.code == 0, r.err[-3000:]
    report = r.json()
    assert "Model Runner V1 does not support: DFlash candidate-head drafts" in report["levels_skipped"]["served"]
    assert report.get("engine_run") is None


def test_an_hf_dspark_draft_model_named_as_speculators_names_it(cli, family_drafts, tmp_path):
    """vLLM serves an HF config naming DSparkDraftModel with model_type qwen3 as Qwen3DSparkModel; so do we. The
    same name on another decoder (DeepSeek's DSpark) is refused naming the architecture."""
    from dflash_convert.io.checkpoint import open_checkpoint

    hf = tmp_path / "hf"
    assert cli("convert", family_drafts["dspark"], "-o", hf).code == 0
    alias = copy_with_config(hf, tmp_path / "alias", lambda c: c.update(architectures=["DSparkDraftModel"]))
    assert open_checkpoint(alias).spec.variant == "dspark"
    assert cli("diff", hf, alias).code == 0
    other = copy_with_config(hf, tmp_path / "other", lambda c: c.update(architectures=["DSparkDraftModel"],
                                                             model_type="deepseek_v4"))
    r = cli("inspect", other)
    assert r.code == 1 and "DSparkDraftModel" in r.err and "DeepSeek" in r.err, r.err


def test_each_engine_view_says_how_it_lays_out_a_dspark_without_sample_from_anchor(family_drafts, tmp_path):
    """speculators format, key absent: vLLM's speculators reader takes false (the anchor is the bonus token, 1 + N
    slots) where speculators trained with its fill-in, true; vLLM's HF reader and SGLang read what convert writes
    (true). The runtime runs the trained layout, and under --engine vllm (applied_checkpoint) vLLM's."""
    from dflash_convert.format import engine_views
    from dflash_convert.io.checkpoint import open_checkpoint
    from dflash_runtime import load_draft

    src = copy_with_config(family_drafts["dspark"], tmp_path / "src", lambda c: c.pop("sample_from_anchor"))
    ckpt = open_checkpoint(src)
    views = {v.engine: v for v in engine_views.checkpoint_views(ckpt)}
    ours = views["vllm-speculators"]
    assert ours.anchor_predicts is False and ours.block_size == 9
    anchor = next(d for d in ours.divergences if d.field == "sample_from_anchor")
    assert anchor.severity == "error" and "absent" in anchor.consequence and (anchor.trained, anchor.applied) == (
        True, False)
    assert views["vllm-hf"].anchor_predicts is True and views["sglang"].anchor_predicts is True
    trained = load_draft(ckpt)
    assert trained.anchor_predicts and (trained.block_size, trained.proposals()) == (8, 8)
    as_vllm = load_draft(engine_views.applied_checkpoint(ckpt, engine_views.serving_view(ckpt, "vllm")))
    assert not as_vllm.anchor_predicts and (as_vllm.block_size, as_vllm.proposals()) == (9, 8)
