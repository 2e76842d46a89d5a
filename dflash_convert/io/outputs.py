"""Report files a command writes beside its result (validate's --junit, --report-md): each checked writable
before any slow work, so that an hours-long run is never lost to a mistyped path at its end, and each written
whole (a sibling file renamed over it), so that a failed write never leaves half a report."""

from __future__ import annotations

import os
import uuid
from pathlib import Path


def unwritable(path: str | Path) -> str | None:
    """Why a file cannot be written at `path` (its directories created as needed), or None when it can.

    Probed, not guessed from permission bits: a root process ignores those, while a read-only file system,
    a regular file where a directory must be, or a kernel file system refuses it all the same. The probe is a
    file created and removed in the nearest directory that exists (an existing report is opened for
    appending, and left as it was)."""
    path = Path(os.path.abspath(path))
    if path.is_dir():
        return "it is a directory"
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
    is written through, to the file it names). Raises OSError; nothing is left behind when it does."""
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
