"""The `dflash-convert` command line: one typer app, each command a thin module over a library call.

Conventions (as the `hf` CLI): `-h`/`--help`; results (the inspect view, the diff summary, the
validation report and its verdict, convert's summary, a pulled path or pushed URL) on stdout;
progress, info lines, warnings and errors on stderr; `--json` prints exactly one JSON object on
stdout, errors included (`{"error": {"message", "file", "exit_code"}}`); `-q` keeps the verdict
line, failures, warnings and errors. Plain text when not a terminal (rich's own rule) or with
NO_COLOR. Exit codes and `--debug`: _entry and _errors.

Layout (as huggingface_hub's cli/): this module makes the app and registers each command by name
(COMMANDS, as `hf.py` lists its own); _output (stdout/stderr, live step lines, --json), _errors
(exception -> exit code and message, a table), _entry (the process: signals, redaction, errors), _help
(how -h reads), _params (choices, parsers, shared options), _options (flags generated from an options
model), and one module per command.
"""

from typing import Annotated, Optional

import typer

from dflash_convert.cli import convert, diff, inspect, predict, pull, push, schema, validate
from dflash_convert.cli._entry import run
from dflash_convert.cli._help import Command
from dflash_convert.cli._params import flag

app = typer.Typer(
    name="dflash-convert",
    help="Convert, inspect, validate and ship DFlash speculative-decoding drafts "
    "(speculators <-> Hugging Face / z-lab formats).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: wraps at any width, never cuts a flag name
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(shown: bool) -> None:
    if shown:
        from dflash_convert import __version__

        typer.echo(__version__)
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: Annotated[bool, flag("--debug", help="Show tracebacks on errors (accepted anywhere on the line; "
                                "also HF_DEBUG=1).")] = False,
    version: Annotated[bool, flag("--version", is_eager=True, callback=_print_version,
                                  help="Print the version and exit.")] = False,
) -> None:
    """Convert, inspect, validate and ship DFlash speculative-decoding drafts."""


# Every command, in the order --help lists them: its name, its function (one thin module each, over a library
# call) and the examples -h ends with. A new command is its module, imported above, and a line here.
COMMANDS = (
    ("convert", convert.convert, convert.EXAMPLES),
    ("inspect", inspect.inspect, inspect.EXAMPLES),
    ("diff", diff.diff, diff.EXAMPLES),
    ("schema", schema.schema, schema.EXAMPLES),
    ("pull", pull.pull, pull.EXAMPLES),
    ("push", push.push, push.EXAMPLES),
    ("validate", validate.validate, validate.EXAMPLES),
    ("predict", predict.predict, predict.EXAMPLES),
)
for _name, _command, _examples in COMMANDS:
    app.command(_name, cls=Command, epilog=_examples)(_command)  # typer: the function's signature is its flags


def main(argv: Optional[list[str]] = None) -> None:
    """Console-script entry point (see _entry.run): the app, each error one line (and JSON) and an exit code."""
    run(app, argv)


__all__ = ["app", "main"]
