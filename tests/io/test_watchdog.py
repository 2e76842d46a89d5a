"""The stop watchdog (io/watchdog.py) ends a run only where the main thread cannot answer a stop signal; a normal
path that answers it, however long its own cleanup takes, is never cut short. (The watchdog ending a run stuck in
one C call: tests/io/test_staging.py, test_sigterm_inside_a_long_c_call_ends_the_run_within_seconds.)"""

from __future__ import annotations

import signal
import subprocess
import sys

from processes import ROOT, stop_signals_at_default

CHILD = r'''
import os, signal, sys, time
from dflash_convert.io.watchdog import watch_stop_signals


def slow_cleanup(signum, frame):  # the normal path: stopping an engine's process group polls for seconds
    for _ in range(30):
        time.sleep(0.05)
    print("normal path", flush=True)
    sys.exit(7)


signal.signal(signal.SIGTERM, slow_cleanup)
with watch_stop_signals(lambda signum: print("watchdog", flush=True), grace_s=0.5):
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(10)
'''


def test_a_normal_path_slower_than_the_grace_period_is_not_cut_short():
    p = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=30, cwd=ROOT,
                       preexec_fn=stop_signals_at_default)
    assert (p.returncode, p.stdout) == (7, "normal path\n"), (p.returncode, p.stdout, p.stderr)
