"""`diff`: two checkpoints compared, also across formats."""

from typing import Annotated, Optional

import typer

from dflash_convert.cli._output import Output
from dflash_convert.cli._params import Json, Quiet, Revision, Token, examples

EXAMPLES = examples(
    "dflash-convert diff ./draft-speculators ./draft-hf",
    "dflash-convert diff org/draft org/draft --revision-a v1 --revision-b main --json",
    "dflash-convert diff ./draft ./draft-bf16 --tolerance 0.01")


def diff(
    a: Annotated[str, typer.Argument(metavar="A", help="First checkpoint (directory or Hub id).")],
    b: Annotated[str, typer.Argument(metavar="B", help="Second checkpoint (directory or Hub id).")],
    tolerance: Annotated[float, typer.Option("--tolerance", help="Max abs difference still counted as equal.")] = 0.0,
    revision: Revision = None,
    revision_a: Annotated[Optional[str], typer.Option("--revision-a", help="Hub revision of A (default: "
                                                      "--revision).")] = None,
    revision_b: Annotated[Optional[str], typer.Option("--revision-b", help="Hub revision of B (default: "
                                                      "--revision).")] = None,
    strict: Annotated[bool, typer.Option("--strict", help="Count provenance differences (the verifier each names) "
                                         "too; by default they are listed apart and do not count.")] = False,
    token: Token = None,
    as_json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Compare two checkpoints (also across formats): exit 0 when equivalent, 3 when not."""
    from dflash_convert.convert.diff import diff_checkpoints
    from dflash_convert.errors import ValidationFailed

    out = Output(as_json, quiet)
    pa, _ = out.local(a, revision=revision_a or revision, token=token)
    pb, _ = out.local(b, revision=revision_b or revision, token=token)
    report = diff_checkpoints(pa, pb, tolerance=tolerance, strict=strict)
    out.result(report.model_dump(mode="json"), render=report.render)
    if not report.equivalent:
        raise typer.Exit(ValidationFailed.exit_code)
