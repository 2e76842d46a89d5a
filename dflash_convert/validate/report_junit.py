"""The validation report as JUnit XML (`--junit`): one testcase per check so that CI systems show failures
natively (warnings pass, with the message in system-out; skipped checks are <skipped/>), and an <error>
testcase for a run that was stopped or ended in an error, so that CI never shows it green or empty."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from dflash_convert.validate.options import LEVELS
from dflash_convert.validate.report import ValidationReport, prompts_note


def to_junit(report: ValidationReport) -> str:
    """JUnit XML: one <testsuite> per level run, one <testcase> per check; a run stopped before its end (Ctrl-C)
    adds an <error> testcase, so that CI never shows it green."""
    n = report.counts()
    stopped = report.incomplete is not None
    root = ET.Element("testsuites", name="dflash-convert validate", tests=str(len(report.checks) + stopped),
                      failures=str(n["fail"]), errors=str(int(stopped)), skipped=str(n["skip"]),
                      time=f"{report.duration_s:.3f}")
    if stopped:
        _junit_error(root, "run_completed", f"{report.incomplete}: the checks below are what was measured until then",
                     "Interrupted")
    for level in LEVELS:
        checks = [c for c in report.checks if c.level == level]
        if not checks:
            continue
        suite = ET.SubElement(root, "testsuite", name=f"validate.{level}", tests=str(len(checks)),
                              failures=str(sum(c.status == "fail" for c in checks)), errors="0",
                              skipped=str(sum(c.status == "skip" for c in checks)))
        props = ET.SubElement(suite, "properties")
        ET.SubElement(props, "property", name="checkpoint", value=report.checkpoint or "")
        if report.target:
            ET.SubElement(props, "property", name="target", value=report.target)
        if prompts_note(report):
            ET.SubElement(props, "property", name="prompts", value=prompts_note(report))
        for c in checks:
            case = ET.SubElement(suite, "testcase", classname=f"dflash_convert.validate.run.{level}", name=c.name)
            detail = f"value: {c.value!r}\nthreshold: {c.threshold!r}\n{c.message}"
            if c.status == "fail":
                ET.SubElement(case, "failure", message=c.message[:500], type="ValidationFailed").text = detail
            elif c.status == "skip":
                ET.SubElement(case, "skipped", message=c.message[:500])
            else:
                ET.SubElement(case, "system-out").text = ("warning: " if c.status == "warn" else "") + detail
    return _xml(root)


def junit_error(message: str, exit_code: int, duration_s: float = 0.0) -> str:
    """JUnit XML of a run that ended in an error before it had a report (an endpoint refusing connections, a
    checkpoint that cannot be read): one <error> testcase saying why, so that CI shows a failed test, not none."""
    root = ET.Element("testsuites", name="dflash-convert validate", tests="1", failures="0", errors="1", skipped="0",
                      time=f"{duration_s:.3f}")
    _junit_error(root, "validate_ran", message, f"exit {exit_code}")
    return _xml(root)


def _junit_error(root: ET.Element, name: str, message: str, kind: str) -> None:
    suite = ET.SubElement(root, "testsuite", name="validate.run", tests="1", failures="0", errors="1", skipped="0")
    case = ET.SubElement(suite, "testcase", classname="dflash_convert.validate.run", name=name)
    ET.SubElement(case, "error", message=message[:500], type=kind).text = message


def _xml(root: ET.Element) -> str:
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
