"""Staged, all-or-nothing writes: a directory is built beside its destination and renamed into place
only when complete; any of STOP_SIGNALS (or an error) removes it, and a leftover of a dead run is
recognised by name (host, pid) and reported or removed.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import sys
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from dflash_convert.errors import DFlashError, Interrupted
from dflash_convert.io.watchdog import answered, ending, track_partial, untrack_partial

# Signals that end a write: each removes the staging directory and raises Interrupted (CLI exit 1).
# SIGHUP is what a dropped SSH session sends; SIGQUIT is Ctrl-\. A signal that was ignored when
# the run started (nohup ignores SIGHUP) stays ignored.
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, n))
_STAGING_RE = re.compile(r"\.(?P<label>.+)\.dflash-(?P<kind>staging|old)-(?P<host>[0-9a-f]{6})-(?P<pid>\d+)-[0-9a-f]{8}")


def _label(dest: Path) -> str:
    """dest's name, or a hash of it when too long for `.<name>.dflash-staging-...` to fit NAME_MAX (255)."""
    name = dest.name
    return name if len(name.encode("utf-8", "surrogateescape")) <= 200 else hashlib.sha256(
        name.encode("utf-8", "surrogateescape")).hexdigest()[:20]


def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def _sibling(dest: Path, base: Path, kind: str) -> Path:
    return base / f".{_label(dest)}.dflash-{kind}-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _staging_base(dest: Path) -> Path:
    """Where staging goes: dest's parent, or its nearest existing ancestor (parents are made at commit)."""
    base = dest.parent
    while not base.exists() and base != base.parent:
        base = base.parent
    return base


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid() or os.name == "nt":  # on Windows os.kill(pid, 0) would terminate the process
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # someone else's process (or not ours to judge): leave its files alone
    return True


def staging_leftovers(dest: str | Path) -> list[Path]:
    """Staging and `.old` directories of runs on `dest` (from this module's naming), live or dead."""
    dest = Path(os.path.abspath(dest))
    base = _staging_base(dest)
    try:
        entries = list(base.iterdir())
    except OSError:
        return []
    found = []
    for p in entries:
        m = _STAGING_RE.fullmatch(p.name)
        if m and m["label"] == _label(dest):
            found.append(p)
    return found


def remove_stale_staging(dest: str | Path) -> tuple[list[Path], list[Path]]:
    """Remove what killed runs on `dest` left beside it; (removed, kept) where kept are other hosts' or live."""
    removed, kept = [], []
    for p in staging_leftovers(dest):
        m = _STAGING_RE.fullmatch(p.name)
        if m["host"] == _host() and not _pid_alive(int(m["pid"])):
            shutil.rmtree(p, ignore_errors=True)
            (kept if p.exists() else removed).append(p)
        else:
            kept.append(p)
    return removed, kept


def check_destination(dest: Path, overwrite: bool, sources: tuple[Path, ...] = ()) -> None:
    dest = Path(os.path.abspath(dest))  # `.` and `x/..` name their directory; `/` names none
    if not dest.name:
        raise DFlashError("destination must name a directory to create or replace", file=dest)
    for src in sources:
        s, d = Path(src).resolve(), dest.resolve()
        if d == s or s in d.parents:
            raise DFlashError(f"destination is inside the source checkpoint {src}", file=dest)
        if d in s.parents:
            raise DFlashError(f"destination contains the source checkpoint {src}", file=dest)
    if dest.is_symlink():
        # Replacing it would swap the link for a directory (and leave the old link behind);
        # writing through it would stage on the link's file system, not the target's.
        raise DFlashError(f"destination is a symbolic link (to {os.readlink(dest)}); give the directory itself",
                          file=dest)
    base = _staging_base(dest)
    if not base.is_dir():
        raise DFlashError(f"{base} is not a directory", file=dest)
    if dest.exists() and not dest.is_dir():
        raise DFlashError("destination exists and is not a directory", file=dest)
    if dest.exists() and any(dest.iterdir()) and not overwrite:
        raise DFlashError("destination is not empty (pass --overwrite to replace it)", file=dest)


def _write_error(exc: OSError, dest: Path) -> DFlashError:
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return DFlashError(f"out of disk space while writing ({exc.strerror or exc}); nothing was written", file=dest)
    if exc.errno == errno.EFBIG:
        return DFlashError("a file is larger than the file system allows (try --max-shard-size); nothing was written",
                           file=dest)
    where = f" ({exc.filename})" if exc.filename else ""
    return DFlashError(f"cannot write: {exc.strerror or exc}{where}; nothing was written", file=dest)


# The first stop signal of the process ends it; later ones are ignored, so that a second Ctrl-C
# a few milliseconds after the first cannot cut the cleanup short, or kill the process by the signal
# with a traceback. `_written` are the destinations this process completed (the message says so).
# Ctrl-C: the one line (and JSON error object under --json) the process ends with, from its first instant
INTERRUPTED_EXIT = 130  # 128 + SIGINT, what shells report for a Ctrl-C
INTERRUPTED = "interrupted (Ctrl-C)"
WRITING_COMMANDS = ("convert", "pull", "push")  # the commands with a destination, left as it was


def interrupted_line(args: list[str]) -> str:
    """The Ctrl-C line of the command line `args` (without the program): a command that writes says that its
    destination was left as it was; the others (validate, inspect, ...) have none."""
    command = next((a for a in args if not a.startswith("-")), None)
    return INTERRUPTED + ("; nothing was written at the destination" if command in WRITING_COMMANDS else "")


def interrupted_now(signum=None, frame=None) -> None:  # noqa: ARG001 - a signal handler's signature
    """Say `Error: interrupted` (and the JSON error object under --json) and end the process at once."""
    args = sys.argv[1:]
    args = args[: args.index("--")] if "--" in args else args
    try:
        sys.stderr.write(f"Error: {interrupted_line(args)}\n")
        sys.stderr.flush()
        if "--json" in args:
            error = {"error": {"message": interrupted_line(args), "file": None, "exit_code": INTERRUPTED_EXIT}}
            sys.stdout.write(json.dumps(error, indent=2) + "\n")
            sys.stdout.flush()
    finally:
        os._exit(INTERRUPTED_EXIT)


_stopping: list[int] = []
_written: list[Path] = []


def _signal_name(signum: int) -> str:
    return signal.Signals(signum).name


def interrupted_message(signum: int) -> str:
    """What is true when a stop signal ends the process outside a staged write."""
    if _written:
        return f"interrupted by {_signal_name(signum)} after {_written[-1]} was written (it is complete)"
    return f"interrupted by {_signal_name(signum)}; nothing was written"


def _install(handler, signals: tuple[int, ...] = STOP_SIGNALS) -> dict:
    previous = {}
    for sig in signals:
        try:
            if signal.getsignal(sig) != signal.SIG_IGN:  # nohup's SIGHUP stays ignored
                previous[sig] = signal.signal(sig, handler)
        except (ValueError, OSError):  # not the main thread: keep the handlers as they are
            break
    return previous


def _restore(previous: dict) -> None:
    if _stopping:  # the process is ending on a signal: keep ignoring further ones until it has
        return
    for sig, handler in previous.items():
        signal.signal(sig, handler)


def _stop(signum: int) -> None:
    """The process is ending on `signum`: further stop signals are ignored by the OS (SIG_IGN), not by a
    Python handler, because the interpreter puts its handlers back to the default while it shuts down, and
    a second SIGTERM then would still kill the process by the signal after its one line was said."""
    _stopping.append(signum)
    answered.set()  # the watchdog stands down: this path ends the run
    for sig in STOP_SIGNALS:
        try:
            signal.signal(sig, signal.SIG_IGN)
        except (ValueError, OSError):  # not the main thread
            break


def stopping() -> bool:
    """A stop signal has been taken: the process is ending on it (later ones are to be ignored)."""
    return bool(_stopping)


@contextmanager
def stop_on_signals(signals: tuple[int, ...] = STOP_SIGNALS) -> Iterator[None]:
    """Inside the block, the first of STOP_SIGNALS raises Interrupted in the main thread (wherever it
    waits: a socket read, a retry's sleep) and any later one is ignored. The CLI runs every command
    inside it: a Hub download stopped by SIGTERM ends at once with one line, like a conversion."""

    def on_signal(signum, frame):  # noqa: ARG001
        if _stopping:
            return
        _stop(signum)
        raise Interrupted(interrupted_message(signum), signum=signum)

    previous = _install(on_signal, signals)
    try:
        yield
    finally:
        _restore(previous)


@contextmanager
def staged_directory(dest: str | Path, *, overwrite: bool = False, notes: list[str] | None = None) -> Iterator[Path]:
    """Yield a hidden staging directory beside `dest`; rename it onto `dest` only if the block succeeds.

    Any exception, and every signal of STOP_SIGNALS, removes the staging directory, and `dest` is
    then untouched (missing parent directories are created only at the commit). Signals that come
    during the commit are held until it is done; a signal after the first is ignored. A SIGKILL can
    only leave a hidden `.<name>.dflash-staging-<host>-<pid>-*` sibling: the next run on `dest`
    removes it once that pid is gone (and says so in `notes`). Out of space is one error naming `dest`.
    """
    dest = Path(os.path.abspath(dest))
    if not dest.name:
        raise DFlashError("destination must name a directory to create or replace", file=dest)
    removed, kept = remove_stale_staging(dest)
    if notes is not None:
        notes += [f"removed {p} left by a killed run" for p in removed]
        notes += [f"{p} belongs to a run still going (or on another host); left as is" for p in kept]
    held: list[int] = []
    state = {"hold": False}

    def on_signal(signum, frame):  # noqa: ARG001
        if _stopping:
            return
        if state["hold"]:
            held.append(signum)
            return
        _stop(signum)
        raise Interrupted(f"interrupted by {_signal_name(signum)}", signum=signum)

    base = _staging_base(dest)
    tmp = _sibling(dest, base, "staging")
    previous = _install(on_signal)
    try:
        try:
            try:
                tmp.mkdir()
            except OSError as exc:
                raise DFlashError(f"cannot create a staging directory in {base}: {exc.strerror or exc}",
                                  file=dest) from None
            track_partial(tmp)  # the stop watchdog removes it if it has to end the run
            yield tmp
            state["hold"] = True
            # No fsync: the rename makes DST atomic against process death (kill -9, Ctrl-C), which is
            # what users hit; forcing 2 GB to disk first would triple the cost of a conversion.
            with ending:  # the stop watchdog never ends the process between these renames
                dest.parent.mkdir(parents=True, exist_ok=True)
                if dest.is_symlink():
                    raise DFlashError("destination became a symbolic link during the conversion", file=dest)
                if dest.exists():
                    if not overwrite and any(dest.iterdir()):
                        raise DFlashError("destination appeared and is not empty", file=dest)
                    trash = _sibling(dest, dest.parent, "old")
                    dest.rename(trash)
                    try:
                        tmp.rename(dest)
                    except OSError:
                        trash.rename(dest)  # put the old output back: a failed overwrite changes nothing
                        raise
                    shutil.rmtree(trash, ignore_errors=True)
                else:
                    tmp.rename(dest)
                _written.append(dest)
        except OSError as exc:
            raise _write_error(exc, dest) from None
        except Interrupted as exc:
            state["hold"] = True
            shutil.rmtree(tmp, ignore_errors=True)
            what = "nothing was written" if not tmp.exists() else f"the partial output {tmp} could not be removed"
            raise Interrupted(f"{str(exc).split(';')[0]}; {what}", file=dest, signum=exc.signum) from None
    finally:
        state["hold"] = True  # a second Ctrl-C must not stop the cleanup half-way
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        untrack_partial(tmp)
        _restore(previous)
    if held:  # a signal that came during the commit ends the run now that DST is complete
        _stop(held[0])
        raise Interrupted(f"interrupted by {_signal_name(held[0])} just after the output was written "
                          "(it is complete)", file=dest, signum=held[0])
