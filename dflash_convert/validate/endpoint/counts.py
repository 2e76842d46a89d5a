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


@dataclass
class SpecCounts:
    """Speculative decoding counts of some requests: verify steps, drafts proposed and accepted, accepted per
    draft position, and (per request only) the steps by drafts accepted."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    per_position: list[int] = field(default_factory=list)
    histogram: list[int] | None = field(default_factory=list)  # None: not known (counters)

    def __add__(self, other: "SpecCounts") -> "SpecCounts":
        hist = None if self.histogram is None or other.histogram is None else _sum(self.histogram, other.histogram)
        return SpecCounts(self.steps + other.steps, self.drafted + other.drafted, self.accepted + other.accepted,
                          _sum(self.per_position, other.per_position), hist)

    @property
    def tau(self) -> float:
        """vLLM's counting: 1 + accepted drafts per verify step."""
        return round(1 + self.accepted / self.steps, 4) if self.steps else 1.0

    @property
    def rates(self) -> list[float]:
        return [round(a / self.steps, 4) if self.steps else 0.0 for a in self.per_position]


def _sum(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def _from_histogram(histogram: list[int], width: int, drafted: int) -> SpecCounts:
    """Counts of steps that accepted j drafts (histogram[j]), over `width` draft positions."""
    hist = [int(h) for h in histogram] + [0] * max(width + 1 - len(histogram), 0)
    per_position = [sum(hist[k + 1:]) for k in range(width)]
    return SpecCounts(steps=sum(hist), drafted=int(drafted), accepted=sum(j * h for j, h in enumerate(hist)),
                      per_position=per_position, histogram=hist)


def vllm_request_counts(body: dict[str, Any]) -> SpecCounts | None:
    """vLLM's per-request statistics of one response (None: the response has none)."""
    spec = ((body.get("metrics") or {}) if isinstance(body, dict) else {}).get("speculative_decoding")
    if not isinstance(spec, dict):
        return None
    counts = _from_histogram(spec["acceptance_histogram"], int(spec["num_spec_tokens"]), spec["num_draft_tokens"])
    if counts.steps != int(spec["num_spec_steps"]) or counts.accepted != int(spec["num_accepted_draft_tokens"]):
        raise ValueError("metrics.speculative_decoding: the histogram disagrees with num_spec_steps / "
                         "num_accepted_draft_tokens")
    return counts


def vllm_request_steps(body: dict[str, Any]) -> list[int] | None:
    """The draft tokens accepted at each verify step of one response, in order: vLLM's `per_step_accepted`
    (--per-request-spec-decode-metrics detailed); None where it is absent or disagrees with the histogram."""
    spec = ((body.get("metrics") or {}) if isinstance(body, dict) else {}).get("speculative_decoding")
    steps = spec.get("per_step_accepted") if isinstance(spec, dict) else None
    if not isinstance(steps, list) or not all(type(a) is int and a >= 0 for a in steps):
        return None
    counts = vllm_request_counts(body)
    return steps if (len(steps), sum(steps)) == (counts.steps, counts.accepted) else None


def sglang_request_counts(body: dict[str, Any]) -> SpecCounts | None:
    """SGLang's per-request statistics of one response (None: the response has none)."""
    details = ((body.get("sglext") or {}) if isinstance(body, dict) else {}).get("spec_tokens_details")
    if isinstance(details, list):  # one per choice; the tool asks for one choice
        details = details[0] if details else None
    if not isinstance(details, dict) or not int(details.get("spec_verify_ct") or 0):
        return None
    steps, proposed = int(details["spec_verify_ct"]), int(details["spec_num_proposed_drafts"])
    counts = _from_histogram(details.get("spec_correct_drafts_histogram") or [], proposed // steps, proposed)
    if counts.steps != steps or counts.accepted != int(details["spec_num_correct_drafts"]):
        raise ValueError("sglext.spec_tokens_details: the histogram disagrees with spec_verify_ct / "
                         "spec_num_correct_drafts")
    return counts


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
        named = {ours: int(totals[name]) for name, ours in SPEC_COUNTERS.items()}
        width = max(per_position, default=-1) + 1
        spec = SpecCounts(named["drafts"], named["drafted"], named["accepted"],
                          [int(per_position.get(k, 0)) for k in range(width)], None)
    return ServerCounters(spec, totals.get(REQUESTS_DONE, 0.0), sum(totals.get(n, 0.0) for n in IN_FLIGHT))


def counter_delta(before: ServerCounters, after: ServerCounters) -> SpecCounts:
    """What the spec-decode counters moved by between two readings (both have them)."""
    a, b = after.spec, before.spec
    return SpecCounts(a.steps - b.steps, a.drafted - b.drafted, a.accepted - b.accepted,
                      [x - (b.per_position[k] if k < len(b.per_position) else 0) for k, x in enumerate(a.per_position)],
                      None)


def foreign_traffic(before: ServerCounters, after: ServerCounters, ours: int) -> str | None:
    """Why the counters' deltas may hold other requests than ours (None: they are ours alone)."""
    done = after.requests_done - before.requests_done
    if before.in_flight or after.in_flight:
        return (f"{before.in_flight:g} request(s) were running or waiting on the server before the run and "
                f"{after.in_flight:g} after it")
    if round(done) != ours:
        return f"{REQUESTS_DONE} moved by {done:g} while this run sent {ours} request(s)"
    return None
