"""transformers' own DFlash as a real engine: `generate(assistant_model=draft, speculation_type="dflash")` run
in-process on a checkpoint in transformers' own layout, observed step by step, and what our runtime's decode loop
says transformers would accept.

transformers' assisted decoding (5.19 and 5.24, `_assisted_decoding` with `DFlashTokenCandidateGenerator`), batch 1:
- its first pass is the target's alone (the prompt, one token); every later step drafts block_size - 1 tokens from
  [last token, mask * (block_size - 1)], unless one token is left to emit, when it drafts nothing;
- the target verifies them all (a full block even at the end); greedy acceptance is the leading drafts equal to the
  target's argmax; the tokens kept are then cropped to the length budget and the first eos, and the step's count of
  accepted drafts is what is kept, less the target's own token.
The counts are observed through `update_candidate_strategy(input_ids, scores, num_matches)`, the hook the loop
calls after each verification, on a wrapper of the generator transformers builds: nothing of transformers is
patched (the wrapper is an attribute of the one target model instance the run loaded).
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from dflash_convert.format.compat import Check, make_check
from dflash_convert.format.configs import DraftSpec
from dflash_convert.validate.report import AcceptanceCounts, EngineStats

ATTN = "sdpa"  # what transformers picks on CPU; set so both models of a run agree


@dataclass
class ObservedRun:
    """One prompt through transformers' own assisted generation."""

    tokens: list[int]  # new tokens only
    accepted_per_step: list[int] = field(default_factory=list)  # the steps that drafted, in order
    drafted_per_step: list[int] = field(default_factory=list)


class _Observed:
    """The candidate generator transformers built, with each step's drafts and acceptance written down."""

    def __init__(self, inner: Any, run: ObservedRun):
        self._inner, self._run, self._drafted = inner, run, 0

    def __getattr__(self, name: str) -> Any:  # requires_model_outputs, model_kwargs_overrides, ...
        return getattr(self._inner, name)

    def get_candidates(self, input_ids: torch.LongTensor, *args, **kwargs):
        candidates, logits = self._inner.get_candidates(input_ids, *args, **kwargs)
        self._drafted = candidates.shape[1] - input_ids.shape[1]
        return candidates, logits

    def update_candidate_strategy(self, input_ids, scores, num_matches) -> None:
        if self._drafted:
            self._run.drafted_per_step.append(self._drafted)
            self._run.accepted_per_step.append(int(num_matches))
        self._inner.update_candidate_strategy(input_ids, scores, num_matches)


def load_pair(draft_dir: str | Path, target_dir: str | Path, dtype: torch.dtype = torch.float32):
    """transformers' own classes for the pair (AutoModel resolves MuseGlimmerAssistantModel from config.json; no
    remote code)."""
    from transformers import AutoModel, AutoModelForCausalLM

    draft = AutoModel.from_pretrained(str(draft_dir), dtype=dtype, attn_implementation=ATTN).eval()
    target = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=dtype, attn_implementation=ATTN).eval()
    return draft, target


@torch.inference_mode()
def observed_generate(target, draft, prompt_ids: list[int], max_new_tokens: int) -> ObservedRun:
    """Greedy `generate(..., speculation_type="dflash")` for one prompt, with the acceptance of every drafting step."""
    run = ObservedRun(tokens=[])
    build = target._get_candidate_generator  # the bound method of this instance's class
    target._get_candidate_generator = lambda *a, **k: _Observed(build(*a, **k), run)
    try:
        prompt = torch.tensor([prompt_ids], dtype=torch.long, device=target.device)
        out = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens,
                              do_sample=False, assistant_model=draft, speculation_type="dflash")
    finally:
        del target._get_candidate_generator
    run.tokens = out[0, len(prompt_ids):].tolist()
    return run


@torch.inference_mode()
def target_greedy(target, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
    """The target's own greedy `generate`."""
    prompt = torch.tensor([prompt_ids], dtype=torch.long, device=target.device)
    out = target.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=max_new_tokens,
                          do_sample=False)
    return out[0, len(prompt_ids):].tolist()


def emulated_steps(accepted_per_step: list[int], new_tokens: int, max_new_tokens: int) -> list[int]:
    """transformers' per-step acceptance from our decode loop's (run with full_last_block: it drafts whole blocks,
    as transformers does): a last step with one token left to emit did not draft in transformers, and the last
    step counts what was kept after the length / eos crop, less the target's own token."""
    steps = list(accepted_per_step)
    if not steps:
        return steps
    before_last = 1 + sum(a + 1 for a in steps[:-1])  # the first token, then a + 1 per step
    if max_new_tokens - before_last <= 1:
        return steps[:-1]
    steps[-1] = min(steps[-1], new_tokens - before_last - 1)
    return steps


def forward_keyword() -> str:
    """The name transformers' MuseGlimmerAssistantModel.forward gives its cache (renamed after 5.19)."""
    from transformers import MuseGlimmerAssistantModel

    params = inspect.signature(MuseGlimmerAssistantModel.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def counts_of(steps: list[list[int]], block_size: int) -> AcceptanceCounts:
    """Acceptance counted over every prompt's draft steps: tau and the per-position rates."""
    flat = [a for prompt in steps for a in prompt]
    num = len(flat)
    return AcceptanceCounts(num_drafts=num, drafted=num * (block_size - 1), accepted=sum(flat),
                            acceptance_length=round(1 + sum(flat) / num, 4) if num else 1.0,
                            per_position_rates=[round(sum(a > k for a in flat) / num, 4) if num else 0.0
                                                for k in range(block_size - 1)])


def cannot_compare(spec: DraftSpec, prompts: list[list[int]], max_new_tokens: int) -> str | None:
    """Why transformers' run cannot be held to our emulation step for step, or None: a sliding window the run's
    contexts reach (transformers' window is its own, which the runtime does not implement)."""
    sliding = "sliding_attention" in spec.layer_types and spec.sliding_window is not None
    longest = max((len(p) for p in prompts), default=0) + max_new_tokens + spec.block_size
    if sliding and longest > spec.sliding_window - spec.block_size:
        return (f"the sliding window ({spec.sliding_window}) is reached by the run's contexts (up to {longest} "
                "positions): transformers' window (|q - k| <= W over a cache of W - 1 positions) is not the one the "
                "runtime runs, so no step-for-step comparison is exact")
    return None


@torch.inference_mode()
def transformers_checks(draft_dir: Path, target_dir: Path, prompts: list[list[int]], max_new_tokens: int, *,
                        our_draft, our_target, dtype: torch.dtype, say) -> tuple[list[Check], EngineStats]:
    """The pair in transformers' own generate against our decode loop, greedy: per prompt, transformers'
    speculative output, its target-only output and ours are equal, and the acceptance is equal step for step."""
    import transformers

    from dflash_runtime import speculative_generate

    draft, target = load_pair(draft_dir, target_dir, dtype)
    ours_steps, theirs_steps, equal, steps_equal, first_diff = [], [], 0, 0, None
    for i, prompt in enumerate(prompts):
        say(f"engine: transformers {transformers.__version__}: prompt {i + 1}/{len(prompts)}")
        run = observed_generate(target, draft, prompt, max_new_tokens)
        ours = speculative_generate(our_draft, our_target, prompt, max_new_tokens=max_new_tokens,
                                    full_last_block=True)
        emulated = emulated_steps(ours.accepted_per_step, len(ours.tokens), max_new_tokens)
        equal += run.tokens == target_greedy(target, prompt, max_new_tokens) == ours.tokens
        steps_equal += run.accepted_per_step == emulated
        if run.accepted_per_step != emulated and first_diff is None:
            step = next((k for k, (a, b) in enumerate(zip(run.accepted_per_step, emulated)) if a != b),
                        min(len(emulated), len(run.accepted_per_step)))
            first_diff = (f"prompt {i + 1}, draft step {step + 1}: transformers "
                          f"{run.accepted_per_step[step:step + 1]}, emulation {emulated[step:step + 1]}")
        ours_steps.append(emulated)
        theirs_steps.append(run.accepted_per_step)
    block, n = our_draft.block_size, len(prompts)
    counts, emulated_counts = counts_of(theirs_steps, block), counts_of(ours_steps, block)
    checks = [
        make_check("engine_outputs_equal", equal == n, f"transformers' speculative output, its target-only output "
                   f"and ours are equal on {equal}/{n} prompts (greedy)", value=equal, threshold=n,
                   level="end_to_end"),
        make_check("engine_acceptance_agrees", steps_equal == n,
                   f"transformers: {counts.num_drafts} drafts, {counts.accepted} accepted, tau "
                   f"{counts.acceptance_length:.3f}; emulation: {emulated_counts.num_drafts} drafts, "
                   f"{emulated_counts.accepted} accepted, tau {emulated_counts.acceptance_length:.3f}; equal step for "
                   f"step on {steps_equal}/{n} prompts" + (f"; first difference: {first_diff}" if first_diff else ""),
                   value=counts.acceptance_length, threshold=emulated_counts.acceptance_length, level="end_to_end")]
    stats = EngineStats(engine="transformers", version=transformers.__version__, python=sys.executable, prompts=n,
                        outputs_equal=equal, counts=counts, sampling={"temperature": 0.0},
                        tolerance={"mode": "exact, step for step"}, emulated=emulated_counts, steps_equal=steps_equal,
                        engine_config={"dtype": str(dtype).removeprefix("torch."), "attn_implementation": ATTN})
    return checks, stats
