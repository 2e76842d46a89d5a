"""The DFlash decode loop (docs/formats.md section 7, batch 1) and the target-only baseline on the same path.

Per step, with the anchor (last committed token, no target KV yet) at position `start`:
    draft [anchor, MASK * (B-1)] -> B-1 proposals
    target verifies [anchor, proposals] at start..start+B-1 -> its own token at every slot
    a = leading proposals equal to the target's token at the previous slot
    commit a proposals + the target's token after them (the new anchor); start += a + 1
    crop the target KV cache to start; the draft context gains the features of the a + 1 inputs
Every emitted token is the target's: greedy output equals target-only greedy output, and at
temperature > 0 every token is a target sample (a proposal is accepted when it equals it).
A draft whose anchor slot predicts (dspark's sample_from_anchor) proposes B tokens per block instead of B-1:
the target then verifies [anchor, B proposals] at start..start+B, and acceptance counts over B positions,
as vLLM counts dspark (num_speculative_tokens = B; tau = 1 + accepted / drafts, at most B + 1).

Draft sampling (vLLM's names): "greedy" (default) proposes the draft's argmax and, at temperature > 0,
accepts a proposal when it equals the target's sample at that slot; this is rejection sampling with
a one-hot draft distribution (accept x with probability p(x), else a sample of p restricted to the
other tokens), so the output is distributed as the target's. "probabilistic" samples the proposals
from the draft at the request's temperature and accepts by standard speculative rejection sampling:
proposal x at slot k is kept with probability min(1, p_k(x) / q_k(x)); the first rejected slot is
resampled from normalize(max(0, p_k - q_k)); when all are kept, one bonus token comes from the
target's distribution after the last. At temperature 0 both are greedy.

top-k / top-p / min-p filter the target's distribution as vLLM's sampler and rejection sampler do
(temperature, then min-p on the scaled logits, then top-k, then top-p over what is left), in every
role: the token sampled after the prompt, the target's token compared with a greedy proposal, the
acceptance ratio, the residual and the bonus token. The draft's distribution stays at the temperature
alone, as vLLM's proposers leave it: the acceptance rate may drop, the output distribution does not
change. Every emitted token is then a sample of the target's filtered distribution.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass, field

import torch

from dflash_convert.errors import UsageError

from . import DRAFT_SAMPLING
from .metrics import DecodeStats
from .draft import DFlashDraft
from .sampling import GREEDY, Sampling, filtered_probs, penalize, pick
from .target import Target, check_pair
from .ties import Decision, decision


@dataclass
class Generation:
    tokens: list[int]  # new tokens only
    stats: DecodeStats
    decisions: list[Decision] | None = None  # greedy, when asked: how near each verify step sat to a tie (ties.py)
    accepted_per_step: list[int] = field(default_factory=list)  # proposals accepted at each draft step, in order


def _now(device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def accept_block(block: torch.Tensor, target_logits: torch.Tensor, draft_probs: torch.Tensor | None,
                 sampling: Sampling, generator: torch.Generator | None, draft_sampling: str = "greedy"
                 ) -> tuple[int, list[int]]:
    """The verify decision for one block. block [S] = anchor + S-1 proposals, target_logits [S, V]
    (the target's logits after each slot, penalized), draft_probs [S-1, V] (the draft's distribution at the
    temperature its proposals were sampled from, on the target logits' device; "probabilistic" only)
    -> (accepted proposals a, committed tokens: the a accepted proposals and one token of the target's)."""
    proposals = block[1:]  # [S-1]
    temperature = sampling.temperature
    if temperature <= 0 or draft_sampling == "greedy":
        chosen = pick(target_logits, sampling, generator).to(block.device)  # the target's token per slot
        matches = (proposals == chosen[:-1]).int()
        accepted = int(matches.cumprod(0).sum()) if matches.numel() else 0
        return accepted, proposals[:accepted].tolist() + [int(chosen[accepted])]
    device = target_logits.device
    p = filtered_probs(target_logits, temperature, **sampling.filters)  # [S, V]
    q = draft_probs  # [S-1, V]
    x = proposals.to(device)[:, None]
    ratio = p[:-1].gather(1, x)[:, 0] / q.gather(1, x)[:, 0]  # p_k(x_k) / q_k(x_k), q_k(x_k) > 0: x_k ~ q_k
    keep = torch.rand(ratio.shape, generator=generator, device=device) < ratio  # P = min(1, ratio)
    accepted = int(keep.int().cumprod(0).sum()) if keep.numel() else 0
    if accepted < proposals.numel():
        residual = (p[accepted] - q[accepted]).clamp_min(0)  # normalize(max(0, p - q))
        dist = residual if float(residual.sum()) > 0 else p[accepted]
        last = int(torch.multinomial(dist / dist.sum(), 1, generator=generator)[0])
    else:
        last = int(torch.multinomial(p[-1], 1, generator=generator)[0])  # bonus token
    return accepted, proposals[:accepted].tolist() + [last]


def _prompt_tensor(prompt_ids, device) -> torch.Tensor:
    ids = torch.as_tensor(prompt_ids, dtype=torch.long, device=device).reshape(-1)
    if ids.numel() == 0:
        raise UsageError("the prompt is empty: at least one token is needed")
    return ids


@torch.inference_mode()
def _decode(target: Target, prompt: torch.Tensor, *, draft: DFlashDraft | None, block_size: int,
            max_new_tokens: int, sampling: Sampling, draft_window: int | None = None,
            draft_sampling: str = "greedy", full_last_block: bool = False,
            record_decisions: bool = False) -> Generation:
    """The one loop; `draft=None` (block size 1) is target-only decoding. `sampling.penalties` (vLLM's repetition,
    presence, frequency) apply to the target's logits in every role, counted as sampling.py says.
    `record_decisions` (greedy, with a draft): each verify step's Decision (ties.py) in the Generation."""
    _check_request(max_new_tokens, draft_sampling)
    temperature, penalties = sampling.temperature, sampling.penalties
    device = target.device
    stop = set(sampling.stop_token_ids)
    probabilistic = draft_sampling == "probabilistic" and temperature > 0
    target.set_capture(draft.target_layer_ids if draft is not None else [])
    per_block = draft.proposals(block_size) if draft is not None else 0  # proposals of a full block
    max_len = prompt.numel() + max_new_tokens + per_block + 1  # the last verify block may reach this far
    target.reset(max_len, per_block + 1)
    if draft is not None:
        draft.reset(max_len, block_size)
    accepted_per_step: list[int] = []
    decisions = [] if record_decisions and draft is not None and temperature <= 0 else None
    survival_per_step: list[list[float]] = []  # dspark confidence heads: product of the confidences up to each slot
    drafted = 0
    draft_time = verify_time = 0.0

    t0 = _now(device)
    anchor, generator = _prefill(target, draft, prompt, sampling, draft_window)
    tokens, start = [anchor], prompt.numel()
    prefill_time = _now(device) - t0

    while len(tokens) < max_new_tokens and anchor not in stop:
        remaining = max_new_tokens - len(tokens)
        # no point verifying more than can be emitted; vLLM drafts full blocks and counts acceptances past the end
        n_prop = per_block if full_last_block else min(per_block, remaining)
        size = n_prop + block_size - per_block  # the draft's block: the proposing slots (and the anchor's)
        block = torch.tensor([anchor], dtype=torch.long, device=device)
        draft_probs = draft_logits = None
        if draft is not None and n_prop > 0:
            t = _now(device)
            proposals, draft_probs, draft_logits = _propose(draft, target, anchor, start, size, draft_window,
                                              temperature if probabilistic else 0.0, generator)
            block = torch.cat([block, proposals.to(device)])
            if draft.last_confidence is not None:
                survival_per_step.append(draft.last_confidence.double().cumprod(0).tolist())
            draft_time += _now(device) - t
        t = _now(device)
        logits, features = target.forward(block, start)  # [P+1, V], [P+1, A*Ht]
        if penalties.active:  # slot i sees the output + proposals before it
            logits = penalize(logits, penalties, prompt, torch.tensor(tokens + block[1:].tolist()), len(tokens))
        accepted, new = accept_block(block, logits, draft_probs, sampling=sampling, generator=generator,
                                     draft_sampling=draft_sampling)
        verify_time += _now(device) - t
        if draft is not None and n_prop > 0:
            accepted_per_step.append(accepted)
            drafted += n_prop
            if decisions is not None:
                decisions.append(decision(block[1:], draft_logits, logits, accepted))
        new = new[:remaining]
        new = new[:next((i + 1 for i, tok in enumerate(new) if tok in stop), len(new))]  # through the first stop
        tokens.extend(new)
        anchor = new[-1]
        committed = start + len(new)  # the anchor and len(new)-1 accepted proposals now have target KV
        target.crop(committed)
        if draft is not None:
            t = _now(device)
            _add_context(draft, features[:len(new)], start, draft_window)
            draft_time += _now(device) - t
        start = committed

    total = _now(device) - t0
    stats = DecodeStats.from_steps(accepted_per_step, per_block + 1,
                                   new_tokens=len(tokens), prefill_time_s=prefill_time, draft_time_s=draft_time,
                                   verify_time_s=verify_time, total_time_s=total, drafted=drafted,
                                   survival_per_step=survival_per_step)
    return Generation(tokens=tokens, stats=stats, decisions=decisions, accepted_per_step=accepted_per_step)


def _check_request(max_new_tokens: int, draft_sampling: str) -> None:
    if max_new_tokens < 1:
        raise UsageError(f"max_new_tokens must be at least 1, got {max_new_tokens}")
    if draft_sampling not in DRAFT_SAMPLING:
        raise UsageError(f"draft sampling {draft_sampling!r}: choose {' or '.join(DRAFT_SAMPLING)}")


def _prefill(target: Target, draft: DFlashDraft | None, prompt: torch.Tensor, sampling: Sampling,
             draft_window: int | None) -> tuple[int, torch.Generator | None]:
    """The prompt through the target (its features into the draft's context) -> (the first token, the run's
    generator, made where the target's logits are: sampling happens there)."""
    logits, features = target.forward(prompt, 0, last_logits_only=True)
    generator = sampling.generator(logits.device)
    first = penalize(logits[-1:], sampling.penalties, prompt, prompt[:0], 0)  # [1, V]: nothing generated yet
    anchor = int(pick(first, sampling, generator)[0])
    if draft is not None:
        _add_context(draft, features, 0, draft_window)
    return anchor, generator


def _propose(draft: DFlashDraft, target: Target, anchor: int, start: int, size: int, draft_window: int | None,
             temperature: float, generator: torch.Generator | None
             ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """The draft's proposals [P] for a block of `size` at `start`, greedy or (temperature > 0: probabilistic draft
    sampling) sampled, with the distribution they were sampled from [P, V] (None when greedy), on the generator's
    device (where the target's logits are): accept_block's ratio reuses it; and the logits they were picked from
    [P, V]."""
    walk = temperature > 0 and draft.walks  # dflash2 and dspark sample slot by slot, each after the previous pick
    sampled = dict(temperature=temperature, generator=generator) if walk else {}
    proposals, draft_logits = draft.propose(anchor, start, embed=target.embed, lm_head=target.lm_head,
                                            block_size=size, draft_window=draft_window, **sampled)  # [P], [P, V]
    if temperature <= 0:
        return proposals, None, draft_logits
    probs = torch.softmax(draft_logits / temperature, dim=-1).to(generator.device)  # [P, V]
    if not walk:
        proposals = torch.multinomial(probs, 1, generator=generator)[:, 0]
    return proposals, probs, draft_logits


def _add_context(draft: DFlashDraft, features: torch.Tensor, start: int, window: int | None) -> None:
    """features [n, A*Ht] of the tokens at start.. join the draft's context (then only the last `window` stay)."""
    draft.add_context(features, start)
    if window is not None:
        draft.keep_last_context(window)


def speculative_generate(draft: DFlashDraft, target: Target, prompt_ids, *, max_new_tokens: int = 64,
                         sampling: Sampling = GREEDY, block_size: int | None = None, draft_window: int | None = None,
                         draft_sampling: str = "greedy", full_last_block: bool = False,
                         record_decisions: bool = False) -> Generation:
    """Generate with the draft proposing and the target verifying, sampling as `sampling` says (see the
    module docstring). `block_size` overrides the draft's (with a warning: engines let a deployment choose
    it); `draft_window` W lets the draft see only the last W committed context tokens (the target always
    sees everything); `draft_sampling` "greedy" or "probabilistic". `full_last_block` counts as vLLM does:
    the last block is drafted and verified whole even when fewer tokens remain to emit (the output is the
    same; acceptances past max_new_tokens are counted). `record_decisions` (greedy): how near each verify step
    sat to a tie, in `Generation.decisions` (ties.py), for comparing counts with another engine."""
    check_pair(draft, target)
    block_size = draft.run_block(block_size)
    if block_size < 2:
        raise UsageError(f"block_size must be at least 2 (anchor + one draft slot), got {block_size}")
    _warn_block_size(draft, block_size)
    if draft_window is not None and draft_window < 1:
        raise UsageError(f"draft_window must be at least 1, got {draft_window}")
    prompt = _prompt_tensor(prompt_ids, target.device)
    return _decode(target, prompt, draft=draft, block_size=block_size, max_new_tokens=max_new_tokens,
                   sampling=sampling, draft_window=draft_window, draft_sampling=draft_sampling,
                   full_last_block=full_last_block, record_decisions=record_decisions)


def _warn_block_size(draft: DFlashDraft, block_size: int) -> None:
    if block_size != draft.block_size:
        warnings.warn(f"run-time block size {block_size} differs from the draft's trained block size "
                      f"{draft.block_size}; acceptance may differ from a deployment at the trained size",
                      stacklevel=3)


def target_generate(target: Target, prompt_ids, *, max_new_tokens: int = 64, sampling: Sampling = GREEDY
                    ) -> Generation:
    """Target-only decoding through the same loop (one token per verify step): the speedup baseline."""
    prompt = _prompt_tensor(prompt_ids, target.device)
    return _decode(target, prompt, draft=None, block_size=1, max_new_tokens=max_new_tokens, sampling=sampling)
