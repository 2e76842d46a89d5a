"""Every generated file of the repository, from the code that states its facts, in one command:

    python -m dflash_convert.regenerate          rewrite each stale file, name it on stdout
    python -m dflash_convert.regenerate --check  name each stale file, rewrite nothing (exit 1 when one is)

Run it after any change to a draft kind (either registry), a config key, an engine rule or an options / report
model. What it writes: docs/formats.md's table of draft kinds and its table of config keys (format/keys.py),
docs/engines.md's engine table (format/engines.py), and schemas/ (schemas.py). Each stale-file test names this
command (COMMAND).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable

COMMAND = "python -m dflash_convert.regenerate"
ROOT = Path(__file__).resolve().parents[1]  # the repository (a source checkout: the docs are not installed)
KINDS_BEGIN, KINDS_END = "<!-- draft-kinds:begin -->", "<!-- draft-kinds:end -->"


def between(text: str, begin: str, end: str, body: str, path: str) -> str:
    """`text` with what lies between the markers `begin` and `end` replaced by `body` (one line each side)."""
    head, found, rest = text.partition(begin)
    _, found_end, tail = rest.partition(end)
    if not (found and found_end):
        raise ValueError(f"{path} lacks its generated part's markers {begin} ... {end}")
    return f"{head}{begin}\n{body.rstrip(chr(10))}\n{end}{tail}"


def kinds_table() -> str:
    """docs/formats.md's table of draft kinds: one row per kind of the two registries (the format side's
    dflash_convert.format.kinds.KINDS, the runtime's dflash_runtime.heads.KINDS)."""
    from dflash_convert.format import kinds
    from dflash_convert.format.kinds.base import BACKBONE_RULES, OWN_TABLE, RUNTIME_ONLY
    from dflash_runtime import heads

    served = {BACKBONE_RULES: "the DFlash rows of engines.md's table",
              OWN_TABLE: "its own row of engines.md's table",
              RUNTIME_ONLY: "none (runtime only: the bundled runtime runs it)"}
    rows = ["| kind (`speculators_model_type`) | HF `architectures` | speculators `architectures` | adds to the "
            "backbone | served by engines | format side | runtime head |", "|---|---|---|---|---|---|---|"]
    for kind in kinds.all_kinds():
        head = heads.KINDS.get(kind.name)
        rows.append(f"| `{kind.name}` | `{kind.hf_architecture}` | `{kind.speculators_architecture}` | "
                    f"{kind.modules or 'nothing'} | {served[kind.engine_support]} | `{type(kind).__module__}` | "
                    + (f"`{head.load.__module__}`" if head else "none: the runtime refuses it") + " |")
    return "\n".join(rows)


def _formats_md(text: str) -> str:
    from dflash_convert.format import keys

    return keys.render_into(between(text, KINDS_BEGIN, KINDS_END, kinds_table(), "docs/formats.md"))


def _engines_md(text: str) -> str:
    from dflash_convert.format import engines

    return between(text, engines.README_START.strip(), engines.README_END, engines.render_markdown(),
                   "docs/engines.md")


def _schema(name: str) -> Callable[[str], str]:
    def render(_: str) -> str:
        from dflash_convert import schemas

        return schemas.render(name)
    return render


def generated() -> dict[str, Callable[[str], str]]:
    """Each generated file (relative to the repository) -> its text from its current text."""
    from dflash_convert import schemas

    return {"docs/formats.md": _formats_md, "docs/engines.md": _engines_md,
            **{f"schemas/{name}.schema.json": _schema(name) for name in schemas.NAMES}}


def current(path: str, root: Path = ROOT) -> str:
    """What generated file `path` must hold now."""
    file = root / path
    return generated()[path](file.read_text() if file.exists() else "")


def stale(root: Path = ROOT) -> list[str]:
    """The generated files whose text is not what the code states now."""
    return [path for path in generated()
            if not (root / path).exists() or (root / path).read_text() != current(path, root)]


def main(argv: list[str]) -> int:
    if argv not in ([], ["--check"]):
        print(f"usage: {COMMAND} [--check]", file=sys.stderr)
        return 2
    if not (ROOT / "docs" / "formats.md").exists():
        print(f"error: {ROOT} is no source checkout (no docs/formats.md): run {COMMAND} in a clone", file=sys.stderr)
        return 1
    paths = stale()
    for path in paths:
        if argv != ["--check"]:
            (ROOT / path).parent.mkdir(parents=True, exist_ok=True)
            (ROOT / path).write_text(current(path))
        print(path)
    return 1 if paths and argv == ["--check"] else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
