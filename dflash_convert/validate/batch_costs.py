"""Step costs at a batch of B sequences (`validate --concurrency N[,N...]`): what the cost model needs at each
concurrency, timed on the device at hand.

The runtime decodes one sequence at a time, so its loop measures batch 1 only. Here the target's own
(transformers) model is called with a batch: B copies of a context of CONTEXT_TOKENS prompt tokens are
prefilled once, then each timed step appends to that cache and the cache is cropped back to the context:
- a verify step: B sequences of K+1 tokens (the anchor and K proposals, as the decode loop verifies them);
- a target-only step: B sequences of one token.
The draft's step at batch B is B of its single-sequence steps, as the runtime's draft runs them (one
sequence per step, its context cache its own), taken from the decode loop's measurement of that K: an
engine batching the draft's B blocks into one forward does no worse, so at B > 1 this is an upper bound on
the draft's share: it lowers every K's expected speedup, and since the draft's step costs about the same at
every K, it weighs tau more than the verify step's growth with K (it favours larger K). The report says so.

A target whose layers keep a recurrent state (linear attention) cannot be cropped back: its batched costs are
not measured, and the reason is returned instead.
"""

from __future__ import annotations

from dataclasses import dataclass
from time import perf_counter

CONTEXT_TOKENS = 128  # the context each timed step follows (a prompt's tokens, repeated to this length)
WARMUP = 1  # untimed calls of each shape first (allocations, lazy initialisation)


@dataclass(frozen=True)
class BatchTimes:
    """Seconds of one target step at batch `batch`: a verify step of n tokens per sequence (n = K+1, per K) and a
    target-only step of one token per sequence, per timing round."""

    batch: int
    verify_s: dict[int, list[float]]  # tokens per sequence -> per round
    target_s: list[float]


def cannot_batch(target) -> str | None:
    """Why this target's batched steps cannot be timed, or None."""
    if getattr(target, "_mixers", None):
        return "its linear-attention layers keep a recurrent state that a timed step cannot be cropped back from"
    if getattr(target, "offloaded", None):
        return "parts of it are offloaded by its device map"
    return None


def time_batches(target, prompt: list[int], batches: list[int], slots: list[int], rounds: int) -> list[BatchTimes]:
    """The target's verify steps (each of `slots` tokens per sequence) and target-only step at each batch size,
    `rounds` times each, after a context made of `prompt` (transformers' own model under `target.model`)."""
    import torch

    context = (prompt * (CONTEXT_TOKENS // max(len(prompt), 1) + 1))[:CONTEXT_TOKENS]
    out = []
    with torch.inference_mode():
        for batch in batches:
            ids = torch.tensor([context] * batch, dtype=torch.long, device=target.device)
            cache = _new_cache(target)
            target.model(input_ids=ids, use_cache=True, **{target.cache_keyword: cache})
            took: dict[int, list[float]] = {n: [] for n in sorted({*slots, 1})}  # 1: the target-only step
            for r in range(rounds + WARMUP):
                for n, times in took.items():
                    seconds = _step(target, cache, context, batch, n)
                    if r >= WARMUP:
                        times.append(seconds)
            out.append(BatchTimes(batch, {n: took[n] for n in slots}, took[1]))
            del cache
    return out


def _step(target, cache, context: list[int], batch: int, n: int) -> float:
    """Seconds of one forward of `n` new tokens per sequence after the cached context; the cache cropped back."""
    import torch

    start = len(context)
    ids = torch.tensor([context[:n]] * batch, dtype=torch.long, device=target.device)
    positions = torch.arange(start, start + n, device=target.device)[None].expand(batch, n)
    _sync(target.device)
    t = perf_counter()
    target.model(input_ids=ids, position_ids=positions, use_cache=True, **{target.cache_keyword: cache})
    _sync(target.device)
    took = perf_counter() - t
    cache.crop(-n)  # back to the context
    return took


def _sync(device) -> None:
    import torch

    if getattr(device, "type", str(device)) == "cuda":
        torch.cuda.synchronize(device)


def _new_cache(target):
    """An empty dynamic cache of the target's config, filled by the batched prefill."""
    from transformers import DynamicCache

    return DynamicCache(config=target.config)
