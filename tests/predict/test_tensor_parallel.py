"""Tensor parallelism in the calibration: plain-only cases (a published plain figure at TP 8, no speculative run) count
their plain error and sit in the plain line only; the TP cases set the all-reduce extra, a per-all-reduce cost on top
of the measured latency, kept because it predicts held-out cases better; the stored constants are the fit's."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from statistics import median

import pytest

from dflash_convert.predict import calibration
from dflash_convert.predict.calibration import (CASES, ENGINES, error_band, evaluate, fit, fixed_costs_from_residuals,
                                                leave_one_out)
from dflash_convert.predict.cost import ALLREDUCE_LATENCY_S, plain_step
from dflash_convert.predict.facts import target_facts
from dflash_convert.predict.gpus import gpu

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "docs" / "performance.md").read_text()
TP_CASES = [c for c in CASES if c.tp > 1]


def _median_error(results) -> float:
    return median(e for r in results for k, e in r.errors.items() if k != "speedup")


def test_a_plain_only_case_counts_its_plain_error_and_sits_in_the_plain_line_only():
    """By hand, residuals in ms (plain, speculative), no admissions: (1, 2), (3, none), (5, 7). The fixed cost is the
    median of all three plain residuals, 3 ms; the speculative cost the median of the paired cases' own differences
    (1 and 2), 1.5 ms: the plain-only case has no speculative step to pair."""
    fixed, spec, *_ = fixed_costs_from_residuals([(1e-3, 2e-3, 0, 0), (3e-3, None, 0, 0), (5e-3, 7e-3, 0, 0)],
                                                 admissions="none")
    assert (fixed, spec) == (pytest.approx(3e-3), pytest.approx(1.5e-3))
    fixed, spec, x_plain, x_spec = fixed_costs_from_residuals([(3e-3, None, 0.5, 0.5)])
    assert spec == x_spec == 0.0 and fixed + 0.5 * x_plain == pytest.approx(3e-3)
    band = error_band()
    plain_only = [r for r in band.results if r.case.plain_only]
    assert len(plain_only) == len(TP_CASES) == 5
    for r in plain_only:  # one figure each, in the median and the worst; no speedup, no direction
        assert set(r.errors) == {"baseline_tokens_per_s"} and r.direction_right is None
        assert r.errors["baseline_tokens_per_s"] <= band.worst


def test_the_all_reduce_extra_is_the_median_of_what_the_tp_cases_leave_per_all_reduce():
    """Every TP case is DeepSeek-R1 (61 layers: 122 all-reduces a plain step), so the least-absolute line through the
    origin is the median of each case's unexplained plain step over 122, at the engines' TP 1 constants."""
    fitted = fit()
    per_all_reduce = []
    for c in TP_CASES:
        target = target_facts(c.target)
        bare = dataclasses.replace(fitted[c.engine], allreduce_extra_s=0.0)
        step = plain_step(target, batch=c.concurrency, context=c.context, gpu=gpu(c.gpu), constants=bare, tp=c.tp,
                          output_len=c.output_len, input_len=c.input_len)
        per_all_reduce.append((c.concurrency / c.baseline_tokens_per_s - step.seconds) / (2 * target.layers))
    assert fitted["vllm"].allreduce_extra_s == fitted["sglang"].allreduce_extra_s == \
        pytest.approx(median(per_all_reduce))
    assert fitted["runtime"].allreduce_extra_s == 0.0  # no TP case of its own: the measured latency alone
    for engine in ("sglang", "vllm"):
        assert ENGINES[engine].allreduce_extra_s == pytest.approx(fitted[engine].allreduce_extra_s, abs=1e-7)
    # a fit without TP cases has none
    assert fit(tuple(c for c in CASES if c.tp == 1))["vllm"].allreduce_extra_s == 0.0


def test_the_extra_is_kept_because_held_out_cases_are_predicted_better_and_the_docs_state_it():
    kept = _median_error(leave_one_out())
    without = _median_error(leave_one_out(allreduce_extra=False))
    assert kept < without
    assert f"leave-one-out median {kept:.1%} with the all-reduce extra, {without:.1%} without" in DOCS


def test_without_the_extra_the_tp_8_cases_are_predicted_far_too_fast():
    """The audit's finding: DeepSeek at TP 8 predicted about 2.7x the measured tokens/s. The extra zeroed, the rest as
    stored, the vLLM batch-1 case is off by more than 100 %; as stored, within the docs' band."""
    vllm_case = next(c for c in TP_CASES if c.engine == "vllm")
    bare = dataclasses.replace(ENGINES["vllm"], allreduce_extra_s=0.0)
    assert evaluate(vllm_case, bare).errors["baseline_tokens_per_s"] > 1.0
    assert evaluate(vllm_case, ENGINES["vllm"]).errors["baseline_tokens_per_s"] < 0.5
    for c in TP_CASES:
        assert evaluate(c, ENGINES[c.engine]).errors["baseline_tokens_per_s"] <= error_band().worst


def test_the_measured_all_reduce_latency_is_sourced():
    """ALLREDUCE_LATENCY_S is a measured figure, not fitted: sglang#2904's H100 table (custom all-reduce, TP 2-8,
    4-32 KB: 3.7 to 11.8 us across SGLang's and vLLM's kernels) brackets it, and the docs cite it."""
    assert 3.7e-6 <= ALLREDUCE_LATENCY_S <= 11.8e-6
    assert "https://github.com/sgl-project/sglang/pull/2904" in DOCS
    assert f"{ALLREDUCE_LATENCY_S * 1e6:g} us" in DOCS


def test_a_tp_8_deepseek_prediction_is_inside_the_cases_tp_and_attention():
    cov = calibration.coverage()
    deepseek = target_facts(calibration.DEEPSEEK_R1)
    assert cov.outside(deepseek, tp=8, concurrency=[1, 8], bounds=set()) == []
