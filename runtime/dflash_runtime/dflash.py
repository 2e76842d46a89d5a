"""The plain DFlash head (docs/formats.md section 5): each proposing slot's logits are its proposal's, the
anchor is the bonus token (slots 1..B-1 propose), and every slot is picked on its own (greedy here; the decode
loop samples each slot from the logits itself)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class Head:
    anchor_predicts = False
    embed_scale = 1.0
    walks = False

    def outputs(self, rows: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (greedy ids [P], logits [P, V])."""
        return logits.argmax(dim=-1), logits

    def pick(self, anchor: torch.Tensor, outputs: tuple[torch.Tensor, ...], *, temperature: float = 0.0,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, None]:
        ids, logits = outputs
        return ids, logits, None


def load(draft) -> Head:  # draft: the draft.DFlashDraft being built
    return Head()
