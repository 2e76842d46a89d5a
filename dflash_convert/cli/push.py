"""`push`: a checkpoint directory uploaded in one commit, with its model card (and a validation report in it)."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from dflash_convert.cli._output import Output
from dflash_convert.cli._params import (
    CommitDescription, CommitMessage, CreatePr, Json, Private, QuietTransfer, Revision, Token, examples, flag,
    refuse_swapped
)
from dflash_convert.errors import DFlashError

EXAMPLES = examples("dflash-convert push ./draft-hf org/draft-hf",
                  "dflash-convert push ./draft-hf org/draft-hf --revision dev --private")


def push(
    directory: Annotated[Path, typer.Argument(metavar="DIRECTORY", help="Checkpoint directory to upload.")],
    repo: Annotated[str, typer.Argument(metavar="REPO", help="Hub repo id (org/name); created if missing.")],
    revision: Revision = None,
    private: Private = False,
    commit_message: CommitMessage = None,
    commit_description: CommitDescription = None,
    create_pr: CreatePr = False,
    token: Token = None,
    no_validate: Annotated[bool, flag("--no-validate", help="Push even if static validation fails.")] = False,
    validation_report: Annotated[Optional[Path], typer.Option(
        "--validation-report", metavar="FILE", help="A `validate --json` report of this draft (e.g. end to end): "
        "its results (tau, the acceptance chart, target, prompts, thresholds, date) go in the model card; a failed "
        "report stops the push.")] = None,
    as_json: Json = False,
    quiet: QuietTransfer = False,
) -> None:
    """Upload a checkpoint directory in one commit to a branch (--revision, created from main if missing), with a
    README model card; prints the commit (or PR) URL."""
    from dflash_convert.publish import push_checkpoint

    out = Output(as_json, quiet)
    _check_order(directory, repo)
    report = _read_validation_report(validation_report) if validation_report is not None else None
    out.hub()
    result = push_checkpoint(directory, repo, validate=not no_validate, report=report, revision=revision,
                             private=private, commit_message=commit_message, commit_description=commit_description,
                             create_pr=create_pr, token=token, on_info=out.info)
    out.result(result.to_dict(), result.pr_url or result.commit_url)


def _check_order(directory: Path, repo: str) -> None:
    """`hf upload` takes REPO first, push DIRECTORY first: arguments given the other way round are said so."""
    if not directory.is_dir() and Path(repo).is_dir():
        refuse_swapped(f"{directory} is no directory and {repo} is one",
                       f"push takes the directory first: dflash-convert push {repo} {directory}")


def _read_validation_report(path: Path):
    """A `validate --json` report file, checked against its schema (one line naming the file otherwise)."""
    from pydantic import ValidationError

    from dflash_convert.io.reading import read_json
    from dflash_convert.validate.report import ValidationReport

    try:
        return ValidationReport.model_validate(read_json(path, allow_bom=True, what="a validate --json report"))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "the top level"
        raise DFlashError(f"not a validation report (`validate --json` writes one): {where}: {first['msg']}",
                          file=path) from None
