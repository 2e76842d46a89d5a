"""Push a checkpoint directory to the Hub behind validation, with the summary on its model card.

Both `push` and `convert --push` come through here: a draft is validated (static level, unless the
caller already holds a report, as `convert` does) and nothing is pushed when a check fails.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import ValidationFailed
from .report import ValidationReport


def push_checkpoint(directory: str | Path, repo_id: str, *, validate: bool = True,
                    report: ValidationReport | None = None, **push_options: Any):
    """hub.push(directory, repo_id, **push_options) after validation; returns hub.PushResult.

    `report` (e.g. the static + numeric report of `convert --validate`) stands in for the static
    run; validate=False pushes without one and the card has no validation section.
    """
    from . import hub

    if report is None and validate:
        from .validate import validate as run_validation

        report = run_validation(directory, levels=("static",))
    if report is not None and report.failed:
        names = ", ".join(f"{c.name} ({c.message})" if c.message else c.name for c in report.failed_checks)
        raise ValidationFailed(f"validation failed: {names}; nothing was pushed (--no-validate pushes anyway)",
                               file=str(directory))
    summary = report.summary().model_dump(mode="json") if report is not None else None
    return hub.push(directory, repo_id, validation=summary, **push_options)
