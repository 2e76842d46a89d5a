"""The `dflash-convert` command line: one typer app, each command a thin wrapper over a library call.

Conventions (as the `hf` CLI): `--json` prints exactly one JSON object on stdout; human output,
progress and warnings go to stderr; exit 0 ok, 1 error (one `Error: ...` line), 2 usage,
3 validation ran and failed. `--debug` (before the command) shows tracebacks.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from .errors import DFlashError

app = typer.Typer(
    name="dflash-convert",
    help="Convert, inspect, validate and ship DFlash speculative-decoding drafts "
    "(speculators <-> Hugging Face / z-lab formats).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, highlight=False)
STATE = {"debug": False}


def emit_json(obj) -> None:
    """The one JSON object of a `--json` run, on stdout."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/yellow] {message}", soft_wrap=True)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
    version: bool = typer.Option(False, "--version", help="Print the version and exit."),
) -> None:
    STATE["debug"] = debug or bool(os.environ.get("DFLASH_CONVERT_DEBUG"))
    if version:
        from . import __version__

        typer.echo(__version__)
        raise typer.Exit(0)


def main() -> None:
    """Console-script entry point: run the app, turn known errors into one line and an exit code."""
    debug = "--debug" in sys.argv[1:] or bool(os.environ.get("DFLASH_CONVERT_DEBUG"))
    try:
        app(standalone_mode=False)
    except DFlashError as exc:
        if debug:
            raise
        err.print(f"Error: {exc}", markup=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.BadParameter, typer.Abort) as exc:  # pragma: no cover - click formats these itself
        raise exc
    except __import__("click").exceptions.UsageError as exc:
        exc.show(file=sys.stderr)
        sys.exit(2)
    except __import__("click").exceptions.ClickException as exc:
        exc.show(file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("Error: interrupted; nothing was written at the destination", markup=False)
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - unexpected: still one line unless --debug
        if debug:
            raise
        err.print(f"Error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", markup=False,
                  soft_wrap=True)
        sys.exit(1)
