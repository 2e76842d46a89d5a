"""The regression gate: `validate --baseline PREVIOUS.json [--max-regression X]` passes on a rerun, fails
(exit 3) on a planted regression beyond what the counts explain, refuses (exit 1, naming it) a baseline of
other prompts or settings, and shows both runs in the Markdown report and its chart."""

from __future__ import annotations

import json

import pytest

from runtime_helpers import one_torch_thread  # noqa: F401 (autouse fixture)


@pytest.fixture(scope="module")
def first_run(speculators_drafts, tiny_target, tmp_path_factory):
    from conftest import run_cli

    root = tmp_path_factory.mktemp("baseline")
    prompts = root / "p.txt"
    prompts.write_text("5 6 7 8 9 10\n11 12 13 14\n20 21 22 23 24 25 26\n")
    args = ["validate", speculators_drafts["full"], "--target", tiny_target, "--prompts", prompts, "--levels",
            "end_to_end", "--max-new-tokens", "12", "--threads", "1", "--sampling", "greedy"]
    r = run_cli(*args, "--json")
    assert r.code == 0, r.err[-2000:]
    path = root / "baseline.json"
    path.write_text(r.out)
    return args, path, r.json()


def _planted(report: dict, path, rates, num_drafts=400):
    """The baseline with better figures than any rerun: tau and rates as if the draft accepted more."""
    a = report["acceptance"]
    a["per_position_rates"] = rates
    a["num_drafts"] = num_drafts
    a["acceptance_length"] = round(1 + sum(rates), 4)
    a["vllm_counting"] = None
    path.write_text(json.dumps(report))


def test_a_rerun_passes_and_both_runs_are_shown(first_run, cli, tmp_path):
    args, path, report = first_run
    md = tmp_path / "r.md"
    r = cli(*args, "--baseline", path, "--json", "--report-md", md)
    assert r.code == 0, r.err[-2000:]
    b = r.json()["baseline"]
    assert b["tau"] == b["baseline_tau"] and b["regressed"] == [] and b["path"] == str(path)
    assert r.json()["acceptance"]["prompt_ids_sha256"] == report["acceptance"]["prompt_ids_sha256"]
    check = next(c for c in r.json()["checks"] if c["name"] == "regression")
    assert check["status"] == "pass" and "standard errors" in check["message"]
    text = md.read_text()
    assert "Against the baseline" in text and "| tau |" in text and "was " in text
    assert "baseline" in md.with_suffix(".svg").read_text()


def test_a_planted_regression_fails_and_noise_does_not(first_run, cli, tmp_path):
    args, path, report = first_run
    block = report["acceptance"]["block_size"]
    planted = tmp_path / "planted.json"
    _planted(json.loads(path.read_text()), planted, [0.9] + [0.5] * (block - 2))
    r = cli(*args, "--baseline", planted, "--json")
    assert r.code == 3, r.err[-2000:]
    b = r.json()["baseline"]
    assert b["regressed"] and b["regressed"][0].startswith("tau")
    assert "regression" in r.err and "FAILED" in r.err
    assert cli(*args, "--baseline", planted, "--max-regression", "0.99").code == 0  # the team's tolerance
    # a drop the counts explain: one accepted draft fewer in 20 steps at position 1 is noise
    noisy = tmp_path / "noisy.json"
    current = r.json()["acceptance"]
    rates = list(current["per_position_rates"])
    rates[0] = min(1.0, rates[0] + 1 / 20)
    _planted(json.loads(path.read_text()), noisy, rates, num_drafts=20)
    assert cli(*args, "--baseline", noisy).code == 0


def test_other_prompts_or_settings_are_refused_naming_them(first_run, cli, tmp_path):
    args, path, report = first_run
    r = cli(*args[:-6], "--max-new-tokens", "10", "--threads", "1", "--sampling", "greedy", "--baseline", path)
    assert r.code == 1 and "max new tokens: 12 there, 10 here" in r.err, r.err[-1000:]
    r = cli(*args, "--repetition-penalty", "1.2", "--baseline", path)
    assert r.code == 1 and "repetition_penalty" in r.err
    other = tmp_path / "p.txt"
    other.write_text("5 6 7 8 9 11\n11 12 13 14\n20 21 22 23 24 25 26\n")
    r = cli(*[other if a == args[5] else a for a in args], "--baseline", path)
    assert r.code == 1 and "prompt token ids" in r.err
    bad = tmp_path / "bad.json"
    bad.write_text('{"tool": "dflash-convert"}')
    r = cli(*args, "--baseline", bad)
    assert r.code == 1 and str(bad) in r.err and "Traceback" not in r.err
    assert cli(*args, "--max-regression", "0.1").code == 2  # a tolerance without a baseline


def test_the_bound_from_the_counts():
    """The rule on its own: equal figures pass; the allowed drop shrinks as the counts grow."""
    from dflash_convert.validate.baseline import _tau_variance

    rates = [0.8, 0.6, 0.3]
    # accepted a: P(a>=1)=.8, P(a>=2)=.6, P(a>=3)=.3 -> P(a=0..3) = .2, .2, .3, .3
    mean, second = 0.2 * 0 + 0.2 * 1 + 0.3 * 2 + 0.3 * 3, 0.2 * 1 + 0.3 * 4 + 0.3 * 9
    n = 10 ** 6
    assert abs(_tau_variance(rates, n) - (second - mean ** 2)) < 1e-4


def test_per_request_histograms(first_run, cli, tmp_path):
    """Per prompt: its verify steps by drafts accepted (vLLM's per-request summary), summing to its steps;
    over the prompts: how many fell in each tau band. Both in the JSON and the Markdown report."""
    from dflash_convert.validate.end_to_end import request_histogram, step_histogram

    steps = [0, 3, 1, 0, 2, 2, 5]  # drafts accepted per step, block 6
    rates = [sum(a > k for a in steps) / len(steps) for k in range(5)]
    assert step_histogram(rates, len(steps)) == [steps.count(a) for a in range(6)]
    assert request_histogram([1.0, 1.99, 2.0, 6.0, 5.5], 6) == [2, 1, 0, 0, 2]
    args, path, report = first_run
    a = report["acceptance"]
    assert sum(a["per_request_histogram"]) == a["prompts"] == 3
    for p in a["per_prompt"]:
        assert sum(p["accepted_histogram"]) == p["steps"] and len(p["accepted_histogram"]) == a["block_size"]
    md = tmp_path / "r.md"
    assert cli(*args, "--report-md", md).code == 0
    assert "Per-request acceptance" in md.read_text() and "steps by drafts accepted" in md.read_text()


def test_an_engine_run_is_gated_on_an_emulation_report(first_run, tmp_path):
    """Each report's most engine-like figures: the real engine's counters, else the emulation counted as vLLM
    counts, else the emulation's own; an engine run whose counters dropped fails against an emulation report."""
    from dflash_convert.validate.baseline import compare, figures
    from dflash_convert.validate.report import AcceptanceCounts, EngineStats, ValidationReport

    _, path, report = first_run
    block = report["acceptance"]["block_size"]
    emulation = ValidationReport.model_validate(report)
    rates = [0.8] + [0.4] * (block - 2)
    emulation.acceptance.vllm_counting = AcceptanceCounts(num_drafts=300, drafted=300 * (block - 1), accepted=0,
                                                          acceptance_length=1 + sum(rates), per_position_rates=rates)
    assert figures(emulation)[0] == "the emulation, counted as vLLM counts"
    engine = emulation.model_copy(deep=True)
    same = AcceptanceCounts(**emulation.acceptance.vllm_counting.model_dump())
    engine.engine_run = EngineStats(engine="vLLM", version="0.33.0", python="p", prompts=3, outputs_equal=3,
                                    counts=same)
    assert figures(engine)[0] == "vLLM 0.33.0's own counters"
    check, comparison = compare(emulation, path, engine)
    assert check.status == "pass" and comparison.counted == "vLLM 0.33.0's own counters"
    low = [0.5] + [0.1] * (block - 2)
    engine.engine_run.counts = AcceptanceCounts(num_drafts=300, drafted=0, accepted=0,
                                                acceptance_length=1 + sum(low), per_position_rates=low)
    check, comparison = compare(emulation, path, engine)
    assert check.status == "fail" and comparison.regressed and "position 1" in " ".join(comparison.regressed)
