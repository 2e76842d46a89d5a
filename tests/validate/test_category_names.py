"""A prompt category is user text the reports print: one carrying control characters (an ESC sequence that
erases the FAILED line, a newline, a bidi override) or too long to be a label is refused where the file is read,
and what is printable is escaped in every Markdown cell (HTML, `|`) and on the terminal."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from dflash_convert.user_text import MAX_CATEGORY_CHARS, markdown_cell, markdown_code, printable

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"
HOSTILE = "x|y<img src=x onerror=alert(1)><script>"


def _prompts(path: Path, categories: list[str]) -> Path:
    lines = PAIR.joinpath("prompts.txt").read_text().splitlines()
    path.write_text("".join(json.dumps({"prompt": [int(t) for t in lines[i].split()], "category": c}) + "\n"
                            for i, c in enumerate(categories)))
    return path


@pytest.mark.parametrize("category, why", [
    ("c\x1b[2K\x1b[1A\nPASSED all fine\r", "holds the control character U+001B at character 2"),
    ("two\nlines", "holds the control character U+000A at character 4"),
    ("del\x7f", "holds the control character U+007F at character 4"),
    ("c1\x9b", "holds the control character U+009B at character 3"),
    ("abc\u202edoc.exe", "holds the control character U+202E at character 4"),
    ("iso\u2066x", "holds the control character U+2066 at character 4"),
    ("c" * (MAX_CATEGORY_CHARS + 1), f"is {MAX_CATEGORY_CHARS + 1} characters long (at most {MAX_CATEGORY_CHARS})"),
])
def test_a_category_that_is_no_label_is_refused_at_read_naming_file_line_and_field(cli, tmp_path, category, why):
    f = _prompts(tmp_path / "p.jsonl", ["code", category])
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--prompts", f, "--levels", "end_to_end")
    assert r.code == 1, r.err
    assert r.err.strip() == f"Error: {f}: line 2: `category` {why}"
    assert r.out == ""


def test_the_longest_category_allowed_still_reads():
    from dflash_convert.user_text import category_problem

    assert category_problem("c" * MAX_CATEGORY_CHARS) is None and category_problem("qa, misc = 2 ü") is None


def test_markdown_and_terminal_escaping_make_user_text_inert():
    assert markdown_cell(HOSTILE + "\nnext\r") == "x\\|y&lt;img src=x onerror=alert(1)&gt;&lt;script&gt; next"
    assert markdown_cell("a & b") == "a &amp; b"
    assert markdown_code("/p/a`b") == "``/p/a`b``" and markdown_code("`x") == "`` `x ``"
    assert printable("c\x1b[2K\nok\u202e") == "c\\x1b[2K\\nok\\u202e"


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory):
    from tests.conftest import run_cli

    d = tmp_path_factory.mktemp("hostile")
    f = _prompts(d / "p.jsonl", [HOSTILE, "code"])
    r = run_cli("validate", str(PAIR / "draft"), "--target", str(PAIR / "target"), "--prompts", str(f), "--levels",
                "end_to_end", "--sampling", "greedy", "--max-new-tokens", "8", "--min-acceptance-length",
                json.dumps({HOSTILE: 99}), "--report-md", str(d / "r.md"), "--json")
    return r, (d / "r.md").read_text(), d


def test_a_category_with_html_and_a_pipe_lands_escaped_in_every_markdown_cell(hostile_run):
    r, md, _ = hostile_run
    assert r.code == 3, r.err
    assert "<img" not in md and "<script" not in md and "onerror=alert(1)>" not in md
    escaped = "x\\|y&lt;img src=x onerror=alert(1)&gt;&lt;script&gt;"
    rows = [line for line in md.splitlines() if line.startswith("| ") and escaped in line]
    # the category table's row and the checks table's row, each with its own number of cells
    assert any(line.startswith(f"| {escaped} | 1 | ") for line in rows), rows
    assert any(line.startswith(f"| acceptance_length[{escaped}] | end_to_end | fail | category {escaped}: tau")
               for line in rows), rows
    for line in rows:
        assert line.replace("\\|", "").count("|") == (7 if line.startswith(f"| {escaped}") else 5), line


def test_the_terminal_report_prints_a_check_names_control_characters_as_escapes(hostile_run):
    """Defense in depth: a report whose check name or category carries ESC (a library caller's, a report read
    back) never writes the raw sequence to the terminal."""
    from rich.console import Console

    from dflash_convert.validate.report import ValidationReport
    from dflash_convert.validate.report_terminal import render_table

    data = hostile_run[0].json()
    data["checks"][-1]["name"] = "acceptance_length[c\x1b[2K\x1b[1A]"
    data["acceptance"]["per_category"][0]["label"] = "c\x1b[2K\x1b[1A"
    out = io.StringIO()
    render_table(ValidationReport.model_validate(data), Console(file=out, width=200, no_color=True))
    text = out.getvalue()
    assert "\x1b" not in text and "acceptance_length[c\\x1b[2K\\x1b[1A]" in text and "  c\\x1b[2K\\x1b[1A  tau" in text
