"""The endpoint level of `validate --endpoint URL [--baseline-endpoint URL]`: the measurement of a live server
(endpoint_run.py) turned into checks and the report's `endpoint` section.

Checks (level end_to_end: they judge decoding):
- endpoint_acceptance: what was counted, and how (informational: passes once something was measured);
- endpoint_acceptance_length / endpoint_position_rates: --min-acceptance-length / --min-position-rates;
- endpoint_acceptance_agrees (CKPT with a --target that has weights): the deployment's figures against the
  runtime's emulation of the engine, counted as vLLM counts, with the tolerance of the in-process engine check;
- endpoint_outputs_equal (--baseline-endpoint, greedy): each prompt's output from both servers, equal or parting
  first at a near-tie judged from the baseline server's top candidates (as the in-process engine check judges);
- endpoint_speedup (--baseline-endpoint with --min-speedup): tokens/s over interleaved rounds.
"""

from __future__ import annotations

from typing import Callable

from dflash_convert.validate.checks import Check, make_check
from dflash_convert.validate.endpoint import Deadline, Endpoint, served_model
from dflash_convert.validate.endpoint_run import (as_counts, bodies, latency_figures, measured, per_request, per_set,
                                                  prompts_sha256, read_counters, sampling_report, sampling_sent,
                                                  send_all)
from dflash_convert.validate.options import Prompt, ValidateOptions
from dflash_convert.validate.report import AcceptanceCounts, EndpointStats

LEVEL = "end_to_end"


def endpoint_level(opts: ValidateOptions, prompts: list[tuple[str | None, Prompt]], *, say: Callable[[str], None],
                   offline: AcceptanceCounts | None = None) -> tuple[list[Check], EndpointStats]:
    """Measure the endpoint on `prompts` ((set name or None, prompt) each); raises EndpointError (exit 1) when
    nothing could be measured as this run's own."""
    deadline = Deadline(opts.endpoint_timeout)
    endpoint = Endpoint(opts.endpoint, key_variable=opts.endpoint_key_env, deadline=deadline,
                        concurrency=opts.endpoint_concurrency)
    baseline = (Endpoint(opts.baseline_endpoint, key_variable=opts.endpoint_key_env, deadline=deadline,
                         concurrency=opts.endpoint_concurrency, label="--baseline-endpoint")
                if opts.baseline_endpoint else None)
    try:
        return _measure(opts, prompts, endpoint, baseline, say, offline)
    finally:
        endpoint.close()
        if baseline is not None:
            baseline.close()


def _measure(opts, prompts, endpoint: Endpoint, baseline: Endpoint | None, say, offline):
    model, engine = served_model(endpoint, opts.endpoint_model)
    sampling = sampling_sent(opts)
    greedy = sampling.get("temperature") == 0
    seed = opts.seed if sampling.get("temperature", 0) > 0 else None
    sent = bodies(prompts, model=model, engine=engine, sampling=sampling, max_tokens=opts.max_new_tokens, seed=seed,
                  logprobs=False)
    say(f"endpoint: {len(sent)} prompts to {engine} at {endpoint.url} ({model}), {opts.endpoint_concurrency} in flight")
    before = read_counters(endpoint)
    replies, wall = send_all(endpoint, sent, opts.endpoint_concurrency)
    after = read_counters(endpoint)
    counts, counted = measured(endpoint, replies, before, after)
    new_tokens = sum(r.new_tokens for r in replies)
    per_request_stats = all(r.spec is not None for r in replies)
    histogram = None
    if per_request_stats:
        histogram = [0] * max(len(r.spec.histogram) for r in replies)
        for r in replies:
            histogram = [a + b for a, b in zip(histogram, r.spec.histogram + [0] * len(histogram))]
    stats = EndpointStats(
        url=endpoint.url, model=model, engine=engine, counted=counted, concurrency=opts.endpoint_concurrency,
        prompts=len(sent), new_tokens=new_tokens, counts=as_counts(counts),
        sglang_acceptance_length=round(new_tokens / counts.steps, 4) if per_request_stats and counts.steps else None,
        accepted_histogram=histogram or [],
        per_prompt_set=per_set(replies, {named.name: named.source for named in opts.prompt_sets}),
        per_request=per_request(replies),
        duration_s=round(wall, 4), tokens_per_s=round(new_tokens / wall, 3) if wall > 0 else 0.0,
        **latency_figures(replies), max_tokens=opts.max_new_tokens, sampling=sampling_report(sampling),
        prompts_sha256=prompts_sha256(sent), offline=offline)
    say(f"endpoint: tau {stats.counts.acceptance_length:.3f} over {counts.steps} verify steps ({counted}); "
        f"{stats.tokens_per_s:.1f} tokens/s")
    checks = threshold_checks(stats, opts)
    if baseline is not None:
        from dflash_convert.validate.endpoint_compare import compare_endpoints

        comparison_checks, stats.baseline_endpoint = compare_endpoints(
            opts, prompts, endpoint, baseline, model=model, engine=engine, sampling=sampling, seed=seed,
            greedy=greedy, say=say)
        checks += comparison_checks
    return checks, stats


def threshold_checks(stats: EndpointStats, opts: ValidateOptions) -> list[Check]:
    """The informational figure, the thresholds asked for and, with the offline emulation, the agreement."""
    c = stats.counts
    sglang = (f"; SGLang's counting (generated tokens / steps) {stats.sglang_acceptance_length:.3f}"
              if stats.sglang_acceptance_length is not None else "")
    checks = [make_check("endpoint_acceptance", True,
                         f"{stats.engine} at {stats.url} ({stats.model}): {c.num_drafts} verify steps, {c.drafted} "
                         f"draft tokens, {c.accepted} accepted: tau {c.acceptance_length:.3f} in vLLM's counting"
                         f"{sglang}; counted from {stats.counted}", value=c.acceptance_length, level=LEVEL)]
    if opts.min_acceptance_length is not None:
        checks.append(make_check(
            "endpoint_acceptance_length", c.acceptance_length >= opts.min_acceptance_length,
            f"the endpoint's tau {c.acceptance_length:.3f} over {c.num_drafts} verify steps; required >= "
            f"{opts.min_acceptance_length}", value=c.acceptance_length, threshold=opts.min_acceptance_length,
            level=LEVEL))
    if opts.min_position_rates:
        got = c.per_position_rates
        low = [f"position {k + 1}: {got[k] if k < len(got) else 0:.3f} < {m}"
               for k, m in enumerate(opts.min_position_rates) if k >= len(got) or got[k] < m]
        checks.append(make_check("endpoint_position_rates", not low, "; ".join(low) if low else
                                 "every position of the endpoint's figures meets its threshold", value=got,
                                 threshold=list(opts.min_position_rates), level=LEVEL))
    if stats.offline is not None:
        checks.append(agreement_check(stats, sampled=(stats.sampling.get("temperature") not in (0, 0.0))))
    return checks


def agreement_check(stats: EndpointStats, *, sampled: bool) -> Check:
    """endpoint_acceptance_agrees: the served figures against the offline emulation of the engine."""
    from dflash_convert.validate.served import agreement

    c, e = stats.counts, stats.offline
    agrees, detail, _ = agreement(c, e, sampled)
    return make_check("endpoint_acceptance_agrees", agrees,
                      f"endpoint: {c.num_drafts} verify steps, tau {c.acceptance_length:.3f}; the offline emulation "
                      f"counted as vLLM counts: {e.num_drafts} steps, tau {e.acceptance_length:.3f}; {detail}"
                      + ("" if agrees else ": the deployment does not serve the draft as it runs offline"),
                      value=c.acceptance_length, threshold=e.acceptance_length, level=LEVEL)

