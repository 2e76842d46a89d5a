"""The registry of draft kinds, format side: one module per kind (dflash.py, dflash2.py, dspark.py), one line each
in KINDS. Adding a kind: a module with its `Kind` here, a head module in dflash_runtime (heads.py), and one line in
each registry. base.py says what a kind holds."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

from dflash_convert.format.kinds import dflash, dflash2, dspark
from dflash_convert.format.kinds.base import REGISTRY, ConfigKey, Kind

KINDS: dict[str, Kind] = REGISTRY  # by DraftSpec.variant (= speculators_model_type)
KINDS.update({
    "dflash": dflash.KIND,
    "dflash2": dflash2.KIND,
    "dspark": dspark.KIND,
})
BUILT_IN = tuple(KINDS)  # the kinds the schemas and docs list


def all_kinds() -> tuple[Kind, ...]:
    return tuple(KINDS.values())


def get(name: str | None) -> Kind | None:
    """The kind named `name`, or None."""
    return KINDS.get(name) if isinstance(name, str) else None


def of(variant: str) -> Kind:
    """The kind of a DraftSpec's variant (the spec's model refuses names that are no kind)."""
    return KINDS[variant]


def said() -> str:
    """The registered kinds in words: "dflash, dflash2 and dspark"."""
    names = list(KINDS)
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


@contextmanager
def registered(kind: Kind) -> Iterator[Kind]:
    """`kind` in the registry for the block (a plug-in or a test), removed after it."""
    if kind.name in KINDS:
        raise ValueError(f"a kind named {kind.name!r} is registered already")
    KINDS[kind.name] = kind
    try:
        yield kind
    finally:
        del KINDS[kind.name]


def config_keys() -> tuple[ConfigKey, ...]:
    """Every registered kind's config keys, each row once. A row new to the list goes just before the next row of its
    kind's list already placed (at the end if none), so the table keeps each kind's own order."""
    rows: list[ConfigKey] = []
    for kind in KINDS.values():
        for i, key in enumerate(kind.keys):
            if key in rows:
                continue
            after = next((rows.index(k) for k in kind.keys[i + 1:] if k in rows), len(rows))
            rows.insert(after, key)
    return tuple(rows)
