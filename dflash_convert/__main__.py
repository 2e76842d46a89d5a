"""The `dflash-convert` console script and `python -m dflash_convert`.

Ctrl-C is answered from the first instant: the handler below is installed before the command line's
imports (typer, rich, the runtime's torch), which take a noticeable part of a second, so an early
Ctrl-C prints the same one `Error:` line (and JSON object under --json) as a late one, never a
traceback. cli.main takes over once it can turn KeyboardInterrupt into that line itself. The handler
lives with the other stop-signal handling (io.staging, standard library imports only), so the CLI
uses it without importing this module.
"""

import signal

from dflash_convert.io.staging import interrupted_now


def main() -> None:
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # an ignored SIGINT (nohup, `&`) stays so
        signal.signal(signal.SIGINT, interrupted_now)
    from dflash_convert.cli import main as run

    run()


if __name__ == "__main__":
    main()
