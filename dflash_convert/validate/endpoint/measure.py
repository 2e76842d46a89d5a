"""`validate --endpoint URL`: the prompts sent to a live OpenAI-compatible server, and what it served measured.

Text prompts and chat messages go to /v1/chat/completions (the server renders its own chat template: what is
measured is what the deployment does); token-id prompts to /v1/completions. Every request asks for its
output token ids (`return_token_ids`) and for per-request speculative statistics (SGLang's
`return_spec_tokens_details`; vLLM returns them when started with --per-request-spec-decode-metrics).
Sampling is what the flags set, each field sent only when set; the server's defaults otherwise, and the report
says which, value by value. `concurrency` requests are in flight at once.

Acceptance (counts.py): per-request statistics when every answer has them; else the deltas of the
server's Prometheus counters around the run, ours only when no other request moved them (else "cannot
measure", exit 1); neither moved: "the endpoint does not speculate" (exit 1).
"""

from __future__ import annotations

import hashlib
import json
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any

from dflash_convert.validate.endpoint.client import Endpoint, EndpointError, field_of
from dflash_convert.validate.endpoint.counts import (COUNTER_FIELDS, ImpossibleCounts, SpecCounts, check_counts,
                                                     counter_delta, foreign_traffic, parse_metrics,
                                                     sglang_request_counts, vllm_request_counts, vllm_request_steps,
                                                     whole)
from dflash_convert.validate.options import FIELDS, PENALTY_FIELDS, Prompt
from dflash_convert.validate.report import AcceptanceCounts, EndpointRequest, PromptSetAcceptance

CHAT, COMPLETIONS = "/v1/chat/completions", "/v1/completions"
TOP_LOGPROBS = 5  # candidates per generated token, for the near-tie judgement of --baseline-endpoint
HOW_TO_COUNT = ("start vLLM with --per-request-spec-decode-metrics summary (each answer then carries its own "
                "counts), or measure while nothing else is sent to the server")


@dataclass
class Sent:
    """One prompt as sent: its index among all prompts, its named set, the path and the JSON body."""

    index: int
    prompt_set: str | None
    path: str
    body: dict[str, Any]


@dataclass
class Reply:
    """What one answer said: output token ids (None: the server gave only text), text, generated tokens,
    its per-request speculative counts (None: none), latency, server-side timings, top candidates per token."""

    sent: Sent
    output_ids: list[int] | None
    text: str
    new_tokens: int
    spec: SpecCounts | None
    seconds: float
    ttft_ms: float | None = None
    itl_ms: float | None = None
    top: list[dict[str, float]] | None = None
    prompt_tokens: int | None = None  # the server's usage.prompt_tokens
    steps: list[int] | None = None  # draft tokens accepted per verify step, in order (vLLM's detailed level)
    finish_reason: str | None = None  # "length": max_tokens reached (or cut to fit the served context)


def sampling_sent(opts) -> dict[str, Any]:
    """The sampling fields the flags set (--sampling greedy: temperature 0), to send as they are."""
    sent = {name: getattr(opts, name) for name in FIELDS + PENALTY_FIELDS if getattr(opts, name) is not None}
    if opts.sampling == "greedy":
        sent["temperature"] = 0.0
    return sent


def sampling_report(sent: dict[str, Any]) -> dict[str, Any]:
    """Each sampling field: the value sent, or 'server default'."""
    return {name: sent.get(name, "server default") for name in FIELDS + PENALTY_FIELDS}


def bodies(prompts: list[tuple[str | None, Prompt]], *, model: str, engine: str, sampling: dict[str, Any],
           max_tokens: int, seed: int | None, logprobs: bool,
           template_kwargs: dict[str, Any] | None = None) -> list[Sent]:
    """The request of each (set name, prompt); `template_kwargs` (--chat-template-kwargs) go in each chat request's
    `chat_template_kwargs`, as vLLM's and SGLang's chat endpoints take them."""
    out = []
    for i, (set_name, prompt) in enumerate(prompts):
        body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": False, "n": 1, **sampling}
        if seed is not None:
            body["seed"] = seed + i
        if engine == "sglang":
            body["return_spec_tokens_details"] = True
        else:  # vLLM (and a router in front of it): ids back as ids, also for the top candidates
            body["return_token_ids"] = True
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            path, body["prompt"] = COMPLETIONS, prompt
            if logprobs:
                body["logprobs"] = TOP_LOGPROBS
        else:
            messages = prompt if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
            path, body["messages"] = CHAT, messages
            if template_kwargs:
                body["chat_template_kwargs"] = dict(template_kwargs)
            if engine == "sglang":
                body["return_output_ids_in_sglext"] = True
            if logprobs:
                body["logprobs"], body["top_logprobs"] = True, TOP_LOGPROBS
        if logprobs and engine != "sglang":
            body["return_tokens_as_token_ids"] = True
        out.append(Sent(i, set_name, path, body))
    return out


def prompts_sha256(sent: list[Sent]) -> str:
    """SHA-256 of what was asked, model name left out: two runs of the same prompts and settings match."""
    asked = [{k: v for k, v in s.body.items() if k != "model"} | {"path": s.path} for s in sent]
    return hashlib.sha256(json.dumps(asked, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _token_key(token: str) -> str:
    """A candidate token as its id (vLLM's return_tokens_as_token_ids gives 'token_id:123')."""
    return token.removeprefix("token_id:")


def _top(choice: dict[str, Any], path: str) -> list[dict[str, float]] | None:
    """Per generated token, {token id: value} of the top candidates (None: not asked or not given)."""
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return None
    if path == CHAT:
        return [{_token_key(c["token"]): float(c["logprob"]) for c in step.get("top_logprobs") or []}
                for step in logprobs.get("content") or []]
    return [{_token_key(t): float(v) for t, v in (step or {}).items()} for step in logprobs.get("top_logprobs") or []]


def parse_reply(sent: Sent, answer, where: str) -> Reply:
    """One answer read, or one EndpointError naming the field it lacks."""
    body = answer.body
    choice = field_of(body, "choices.0", where)
    answer_to = f"{where}, the answer to prompt {sent.index + 1}"
    try:
        new_tokens = whole(field_of(body, "usage.completion_tokens", where), "usage.completion_tokens")
        spec = vllm_request_counts(body, new_tokens) or sglang_request_counts(body, new_tokens)
        steps = vllm_request_steps(body)
    except ImpossibleCounts as exc:
        raise EndpointError(f"{answer_to}: impossible counts: {exc}") from None
    except (KeyError, TypeError, ValueError) as exc:
        raise EndpointError(f"{answer_to}: malformed speculative statistics ({exc})") from None
    ids = choice.get("token_ids") if isinstance(choice, dict) else None
    if ids is None:
        ids = (((body.get("sglext") or {}).get("output_ids") or [None])[0])
    text = (choice.get("message") or {}).get("content") if sent.path == CHAT else choice.get("text")
    metrics = body.get("metrics") or {}
    prompt_tokens = (body.get("usage") or {}).get("prompt_tokens")
    return Reply(sent, [int(t) for t in ids] if ids is not None else None, text or "", new_tokens, spec,
                 answer.seconds, metrics.get("time_to_first_token_ms"), metrics.get("mean_itl_ms"),
                 _top(choice, sent.path), prompt_tokens if type(prompt_tokens) is int else None, steps,
                 choice.get("finish_reason") if isinstance(choice, dict) else None)


def send_all(endpoint: Endpoint, sent: list[Sent], concurrency: int) -> tuple[list[Reply], float]:
    """Every request, `concurrency` in flight; (replies in order, wall seconds). The first failure ends the run;
    so does Ctrl-C, which then propagates (exit 130). The senders are daemon threads and the client is closed on
    the way out: nothing waits for an answer still in flight."""
    started = time.monotonic()
    todo = iter(range(len(sent)))
    replies: list[Reply | None] = [None] * len(sent)
    failures: list[BaseException] = []
    finished = [0]
    state = threading.Condition()

    def sender() -> None:
        while True:
            with state:
                i = next(todo, None)
                if i is None or failures:
                    return
            try:
                s = sent[i]
                replies[i] = parse_reply(s, endpoint.post(s.path, s.body), f"{endpoint.label} {endpoint.url}{s.path}")
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread, raised there
                with state:
                    failures.append(exc)
            with state:
                finished[0] += 1
                state.notify()

    for _ in range(min(concurrency, len(sent))):
        threading.Thread(target=sender, daemon=True, name="endpoint-sender").start()
    try:
        with state:
            while finished[0] < len(sent) and not failures and endpoint.deadline.left() > 0:
                state.wait(min(endpoint.deadline.left(), 1.0))
        if failures:
            raise failures[0]
        if finished[0] < len(sent):
            raise EndpointError(f"{endpoint.label} {endpoint.url}: {len(sent) - finished[0]} request(s) unanswered "
                                f"within {endpoint.deadline.total_s:g} s (--endpoint-timeout)")
    except BaseException:
        with state:
            failures.append(EndpointError("stopped"))  # the senders take no further request
        endpoint.close()  # requests in flight end with their connections
        raise
    return [r for r in replies if r is not None], time.monotonic() - started


def read_counters(endpoint: Endpoint):
    """The server's /metrics, or why it could not be read (a string): a run with per-request statistics needs
    none, and one without says why it cannot count."""
    try:
        return parse_metrics(endpoint.get("/metrics").body)
    except EndpointError as exc:
        return str(exc).removeprefix(f"{endpoint.label} {endpoint.url}")
    except ValueError as exc:  # a value that is no number, or a spec-decode counter that is no count
        return f"/metrics: {exc}"


def measured(endpoint: Endpoint, replies: list[Reply], before, after) -> tuple[SpecCounts, str]:
    """(the acceptance counts of these replies, how they were counted); EndpointError when they cannot be
    counted as ours, or nothing speculated."""
    where = f"{endpoint.label} {endpoint.url}"
    carried = [r for r in replies if r.spec is not None]
    if replies and len(carried) == len(replies):
        at = {r.spec.width for r in carried if r.spec.width is not None}
        if len(at) > 1:
            first = {k: next(r.sent.index + 1 for r in carried if r.spec.width == k) for k in sorted(at)}
            raise EndpointError(f"{where}: cannot measure: the answers speculated at different numbers of draft tokens "
                                "per verify step (" + ", ".join(f"{k} in the answer to prompt {i}"
                                                                for k, i in first.items()) + "): not summed")
        total = SpecCounts()
        for r in replies:
            total = total + r.spec
        if total.steps == 0:
            raise EndpointError(f"{where}: cannot measure: the {len(replies)} answer(s) carried per-request statistics "
                                "of 0 verify steps: nothing was speculated, no tau to report")
        return total, "per-request statistics, summed over the requests"
    said = (f"{len(carried)} of {len(replies)} answers carried per-request statistics and {len(replies) - len(carried)}"
            f" did not (the first: the answer to prompt {next(r.sent.index + 1 for r in replies if r.spec is None)})"
            if carried else "no answer carried per-request statistics")
    unread = next((c for c in (before, after) if isinstance(c, str)), None)
    if unread is not None:
        raise EndpointError(f"{where}: cannot measure: {said} and its counters could not be read "
                            f"({unread.strip(': ')}); " + HOW_TO_COUNT)
    if before.spec is None or after.spec is None:
        if carried:
            raise EndpointError(f"{where}: cannot measure: {said}, and its /metrics has no spec-decode counter; "
                                + HOW_TO_COUNT)
        raise EndpointError(f"{where}: the endpoint does not speculate (no per-request speculative statistics, and "
                            "no spec-decode counter in its /metrics)")

    def impossible(counts: SpecCounts, tokens: int | None = None) -> None:
        try:
            check_counts(counts, COUNTER_FIELDS, tokens=tokens)
        except ImpossibleCounts as exc:
            raise EndpointError(f"{where}/metrics: impossible counts around the run: {exc}") from None

    delta = counter_delta(before, after)
    impossible(delta)  # what no server can count: negative deltas, more accepted than drafted, ...
    if delta.steps == 0:
        if carried:
            raise EndpointError(f"{where}: cannot measure: {said}, and its spec-decode counters did not move")
        raise EndpointError(f"{where}: the endpoint does not speculate (its spec-decode counters did not move, and "
                            "no answer carried per-request statistics)")
    other = foreign_traffic(before, after, len(replies))
    if other is not None:  # before the bound by our tokens: other traffic's steps in the deltas are not ours
        raise EndpointError(f"{where}: cannot measure: the server-wide counters may hold other traffic ({other}); "
                            + HOW_TO_COUNT)
    impossible(delta, tokens=sum(r.new_tokens for r in replies))
    return delta, "the deltas of the server's Prometheus spec-decode counters around the run, summed over every " \
                  "label set (engine ranks)"


def as_counts(counts: SpecCounts) -> AcceptanceCounts:
    return AcceptanceCounts(num_drafts=counts.steps, drafted=counts.drafted, accepted=counts.accepted,
                            acceptance_length=counts.tau, per_position_rates=counts.rates)


def per_request(replies: list[Reply]) -> list[EndpointRequest]:
    return [EndpointRequest(prompt=r.sent.index + 1, prompt_set=r.sent.prompt_set, path=r.sent.path,
                            new_tokens=r.new_tokens, steps=r.spec.steps if r.spec else None,
                            accepted=r.spec.accepted if r.spec else None,
                            acceptance_length=r.spec.tau if r.spec else None, latency_s=round(r.seconds, 4),
                            ttft_ms=r.ttft_ms, itl_ms=r.itl_ms) for r in replies]


PROMPT_LENGTH_EDGES = tuple(1024 << i for i in range(11))  # 1k .. 1M: where a prompt-length group ends


def prompt_length_group(tokens: int) -> str:
    """The group of a prompt of `tokens` tokens: <1024, 1024-2047, 2048-4095, ..."""
    end = next((e for e in PROMPT_LENGTH_EDGES if tokens < e), None)
    if end is None:
        return f">={PROMPT_LENGTH_EDGES[-1]}"
    return f"<{end}" if end == PROMPT_LENGTH_EDGES[0] else f"{end // 2}-{end - 1}"


def per_group(replies: list[Reply], group_of: dict[int, str | None], source: str) -> dict[str, PromptSetAcceptance]:
    """tau per group of requests (`group_of`: prompt index -> its group, None: in none), from each request's own
    statistics; empty where a request has none (counters cannot split a run)."""
    if not all(r.spec is not None for r in replies):
        return {}
    out = {}
    for name in dict.fromkeys(group_of.get(r.sent.index) for r in replies):
        if name is None:
            continue
        total = SpecCounts()
        mine = [r for r in replies if group_of.get(r.sent.index) == name]
        for r in mine:
            total = total + r.spec
        out[name] = PromptSetAcceptance(source=source, prompts=len(mine), new_tokens=sum(r.new_tokens for r in mine),
                                        num_drafts=total.steps, accepted=total.accepted, acceptance_length=total.tau,
                                        per_position_rates=total.rates)
    return out


def per_set(replies: list[Reply], sources: dict[str, str]) -> dict[str, PromptSetAcceptance]:
    """tau per named prompt set (`sources`: name -> where it came from), from per-request statistics (counters
    cannot split a run)."""
    out = {}
    for name in dict.fromkeys(r.sent.prompt_set for r in replies if r.sent.prompt_set is not None):
        mine = [r for r in replies if r.sent.prompt_set == name]
        if not all(r.spec is not None for r in mine):
            continue
        total = SpecCounts()
        for r in mine:
            total = total + r.spec
        out[name] = PromptSetAcceptance(source=sources.get(name, name), prompts=len(mine),
                                        new_tokens=sum(r.new_tokens for r in mine),
                                        num_drafts=total.steps, accepted=total.accepted, acceptance_length=total.tau,
                                        per_position_rates=total.rates)
    return out


def latency_figures(replies: list[Reply]) -> dict[str, float | None]:
    seconds = sorted(r.seconds for r in replies)
    ttft = [r.ttft_ms for r in replies if r.ttft_ms is not None]
    itl = [r.itl_ms for r in replies if r.itl_ms is not None]
    return {"latency_s_mean": round(statistics.fmean(seconds), 4),
            "latency_s_p50": round(_quantile(seconds, 0.5), 4), "latency_s_p90": round(_quantile(seconds, 0.9), 4),
            "ttft_ms_mean": round(statistics.fmean(ttft), 3) if len(ttft) == len(replies) else None,
            "itl_ms_mean": round(statistics.fmean(itl), 3) if len(itl) == len(replies) else None}


def _quantile(values: list[float], q: float) -> float:
    """The q-quantile of sorted `values` (nearest rank)."""
    return values[min(int(q * len(values)), len(values) - 1)]
