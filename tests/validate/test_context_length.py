"""Acceptance where deployments lose it: --context-lengths (tau against context length, the long prompts cut from
a real text), tau against output position, and the draft's trained context read statically (trained_context)."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from dflash_convert.validate.breakdown import (context_svg, context_windows, counts_of, half_tau_length,
                                               output_buckets)
from dflash_convert.validate.options import ValidateOptions
from dflash_convert.validate.report import SliceAcceptance
from dflash_convert.validate.report_markdown import to_markdown
from runtime_helpers import plant_verify_one_position_too_far

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"


def _pair_prompts(n: int = 4) -> list[list[int]]:
    return [[int(t) for t in line.split()] for line in PAIR.joinpath("prompts.txt").read_text().splitlines()[:n]]


def test_context_lengths_flag_reads_k_as_1024():
    from dflash_convert.cli._options import PARSERS

    assert PARSERS["lengths"]("2k,8K,1024") == [2048, 8192, 1024]
    with pytest.raises(typer.BadParameter, match="2m"):
        PARSERS["lengths"]("2m")


def test_long_context_file_needs_context_lengths():
    from dflash_convert.errors import UsageError

    with pytest.raises(UsageError, match="--context-lengths"):
        ValidateOptions(long_context_file="x.txt")
    with pytest.raises(UsageError, match="distinct"):
        ValidateOptions(context_lengths=[1024, 1024])


def test_windows_are_exactly_the_length_asked_and_say_when_the_text_repeats():
    text = list(range(10, 110))  # 100 tokens
    long = context_windows(text, [16, 40, 300], "the text", prefix=[1])
    assert [len(w) for w in long.windows[16]] == [16] * 4  # as many as the text holds, at most 4
    assert long.windows[16][1] == [1] + text[15:30]  # consecutive windows, each after the BOS
    assert [len(w) for w in long.windows[40]] == [40, 40]
    assert long.windows[300] == [[1] + (text * 3)[:299]]
    assert "repeated to reach 300 (3x)" in long.source and "40" not in long.source.split("repeated")[1]


def test_output_buckets_group_steps_by_the_position_they_began_at():
    slots = 15
    run = [15, 15, 15, 15, 0, 1]  # positions 1, 17, 33, 49 | 65, 66
    buckets = [SliceAcceptance(**b) for b in output_buckets([run, [3]], slots, max_new_tokens=300)]
    assert [(b.first_position, b.end_position) for b in buckets] == [(0, 64), (64, 256)]
    first, second = buckets
    assert (first.num_drafts, first.accepted, first.prompts) == (5, 63, 2)
    assert first.acceptance_length == round(1 + 63 / 5, 4)
    assert (second.num_drafts, second.accepted, second.prompts, second.new_tokens) == (2, 1, 1, 3)
    assert second.per_position_rates[:2] == [0.5, 0.0] and second.accepted_histogram[:2] == [1, 1]
    assert output_buckets([run], slots, max_new_tokens=64)[0]["end_position"] is None  # one open bucket


def test_half_tau_length_is_the_first_length_below_half():
    def at(length, tau):
        return SliceAcceptance(label=f"{length}", prompts=1, new_tokens=1, context_tokens=length,
                               **counts_of([], 3) | {"acceptance_length": tau})

    assert half_tau_length(4.0, [at(4096, 1.2), at(1024, 3.0), at(2048, 1.9)]) == 2048
    assert half_tau_length(4.0, [at(1024, 2.0)]) is None


@pytest.fixture(scope="module")
def pair_report():
    from dflash_convert.validate.run import validate

    return validate(PAIR / "draft", ValidateOptions(
        target=PAIR / "target", prompts=_pair_prompts(), levels=["static", "end_to_end"], max_new_tokens=32,
        sampling="greedy", timing_rounds=1, context_lengths=[256, 1024], max_model_len=1024 + 32))


def test_bundled_pair_curve_and_the_warning_past_its_512_positions(pair_report):
    """The bundled pair (draft positions end at 512) at 256 and 1024 tokens: a curve point per length, every
    output the target's greedy output, and the static warning told what the curve shows past 512."""
    a = pair_report.acceptance
    assert [s.context_tokens for s in a.per_context_length] == [256, 1024]
    assert all(s.outputs_equal == s.prompts >= 1 and s.num_drafts > 0 for s in a.per_context_length)
    assert "token ids joined in order" in a.context_source and "1024 (" in a.context_source
    assert a.context_half_tau_length == half_tau_length(a.acceptance_length, a.per_context_length)
    trained = next(c for c in pair_report.checks if c.name == "trained_context")
    assert trained.status == "warn" and trained.value["draft"] == 512
    assert "--context-lengths up to 1024 measure past them" in trained.message
    at_1024 = a.per_context_length[1].acceptance_length
    assert f"measured: past the draft's trained positions (512): tau {at_1024:.2f} at 1024" in trained.message
    assert "sliding window 2048 on layers [0, 1]" in trained.message
    curve = next(c for c in pair_report.checks if c.name == "context_lengths")
    assert curve.status in ("pass", "warn") and "at 1024" in curve.message
    md = to_markdown(pair_report, curve="r-context-length.svg")
    assert "### tau against context length" in md and "| 1024 tokens | " in md
    assert "1024 tokens" in context_svg(pair_report) and "<svg" in context_svg(pair_report)


def test_rope_range_1024_is_warned_at_2048_and_8k_is_not(tmp_path, tiny_target, speculators_drafts):
    """A draft whose positions end at 1024, served at 2048 (--max-model-len) and measured there (2044 + 4 new
    tokens): warned by name, with the curve measured past 1024; one trained to 8192 is not warned. Random weights accept nothing at any
    length, so the fall of tau itself cannot be shown here: the bundled pair's curve is the measured one."""
    from factories import copy_draft, read_config

    from dflash_convert.validate.run import validate

    decoder = read_config(speculators_drafts["full"])["transformer_layer_config"]
    reports = {}
    for positions in (1024, 8192):
        draft = copy_draft(speculators_drafts["full"], tmp_path / str(positions),
                           spec_update={"decoder": decoder | {"max_position_embeddings": positions}})
        reports[positions] = validate(draft, ValidateOptions(
            target=tiny_target, levels=["static", "end_to_end"], max_new_tokens=4, sampling="greedy",
            timing_rounds=1, context_lengths=[2044], max_model_len=2048))
    short = next(c for c in reports[1024].checks if c.name == "trained_context")
    assert short.status == "warn" and "--max-model-len: 2048 tokens" in short.message
    assert "passes the 1024 positions the draft was trained for" in short.message
    assert "measured: past the draft's trained positions (1024)" in short.message
    long = next(c for c in reports[8192].checks if c.name == "trained_context")
    assert long.status == "pass" and long.value["draft"] == 8192
    for r in reports.values():
        s = r.acceptance.per_context_length
        assert [x.context_tokens for x in s] == [2044] and s[0].outputs_equal == s[0].prompts
        assert "random ids" in r.acceptance.context_source


def test_inspect_warns_where_max_model_len_passes_the_trained_positions(cli):
    def trained(max_model_len: int) -> dict:
        result = cli("inspect", PAIR / "draft", "--max-model-len", max_model_len, "--json")
        return next(c for c in result.json()["checks"] if c["name"] == "trained_context")

    warned = trained(2048)
    assert warned["status"] == "warn" and "--max-model-len: 2048 tokens" in warned["message"]
    assert trained(512)["status"] == "pass"


@pytest.mark.parametrize("value", ["", ",", "0", "-1", "1.5k", "2m"])
def test_context_lengths_that_are_no_lengths_are_a_usage_error(cli, value):
    r = cli("validate", PAIR / "draft", f"--context-lengths={value}", "--levels", "static")
    last = r.err.strip().splitlines()[-1]  # click's usage lines, then one error line naming the flag
    assert r.code == 2 and last.startswith("Error:") and "--context-lengths" in last, r.err


def test_context_lengths_past_max_model_len_or_the_targets_positions_are_refused_before_any_work(cli):
    """vLLM refuses a prompt longer than max_model_len and stops a generation at it; past the target's own 512
    positions the target is out of range: exit 2 naming both numbers, nothing measured. An explicit
    --max-model-len measures past the target's positions (as VLLM_ALLOW_LONG_MAX_MODEL_LEN does)."""
    def run(*flags):
        return cli("validate", PAIR / "draft", "--target", PAIR / "target", "--levels", "static", "--json", *flags)

    r = run("--context-lengths", "4k", "--max-model-len", "4096")
    assert r.code == 2 and "4096 + --max-new-tokens 64 = 4160 tokens pass --max-model-len 4096" in r.err, r.err
    assert "up to 4032" in r.err and "checks" not in r.out
    r = run("--context-lengths", "1k")
    assert r.code == 2 and "1088 tokens pass the target's own 512 positions" in r.err, r.err
    assert "max_position_embeddings 512" in r.err and "--max-model-len 1088" in r.err
    assert run("--context-lengths", "448").code == 0  # 448 + 64 new tokens: the target's 512 exactly
    assert run("--context-lengths", "1k", "--max-model-len", "1088").code == 0


def test_target_positions_are_vllms_derived_max_model_len():
    from dflash_convert.validate.trained_context import target_positions

    assert target_positions({"max_position_embeddings": 4096}) == (4096, "max_position_embeddings 4096")
    linear = {"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}
    assert target_positions(linear)[0] == 16384 and "factor 4" in target_positions(linear)[1]
    yarn = {"max_position_embeddings": 131072, "rope_scaling": {"type": "yarn", "factor": 4.0,
                                                                "original_max_position_embeddings": 32768}}
    assert target_positions(yarn)[0] == 131072  # yarn states the extended range itself
    per_layer = {"text_config": {"max_position_embeddings": 8192, "seq_length": 2048,
                                 "rope_parameters": {"full_attention": {"rope_type": "dynamic", "factor": 2}}}}
    assert target_positions(per_layer) == (4096, "seq_length 2048 x RoPE dynamic factor 2")
    assert target_positions({"model_type": "gemma3_text", "max_position_embeddings": 131072,
                             "rope_scaling": {"rope_type": "linear", "factor": 8.0}})[0] == 131072
    assert target_positions({"hidden_size": 8}) == (None, "")


def _sampled_context_run(cli):
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--prompts", PAIR / "prompts.txt",
            "--levels", "end_to_end", "--device", "cpu", "--max-new-tokens", "16",
            "--context-lengths", "64,96", "--json")
    report = r.json() if r.out else {}
    check = next((c for c in report.get("checks", []) if c["name"] == "context_lengths"), None)
    return r, report, check


def test_a_sampled_run_checks_the_long_prompts_outputs_on_a_greedy_pass(cli):
    """The default --sampling auto samples at temperature 1: the long prompts' outputs are still checked, on a
    greedy pass (as the run's own prompts are), and the check says so."""
    r, report, check = _sampled_context_run(cli)
    assert r.code == 0, r.err
    a = report["acceptance"]
    assert a["temperature"] > 0
    assert [s["context_tokens"] for s in a["per_context_length"]] == [64, 96]
    assert all(s["outputs_equal"] == s["prompts"] >= 1 for s in a["per_context_length"])
    assert check["status"] in ("pass", "warn") and "greedy pass of the long prompts" in check["message"]


def test_a_sampled_run_fails_a_defect_that_shows_only_on_the_long_prompts(cli, monkeypatch):
    """The planted defect: the loop's verify blocks at positions one too far on the long prompts only (the run's
    own prompts are short and decode right): under sampling the context check must fail it, exit 3."""
    plant_verify_one_position_too_far(monkeypatch, only=lambda prompt: len(prompt) >= 64)
    r, report, check = _sampled_context_run(cli)
    assert r.code == 3 and check is not None and check["status"] == "fail", (r.code, r.err, check)
    assert "not the target's greedy output at 64 tokens" in check["message"]
    assert any(s["outputs_equal"] < s["prompts"] for s in report["acceptance"]["per_context_length"])
    greedy = next(c for c in report["checks"] if c["name"] == "greedy_output_equal")
    assert greedy["status"] == "pass"


def test_the_engine_runs_long_prompts_within_the_max_model_len_vllm_derives_not_max_position_embeddings():
    """A target stating seq_length 2048 beside max_position_embeddings 4096: vLLM's default max_model_len is 2048,
    so a 3000-token --context-lengths prompt needs max_model_len raised; a linear RoPE factor 4 serves 16384."""
    from dflash_convert.validate.engine.level import fitting_engine_args

    long = [(3000, [[1] * 3000])]
    short = {"text_config": {"max_position_embeddings": 4096, "seq_length": 2048}}
    assert fitting_engine_args({}, long, 16, 16, short) == {"max_model_len": 3000 + 16 + 2 * 16}
    linear = {"max_position_embeddings": 2048, "rope_scaling": {"rope_type": "linear", "factor": 4.0}}
    assert fitting_engine_args({}, long, 16, 16, linear) == {}
