"""What a draft kind adds to the DFlash backbone: its head, one module per kind, and the registry of kinds.

The backbone (draft.py, step.py) runs every kind the same way: block [anchor, MASK * (B-1)] -> final-normed hidden
[B, H] -> the proposing slots' rows [P, H] (P = B with anchor_predicts, else slots 1..B-1) -> logits [P, V].
A head takes it from there, in two halves:
    outputs(rows, logits) -> tensors      inside the (compiled) step: fixed shapes, no host syncs
    pick(anchor, outputs) -> ids [P], logits [P, V], confidences [P] or None      eager, slot by slot if it walks
`logits` from pick are what each proposal was (or is to be) drawn from (the decode loop's acceptance ratio reads them).
A kind is loaded by its `load(draft)`, which reads the draft's spec, tensors and layers (and may add to its
layers, as dflash2's convolutions do). Adding a kind: one module with its head and load, one line in KINDS under
the name of its format side (dflash_convert.format.kinds; checked at import).
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Protocol

import torch

from dflash_convert.format import kinds

from . import dflash, dflash2, dspark


class Head(Protocol):
    anchor_predicts: bool  # the anchor's slot proposes too (dspark's sample_from_anchor)
    embed_scale: float  # the block's embeddings are scaled by it before the layers (1.0: untouched)
    walks: bool  # picks slot by slot, each after the previous pick, so it samples its proposals itself;
    # otherwise its picks are greedy and a sampling caller draws each slot from the logits (the decode loop does)

    def outputs(self, rows: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """rows [P, H] final-normed hidden of the proposing slots, logits [P, V] float32 -> what the step returns."""

    def pick(self, anchor: torch.Tensor, outputs: tuple[torch.Tensor, ...], *, temperature: float,
             generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """anchor (0-d id), the step's outputs -> (proposals [P], their logits [P, V], confidences [P] or None);
        a walking head samples at temperature > 0 with `generator`, any other picks greedily."""


@dataclass(frozen=True)
class Kind:
    load: Callable[[Any], Head]  # (the draft.DFlashDraft being built) -> its head
    applies: tuple[str, ...] = ()  # family keys (dflash_config.*) the head applies; other non-neutral ones refused


KINDS: dict[str, Kind] = {  # by DraftSpec.variant: each a name of the format side's registry (kinds.KINDS)
    "dflash": Kind(dflash.load),
    "dflash2": Kind(dflash2.load, dflash2.APPLIES),
    "dspark": Kind(dspark.load),
}


def check_registries() -> None:
    """The two registries name the same built-in kinds: a head under a name the format side lacks is never loaded
    (no draft parses as that kind), and a built-in kind without a head is a draft the runtime cannot run."""
    heads, names = set(KINDS), set(kinds.BUILT_IN)
    if heads != names:
        raise ValueError(f"dflash_runtime.heads.KINDS and dflash_convert.format.kinds.KINDS differ: heads without a "
                         f"kind {sorted(heads - names)}, kinds without a head {sorted(names - heads)}")


check_registries()


@contextmanager
def registered(name: str, kind: Kind) -> Iterator[Kind]:
    """`kind` as the head of the format side's kind `name` for the block (a plug-in or a test), removed after it."""
    if name not in kinds.KINDS:
        raise ValueError(f"no draft kind {name!r} is registered on the format side ({kinds.said()}): register it "
                         "there first (dflash_convert.format.kinds)")
    if name in KINDS:
        raise ValueError(f"the kind {name!r} has a head already")
    KINDS[name] = kind
    try:
        yield kind
    finally:
        del KINDS[name]
