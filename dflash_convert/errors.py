"""Errors users see: one line each, mapped to documented exit codes by the CLI.

Exit codes: 0 ok, 1 error (bad input, I/O), 2 usage, 3 validation ran and failed.
"""

from __future__ import annotations


class DFlashError(Exception):
    """Bad input or a failed operation. The message names the file and the field or tensor."""

    exit_code = 1

    def __init__(self, message: str, *, file: str | None = None):
        self.file = str(file) if file is not None else None
        super().__init__(f"{self.file}: {message}" if self.file else message)


class NotRunnable(DFlashError):
    """A well-formed input the bundled runtime cannot run exactly (a draft variant or RoPE type it does
    not implement): validate says it could not run (exit 1) instead of failing the draft (exit 3)."""


class UsageError(DFlashError):
    """Wrong or contradictory command-line options."""

    exit_code = 2


class ValidationFailed(DFlashError):
    """Validation ran to the end and at least one check failed."""

    exit_code = 3


class Interrupted(BaseException):
    """A stop signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT) ended a write; its partial output was removed.

    A BaseException, like KeyboardInterrupt, so that no `except Exception` on the way swallows it.
    The exit code is the shells' 128 + signal number (130 for Ctrl-C), as for a Ctrl-C anywhere else.
    """

    exit_code = 130

    def __init__(self, message: str, *, file: str | None = None, signum: int | None = None):
        self.file = str(file) if file is not None else None
        self.signum = signum
        if signum is not None:
            self.exit_code = 128 + int(signum)
        super().__init__(f"{self.file}: {message}" if self.file else message)


# The optional modules and the extra of pyproject.toml that installs each: a command that needs one
# that is missing says which extra to install, in one line.
EXTRAS = {"torch": "runtime", "transformers": "runtime", "safetensors": "runtime", "accelerate": "runtime"}


def missing_extra(exc: ModuleNotFoundError) -> DFlashError | None:
    """The one-line error for an optional module that is not installed (None for any other module)."""
    module = (exc.name or "").split(".")[0]
    extra = EXTRAS.get(module)
    if extra is None:
        return None
    # the package is installed from a clone of its repository (it is not on PyPI): the extra comes from there too
    return DFlashError(f"this command needs {module}, which is not installed: run pip install -e '.[{extra}]' in "
                       "your clone of dflash-convert")
