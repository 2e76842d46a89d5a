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

    `report` (the static + numeric report of `convert --validate`, or a `validate` run with end-to-end
    figures, e.g. `push --validation-report`) goes on the model card, and a failed one stops the push;
    the static checks run on `directory` unless `report` already ran them there. validate=False pushes
    without checks (the card then shows `report` only).
    """
    from dflash_convert.hub import client as hub

    static = None
    if validate and not (report is not None and "static" in report.levels_run
                         and Path(report.checkpoint).resolve() == Path(directory).resolve()):
        from dflash_convert.validate.options import ValidateOptions
        from dflash_convert.validate.run import validate as run_validation

        static = run_validation(directory, ValidateOptions(levels=["static"]))
    for checked in (static, report if validate else None):
        if checked is not None and checked.failed:
            names = ", ".join(f"{c.name} ({c.message})" if c.message else c.name for c in checked.failed_checks)
            what = "validation" if checked is static else f"the validation report of {checked.checkpoint or checked.endpoint.url}"
            raise ValidationFailed(f"{what} failed: {names}; nothing was pushed (--no-validate pushes anyway)",
                                   file=str(directory))
    shown = report or static
    summary = shown.summary().model_dump(mode="json") if shown is not None else None
    return hub.push(directory, repo_id, validation=summary, **push_options)


def convert_and_publish(src: str | Path, dest: str | Path, opts: ConvertOptions | None = None, *,
                        validate: bool = False, push: str | None = None, push_options: dict[str, Any] | None = None,
                        on_progress: Callable[[int, int], None] | None = None,
                        on_warning: Callable[[str], None] | None = None,
                        on_status: Callable[[str], None] | None = None, strict: bool = False) -> Converted:
    """convert(src, dest, opts); every problem `inspect` finds in the staged output goes to on_warning
    (strict=True: any of them raises ValidationFailed and nothing is written); validate=True (implied by
    push) runs static + numeric validation on the staged output before it is renamed into place (a
    failing check raises ValidationFailed and nothing is written); push=REPO then uploads `dest`
    (push_options go to hub.client.push: revision, private, commit_message, commit_description,
    create_pr, token, on_info). on_status gets the validation's progress lines.
    """
    if push:  # a push that cannot be made is refused before the conversion, not after it
        from dflash_convert.hub.client import check_push_options

        check_push_options((push_options or {}).get("revision"), bool((push_options or {}).get("create_pr")),
                           "--push-revision")
    report = None
    say = on_status or (lambda message: None)
    warn = on_warning or (lambda message: None)

    def check_staged(tmp: Path) -> None:
        """What `inspect` would say of the output (config and headers: no value is read again)."""
        from dflash_convert.validate.inspect import inspect_checkpoint

        problems = inspect_checkpoint(tmp).problems
        for c in problems:
            warn(f"the output fails inspect's {c.name} check: {c.message}" if c.status == "fail" else
                 f"the output warns in inspect's {c.name} check: {c.message}")
        if strict and problems:
            raise ValidationFailed(f"--strict: inspect finds {len(problems)} problem(s) in the output "
                                   f"({', '.join(c.name for c in problems)}); nothing was written")
        if validate or push:
            validate_staged(tmp)

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
                   before_commit=check_staged)
    done.validation = report
    if push:
        done.push = push_checkpoint(dest, push, report=report, **(push_options or {}))
    return done
