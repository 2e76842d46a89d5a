"""The `dflash-convert` console script and `python -m dflash_convert`.

Ctrl-C is answered from the first instant: the handler below is installed before the command line's
imports (typer, rich, the runtime's torch), which take a noticeable part of a second, so an early
Ctrl-C prints the same one `Error:` line (and JSON object under --json) as a late one, never a
traceback. cli.main takes over once it can turn KeyboardInterrupt into that line itself.
"""

import json
import os
import signal
import sys

INTERRUPTED_EXIT = 130  # 128 + SIGINT, what shells report for a Ctrl-C
INTERRUPTED = "interrupted (Ctrl-C); nothing was written at the destination"


def interrupted_now(signum=None, frame=None) -> None:  # noqa: ARG001 - a signal handler's signature
    """Say `Error: interrupted` (and the JSON error object under --json) and end the process at once."""
    args = sys.argv[1:]
    args = args[: args.index("--")] if "--" in args else args
    try:
        sys.stderr.write(f"Error: {INTERRUPTED}\n")
        sys.stderr.flush()
        if "--json" in args:
            error = {"error": {"message": INTERRUPTED, "file": None, "exit_code": INTERRUPTED_EXIT}}
            sys.stdout.write(json.dumps(error, indent=2) + "\n")
            sys.stdout.flush()
    finally:
        os._exit(INTERRUPTED_EXIT)


def main() -> None:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # an ignored SIGINT (nohup, `&`) stays so
        signal.signal(signal.SIGINT, interrupted_now)
    from dflash_convert.cli import main as run

    run()


if __name__ == "__main__":
    main()
