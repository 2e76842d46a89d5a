"""The notes a prediction carries where its setting lies outside what the calibration cases measured, each read from
the cases (calibration.coverage), never a hand list: speculation at TP > 1 (every TP case is plain only), admissions
a visible share of the step on a kind of target the admission costs were not fitted on, the all-reduce extra's one
target, and input or output lengths past the cases'."""

from __future__ import annotations

import dataclasses

from dflash_convert.predict import calibration
from dflash_convert.predict.calibration import CASES, coverage
from dflash_convert.predict.facts import target_facts
from dflash_convert.predict.gpus import gpu
from dflash_convert.predict.prediction import Inputs, predict

HYBRID = Inputs(target_facts(calibration.QWEN3_6_35B_A3B_FP8), calibration.QWEN3_6_35B_A3B_DFLASH, "t", "d")
DENSE = Inputs(target_facts(calibration.QWEN3_8B), calibration.QWEN3_8B_DFLASH, "t", "d")
DEEPSEEK = target_facts(calibration.DEEPSEEK_R1)


def outside(inputs: Inputs, **request) -> list[str]:
    on = gpu(request.pop("gpu", "B200"))
    args = dict(concurrency=[4], input_len=60, output_len=256, engine="vllm", tp=1) | request
    return predict(inputs, [on], {7: 5.2, 15: 6.5}, **args).error_band.outside_calibration


def test_the_b200_cases_own_setting_is_inside_every_note():
    assert outside(HYBRID) == []
    assert outside(HYBRID, input_len=1024, output_len=1024, concurrency=[1, 32]) == []


def test_speculation_at_tp_above_1_is_uncalibrated_as_every_tp_case_is_plain_only():
    cov = coverage()
    assert cov.speculative_tp == (1, 1) and cov.tp == (1, 8)
    notes = outside(HYBRID, tp=2)
    assert any(n.startswith("speculation at TP 2 is uncalibrated (the cases with a speculative figure: TP 1;")
               for n in notes), notes
    # read from the cases: a speculative case at TP 2 covers it
    wider = coverage(CASES + (dataclasses.replace(CASES[0], tp=2),))
    assert not any(n.startswith("speculation") for n in wider.outside(
        target_facts(calibration.QWEN3_8B), tp=2, concurrency=[1], bounds=set(), speculative=True))


def test_admissions_on_a_target_of_a_kind_they_were_not_fitted_on_are_noted_where_visible():
    assert coverage().admission_attention == {"linear-attention hybrid"}  # the B200 runs' target
    busy = outside(DENSE, concurrency=[64], input_len=512, output_len=256, gpu="H200")
    assert any(n.startswith("admissions ") and "on a full attention target (the admission costs were fitted where "
               "admissions matter on linear-attention hybrid targets only)" in n for n in busy), busy
    # batch 1 with long outputs: admissions are no visible share, no note
    quiet = outside(DENSE, concurrency=[1], input_len=512, output_len=1024, gpu="H200")
    assert not any(n.startswith("admissions") for n in quiet), quiet


def test_the_all_reduce_cost_at_tp_above_1_rests_on_the_one_target_the_tp_cases_ran():
    cov = coverage()
    assert set(cov.tp_targets) == {"DeepSeek-R1"}
    notes = cov.outside(target_facts(calibration.QWEN3_8B), tp=4, concurrency=[1], bounds=set())
    assert notes == ["the all-reduce cost at TP 4: its fitted extra rests on the runs of DeepSeek-R1 (MLA attention, "
                     "MoE, 8-bit weights; sglang, vllm) only"]
    assert cov.outside(DEEPSEEK, tp=8, concurrency=[8], bounds=set()) == []  # that target itself
    assert cov.outside(target_facts(calibration.QWEN3_8B), tp=1, concurrency=[1], bounds=set()) == []


def test_lengths_past_the_cases_are_noted_from_the_cases_range():
    cov = coverage()
    ins = [c.input_len for c in CASES if c.kind == "throughput"]
    outs = [c.output_len for c in CASES if c.kind == "throughput"]
    assert cov.input_len == (min(ins), max(ins)) and cov.output_len == (min(outs), max(outs))
    notes = outside(HYBRID, input_len=32768, output_len=64)
    assert f"--input-len 32768 (the cases: {min(ins)} to {max(ins)})" in notes
    assert f"--output-len 64 (the cases: {min(outs)} to {max(outs)})" in notes
    assert not any(n.startswith("--") for n in outside(HYBRID, input_len=max(ins), output_len=min(outs)))
