"""validate --compare-to SRC: the same run on another draft (the unquantized source of a quantized copy), and
what the checked draft loses against it: tau and each position's acceptance rate, as one check.

The tolerance is stated once here: a quantized draft that keeps tau within QUANTIZATION_TAU_TOLERANCE (a fraction
of the source's tau) passes; a larger loss warns (the draft still works; whether the loss is worth the memory is the
user's call), never fails: the comparison measures a choice, not a defect.
"""

from __future__ import annotations

from typing import Callable

from dflash_convert.format.compat import make_check
from dflash_convert.validate.options import ValidateOptions
from dflash_convert.validate.report import Check, ValidationReport

QUANTIZATION_TAU_TOLERANCE = 0.05  # 5 % of the source's tau


def compare_check(report: ValidationReport, source: ValidationReport, source_path: str) -> Check:
    """tau and per-position rates of `report` against `source`, the same prompts and settings."""
    mine, theirs = report.acceptance, source.acceptance
    if mine is None or theirs is None:
        return make_check("compare_to", None, f"--compare-to {source_path}: no acceptance measured on "
                          f"{'this draft' if mine is None else 'the source'} (the end-to-end level did not run)",
                          level="end_to_end")
    lost = theirs.acceptance_length - mine.acceptance_length
    rates = [round(a - b, 4) for a, b in zip(theirs.per_position_rates, mine.per_position_rates)]
    allowed = QUANTIZATION_TAU_TOLERANCE * theirs.acceptance_length
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
    check = compare_check(report, source, str(opts.compare_to))
    report.checks.append(check)
    report.passed = report.passed and not check.failed
