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
from dflash_convert.io.reading import read_json
from dflash_convert.validate.end_to_end import no_library_bar
from dflash_convert.validate.engine import served
from dflash_convert.validate.prepare import Prepared
from dflash_convert.errors import DFlashError, UsageError
from dflash_convert.validate.breakdown import category_slices, context_slice, output_buckets
from dflash_convert.validate.report import AcceptanceCounts, AcceptanceStats, EngineStats, SliceAcceptance
from dflash_convert.validate.static import Check, make_check
from dflash_convert.validate.trained_context import target_positions


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
    long = list(prep.prompts.long.windows.items()) if prep.prompts.long is not None else []
    n = len(prep.prompts.ids)
    request = served.EngineRequest(
        target=prep.target.dir, prompts=prep.prompts.ids + [p for _, windows in long for p in windows],
        max_tokens=opts.max_new_tokens, stop_token_ids=list(prep.sampling.stop_token_ids),
        engine_args=fitting_engine_args(opts.engine_args, long, opts.max_new_tokens,
                                        max(stats.block_size for stats, _ in per_k),
                                        read_json(prep.target.config)),
        sampling=served.engine_sampling(prep.sampling, opts.seed),
        # vLLM's num_speculative_tokens: the proposals of a block (block_size - 1; block_size when the anchor drafts)
        drafts=[{"draft": str(prep.path), "num_speculative_tokens": len(stats.per_position_rates),
                 "mixed_layer_types": mixed} for stats, _ in per_k])
    answer = served.run_vllm(request, python=python, timeout_s=opts.engine_timeout,
                             kv_cache_gib=opts.engine_kv_cache_gib, say=prep.say)
    checks, runs = [], []
    ours = OurOneTokenLogits(prep, device, target_dtype)
    for (stats, outputs), engine_run in zip(per_k, answer["drafts"]):
        short, target_only = split_long(answer, engine_run, n, len(stats.per_position_rates)) if long else (
            engine_run, answer.get("target_only"))
        k_checks, k_run = _vllm_k(prep, {**answer, "drafts": [short], "target_only": target_only}, stats, outputs,
                                  request, python, several=len(per_k) > 1, emulated_dtypes=emulated_dtypes,
                                  ours_top=lambda i, k, ids, outputs=outputs: ours(i, outputs[i][:k + 1], ids))
        engine_breakdowns(k_run, short, prep.prompts.categories, len(stats.per_position_rates), opts.max_new_tokens)
        if long:
            k_checks.append(context_check(k_run, stats, engine_run, answer.get("target_only"), n, long,
                                          sampled=request.sampling is not None and
                                          float(request.sampling.get("temperature") or 0) > 0,
                                          emulated_dtypes=emulated_dtypes, max_new_tokens=opts.max_new_tokens))
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


def fitting_engine_args(engine_args: dict[str, Any], long: list[tuple[int, list[list[int]]]], max_new_tokens: int,
                        block: int, target_config: dict[str, Any]) -> dict[str, Any]:
    """--engine-args with room for the longest --context-lengths prompt, its new tokens and two blocks: vLLM
    drafts a block past the last token, and its drafter cuts the proposals whose positions pass max_model_len
    (with vLLM 0.32 CPU, a max_model_len of exactly prompt + new tokens + block moved its counts on the last
    steps). vLLM's default max_model_len, the one it derives from the target's config (target_positions), is
    kept where that holds them, raised where it does not (vLLM then says whether the target allows it). A
    max_model_len the user gave that is smaller is a usage error naming it (the long prompts would be cut or
    refused, not measured)."""
    if not long:
        return engine_args
    longest = max(length for length, _ in long)
    need = longest + max_new_tokens + 2 * block
    given = engine_args.get("max_model_len")
    if given is not None:
        if int(given) < need:
            raise UsageError(f"--engine-args max_model_len {given} is smaller than the longest --context-lengths "
                             f"prompt ({longest}) + --max-new-tokens ({max_new_tokens}) + two blocks ({2 * block}) "
                             f"= {need}")
        return engine_args
    positions, _ = target_positions(target_config)
    if positions is not None and positions >= need:
        return engine_args
    return {**engine_args, "max_model_len": need}


def split_long(answer: dict[str, Any], run: dict[str, Any], n: int, slots: int
               ) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """(the draft's run on the first `n` prompts, vLLM's target-only run on them) out of a run whose request also
    held the --context-lengths prompts: the counters recounted from vLLM's per-request verify steps, since its
    counters sum over every request. A vLLM that lists no steps cannot be split: an error, never a verdict."""
    if "error" in run:
        return run, answer.get("target_only")
    steps = run.get("steps")
    if steps is None or any(s is None for s in steps):
        raise DFlashError(f"vLLM {answer.get('vllm_version')} lists no per-request verify steps (vLLM 0.32 and "
                          "later, per_request_spec_decode_metrics \"detailed\"), so its counts cannot be grouped per "
                          "--context-lengths value; run without --context-lengths, or with a newer vLLM")
    mine = steps[:n]
    flat = [a for s in mine for a in s]
    short = {**run, "outputs": run["outputs"][:n], "steps": mine, "num_drafts": len(flat),
             **({"top_logits": run["top_logits"][:n]} if run.get("top_logits") is not None else {}),
             "num_draft_tokens": len(flat) * slots, "num_accepted_tokens": sum(flat),
             "num_accepted_tokens_per_pos": [sum(a > k for a in flat) for k in range(slots)]}
    base = answer.get("target_only")
    if base is not None:
        base = {**base, "outputs": base["outputs"][:n],
                **({"top_logits": base["top_logits"][:n]} if base.get("top_logits") is not None else {})}
    return short, base


def engine_breakdowns(engine: EngineStats, run: dict[str, Any], categories: list[str | None], slots: int,
                      max_new_tokens: int) -> None:
    """vLLM's own per-request counts (its verify steps per request) grouped per category and output bucket, as
    the runtime's are (breakdown.py); nothing where this vLLM lists no steps."""
    steps = run.get("steps")
    if "error" in run or steps is None or any(s is None for s in steps):
        return
    engine.per_output_bucket = [SliceAcceptance(**b) for b in output_buckets(steps, slots, max_new_tokens)]
    if any(categories):
        engine.per_category = [SliceAcceptance(**c) for c in category_slices(
            categories, steps, [len(o) for o in run["outputs"]], None, slots)]


def context_check(engine: EngineStats, stats: AcceptanceStats, run: dict[str, Any], target_only: dict | None,
                  n: int, long: list[tuple[int, list[list[int]]]], *, sampled: bool, emulated_dtypes: list[str],
                  max_new_tokens: int) -> Check:
    """`engine_context_lengths`: vLLM's counts per --context-lengths value (the prompts after the first `n`),
    grouped into `engine.per_context_length`, each against the emulation of that length counted as vLLM counts:
    greedy, the outputs (vLLM's speculative, its target-only and ours, equal or parting first at a near-tie) and
    the counts step by step (served.greedy_agreement); sampled, within the counts' interval. A greedy difference
    of the counts where either side ran in half precision is a warning (no verdict): see the comment below; an
    output that is not the target's (beyond the near-ties outputs_check excuses) fails in any dtype."""
    slots = len(stats.per_position_rates)
    served_dtype = str((run.get("engine_config") or {}).get("dtype") or "bfloat16")
    parts, verdicts, first, outputs_failed = [], [], n, False
    for i, (length, windows) in enumerate(long):
        rows = slice(first, first + len(windows))
        first += len(windows)
        steps, spec = run["steps"][rows], run["outputs"][rows]
        equal, outputs_bad = None, None
        if not sampled and target_only is not None and i < len(stats._context_outputs):
            top = target_only.get("top_logits")
            spec_top = run.get("top_logits")  # the speculative run's verify rows: vLLM's own two paths measured
            check, equal = served.outputs_check(spec, target_only["outputs"][rows], stats._context_outputs[i],
                                                top[rows] if top is not None else None, served_dtype,
                                                spec_top[rows] if spec_top is not None else None)
            outputs_bad = None if check.status == "pass" else check.message
            outputs_failed = outputs_failed or outputs_bad is not None
        got = SliceAcceptance(**context_slice(length, steps, sum(map(len, spec)), slots, equal))
        engine.per_context_length.append(got)
        emulated_slice = stats.vllm_context_counting[i]
        counts, emulated = _as_counts(got, slots), _as_counts(emulated_slice, slots)
        if sampled:
            agrees, detail, _ = served.sampled_agreement(counts, emulated)
        else:
            decisions = stats.vllm_context_steps[i] if stats.vllm_context_steps else None
            agrees, detail, _ = served.greedy_agreement({"steps": steps}, counts, emulated, decisions,
                                                        [served_dtype, *emulated_dtypes], max_new_tokens)
        verdicts.append(False if outputs_bad else agrees)
        parts.append(f"{length} tokens: vLLM tau {got.acceptance_length:.3f} ({got.num_drafts} steps, {got.accepted} "
                     f"accepted), emulation {emulated_slice.acceptance_length:.3f} ({emulated_slice.num_drafts} steps, "
                     f"{emulated_slice.accepted} accepted); " + (outputs_bad or detail))
    ok = None if any(v is None for v in verdicts) and False not in verdicts else False not in verdicts
    coarse = sorted({d for d in (served_dtype, *emulated_dtypes) if d != "float32"})
    if ok is False and coarse and not sampled and not outputs_failed:  # outputs_check already excused its near-ties
        # the tie rules are calibrated on short prompts; over long contexts half-precision rounding moves decisions
        # further (the bundled pair in bfloat16: a count 16 ulps from a tie at 96 tokens, a target-only token 4 ulps
        # from the other at 239; every count and output equal in float32): no verdict on the draft from it
        ok = None
        parts.insert(0, f"in {', '.join(coarse)} over long contexts, rounding moves decisions further than the tie "
                     "rules allow, so this is no verdict on the draft: compare exactly with --dtype float32 "
                     "--engine-args '{\"dtype\": \"float32\"}'")
    return make_check("engine_context_lengths", bool(ok), "vLLM per context length against the emulation counted as "
                      "vLLM counts: " + " | ".join(parts),
                      value={s.label: s.acceptance_length for s in engine.per_context_length},
                      threshold={s.label: s.acceptance_length for s in stats.vllm_context_counting},
                      level="end_to_end", bad="warn" if ok is None else "fail")


def _as_counts(s: SliceAcceptance, slots: int) -> AcceptanceCounts:
    return AcceptanceCounts(num_drafts=s.num_drafts, drafted=s.num_drafts * slots, accepted=s.accepted,
                            acceptance_length=s.acceptance_length, per_position_rates=s.per_position_rates)


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
