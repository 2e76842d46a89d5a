"""DSpark's additions to the DFlash step, as plain functions (docs/formats.md, DSpark section).

The backbone is the DFlash one. What changes:
  * sample_from_anchor (speculators' default for dspark, vLLM's): every slot of the block predicts the
    token after it, the anchor's included, so a block [anchor, MASK * (B-1)] proposes B tokens (slot s
    predicts position start + s + 1). Without it the anchor is the bonus token and slots 1..B-1 propose.
  * the Markov head, run left to right over the proposing slots: slot s's draft logits are its base
    logits (the lm_head of its final-normed hidden, draft vocab) plus a low-rank bias of the previous
    token (the anchor for the first proposing slot, then the previous pick; a target-vocab id):
        e = markov_w1[prev]                                                  # [r]
        vanilla: bias = markov_w2 @ e                                        # [Vd]
        gated:   bias = markov_w2 @ (sigmoid(gate_proj([hidden; e])) * e)
        rnn:     g, c, o = split3(joint_proj([state; e; hidden]))           # state: 0 at the first proposing slot
                 state = sigmoid(g) * state + (1 - sigmoid(g)) * tanh(c);  bias = markov_w2 @ tanh(o)
    and the pick (argmax, or a sample of softmax(logits / T)) is the next slot's previous token.
    The rnn state starts at zero at the first proposing slot, as SGLang 0.5.23 (the engine serving rnn
    heads) starts it; with a bonus anchor speculators' training runs it from the anchor's slot instead.
  * the confidence head: p_s = sigmoid(proj([hidden_s; e_s])) (or proj(hidden_s) without the Markov
    input), an estimate of slot s's acceptance given the slots before it were accepted. vLLM reads it
    only for adaptive verification (how many proposals to verify); it never changes a token.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dflash_convert.errors import NotRunnable
from dflash_convert.format import catalogue, kinds

MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")


@dataclass
class Markov:
    """The Markov head's weights ([out, in] as stored)."""

    w1: torch.Tensor  # [V, r]: embedding of the previous token (target vocab)
    w2: torch.Tensor  # [Vd, r]: rank r -> draft vocab bias
    kind: str = "vanilla"
    proj: torch.Tensor | None = None  # gated: gate_proj [r, H + r]; rnn: joint_proj [3r, 2r + H]
    proj_bias: torch.Tensor | None = None  # [r] / [3r]

    @property
    def rank(self) -> int:
        return self.w1.shape[1]


@dataclass
class Confidence:
    weight: torch.Tensor  # [1, H (+ r with the Markov input)]
    bias: torch.Tensor | None  # [1]
    with_markov: bool


def markov_bias(head: Markov, prev: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """prev [n] token ids, hidden [n, H] the slots' final-normed hidden, state [n, r] (rnn; None at a block's
    first proposing slot) -> (bias [n, Vd], the Markov embedding [n, r], the next state). speculators'
    MarkovHead.block_bias one slot at a time, in its order of operations."""
    emb = F.embedding(prev.long(), head.w1).to(head.w2.dtype)  # [n, r]
    if head.kind == "vanilla":
        return F.linear(emb, head.w2), emb, state
    hidden = hidden.to(emb.dtype)
    if head.kind == "gated":
        gate = torch.sigmoid(F.linear(torch.cat([hidden, emb], dim=-1), head.proj, head.proj_bias))  # [n, r]
        return F.linear(gate * emb, head.w2), emb, state
    if state is None:
        state = emb.new_zeros(emb.shape[0], head.rank)
    gate_raw, candidate_raw, out_raw = F.linear(torch.cat([state, emb, hidden], dim=-1), head.proj,
                                                head.proj_bias).chunk(3, dim=-1)  # [n, r] each
    gate = torch.sigmoid(gate_raw)
    state = gate * state + (1.0 - gate) * torch.tanh(candidate_raw)
    return F.linear(torch.tanh(out_raw), head.w2), emb, state


def confidence(head: Confidence, hidden: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
    """hidden [n, H], Markov embeddings emb [n, r] -> acceptance probabilities [n] (float32, as vLLM's
    DSparkConfidenceHead computes them: its input cast to float32, float32 weights)."""
    x = torch.cat([hidden, emb.to(hidden.dtype)], dim=-1) if head.with_markov else hidden
    bias = None if head.bias is None else head.bias.float()
    return torch.sigmoid(F.linear(x.float(), head.weight.float(), bias).squeeze(-1))


def sequential(head: Markov, anchor: torch.Tensor, base: torch.Tensor, hidden: torch.Tensor,
               draft_to_target: torch.Tensor | None = None, conf: Confidence | None = None, *,
               temperature: float = 0.0, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """The Markov walk over S proposing slots, as vLLM's DSparkSpeculator._sample_sequential: slot 0 after
    the anchor, each later slot after the previous pick. base [S, V] float32 base logits over the TARGET
    vocab (-inf outside a pruned draft vocab, whose ids draft_to_target [Vd] names), hidden [S, H]
    -> (picked target ids [S], draft logits [S, V]: base + bias, what each slot was drawn from,
    confidences [S] or None). Greedy at temperature 0, else each slot drawn from softmax(logits / T)."""
    steps = base.shape[0]
    logits = base.clone()
    picked = torch.empty(steps, dtype=torch.long, device=base.device)
    embeds = []
    prev, state = anchor.reshape(1).to(base.device), None
    for s in range(steps):
        bias, emb, state = markov_bias(head, prev, hidden[s:s + 1], state)  # [1, Vd]
        embeds.append(emb)
        if draft_to_target is None:
            logits[s] = logits[s] + bias[0].float()
        else:  # the bias is added in the draft vocab; -inf stays outside it
            logits[s, draft_to_target] = logits[s, draft_to_target] + bias[0].float()
        if temperature > 0:
            prev = torch.multinomial(torch.softmax(logits[s] / temperature, dim=-1), 1, generator=generator)
        else:
            prev = logits[s].argmax().reshape(1)
        picked[s] = prev[0]
    probs = None if conf is None else confidence(conf, hidden, torch.cat(embeds))
    return picked, logits, probs


@dataclass
class Head:
    """The Markov walk (when the head has one) over the proposing slots, and the confidence head's estimates."""

    markov: Markov | None
    confidence: Confidence | None
    anchor_predicts: bool  # sample_from_anchor: the anchor's slot proposes too
    draft_to_target: torch.Tensor | None = None  # [Vd] a pruned draft vocab's target ids
    embed_scale = 1.0

    @property
    def walks(self) -> bool:
        return self.markov is not None

    def outputs(self, rows: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (hidden [P, H], base logits [P, V]) for the heads; (greedy ids [P], logits [P, V]) without heads."""
        if self.markov is None and self.confidence is None:
            return logits.argmax(dim=-1), logits
        return rows, logits

    def pick(self, anchor: torch.Tensor, outputs: tuple[torch.Tensor, ...], *, temperature: float = 0.0,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """-> (picks [P], base + Markov bias [P, V]: what each slot was drawn from, confidences [P] or None)."""
        out, logits = outputs
        if self.markov is not None:
            return sequential(self.markov, anchor, logits, out, self.draft_to_target, self.confidence,
                              temperature=temperature, generator=generator)
        probs = None
        if self.confidence is not None:  # without a Markov head: confidence over the hidden state alone
            probs = confidence(self.confidence, out, out[:, :0])
            out = logits.argmax(dim=-1)
        return out, logits, probs


def load(draft) -> Head:  # draft: the draft.DFlashDraft being built
    """The Markov and confidence heads the config and tensors describe (speculators' fill-ins for absent keys)."""
    tensors, name = draft.tensors, catalogue.name
    kind, fields = kinds.of(draft.spec.variant), draft.spec.variant_fields
    value = functools.partial(kind.trained_value, fields)
    head_type = value("markov_head_type")
    if head_type not in MARKOV_HEAD_TYPES:
        raise NotRunnable(f"markov_head_type {head_type!r} is not one the runtime runs "
                          f"({', '.join(MARKOV_HEAD_TYPES)}: speculators 0.9.0's)")
    markov = conf = None
    if value("markov_rank") > 0:
        extra = {"gated": ("markov_gate", "markov_gate_bias"), "rnn": ("markov_joint", "markov_joint_bias")}.get(head_type)
        markov = Markov(tensors[name("markov_w1")], tensors[name("markov_w2")], head_type,
                        *(tensors[name(k)] for k in extra or ()))
    if value("enable_confidence_head") and name("confidence_proj") in tensors:
        conf = Confidence(tensors[name("confidence_proj")], tensors.get(name("confidence_bias")),
                          with_markov=bool(value("confidence_head_with_markov")))
    return Head(markov, conf, kind.anchor_predicts(fields), draft.draft_to_target)
