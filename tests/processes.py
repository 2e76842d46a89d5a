"""Child processes: the Python with vLLM that the engine tests run (VLLM_PYTHON, needs_vllm, require_vllm), and the signal
tests' children, started with every stop signal at its default, as in a terminal.

A suite started as a background job (`pytest &`) has SIGINT and SIGQUIT ignored, one under nohup has
SIGHUP ignored, and a child inherits that. The tool keeps a signal that was ignored when it started
ignored (nohup's promise), so a child that inherited one would never stop when a test sends it.
"""

from __future__ import annotations

import functools
import os
import signal
import subprocess
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


# scripts/test.sh (.ci/run) sets it: a real-engine test that cannot run then fails instead of skipping
REQUIRE_VLLM = os.environ.get("DFLASH_REQUIRE_VLLM") == "1"

# The real-engine tests: skipped without a Python that imports vLLM, failed under DFLASH_REQUIRE_VLLM=1 (the conftest
# acts on the mark before each test and counts them in the summary line).
needs_vllm = pytest.mark.needs_vllm


@functools.cache
def vllm_missing() -> str | None:
    """Why the real vLLM engine cannot run here (None: it can): no Python at VLLM_PYTHON, or one that cannot import
    vllm (a venv whose build failed or is still under way). Checked once per session."""
    if not os.access(VLLM_PYTHON, os.X_OK):
        return (f"no Python with vLLM at {VLLM_PYTHON}: run scripts/setup-vllm.sh (builds build/vllm-venv) or set "
                "DFLASH_VLLM_PYTHON")
    try:
        run = subprocess.run([VLLM_PYTHON, "-c", "import vllm"], capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{VLLM_PYTHON} cannot run `import vllm`: {exc}"
    if run.returncode:
        last = (run.stderr.strip().splitlines() or ["no message"])[-1]
        return f"{VLLM_PYTHON} cannot import vllm ({last})"
    return None


def require_vllm() -> None:
    """Skip the calling test when the real vLLM engine cannot run; fail it under DFLASH_REQUIRE_VLLM=1."""
    reason = vllm_missing()
    if reason is not None:
        if REQUIRE_VLLM:
            pytest.fail(f"DFLASH_REQUIRE_VLLM=1 and {reason}", pytrace=False)
        pytest.skip(reason)
