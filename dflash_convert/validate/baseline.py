"""The regression gate (`validate --baseline PREVIOUS.json [--max-regression X]`): this run's acceptance
against an earlier `validate --json` report of the same prompts and settings.

Same prompts and settings, checked before any decoding: the token ids of every prompt (a SHA-256 of
them, `acceptance.prompt_ids_sha256`), the number of prompts, block size, max new tokens, the resolved
sampling (temperature, top-k, top-p, min-p, the three penalties, stop ids) and the draft sampling. A
difference is one error naming it (exit 1): the figures of different runs say nothing about a regression.

The figures compared, in each report, are the most engine-like it holds: the real engine's own counters
(`engine_run.counts`), else the emulation counted as vLLM counts (`acceptance.vllm_counting`), else the
emulation's own figures; so an engine run can be gated on an emulation report and the reverse.

The rule, from the counts alone (n draft steps in each run):
- position k: the rate is a share of n steps; a drop b - c counts when it exceeds
  z * sqrt(b~(1 - b~)/(n_b + 2) + c~(1 - c~)/(n_c + 2)) + X * b, with b~ = (accepted + 1)/(n + 2) (the
  Agresti-Caffo interval: finite at rates of 0 or 1);
- tau: 1 + mean accepted per step; accepted a per step has variance sum_k (2k + 1) r_k - (sum_k r_k)^2
  (a >= k + 1 with probability r_k, 0-based k; the adjusted rates used), so the bound is
  z * sqrt(var_b/n_b + var_c/n_c) + X * tau_b;
- z: one-sided, family error ALPHA over tau and every position (Bonferroni): z = Phi^-1(1 - ALPHA/m).
Steps of one prompt are not independent (a hard prompt lowers all of its steps), so the bound is a
floor on the noise, not its exact size; X adds a tolerance the team chooses. Rises never fail.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from statistics import NormalDist
from typing import Any

from pydantic import ValidationError

from dflash_convert.errors import DFlashError
from dflash_convert.io.reading import read_json
from dflash_convert.validate.static import Check, make_check
from dflash_convert.validate.report import BaselineComparison, ValidationReport

ALPHA = 0.01  # the chance that a run equal to its baseline fails the gate by noise alone
SAMPLING_KEYS = ("temperature", "top_k", "top_p", "min_p", "repetition_penalty", "presence_penalty",
                 "frequency_penalty", "stop_token_ids")


def prompt_ids_sha256(prompt_ids: list[list[int]]) -> str:
    return hashlib.sha256(json.dumps(prompt_ids, separators=(",", ":")).encode()).hexdigest()


def load_baseline(path: str | Path) -> ValidationReport:
    """An earlier `validate --json` report with end-to-end figures, or one error naming the file."""
    raw = read_json(Path(path))
    try:
        report = ValidationReport.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise DFlashError(f"not a `validate --json` report: field `{where}`: {first['msg']}", file=path) from None
    if report.acceptance is None and report.endpoint is None:
        raise DFlashError("the baseline report has no end-to-end figures (its run did not decode): nothing to "
                          "compare with", file=path)
    return report


def settings(acceptance) -> dict[str, Any]:
    """What must be equal for two runs' figures to be comparable (from a report's acceptance section)."""
    s = acceptance.sampling
    out = {"prompt token ids (SHA-256)": acceptance.prompt_ids_sha256, "prompts": acceptance.prompts,
           "block size": acceptance.block_size, "max new tokens": acceptance.max_new_tokens,
           "draft sampling": acceptance.draft_sampling}
    for key in SAMPLING_KEYS:
        out[key] = getattr(s, key) if s is not None else None
    return out


def check_same_settings(baseline: ValidationReport, path: str | Path, current: dict[str, Any]) -> None:
    """Raise DFlashError naming every setting that differs (a baseline without a prompt hash: prompts
    compared by number and lengths, see `current`)."""
    theirs = settings(baseline.acceptance)
    if theirs["prompt token ids (SHA-256)"] is None:  # a report from before the hash: lengths stand in
        theirs["prompt token ids (SHA-256)"] = current["prompt token ids (SHA-256)"]
        theirs["prompt lengths"] = [p.prompt_tokens for p in baseline.acceptance.per_prompt]
    else:
        current = {k: v for k, v in current.items() if k != "prompt lengths"}
    differ = [f"{k}: {_short(theirs[k])} there, {_short(current.get(k))} here" for k in theirs
              if theirs[k] != current.get(k)]
    if differ:
        raise DFlashError("the baseline ran other prompts or settings, its figures cannot gate this run: "
                          + "; ".join(differ), file=path)


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else value
    return text if len(text) <= 40 else text[:16] + "..." + text[-8:]


def figures(report: ValidationReport) -> tuple[str, int, float, list[float]]:
    """(what was counted, draft steps, tau, per-position rates): the most engine-like figures of a report."""
    if report.endpoint is not None:
        e = report.endpoint
        return f"the endpoint's {e.engine} counts ({e.counted.split(',')[0]})", e.counts.num_drafts, \
            e.counts.acceptance_length, list(e.counts.per_position_rates)
    if report.engine_run is not None:
        c = report.engine_run.counts
        return f"{report.engine_run.engine} {report.engine_run.version}'s own counters", c.num_drafts, \
            c.acceptance_length, list(c.per_position_rates)
    a = report.acceptance
    if a.vllm_counting is not None:
        c = a.vllm_counting
        return "the emulation, counted as vLLM counts", c.num_drafts, c.acceptance_length, list(c.per_position_rates)
    return "the emulation", a.num_drafts, a.acceptance_length, list(a.per_position_rates)


def _adjusted(rate: float, n: int) -> float:
    return (round(rate * n) + 1) / (n + 2)


def _tau_variance(rates: list[float], n: int) -> float:
    r = [_adjusted(x, n) for x in rates]
    return max(sum((2 * k + 1) * x for k, x in enumerate(r)) - sum(r) ** 2, 0.0)


def compare(baseline: ValidationReport, path: str | Path, current: ValidationReport, max_regression: float = 0.0
            ) -> tuple[Check, BaselineComparison]:
    """The `regression` check of `current` against `baseline` (settings already checked equal; an endpoint run's
    checked here: the same requests, as sent, in both)."""
    if current.endpoint is not None:
        _same_requests(baseline, path, current)
    was_what, n_b, tau_b, rates_b = figures(baseline)
    now_what, n_c, tau_c, rates_c = figures(current)
    m = len(rates_b) + 1
    z = NormalDist().inv_cdf(1 - ALPHA / m)
    x = max_regression
    spread = _tau_variance(rates_b, n_b) / max(n_b, 1) + _tau_variance(rates_c, n_c) / max(n_c, 1)
    tau_allowed = z * math.sqrt(spread) + x * tau_b
    allowed = []
    for b, c in zip(rates_b, rates_c):
        pb, pc = _adjusted(b, n_b), _adjusted(c, n_c)
        allowed.append(z * math.sqrt(pb * (1 - pb) / (n_b + 2) + pc * (1 - pc) / (n_c + 2)) + x * b)
    low = []
    if tau_b - tau_c > tau_allowed:
        low.append(f"tau {tau_c:.3f} < {tau_b:.3f} by {tau_b - tau_c:.3f} (allowed {tau_allowed:.3f})")
    low += [f"position {k + 1}: {c:.3f} < {b:.3f} by {b - c:.3f} (allowed {a:.3f})"
            for k, (b, c, a) in enumerate(zip(rates_b, rates_c, allowed)) if b - c > a]
    rule = (f"a drop fails beyond z = {z:.2f} standard errors from the counts (one-sided, {ALPHA:g} over tau and "
            f"{m - 1} positions, Bonferroni) + {x:g} x the baseline value")
    comparison = BaselineComparison(
        path=str(path), created_at=baseline.created_at, tool_version=baseline.tool_version, baseline_counted=was_what,
        counted=now_what, baseline_num_drafts=n_b, num_drafts=n_c, baseline_tau=tau_b, tau=tau_c,
        tau_allowed_drop=round(tau_allowed, 4), baseline_rates=rates_b, rates=rates_c,
        rates_allowed_drop=[round(a, 4) for a in allowed], z=round(z, 4), max_regression=x, rule=rule,
        regressed=low)
    message = (f"tau {tau_c:.3f} vs {tau_b:.3f} in {path} ({now_what} vs {was_what}; {n_c} vs {n_b} draft steps): "
               + ("; ".join(low) if low else "no drop beyond what the counts explain") + f"; {rule}")
    check = make_check("regression", not low, message, value=round(tau_c, 4), threshold=round(tau_b - tau_allowed, 4),
                   level="end_to_end")
    return check, comparison


def _same_requests(baseline: ValidationReport, path: str | Path, current: ValidationReport) -> None:
    """An endpoint run is gated only on an endpoint report of the same requests (prompts, max tokens, sampling)."""
    if baseline.endpoint is None:
        raise DFlashError("the baseline has no --endpoint figures: an endpoint run is compared with an earlier "
                          "endpoint run of the same prompts and settings", file=path)
    theirs, ours = baseline.endpoint, current.endpoint
    if theirs.prompts_sha256 != ours.prompts_sha256:
        raise DFlashError("the baseline's endpoint run sent other requests (prompts, max tokens or sampling: "
                          f"{theirs.prompts} prompts, max {theirs.max_tokens} tokens, {_short(theirs.sampling)} there; "
                          f"{ours.prompts}, {ours.max_tokens}, {_short(ours.sampling)} here): its figures cannot gate "
                          "this run", file=path)
