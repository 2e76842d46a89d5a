"""The last resort for a stop signal Python cannot answer in time. Python runs its signal handlers only between
bytecodes of the main thread, so a run inside one long C call (a long-context prefill on CPU is a single call
lasting minutes) would not end on SIGTERM until that call returns. The signal's C-level handler writes the
signal's number to a wakeup socket at once (signal.set_wakeup_fd); a daemon thread reading it watches the main
thread for GRACE_S seconds, and where it has not moved from its instruction (it could not run a Python handler)
does what the normal path does: removes the partial outputs registered here (staging directories), says the
run's one line, and ends the process with 128 + the signal's number. Exactly one of the two ends the run: each claims it under `ending`, which a staged
commit also holds, so the watchdog never ends the process half-way through a rename."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

GRACE_S = 5.0  # what the normal path gets to answer a stop signal before the watchdog ends the process
STOP_SIGNAL_NAMES = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT")

# held by a staged commit (renames that must all happen or none) and, for good, by the watchdog ending the run
ending = threading.Lock()
answered = threading.Event()  # set by a stop signal's Python handler (io/staging): the normal path has taken it
_partial: dict[Path, None] = {}  # partial outputs to remove if the watchdog ends the run (insertion-ordered)


def track_partial(path: Path) -> None:
    """`path` (a directory or a file being written) is removed if the watchdog ends the run, until untracked."""
    _partial[path] = None


def untrack_partial(path: Path) -> None:
    _partial.pop(path, None)


def _remove_partials() -> None:
    for path in list(_partial):
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        except OSError:
            pass


def _main_at() -> tuple[int, int] | None:
    """Where the main thread's Python code stands: its innermost frame and instruction (not kept)."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    return None if frame is None else (id(frame), frame.f_lasti)


def _stuck(grace_s: float, done: threading.Event) -> bool:
    """Whether the main thread stays at one instruction for `grace_s` seconds: inside one C call, where no Python
    handler can run. Once it moves, it runs Python again, and Python runs a pending handler at once: the normal
    path answers the signal, however long its own cleanup takes (a vLLM engine group given 10 s to stop)."""
    at = _main_at()
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        if done.wait(0.05) or _main_at() != at or answered.is_set():
            return False
    return True


@contextmanager
def watch_stop_signals(say: Callable[[int], None], grace_s: float = GRACE_S) -> Iterator[None]:
    """Inside the block, a stop signal the main thread has not answered within `grace_s` seconds ends the
    process: partial outputs removed, `say(signum)` (the one line), exit 128 + signum. Outside the main thread,
    or where another wakeup fd is set (an event loop's), nothing is watched."""
    stop = {getattr(signal, n) for n in STOP_SIGNAL_NAMES if hasattr(signal, n)}
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    reader, writer = socket.socketpair()
    writer.setblocking(False)
    try:
        previous = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
    except (ValueError, OSError):
        previous = None
    if previous != -1:  # not ours to take (or not settable): the normal path alone answers
        if previous is not None:
            signal.set_wakeup_fd(previous)
        reader.close()
        writer.close()
        yield
        return
    run = {"ended": False}
    done = threading.Event()
    answered.clear()

    def watch() -> None:
        try:
            while not done.is_set():
                data = reader.recv(64)
                signum = next((b for b in data if b in stop), None)
                if not data or signum is None:
                    continue
                if not _stuck(grace_s, done):  # the main thread answers (or ended the run): its path alone
                    return
                ending.acquire()  # never released: the process ends holding it
                if run["ended"]:
                    ending.release()
                    return
                run["ended"] = True
                try:
                    _remove_partials()
                    say(signum)
                finally:
                    os._exit(128 + signum)
        except OSError:
            return
        finally:
            reader.close()

    threading.Thread(target=watch, name="dflash-stop-watchdog", daemon=True).start()
    try:
        yield
    finally:
        with ending:  # blocks for good where the watchdog is ending the process
            run["ended"] = True
        done.set()
        signal.set_wakeup_fd(-1)
        try:
            writer.send(b"\0")  # wakes the thread's read so that it sees `done`
        except OSError:
            pass
        writer.close()
