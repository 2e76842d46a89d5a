"""The calibration set beyond the band: the pay-off direction of every published case as the docs state it (the
measured ones and those whose source states only the direction or a K ranking), the rule that a direction holds over
a source's whole tau range, and a case served with tensor parallelism."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from dflash_convert.predict import calibration
from dflash_convert.predict.calibration import (CASES, DIRECTION_CASES, ENGINES, Case, DirectionCase, error_band,
                                                evaluate, evaluate_direction)

ROOT = Path(__file__).resolve().parents[2]
DOCS = (ROOT / "docs" / "performance.md").read_text()

# What docs/performance.md's table says of each direction-only case: right, or the model's documented miss.
STATED = {
    "Qwen3.5-35B-A3B on RTX PRO 6000, vLLM, K 4, concurrency 16": False,  # slower at tau 2, faster at tau 3
    "Qwen3.5-35B-A3B on RTX PRO 6000, vLLM, K 4, concurrency 1": False,  # predicted slower over tau 2-3
    "Qwen3.8-27B-FP8 on H20, vLLM, DFlash2 K 5 against K 7, 64k in": True,
}


def test_every_measured_case_has_its_pay_off_direction_right():
    for r in error_band().results:
        if r.direction_right is not None:
            assert r.direction_right, (r.case.name, r.predicted["speedup"], r.case.measured_speedup)
    assert sum(c.kind == "throughput" and not c.plain_only for c in CASES) == 12
    assert sum(c.plain_only for c in CASES) == 5  # the TP 8 cases: no speculative figure, no direction


def test_the_direction_only_cases_come_out_as_the_docs_state():
    band = error_band()
    assert {r.case.name: r.right for r in band.stated} == STATED
    assert (band.directions_right, band.directions) == (12 + 1, 12 + 3)
    assert band.line() in DOCS
    for case in DIRECTION_CASES:  # each one is in the docs' table with its source
        assert case.name in DOCS and case.source in DOCS, case.name
    # the miss at concurrency 16 is the tau range's: slower at its low end (right), faster at its high end, at every
    # output length of the range evaluated (256 to 2,048)
    busy = next(r for r in band.stated if "concurrency 16" in r.case.name)
    for n in busy.case.output_len:
        assert busy.predicted[f"speedup at tau 2 and {n} out"] < 1.0 < busy.predicted[f"speedup at tau 3 and {n} out"]


def test_the_ranking_at_64k_is_the_verify_s_kv_cache_and_compute():
    """recipes#839: on an H20 (296 fp8 TFLOP/s, 4 TB/s) at 64k context, K 5 beats K 7 at about the same tau: the
    verify of 10 x (K+1) tokens reads 10 64k caches (about the same bytes at either K), and attention over them (bf16
    caches, at the bf16 peak: 148 TFLOP/s) makes both verifies compute-bound, K 7's by a third more, so its two more
    slots cost more than they return."""
    from dflash_convert.predict.cost import target_pass
    from dflash_convert.predict.facts import target_facts
    from dflash_convert.predict.gpus import gpu

    h20 = next(c for c in DIRECTION_CASES if c.versus_k is not None)
    r = evaluate_direction(h20, ENGINES[h20.engine])
    assert r.right and r.predicted["ratio"] > 1.0

    def verify(k: int):
        return target_pass(target_facts(h20.target), batch=h20.concurrency, tokens_per_seq=k + 1,
                           context=h20.context, gpu=gpu(h20.gpu), constants=ENGINES[h20.engine], tp=1)

    five, seven = verify(h20.k), verify(h20.versus_k)
    assert max(seven.bytes_by_term, key=seven.bytes_by_term.get) == "KV cache"
    assert five.memory_s == pytest.approx(seven.memory_s, rel=0.05)  # + the linear state per verified slot
    assert seven.compute_s > five.compute_s > five.memory_s
    assert seven.compute_s / five.compute_s == pytest.approx(8 / 6, rel=0.01)


def test_a_direction_must_hold_over_the_whole_tau_range():
    dense = dataclasses.replace(DIRECTION_CASES[1], target=calibration.QWEN3_8B, draft=calibration.QWEN3_8B_DFLASH,
                                gpu="A800", engine="sglang", k=15, concurrency=1, output_len=(512, 512))
    wide = dataclasses.replace(dense, tau=(1.0, 6.0))  # slower at tau 1 (nothing accepted), faster at 6
    r = evaluate_direction(wide, ENGINES["sglang"])
    low, high = r.predicted.values()
    assert low < 1.0 < high and not r.right
    assert evaluate_direction(dataclasses.replace(dense, tau=(5.0, 6.0)), ENGINES["sglang"]).right
    assert not evaluate_direction(dataclasses.replace(dense, tau=(5.0, 6.0), faster=False), ENGINES["sglang"]).right
    # a ranking is judged on the winner's lowest tau against the loser's highest
    ranking = dataclasses.replace(dense, k=7, versus_k=15, tau=(4.0, 4.0), versus_tau=(4.0, 9.0))
    assert not evaluate_direction(ranking, ENGINES["sglang"]).right
    assert evaluate_direction(dataclasses.replace(ranking, versus_tau=(3.5, 3.5)), ENGINES["sglang"]).right


def test_a_case_served_with_tensor_parallelism_splits_the_bytes_and_pays_the_all_reduces():
    one = next(c for c in CASES if c.name.startswith("Qwen3-8B on A800"))
    four = dataclasses.replace(one, tp=4)
    r1, r4 = evaluate(one, ENGINES["sglang"]), evaluate(four, ENGINES["sglang"])
    # a quarter of the bytes each, plus 2 x 36 all-reduces of 8 us and up: faster, but not 4x (the fixed cost stays)
    assert r1.predicted["baseline_tokens_per_s"] < r4.predicted["baseline_tokens_per_s"] \
        < 4 * r1.predicted["baseline_tokens_per_s"]
    no_links = dataclasses.replace(four, gpu="L4")  # 32 GB/s PCIe against the A800's 200 GB/s NVLink
    assert evaluate(no_links, ENGINES["sglang"]).predicted["speculative_tokens_per_s"] \
        < r4.predicted["speculative_tokens_per_s"]


@pytest.mark.parametrize("case", [c for c in CASES if c.kind == "throughput"], ids=lambda c: c.name)
def test_every_measured_case_cites_its_source_and_figures_in_the_docs(case: Case):
    assert case.source in DOCS
    figures = (f"{case.baseline_tokens_per_s:g} tok/s plain" if case.plain_only else
               f"{case.baseline_tokens_per_s:g} -> {case.speculative_tokens_per_s:g} tok/s")
    assert figures in DOCS, case.name


def test_direction_cases_are_not_in_the_error_median():
    with_them, without = error_band(), error_band(direction_cases=())
    assert (with_them.median, with_them.worst) == (without.median, without.worst)
    assert isinstance(DIRECTION_CASES[0], DirectionCase)


def test_the_speculative_fixed_cost_is_the_median_of_each_case_s_own_difference():
    """Worked by hand, residuals in ms (plain, speculative), no step admitting a request: (1, 2), (3, 10), (5, 7). The
    fixed cost is the median plain residual, 3; the speculative cost the median of each case's own difference (1, 7,
    2), 2 ms. Medians taken separately would give 7 - 3 = 4 ms: the second case's speculative residual set against
    the first's plain one. (With admissions the medians become least-absolute lines: test_admissions.py.)"""
    from dflash_convert.predict.calibration import fixed_costs_from_residuals

    fixed, extra, *admissions = fixed_costs_from_residuals([(1e-3, 2e-3, 0, 0), (3e-3, 10e-3, 0, 0),
                                                            (5e-3, 7e-3, 0, 0)])
    assert (fixed, extra, admissions) == (pytest.approx(3e-3), pytest.approx(2e-3), [0.0, 0.0])
    # an even count: the mean of the two middle ones, as a median
    assert fixed_costs_from_residuals([(1e-3, 1e-3, 0, 0), (3e-3, 3e-3, 0, 0)])[0] == pytest.approx(2e-3)
    # a case that runs faster than the model leaves a negative residual; the costs never go below zero
    assert fixed_costs_from_residuals([(-1e-3, -4e-3, 0, 0)]) == (0.0, 0.0, 0.0, 0.0)
    assert fixed_costs_from_residuals([]) == (0.0, 0.0, 0.0, 0.0)
    # one case: the pair fits it exactly (fixed + extra = its speculative residual when its plain one is not negative)
    assert sum(fixed_costs_from_residuals([(2e-3, 9e-3, 0, 0)])) == pytest.approx(9e-3)


def test_the_speedup_error_is_per_engine_and_pooled_where_an_engine_has_too_few_cases():
    """The speedup is what a user acts on: its error is each engine's own cases' (SGLang's seven, vLLM's five since the
    B200 runs), vLLM's 1.22x-measured, 2.92x-predicted vllm#49730 case its worst; an engine with fewer than
    MIN_OWN_CASES takes the serving engines' cases pooled."""
    band = error_band()
    sglang, vllm = band.speedup("sglang"), band.speedup("vllm")
    own = [r.errors["speedup"] for r in band.results if r.case.engine == "sglang" and "speedup" in r.errors]
    assert (sglang.pooled, sglang.cases, sglang.worst) == (False, 7, max(own))
    h100 = next(r for r in band.results if r.case.engine == "vllm" and "49730" in r.case.source)
    assert (vllm.pooled, vllm.cases) == (False, 5)
    assert vllm.worst == h100.errors["speedup"] > 1.0  # 2.92x predicted against 1.22x measured
    assert vllm.worst > band.worst  # the band (tokens/s only) hides it
    for line in (sglang.line(), vllm.line()):
        assert line in DOCS, line
    # with one case of its own (the calibration set before the B200 runs) vLLM's error is the serving engines' pooled
    before = tuple(c for c in CASES if c.engine != "vllm" or "49730" in c.source)
    pooled = error_band(before).speedup("vllm")
    assert pooled.pooled and pooled.cases == sum(c.engine != "runtime" and not c.plain_only for c in before)
    assert "pooled (vllm has fewer than 2 of its own)" in pooled.line()


def test_what_the_cases_cover_is_read_from_the_cases():
    from dflash_convert.predict.facts import target_facts

    cov = calibration.coverage()
    assert cov.tp == (1, 8) and cov.concurrency == (1, 64)  # the DeepSeek-R1 cases at TP 8, up to concurrency 64
    assert cov.kinds["attention"] == {"full attention", "linear-attention hybrid", "MLA attention"}
    assert cov.kinds["MLP"] == {"dense", "MoE"} and cov.kinds["weights"] == {"16-bit weights", "8-bit weights"}
    assert "compute" not in cov.bounds
    dense = target_facts(calibration.QWEN3_8B)
    assert cov.outside(dense, tp=1, concurrency=[1, 8], bounds={"weights"}) == []
    mla = target_facts({**calibration.QWEN3_8B, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
                        "quantization_config": {"quant_method": "awq", "bits": 4}})
    out = cov.outside(mla, tp=16, concurrency=[1, 128], bounds={"compute", "weights", "does not fit: ..."})
    assert out == ["sub-8-bit weights (the cases: 16-bit weights, 8-bit weights)", "TP 16 (the cases: TP 1 to 8)",
                   "concurrency 128 (the cases: 1 to 64)",
                   "steps bound by compute (the cases' steps: admissions, all-reduce, experts, fixed cost, weights)",
                   # a dense 4-bit target: not the kind of the one target the TP cases ran
                   "the all-reduce cost at TP 16: its fitted extra rests on the runs of DeepSeek-R1 (MLA attention, MoE, "
                   "8-bit weights; sglang, vllm) only"]
    # a case run at TP 16 covers TP 16: nothing is a hand list
    wider = calibration.coverage(CASES + (dataclasses.replace(CASES[0], tp=16, concurrency=128),))
    assert wider.outside(dense, tp=16, concurrency=[128], bounds=set()) == []


def test_the_b200_runs_are_the_report_s_table_and_give_vllm_a_speculative_step_of_about_2_5_plain_steps():
    """The B200 report's points are cases with the figures the docs' table reads from its files, and the step ratio
    the docs derive from them (seconds per step = concurrency x tau / tokens/s) is the cases' own: at concurrency 1
    vLLM's K 15 step is 2.61 plain steps, so vLLM DFlash on that target is slower than plain below tau ~2.6, and the
    model fitted with these runs calls vllm#42505's concurrency-1 row slower at tau 2."""
    b200 = [c for c in CASES if c.source == calibration.B200_REPORT]
    assert len(b200) == len(calibration.B200_RUNS) == 8
    assert {c.engine for c in b200} == {"vllm", "sglang"} and all(c.gpu == "B200" for c in b200)
    for c in b200:
        assert f"| {c.baseline_tokens_per_s:.1f} (" in DOCS, c.name
        assert f"| {c.speculative_tokens_per_s:.1f}, {c.tau:.3f} (" in DOCS, c.name
        assert c.context == 60 + 128 and c.target["quantization_config"]["quant_method"] == "fp8"
    one = next(c for c in b200 if c.engine == "vllm" and c.concurrency == 1)
    ratio = (one.tau / one.speculative_tokens_per_s) / (1 / one.baseline_tokens_per_s)
    assert f"{ratio:.2f} plain steps at K 15, concurrency 1" in DOCS and 2.5 < ratio < 2.7
    assert 1 < ratio < 2.0 * 1.5  # slower than plain at tau 2 for any model that reproduces this step
    row = next(r for r in error_band().stated if "concurrency 1" in r.case.name)
    assert not row.right
    for n in row.case.output_len:
        assert row.predicted[f"speedup at tau 2 and {n} out"] < 1.0 < row.predicted[f"speedup at tau 3 and {n} out"]
