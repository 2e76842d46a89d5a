"""Report files a command writes beside its result (validate's --junit, --report-md): each checked writable
before any slow work, so that an hours-long run is never lost to a mistyped path at its end, and each written
whole (a sibling file renamed over it), so that a failed write never leaves half a report."""

from __future__ import annotations

import errno
import os
import stat
import uuid
from pathlib import Path

# what an existing path is, when it is not a regular file: a report is never written over (renamed over) it,
# nor opened to probe it (opening a FIFO blocks until a reader comes; /dev/null renamed over is gone for everyone)
_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
          (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


def not_a_file(path: str | Path) -> str | None:
    """Why an existing `path` is no regular file a report may replace ("a character device, not a file"), or None
    (a regular file, or nothing there). A symbolic link is followed: one to a regular file is written through (the
    file it names is replaced, the link kept); one to anything else is refused, and said as a link."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # nothing there (or a dangling link: written through, as a new file)
        return None
    if stat.S_ISREG(mode):
        return None
    kind = next((name for test, name in _KINDS if test(mode)), "a special file")
    link = f"a symbolic link to {os.path.realpath(path)}, " if os.path.islink(path) else ""
    return f"{link}{kind}, not a file"


def unwritable(path: str | Path, *, appended: bool = False) -> str | None:
    """Why a file cannot be written at `path` (its directories created as needed), or None when it can.

    Probed, not guessed from permission bits: a root process ignores those, while a read-only file system,
    a regular file where a directory must be, or a kernel file system refuses it all the same. The probe is a
    file created and removed in the nearest directory that exists (an existing report is opened for
    appending, and left as it was). An existing path that is no regular file (a device, a FIFO, a socket, or a
    link to one) is refused unopened (`not_a_file`); `appended` (a file only ever appended to, as
    GITHUB_STEP_SUMMARY): a character device is taken (appending to /dev/stderr replaces nothing)."""
    path = Path(os.path.abspath(path))
    if path.is_dir():
        return "it is a directory"
    special = not_a_file(path)
    if special is not None and not (appended and stat.S_ISCHR(os.stat(path).st_mode)):
        return special
    if path.exists():
        try:
            with open(path, "a", encoding="utf-8"):
                pass
        except OSError as exc:
            return exc.strerror or str(exc)
        return None
    existing = path.parent
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    probe = existing / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.probe"
    try:
        with open(probe, "x", encoding="utf-8"):
            pass
    except OSError as exc:
        return f"cannot create a file in {existing} ({exc.strerror or exc})"
    try:
        probe.unlink()
    except OSError:
        pass
    return None


def write_text(path: str | Path, text: str) -> None:
    """Write `text` to `path` whole: into a sibling first, renamed over `path` once complete (a symbolic link
    is written through, to the file it names). Raises OSError; nothing is left behind when it does. A path that is
    no regular file (a device, a FIFO: `not_a_file`) is refused, never renamed over."""
    special = not_a_file(path)
    if special is not None:
        raise OSError(errno.EINVAL, special, str(path))
    path = Path(os.path.realpath(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "x", encoding="utf-8") as f:  # "x": the mode the umask gives, as a plain write would
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
