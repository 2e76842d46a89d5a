"""`predict`: the cost model's arithmetic on hand-worked cases, the calibration set within the band the docs
state, the MoE-vs-dense pay-off at batch 1, the command offline from config files, and its bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_convert.errors import UsageError
from dflash_convert.predict import calibration
from dflash_convert.predict.cost import EngineConstants, plain_step, speculative_step
from dflash_convert.predict.facts import ModelFacts, target_facts
from dflash_convert.predict.gpus import GPU, gpu
from dflash_convert.predict.prediction import Inputs, parse_taus, predict, taus_from_rates, text_lines

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "examples" / "pair"
IDEAL = EngineConstants(1.0, 1.0, 0.0, 0.0)  # the datasheet exactly: the arithmetic is the bytes and FLOPs alone
ROUND_GPU = GPU("round", memory_bandwidth_gbps=1000, bf16_tflops=100, fp8_tflops=None, memory_gb=80, link_gbps=100)

# hidden 1024, 4 layers, 8 heads of 128 (kv 8), MLP 4096, vocab 32000, bf16:
#   attention 4 x 1024^2 = 4,194,304 and MLP 3 x 1024 x 4096 = 12,582,912 per layer -> 67,108,864 weights,
#   134,217,728 bytes; lm_head 32000 x 1024 x 2 = 65,536,000 bytes; KV per position per layer 2 x 8 x 128 x 2 = 4096
DENSE = {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
         "head_dim": 128, "intermediate_size": 4096, "vocab_size": 32000, "torch_dtype": "bfloat16"}
SMALL_DRAFT = ModelFacts(hidden=1024, layers=1, heads=8, kv_heads=8, head_dim=128, intermediate=4096, vocab=32000,
                         context_features=2 * 1024)


def test_a_dense_target_at_batch_1_is_memory_bound_on_its_weights():
    m = target_facts(DENSE)
    step = plain_step(m, batch=1, context=1000, gpu=ROUND_GPU, constants=IDEAL)
    kv = 4 * 1000 * 4096
    assert step.passes[0].bytes_by_term == {"weights": 134_217_728, "experts": 0.0, "KV cache": kv,
                                           "lm_head": 65_536_000}
    # 216,137,728 bytes at 1000 GB/s; FLOPs 2 x (67,108,864 + 32,768,000) + 4 x 4000 x 1024 = 216,137,728 at
    # 100 TFLOP/s is 100x less
    assert step.seconds == pytest.approx(216_137_728 / 1e12)
    assert step.passes[0].compute_s == pytest.approx(216_137_728 / 1e14)
    assert step.bound == "weights"


def test_a_moe_verify_touches_many_more_experts_than_one_token_and_costs_several_plain_steps():
    moe = target_facts({**DENSE, "num_experts": 64, "num_experts_per_tok": 8, "moe_intermediate_size": 512,
                        "num_hidden_layers": 4})
    assert moe.distinct_experts(1) == pytest.approx(8.0)
    assert moe.distinct_experts(16) == pytest.approx(64 * (1 - (56 / 64) ** 16))  # 56.4 of 64
    plain = plain_step(moe, batch=1, context=100, gpu=ROUND_GPU, constants=IDEAL)
    spec = speculative_step(moe, SMALL_DRAFT, batch=1, k=15, tau=3.0, context=100, gpu=ROUND_GPU, constants=IDEAL)
    expert_bytes = 3 * 1024 * 512 * 2
    assert plain.passes[0].bytes_by_term["experts"] == pytest.approx(4 * 8 * expert_bytes)
    assert spec.passes[1].bytes_by_term["experts"] == pytest.approx(4 * moe.distinct_experts(16) * expert_bytes)
    assert spec.seconds > 3 * plain.seconds  # so tau 3 does not pay for it
    assert spec.bound == "experts"


def test_verification_at_high_concurrency_is_compute_bound():
    m = target_facts(DENSE)
    spec = speculative_step(m, SMALL_DRAFT, batch=512, k=15, tau=4.0, context=100, gpu=ROUND_GPU, constants=IDEAL)
    verify = spec.passes[1]
    n = 512 * 16
    assert verify.flops == pytest.approx(2 * n * (67_108_864 + 32_768_000) + 4 * n * 4 * 100 * 8 * 128)
    assert verify.compute_s > verify.memory_s and spec.bound == "compute"
    assert plain_step(m, batch=512, context=100, gpu=ROUND_GPU, constants=IDEAL).bound != "compute"


def test_kv_reads_dominate_at_long_context():
    m = target_facts(DENSE)
    step = plain_step(m, batch=16, context=128_000, gpu=ROUND_GPU, constants=IDEAL)
    assert step.passes[0].bytes_by_term["KV cache"] == 16 * 4 * 128_000 * 4096  # 33.6 GB against 0.2 GB of weights
    assert step.bound == "KV cache"


def test_sliding_and_linear_attention_layers_read_less_than_a_growing_cache():
    hybrid = target_facts({**DENSE, "layer_types": ["linear_attention", "full_attention", "sliding_attention",
                                                    "linear_attention"], "sliding_window": 128,
                           "linear_num_key_heads": 4, "linear_num_value_heads": 8, "linear_key_head_dim": 64,
                           "linear_value_head_dim": 64})
    step = plain_step(hybrid, batch=1, context=10_000, gpu=ROUND_GPU, constants=IDEAL)
    state = 8 * 64 * 64 * 4  # float32 state per linear layer, read and written once at one token
    assert step.passes[0].bytes_by_term["KV cache"] == (10_000 + 128) * 4096 + 2 * state * 2


def test_quantization_config_sets_the_bytes_per_weight():
    fp8 = target_facts({**DENSE, "quantization_config": {"quant_method": "fp8"}})
    w4 = target_facts({**DENSE, "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}})
    assert (fp8.weight_bytes, fp8.compute) == (1.0, "fp8")
    assert w4.weight_bytes == pytest.approx(0.5 + 2 / 128) and w4.compute == "bf16"


def test_the_calibration_set_is_reproduced_within_the_band_the_docs_state():
    fitted = calibration.fit()
    for engine, stored in calibration.ENGINES.items():  # the stored constants are the fit's, not hand-set
        got = fitted[engine]
        assert got.bandwidth_efficiency == pytest.approx(stored.bandwidth_efficiency, abs=0.003), engine
        assert got.fixed_step_s == pytest.approx(stored.fixed_step_s, abs=2e-5), engine
        assert got.speculative_step_s == pytest.approx(stored.speculative_step_s, abs=2e-5), engine
        assert got.allreduce_extra_s == pytest.approx(stored.allreduce_extra_s, abs=1e-7), engine
    band = calibration.error_band()
    assert band.median <= 0.15
    # every measured case's pay-off direction (the stated ones: test_calibration_cases.py)
    assert all(r.direction_right is not False for r in band.results)
    assert all(e <= band.worst for r in band.results for k, e in r.errors.items() if k != "speedup")
    assert band.line() in (ROOT / "docs" / "performance.md").read_text()


def test_a_moe_target_at_batch_1_is_predicted_slower_where_a_dense_one_of_its_active_size_is_faster():
    moe = target_facts(calibration.QWEN3_30B_A3B)
    active = moe.dense_params + moe.moe_layers * moe.top_k * moe.expert_params  # about 3 B
    dense = target_facts({"hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
                          "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
                          "intermediate_size": round((active / 48 - moe.attention_params) / (3 * 2048))})
    assert dense.dense_params == pytest.approx(active, rel=0.01)
    taus = {15: 2.5}
    a800 = [gpu("A800")]
    slower = predict(Inputs(moe, calibration.QWEN3_30B_A3B_DFLASH, "moe", "d"), a800, taus, concurrency=[1],
                     input_len=256, output_len=256, engine="sglang")
    faster = predict(Inputs(dense, calibration.QWEN3_30B_A3B_DFLASH, "dense", "d"), a800, taus, concurrency=[1],
                     input_len=256, output_len=256, engine="sglang")
    assert slower.predictions[0].speedup < 1.0 < faster.predictions[0].speedup
    assert slower.recommendation[0].num_speculative_tokens is None
    assert "no K reaches 1.0x" in slower.recommendation[0].reason
    assert faster.recommendation[0].num_speculative_tokens == 15
    assert "--speculative-num-draft-tokens 16" in faster.recommendation[0].launch  # sglang counts the block


def test_tau_from_rates_and_parsing():
    assert taus_from_rates([0.9, 0.7, 0.4]) == {1: pytest.approx(1.9), 2: pytest.approx(2.6), 3: pytest.approx(3.0)}
    assert parse_taus("3=2.5, 7=4") == {3: 2.5, 7: 4.0}
    for bad, words in (("7", "has no tau"), ("7=", "has no tau"), ("7=9", "must be in [1, 8]"), ("0=1", "at least 1")):
        with pytest.raises(UsageError, match=words.replace("[", r"\[").replace("]", r"\]")):
            parse_taus(bad)


def test_the_command_runs_offline_from_config_files_and_prints_json():
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    r = subprocess.run([sys.executable, "-m", "dflash_convert", "predict", "--target", str(PAIR / "target"),
                        "--draft", str(PAIR / "draft" / "config.json"), "--gpu", "H100-SXM,h200",
                        "--tau", "7=6.5,15=14.6", "--concurrency", "1,32", "--json"],
                       capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {(p["gpu"], p["num_speculative_tokens"], p["concurrency"]) for p in out["predictions"]} == {
        (g, k, b) for g in ("H100-SXM", "H200") for k in (7, 15) for b in (1, 32)}
    row = out["predictions"][0]
    assert set(row) >= {"gpu", "num_speculative_tokens", "concurrency", "baseline_tokens_per_s",
                        "speculative_tokens_per_s", "speedup", "bound"}
    assert len(out["recommendation"]) == 4 and out["error_band"]["median"] <= 0.15


def test_the_command_reads_tau_from_a_validate_report(cli, tmp_path):
    report = tmp_path / "report.json"
    report.write_text(json.dumps({"per_num_speculative_tokens": [
        {"num_speculative_tokens": 3, "acceptance_length": 3.2, "per_position_rates": [0.9, 0.8, 0.5]}]}))
    r = cli("predict", "--target", PAIR / "target", "--draft", PAIR / "draft", "--gpu", "H200", "--from-report",
            report, "--json")
    assert r.code == 0, r.err
    assert json.loads(r.out)["taus"] == {"1": 1.9, "2": 2.7, "3": 3.2}  # K 1, 2 from the rates; 3 as measured
    both = cli("predict", "--target", PAIR / "target", "--draft", PAIR / "draft", "--gpu", "H200", "--from-report",
               report, "--tau", "3=3.5", "--json")
    assert both.code == 0 and json.loads(both.out)["taus"]["3"] == 3.5, both.err  # --tau overrides the report's
    assert json.loads(both.out)["tau_source"].endswith("--tau at K 3")


@pytest.mark.parametrize("args, words", [
    (["--gpu", "H999", "--tau", "7=4"], "unknown GPU; known: H100-SXM, H100-PCIe, H200"),
    (["--gpu", "H100", "--tau", "7"], "K 7 has no tau"),
    (["--gpu", "H100", "--tau", "7=4", "--concurrency", "0"], "--concurrency must be positive"),
    (["--gpu", "H100", "--tau", "7=4", "--concurrency", "-3"], "--concurrency must be positive"),
    (["--gpu", "H100"], "no tau"),
    (["--gpu-spec", "bw=100", "--tau", "7=4"], "bf16 missing"),
    (["--gpu-spec", "bw=nan,bf16=1", "--tau", "7=4"], "positive finite number"),
    (["--gpu-spec", "bw=inf,bf16=1", "--tau", "7=4"], "positive finite number"),
    # a key twice: which was meant is not guessed; figures past their bounds printed 0.0 tok/s
    (["--gpu-spec", "name=x,bw=100,bf16=100,bw=200", "--tau", "7=4"], "name=x,bw=100,bf16=100,bw=200: bw is given twice"),
    (["--gpu-spec", "name=x,bw=1e-300,bf16=100", "--tau", "7=4"], "bw must be in [1, 100,000] GB/s, got 1e-300"),
    (["--gpu-spec", "name=x,bw=100,bf16=1e-300", "--tau", "7=4"], "bf16 must be in [0.1, 100,000] TFLOP/s, got 1e-300"),
    (["--gpu-spec", "name=x,bw=100,bf16=100,mem=1e-9", "--tau", "7=4"], "mem must be in [1, 10,000] GB, got 1e-09"),
    (["--gpu-spec", "name=x,bw=100,bf16=100,link=1e9", "--tau", "7=4"], "link must be in [1, 100,000] GB/s"),
    (["--gpu", "H100", "--tau", "7=4", "--concurrency", "99999999999999"],
     "--concurrency must be at most 1,000,000 sequences, got 99999999999999"),
])
def test_bad_input_is_one_line_and_exit_2(cli, args, words):
    r = cli("predict", "--target", PAIR / "target", "--draft", PAIR / "draft", *args)
    assert r.code == 2, (r.code, r.err)
    assert words in r.err and len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err, r.err


def test_the_gpu_table_lies_within_the_gpu_spec_bounds():
    """The bounds are wide around the table's parts: every datasheet figure there is one --gpu-spec accepts."""
    from dflash_convert.predict.gpus import GPUS, SPEC_BOUNDS, gpu_from_spec

    for g in GPUS.values():
        spec = (f"name={g.name},bw={g.memory_bandwidth_gbps},bf16={g.bf16_tflops},mem={g.memory_gb},"
                f"link={g.link_gbps}" + (f",fp8={g.fp8_tflops}" if g.fp8_tflops else ""))
        assert gpu_from_spec(spec) == g
    assert set(SPEC_BOUNDS) == {"bw", "bf16", "fp8", "mem", "link"}


def test_inspect_says_when_a_full_batch_makes_the_verify_compute_bound(cli):
    launch = ("--engine", "vllm", "--num-speculative-tokens", "15")
    r = cli("inspect", PAIR / "draft", *launch, "--max-num-seqs", "64", "--gpu", "H100", "--json")
    assert r.code == 0, r.err  # a warning, not a failed check
    check = next(c for c in json.loads(r.out)["checks"] if c["name"] == "verify_compute_bound")
    # H100 SXM: 989 TFLOP/s x 0.6 over 3350 GB/s x 0.77 = 230 tokens; 64 x 16 = 1024 is past it
    assert check["status"] == "warn" and "1024 verify tokens" in check["message"] and "230 tokens" in check["message"]
    assert "give --target" in check["message"]
    few = cli("inspect", PAIR / "draft", *launch, "--max-num-seqs", "4", "--gpu", "H100", "--target",
              PAIR / "target", "--json")
    check = next(c for c in json.loads(few.out)["checks"] if c["name"] == "verify_compute_bound")
    assert check["status"] == "pass" and "memory-bound" in check["message"], check
    for args, words in ((("--gpu", "H100"), "give --engine, --num-speculative-tokens and --max-num-seqs"),
                        (("--max-num-seqs", "4", "--target", PAIR / "target"), "--target goes with --gpu"),
                        (("--max-num-seqs", "4", "--gpu", "nope"), "unknown GPU; known:")):
        bad = cli("inspect", PAIR / "draft", *launch, *args)
        assert bad.code == 2 and words in bad.err, bad.err


def test_an_engine_with_one_case_takes_the_pooled_fixed_costs():
    """One throughput case fits both of an engine's fixed costs exactly, whatever else made it slow: vLLM's first case
    (vllm#49730, a hybrid target at 1.2x) alone sets an 11.2 ms speculative cost that would predict no speculation for
    every small target. With fewer than MIN_OWN_CASES cases an engine takes the serving engines' pooled costs: the
    rule on the calibration set as it stood with that one vLLM case; with the B200 runs vLLM has cases of its own."""
    from dflash_convert.predict.calibration import CASES, EngineConstants, _fixed_costs, fit

    one = tuple(c for c in CASES if c.engine != "vllm" or "49730" in c.source)
    fitted = fit(one)
    vllm = [c for c in one if c.engine == "vllm" and c.kind == "throughput"]
    assert len(vllm) == 1 < calibration.MIN_OWN_CASES  # else this test no longer tests the rule
    serving = [c for c in one if c.engine != "runtime" and c.tp == 1]  # TP > 1 cases give the all-reduce extra
    base = EngineConstants(fitted["vllm"].bandwidth_efficiency, calibration.ASSUMED_COMPUTE_EFFICIENCY, 0.0, 0.0)
    pooled = _fixed_costs(serving, base)
    got = fitted["vllm"]
    assert (got.fixed_step_s, got.speculative_step_s, got.admission_s, got.speculative_admission_s) == \
        pytest.approx(pooled)
    assert fitted["vllm"].speculative_step_s < _fixed_costs(vllm, base)[1]  # pooled against 11.2 ms alone
    # the stored constants: vLLM's own, fitted on its five TP 1 cases (its TP 8 case gives the all-reduce extra)
    now = [c for c in CASES if c.engine == "vllm" and c.kind == "throughput" and c.tp == 1]
    assert len(now) >= calibration.MIN_OWN_CASES
    base = EngineConstants(calibration.ENGINES["vllm"].bandwidth_efficiency, calibration.ASSUMED_COMPUTE_EFFICIENCY,
                           0.0, 0.0)
    got = fit()["vllm"]
    assert (got.fixed_step_s, got.speculative_step_s, got.admission_s, got.speculative_admission_s) == \
        pytest.approx(_fixed_costs(now, base))


def test_the_prediction_carries_the_engine_s_speedup_error_and_says_where_it_is_outside_the_cases():
    facts = target_facts(DENSE)
    draft = SMALL_DRAFT
    inside = predict(Inputs(facts, draft, "t", "d"), [gpu("A800")], {7: 4.0}, concurrency=[1], input_len=256,
                     output_len=256, engine="sglang")
    outside = predict(Inputs(facts, draft, "t", "d"), [gpu("A800")], {7: 4.0}, concurrency=[1, 128], input_len=256,
                      output_len=256, engine="vllm", tp=8)
    band = calibration.error_band()
    assert inside.error_band.speedup_worst == pytest.approx(band.speedup("sglang").worst, abs=1e-4)
    assert not inside.error_band.speedup_pooled and inside.error_band.outside_calibration == []
    assert not outside.error_band.speedup_pooled and outside.error_band.speedup_worst > 1.0  # vllm#49730's 139 %
    # TP 8 is the DeepSeek-R1 cases' (inside); concurrency 128 lies past them
    assert outside.error_band.outside_calibration[:1] == ["concurrency 128 (the cases: 1 to 64)"]
    assert not any(o.startswith("TP ") for o in outside.error_band.outside_calibration)
    text = "\n".join(text_lines(outside))
    assert f"worst {outside.error_band.speedup_worst:.0%} on 5 cases" in text
    assert "note: outside the calibration cases" in text and "concurrency 128 (the cases: 1 to 64)" in text


def test_the_docs_figures_for_the_bundled_pair_and_the_h100_ridge_are_what_the_tool_prints():
    from dflash_convert.predict.prediction import load_inputs, verify_compute_note

    perf, cli_doc = (ROOT / "docs" / "performance.md").read_text(), (ROOT / "docs" / "cli.md").read_text()
    inputs = load_inputs(PAIR / "target", PAIR / "draft", "t", "d")
    # validate's measured tau on examples/pair/prompts.txt, its context 28 in + 64 out: K 7 1021 tokens over 130 steps
    # (7.854), K 15 1023 over 72 (14.208)
    report = predict(inputs, [gpu("H100-SXM"), gpu("H200")], {7: 1021 / 130, 15: 1023 / 72}, concurrency=[1],
                     input_len=28, output_len=64)
    h100, h200 = (next(r for r in report.predictions if r.gpu == g and r.num_speculative_tokens == 15)
                  for g in ("H100-SXM", "H200"))
    assert f"{h100.speedup:.2f}" == f"{h200.speedup:.2f}"
    assert (f"K 15, {h100.speedup:.2f}x on either GPU at concurrency 1 ({h100.baseline_tokens_per_s} -> "
            f"{h100.speculative_tokens_per_s} tok/s on the H100 SXM") in perf.replace("\n", " ")
    seven = next(r for r in report.predictions if r.gpu == "H100-SXM" and r.num_speculative_tokens == 7)
    assert f"K 7 {seven.speedup:.2f}x\n({seven.baseline_tokens_per_s} -> {seven.speculative_tokens_per_s}:" in perf
    assert "--prompts\nexamples/pair/prompts.txt --predict-gpu H100-SXM,H200" in perf
    _, note = verify_compute_note(gpu("H100-SXM"), "vllm", 15, 64)
    ridge = note.split("past about ")[1].split(" tokens")[0]
    assert f"(about {ridge} tokens on an H100 SXM)" in cli_doc


def test_the_markdown_section_carries_the_speedup_error_and_what_lies_outside_the_cases():
    from dflash_convert.predict.prediction import markdown_lines

    report = predict(Inputs(target_facts(DENSE), SMALL_DRAFT, "t", "d"), [gpu("A800")], {7: 4.0}, concurrency=[128],
                     input_len=256, output_len=256, engine="vllm")
    text = "\n".join(markdown_lines(report))
    assert report.error_band.speedup_line in text
    assert "- note: outside the calibration cases, so the error band was not measured here: concurrency 128" in text
