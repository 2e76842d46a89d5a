"""The documentation names only what exists: every repository path the README and docs/ name (in text,
code or a link) is a file or folder of the repository, and every relative link resolves."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "examples").rglob("*.md"))]
# the repository's own top-level files and folders (tracked: not build/, out/ or .venv/, which runs make)
TOP = sorted({f.split("/")[0] for f in subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True,
                                                       check=True).stdout.splitlines()} - {".gitignore"})
# a repository path: a top-level folder or file, then path characters (no glob, no placeholder)
PATH = re.compile(r"(?<![\w./~-])((?:" + "|".join(re.escape(t) for t in TOP) + r")(?:/[\w.-]+)*/?)(?![\w*{<-])")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def named_paths(doc: Path, text: str | None = None) -> list[tuple[int, str]]:
    """(line, path) of every repository path the document (or `text`, as if it were the document) names, and
    of every relative link, resolved from the document's folder."""
    found = []
    for n, line in enumerate((doc.read_text() if text is None else text).splitlines(), 1):
        for m in PATH.finditer(line):
            path = m.group(1).rstrip(".")
            if "/" in path or path in TOP and line[m.start() - 1:m.start()] == "`":
                found.append((n, path))
        for m in LINK.finditer(line):
            target = m.group(1)
            if "://" not in target and not target.startswith("mailto:"):
                found.append((n, str((doc.parent / target).resolve().relative_to(ROOT))))
    return found


def test_every_path_the_docs_name_exists():
    missing = [f"{doc.relative_to(ROOT)}:{n}: {path}" for doc in DOCS for n, path in named_paths(doc)
               if not (ROOT / path).exists()]
    assert not missing, "paths named in the docs that do not exist:\n" + "\n".join(missing)


def test_the_path_finder_finds_paths():
    """The finder itself: a stale path in code is reported, a link resolves from the page that holds it, a
    placeholder is not a path."""
    doc = ROOT / "docs" / "engines.md"
    assert named_paths(doc, "see `dflash_convert/catalogue.py` (moved)") == [(1, "dflash_convert/catalogue.py")]
    assert named_paths(doc, "in [formats](formats.md#section-9)") == [(1, "docs/formats.md")]
    assert named_paths(doc, "write `out/{name}.json` or tests/test_*.py") == []


def test_the_formats_page_refuses_no_registered_kind():
    """docs/formats.md's speculators_model_type row lists the values the tool refuses: none may be a kind the
    registry reads (it said `dspark` was refused long after dspark drafts were converted and run); the kinds
    themselves are the page's generated table (tests/test_structure.py keeps it current)."""
    from dflash_convert.format import kinds

    row = next(line for line in (ROOT / "docs" / "formats.md").read_text().splitlines()
               if line.startswith("| `speculators_model_type` |"))
    refused = set(re.findall(r"`(\w+)`", row.partition("other values")[2]))
    assert refused and not refused & set(kinds.KINDS), f"docs/formats.md says registered kinds are refused: " \
                                                       f"{sorted(refused & set(kinds.KINDS))}"
