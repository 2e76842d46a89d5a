"""The process entry: stop-signal handlers, token redaction, and every error turned into one `Error:` line
(and the JSON error object under --json) with its exit code (the table in _errors). `--debug` anywhere on
the line (or HF_DEBUG=1, DFLASH_CONVERT_DEBUG=1) shows tracebacks."""

import os
import signal
import sys
import traceback
from typing import Optional

import typer

from dflash_convert.cli._errors import Failure, failure_of
from dflash_convert.cli._output import emit_json, err, live
from dflash_convert.errors import Interrupted
from dflash_convert.io.staging import INTERRUPTED_EXIT, interrupted_line, interrupted_now


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _fail(message: str, *, exit_code: int, file: Optional[str], as_json: bool, debug: bool) -> None:
    _quiet_interrupts()
    live.stop()
    if debug:
        traceback.print_exc()
    err.print(f"Error: {message}", markup=False, soft_wrap=True)
    if as_json:
        emit_json({"error": {"message": message, "file": file, "exit_code": exit_code}})
    sys.exit(exit_code)


def _usage_failed(failure: Failure, exc: BaseException, as_json: bool) -> None:
    """click's usage errors: the usage line and `Error:` on stderr as click says them, never a traceback."""
    _quiet_interrupts()
    live.stop()
    if as_json:
        emit_json({"error": {"message": failure.message, "file": None, "exit_code": failure.exit_code}})
    if getattr(exc, "ctx", None) is not None:
        typer.echo(exc.ctx.get_usage() + f"\nTry '{exc.ctx.command_path} -h' for help.\n", err=True)
    typer.echo(f"Error: {failure.message}", err=True)
    sys.exit(failure.exit_code)


def _on_sigint(handler) -> None:
    """Install a SIGINT handler unless SIGINT is ignored (nohup, `&`), or this is not the main thread."""
    try:
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, handler)
    except (ValueError, TypeError):  # not the main thread; a handler Python did not install
        pass


def _quiet_interrupts() -> None:
    """From here to the exit a Ctrl-C still ends the process with its one line, never a traceback."""
    from dflash_convert.io.staging import stopping

    # once a stop signal is being answered, a second one must not add a line (or cut the first short)
    _on_sigint(signal.SIG_IGN if stopping() else interrupted_now)


def _stuck_line(args: list[str], as_json: bool):
    """What the stop watchdog says for the run `args` when it ends it: the line (and JSON error object) the
    normal path says for the same signal."""
    from dflash_convert.io.staging import interrupted_message

    def say(signum: int) -> None:
        message = interrupted_line(args) if signum == signal.SIGINT else interrupted_message(signum)
        if live.bar is not None:  # the live step line is not at its end: start a fresh line
            sys.stderr.write("\n")
        sys.stderr.write(f"Error: {message}\n")
        sys.stderr.flush()
        if as_json:
            emit_json({"error": {"message": message, "file": None, "exit_code": 128 + signum}})

    return say


def run(app: typer.Typer, argv: Optional[list[str]] = None) -> None:
    """The console script's work: run the app, turn every error into one line (and JSON) and an exit code.

    The SIGINT handler it found is put back when it returns (the console script's says `interrupted` until
    the process ends; an in-process caller, e.g. a test, gets its own back)."""
    previous = signal.getsignal(signal.SIGINT)
    try:
        _main(app, argv)
    finally:
        if previous is not None:
            _on_sigint(previous)


def _main(app: typer.Typer, argv: Optional[list[str]]) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    end = args.index("--") if "--" in args else len(args)  # after `--` everything is an argument
    debug = "--debug" in args[:end] or _env_flag("HF_DEBUG") or _env_flag("DFLASH_CONVERT_DEBUG")
    as_json = "--json" in args[:end]
    args = [a for i, a in enumerate(args) if not (a == "--debug" and i < end)]
    from dflash_convert.io.staging import STOP_SIGNALS, stop_on_signals
    from dflash_convert.io.watchdog import watch_stop_signals

    try:
        _on_sigint(signal.default_int_handler)  # from here a Ctrl-C is a KeyboardInterrupt
        from dflash_convert.hub.tokens import redact_output

        redact_output(args)  # before anything can print: no token in any stream, traceback or warning
        # SIGTERM, SIGHUP, SIGQUIT end any command (a Hub download too) with one line; a second one is ignored
        # and where the main thread is inside one long C call (a long-context prefill) and cannot answer, the
        # watchdog ends the run after a grace period as the normal path would
        with watch_stop_signals(_stuck_line(args, as_json)), \
                stop_on_signals(tuple(s for s in STOP_SIGNALS if s != signal.SIGINT)):
            rc = app(args=args, prog_name="dflash-convert", standalone_mode=False)  # typer.Exit codes come back
        _quiet_interrupts()
        live.stop()
        if rc == INTERRUPTED_EXIT:  # typer turns a KeyboardInterrupt into this code, silently
            _fail(interrupted_line(args), exit_code=INTERRUPTED_EXIT, file=None, as_json=as_json, debug=False)
        sys.exit(rc if isinstance(rc, int) else 0)
    except (Exception, KeyboardInterrupt, Interrupted) as exc:  # noqa: BLE001 - each one line unless --debug
        failure = failure_of(exc, debug)
        if failure.usage:
            _usage_failed(failure, exc, as_json)
        _fail(failure.message, exit_code=failure.exit_code, file=failure.file, as_json=as_json, debug=debug)
