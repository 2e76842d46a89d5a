"""--profile-out: the measured acceptance as NVIDIA Model-Optimizer's speculation_profile.json, its vectors
recomputed here from its own histogram; one profile per K and per context length."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dflash_convert.validate.options import ValidateOptions
from dflash_convert.validate.profile import profile

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"


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


def test_pair_profile_per_k_and_per_context_length(tmp_path, cli):
    out, prompts = tmp_path / "speculation_profile.json", tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PAIR.joinpath("prompts.txt").read_text().splitlines()[:4]) + "\n")
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--prompts", prompts,
            "--levels", "end_to_end", "--sampling", "greedy", "--max-new-tokens", "24", "--num-speculative-tokens",
            "7,3", "--context-lengths", "256", "--profile-out", out, "--json")
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
    assert ks == [(3, 40), (7, 256), (3, 256)]
    for p in [written, *written["profiles"]]:
        _assert_consistent(p)
    at_256 = a["per_context_length"][0]
    assert written["profiles"][1]["mean_accept_length"] == pytest.approx(at_256["acceptance_length"], abs=1e-4)
