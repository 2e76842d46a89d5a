"""The engine level: the pair run by the real engine after the end-to-end level, on the same prompts, max tokens
and sampling, and checked against what that level emulated.

- `vllm_level` (--engine-python PATH): every K of the run served one after another in one vLLM process
  (served.py), each against the emulation of that K counted as vLLM counts;
- `transformers_level` (--engine transformers): transformers' own generate(speculation_type="dflash"),
  in-process, against our decode loop run with transformers' semantics (transformers_engine.py): greedy, step
  for step.

Each returns (checks, what the engine ran, or why it did not run): where the engine cannot run here, the level
says why and the emulation's verdict stands.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from dflash_convert.format import engine_views
from dflash_convert.validate.end_to_end import no_library_bar
from dflash_convert.validate.engine import served
from dflash_convert.validate.prepare import Prepared
from dflash_convert.validate.report import AcceptanceStats, EngineStats
from dflash_convert.validate.static import Check


def vllm_level(prep: Prepared, per_k: list[tuple[AcceptanceStats, list[list[int]]]], *,
               emulated_dtypes: list[str], device: str = "cpu", target_dtype: Any = None
               ) -> tuple[list[list[Check]], list[EngineStats], str | None]:
    """(each K's checks, each K's run in vLLM, None) for the (figures, our outputs) of each K; ([], [], why)
    where vLLM cannot serve the draft here. Our target (on `device`, in `target_dtype`) is loaded again only where
    vLLM's target-only output parts from ours beyond the floor, to measure the two engines' noise there."""
    opts, spec = prep.opts, prep.ckpt.spec
    python = served.engine_python(opts.engine_python)
    refused = engine_views.vllm_cannot_serve_here(spec)
    if refused is not None and not _has_cuda():
        # no GPU here, so vLLM runs its CPU build (V1 model runner only): say why, keep the emulation's verdict
        prep.say(f"engine: {refused}; the emulation above is the vLLM verdict")
        return [], [], refused
    mixed = len(set(spec.layer_types)) > 1
    request = served.EngineRequest(
        target=prep.target.dir, prompts=prep.prompts.ids, max_tokens=opts.max_new_tokens,
        stop_token_ids=list(prep.sampling.stop_token_ids), engine_args=opts.engine_args,
        sampling=served.engine_sampling(prep.sampling, opts.seed),
        # vLLM's num_speculative_tokens: the proposals of a block (block_size - 1; block_size when the anchor drafts)
        drafts=[{"draft": str(prep.path), "num_speculative_tokens": len(stats.per_position_rates),
                 "mixed_layer_types": mixed} for stats, _ in per_k])
    answer = served.run_vllm(request, python=python, timeout_s=opts.engine_timeout,
                             kv_cache_gib=opts.engine_kv_cache_gib, say=prep.say)
    checks, runs = [], []
    ours = OurOneTokenLogits(prep, device, target_dtype)
    for (stats, outputs), engine_run in zip(per_k, answer["drafts"]):
        k_checks, k_run = _vllm_k(prep, {**answer, "drafts": [engine_run]}, stats, outputs, request, python,
                                  several=len(per_k) > 1, emulated_dtypes=emulated_dtypes,
                                  ours_top=lambda i, k, ids, outputs=outputs: ours(i, outputs[i][:k + 1], ids))
        checks.append(k_checks)
        runs.append(k_run)
    return checks, runs, None


def _vllm_k(prep: Prepared, answer: dict[str, Any], stats: AcceptanceStats, outputs: list[list[int]],
            request: served.EngineRequest, python: str, *, several: bool,
            emulated_dtypes: list[str], ours_top=None) -> tuple[list[Check], EngineStats]:
    """vLLM's run of one K (`answer` holds that draft's run alone) against the emulation of that K."""
    opts = prep.opts
    checks, engine_run = served.served_checks(
        answer, outputs, stats.vllm_counting, block=stats.block_size, engine_args=opts.engine_args, python=python,
        min_acceptance_length=opts.min_acceptance_length, min_position_rates=opts.min_position_rates,
        sampling=request.sampling, steps=stats.vllm_steps, emulated_dtypes=emulated_dtypes, ours_top=ours_top)
    equal = engine_run.outputs_equal
    k = f" at num_speculative_tokens {len(stats.per_position_rates)}" if several else ""
    prep.say(f"engine: vLLM {engine_run.version}{k}: tau {engine_run.counts.acceptance_length:.3f}, "
             + (f"outputs equal on {equal}/{engine_run.prompts} prompts" if equal is not None else "sampled"))
    return checks, engine_run


class OurOneTokenLogits:
    """Our target's one-token decode logits (dflash_runtime.paths) at a token of our output, the second computation
    where vLLM's target-only output parts from ours (served.outputs_check); the target is loaded on first use."""

    def __init__(self, prep: Prepared, device: str, dtype: Any):
        self.prep, self.device, self.dtype, self.target = prep, device, dtype, None

    def __call__(self, i: int, tokens: list[int], ids: list[int]) -> dict[str, float]:
        """{token id: logit} of `ids` for the last of `tokens`, prompt i's output up to it."""
        import torch

        from dflash_convert.validate.sampling import runtime_sampling
        from dflash_runtime import load_target
        from dflash_runtime.paths import one_token_logits

        if self.target is None:
            self.prep.say("engine: loading our target to measure where vLLM's target-only output parts from ours")
            with no_library_bar():
                self.target = load_target(self.prep.target.dir, device=self.device,
                                          dtype=self.dtype if self.dtype is not None else torch.float32)
        penalties = runtime_sampling(self.prep.sampling).penalties
        row = one_token_logits(self.target, self.prep.prompts.ids[i], tokens,
                               max_new_tokens=self.prep.opts.max_new_tokens, penalties=penalties)[-1]
        return {str(t): float(row[t]) for t in ids}


def transformers_level(prep: Prepared, *, draft: Any, dtype: Any,
                       target_dtype: Any) -> tuple[list[Check], EngineStats | None, str | None]:
    """(checks, transformers' run, None), or ([], None, why) where it cannot be compared here. `draft`: the numeric
    level's loaded draft (None: loaded here in `dtype`); the target is loaded in `target_dtype`."""
    from dflash_convert.validate.engine import transformers_engine

    from dflash_runtime import load_draft, load_target

    opts, spec = prep.opts, prep.given.spec
    why = None
    if spec.source_format != "transformers":
        why = "transformers reads only its own layout: convert --to transformers (--non-causal), then validate that"
    elif prep.sampling.temperature > 0:
        why = "sampled: transformers draws from a random stream of its own; it is compared greedy only"
    else:
        why = transformers_engine.cannot_compare(spec, prep.prompts.ids, opts.max_new_tokens)
    if why is not None:
        prep.say(f"engine: transformers not run: {why}")
        return [], None, why
    draft = draft if draft is not None else load_draft(prep.ckpt, dtype=dtype, **prep.draft_options)
    with no_library_bar():  # its loads of the pair: the status lines say what loads (none under -q)
        target = load_target(prep.target.dir, dtype=target_dtype)
        checks, e = transformers_engine.transformers_checks(
            Path(prep.path), prep.target.dir, prep.prompts.ids, opts.max_new_tokens, our_draft=draft,
            our_target=target, dtype=dtype, say=prep.say)
    prep.say(f"engine: transformers {e.version}: tau {e.counts.acceptance_length:.3f} (emulation "
             f"{e.emulated.acceptance_length:.3f}), outputs equal on {e.outputs_equal}/{e.prompts}, acceptance "
             f"equal step for step on {e.steps_equal}/{e.prompts} prompts")
    return checks, e, None


def _has_cuda() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available())
