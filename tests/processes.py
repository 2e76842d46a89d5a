"""Child processes: the Python with vLLM that the engine tests run (VLLM_PYTHON, needs_vllm), and the signal
tests' children, started with every stop signal at its default, as in a terminal.

A suite started as a background job (`pytest &`) has SIGINT and SIGQUIT ignored, one under nohup has
SIGHUP ignored, and a child inherits that. The tool keeps a signal that was ignored when it started
ignored (nohup's promise), so a child that inherited one would never stop when a test sends it.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

STOP_SIGNALS = [getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, n)]


def stop_signals_at_default() -> None:
    """A Popen preexec_fn: the child starts with SIGINT, SIGTERM, SIGHUP and SIGQUIT at their defaults
    (Python then turns SIGINT into KeyboardInterrupt, as it does in a terminal)."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_DFL)


VLLM_PYTHON = os.environ.get("DFLASH_VLLM_PYTHON") or str(ROOT / "build" / "vllm-venv" / "bin" / "python")


needs_vllm = pytest.mark.skipif(not os.access(VLLM_PYTHON, os.X_OK), reason=f"no Python with vLLM at {VLLM_PYTHON}: "
                                "run scripts/setup-vllm.sh (builds build/vllm-venv) or set DFLASH_VLLM_PYTHON")
