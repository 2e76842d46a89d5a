"""Per-request acceptance, as vLLM's --per-request-spec-decode-metrics summary reports it: for each request
the histogram of its verify steps by the number of drafts they accepted (0 .. block - 1); and over the
requests, how many reached each acceptance length (tau) band."""

from __future__ import annotations


def step_histogram(rates: list[float], num_drafts: int) -> list[int]:
    """Steps that accepted exactly a drafts, a = 0 .. len(rates): from the per-position rates (rates[k] =
    share of steps that accepted more than k drafts, so exactly a: rates[a - 1] - rates[a])."""
    at_least = [1.0, *rates, 0.0]
    return [round(num_drafts * (at_least[a] - at_least[a + 1])) for a in range(len(rates) + 1)]


def request_histogram(taus: list[float], block: int) -> list[int]:
    """Requests per tau band [1, 2), [2, 3), ..., [block - 1, block] (tau = block falls in the last)."""
    bands = [0] * max(block - 1, 1)
    for tau in taus:
        bands[min(max(int(tau) - 1, 0), len(bands) - 1)] += 1
    return bands
