"""validate --compare-to SRC: the same run on another draft (the unquantized source of a quantized copy), and
what the checked draft loses against it: tau and each position's acceptance rate, as one check.

The tolerance is stated once here, as a fraction of the source's tau, by the fewest weight bits the draft's
quantization uses: 8-bit weights are expected to cost little (an INT8 W8A16 draft was reported at tau 4.16
against 4.24 for bf16, 1.9 %), sub-8-bit ones more. A larger loss warns (the copy still works; whether the memory
saved is worth the acceptance is the user's call), never fails: the comparison measures a choice, not a defect.
"""

from __future__ import annotations

from typing import Callable

from dflash_convert.format.compat import make_check
from dflash_convert.validate.options import ValidateOptions
from dflash_convert.validate.report import Check, ValidationReport

TAU_TOLERANCE = {8: 0.03, 4: 0.10}  # fewest weight bits -> tau lost tolerated, a fraction of the source's


def tau_tolerance(draft_path) -> float:
    """The fraction of the source's tau a draft may lose: by its fewest weight bits (unquantized: as 8-bit)."""
    from dflash_convert.io.checkpoint import open_checkpoint

    q = open_checkpoint(draft_path).quantization
    bits = min((s.weights.num_bits for s in q.schemes), default=8) if q else 8
    return TAU_TOLERANCE[8] if bits >= 8 else TAU_TOLERANCE[4]


def compare_check(report: ValidationReport, source: ValidationReport, source_path: str, tolerance: float) -> Check:
    """tau and per-position rates of `report` against `source`, the same prompts and settings; a loss above
    `tolerance` (a fraction of the source's tau) warns."""
    mine, theirs = report.acceptance, source.acceptance
    if mine is None or theirs is None:
        return make_check("compare_to", None, f"--compare-to {source_path}: no acceptance measured on "
                          f"{'this draft' if mine is None else 'the source'} (the end-to-end level did not run)",
                          level="end_to_end")
    lost = theirs.acceptance_length - mine.acceptance_length
    rates = [round(a - b, 4) for a, b in zip(theirs.per_position_rates, mine.per_position_rates)]
    allowed = tolerance * theirs.acceptance_length
    message = (f"tau {mine.acceptance_length:.3f} against {theirs.acceptance_length:.3f} for {source_path}: "
               f"{lost:+.3f} lost ({lost / theirs.acceptance_length:+.1%}; tolerated {allowed:.3f}); per-position "
               f"rates lost {rates}")
    return make_check("compare_to", lost <= allowed, message, value={"tau_lost": round(lost, 4),
                      "position_rates_lost": rates}, threshold=round(allowed, 4), level="end_to_end", bad="warn")


def compare_to_source(report: ValidationReport, opts: ValidateOptions,
                      validate: Callable[..., ValidationReport], progress) -> None:
    """Run `opts.compare_to` with the same options and append the comparison check to `report`."""
    source_opts = opts.model_copy(update={"compare_to": None, "baseline": None, "endpoint": None})
    source = validate(opts.compare_to, source_opts, progress=progress)
    check = compare_check(report, source, str(opts.compare_to), tau_tolerance(report.checkpoint))
    report.checks.append(check)
    report.passed = report.passed and not check.failed
