"""--baseline-endpoint URL: the same target served without speculation, beside --endpoint.

Outputs (greedy only: samples of two servers' random streams are not compared): each prompt's output token ids
from both servers, equal, or parting first at a near-tie, judged as the in-process engine check judges it
(served.parting): both servers are asked for their top candidates per token, and the speculative server's come
from the verify rows its tokens were taken from, so where the outputs part the two servers' computations of the
target are measured against each other (validate.partings: a near-tie where the gap in the baseline is within
how far the speculative server's computation moved it; a move beyond rounding gives no verdict, exit 1), with
the floor of TIE_ULPS units in the last place of the baseline's pick for a parting nothing measured. The
candidates' values are what the server reports per token: its logits when started with `--logprobs-mode
processed_logits` (the in-process check's values), log-probabilities otherwise. Log-probabilities are not
measured (their units in the last place are those of values near 0, not of the logits the servers rounded): the
floor alone judges them, and it is stricter there.

Speed: both endpoints get every prompt in `timing_rounds` interleaved rounds (speculative first in even rounds,
the baseline first in odd ones), at the same concurrency; tokens/s over all rounds, the speedup of each round as
its spread, and the mean request latency of each.
"""

from __future__ import annotations

import statistics
from typing import Any, Callable

from dflash_convert.validate.static import Check, make_check
from dflash_convert.errors import UsageError
from dflash_convert.validate.endpoint.client import Endpoint, served_model
from dflash_convert.validate.endpoint.measure import Reply, bodies, send_all
from dflash_convert.validate.report import EndpointComparison

LOGITS_HINT = "start both servers with --logprobs-mode processed_logits to judge near-ties from logits"


def compare_endpoints(opts, prompts, endpoint: Endpoint, baseline: Endpoint, *, model: str, engine: str,
                      sampling: dict[str, Any], seed: int | None, greedy: bool,
                      say: Callable[[str], None]) -> tuple[list[Check], EndpointComparison]:
    base_model, base_engine = _baseline_model(baseline, model)
    ours = bodies(prompts, model=model, engine=engine, sampling=sampling, max_tokens=opts.max_new_tokens, seed=seed,
                  logprobs=greedy, template_kwargs=opts.chat_template_kwargs)
    theirs = bodies(prompts, model=base_model, engine=base_engine, sampling=sampling, max_tokens=opts.max_new_tokens,
                    seed=seed, logprobs=greedy, template_kwargs=opts.chat_template_kwargs)
    rounds = max(opts.timing_rounds, 1)
    say(f"endpoint: {rounds} interleaved rounds against {baseline.url} (no speculation)")
    spec_runs, base_runs = [], []
    for r in range(rounds):
        pair = [(endpoint, ours, spec_runs), (baseline, theirs, base_runs)]
        for server, sent, runs in pair if r % 2 == 0 else pair[::-1]:
            runs.append(send_all(server, sent, opts.endpoint_concurrency))
    comparison = _speed(baseline.url, base_model, len(ours), spec_runs, base_runs)
    checks = []
    if greedy:
        check, comparison.outputs_equal, comparison.near_ties = outputs_check(spec_runs[0][0], base_runs[0][0])
        checks.append(check)
    if opts.min_speedup is not None:
        checks.append(make_check("endpoint_speedup", comparison.speedup >= opts.min_speedup,
                                 f"speedup {comparison.speedup:.2f}x over {rounds} interleaved rounds (per round "
                                 f"{comparison.speedup_range[0]:.2f}-{comparison.speedup_range[1]:.2f}x); required >= "
                                 f"{opts.min_speedup}", value=comparison.speedup, threshold=opts.min_speedup,
                                 level="end_to_end"))
    return checks, comparison


def _baseline_model(baseline: Endpoint, model: str) -> tuple[str, str]:
    """The baseline's model: the only one it lists, else the one named as --endpoint's."""
    try:
        return served_model(baseline, None)
    except UsageError:  # several listed: --endpoint's model name picks
        return served_model(baseline, model)


def _speed(url: str, model: str, prompts: int, spec_runs, base_runs) -> EndpointComparison:
    def tokens(replies: list[Reply]) -> int:
        return sum(r.new_tokens for r in replies)

    spec_rate = sum(tokens(r) for r, _ in spec_runs) / sum(w for _, w in spec_runs)
    base_rate = sum(tokens(r) for r, _ in base_runs) / sum(w for _, w in base_runs)
    per_round = [(tokens(s) / ws) / (tokens(b) / wb) for (s, ws), (b, wb) in zip(spec_runs, base_runs)]
    return EndpointComparison(
        url=url, model=model, prompts=prompts, outputs_equal=None, rounds=len(spec_runs),
        tokens_per_s=round(spec_rate, 3), baseline_tokens_per_s=round(base_rate, 3),
        speedup=round(spec_rate / base_rate, 4), speedup_range=[round(min(per_round), 4), round(max(per_round), 4)],
        latency_s=round(statistics.fmean(r.seconds for run, _ in spec_runs for r in run), 4),
        baseline_latency_s=round(statistics.fmean(r.seconds for run, _ in base_runs for r in run), 4))


def outputs_check(spec: list[Reply], base: list[Reply]) -> tuple[Check, int, list[str]]:
    """endpoint_outputs_equal: each prompt's greedy output from both servers, equal or parting at a near-tie."""
    from dflash_convert.errors import DFlashError
    from dflash_convert.validate.engine.served import parting

    equal, ties, bad = 0, [], None
    for s, b in zip(spec, base):
        if s.output_ids is None or b.output_ids is None:  # a server without token ids: compare the text
            equal += s.text == b.text
            if s.text != b.text and bad is None:
                bad = f"prompt {s.sent.index + 1}: the outputs' texts differ (no token ids to say where)"
            continue
        part = parting(b.output_ids, s.output_ids, b.top, "bfloat16", s.top, "the speculative endpoint")
        if part is not None and not _logits(part):  # log-probabilities: the floor alone (see the module)
            part = parting(b.output_ids, s.output_ids, b.top, "bfloat16")
        if part is not None and part.beyond_rounding:
            raise DFlashError(f"cannot judge endpoint_outputs_equal: at prompt {s.sent.index + 1}, {_describe(part)}: "
                              "the two servers' computations of the target disagree by more than rounding")
        if part is None:
            equal += 1
        elif part.near_tie:
            ties.append(f"prompt {s.sent.index + 1}, {_describe(part)}")
        elif bad is None:
            logprobs = part.taken_logit is not None and part.taken_logit <= 0
            bad = (f"prompt {s.sent.index + 1}: the deployment's speculation changes its output ({_describe(part)})"
                   + (f"; the values are log-probabilities: {LOGITS_HINT}" if logprobs else ""))
    n = len(spec)
    message = bad + f" ({equal}/{n} prompts equal)" if bad else (
        f"greedy outputs of both servers equal on {equal}/{n} prompts"
        + (f"; the other {len(ties)} part at a near-tie: " + " | ".join(ties) if ties else ""))
    check = make_check("endpoint_outputs_equal", bad is None, message, value=f"{equal}/{n}", threshold=f"{n}/{n}",
                       level="end_to_end")
    return check, equal, ties


def _logits(part) -> bool:
    """Whether the values the servers reported at a parting are logits (a log-probability is never above 0)."""
    return all(v is not None and v > 0 for v in (part.taken_logit, part.second_taken))


def _describe(part) -> str:
    where = f"token {part.at + 1}: the baseline took {part.taken}, the speculative endpoint {part.other}"
    if part.taken_logit is None or part.other_logit is None:
        return where + " (not among the baseline's top candidates)"
    kind = "a near-tie" if part.near_tie else "not a near-tie"
    measured = part.measured_words() if part.path.measured else ""
    return f"{where} (values {part.taken_logit:.4g} and {part.other_logit:.4g}{measured}: {kind})"
