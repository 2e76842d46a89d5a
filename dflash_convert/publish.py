"""Layer 4, the pipelines over convert, validate and the Hub: validate-then-push, and
convert-validate-push. `push` and `convert --validate/--push` come through here; nothing is pushed,
and nothing is written at a conversion's destination, when a check fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from dflash_convert.convert.conversion import ConvertOptions, Converted, convert
from dflash_convert.errors import ValidationFailed
from dflash_convert.validate.report import ValidationReport


def push_checkpoint(directory: str | Path, repo_id: str, *, validate: bool = True,
                    report: ValidationReport | None = None, **push_options: Any):
    """hub.client.push(directory, repo_id, **push_options) after validation; returns hub.client.PushResult.

    `report` (e.g. the static + numeric report of `convert --validate`, or an end-to-end run) stands in
    for the static run; validate=False pushes without one and the card has no validation section.
    """
    from dflash_convert.hub import client as hub

    if report is None and validate:
        from dflash_convert.validate.options import ValidateOptions
        from dflash_convert.validate.run import validate as run_validation

        report = run_validation(directory, ValidateOptions(levels=["static"]))
    if report is not None and report.failed:
        names = ", ".join(f"{c.name} ({c.message})" if c.message else c.name for c in report.failed_checks)
        raise ValidationFailed(f"validation failed: {names}; nothing was pushed (--no-validate pushes anyway)",
                               file=str(directory))
    summary = report.summary().model_dump(mode="json") if report is not None else None
    return hub.push(directory, repo_id, validation=summary, **push_options)


def convert_and_publish(src: str | Path, dest: str | Path, opts: ConvertOptions | None = None, *,
                        validate: bool = False, push: str | None = None, push_options: dict[str, Any] | None = None,
                        on_progress: Callable[[int, int], None] | None = None,
                        on_warning: Callable[[str], None] | None = None,
                        on_status: Callable[[str], None] | None = None) -> Converted:
    """convert(src, dest, opts); validate=True (implied by push) runs static + numeric validation on the
    staged output before it is renamed into place (a failing check raises ValidationFailed and nothing
    is written); push=REPO then uploads `dest` (push_options go to hub.client.push: revision, private,
    commit_message, commit_description, create_pr, token). on_status gets the validation's progress lines.
    """
    if push:  # a push that cannot be made is refused before the conversion, not after it
        from dflash_convert.hub.client import check_push_options

        check_push_options((push_options or {}).get("revision"), bool((push_options or {}).get("create_pr")),
                           "--push-revision")
    report = None
    say = on_status or (lambda message: None)

    def validate_staged(tmp: Path) -> None:
        nonlocal report
        from dflash_convert.validate.run import validate_output_dir

        say("validating the converted checkpoint (static, numeric)")
        report = validate_output_dir(tmp, progress=on_status)
        n = report.counts()
        say(f"validation {'passed' if report.passed else 'FAILED'}: {n['pass']} passed, {n['fail']} failed, "
            f"{n['warn']} warnings ({', '.join(report.levels_run)})")
        if report.failed:
            names = ", ".join(c.name for c in report.failed_checks)
            raise ValidationFailed(f"validation of the converted checkpoint failed ({names}); nothing was written")

    done = convert(src, dest, opts, on_progress=on_progress, on_warning=on_warning,
                   before_commit=validate_staged if validate or push else None)
    done.validation = report
    if push:
        done.push = push_checkpoint(dest, push, report=report, **(push_options or {}))
    return done
