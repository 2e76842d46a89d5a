"""Which K to serve: --num-speculative-tokens runs (one end-to-end run per K on the bundled pair) and the cost
model that turns tau and step times into an expected speedup and a recommendation per concurrency."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_convert.errors import UsageError
from dflash_convert.validate.cost import StepTimes, expected_speedup, recommend
from dflash_convert.validate.options import ValidateOptions

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"
KS = [3, 7, 15]


def _opts(**over) -> ValidateOptions:
    prompts = [[int(t) for t in line.split()] for line in PAIR.joinpath("prompts.txt").read_text().splitlines()[:4]]
    return ValidateOptions(target=PAIR / "target", prompts=prompts, levels=["end_to_end"], max_new_tokens=32,
                           sampling="greedy", timing_rounds=1, **over)


@pytest.fixture(scope="module")
def sweep():
    from dflash_convert.validate.run import validate

    return validate(PAIR / "draft", _opts(num_speculative_tokens=KS))


def test_tau_per_k_rises_and_equals_the_single_k_runs(sweep):
    """On the bundled pair tau is non-decreasing in K, each K's run is the run that K alone gives, and each
    K runs a block of K+1 with K per-position rates (and K synthetic rates)."""
    from dflash_convert.validate.run import validate

    rows = sweep.per_num_speculative_tokens
    assert [r.num_speculative_tokens for r in rows] == KS and [r.block_size for r in rows] == [k + 1 for k in KS]
    taus = [r.acceptance_length for r in rows]
    assert taus == sorted(taus) and taus[0] < taus[-1]
    assert all(len(r.per_position_rates) == r.num_speculative_tokens == r.synthetic.num_speculative_tokens
               for r in rows)
    assert sweep.acceptance.acceptance_length == taus[0] and sweep.passed
    for k, row in zip(KS, rows):
        single = validate(PAIR / "draft", _opts(num_speculative_tokens=[k])).acceptance
        assert (single.acceptance_length, single.per_position_rates) == (row.acceptance_length, row.per_position_rates)
        assert single.outputs_equal == row.outputs_equal == 4
    rec = sweep.recommendation
    assert [r.concurrency for r in rec] == [1] and rec[0].num_speculative_tokens in KS
    assert rec[0].device.startswith("cpu")


def test_block_size_is_the_dflash_block_and_excludes_k():
    with pytest.raises(UsageError, match="not both"):
        _opts(num_speculative_tokens=[3], block_size=4).check()
    with pytest.raises(UsageError, match="distinct"):
        _opts(num_speculative_tokens=[3, 3]).check()
    assert _opts(num_speculative_tokens=[3, 7]).blocks(anchor_predicts=False) == [4, 8]
    assert _opts(num_speculative_tokens=[3, 7]).blocks(anchor_predicts=True) == [3, 7]  # DSpark, sample_from_anchor
    assert _opts(block_size=5).blocks(anchor_predicts=False) == [5]
    assert "not vLLM's KV-cache" in ValidateOptions.model_fields["block_size"].description


def test_expected_speedup_on_fixed_timings():
    assert expected_speedup(4.0, StepTimes(draft_s=0.005, verify_s=0.015, target_s=0.010)) == pytest.approx(2.0)
    assert expected_speedup(4.0, StepTimes(0.0, 0.0, 0.010)) == 0.0


def test_recommendation_follows_the_verify_cost_with_the_batch():
    """One stream: verify costs the same at every K (memory-bound), the longest K wins. 64 streams: verify grows
    with the K+1 slots of every sequence (compute-bound), the shortest K wins, though tau is flat per K."""
    taus = {3: 3.2, 7: 5.0, 15: 6.5}
    one = {k: [StepTimes(0.002, 0.011, 0.010)] for k in taus}
    many = {k: [StepTimes(0.002, 0.012 * (k + 1) / 4, 0.012)] for k in taus}
    by_batch = {r.concurrency: r for r in recommend(taus, {1: one, 64: many})}
    assert by_batch[1].best.num_speculative_tokens == 15 and by_batch[1].best.speedup == pytest.approx(5.0)
    assert by_batch[64].best.num_speculative_tokens == 3 and by_batch[64].runner_up.num_speculative_tokens == 7
    assert by_batch[64].best.speedup == pytest.approx(3.2 * 0.012 / 0.014)


def test_spread_over_rounds_decides_whether_the_winner_is_clear():
    taus = {3: 3.0, 7: 3.1}
    rounds = {3: [StepTimes(0.001, 0.010, 0.010), StepTimes(0.001, 0.012, 0.010)],
              7: [StepTimes(0.001, 0.010, 0.010), StepTimes(0.001, 0.012, 0.010)]}
    (rec,) = recommend(taus, {1: rounds})
    assert rec.best.num_speculative_tokens == 7 and not rec.clear
    assert rec.best.low < rec.best.speedup < rec.best.high
    (rec,) = recommend({3: 3.0, 7: 6.0}, {1: rounds})
    assert rec.best.num_speculative_tokens == 7 and rec.clear


def test_markdown_and_model_card_carry_the_k_table_and_the_recommended_launch(sweep):
    from dflash_convert.hub.card import model_card
    from dflash_convert.io.checkpoint import open_checkpoint
    from dflash_convert.validate.report_markdown import to_markdown

    sweep = sweep.model_copy(deep=True)
    sweep.recommendation[0].speculate = True  # a K that pays off here (whether one does on this machine varies)
    k = sweep.recommendation[0].num_speculative_tokens
    markdown = to_markdown(sweep)
    assert "| num_speculative_tokens | block | tau |" in markdown and f"**num_speculative_tokens {k}**" in markdown
    assert "K=15" in markdown and "do not transfer to another device" in markdown
    card = model_card(open_checkpoint(PAIR / "draft").spec, repo_id="org/d",
                      validation=sweep.summary().model_dump(mode="json"))
    section = card.split("### Which K to serve", 1)[1]  # the trained block's commands come before it
    assert f'"num_speculative_tokens": {k}}}' in section and sweep.recommendation[0].device in section
    assert f"SGLang: `--speculative-num-draft-tokens {k + 1}` (the block" in section


def _k_stats(k: int, tau: float, draft_s: float):
    """One K's run as the sweep reads it: tau, K rates and one timing round at batch 1."""
    from dflash_convert.validate.report import AcceptanceStats

    return AcceptanceStats.model_construct(per_position_rates=[1.0] * k, acceptance_length=tau, block_size=k + 1,
                                           round_step_times=[[draft_s, 0.010, 0.010]])


def test_recommendation_per_concurrency_comes_from_the_batched_costs():
    """At batch 1 the loop's costs make K=15 best; at batch 8 the timed verify of 16 tokens per sequence costs
    four times that of 4, and the draft's step is 8 single-sequence steps, so K=3 wins there."""
    from dflash_convert.validate.batch_costs import BatchTimes
    from dflash_convert.validate.sweep import batched, concurrency_costs, recommendations

    runs = [_k_stats(3, 3.0, 0.001), _k_stats(15, 6.0, 0.001)]
    eight = BatchTimes(8, verify_s={4: [0.020, 0.022], 16: [0.080, 0.088]}, target_s=[0.018, 0.018])
    assert batched(runs[1], eight) == [StepTimes(0.008, 0.080, 0.018), StepTimes(0.008, 0.088, 0.018)]
    by = {r.concurrency: r for r in recommendations(runs, "cpu (test)", [eight])}
    assert sorted(by) == [1, 8]
    assert by[1].num_speculative_tokens == 15 and by[8].num_speculative_tokens == 3
    per_round = [expected_speedup(3.0, StepTimes(0.008, v, 0.018)) for v in (0.020, 0.022)]
    assert by[8].expected_speedup == pytest.approx(sum(per_round) / 2, abs=1e-4)  # the median of two rounds
    (cost,) = concurrency_costs(runs[0], [eight])
    assert (cost.concurrency, cost.draft_step_s, cost.verify_step_s) == (8, 0.008, pytest.approx(0.021))


def test_concurrency_is_a_list_and_one_value_with_endpoint():
    assert ValidateOptions(concurrency=4).concurrency == [4] and ValidateOptions().concurrency == [1]
    with pytest.raises(UsageError, match="one value"):
        ValidateOptions(endpoint="http://localhost:1", concurrency=[1, 4]).check()
    with pytest.raises(UsageError, match="distinct"):
        ValidateOptions(concurrency=[4, 4]).check()
    with pytest.raises(UsageError, match=r"in \[1, 1000000\], got 99999999999999"):  # it batched that many
        ValidateOptions(concurrency=[99999999999999])
    assert ValidateOptions(endpoint="http://localhost:1", concurrency=[4]).endpoint_concurrency == 4


def test_batched_steps_are_timed_per_block_and_round(tiny_target):
    """The target's batched forward: one time per round for each K+1 and for the target-only step, the cache
    cropped back to the context after each (a later step would otherwise follow a longer one)."""
    import torch

    from dflash_convert.validate import batch_costs
    from dflash_runtime import load_target

    target = load_target(tiny_target, device="cpu", dtype=torch.float32)
    assert batch_costs.cannot_batch(target) is None
    crops = []
    real_step = batch_costs._step

    def step(target, cache, context, batch, n):
        took = real_step(target, cache, context, batch, n)
        crops.append(cache.get_seq_length())
        return took

    batch_costs._step = step
    try:
        (times,) = batch_costs.time_batches(target, [5, 6, 7], [3], [4, 16], rounds=2)
    finally:
        batch_costs._step = real_step
    assert times.batch == 3 and sorted(times.verify_s) == [4, 16]
    assert all(len(v) == 2 for v in times.verify_s.values()) and len(times.target_s) == 2
    assert set(crops) == {batch_costs.CONTEXT_TOKENS}


def test_cli_concurrency_gives_a_recommendation_per_concurrency(cli, tmp_path):
    """--concurrency 1,4: the K recommended at each, batch 4's from the target's steps timed at batch 4."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PAIR.joinpath("prompts.txt").read_text().splitlines()[:4]) + "\n")
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--prompts", prompts,
            "--levels", "end_to_end", "--max-new-tokens", "16", "--sampling", "greedy",
            "--num-speculative-tokens", "3,7", "--concurrency", "1,4", "--json")
    assert r.code == 0, r.err[-2000:]
    report = r.json()
    assert [rec["concurrency"] for rec in report["recommendation"]] == [1, 4]
    for row in report["per_num_speculative_tokens"]:
        (at,) = row["per_concurrency"]
        assert at["concurrency"] == 4 and at["verify_step_s"] > 0 and at["draft_step_s"] == 4 * row["draft_step_s"]
    assert "concurrency 4 (target steps timed at batch 4" in r.err
    assert next(c for c in report["checks"] if c["name"] == "batch_costs")["status"] == "pass"
    from dflash_convert.hub.card import model_card
    from dflash_convert.io.checkpoint import open_checkpoint

    card = model_card(open_checkpoint(PAIR / "draft").spec, repo_id="org/d", validation=report)
    at4 = card.split("at concurrency 4", 1)[1].split("```text", 1)[1].split("```", 1)[0]
    assert [f"{row['per_concurrency'][0]['expected_speedup']:.2f}x" in at4
            for row in report["per_num_speculative_tokens"]] == [True, True]


def test_no_k_reaching_1x_is_advised_as_no_speculation_everywhere(sweep):
    """Where the best K's expected speedup is below 1.0x on the measured device, the recommendation says no
    speculation (JSON `speculate: false`), in the terminal, the verdict line, the Markdown and the model card
    (no launch line at a K that slows serving); the verdict (the draft's correctness) is unchanged."""
    from dflash_convert.hub.card import model_card
    from dflash_convert.io.checkpoint import open_checkpoint
    from dflash_convert.validate.report import verdict_text
    from dflash_convert.validate.report_markdown import acceptance_svg, to_markdown
    from dflash_convert.validate.report_terminal import per_k_lines
    from dflash_convert.validate.sweep import recommendations

    (slow,) = recommendations([_k_stats(3, 1.1, 0.02), _k_stats(7, 1.1, 0.03)], "cpu (test)")
    assert slow.expected_speedup < 1.0 and slow.speculate is False
    (fast,) = recommendations([_k_stats(3, 3.0, 0.001), _k_stats(7, 4.0, 0.001)], "cpu (test)")
    assert fast.speculate is True
    report = sweep.model_copy(deep=True)
    report.recommendation[0].speculate = False
    k = report.recommendation[0].num_speculative_tokens
    assert report.passed and report.model_dump(mode="json")["recommendation"][0]["speculate"] is False
    advice = f"no speculation (no K reaches 1.0x on the measured device; the best is K={k})"
    assert any(line.startswith(f"recommended at concurrency 1: {advice}") for line in per_k_lines(report))
    line = verdict_text(report)
    assert "no speculation recommended (no K reaches 1.0x on the measured machine); best K=" in line, line
    assert ", recommended K=" not in line
    assert f"**{advice}**" in to_markdown(report) and "PASSED: no speculation" in acceptance_svg(report)
    assert "(recommended)" not in acceptance_svg(report)  # the legend marks no K under a "no speculation" title
    card = model_card(open_checkpoint(PAIR / "draft").spec, repo_id="org/d",
                      validation=report.summary().model_dump(mode="json"))
    section = card.split("### Which K to serve", 1)[1]
    assert "Recommended at concurrency 1: no speculation: no K reaches 1.0x on" in section
    assert '"num_speculative_tokens":' not in section
    # an expected speedup just below 1.0x is not printed as "1.00x" beside that advice (terminal, Markdown, card)
    report.recommendation[0].expected_speedup = 0.9962
    shown = "\n".join([*per_k_lines(report), to_markdown(report), model_card(
        open_checkpoint(PAIR / "draft").spec, repo_id="org/d", validation=report.summary().model_dump(mode="json"))])
    assert shown.count("0.996x") >= 3 and "(1.00x" not in shown and "expected 1.00x" not in shown
    assert f"the best, K={k}, 0.996x" in shown


def test_a_sweeps_headline_and_chart_show_the_recommended_k_and_every_k(sweep):
    """The verdict line headlines the recommended K (not the first run), then every other K; the SVG is one chart
    with a series per K, the recommended one marked. The recommendation is set to the middle K here, so that it is
    neither the first K nor the last."""
    import xml.etree.ElementTree as ET

    from dflash_convert.validate.report import verdict_text
    from dflash_convert.validate.report_markdown import acceptance_svg

    report = sweep.model_copy(deep=True)
    report.recommendation[0].num_speculative_tokens = 7
    report.recommendation[0].speculate = True
    rows = {r.num_speculative_tokens: r for r in report.per_num_speculative_tokens}
    line = verdict_text(report)
    best = rows[7]
    assert (f", recommended K=7: tau {best.acceptance_length:.2f}, speedup {best.measured_speedup:.2f}x (K=3: tau "
            f"{rows[3].acceptance_length:.2f}, {rows[3].measured_speedup:.2f}x; K=15: tau "
            f"{rows[15].acceptance_length:.2f}, {rows[15].measured_speedup:.2f}x)") in line, line
    svg = ET.fromstring(acceptance_svg(report))
    ns = "{http://www.w3.org/2000/svg}"
    bars = [r.find(f"{ns}title").text for r in svg.iter(f"{ns}rect") if r.find(f"{ns}title") is not None]
    for k in KS:  # each K's series: one bar per position of its block
        assert sum(t.startswith(f"K={k}: tau ") for t in bars) == k, bars
    texts = [t.text for t in svg.iter(f"{ns}text")]
    assert f"K=7: tau {best.acceptance_length:.2f} (recommended)" in texts
    assert texts[0].startswith("PASSED: recommended K=7, tau ")
