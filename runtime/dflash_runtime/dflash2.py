"""DFlash2's additions to the DFlash step, as plain functions (docs/formats.md section 12).

Per decoder layer, a grouped dynamic causal convolution on each side of attention and of the MLP:
    h [B, H] --kernel_projection--> [B, 2, K, G] taps from the hidden state (input side, output side)
    conv(x)[t] = sum_{tap < K, t mod block >= tap} x[t - tap] * (base_kernel[side, tap] + dynamic[t, side, tap])
with each dynamic tap shared by the group_size channels of one of the G groups. Taps never reach
across a block boundary, so never into the context.
After the final norm, the candidate selector re-ranks the unary top-k of each draft slot:
    logits = target lm_head(hidden); c = the k largest logits of each slot
    unary[c] = cap * tanh(m * logits[c] / cap)     # m: output_multiplier, cap: final_logit_softcapping (0: none)
    score(prev, c) = unary[c] + <predecessor[prev] * (W_h hidden), successor[c]>
over the k candidates c of each slot, and the walk picks slot by slot: the first slot's predecessor is the
anchor, each later slot's the previous pick (greedy: the best score; sampled: softmax(score / T) over the k
candidates). The multiplier comes before the cap because vLLM's candidate path (which decides its proposals)
maps the logits in that order; its logits processor's forward caps first. Only the k
candidates get finite draft logits: the realized row of scores, which is what a sampled walk drew from.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from dflash_convert.format import catalogue, kinds

# family keys (dflash_config.*) the head applies: the embedding scale, and the candidates' logit maps
APPLIES = ("dflash_config.input_embedding_scale", "dflash_config.output_multiplier",
           "dflash_config.final_logit_softcapping")


@dataclass
class Conv:
    """One grouped dynamic causal convolution (an attention or an MLP side pair)."""

    base_kernel: torch.Tensor  # [2, K, H]: static taps, input side then output side
    kernel_projection: torch.Tensor  # [2*K*G, H]: dynamic taps from the hidden state
    group_size: int
    block_size: int

    @property
    def taps(self) -> int:
        return self.base_kernel.shape[1]


@dataclass
class Selector:
    predecessor_codebook: torch.Tensor  # [V, R]
    successor_codebook: torch.Tensor  # [V, R]
    hidden_projection: torch.Tensor  # [R, H]
    top_k: int


def grouped_conv(x: torch.Tensor, dynamic: torch.Tensor, base: torch.Tensor, *, block_size: int,
                 group_size: int) -> torch.Tensor:
    """x [n, H] (rows are consecutive block slots from slot 0), dynamic [n, K, G], base [K, H] -> [n, H]."""
    n, hidden = x.shape
    taps, groups = base.shape[0], hidden // group_size
    grouped = x.reshape(n, groups, group_size)  # [n, G, gs]
    slot = torch.arange(n, device=x.device).remainder(block_size)  # [n]
    out = torch.zeros_like(grouped)
    for tap in range(taps):
        shifted = grouped if tap == 0 else torch.cat([grouped.new_zeros(tap, groups, group_size), grouped[:-tap]])
        coefficient = base[tap].to(grouped.dtype).view(1, groups, group_size) + dynamic[:, tap, :, None]
        out = out + shifted * coefficient * slot.ge(tap).view(-1, 1, 1)
    return out.reshape(n, hidden)


def conv_prepare(conv: Conv, h: torch.Tensor, block_size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """h [n, H] -> (input side convolved [n, H], the output side's dynamic taps [n, K, G]). `block_size`: the
    block the rows are cut into (default the trained one; the runtime passes the block it runs, as vLLM
    convolves over 1 + num_speculative_tokens)."""
    n, hidden = h.shape
    dynamic = F.linear(h, conv.kernel_projection).view(n, 2, conv.taps, hidden // conv.group_size)
    x = grouped_conv(h, dynamic[:, 0], conv.base_kernel[0], block_size=block_size or conv.block_size,
                     group_size=conv.group_size)
    return x, dynamic[:, 1]


def conv_finish(conv: Conv, y: torch.Tensor, dynamic: torch.Tensor, block_size: int | None = None) -> torch.Tensor:
    """A sublayer's output y [n, H] convolved on the output side with the taps conv_prepare kept."""
    return grouped_conv(y, dynamic, conv.base_kernel[1], block_size=block_size or conv.block_size,
                        group_size=conv.group_size)


def unary_logits(logits: torch.Tensor, *, multiplier: float, softcap: float | None) -> torch.Tensor:
    """Candidate logits mapped as vLLM's candidate path maps them (LogitsProcessor.get_top_k_tokens): in
    float32, output_multiplier first, then the soft cap: cap * tanh(m * x / cap)."""
    logits = logits.float()
    if multiplier != 1.0:
        logits = logits * multiplier
    if softcap:
        logits = torch.tanh(logits / softcap) * softcap
    return logits


def candidate_scores(sel: Selector, logits: torch.Tensor, hidden: torch.Tensor, *, multiplier: float = 1.0,
                     softcap: float | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The target lm_head's logits [S, V] and final-normed hidden [S, H] of the S drafted slots -> (candidate
    ids [S, k], their unary logits [S, k], the projected hidden states [S, R]): what the walk scores each slot
    with. The k candidates are the largest raw logits, mapped afterwards (vLLM's order: a saturating cap
    would otherwise tie candidates the raw logits rank)."""
    top, candidates = logits.topk(sel.top_k, dim=-1)  # [S, k]
    unary = unary_logits(top, multiplier=multiplier, softcap=softcap)
    return candidates, unary, F.linear(hidden, sel.hidden_projection)


def scores_after(sel: Selector, predecessor: torch.Tensor, candidates: torch.Tensor, top: torch.Tensor,
                 projected: torch.Tensor) -> torch.Tensor:
    """One slot's candidate scores [k] after the token `predecessor` (a 0-dim id): unary + the bilinear
    transition (speculators' CandidateSelector.score_candidates, in its order of operations)."""
    # index_select with a 1-element index, not codebook[predecessor]: torch.compile reads a 0-dim tensor index as a
    # host int (a graph break, and a recompile for every token id)
    row = sel.predecessor_codebook.index_select(0, predecessor.reshape(1))[0]
    context = row * projected.to(sel.predecessor_codebook.dtype)  # [R]
    transition = (context[None, :] * sel.successor_codebook[candidates]).sum(dim=-1)  # [k]
    return top + transition.to(top.dtype)


def walk(sel: Selector, anchor: torch.Tensor, candidates: torch.Tensor, top: torch.Tensor, projected: torch.Tensor,
         vocab: int, *, temperature: float = 0.0, generator: torch.Generator | None = None
         ) -> tuple[torch.Tensor, torch.Tensor]:
    """The walk over S slots: slot 0 after the anchor, each later slot after the previous pick -> (picked
    ids [S], draft logits [S, V]: each slot's realized scores at its k candidates, -inf elsewhere). Greedy
    at temperature 0, else each slot drawn from softmax(scores / temperature) over its candidates. Only
    the row the walk reads is scored (vLLM scores all k x k and reads one row: the same numbers)."""
    steps = candidates.shape[0]
    logits = torch.full((steps, vocab), float("-inf"), device=top.device, dtype=torch.float32)
    picked = torch.empty(steps, dtype=torch.long, device=candidates.device)
    previous = anchor.reshape(())
    for s in range(steps):
        row = scores_after(sel, previous, candidates[s], top[s], projected[s]).float()  # [k]
        if temperature > 0:
            index = torch.multinomial(torch.softmax(row / temperature, dim=-1), 1, generator=generator)[0]
        else:
            index = row.argmax()
        logits[s, candidates[s]] = row
        previous = candidates[s].index_select(0, index.reshape(1))[0]
        picked[s] = previous
    return picked, logits


@dataclass
class Head:
    """The candidate selector's walk over the proposing slots (slots 1..B-1; the anchor is the bonus token)."""

    selector: Selector
    vocab: int  # V, the target's
    embed_scale: float = 1.0  # input_embedding_scale
    multiplier: float = 1.0  # output_multiplier
    softcap: float | None = None  # final_logit_softcapping (None: no cap)
    anchor_predicts = False
    walks = True

    def outputs(self, rows: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """-> (candidate ids [P, k], their unary logits [P, k], projected hidden [P, R]) for the walk."""
        return candidate_scores(self.selector, logits, rows, multiplier=self.multiplier, softcap=self.softcap)

    def pick(self, anchor: torch.Tensor, outputs: tuple[torch.Tensor, ...], *, temperature: float = 0.0,
             generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor, None]:
        """-> (the walk's picks [P], its realized scores [P, V]: -inf outside each slot's k candidates, None)."""
        picked, logits = walk(self.selector, anchor, *outputs, self.vocab, temperature=temperature,
                              generator=generator)
        return picked, logits, None


def load(draft) -> Head:  # draft: the draft.DFlashDraft being built
    """The selector and its logit maps; each layer gets its two convolutions."""
    spec, tensors, name = draft.spec, draft.tensors, catalogue.name
    f = spec.variant_fields
    for layer in draft.layers:
        for part in ("attention", "mlp"):
            setattr(layer, f"{part}_conv", Conv(
                tensors[name(f"{part}_conv_base_kernel", layer.index)],
                tensors[name(f"{part}_conv_kernel_projection", layer.index)],
                group_size=f["conv_group_size"], block_size=spec.block_size))
    selector = Selector(*(tensors[name(f"selector_{leaf}")] for leaf in (
        "predecessor_codebook", "successor_codebook", "hidden_projection")), top_k=f["selector_top_k"])
    value = functools.partial(kinds.of(spec.variant).trained_value, f)
    return Head(selector, spec.vocab_size, embed_scale=float(value("input_embedding_scale")),
                multiplier=float(value("output_multiplier")),
                softcap=float(value("final_logit_softcapping")) or None)  # 0: no cap
