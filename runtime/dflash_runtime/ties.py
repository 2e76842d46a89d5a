"""How near each greedy verify decision sat to going the other way.

Two engines that run the same pair in the same dtype round their logits differently (other kernels, other
reduction orders), by a unit or two in the last place. Where the largest logit of a row is that close to
another one, either engine may pick either token: a draft's proposal, the target's token at a slot, and so
the count of accepted proposals and everything decoded after it. A comparison of two engines' counts is
defined only up to such a step.

A gap is measured relative to the binade of the row's largest logit, 2^floor(log2|top|): a gap of g in these
units is g * 2^m units in the last place of a dtype with m mantissa bits, whatever the logits' magnitude.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

SMALLEST_BINADE = -14  # logits nearer 0 than 2^-14 are measured against 2^-14 (float16's smallest normal)


@dataclass(frozen=True)
class Decision:
    """One greedy verify step: the proposals accepted, and the smallest relative gap (see the module) at which
    another outcome was within reach: of the count itself (`margin`), and of any committed token, the count's
    or the target's token after the accepted ones (`next_margin` <= margin). inf: no other token competed."""

    accepted: int
    margin: float
    next_margin: float


def relative_gaps(logits: torch.Tensor) -> torch.Tensor:
    """logits [S, V] -> [S, V]: each row's largest logit minus each logit, over the binade of the largest."""
    logits = logits.float()
    top = logits.max(dim=-1, keepdim=True).values  # [S, 1]
    binade = torch.exp2(torch.floor(torch.log2(top.abs().clamp_min(2.0 ** SMALLEST_BINADE))))
    return (top - logits) / binade


def _second(gaps: torch.Tensor) -> torch.Tensor:
    """[S, V] -> [S]: the gap of the nearest token other than the row's top (inf when the row has one token)."""
    if gaps.shape[-1] < 2:
        return torch.full(gaps.shape[:-1], float("inf"))
    return torch.topk(gaps, 2, dim=-1, largest=False).values[:, 1]


def decision(proposals: torch.Tensor, draft_logits: torch.Tensor, target_logits: torch.Tensor,
             accepted: int) -> Decision:
    """The Decision of one greedy step. proposals [P] (each the top of its draft_logits row [P, V]), target_logits
    [P+1, V] (as the target's picks were made from them: penalized), `accepted` proposals kept.

    Slot j decides the count while j <= accepted (and j < P). A kept slot (proposal = the target's top) could
    have gone the other way where either row had another token near its top; the rejecting slot where some
    token was near the top of both rows (both engines could have met on it). The committed tokens could change
    where a kept slot could, or where the target's row after the kept proposals had another token near its top."""
    p = proposals.numel()
    target_gaps = relative_gaps(target_logits)  # [P+1, V]
    margin = float("inf")
    if p:
        draft_gaps = relative_gaps(draft_logits.to(target_gaps.device))  # [P, V]
        kept = torch.minimum(_second(draft_gaps[:accepted]), _second(target_gaps[:accepted]))  # [a]
        margin = float(kept.min()) if accepted else float("inf")
        if accepted < p:  # the rejecting slot: the nearest token both rows had near their top
            meet = torch.maximum(draft_gaps[accepted], target_gaps[accepted]).min()
            margin = min(margin, float(meet))
    committed = float(_second(target_gaps[accepted:accepted + 1])[0])
    return Decision(accepted=accepted, margin=margin, next_margin=min(margin, committed))
