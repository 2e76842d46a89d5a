"""Child processes for the signal tests: started with every stop signal at its default, as in a terminal.

A suite started as a background job (`pytest &`) has SIGINT and SIGQUIT ignored, one under nohup has
SIGHUP ignored, and a child inherits that. The tool keeps a signal that was ignored when it started
ignored (nohup's promise), so a child that inherited one would never stop when a test sends it.
"""

from __future__ import annotations

import signal

STOP_SIGNALS = [getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, n)]


def stop_signals_at_default() -> None:
    """A Popen preexec_fn: the child starts with SIGINT, SIGTERM, SIGHUP and SIGQUIT at their defaults
    (Python then turns SIGINT into KeyboardInterrupt, as it does in a terminal)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)
