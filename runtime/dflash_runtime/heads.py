"""What a draft kind adds to the DFlash backbone: its head, one module per kind, and the registry of kinds.

The backbone (draft.py, step.py) runs every kind the same way: block [anchor, MASK * (B-1)] -> final-normed hidden
[B, H] -> the proposing slots' rows [P, H] (P = B with anchor_predicts, else slots 1..B-1) -> logits [P, V].
A head takes it from there, in two halves:
    outputs(rows, logits) -> tensors      inside the (compiled) step: fixed shapes, no host syncs
    pick(anchor, outputs) -> ids [P], logits [P, V], confidences [P] or None      eager, slot by slot if it walks
`logits` from pick are what each proposal was (or is to be) drawn from (the decode loop's acceptance ratio reads them).
A kind is loaded by its `load(draft)`, which reads the draft's spec, tensors and layers (and may add to its
layers, as dflash2's convolutions do). Adding a kind: one module with its head and load, one line in KINDS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Protocol

import torch

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


KINDS: dict[str, Kind] = {  # by DraftSpec.variant
    "dflash": Kind(dflash.load),
    "dflash2": Kind(dflash2.load, dflash2.APPLIES),
    "dspark": Kind(dspark.load),
}
