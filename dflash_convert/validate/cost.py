"""Which K to serve: the expected speedup of each num_speculative_tokens from its acceptance and step costs.

One draft+verify step commits tau_K tokens on average and costs t_draft(K) + t_verify(K); the target alone
commits one token per step of t_target. So the expected speedup of K is

    tau_K * t_target / (t_draft(K) + t_verify(K))

at one concurrency (batch size); costs measured at another batch give that batch's figure (a verify step
of K+1 slots per sequence grows with the batch where a target-only step of one slot barely does, which is
why a large K that wins for one stream can lose at 128). Step times are those of the device they were
measured on: CPU figures do not transfer to a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median


@dataclass(frozen=True)
class StepTimes:
    """Seconds per step at one concurrency: a draft step and a verify step at some K, a target-only step."""

    draft_s: float
    verify_s: float
    target_s: float


def expected_speedup(tau: float, times: StepTimes) -> float:
    """tau * t_target / (t_draft + t_verify); 0 where the speculative step took no measurable time."""
    step = times.draft_s + times.verify_s
    return tau * times.target_s / step if step > 0 else 0.0


@dataclass(frozen=True)
class Estimate:
    """The expected speedup of one K at one concurrency: the median over timing rounds and their range."""

    num_speculative_tokens: int
    speedup: float
    low: float
    high: float


@dataclass(frozen=True)
class Recommendation:
    """The K with the best expected speedup at one concurrency, with its spread over the timing rounds and the
    runner-up; `clear` is false where the two ranges overlap (the rounds cannot tell them apart)."""

    concurrency: int
    best: Estimate
    runner_up: Estimate | None

    @property
    def clear(self) -> bool:
        return self.runner_up is None or self.best.low > self.runner_up.high


def estimates(taus: dict[int, float], rounds: dict[int, list[StepTimes]]) -> list[Estimate]:
    """One Estimate per K that has both a tau and at least one timed round, in K order."""
    out = []
    for k in sorted(taus.keys() & rounds.keys()):
        per_round = [expected_speedup(taus[k], t) for t in rounds[k]]
        if per_round:
            out.append(Estimate(k, median(per_round), min(per_round), max(per_round)))
    return out


def recommend(taus: dict[int, float], costs: dict[int, dict[int, list[StepTimes]]]) -> list[Recommendation]:
    """Per concurrency (costs: concurrency -> K -> per-round step times), the K with the best expected speedup."""
    out = []
    for concurrency in sorted(costs):
        ranked = sorted(estimates(taus, costs[concurrency]), key=lambda e: (-e.speedup, e.num_speculative_tokens))
        if ranked:
            out.append(Recommendation(concurrency, ranked[0], ranked[1] if len(ranked) > 1 else None))
    return out
