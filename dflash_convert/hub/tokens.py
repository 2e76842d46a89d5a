"""Hub tokens: cleaned and checked once, and kept out of every byte the process writes.

A token read from a file with Windows line endings, or `echo`ed into a variable, ends in \\r or \\n;
sent as is, the HTTP library refuses the header and quotes it (token included) in its error. So a
token is stripped once and refused, without being printed, if it still holds a character an HTTP
header cannot carry. Every token seen is remembered in all the forms a message may show it (as
given, stripped, escaped by repr or JSON), and `redact_output` replaces them by `***` in everything
written to stdout and stderr: our error lines, warnings, the log records of huggingface_hub and its
HTTP library, and --debug tracebacks.

Only the standard library here: the CLI installs the redaction before anything else is imported.
"""

from __future__ import annotations

import json
import logging
import os
import re
import sys
import warnings

from dflash_convert.errors import DFlashError, UsageError

REDACTED = "***"
TOKEN_VARIABLES = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
MIN_SECRET = 4  # shorter fragments would blank ordinary text and hide nothing worth hiding
_forms: set[str] = set()


def remember(secret: str | None) -> None:
    """Redact `secret` from now on, in every form a message may quote it."""
    if not secret:
        return
    forms = set()
    for text in (secret, secret.strip()):
        forms |= {text, repr(text)[1:-1], json.dumps(text)[1:-1],
                  repr(text.encode("utf-8", "backslashreplace"))[2:-1]}
    # What is left when a printer drops or escapes the characters a header cannot carry.
    forms.update(re.findall(r"[\x21-\x7e]{8,}", secret))
    _forms.update(f for f in forms if len(f) >= MIN_SECRET)


def redact(text: str) -> str:
    for form in sorted(_forms, key=len, reverse=True):
        if form in text:
            text = text.replace(form, REDACTED)
    return text


def clean_token(token: str, *, source: str) -> str:
    """`token` without surrounding whitespace/CR/LF; refused (not printed) if a header cannot carry it."""
    remember(token)
    cleaned = token.strip(" \t\r\n")
    error = UsageError if source == "--token" else DFlashError
    if not cleaned:
        raise error(f"the Hub token from {source} is empty")
    bad = next((i for i, c in enumerate(cleaned) if not "\x21" <= c <= "\x7e"), None)
    if bad is not None:
        raise error(f"the Hub token from {source} holds a character an HTTP header cannot carry (a control "
                    f"character, space or non-ASCII character at position {bad + 1}); it was not sent")
    return cleaned


def hub_token(token: str | None) -> str | None:
    """The token to hand to huggingface_hub: --token cleaned, else None (the client then applies its own
    precedence: HF_TOKEN, then the stored token), after checking and remembering that token too."""
    if token is not None:
        return clean_token(token, source="--token")
    from huggingface_hub import get_token

    implicit = get_token()  # the client strips CR/LF from these itself, but not other characters
    if implicit is not None:
        source = next((f"${name}" for name in TOKEN_VARIABLES if (os.environ.get(name) or "").strip()),
                      "the stored token (`hf auth login`)")
        clean_token(implicit, source=source)
    return None


class _Redacting:
    """A text stream that writes through `redact` (writers hand over whole messages: print's arguments,
    log records, warnings, traceback lines)."""

    def __init__(self, stream):
        self._stream = stream
        self.line_open = False  # a progress bar left the cursor mid-line

    def write(self, text: str) -> int:
        self._stream.write(redact(text))
        if text:
            self.line_open = not text.endswith("\n")
        return len(text)

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name):  # flush, isatty, fileno, encoding, ...
        return getattr(self._stream, name)


def end_open_line() -> None:
    """End a line a progress bar left open on stderr, so that the next message starts a line of its own."""
    if getattr(sys.stderr, "line_open", False):
        sys.stderr.write("\n")


def _argv_tokens(argv: list[str]) -> list[str]:
    found = [v.split("=", 1)[1] for v in argv if v.startswith("--token=")]
    return found + [argv[i + 1] for i, v in enumerate(argv[:-1]) if v == "--token"]


def redact_output(argv: list[str] | None = None) -> None:
    """Route stdout, stderr, warnings and the log handlers already bound to them through `redact`.

    Remembers the tokens of the command line and the environment at once; `hub_token` adds the
    stored token when it is read. Idempotent.
    """
    argv = sys.argv[1:] if argv is None else argv
    for secret in [*_argv_tokens(argv), *(os.environ.get(n) for n in TOKEN_VARIABLES)]:
        remember(secret)
    handlers = list(logging.getLogger().handlers)
    for logger in list(logging.Logger.manager.loggerDict.values()):
        handlers += getattr(logger, "handlers", [])
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if isinstance(stream, _Redacting):
            continue
        wrapped = _Redacting(stream)
        setattr(sys, name, wrapped)
        for handler in handlers:  # e.g. huggingface_hub's, bound to the raw stream when it was imported
            if isinstance(handler, logging.StreamHandler) and handler.stream is stream:
                handler.setStream(wrapped)
    if not getattr(warnings.showwarning, "redacting", False):
        show = warnings.showwarning

        def showwarning(message, category, filename, lineno, file=None, line=None):
            show(redact(str(message)), category, filename, lineno, file, line)

        showwarning.redacting = True
        warnings.showwarning = showwarning
