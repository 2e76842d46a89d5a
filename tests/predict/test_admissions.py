"""The admission term: a step that admits a new request (its prefill beside the running decodes) costs an engine
constant more, on the share 1 - exp(-a) of steps that admit any, a = concurrency x t / output_len (t: 1 token per
sequence a plain step, tau a speculative one). Its arithmetic by hand, its fit reproduced, the high-concurrency
cases it exists for, the leave-one-out figure that keeps it, and the output length each prediction passes."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from dflash_convert.predict import calibration
from dflash_convert.predict.calibration import (CASES, DIRECTION_CASES, ENGINES, error_band, evaluate,
                                                evaluate_direction, fixed_costs_from_residuals, leave_one_out)
from dflash_convert.predict.cost import EngineConstants, admission_cost, mixed_share, plain_step, speculative_step
from dflash_convert.predict.facts import target_facts
from dflash_convert.predict.gpus import GPU, gpu
from dflash_convert.predict.prediction import Inputs, predict

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "docs" / "performance.md").read_text()
ROUND_GPU = GPU("round", memory_bandwidth_gbps=1000, bf16_tflops=100, fp8_tflops=None, memory_gb=80, link_gbps=100)
# the dense target of test_predict.py: 134,217,728 bytes of weights, 65,536,000 of lm_head, 4096 bytes of KV per
# position per layer over 4 layers
DENSE = {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
         "head_dim": 128, "intermediate_size": 4096, "vocab_size": 32000, "torch_dtype": "bfloat16"}


def test_a_mixed_step_costs_the_admission_constant_on_the_share_of_steps_that_admit():
    """Batch 4 at context 1000 on a 1000 GB/s GPU at the datasheet: 134,217,728 + 4 x 4 x 1000 x 4096 + 65,536,000 =
    265,289,728 bytes, 265.29 us. Requests of 4 tokens: a = 4 x 1 / 4 = 1 admission a step on average, so 1 - 1/e =
    63.2 % of steps admit one; an admission cost of 265.29 us / 0.632 = 419.68 us doubles the step."""
    m = target_facts(DENSE)
    ideal = EngineConstants(1.0, 1.0, 0.0, 0.0, admission_s=419.682e-6, speculative_admission_s=419.682e-6)
    bare = plain_step(m, batch=4, context=1000, gpu=ROUND_GPU, constants=ideal)  # no output length: no admissions
    assert bare.seconds == pytest.approx(265_289_728 / 1e12) and bare.admissions_s == 0.0
    mixed = plain_step(m, batch=4, context=1000, gpu=ROUND_GPU, constants=ideal, output_len=4)
    assert mixed.admissions_s == pytest.approx((1 - math.exp(-1)) * 419.682e-6)
    assert mixed.seconds == pytest.approx(2 * bare.seconds, rel=1e-5)
    # a speculative step commits tau tokens per sequence: at tau 4 it meets a = 4 x 4 / L, tau times a plain step's
    spec = dict(k=7, context=1000, gpu=ROUND_GPU, constants=ideal, batch=4)
    draft = calibration.QWEN3_8B_DFLASH
    at16 = speculative_step(m, draft, tau=4.0, output_len=16, **spec)
    at4 = speculative_step(m, draft, tau=4.0, output_len=4, **spec)
    assert at16.admissions_s == pytest.approx(mixed.admissions_s)  # a = 4 x 4 / 16 = 1, as plain at 4 tokens
    assert at4.admissions_s == pytest.approx((1 - math.exp(-3)) * 419.682e-6)  # a = 4 x 3 / 4: 95 % of steps, never past 1
    assert admission_cost(ideal, batch=16, output_len=4, tokens_per_step=5, speculative=True) < 419.682e-6
    assert mixed_share(0.0) == 0.0 and mixed_share(20 * 5 / 1) == pytest.approx(1.0)
    # plain and speculative steps take their own constants; the bound names admissions where they are the most
    split = dataclasses.replace(ideal, admission_s=0.0, speculative_admission_s=1.0)
    assert plain_step(m, batch=4, context=1000, gpu=ROUND_GPU, constants=split, output_len=4).admissions_s == 0.0
    assert speculative_step(m, draft, tau=4.0, output_len=16, **{**spec, "constants": split}).bound == "admissions"


def test_the_admission_line_is_fitted_by_least_absolute_deviations_from_each_case_s_residuals():
    """Residuals on the lines F = 2 ms, X_plain = 1 ms (plain) and S = 1 ms, X_spec = 30 ms (speculative, less the
    plain residual): the fit gives them back, and a case far off (20 ms more, as vllm#49730 is off the others) moves
    neither line, as it moved no median."""
    shares = [(0.01, 0.05), (0.1, 0.4), (0.2, 0.7), (0.03, 0.2), (0.5, 0.9)]

    def case(mp: float, ms: float, off: float = 0.0) -> tuple[float, float, float, float]:
        plain = 2e-3 + 1e-3 * mp
        return plain, plain + 1e-3 + 30e-3 * ms - 1e-3 * mp + off, mp, ms

    costs = fixed_costs_from_residuals([case(*s) for s in shares])
    assert costs == pytest.approx((2e-3, 1e-3, 1e-3, 30e-3), abs=1e-9)
    off = fixed_costs_from_residuals([case(*s) for s in shares] + [case(0.02, 0.1, off=20e-3)])
    assert off == pytest.approx(costs, abs=1e-9)
    # one X for both (the "shared" form) and none at all (the medians of before) from the same residuals
    assert fixed_costs_from_residuals([case(*s) for s in shares], "none")[2:] == (0.0, 0.0)
    shared = fixed_costs_from_residuals([case(*s) for s in shares], "shared")
    assert shared[2] == shared[3] > 0


def test_the_stored_constants_are_the_fit_s_with_the_admission_term():
    fitted = calibration.fit()
    for engine, stored in ENGINES.items():
        got = fitted[engine]
        assert got.admission_s == pytest.approx(stored.admission_s, abs=2e-5), engine
        assert got.speculative_admission_s == pytest.approx(stored.speculative_admission_s, abs=2e-5), engine
    assert ENGINES["vllm"].speculative_admission_s > 5 * ENGINES["vllm"].admission_s  # what the B200 gaps show
    for name in ("sglang", "vllm"):
        c = ENGINES[name]
        line = (f"{name}: {c.bandwidth_efficiency:.3f}, {c.fixed_step_s * 1e3:.3f} / {c.speculative_step_s * 1e3:.3f} ms "
                f"fixed / speculative, {c.admission_s * 1e3:.3f} / {c.speculative_admission_s * 1e3:.3f} ms a mixed "
                "plain / speculative step")
        assert line in DOCS, line


def test_the_highest_concurrency_cases_are_predicted_within_10_percent_and_not_without_the_term():
    """vLLM K 7 at concurrency 16 and SGLang K 15 at 32: without the term (its constants zeroed, the rest as fitted)
    their speculative tokens/s is predicted about 1.5x too fast; with it, within 10 %."""
    busy = [c for c in CASES if c.kind == "throughput" and not c.plain_only and c.concurrency >= 16]
    assert {(c.engine, c.concurrency) for c in busy} == {("vllm", 16), ("sglang", 32)}
    for c in busy:
        constants = ENGINES[c.engine]
        assert evaluate(c, constants).errors["speculative_tokens_per_s"] < 0.10, c.name
        bare = dataclasses.replace(constants, admission_s=0.0, speculative_admission_s=0.0)
        assert evaluate(c, bare).errors["speculative_tokens_per_s"] > 0.30, c.name
        # the share of steps that admit: a = c tau / L_out, tau times a plain step's
        assert c.output_len == 256 and c.concurrency * c.tau / c.output_len > 0.3


def test_the_kept_form_has_the_lowest_leave_one_out_error_and_the_docs_state_it():
    """A term that does not predict held-out cases better is not kept: the median of |predicted / measured - 1| over
    the held-out cases' plain and speculative tokens/s, with the term as kept and without it."""
    def median_error(form: str) -> float:
        errors = sorted(e for r in leave_one_out(admissions=form) for k, e in r.errors.items() if k != "speedup")
        n = len(errors)
        return (errors[(n - 1) // 2] + errors[n // 2]) / 2

    kept, none = median_error(calibration.ADMISSIONS), median_error("none")
    assert kept < none
    assert f"leave-one-out median {kept:.1%} with the term as kept, {none:.1%} without" in DOCS


def test_a_direction_holds_over_the_whole_output_length_range_too():
    """vllm#42505 states no output length: 256 to 2,048 is evaluated, the case right only where the direction holds
    at every tau end and every output-length end. A dense target on an A800 at tau 2, concurrency 4: faster with long requests,
    slower with 8-token ones (a = 4 x 2 / 8 = 1: 63 % of its speculative steps then admit one)."""
    busy = next(c for c in DIRECTION_CASES if c.concurrency == 16)
    r = evaluate_direction(busy, ENGINES["vllm"])
    assert busy.output_len == calibration.EVALSCOPE_OUTPUT_RANGE == (256, 2048)
    assert set(r.predicted) == {f"speedup at tau {t:g} and {n} out" for t in (2, 3) for n in (256, 2048)}
    assert r.right == all(s < 1.0 for s in r.predicted.values())
    dense = dataclasses.replace(DIRECTION_CASES[1], target=calibration.QWEN3_8B, draft=calibration.QWEN3_8B_DFLASH,
                                gpu="A800", engine="sglang", k=15, concurrency=4, tau=(2.0, 2.0))
    wide = evaluate_direction(dataclasses.replace(dense, output_len=(8, 4096)), ENGINES["sglang"])
    short, long = wide.predicted["speedup at tau 2 and 8 out"], wide.predicted["speedup at tau 2 and 4096 out"]
    assert short < 1.0 < long and not wide.right
    assert evaluate_direction(dataclasses.replace(dense, output_len=(4096, 4096)), ENGINES["sglang"]).right


def test_predict_passes_its_output_length_and_names_admissions_when_they_are_the_step_s_largest_share():
    """The B200 cases' target and draft at concurrency 32, tau 6.5: 64-token requests make admissions the speculative
    step's largest term (a = 32 x 6.5 / 64 = 3.25); 4,096-token ones leave them a small share, and a faster step."""
    inputs = Inputs(target_facts(calibration.QWEN3_6_35B_A3B_FP8), calibration.QWEN3_6_35B_A3B_DFLASH, "t", "d")

    def row(output_len: int):
        return predict(inputs, [gpu("B200")], {15: 6.5}, concurrency=[32], input_len=60, output_len=output_len,
                       engine="sglang").predictions[0]

    short, long = row(64), row(4096)
    assert short.bound == "admissions" and long.bound != "admissions"
    assert short.speculative_tokens_per_s < long.speculative_tokens_per_s


def test_at_concurrency_1_the_assumed_output_length_barely_moves_a_case():
    """The A800 cases state no output length (512 assumed): at batch 1 a step admits 1/L_out requests, so 256 or
    2,048 moves their figures by under 3 %."""
    for c in (c for c in CASES if "29244" in c.source):
        assert c.output_len == 512
        got = [evaluate(dataclasses.replace(c, output_len=n), ENGINES[c.engine]).predicted for n in (256, 2048)]
        for figure in ("baseline_tokens_per_s", "speculative_tokens_per_s"):
            assert got[0][figure] == pytest.approx(got[1][figure], rel=0.03), (c.name, figure)

