"""`inspect`: the format, what each engine applies, the tensors and every problem found."""

from typing import Annotated

import typer

from dflash_convert.cli._output import Output
from dflash_convert.cli._params import (
    AllowPickle, EngineOpt, Json, Quiet, Revision, Source, Token, examples, flag, value
)

EPILOG = examples(
    "dflash-convert inspect ./draft",
    "dflash-convert inspect org/draft --revision v1 --json",
    "dflash-convert inspect ./draft --scan --engine sglang")


def inspect(
    path: Source,
    scan: Annotated[bool, flag("--scan", help="Also read tensor values (NaN/Inf, all-zero); imports torch.")] = False,
    allow_pickle: AllowPickle = False,
    revision: Revision = None,
    token: Token = None,
    engine: EngineOpt = None,
    as_json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Show the format, what each engine will apply, the tensors, and every problem found (exit 3 if any fails)."""
    from dflash_convert.errors import ValidationFailed
    from dflash_convert.validate.inspect import inspect_checkpoint

    out = Output(as_json, quiet)
    local, sha = out.local(path, revision=revision, token=token, allow_pickle=allow_pickle)
    report = inspect_checkpoint(local, scan=scan, allow_pickle=allow_pickle, engine=value(engine))
    report.revision = sha
    out.result(report.model_dump(mode="json"), render=report.render)
    if not report.ok:
        raise typer.Exit(ValidationFailed.exit_code)
