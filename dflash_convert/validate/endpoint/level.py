"""The endpoint level of `validate --endpoint URL [--baseline-endpoint URL]`: the measurement of a live server
(measure.py) turned into checks and the report's `endpoint` section.

Checks (level end_to_end: they judge decoding):
- endpoint_acceptance: what was counted, and how (informational: passes once something was measured);
- endpoint_acceptance_length / endpoint_position_rates: --min-acceptance-length / --min-position-rates;
- endpoint_acceptance_agrees (CKPT with a --target that has weights): the deployment's figures against the
  runtime's emulation of the engine, counted as vLLM counts, with the tolerance of the in-process engine check;
- endpoint_outputs_equal (--baseline-endpoint, greedy): each prompt's output from both servers, equal or parting
  first at a near-tie judged from the baseline server's top candidates (as the in-process engine check judges);
- endpoint_speedup (--baseline-endpoint with --min-speedup): tokens/s over interleaved rounds;
- endpoint_acceptance_length[CATEGORY] (--min-acceptance-length CATEGORY=X): the category's requests' own figures;
- endpoint_context_lengths (--context-lengths, context.py): tau per prompt length, warning where it falls below
  half the endpoint's tau on the prompts.
"""

from __future__ import annotations

from typing import Callable

from dflash_convert.validate.breakdown import LongContexts, context_check, half_tau_length, output_buckets
from dflash_convert.validate.static import Check, make_check
from dflash_convert.validate.endpoint.client import Deadline, Endpoint, EndpointError, served_model
from dflash_convert.validate.endpoint.measure import (HOW_TO_COUNT, as_counts, bodies, latency_figures, measured,
                                                  per_group, per_request, per_set, prompt_length_group,
                                                  prompts_sha256, read_counters, sampling_report, sampling_sent,
                                                  send_all)
from dflash_convert.validate.options import Prompt, ValidateOptions
from dflash_convert.validate.report import AcceptanceCounts, EndpointStats, SliceAcceptance, StepDecisions

LEVEL = "end_to_end"


def endpoint_level(opts: ValidateOptions, prompts: list[tuple[str | None, Prompt]], *, say: Callable[[str], None],
                   offline: AcceptanceCounts | None = None, offline_steps: list[StepDecisions] | None = None,
                   categories: list[str | None] | None = None, long: LongContexts | None = None
                   ) -> tuple[list[Check], EndpointStats]:
    """Measure the endpoint on `prompts` ((set name or None, prompt) each); raises EndpointError (exit 1) when
    nothing could be measured as this run's own. `offline`: the emulation's figures counted as vLLM counts, and
    `offline_steps` its verify decisions (greedy), for endpoint_acceptance_agrees. `categories`: each prompt's
    category, for tau per category (as per prompt length) from the requests' own statistics. `long`: the
    --context-lengths prompts the end-to-end level decoded (None: cut here, context.py)."""
    deadline = Deadline(opts.endpoint_timeout)
    endpoint = Endpoint(opts.endpoint, key_variable=opts.endpoint_key_env, deadline=deadline,
                        concurrency=opts.endpoint_concurrency)
    baseline = (Endpoint(opts.baseline_endpoint, key_variable=opts.endpoint_key_env, deadline=deadline,
                         concurrency=opts.endpoint_concurrency, label="--baseline-endpoint")
                if opts.baseline_endpoint else None)
    try:
        return _measure(opts, prompts, endpoint, baseline, say, offline, offline_steps, categories, long)
    finally:
        endpoint.close()
        if baseline is not None:
            baseline.close()


def _measure(opts, prompts, endpoint: Endpoint, baseline: Endpoint | None, say, offline, offline_steps=None,
             categories=None, long=None):
    model, engine = served_model(endpoint, opts.endpoint_model)
    if opts.context_lengths:  # refused or cut before anything is generated
        from dflash_convert.validate.endpoint.context import endpoint_long_contexts, refuse_beyond_context

        refuse_beyond_context(endpoint, model, opts.context_lengths, opts.max_new_tokens)
        long = long or endpoint_long_contexts(opts, endpoint, model, prompts, say)
    sampling = sampling_sent(opts)
    greedy = sampling.get("temperature") == 0
    seed = opts.seed if sampling.get("temperature", 0) > 0 else None
    sent = bodies(prompts, model=model, engine=engine, sampling=sampling, max_tokens=opts.max_new_tokens, seed=seed,
                  logprobs=False, template_kwargs=opts.chat_template_kwargs)
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
        per_category=per_group(replies, dict(enumerate(categories or [])), "the prompts' `category`"),
        per_prompt_length=per_group(replies, {r.sent.index: prompt_length_group(r.prompt_tokens) for r in replies
                                              if r.prompt_tokens is not None}, "the server's usage.prompt_tokens"),
        duration_s=round(wall, 4), tokens_per_s=round(new_tokens / wall, 3) if wall > 0 else 0.0,
        **latency_figures(replies), max_tokens=opts.max_new_tokens, sampling=sampling_report(sampling),
        prompts_sha256=prompts_sha256(sent), offline=offline)
    say(f"endpoint: tau {stats.counts.acceptance_length:.3f} over {counts.steps} verify steps ({counted}); "
        f"{stats.tokens_per_s:.1f} tokens/s")
    if per_request_stats and all(r.steps is not None for r in replies):
        stats.per_output_bucket = [SliceAcceptance(**b) for b in output_buckets(
            [r.steps for r in replies], len(counts.per_position), opts.max_new_tokens)]
    checks = threshold_checks(stats, opts, offline_steps=offline_steps)
    if long is not None:
        from dflash_convert.validate.endpoint.context import measure_lengths

        stats.per_context_length = measure_lengths(endpoint, long, model=model, engine=engine, sampling=sampling,
                                                   seed=seed, opts=opts, say=say, width=counts.width)
        stats.context_source = f"{long.source}; sent to {endpoint.url} as token ids"
        stats.context_half_tau_length = half_tau_length(stats.acceptance_length, stats.per_context_length)
        checks.append(context_check("endpoint_context_lengths", stats.acceptance_length, stats.per_context_length,
                                    stats.context_half_tau_length))
    if baseline is not None:
        from dflash_convert.validate.endpoint.compare import compare_endpoints

        comparison_checks, stats.baseline_endpoint = compare_endpoints(
            opts, prompts, endpoint, baseline, model=model, engine=engine, sampling=sampling, seed=seed,
            greedy=greedy, say=say)
        checks += comparison_checks
    return checks, stats


def threshold_checks(stats: EndpointStats, opts: ValidateOptions, *,
                     offline_steps: list[StepDecisions] | None = None) -> list[Check]:
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
    checks += category_checks(stats, opts)
    if opts.min_position_rates:
        got = c.per_position_rates
        low = [f"position {k + 1}: {got[k] if k < len(got) else 0:.3f} < {m}"
               for k, m in enumerate(opts.min_position_rates) if k >= len(got) or got[k] < m]
        checks.append(make_check("endpoint_position_rates", not low, "; ".join(low) if low else
                                 "every position of the endpoint's figures meets its threshold", value=got,
                                 threshold=list(opts.min_position_rates), level=LEVEL))
    if stats.offline is not None:
        checks.append(agreement_check(stats, sampled=(stats.sampling.get("temperature") not in (0, 0.0)),
                                      steps=offline_steps, max_new_tokens=opts.max_new_tokens))
    return checks


def category_checks(stats: EndpointStats, opts: ValidateOptions) -> list[Check]:
    """--min-acceptance-length CATEGORY=X against the category's requests' own statistics; without them (counters
    cannot split a run) the gate cannot be judged: an error, never a pass."""
    out = []
    for name, need in opts.min_category_acceptance_length.items():
        s = stats.per_category.get(name)
        if s is None:
            raise EndpointError(f"{stats.url}: cannot gate category {name}: no per-request statistics to split the "
                                f"run by category ({stats.counted}); " + HOW_TO_COUNT)
        out.append(make_check(f"endpoint_acceptance_length[{name}]", s.acceptance_length >= need,
                              f"category {name}: tau {s.acceptance_length:.3f} over {s.num_drafts} verify steps of "
                              f"{s.prompts} prompts at the endpoint; required >= {need}", value=s.acceptance_length,
                              threshold=need, level=LEVEL))
    return out


def agreement_check(stats: EndpointStats, *, sampled: bool, steps: list[StepDecisions] | None = None,
                    max_new_tokens: int | None = None) -> Check:
    """endpoint_acceptance_agrees: the served figures against the offline emulation of the engine. Sampled: within
    the interval from the counts. Greedy: the engine check's rule (served.greedy_agreement) without the server's
    per-step lists: where no offline decision sat near a tie the totals must be equal; otherwise no verdict (a
    warning), as other kernels may break those ties otherwise."""
    from dflash_convert.validate.engine.served import greedy_agreement, sampled_agreement

    c, e = stats.counts, stats.offline
    if sampled:
        agrees, detail, _ = sampled_agreement(c, e)
    elif steps is not None and len(steps) == len(stats.per_request) and \
            all(r.steps is not None and r.accepted is not None for r in stats.per_request):
        agrees, detail = per_prompt_agreement(stats.per_request, steps)
    else:
        agrees, detail, _ = greedy_agreement({"steps": None}, c, e, steps, ["bfloat16"], max_new_tokens)
    return make_check("endpoint_acceptance_agrees", bool(agrees),
                      f"endpoint: {c.num_drafts} verify steps, tau {c.acceptance_length:.3f}; the offline emulation "
                      f"counted as vLLM counts: {e.num_drafts} steps, tau {e.acceptance_length:.3f}; {detail}"
                      + (": the deployment does not serve the draft as it runs offline" if agrees is False else ""),
                      value=c.acceptance_length, threshold=e.acceptance_length, level=LEVEL,
                      bad="warn" if agrees is None else "fail")


def per_prompt_agreement(served: list, steps: list[StepDecisions]) -> tuple[bool | None, str]:
    """Greedy, with the server's per-request statistics: each prompt whose offline decisions all sat clear of a
    tie (served.acceptance_tie, in bfloat16: the coarsest a deployment serves in) must have been served in as many
    verify steps with as many accepted tokens; a prompt with a near-tie is not compared (other kernels may break
    it otherwise, and every later step follows). None: no prompt could be compared."""
    from dflash_convert.validate.engine.served import ACCEPTANCE_TIE_ULPS, acceptance_tie, defined_until

    gap, dtype = acceptance_tie(["bfloat16"])
    compared, tied = 0, []
    for i, (request, ours) in enumerate(zip(served, steps), 1):
        if defined_until(ours, gap) is not None:
            tied.append(i)
            continue
        want = (len(ours.accepted), sum(ours.accepted))
        if (request.steps, request.accepted) != want:
            return False, (f"prompt {i}: served in {request.steps} verify steps with {request.accepted} accepted, "
                           f"offline {want[0]} with {want[1]}, with no decision within {ACCEPTANCE_TIE_ULPS} {dtype} "
                           "ulps of another outcome")
        compared += 1
    rule = (f"each prompt whose offline decisions all sat more than {ACCEPTANCE_TIE_ULPS} {dtype} ulps from another "
            "outcome, by its steps and accepted tokens")
    skipped = f"; {len(tied)} prompt(s) with a near-tie not compared ({', '.join(map(str, tied[:6]))})" if tied else ""
    if not compared:
        return None, f"no prompt could be compared: each has a near-tie{skipped} ({rule})"
    return True, f"equal on the {compared} prompt(s) compared{skipped} ({rule})"

