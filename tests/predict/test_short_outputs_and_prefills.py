"""What a request's length does to a step: its first token comes from its prefill, so a step commits at most what a
request has left to decode (committed_per_step), and each admitted request runs its own prefill (prefill_pass), the
expected a x that pass per step beside the engine's admission constant."""

from __future__ import annotations

import math

import pytest

from dflash_convert.predict import calibration
from dflash_convert.predict.cost import (EngineConstants, admission_cost, committed_per_step, plain_step, prefill_pass,
                                         speculative_step)
from dflash_convert.predict.facts import target_facts
from dflash_convert.predict.gpus import gpu
from dflash_convert.predict.prediction import Inputs, predict, text_lines

QWEN3_8B = Inputs(target_facts(calibration.QWEN3_8B), calibration.QWEN3_8B_DFLASH, "t", "d")
TAUS = {3: 2.5, 7: 4.1, 15: 5.6}
# meta-llama/Llama-3.1-70B config.json: 80 layers at 8192, 64 heads (8 KV) of 128, MLP 28672, vocabulary 128,256
LLAMA_70B = target_facts({"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
                          "num_key_value_heads": 8, "intermediate_size": 28672, "vocab_size": 128256,
                          "torch_dtype": "bfloat16"})


def test_a_step_commits_at_most_what_a_request_has_left_to_decode():
    assert committed_per_step(5.6, 1) == committed_per_step(5.6, 2) == 1.0  # nothing left to speculate on
    assert committed_per_step(5.6, 4) == 3.0  # the prefill's token, then at most 3 by decode steps
    assert committed_per_step(5.6, 7) == committed_per_step(5.6, 512) == 5.6
    assert committed_per_step(5.6, None) == 5.6  # a pass timed alone


def test_an_output_of_one_token_gains_nothing_from_speculation_and_says_why():
    """The reviewer's command at --output-len 1 recommended K 15 at 1.27x: one token is the prefill's, so no decode
    step commits more than the target's own token, and every K costs more than it gives."""
    report = predict(QWEN3_8B, [gpu("H200")], TAUS, concurrency=[1, 8, 64], input_len=1024, output_len=1)
    assert all(r.speedup < 1.0 for r in report.predictions)
    assert all(rec.num_speculative_tokens is None for rec in report.recommendation)
    note = next(n for n in report.notes if n.startswith("--output-len 1:"))
    assert "one token comes from its prefill" in note and "nothing to speculate on" in note
    assert "at most 0" not in "\n".join(report.notes)  # no decode step at all, not one of 0 tokens
    # an output of 5 tokens caps tau for K 7 and 15 only (4 < 4.1, 5.6), and K 15 commits no more than K 7 then
    five = predict(QWEN3_8B, [gpu("H200")], TAUS, concurrency=[1], input_len=32, output_len=5)
    assert any(n.startswith("--output-len 5 caps tau for K 7, 15:") for n in five.notes)
    by_k = {r.num_speculative_tokens: r for r in five.predictions}
    assert by_k[15].speculative_tokens_per_s <= by_k[7].speculative_tokens_per_s < 4 * by_k[7].baseline_tokens_per_s
    # the usual output lengths: no such note
    usual = predict(QWEN3_8B, [gpu("H200")], TAUS, concurrency=[1], input_len=1024, output_len=512)
    assert not any("caps tau" in n for n in usual.notes)
    assert "caps tau" not in "\n".join(text_lines(usual))
    # an output below K+1 whose cap is above tau (6 - 1 = 5 > 4.1 for K 7) caps nothing: no note
    six = predict(QWEN3_8B, [gpu("H200")], {7: 4.1}, concurrency=[1], input_len=1024, output_len=6)
    assert not any("caps tau" in n or "prefill" in n for n in six.notes), six.notes


def test_no_speculation_s_reason_counts_the_tokens_a_step_commits():
    """A step commits tau capped at what a request has left (committed_per_step): at --output-len 2 that is 1 token,
    so the reason compares the step with 1 plain step, not with tau 4.10 of them."""
    two = predict(QWEN3_8B, [gpu("H200")], {7: 4.1}, concurrency=[1], input_len=1024, output_len=2)
    reason = two.recommendation[0].reason
    assert two.recommendation[0].num_speculative_tokens is None
    assert ("costs more than the 1.00 plain step (admissions-bound) its 1 committed token replaces (tau 4.10 capped "
            "by --output-len 2)") in reason and "tau 4.10 plain steps" not in reason, reason
    # uncapped (a long output): the tokens it commits are tau, and nothing is said to cap them
    low = predict(QWEN3_8B, [gpu("H200")], {3: 1.1}, concurrency=[64], input_len=1024, output_len=512)
    reason = low.recommendation[0].reason
    assert "the 1.10 plain steps" in reason and "its 1.10 committed tokens replace" in reason
    assert "capped" not in reason, reason


def test_a_speedup_just_below_one_is_not_printed_as_1_00x():
    """At --output-len 5 K 7 gives 0.996x: "1.00x" beside "no K reaches 1.0x" reads as a contradiction; the
    reason and the table print the digits that agree with the verdict."""
    from dflash_convert.predict.prediction import markdown_lines, speedup_text

    five = predict(QWEN3_8B, [gpu("H200")], {7: 4.1}, concurrency=[1], input_len=1024, output_len=5)
    row, rec = five.predictions[0], five.recommendation[0]
    assert 0.995 <= row.speedup < 1.0 and rec.num_speculative_tokens is None
    assert f"gives {row.speedup:.3f}x" in rec.reason and "1.00x" not in rec.reason, rec.reason
    shown = "\n".join(text_lines(five) + markdown_lines(five))
    assert f"{row.speedup:.3f}x" in shown and "1.00x" not in shown
    assert speedup_text(0.9996) == "0.9996" and speedup_text(1.004) == "1.00" and speedup_text(0.57) == "0.57"


def test_an_admission_runs_its_own_prefill_a_times_per_step():
    constants = calibration.ENGINES["vllm"]
    h200 = gpu("H200")
    bare = plain_step(LLAMA_70B, batch=8, context=1024, gpu=h200, constants=constants, tp=4, output_len=512)
    long = plain_step(LLAMA_70B, batch=8, context=1024, gpu=h200, constants=constants, tp=4, output_len=512,
                      input_len=32768)
    prefill = prefill_pass(LLAMA_70B, input_len=32768, gpu=h200, constants=constants, tp=4)
    assert long.admissions_s - bare.admissions_s == pytest.approx(8 / 512 * prefill.seconds)
    # 32k tokens of a 70B target are compute-bound: 2 FLOPs per weight per token, and attention over 16k on average
    assert prefill.compute_s > prefill.memory_s
    active = LLAMA_70B.dense_params
    assert prefill.flops > 2 * 32768 * active and prefill.seconds > 1.0
    # each admission its own prefill, X once per mixed step; speculative steps meet tau times as many
    spec = speculative_step(LLAMA_70B, calibration.QWEN3_8B_DFLASH, batch=8, k=7, tau=4.0, context=1024, gpu=h200,
                            constants=constants, tp=4, output_len=512, input_len=32768)
    a = 8 * 4.0 / 512
    assert spec.admissions_s == pytest.approx((1 - math.exp(-a)) * constants.speculative_admission_s
                                              + a * prefill.seconds)
    assert admission_cost(constants, batch=8, output_len=None, tokens_per_step=1, speculative=False,
                          prefill_s=1.0) == 0.0  # no requests arriving: no prefills


def test_a_long_prompt_lowers_the_predicted_throughput():
    """The reviewer's 70B at TP 4: 128 against 32k tokens in moved plain tok/s by 3 % (43.3 -> 41.9), only the mean
    context's KV cache; each request's 32k prefill costs about 2 s every 512 tokens out, a fifth of the time."""
    inputs = Inputs(LLAMA_70B, calibration.QWEN3_8B_DFLASH, "t", "d")

    def plain(input_len: int) -> float:
        report = predict(inputs, [gpu("H200")], {7: 4.1}, concurrency=[1], input_len=input_len, output_len=512, tp=4)
        return report.predictions[0].baseline_tokens_per_s

    assert plain(32768) < 0.85 * plain(128)


def test_the_calibration_counts_each_case_s_prefills():
    """Every throughput case states its prompt length (the source's, or the context it assumes), and the fit's
    residuals are what is left after the prefills: zeroing them in a case moves its predicted figure."""
    for c in calibration.CASES:
        if c.kind == "throughput":
            assert 0 < c.input_len <= c.context, c.name
    b200 = next(c for c in calibration.CASES if c.gpu == "B200")
    assert b200.input_len == 60  # the report's GSM8K prompts
    assert all(d.input_len > 0 for d in calibration.DIRECTION_CASES)
