"""The served level: the pair run in real vLLM (`validate --engine vllm --engine-python PATH`), and its
figures checked against our emulation of vLLM.

vLLM runs in a child process with the interpreter at PATH (the environment where it is installed),
running vllm_driver.py (standard library + vLLM only) that talks JSON. The child has its own process
group and its own KV-cache size; a timeout, Ctrl-C or a stop signal kills the whole group.

vLLM counts acceptance over full blocks: it always drafts block - 1 tokens and counts acceptances past
max_tokens, where our loop shortens the last block. Its figures are compared with the emulation
counted the same way (`full_last_block`).

Greedy, the outputs: equal, or differing first at a near-tie. vLLM's target-only run takes each token from a
one-token decode, its speculative run from a row of a verify block: two computations of the same function, whose
kernels round differently. Both runs report their processed logits (vLLM's rejection sampler reports the rows
its tokens came from), so where the two outputs part, the parting is judged by the noise measured between
vLLM's own two computations there (validate.partings.PathParting, the rule the runtime's greedy_output_equal
applies to its own two paths): a near-tie where the gap of the two tokens in the target-only run is within how
far the speculative run's computation moved it, plus a margin; paths that moved a logit beyond rounding give
no verdict (exit 1). Where vLLM's target-only output parts from our target's greedy output, the second
computation is our target's one-token decode at the same prefix (`ours_top`, when the caller measured it).
Under both rules lies a floor: a gap within TIE_ULPS units in the last place (of the dtype vLLM served in) is a
near-tie with nothing measured (seen with vLLM 0.32 CPU in bf16, where a repetition penalty brought a penalized
and an unpenalized logit within one ulp); nothing wider passes unmeasured.

Greedy, the counts: step by step, where they are defined (`compare_steps`). vLLM lists each request's accepted
count per verify step; the emulation records how near each of its decisions sat to another outcome
(dflash_runtime.ties). Each prompt is compared step by step, exactly, up to its first step whose decision sat
within the tie bound of another outcome: the largest logit move measured between vLLM's two computations of the
target's rows (`measured_noise`: its target-only and speculative runs' logits over each prompt's common prefix),
never less than ACCEPTANCE_TIE_ULPS ulps of the coarser of the two runs' dtypes (the floor, also the bound where
nothing was measured) and never more than rounding's cap (validate.partings). There, other kernels may
take the other outcome, and every later step of that prompt follows from it. Any difference before that is the
draft served otherwise than emulated; the steps after are not compared, and the check says how many. A fixed
tolerance on the totals held on one machine's kernels and failed on another's (low-confidence drafts, penalized
runs: a different number of near-ties broken the other way); this holds on any.

Sampled (each prompt seeded, vLLM's random stream is not ours): within an interval derived from the counts
(`sampled_tolerance`): tau AND every per-position rate.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist
from typing import Any, Callable

from dflash_convert.errors import DFlashError, Interrupted, UsageError
from dflash_convert.io.staging import STOP_SIGNALS
from dflash_convert.validate.partings import (MANTISSA_BITS, MARGIN_ULPS, NOISE_CAP_RELATIVE, NOISE_CAP_ULPS,
                                              PathParting, binade, ulp)
from dflash_convert.validate.static import Check, first_difference, make_check
from dflash_convert.validate.report import AcceptanceCounts, EngineStats, StepDecisions

DRIVER = Path(__file__).with_name("vllm_driver.py")
ENGINE_TAU_TOLERANCE = 0.02  # sampled: the least tolerance on tau, relative (near-ties move counts too)
ENGINE_RATE_TOLERANCE = 0.02  # sampled: the least tolerance per draft position, absolute
SAMPLED_ALPHA = 0.01  # sampled: chance that agreeing runs fail the check, split over tau and the positions
LOG_TAIL = 2000  # characters of the engine's stderr kept for an error message
# greedy outputs: the floor: a token within this many units in the last place of the top logit is a near-tie even
# where no second computation was measured (above it, only the measured noise makes a near-tie)
TIE_ULPS = 2
# greedy counts: the floor of the tie bound: a decision within this many ulps of another outcome is a near-tie
# whatever was measured. More than for the outputs: the draft's logits come through layers whose kernels differ
# between engines, not from the target's last row.
ACCEPTANCE_TIE_ULPS = 4


@dataclass
class EngineRequest:
    """What vLLM is asked to run: one target, the prompts, one or more drafts (tests batch them)."""

    target: Path
    prompts: list[list[int]]
    max_tokens: int
    stop_token_ids: list[int]
    drafts: list[dict[str, Any]]  # {"draft": DIR, "num_speculative_tokens": K, "mixed_layer_types": bool}
    engine_args: dict[str, Any]
    sampling: dict[str, Any] | None = None  # SamplingParams fields + "seed" (prompt i: seed + i); None: greedy


def engine_sampling(used, seed: int) -> dict[str, Any] | None:
    """The engine's SamplingParams fields for the run's resolved sampling (None: greedy without penalties),
    and the seed of prompt 0 (prompt i: seed + i). Penalties go to vLLM under greedy too: it applies a
    model's penalties to greedy requests, and so does this run."""
    from dflash_convert.validate.sampling import PENALTY_FIELDS, VLLM_DEFAULTS

    penalties = {k: getattr(used, k) for k in PENALTY_FIELDS
                 if getattr(used, k) is not None and getattr(used, k) != VLLM_DEFAULTS[k]}
    if used.temperature <= 0:
        return {"temperature": 0.0, **penalties} if penalties else None
    return {"temperature": used.temperature, "top_k": used.top_k, "top_p": used.top_p, "min_p": used.min_p,
            **penalties, "seed": seed}


def engine_python(spec: str) -> str:
    """The interpreter `--engine-python` names: `self` is the current one."""
    if spec == "self":
        return sys.executable
    path = Path(spec).expanduser()
    if not (path.is_file() and os.access(path, os.X_OK)):
        raise UsageError(f"--engine-python {spec}: not an executable file (a Python interpreter with vLLM installed, "
                         "or `self`)")
    return str(path)


def run_vllm(request: EngineRequest, *, python: str, timeout_s: float, kv_cache_gib: float,
             say: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """The driver's JSON answer (see vllm_driver.py). Raises DFlashError when the engine cannot be run
    or gives no answer in `timeout_s` seconds, Interrupted on a stop signal (the child group killed)."""
    body = json.dumps({"target": str(Path(request.target).resolve()), "prompts": request.prompts,
                       "max_tokens": request.max_tokens, "stop_token_ids": request.stop_token_ids,
                       "engine_args": request.engine_args, "sampling": request.sampling,
                       "drafts": [{**d, "draft": str(Path(d["draft"]).resolve())} for d in request.drafts]})
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=f"{kv_cache_gib:g}", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    say(f"engine: vLLM at {python} ({len(request.drafts)} draft(s), {len(request.prompts)} prompts, "
        f"timeout {timeout_s:g} s)")
    try:
        proc = subprocess.Popen([python, str(DRIVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=env, text=True, start_new_session=True)
    except OSError as exc:
        raise DFlashError(f"cannot start {python}: {exc.strerror or exc}") from None
    previous = _on_stop_signals(proc)
    try:
        out, err = proc.communicate(body, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise DFlashError(f"vLLM gave no answer within {timeout_s:g} s (--engine-timeout); its process group was "
                          "killed") from None
    except BaseException:
        _kill(proc)
        raise
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    try:
        answer = json.loads(out.strip().splitlines()[-1]) if out.strip() else None
    except json.JSONDecodeError:
        answer = None
    if not isinstance(answer, dict):
        tail = err.strip()[-LOG_TAIL:].splitlines()
        raise DFlashError(f"vLLM at {python} exited {proc.returncode} without an answer"
                          + (f": {tail[-1]}" if tail else ""))
    if "error" in answer and "drafts" not in answer:
        raise DFlashError(f"vLLM at {python}: {answer['error']}")
    return answer


def _on_stop_signals(proc: subprocess.Popen) -> dict:
    """Stop signals kill the child's group, then end this run (Ctrl-C reaches only us: the child has its
    own session). Returns the handlers to restore."""
    def on_signal(signum, frame):  # noqa: ARG001
        _kill(proc)
        raise Interrupted(f"interrupted by {signal.Signals(signum).name}; the vLLM engine was stopped")

    previous = {}
    for sig in STOP_SIGNALS:
        try:
            if signal.getsignal(sig) != signal.SIG_IGN:
                previous[sig] = signal.signal(sig, on_signal)
        except (ValueError, OSError):  # not the main thread: the caller's handlers stay
            break
    return previous


def _kill(proc: subprocess.Popen) -> None:
    """SIGTERM to the child's process group, SIGKILL after a grace period."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        try:
            proc.wait(timeout=wait)
            break
        except subprocess.TimeoutExpired:
            continue
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()


def engine_counts(run: dict[str, Any]) -> AcceptanceCounts:
    """vLLM's counters as tau and per-position rates."""
    num, accepted = run["num_drafts"], run["num_accepted_tokens"]
    return AcceptanceCounts(num_drafts=num, accepted=accepted, drafted=run["num_draft_tokens"],
                            acceptance_length=round(1 + accepted / num, 4) if num else 1.0,
                            per_position_rates=[round(a / num, 4) if num else 0.0
                                                for a in run["num_accepted_tokens_per_pos"]])


def _length_variance(rates: list[float]) -> float:
    """Variance of the accepted length of one draft, from the per-position rates: P(L >= k) = rate k, so
    E[L] = sum rate_k and E[L^2] = sum (2k - 1) rate_k (k from 1)."""
    mean = sum(rates)
    return max(sum((2 * k + 1) * r for k, r in enumerate(rates)) - mean * mean, 0.0)


def sampled_tolerance(engine: AcceptanceCounts, emulated: AcceptanceCounts) -> tuple[float, list[float], float]:
    """(tau tolerance, per-position tolerances, z) for two sampled runs of the same prompts: z standard errors
    of the difference, z two-sided at SAMPLED_ALPHA split (Bonferroni) over tau and the K positions. A position:
    two proportions over the runs' draft counts (pooled rate). Tau: the accepted length's variance from each
    run's rates over its drafts. Drafts are taken as independent (those of one prompt are not quite), and each
    tolerance is at least the greedy one (near-ties)."""
    k = max(len(engine.per_position_rates), len(emulated.per_position_rates), 1)
    z = NormalDist().inv_cdf(1 - SAMPLED_ALPHA / (2 * (k + 1)))
    n_e, n_m = max(engine.num_drafts, 1), max(emulated.num_drafts, 1)
    rates = []
    for r_e, r_m in zip(engine.per_position_rates, emulated.per_position_rates):
        pooled = (r_e * n_e + r_m * n_m) / (n_e + n_m)
        rates.append(round(max(z * math.sqrt(pooled * (1 - pooled) * (1 / n_e + 1 / n_m)), ENGINE_RATE_TOLERANCE), 4))
    se_tau = math.sqrt(_length_variance(engine.per_position_rates) / n_e +
                       _length_variance(emulated.per_position_rates) / n_m)
    tau = round(max(z * se_tau, ENGINE_TAU_TOLERANCE * emulated.acceptance_length), 4)
    return tau, rates, round(z, 3)


def sampled_agreement(counts: AcceptanceCounts, emulated: AcceptanceCounts) -> tuple[bool, str, dict]:
    """Whether a sampled run's figures agree with the emulation's: tau AND every position within the interval from
    the counts (a draft whose acceptance moved between positions at the same tau disagrees)."""
    tau_gap = abs(counts.acceptance_length - emulated.acceptance_length)
    gaps = [abs(a - b) for a, b in zip(counts.per_position_rates, emulated.per_position_rates)]
    tau_tol, rate_tols, z = sampled_tolerance(counts, emulated)
    rule = (f"sampled, so a tolerance from the counts: {z:g} standard errors of each difference (two-sided "
            f"{SAMPLED_ALPHA:g} over tau and {len(rate_tols)} positions; drafts taken as independent): tau within "
            f"{tau_tol:.3f}, positions within {min(rate_tols, default=0):.3f}..{max(rate_tols, default=0):.3f}")
    off = [k for k, (g, t) in enumerate(zip(gaps, rate_tols)) if g > t + 1e-9]
    agrees = (tau_gap <= tau_tol + 1e-9 and not off
              and len(counts.per_position_rates) == len(emulated.per_position_rates))
    detail = (f"tau gap {tau_gap:.3f}; largest per-position gap {max(gaps, default=0.0):.3f}"
              + (f"; outside at position(s) {', '.join(str(k + 1) for k in off)}" if off else "")
              + f" (tolerance, {rule})")
    return agrees, detail, {"mode": "sampled", "tau": round(tau_tol, 4), "per_position": rate_tols, "z": z}


def acceptance_tie(dtypes: list[str], measured: float | None = None) -> tuple[float, str]:
    """(the tie bound in dflash_runtime.ties' relative units, the dtype its ulps are of): the coarsest of `dtypes`
    (the runs' dtypes), bfloat16 for one not known. The bound is the `measured` noise (relative units, see
    measured_noise), at least ACCEPTANCE_TIE_ULPS ulps (the floor; the bound where nothing was measured) and at
    most rounding's cap (validate.partings: larger moves are not rounding, and must not widen the bound)."""
    dtype = min(dtypes, key=lambda d: MANTISSA_BITS.get(d, MANTISSA_BITS["bfloat16"]))
    bits = MANTISSA_BITS.get(dtype, MANTISSA_BITS["bfloat16"])
    floor = ACCEPTANCE_TIE_ULPS * 2.0 ** -bits
    cap = max(NOISE_CAP_ULPS * 2.0 ** -bits, NOISE_CAP_RELATIVE)
    gap = floor if measured is None else max(floor, min(measured, cap))
    return gap, dtype if dtype in MANTISSA_BITS else "bfloat16"


def measured_noise(base: list[list[int]], base_top: list | None, spec: list[list[int]], spec_top: list | None
                   ) -> float | None:
    """The largest move of a logit between vLLM's two computations of the target, in dflash_runtime.ties'
    relative units (over the binade of the row's largest logit): the target-only run's reported logits
    (`base_top`, per prompt, per token, {token id: logit}) against the speculative run's (`spec_top`) at each
    token both outputs share with all the tokens before it (the same prefix, so the same function), over the
    token ids both report. None: nothing measured (a run without logits, or no shared row)."""
    largest = None
    for b_out, s_out, b_rows, s_rows in zip(base, spec, base_top or [], spec_top or []):
        if not b_rows or not s_rows:
            continue
        same = next((k for k, (x, y) in enumerate(zip(b_out, s_out)) if x != y), min(len(b_out), len(s_out)))
        for b_row, s_row in zip(b_rows[:same], s_rows[:same]):
            if not b_row or not s_row:  # a row not reported
                continue
            shared = [t for t in b_row if t in s_row]
            if not shared:
                continue
            scale = binade(max(b_row.values()))
            move = max(abs(b_row[t] - s_row[t]) for t in shared) / scale
            largest = move if largest is None else max(largest, move)
    return largest


@dataclass
class StepComparison:
    """vLLM's accepted counts per verify step against the emulation's, where they are defined."""

    compared: int = 0  # verify steps compared, exactly
    whole: int = 0  # prompts compared to their last step
    stops: list[str] = field(default_factory=list)  # "prompt P step S": where a prompt's comparison stopped at a tie
    uncompared: int = 0  # emulated steps at or after those
    difference: str | None = None  # the first difference, named


def _near(margin: float | None, gap: float) -> bool:
    return margin is not None and margin <= gap


def defined_until(ours: StepDecisions, gap: float) -> int | None:
    """How many of a prompt's verify steps another engine must count as the emulation did: up to its first
    decision within `gap` of another outcome (dflash_runtime.ties' units; a tie in the count: that step is not
    defined; in a committed token: the steps after it are not). None: every step is defined."""
    for s, (margin, committed) in enumerate(zip(ours.margin, ours.next_margin)):
        if _near(margin, gap):
            return s
        if _near(committed, gap):
            return s + 1
    return None


def compare_steps(engine_steps: list[list[int] | None], emulated: list[StepDecisions], gap: float,
                  dtype: str) -> StepComparison:
    """Each prompt step by step, exactly, over the steps `defined_until` says are defined."""
    out = StepComparison()
    ulp = 2.0 ** -MANTISSA_BITS.get(dtype, MANTISSA_BITS["bfloat16"])
    for i, (vllm, ours) in enumerate(zip(engine_steps, emulated), 1):
        n, stop = len(ours.accepted), defined_until(ours, gap)
        served = vllm or []
        differs = next((s for s in range(n if stop is None else stop)
                        if s >= len(served) or served[s] != ours.accepted[s]), None)
        if differs is not None:
            margin = ours.margin[differs]
            out.difference = out.difference or (
                f"prompt {i}, verify step {differs + 1}: vLLM accepted "
                + ("nothing (it ran fewer steps)" if differs >= len(served) else f"{served[differs]} proposal(s)")
                + f", the emulation {ours.accepted[differs]}, at a decision "
                + ("with no other token near" if margin is None else
                   f"{margin / ulp:.0f} {dtype} ulps from another outcome"))
            out.compared += differs
        elif stop is not None:
            out.compared += stop
            out.stops.append(f"prompt {i} step {stop + 1}")
            out.uncompared += n - stop
        elif len(served) != n:
            out.compared += n
            out.difference = out.difference or f"prompt {i}: vLLM ran {len(served)} verify steps, the emulation {n}"
        else:
            out.compared += n
            out.whole += 1
    return out


def totals_interval(steps: list[StepDecisions], gap: float, proposals: int, max_new_tokens: int
                    ) -> tuple[tuple[int, int], tuple[int, int]]:
    """((least, most) verify steps, (least, most) accepted tokens) another engine's totals can have, from the
    emulation's steps: equal over the steps `defined_until` says are defined; after them, any decoding of what is
    left of the prompt's `max_new_tokens` (each step commits 1 to proposals + 1 tokens, and counts at most
    `proposals` acceptances past the end)."""
    steps_lo = steps_hi = acc_lo = acc_hi = 0
    for ours in steps:
        stop = defined_until(ours, gap)
        fixed = ours.accepted if stop is None else ours.accepted[:stop]
        fixed_steps, fixed_acc = len(fixed), sum(fixed)
        left = max_new_tokens - fixed_acc - fixed_steps - 1  # tokens after the fixed steps (the first came at prefill)
        steps_lo, steps_hi = steps_lo + fixed_steps, steps_hi + fixed_steps
        acc_lo, acc_hi = acc_lo + fixed_acc, acc_hi + fixed_acc
        if stop is not None and stop < len(ours.accepted) and left > 0:
            steps_lo, steps_hi = steps_lo + 1, steps_hi + left
            acc_hi += left - 1 + proposals
    return (steps_lo, steps_hi), (acc_lo, acc_hi)


def tie_rule(gap: float, dtype: str, measured: float | None) -> str:
    """The tie bound in words, with the figure measured (or that nothing was)."""
    units = gap * 2.0 ** MANTISSA_BITS.get(dtype, MANTISSA_BITS["bfloat16"])
    why = ("no logit move measured between vLLM's target-only and speculative runs: the floor" if measured is None
           else f"the largest logit move measured between vLLM's target-only and speculative runs "
                f"{measured:.3g} of the row's binade = {measured * units / gap:.1f} ulps, floor "
                f"{ACCEPTANCE_TIE_ULPS} ulps, cap rounding's")
    return (f"each prompt step by step up to its first decision within {units:.3g} {dtype} ulps ({why}) of another "
            "outcome, where other kernels may decide otherwise")


def greedy_agreement(run: dict[str, Any], counts: AcceptanceCounts, emulated: AcceptanceCounts,
                     steps: list[StepDecisions] | None, dtypes: list[str], max_new_tokens: int | None = None,
                     measured: float | None = None) -> tuple[bool | None, str, dict]:
    """Whether a greedy run's counts agree with the emulation's, step by step where they are defined
    (compare_steps); without the engine's steps, its totals within what the emulation's near-ties let them move
    (totals_interval, given `max_new_tokens`). None (a warning, no verdict) where nothing could be compared.
    `measured`: the noise measured between vLLM's two computations of the target (measured_noise), by which the
    tie bound widens past its floor (acceptance_tie)."""
    gap, dtype = acceptance_tie(dtypes, measured)
    rule = tie_rule(gap, dtype, measured)
    tolerance = {"mode": "greedy", "tie_ulps": round(gap * 2.0 ** MANTISSA_BITS.get(dtype, 7), 3), "dtype": dtype,
                 "measured_noise": None if measured is None else round(measured, 6)}
    engine_steps = run.get("steps")
    if steps is None or engine_steps is None:
        ties = 0 if steps is None else sum(_near(m, gap) or _near(n, gap) for p in steps
                                           for m, n in zip(p.margin, p.next_margin))
        if steps is not None and not ties:  # nothing near a tie: the totals are defined and must be equal
            same = counts == emulated
            return same, ("no decision sat near a tie, so the counts must be equal: "
                          + ("they are" if same else "they differ")), {**tolerance, "compared": "totals"}
        if steps is not None and max_new_tokens is not None:
            (s_lo, s_hi), (a_lo, a_hi) = totals_interval(steps, gap, len(emulated.per_position_rates),
                                                         max_new_tokens)
            inside = s_lo <= counts.num_drafts <= s_hi and a_lo <= counts.accepted <= a_hi
            return inside, (f"{ties} decision(s) sat near a tie, after which a prompt may decode otherwise; the "
                            f"totals can then be {s_lo}..{s_hi} verify steps and {a_lo}..{a_hi} accepted tokens: "
                            + ("they are" if inside else f"{counts.num_drafts} steps and {counts.accepted} accepted "
                               "are not")), {**tolerance, "compared": "totals within the ties' reach",
                                             "steps": [s_lo, s_hi], "accepted": [a_lo, a_hi]}
        why = ("this vLLM lists no per-request verify steps" if engine_steps is None
               else "the emulation recorded no verify decisions")
        return None, (f"cannot be compared exactly: {why}, and {ties or 'some'} decision(s) sat near a tie, where "
                      "other kernels may count otherwise"), {**tolerance, "compared": "none"}
    cmp = compare_steps(engine_steps, steps, gap, dtype)
    tolerance.update(steps_compared=cmp.compared, prompts_whole=cmp.whole, steps_not_compared=cmp.uncompared)
    stops = (f"; {len(cmp.stops)} stop at a near-tie ({', '.join(cmp.stops[:4])}"
             + (", ..." if len(cmp.stops) > 4 else "") + f"), {cmp.uncompared} step(s) from there not compared"
             if cmp.stops else "")
    if cmp.difference is not None:
        return False, f"{cmp.difference} ({rule})", tolerance
    if cmp.compared == 0:
        return None, f"no verify step could be compared: every prompt starts at a near-tie{stops} ({rule})", tolerance
    return True, (f"equal at each of the {cmp.compared} verify steps compared ({cmp.whole}/{len(steps)} prompts to "
                  f"their end{stops}; {rule})"), tolerance


def tie_tolerance(logit: float, dtype: str) -> float:
    """TIE_ULPS units in the last place of `logit` in `dtype` (bfloat16 when vLLM did not say): the floor."""
    return TIE_ULPS * ulp(logit, dtype)


@dataclass
class Parting:
    """Where two greedy outputs of one prompt part: token `at` (0-based), the token the reference run (vLLM's
    target-only run, or the baseline endpoint) took and the other one, with their logits in that run (None: not
    among its top candidates), and in the second computation, the one that took `other` (`second_taken`,
    `second_other`; None: not measured), named `second`."""

    at: int
    taken: int | None
    other: int | None
    dtype: str
    taken_logit: float | None = None
    other_logit: float | None = None
    second_taken: float | None = None
    second_other: float | None = None
    second: str = "the other run"
    # the largest logit move between the two runs over the tokens before `at` (the same prefix, so the same
    # function): the rounding the second run is measured to add. The second run's own row at the parting is the
    # one it took `other` from, so it always orders the two its way; the gap must also be within twice this.
    prefix_noise: float | None = None
    independent: bool = False  # the second computation is a recomputation of its own (our target), not the run's

    @property
    def tolerance(self) -> float | None:
        return None if self.taken_logit is None else tie_tolerance(self.taken_logit, self.dtype)

    @property
    def path(self) -> PathParting:
        """The parting as validate.partings judges two computations of one target (the reference as the
        one-token decode, the second computation as the verify block)."""
        return PathParting(self.at, self.taken, self.other, self.dtype, self.taken_logit, self.other_logit,
                           self.second_taken, self.second_other)

    @property
    def within_floor(self) -> bool:
        return (self.taken_logit is not None and self.other_logit is not None
                and abs(self.taken_logit - self.other_logit) <= self.tolerance)

    @property
    def near_tie(self) -> bool:
        # a reference run that took a token below another by its own logits (gap < 0) is no tie, measured or not
        gap = self.path.gap
        return self.within_floor or (gap is not None and gap >= 0 and self.path.near_tie
                                     and (self.independent or (self.prefix_noise is not None
                                                               and gap <= 2 * self.prefix_noise + self.path.margin)))

    @property
    def beyond_rounding(self) -> bool:
        """Not a near-tie, and the two computations moved a logit further than rounding (no verdict)."""
        return not self.near_tie and self.path.beyond_rounding

    def measured_words(self) -> str:
        path = self.path
        if not path.measured:
            return f"; {self.second} did not report both tokens' logits: nothing measured"
        u = ulp(self.taken_logit, self.dtype)
        prefix = ("" if self.independent else "; no shared token before it to measure the runs' rounding on"
                  if self.prefix_noise is None else
                  f"; the runs' rounding before it moved a logit by {self.prefix_noise:.3g} at most")
        return (f"; {self.second} computes them {self.second_taken:.4g} and {self.second_other:.4g}: the computations "
                f"moved the gap by {path.moved:.3g} = {path.moved / u:.1f} ulps (largest logit move {path.noise:.3g})"
                f"{prefix}")

    def describe(self, other_side: str) -> str:
        where = f"token {self.at + 1}: vLLM's target-only run took {self.taken}, {other_side} {self.other}"
        if self.within_floor:
            return (f"{where}, a near-tie (logits {self.taken_logit:.4g} and {self.other_logit:.4g}, within "
                    f"{TIE_ULPS} {self.dtype} ulps = {self.tolerance:.3g}): numerics, not the draft")
        if self.other_logit is not None:
            logits = f"logits {self.taken_logit:.4g} and {self.other_logit:.4g}"
            if self.near_tie:
                return (f"{where}, a near-tie ({logits}{self.measured_words()}: the gap within that noise + "
                        f"{MARGIN_ULPS} ulp): numerics, not the draft")
            if self.path.beyond_rounding:
                return f"{where} ({logits}{self.measured_words()}: beyond rounding, cap {self.path.cap:.3g})"
            return f"{where} ({logits}{self.measured_words()}: not a near-tie)"
        return where


def parting(base: list[int], other: list[int], top: list[dict[str, float]] | None, dtype: str,
            other_top: list[dict[str, float]] | None = None, second: str = "the other run",
            independent: bool = False) -> Parting | None:
    """Where `other` parts from the reference output `base` (None: equal), judged by `top`, the reference run's
    processed logits per generated token ({token id: logit}, as the driver reports them), and `other_top`, the
    second computation's at the same tokens (the run that took `other`; None: not measured)."""
    if base == other:
        return None
    at = first_difference(base, other)
    taken, alt = (base[at] if at < len(base) else None), (other[at] if at < len(other) else None)
    step = (top[at] if top is not None and at < len(top) else None) or {}
    if taken is None or alt is None or str(taken) not in step:
        return Parting(at, taken, alt, dtype, second=second)
    row = (other_top[at] if other_top is not None and at < len(other_top) else None) or {}
    prefix = measured_noise([base], [top], [other], [other_top]) if other_top is not None and not independent \
        else None
    return Parting(at, taken, alt, dtype, step[str(taken)], step.get(str(alt)), row.get(str(taken)),
                   row.get(str(alt)), second=second, independent=independent,
                   prefix_noise=None if prefix is None else prefix * binade(step[str(taken)]))


def outputs_check(spec: list[list[int]], base: list[list[int]], ours: list[list[int]],
                  top: list[list[dict[str, float]]] | None, dtype: str,
                  spec_top: list[list[dict[str, float]] | None] | None = None,
                  ours_top: Callable[[int, int, list[int]], dict[str, float] | None] | None = None
                  ) -> tuple[Check, int]:
    """engine_outputs_equal: vLLM's speculative output, vLLM's target-only output and our target's greedy output
    per prompt, equal or parting first at a near-tie; and how many prompts are equal outright. `top`, `spec_top`:
    the target-only and speculative runs' reported logits (Parting); `ours_top(i, k, ids)`: our target's one-token
    logits {token id: logit} of `ids` for token k of prompt i after our output's tokens before it (None: not
    measured).
    A parting whose computations moved a logit beyond rounding: DFlashError (no verdict)."""
    n = len(ours)
    equal, ties, bad = 0, [], None
    for i in range(n):
        base_top = top and top[i]
        ours_part = parting(base[i], ours[i], base_top, dtype)
        if ours_part is not None and not ours_part.near_tie and ours_part.other_logit is not None and ours_top:
            # measured only where the floor does not already decide: one teacher-forced pass of our target
            row = ours_top(i, ours_part.at, [ours_part.taken, ours_part.other])
            ours_part = parting(base[i], ours[i], base_top, dtype, [None] * ours_part.at + [row],
                                "our target's one-token decode", independent=True)
        partings = [(p, side) for p, side in ((parting(base[i], spec[i], base_top, dtype, spec_top and spec_top[i],
                                                       "vLLM's speculative run (its verify block)"),
                                               "vLLM's speculative run"),
                                              (ours_part, "our target"))
                    if p is not None]
        beyond = next((p for p, _ in partings if p.beyond_rounding), None)
        if beyond is not None:
            raise DFlashError(f"cannot judge engine_outputs_equal: at prompt {i + 1}, "
                              f"{beyond.describe(beyond.second)}: the two computations of the target disagree by more "
                              "than rounding, so they do not run this target alike on this device and dtype (no "
                              "verdict on the draft)")
        if not partings:
            equal += 1
        elif all(p.near_tie for p, _ in partings):
            ties.append(f"prompt {i + 1}, " + "; ".join(p.describe(side) for p, side in partings))
        elif bad is None:
            p, side = next((p, side) for p, side in partings if not p.near_tie)
            bad = (f"prompt {i + 1}: " + ("vLLM's speculative and target-only outputs differ" if side != "our target"
                                         else "vLLM's target-only output is not our target's greedy output")
                   + f" ({p.describe(side)})")
    if bad is None:
        message = (f"vLLM's speculative output, vLLM's target-only output and our target's greedy output are equal on "
                   f"{equal}/{n} prompts" + (f"; the other {len(ties)} part at a near-tie: " + " | ".join(ties)
                                              if ties else ""))
    else:
        message = bad + f" ({equal}/{n} prompts equal)"
    return make_check("engine_outputs_equal", bad is None, message, value=f"{equal}/{n}", threshold=f"{n}/{n}",
                      level="end_to_end"), equal


def served_checks(answer: dict[str, Any], ours: list[list[int]], emulated: AcceptanceCounts, *, block: int,
                  engine_args: dict[str, Any], python: str, min_acceptance_length: float | None,
                  min_position_rates: list[float] | None,
                  sampling: dict[str, Any] | None = None, steps: list[StepDecisions] | None = None,
                  emulated_dtypes: list[str] | None = None,
                  ours_top: Callable[[int, int, list[int]], dict[str, float] | None] | None = None
                  ) -> tuple[list[Check], EngineStats]:
    """The checks of one draft's engine run against our outputs and the emulation under vLLM's counting (`steps`:
    its verify decisions per prompt, run in `emulated_dtypes`, bfloat16 when not given). Greedy: outputs equal (or parting first at a
    near-tie) and counts equal step by step where defined (greedy_agreement). Sampled: the counts within an
    interval from the counts (the outputs are samples of different random streams: not compared)."""
    run = answer["drafts"][0]
    if "error" in run:
        # the engine refused what the static level let through, or cannot run it here: no verdict on the draft
        raise DFlashError(f"vLLM {answer.get('vllm_version')}: {run['error']}"
                          if not run.get("broken_sampler") else run["error"])
    sampled = bool(sampling and float(sampling.get("temperature") or 0) > 0)
    spec = run["outputs"]
    counts = engine_counts(run)
    n = len(ours)
    checks = []
    equal = None
    served_dtype = str((run.get("engine_config") or {}).get("dtype") or "bfloat16")
    if sampled:
        agrees, detail, tolerance = sampled_agreement(counts, emulated)
    else:
        target_only = answer["target_only"]
        check, equal = outputs_check(spec, target_only["outputs"], ours, target_only.get("top_logits"), served_dtype,
                                     run.get("top_logits"), ours_top)
        checks.append(check)
        agrees, detail, tolerance = greedy_agreement(
            run, counts, emulated, steps, [served_dtype, *(emulated_dtypes or ["bfloat16"])],
            measured=measured_noise(target_only["outputs"], target_only.get("top_logits"), spec, run.get("top_logits")))
        detail = f"counts per step: {detail}"
    checks.append(make_check(  # None: nothing could be compared, said as a warning, never a verdict on the draft
        "engine_acceptance_agrees", bool(agrees),
        f"vLLM: {counts.num_drafts} drafts, {counts.accepted} accepted, tau {counts.acceptance_length:.3f}; "
        f"emulation counted as vLLM counts (full last block): {emulated.num_drafts} drafts, {emulated.accepted} "
        f"accepted, tau {emulated.acceptance_length:.3f}; {detail}",
        value=counts.acceptance_length, threshold=emulated.acceptance_length, level="end_to_end",
        bad="warn" if agrees is None else "fail"))
    if min_acceptance_length is not None:
        checks.append(make_check("engine_acceptance_length", counts.acceptance_length >= min_acceptance_length,
                             f"vLLM's tau {counts.acceptance_length:.3f} over {counts.num_drafts} draft steps (block "
                             f"{block}); required >= {min_acceptance_length}", value=counts.acceptance_length,
                             threshold=min_acceptance_length, level="end_to_end"))
    if min_position_rates:
        got = counts.per_position_rates
        low = [f"position {k + 1}: {got[k]:.3f} < {m}" for k, m in enumerate(min_position_rates)
               if k >= len(got) or got[k] < m]
        checks.append(make_check("engine_position_rates", not low, "; ".join(low) if low else
                             "every position of vLLM's figures meets its threshold", value=got,
                             threshold=list(min_position_rates), level="end_to_end"))
    stats = EngineStats(engine="vllm", version=answer["vllm_version"], python=python, engine_args=engine_args,
                        engine_config=run.get("engine_config") or {}, prompts=n, outputs_equal=equal, counts=counts,
                        sampling=sampling or {"temperature": 0.0}, tolerance=tolerance)
    return checks, stats
