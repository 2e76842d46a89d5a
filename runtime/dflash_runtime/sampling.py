"""How a request samples (`Sampling`, vLLM's SamplingParams fields that decide the tokens) and how the
target's logits become a token under it: penalties, then temperature and the min-p / top-k / top-p filters.

Penalties: repetition, presence and frequency on the target's logits, as vLLM 0.33 applies them.

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

import math
from dataclasses import dataclass, field

import torch

from dflash_convert.errors import UsageError


@dataclass(frozen=True)
class Penalties:
    repetition: float = 1.0
    presence: float = 0.0
    frequency: float = 0.0

    def __post_init__(self) -> None:  # vLLM's SamplingParams ranges
        if not (self.repetition > 0 and math.isfinite(self.repetition)):
            raise UsageError(f"repetition penalty must be a finite number > 0, got {self.repetition}")
        if not (-2 <= self.presence <= 2 and -2 <= self.frequency <= 2):
            raise UsageError(f"presence and frequency penalties must be in [-2, 2], got {self.presence} and "
                             f"{self.frequency}")

    @property
    def active(self) -> bool:
        return self.repetition != 1.0 or self.presence != 0.0 or self.frequency != 0.0


NONE = Penalties()


@dataclass(frozen=True)
class Sampling:
    """One request's sampling. Checked when made: a bad value is a UsageError, never a silent clamp."""

    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # <= 0 or >= V: off
    top_p: float = 1.0  # 1: off
    min_p: float = 0.0  # 0: off
    penalties: Penalties = NONE
    stop_token_ids: tuple[int, ...] = field(default=())  # decoding stops after emitting one of these
    seed: int | None = None  # None: a fresh seed per call (temperature > 0 only)

    def __post_init__(self) -> None:
        if not (self.temperature >= 0 and math.isfinite(self.temperature)):
            raise UsageError(f"temperature must be a finite number >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1 and 0 <= self.min_p <= 1):
            raise UsageError(f"top_p must be in (0, 1] and min_p in [0, 1], got {self.top_p} and {self.min_p}")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))

    @property
    def filters(self) -> dict:
        """filtered_probs' keyword arguments."""
        return dict(top_k=self.top_k, top_p=self.top_p, min_p=self.min_p)

    def generator(self, device: torch.device) -> torch.Generator | None:
        """The random stream of one decode (None when greedy), on the device the logits are on."""
        if self.temperature <= 0:
            return None
        g = torch.Generator(device=device)
        if self.seed is None:
            g.seed()
        else:
            g.manual_seed(self.seed)
        return g


GREEDY = Sampling()


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


def filtered_probs(logits: torch.Tensor, temperature: float, *, top_k: int = 0, top_p: float = 1.0,
                   min_p: float = 0.0) -> torch.Tensor:
    """logits [n, V] -> the distribution [n, V] vLLM samples from: logits / temperature, then min-p (drop
    tokens whose scaled logit is below the row's max + log(min_p)), top-k (keep logits >= the k-th
    largest, ties kept; k <= 0 or >= V: off), top-p (sorted ascending, drop tokens while the cumulative
    probability stays <= 1 - top_p; the most likely token always stays; top_p >= 1: off)."""
    scaled = logits.float() / temperature
    if min_p > 0:
        threshold = scaled.amax(dim=-1, keepdim=True) + math.log(min_p)
        scaled = scaled.masked_fill(scaled < threshold, float("-inf"))
    if 0 < top_k < scaled.shape[-1]:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]  # [n, 1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1:
        ascending, order = scaled.sort(dim=-1)
        cumulative = ascending.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1 - top_p
        drop[:, -1] = False
        scaled = scaled.scatter(-1, order, ascending.masked_fill(drop, float("-inf")))
    return torch.softmax(scaled, dim=-1)


def pick(logits: torch.Tensor, sampling: Sampling, generator: torch.Generator | None) -> torch.Tensor:
    """logits [n, V] float32 -> one token per row: argmax, or a sample of the filtered distribution."""
    if sampling.temperature <= 0:
        return logits.argmax(dim=-1)
    probs = filtered_probs(logits, sampling.temperature, **sampling.filters)
    return torch.multinomial(probs, 1, generator=generator)[:, 0]
