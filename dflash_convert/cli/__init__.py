"""The `dflash-convert` command line: one typer app, each command a thin module over a library call.

Conventions (as the `hf` CLI): `-h`/`--help`; results (the inspect view, the diff summary, the
validation report and its verdict, convert's summary, a pulled path or pushed URL) on stdout;
progress, info lines, warnings and errors on stderr; `--json` prints exactly one JSON object on
stdout, errors included (`{"error": {"message", "file", "exit_code"}}`); `-q` keeps the verdict
line, failures, warnings and errors. Plain text when not a terminal (rich's own rule) or with
NO_COLOR. Exit codes and `--debug`: _entry and _errors.

Layout (as huggingface_hub's cli/): this module makes the app and registers the commands; _output
(stdout/stderr, live step lines, --json), _errors (exception -> exit code and message, a table),
_entry (the process: signals, redaction, errors), _params (choices, parsers, shared options),
_options (flags generated from an options model), and one module per command.
"""

import re
from typing import Annotated, Optional

import typer
from typer.core import TyperCommand

from dflash_convert.cli import convert, diff, inspect, pull, push, schema, validate
from dflash_convert.cli._entry import run
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


PANEL_ORDER = ("Arguments", "Inputs", "Decoding", "Runtime", "Engine", "Thresholds", "Reports", "Options")


class _Command(TyperCommand):
    """Usage lines as click and man pages write them: a required argument plain (`SRC`), not typer's `{SRC}`."""

    def collect_usage_pieces(self, ctx) -> list[str]:
        return [re.sub(r"\{([^{}]+)\}", r"\1", piece) for piece in super().collect_usage_pieces(ctx)]

    def format_options(self, ctx, formatter) -> None:
        """Arguments, then the options under their panel's heading (an options model's HELP_PANELS) in
        PANEL_ORDER, the rest under Options: click's plain layout, one section per group."""
        sections: dict[str, list] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                heading = "Arguments" if param.param_type_name == "argument" else \
                    getattr(param, "rich_help_panel", None) or "Options"
                sections.setdefault(heading, []).append(record)
        order = {name: i for i, name in enumerate(PANEL_ORDER)}
        for heading in sorted(sections, key=lambda h: order.get(h, len(order))):
            with formatter.section(heading):
                formatter.write_dl(sections[heading])


# in the order --help lists them
for _module in (convert, inspect, diff, schema, pull, push, validate):
    _name = _module.__name__.rpartition(".")[2]
    app.command(cls=_Command, epilog=_module.EPILOG)(getattr(_module, _name))


def main(argv: Optional[list[str]] = None) -> None:
    """Console-script entry point (see _entry.run): the app, each error one line (and JSON) and an exit code."""
    run(app, argv)


__all__ = ["app", "main"]
