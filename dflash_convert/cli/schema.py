"""`schema`: the JSON Schemas of the files and reports dflash-convert reads and writes."""

import sys
from typing import Annotated, Optional

import typer

from dflash_convert.cli._output import emit_json, err
from dflash_convert.cli._params import examples, flag, one_of
from dflash_convert import schemas

EXAMPLES = examples("dflash-convert schema",
                  "dflash-convert schema validation-report > validation-report.schema.json",
                  "dflash-convert schema --all > schemas.json")


def schema(
    name: Annotated[Optional[str], typer.Argument(
        metavar="NAME", callback=one_of(schemas.NAMES),
        help=f"The schema to print: {', '.join(schemas.NAMES)} (without NAME: the list of names).")] = None,
    all_: Annotated[bool, flag("--all", help="Print every schema, as one JSON object keyed by name.")] = False,
) -> None:
    """Print the JSON Schemas of the files and reports dflash-convert reads and writes."""
    if all_:
        emit_json({n: schemas.schema(n) for n in schemas.NAMES})
    elif name is not None:
        sys.stdout.write(schemas.render(name))
    else:
        typer.echo("\n".join(schemas.NAMES))
        err.print("dflash-convert schema NAME prints one (JSON Schema); --all prints every one", markup=False)
