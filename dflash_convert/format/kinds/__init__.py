"""The registry of draft kinds, format side: one module per kind (dflash.py, dflash2.py, dspark.py), each registered
here. Adding a kind: a module with its `Kind` here, a head module in dflash_runtime (heads.py), one line in each
registry, then `python -m dflash_convert.regenerate`. base.py says what a kind holds; `check` what a new kind may not
do to the others."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Callable, Iterator

from dflash_convert.format.kinds import dflash, dflash2, dspark
from dflash_convert.format.kinds.base import ENGINE_SUPPORT, OWN_TABLE, REGISTRY, ConfigKey, Kind

KINDS: dict[str, Kind] = REGISTRY  # by DraftSpec.variant (= speculators_model_type)
# What the modules reading the kinds require of a new one beyond `check`'s own rules (catalogue: no tensor of the
# backbone's; engines: a sub-table naming every engine): each adds its check at import, running it on the kinds
# registered by then.
CHECKS: list[Callable[[Kind], None]] = []


def check(kind: Kind) -> None:
    """Refuse (ValueError) a kind that would change what another kind means: a name taken, a tensor key or name
    another kind gives a different entry (the catalogue looks keys and names up across kinds: the first match would
    win silently), or engine support not chosen in its own class (it would inherit another kind's engines)."""
    if kind.name in KINDS:
        raise ValueError(f"a kind named {kind.name!r} is registered already")
    declared = vars(type(kind)).get("engine_support", vars(kind).get("engine_support"))
    if declared not in ENGINE_SUPPORT:
        raise ValueError(f"kind {kind.name}: engine_support must be set in its own class to one of "
                         f"{', '.join(repr(s) for s in ENGINE_SUPPORT)} (found {declared!r}; a kind never inherits "
                         "another kind's engines)")
    if (declared == OWN_TABLE) != bool(kind.support):
        raise ValueError(f"kind {kind.name}: a support sub-table goes with engine_support {OWN_TABLE!r}, and only there")
    for other in KINDS.values():
        for mine in kind.tensors:
            theirs = next((t for t in other.tensors if mine.key == t.key or mine.name == t.name), None)
            if theirs is not None and theirs != mine:
                raise ValueError(f"kind {kind.name}: tensor {mine.key!r} ({mine.name}) collides with kind "
                                 f"{other.name}'s {theirs.key!r} ({theirs.name}), another entry: rename one")
    for extra in CHECKS:
        extra(kind)


def register(kind: Kind) -> Kind:
    """Add `kind` to the registry once `check` and every module's CHECKS accept it."""
    check(kind)
    KINDS[kind.name] = kind
    return kind


for _kind in (dflash.KIND, dflash2.KIND, dspark.KIND):
    register(_kind)
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
    return in_words(list(KINDS))


def in_words(items: list[str]) -> str:
    """["a", "b", "c"] -> "a, b and c"."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


@contextmanager
def registered(kind: Kind) -> Iterator[Kind]:
    """`kind` in the registry for the block (a plug-in or a test), checked as `register` does, removed after it."""
    register(kind)
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
