"""The measured acceptance as a `speculation_profile.json`, in the schema NVIDIA Model-Optimizer proposes for
profiles that travel with a draft checkpoint (its pull requests #2247, #2313, #2315, #2316: specdec_bench and
ar_validate write it; deployment simulators read it instead of assuming an acceptance vector).

The profile is made from the verify steps' histogram of accepted drafts (what the report keeps per prompt and
per slice). Acceptance length = drafts accepted + 1 (the target's own token), so for a step-weighted
distribution P over lengths:

- `marginal_accept_rates[i]` = P(length >= i + 2): the share of steps whose first i + 1 drafts were all
  accepted (vLLM's synthetic_acceptance_rates);
- `conditional_accept_rates[i]` = P(length >= i + 2) / P(length >= i + 1): draft i + 1 accepted given the
  ones before it were (0 where no step got that far);
- `mean_accept_length` = the step-weighted mean length = 1 + the sum of the marginals, checked as the schema
  checks it (`validation`).

One profile per K run: the file is the first K's profile on the run's prompts, its `profiles` list holds the
others (each further K, each --context-lengths value), each with the conditions it was measured under; the
schema's `per_category` holds each prompt category's vectors at the first K."""

from __future__ import annotations

from typing import Any

SCHEMA_VERSION = "1.0"  # Model-Optimizer's speculation_profile schema version written
CONSISTENCY_TOLERANCE = 0.02  # |1 + sum(marginals) - mean| the schema's own check allows


def lengths(accepted_histogram: list[int]) -> dict[str, int]:
    """{acceptance length: steps} (JSON keys) of a steps-by-drafts-accepted histogram (entry a: exactly a)."""
    return {str(a + 1): n for a, n in enumerate(accepted_histogram) if n}


def vectors(histogram: dict[str, int], k: int) -> tuple[list[float], list[float], float | None]:
    """(conditional, marginal, mean acceptance length) of a {length: steps} histogram, over K positions."""
    counts = {int(length): n for length, n in histogram.items()}
    total = sum(counts.values())
    if not total:
        return [0.0] * k, [0.0] * k, None
    survival = [sum(n for length, n in counts.items() if length >= t) / total for t in range(1, k + 2)]
    marginal = survival[1:]
    conditional = [survival[i + 1] / survival[i] if survival[i] else 0.0 for i in range(k)]
    return conditional, marginal, sum(length * n for length, n in counts.items()) / total


def profile(accepted_histogram: list[int], k: int, *, method: str, conditions: dict[str, Any],
            draft: str | None = None, target: str | None = None, block_size: int | None = None,
            per_request: list[float] | None = None) -> dict[str, Any]:
    """One profile: K = `k` proposals per step, from the steps-by-drafts-accepted histogram."""
    histogram = lengths(accepted_histogram)
    conditional, marginal, mean = vectors(histogram, k)
    implied = 1.0 + sum(marginal)
    return {
        "schema_version": SCHEMA_VERSION,
        "measured": mean is not None,
        "method": method,
        "draft_checkpoint": draft,
        "target_model": target,
        "num_speculative_tokens": k,
        "block_size": block_size,
        "max_supported_k": k,
        "verification_method": "longest_prefix",
        "conditional_accept_rates": [round(x, 6) for x in conditional],
        "marginal_accept_rates": [round(x, 6) for x in marginal],
        "mean_accept_length": None if mean is None else round(mean, 6),
        "mean_accept_length_per_request": round(sum(per_request) / len(per_request), 6) if per_request else None,
        # a block-parallel draft re-plans its whole block at another K: each K is measured, not extrapolated
        "accept_length_model": "measured_per_k",
        "accept_length_by_k": {str(k): round(mean, 6)} if mean is not None else {},
        "acceptance_length_histogram": histogram,
        "per_category": None,
        "measurement_conditions": conditions,
        "validation": None if mean is None else {
            "mean_consistency": {"implied_mean_accept_length": round(implied, 6),
                                 "reported_mean_accept_length": round(mean, 6),
                                 "abs_delta": round(abs(implied - mean), 6), "tolerance": CONSISTENCY_TOLERANCE,
                                 "passed": abs(implied - mean) <= CONSISTENCY_TOLERANCE},
            "marginal_monotonicity": {"passed": all(b <= a + 1e-9 for a, b in zip(marginal, marginal[1:]))}},
    }


def _summed(histograms: list[list[int]]) -> list[int]:
    width = max(map(len, histograms), default=0)
    return [sum(h[a] for h in histograms if a < len(h)) for a in range(width)]


def run_profiles(per_k: list, *, method: str, draft: str | None, target: str | None, engine: str,
                 dataset: str, template_kwargs: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The run's speculation_profile (the first K's, on the run's prompts) with every other K's and every
    context length's in `profiles`; `per_k`: each K's AcceptanceStats. None without end-to-end figures.
    `template_kwargs`: the chat template's variables the prompts were rendered with (enable_thinking: the mode),
    recorded in each profile's conditions."""
    if not per_k:
        return None

    def conditions(a, **over) -> dict[str, Any]:
        lengths_ = [p.prompt_tokens for p in a.per_prompt]
        return {"dataset": dataset, "num_samples": a.prompts,
                "context_length": {"min": min(lengths_), "max": max(lengths_)} if lengths_ else None,
                "max_new_tokens": a.max_new_tokens, "temperature": a.temperature, "draft_sampling": a.draft_sampling,
                "engine": engine, "method": method,
                "counted": "each prompt's last block shortened to the tokens still to emit",
                **({"chat_template_kwargs": template_kwargs} if template_kwargs else {}), **over}

    def of(a, histogram: list[int], per_request: list[float] | None, **over) -> dict[str, Any]:
        k = len(a.per_position_rates)
        out = profile(histogram, k, method=method, conditions=conditions(a, **over), draft=draft, target=target,
                      block_size=a.block_size, per_request=per_request)
        return out

    first, *others = per_k
    main = of(first, _summed([p.accepted_histogram for p in first.per_prompt]),
              [p.acceptance_length for p in first.per_prompt])
    more = [of(a, _summed([p.accepted_histogram for p in a.per_prompt]), [p.acceptance_length for p in a.per_prompt])
            for a in others]
    for a in per_k:
        more += [of(a, s.accepted_histogram, None, dataset=a.context_source, num_samples=s.prompts,
                    context_length={"min": s.context_tokens, "max": s.context_tokens})
                 for s in a.per_context_length]
    by_k = {kk: v for p in [main, *more] if p["measurement_conditions"].get("dataset") == dataset
            for kk, v in p["accept_length_by_k"].items()}
    main["accept_length_by_k"] = dict(sorted(by_k.items(), key=lambda kv: int(kv[0])))
    if first.per_category:  # the schema's per_category: each category's vectors at the first K
        k = len(first.per_position_rates)
        main["per_category"] = {}
        for c in first.per_category:
            conditional, marginal, mean = vectors(lengths(c.accepted_histogram), k)
            main["per_category"][c.category] = {
                "num_samples": c.prompts, "mean_accept_length": None if mean is None else round(mean, 6),
                "conditional_accept_rates": [round(x, 6) for x in conditional],
                "marginal_accept_rates": [round(x, 6) for x in marginal],
                "acceptance_length_histogram": lengths(c.accepted_histogram)}
    main["profiles"] = more
    return main
