"""What each kind of error becomes: its one `Error:` line, exit code and file (a table, first match wins).

Exit codes: 0 ok, 1 error, 2 usage, 3 validation ran and failed, 130 interrupted (Ctrl-C; 128 + the
signal for other stop signals)."""

import re
import sys
from dataclasses import dataclass
from typing import Any, Callable, Optional

import typer

from dflash_convert.errors import DFlashError, Interrupted, missing_extra
from dflash_convert.io.staging import INTERRUPTED_EXIT, interrupted_line


@dataclass(frozen=True)
class Failure:
    message: str
    exit_code: int
    file: Optional[str] = None
    usage: bool = False  # click's: said with the usage line, never a traceback


def usage_message(exc: Exception) -> str:
    """click's message, with typer's pydantic wording of a bad choice said plainly."""
    text = exc.format_message()
    bad = re.search(r"Value error, (.+) is not one of (.+?)\.?$", text)
    if bad:
        allowed = ", ".join(c.strip(" '") for c in bad.group(2).split(","))
        text = text[: bad.start()] + f"{bad.group(1)} is not one of the choices: {allowed}"
    return text


def _missing_extra(exc: ModuleNotFoundError) -> Optional[Failure]:
    missing = missing_extra(exc)  # an optional dependency: name the extra that installs it
    return None if missing is None else Failure(str(missing), missing.exit_code)


class UsageErrors:
    """click's usage errors (the copy typer carries): whatever has its message and its exit code."""

    def __instancecheck__(self, exc: object) -> bool:
        return hasattr(exc, "format_message") and hasattr(exc, "exit_code")


# exception types -> what they say; None: not this row, the next one that matches decides
TABLE: tuple[tuple[Any, Callable[[Any], Optional[Failure]]], ...] = (
    # Interrupted: a stop signal during a write (staging already gone); its code is 128 + the signal
    ((DFlashError, Interrupted), lambda exc: Failure(str(exc), exc.exit_code, exc.file)),
    ((KeyboardInterrupt, typer.Abort), lambda exc: Failure(interrupted_line(sys.argv[1:]), INTERRUPTED_EXIT)),
    ((ModuleNotFoundError,), _missing_extra),
    ((UsageErrors(),), lambda exc: Failure(usage_message(exc), exc.exit_code, usage=True)),
)


def failure_of(exc: BaseException, debug: bool) -> Failure:
    """The row of TABLE that answers `exc`; anything else is unexpected: its type and text, exit 1."""
    for types, say in TABLE:
        if isinstance(exc, types):
            found = say(exc)
            if found is not None:
                return found
    return Failure(f"{type(exc).__name__}: {exc}" + ("" if debug else " (rerun with --debug for the traceback)"), 1)
