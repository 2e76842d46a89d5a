"""Repetition, presence and frequency penalties on the target's logits, as vLLM 0.33 applies them.

vLLM's rule (its sampler and its rejection sampler share it), on the float32 logits before temperature,
min-p, top-k and top-p:
    repetition r: every token seen in the prompt OR in the output so far: logit * (1 / r) when the logit
                  is > 0, else logit * r
    frequency f:  logit - f * (times the token occurs in the output so far)
    presence p:   logit - p * (1 if the token occurs in the output so far)
in that order. Only repetition counts prompt tokens; presence and frequency count output tokens only.
"The output so far" at a verify slot is what the sequence would hold if the proposals before the slot
were accepted: the committed output (the anchor included) plus proposals 1..i-1 for the target's logits
at slot i, and plus every proposal for the bonus token. transformers' RepetitionPenaltyLogitsProcessor
counts the same tokens for repetition (its input ids are prompt + output); transformers has no presence
or frequency penalty.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Penalties:
    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0

    @property
    def active(self) -> bool:
        return self.repetition != 1.0 or self.presence != 0.0 or self.frequency != 0.0


NONE = Penalties()


def penalize(logits: torch.Tensor, penalties: Penalties | None, prompt: torch.Tensor, output: torch.Tensor,
             seen: int) -> torch.Tensor:
    """logits [n, V] (row i: the target's logits after output[:seen + i]), prompt [P] and output [O >= seen + n - 1]
    token ids -> the penalized float32 logits [n, V] (a new tensor; the input as float32 when nothing applies)."""
    logits = logits.float()
    if penalties is None or not penalties.active:
        return logits
    n, vocab = logits.shape
    device = logits.device
    output = output.to(device=device, dtype=torch.long)
    extra = output[seen:seen + n - 1]  # row i >= 1 also sees extra[i - 1]
    if extra.numel() != n - 1:
        raise ValueError(f"{n} rows need {seen + n - 1} output tokens, got {output.numel()}")
    counts = torch.zeros(n, vocab, dtype=torch.long, device=device)  # [n, V] output occurrences per row
    counts[0] = torch.bincount(output[:seen], minlength=vocab)[:vocab]
    if n > 1:
        counts[1:].scatter_(1, extra[:, None], 1)
        counts = counts.cumsum(0)
    in_output = counts > 0
    if penalties.repetition != 1.0:
        in_prompt = torch.zeros(vocab, dtype=torch.bool, device=device)
        in_prompt[prompt.to(device=device, dtype=torch.long)] = True
        r = torch.full((n, vocab), penalties.repetition, dtype=torch.float32, device=device)
        r = torch.where(in_prompt[None] | in_output, r, torch.ones_like(r))
        logits = logits * torch.where(logits > 0, 1.0 / r, r)
    if penalties.frequency != 0.0:
        logits = logits - torch.tensor(penalties.frequency, dtype=torch.float32, device=device) * counts
    if penalties.presence != 0.0:
        logits = logits - torch.tensor(penalties.presence, dtype=torch.float32, device=device) * in_output
    return logits
