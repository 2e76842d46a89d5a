"""Acceptance as a serving engine counts it, read from what the server says: per request, or from its
Prometheus counters around the run.

Per request (exact, ours only):
- vLLM (--per-request-spec-decode-metrics summary|detailed) puts `metrics.speculative_decoding` in each
  response: `acceptance_histogram` (entry j: verify steps that accepted exactly j draft tokens, length
  num_spec_tokens + 1), `num_spec_steps`, `num_accepted_draft_tokens`, `num_draft_tokens`, `num_spec_tokens`;
  at `detailed`, `per_step_accepted` too (the accepted count of each verify step, in order: the output buckets).
- SGLang (a request with `return_spec_tokens_details`) puts `sglext.spec_tokens_details` in each response:
  `spec_verify_ct` (verify steps), `spec_num_correct_drafts` (accepted draft tokens),
  `spec_num_proposed_drafts` (steps x (speculative_num_draft_tokens - 1)), `spec_correct_drafts_histogram`
  (entry j: steps that accepted j drafts, as long as the largest j seen).
Either way a step accepts a prefix of its drafts, so position k (0-based) was accepted in the steps that
accepted more than k: the per-position rates follow from the histogram exactly.

Server-wide (vLLM only): the deltas of vllm:spec_decode_num_drafts_total, ..._num_draft_tokens_total,
..._num_accepted_tokens_total and ..._num_accepted_tokens_per_pos_total{position}, each summed over every
label set (each data-parallel rank is its own `engine` label). They are ours only when no other request ran:
vllm:request_success_total moved by exactly our requests and nothing was running or waiting before or after.
SGLang's server-wide figure (sglang:spec_accept_length) is a gauge over its last logging interval, not a
counter: it is never used.

Tau, two countings: vLLM's is 1 + accepted / steps (the bonus token of each step); SGLang's is generated
tokens / steps (the first token, from the prefill, counted too). Both are reported.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

SPEC_COUNTERS = {"vllm:spec_decode_num_drafts_total": "drafts", "vllm:spec_decode_num_draft_tokens_total": "drafted",
                 "vllm:spec_decode_num_accepted_tokens_total": "accepted"}
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
REQUESTS_DONE = "vllm:request_success_total"
IN_FLIGHT = ("vllm:num_requests_running", "vllm:num_requests_waiting")
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


class ImpossibleCounts(ValueError):
    """Counts a server reported that cannot be (a negative count, more accepted than drafted, fewer tokens than
    verify steps...): the message names the server's field. Never a figure: the run ends in an error (exit 1)."""


@dataclass
class SpecCounts:
    """Speculative decoding counts of some requests: verify steps, drafts proposed and accepted, accepted per
    draft position, (per request only) the steps by drafts accepted, and the draft tokens per verify step (K) the
    server said it ran at (None: not said)."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)
    histogram: list[int] | None = field(default_factory=list)  # None: not known (counters)
    width: int | None = None

    def __add__(self, other: "SpecCounts") -> "SpecCounts":
        hist = None if self.histogram is None or other.histogram is None else _sum(self.histogram, other.histogram)
        return SpecCounts(self.steps + other.steps, self.drafted + other.drafted, self.accepted + other.accepted,
                          _sum(self.per_position, other.per_position), hist,
                          self.width if self.width is not None else other.width)

    @property
    def tau(self) -> float:
        """vLLM's counting: 1 + accepted drafts per verify step."""
        return round(1 + self.accepted / self.steps, 4) if self.steps else 1.0

    @property
    def rates(self) -> list[float]:
        return [round(a / self.steps, 4) if self.steps else 0.0 for a in self.per_position]


# Each source's names for the fields check_counts judges, so that an error names what the server answered.
_VLLM = "metrics.speculative_decoding."
VLLM_FIELDS = {"steps": _VLLM + "num_spec_steps", "drafted": _VLLM + "num_draft_tokens",
               "accepted": _VLLM + "num_accepted_draft_tokens", "histogram": _VLLM + "acceptance_histogram",
               "width": _VLLM + "num_spec_tokens", "per_step": _VLLM + "per_step_accepted",
               "tokens": "usage.completion_tokens"}
_SGLANG = "sglext.spec_tokens_details."
SGLANG_FIELDS = {"steps": _SGLANG + "spec_verify_ct", "drafted": _SGLANG + "spec_num_proposed_drafts",
                 "accepted": _SGLANG + "spec_num_correct_drafts",
                 "histogram": _SGLANG + "spec_correct_drafts_histogram",
                 "width": _SGLANG + "spec_num_proposed_drafts / spec_verify_ct", "tokens": "usage.completion_tokens"}


def whole(value: Any, name: str) -> int:
    """`value` as a count: a whole number, at least 0 (an integral float, as Prometheus writes counters, too)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or \
            (isinstance(value, float) and not (math.isfinite(value) and value.is_integer())):
        raise ImpossibleCounts(f"{name} is {value!r}, not a whole count")
    if value < 0:
        raise ImpossibleCounts(f"{name} is {value:g}, a negative count")
    return int(value)


def check_counts(counts: SpecCounts, names: dict[str, str], *, tokens: int | None = None) -> SpecCounts:
    """`counts` as they are when they can be; else ImpossibleCounts naming the server's field (`names`: each of
    ours -> the server's). The one gate every source passes (per-request statistics, the counters' deltas, per-step
    lists), before any tau is computed. `tokens`: the generated tokens the counts cover (each verify step commits
    at least one)."""
    for ours in ("steps", "drafted", "accepted"):
        whole(getattr(counts, ours), names[ours])
    for k, n in enumerate(counts.per_position):
        if whole(n, f"{names['per_position']}[{k}]") > counts.steps:
            raise ImpossibleCounts(f"{names['per_position']}[{k}] is {n}, more than the {counts.steps} verify steps "
                                   f"({names['steps']})")
    k = counts.width
    if k is not None and counts.histogram is not None and len(counts.histogram) > k + 1:
        raise ImpossibleCounts(f"{names['histogram']} has {len(counts.histogram)} entries, at most {k + 1} at "
                               f"{k} draft tokens per verify step ({names['width']})")
    if k is not None and len(counts.per_position) > k:
        raise ImpossibleCounts(f"{names['per_position']} has {len(counts.per_position)} positions, at most {k} "
                               f"at {k} draft tokens per verify step ({names['width']})")
    if counts.accepted > counts.drafted:
        raise ImpossibleCounts(f"{counts.accepted} accepted draft tokens ({names['accepted']}) exceed the "
                               f"{counts.drafted} drafted ({names['drafted']})")
    if k is not None and counts.drafted > k * counts.steps:
        raise ImpossibleCounts(f"{counts.drafted} drafted ({names['drafted']}) exceed {k} per verify step "
                               f"({names['width']}) over {counts.steps} steps ({names['steps']})")
    if tokens is not None and tokens < counts.steps:
        raise ImpossibleCounts(f"{names['tokens']} is {tokens}, fewer than the {counts.steps} verify steps "
                               f"({names['steps']}): each step commits at least one token")
    return counts


def _sum(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def _from_histogram(histogram: Any, width: int, drafted: int, names: dict[str, str]) -> SpecCounts:
    """Counts of steps that accepted j drafts (histogram[j]), over `width` draft positions."""
    if not isinstance(histogram, list):
        raise ImpossibleCounts(f"{names['histogram']} is {histogram!r}, not a list of counts")
    hist = [whole(h, f"{names['histogram']}[{j}]") for j, h in enumerate(histogram)]
    hist += [0] * max(width + 1 - len(hist), 0)
    per_position = [sum(hist[k + 1:]) for k in range(width)]
    return SpecCounts(steps=sum(hist), drafted=drafted, accepted=sum(j * h for j, h in enumerate(hist)),
                      per_position=per_position, histogram=hist, width=width)


def vllm_request_counts(body: dict[str, Any], tokens: int | None = None) -> SpecCounts | None:
    """vLLM's per-request statistics of one response (None: the response has none); ImpossibleCounts (a
    ValueError) where they cannot be. `tokens`: the answer's generated tokens."""
    spec = ((body.get("metrics") or {}) if isinstance(body, dict) else {}).get("speculative_decoding")
    if not isinstance(spec, dict):
        return None
    names = VLLM_FIELDS | {"per_position": VLLM_FIELDS["histogram"] + " (accepted per position)"}
    width, drafted = whole(spec["num_spec_tokens"], names["width"]), whole(spec["num_draft_tokens"], names["drafted"])
    counts = _from_histogram(spec["acceptance_histogram"], width, drafted, names)
    steps = whole(spec["num_spec_steps"], names["steps"])
    accepted = whole(spec["num_accepted_draft_tokens"], names["accepted"])
    if (counts.steps, counts.accepted) != (steps, accepted):
        raise ImpossibleCounts(f"{names['histogram']} counts {counts.steps} verify steps accepting {counts.accepted} "
                               f"draft tokens, {names['steps']} {steps} and {names['accepted']} {accepted}")
    return check_counts(counts, names, tokens=tokens)


def vllm_request_steps(body: dict[str, Any]) -> list[int] | None:
    """The draft tokens accepted at each verify step of one response, in order: vLLM's `per_step_accepted`
    (--per-request-spec-decode-metrics detailed); None where it is absent or disagrees with the histogram;
    ImpossibleCounts where an entry cannot be (not a count, or more than the step's K drafts)."""
    spec = ((body.get("metrics") or {}) if isinstance(body, dict) else {}).get("speculative_decoding")
    steps = spec.get("per_step_accepted") if isinstance(spec, dict) else None
    if not isinstance(steps, list):
        return None
    counts = vllm_request_counts(body)
    for i, a in enumerate(steps):
        if whole(a, f"{VLLM_FIELDS['per_step']}[{i}]") > counts.width:
            raise ImpossibleCounts(f"{VLLM_FIELDS['per_step']}[{i}] is {a}, more than the {counts.width} draft tokens "
                                   f"of a verify step ({VLLM_FIELDS['width']})")
    return steps if (len(steps), sum(steps)) == (counts.steps, counts.accepted) else None


def sglang_request_counts(body: dict[str, Any], tokens: int | None = None) -> SpecCounts | None:
    """SGLang's per-request statistics of one response (None: the response has none); ImpossibleCounts where they
    cannot be."""
    details = ((body.get("sglext") or {}) if isinstance(body, dict) else {}).get("spec_tokens_details")
    if isinstance(details, list):  # one per choice; the tool asks for one choice
        details = details[0] if details else None
    if not isinstance(details, dict) or not details.get("spec_verify_ct"):
        return None
    names = SGLANG_FIELDS | {"per_position": SGLANG_FIELDS["histogram"] + " (accepted per position)"}
    steps = whole(details["spec_verify_ct"], names["steps"])
    proposed = whole(details["spec_num_proposed_drafts"], names["drafted"])
    if proposed % steps:
        raise ImpossibleCounts(f"{names['drafted']} {proposed} is not a whole number of drafts per verify step over "
                               f"{steps} steps ({names['steps']})")
    counts = _from_histogram(details.get("spec_correct_drafts_histogram") or [], proposed // steps, proposed, names)
    accepted = whole(details["spec_num_correct_drafts"], names["accepted"])
    if (counts.steps, counts.accepted) != (steps, accepted):
        raise ImpossibleCounts(f"{names['histogram']} counts {counts.steps} verify steps accepting {counts.accepted} "
                               f"draft tokens, {names['steps']} {steps} and {names['accepted']} {accepted}")
    return check_counts(counts, names, tokens=tokens)


@dataclass
class ServerCounters:
    """The server-wide figures of one /metrics reading, summed over every label set."""

    spec: SpecCounts | None  # None: no spec-decode counter exposed (the server does not speculate)
    requests_done: float
    in_flight: float


def parse_metrics(text: str) -> ServerCounters:
    """vLLM's Prometheus exposition, its counters summed over every label set (engine, model, position)."""
    totals: dict[str, float] = {}
    per_position: dict[int, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        name, value = match["name"], float(match["value"])
        if name == PER_POSITION:
            labels = dict(_LABEL.findall(match["labels"] or ""))
            position = int(labels.get("position", 0))
            per_position[position] = per_position.get(position, 0.0) + value
        else:
            totals[name] = totals.get(name, 0.0) + value
    spec = None
    if all(name in totals for name in SPEC_COUNTERS):
        named = {ours: whole(totals[name], name) for name, ours in SPEC_COUNTERS.items()}
        width = max(per_position, default=-1) + 1
        spec = SpecCounts(named["drafts"], named["drafted"], named["accepted"],
                          [whole(per_position.get(k, 0), f"{PER_POSITION}{{position=\"{k}\"}}") for k in range(width)],
                          None)
    return ServerCounters(spec, totals.get(REQUESTS_DONE, 0.0), sum(totals.get(n, 0.0) for n in IN_FLIGHT))


def counter_delta(before: ServerCounters, after: ServerCounters) -> SpecCounts:
    """What the spec-decode counters moved by between two readings (both have them)."""
    a, b = after.spec, before.spec
    return SpecCounts(a.steps - b.steps, a.drafted - b.drafted, a.accepted - b.accepted,
                      [x - (b.per_position[k] if k < len(b.per_position) else 0) for k, x in enumerate(a.per_position)],
                      None, len(a.per_position) or None)


COUNTER_FIELDS = {ours: f"the delta of {name}" for name, ours in SPEC_COUNTERS.items()} | {
    "steps": "the delta of vllm:spec_decode_num_drafts_total", "per_position": f"the delta of {PER_POSITION}",
    "width": f"the positions {PER_POSITION} lists", "tokens": "the answers' usage.completion_tokens summed"}


def foreign_traffic(before: ServerCounters, after: ServerCounters, ours: int) -> str | None:
    """Why the counters' deltas may hold other requests than ours (None: they are ours alone)."""
    done = after.requests_done - before.requests_done
    if before.in_flight or after.in_flight:
        return (f"{before.in_flight:g} request(s) were running or waiting on the server before the run and "
                f"{after.in_flight:g} after it")
    if round(done) != ours:
        return f"{REQUESTS_DONE} moved by {done:g} while this run sent {ours} request(s)"
    return None
