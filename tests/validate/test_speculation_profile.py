"""--profile-out: the measured acceptance as NVIDIA Model-Optimizer's speculation_profile.json, its vectors
recomputed here from its own histogram; one profile per K and per context length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_convert.validate.options import ValidateOptions
from dflash_convert.validate.profile import profile

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"

pytestmark = pytest.mark.usefixtures("one_timing_round")  # no test here reads the speedup


def _recomputed(histogram: dict[str, int], k: int) -> tuple[list[float], list[float], float]:
    """From the steps themselves: every step's length listed, each share counted directly."""
    steps = [int(length) for length, n in histogram.items() for _ in range(n)]
    at_least = [sum(s >= t for s in steps) / len(steps) for t in range(1, k + 2)]
    marginal = at_least[1:]
    conditional = [at_least[i + 1] / at_least[i] if at_least[i] else 0.0 for i in range(k)]
    return conditional, marginal, sum(steps) / len(steps)


def _assert_consistent(p: dict) -> None:
    k = p["num_speculative_tokens"]
    conditional, marginal, mean = _recomputed(p["acceptance_length_histogram"], k)
    assert p["conditional_accept_rates"] == pytest.approx(conditional, abs=1e-6)
    assert p["marginal_accept_rates"] == pytest.approx(marginal, abs=1e-6)
    assert p["mean_accept_length"] == pytest.approx(mean, abs=1e-6)
    assert p["validation"]["mean_consistency"]["passed"] and p["validation"]["marginal_monotonicity"]["passed"]
    assert len(p["conditional_accept_rates"]) == len(p["marginal_accept_rates"]) == k


def test_vectors_follow_the_histogram_with_gaps_and_a_dead_tail():
    # steps by drafts accepted: 5 accepted none, 0 one, 3 two, 2 all four (lengths 1, 3, 5)
    p = profile([5, 0, 3, 0, 2], 4, method="dflash", conditions={"dataset": "x"})
    assert p["acceptance_length_histogram"] == {"1": 5, "3": 3, "5": 2}
    assert p["marginal_accept_rates"] == [0.5, 0.5, 0.2, 0.2]
    assert p["conditional_accept_rates"] == [0.5, 1.0, 0.4, 1.0]
    assert p["mean_accept_length"] == 2.4 and p["measured"] and p["accept_length_model"] == "measured_per_k"
    _assert_consistent(p)
    dead = profile([4, 0, 0], 2, method="dflash", conditions={})
    assert dead["conditional_accept_rates"] == [0.0, 0.0] and dead["mean_accept_length"] == 1.0


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory):
    """The bundled pair at K 7 and 3 with --context-lengths 128,256 (one run, shared)."""
    from conftest import run_cli

    tmp_path = tmp_path_factory.mktemp("sweep")
    out, prompts = tmp_path / "speculation_profile.json", tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PAIR.joinpath("prompts.txt").read_text().splitlines()[:4]) + "\n")
    r = run_cli("validate", PAIR / "draft", "--target", PAIR / "target", "--prompts", prompts,
                "--levels", "end_to_end", "--sampling", "greedy", "--max-new-tokens", "24",
                "--num-speculative-tokens", "7,3", "--context-lengths", "128,256", "--profile-out", out, "--json")
    return r, out, prompts


def test_pair_profile_per_k_and_per_context_length(sweep_run):
    r, out, prompts = sweep_run
    assert r.code == 0, r.err
    report, written = r.json(), json.loads(out.read_text())
    assert written == report["speculation_profile"]
    a = report["acceptance"]
    assert written["num_speculative_tokens"] == 7 and written["mean_accept_length"] == pytest.approx(
        a["acceptance_length"], abs=1e-4)
    assert sum(written["acceptance_length_histogram"].values()) == a["num_drafts"]
    assert written["marginal_accept_rates"] == pytest.approx(a["per_position_rates"], abs=1e-4)
    c = written["measurement_conditions"]
    assert (c["dataset"], c["max_new_tokens"], c["temperature"], c["method"]) == (
        str(prompts), 24, 0.0, "dflash")
    assert "dflash_runtime" in c["engine"] and set(written["accept_length_by_k"]) == {"3", "7"}
    ks = [(p["num_speculative_tokens"], p["measurement_conditions"]["context_length"]["max"])
          for p in written["profiles"]]
    assert ks == [(3, 40), (7, 128), (7, 256), (3, 128), (3, 256)]
    for p in [written, *written["profiles"]]:
        _assert_consistent(p)
    at_256 = a["per_context_length"][1]
    assert written["profiles"][2]["mean_accept_length"] == pytest.approx(at_256["acceptance_length"], abs=1e-4)


def test_a_k_sweep_shows_the_context_curve_of_every_k(sweep_run):
    """Each K's own tau per context length and where it falls below half, in the JSON, the terminal, the Markdown
    and the SVG (one series per K), not only the first K's."""
    from dflash_convert.validate.breakdown import context_svg
    from dflash_convert.validate.report import ValidationReport
    from dflash_convert.validate.report_markdown import to_markdown

    r, out, _ = sweep_run
    report = ValidationReport.model_validate(r.json())
    rows = report.per_num_speculative_tokens
    assert [x.num_speculative_tokens for x in rows] == [7, 3]
    profiles = json.loads(out.read_text())["profiles"][1:]  # K=7 at 128, 256, then K=3 at 128, 256
    for k, row in enumerate(rows):
        assert [s.context_tokens for s in row.per_context_length] == [128, 256]
        assert [s.acceptance_length for s in row.per_context_length] == pytest.approx(
            [p["mean_accept_length"] for p in profiles[2 * k:2 * k + 2]], abs=1e-4)
        assert max(s.acceptance_length for s in row.per_context_length) <= row.num_speculative_tokens + 1
    assert rows[0].per_context_length == report.acceptance.per_context_length
    taus = [f"{row.per_context_length[1].acceptance_length:.2f}" for row in rows]
    assert "tau against context length per K" in r.err
    assert f"256 tokens {taus[0]:>7} {taus[1]:>7}" in r.err, r.err
    half = [f"K={x.num_speculative_tokens} at " + (f"{x.context_half_tau_length} tokens"
                                                   if x.context_half_tau_length else "none of the lengths") for x in rows]
    assert "tau falls below half its short-context value: " + "; ".join(half) in r.err
    md = to_markdown(report, curve="r-context-length.svg")
    assert f"| 256 tokens | {taus[0]} | {taus[1]} |" in md
    svg = context_svg(report)
    assert "K=7 (short" in svg and "K=3 (short" in svg and f"K=3 (short {rows[1].acceptance_length:.2f}), 256 tokens: " in svg


def test_the_model_card_shows_the_run_s_context_curve(sweep_run):
    """push --validation-report: the card carries tau against context length as the run measured it."""
    from dflash_convert.hub.card import model_card
    from dflash_convert.io.checkpoint import open_checkpoint

    r, _, _ = sweep_run
    report = r.json()
    card = model_card(open_checkpoint(PAIR / "draft").spec, repo_id="org/d", validation=report)
    rows = report["acceptance"]["per_context_length"]
    assert len(rows) == 2 and "Acceptance against context length" in card
    for x in rows:
        assert f"| {x['label']} | {x['acceptance_length']:.2f} | {x['num_drafts']} | " in card
