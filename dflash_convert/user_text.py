"""Text the user gave (a prompt category, a file name, a URL, a check name carrying a category) made inert where
the reports show it: refused at read when it carries control characters, escaped in every Markdown cell and
heading, and its control characters shown as escapes on the terminal (where an ESC sequence could erase or
rewrite the verdict line)."""

from __future__ import annotations

import html
import re

MAX_CATEGORY_CHARS = 64  # a category name is a label (SpecBench's, SPEED-Bench's are one or two words)
# C0 and C1 controls, DEL, and the Unicode bidirectional embeddings, overrides and isolates (they reorder what
# follows them on screen)
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def category_problem(name: str) -> str | None:
    """What makes `name` unfit for a category label (control characters, too long), else None."""
    bad = _CONTROL.search(name)
    if bad:
        return f"holds the control character U+{ord(bad.group()):04X} at character {bad.start() + 1}"
    if len(name) > MAX_CATEGORY_CHARS:
        return f"is {len(name)} characters long (at most {MAX_CATEGORY_CHARS})"
    return None


def printable(text: object) -> str:
    """`text` with its control characters (and bidi controls) written as escapes, \\x1b or \\u202e: for the terminal."""
    return _CONTROL.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def markdown_cell(text: object) -> str:
    """`text` for one Markdown table cell, heading or sentence: on one line (whitespace and control characters
    collapsed to a space), HTML's special characters as entities (so `<img ...>` or `<script>` stays text) and `|`
    escaped (it would end the cell)."""
    one_line = " ".join(_CONTROL.sub(" ", str(text)).split())
    return html.escape(one_line, quote=False).replace("|", "\\|")


def markdown_code(text: object) -> str:
    """`text` as a Markdown code span on one line: HTML inside one is not rendered; a backtick would end it early,
    so the span's fence is one backtick longer than the longest run of them inside."""
    one_line = " ".join(_CONTROL.sub(" ", str(text)).split())
    fence = "`" * (max((len(m) for m in re.findall("`+", one_line)), default=0) + 1)
    pad = " " if one_line.startswith("`") or one_line.endswith("`") else ""
    return f"{fence}{pad}{one_line}{pad}{fence}"
