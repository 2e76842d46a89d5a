"""`pull`: a DFlash checkpoint downloaded from the Hub."""

from pathlib import Path
from typing import Annotated, Optional

import typer

from dflash_convert.cli._output import Output
from dflash_convert.cli._params import AllowPickle, Json, QuietTransfer, Revision, Token, examples, flag

EXAMPLES = examples("dflash-convert pull org/draft",
                  "dflash-convert pull org/draft --revision v1 -o ./draft")


def pull(
    repo: Annotated[str, typer.Argument(metavar="REPO", help="Hub repo id (org/name).")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Materialize the files in DIR instead of "
                                                   "only the cache.")] = None,
    revision: Revision = None,
    token: Token = None,
    allow_pickle: AllowPickle = False,
    overwrite: Annotated[bool, flag("--overwrite", help="Replace a non-empty -o DIR (once the pull is "
                                     "complete).")] = False,
    as_json: Json = False,
    quiet: QuietTransfer = False,
) -> None:
    """Download a DFlash checkpoint from the Hub (config, safetensors, index, README); prints its local path."""
    out = Output(as_json, quiet)
    resolved = out.hub().pull(repo, output, revision=revision, token=token, allow_pickle=allow_pickle,
                              overwrite=overwrite, on_info=out.info)
    out.info(f"pulled {repo}@{resolved.revision} (commit {resolved.commit_sha})")
    out.result(resolved.to_dict(), str(resolved.path))
