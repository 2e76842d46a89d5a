"""The end-to-end level (target weights): speculative decoding of the prompts against the real target;
greedy output must be the target's own greedy output; tau, per-position rates and speedup measured
against the user's thresholds."""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from dflash_convert.errors import DFlashError, NotRunnable
from dflash_convert.io.checkpoint import Checkpoint
from dflash_convert.io.progress import Step
from dflash_convert.validate.breakdown import (LongContexts, category_slices, context_check, context_slice,
                                               half_tau_length, output_buckets)
from dflash_convert.validate.static import Check, first_difference, make_check
from dflash_convert.validate.options import ValidateOptions
from dflash_convert.validate.report import (UNRELIABLE_TIMING, AcceptanceCounts, AcceptanceStats,
                                            PromptSetAcceptance, PromptStats, SamplingUsed, SliceAcceptance,
                                            StepDecisions, SyntheticAcceptance)
from dflash_convert.validate.sampling import runtime_sampling
from dflash_convert.validate.partings import PathParting
from dflash_runtime.metrics import DecodeStats

BASELINE_PROMPTS = 4  # prompts also decoded target-only (speedup, direct comparison)
BUSY_LOAD = 0.75  # 1-minute load average per usable core above which timings are reported unreliable
# Without --min-acceptance-length, tau below 1 + this share of the block's draft slots is a loud warning:
# at block 16 a draft wired to the wrong target layers accepts ~1.6 (a working one 6 and more).
AUTO_ACCEPTED_SHARE_WARN = 0.1
LOW_TAU_CAUSES = ("the wrong target (another model, or one of the same shape with other weights: the draft's "
                    "config names the target it was trained against), target layer ids (a lost +1 between the formats' ids, a reordered list), the mask token id, "
                    "causality (a causal draft served non-causally or the reverse)")


def auto_tau_floor(block: int) -> float:
    """The tau below which a draft is reported as accepting almost nothing at this block size."""
    return round(1 + AUTO_ACCEPTED_SHARE_WARN * (block - 1), 4)


@dataclass
class Prompts:
    """What end to end decodes: token ids, the named prompt sets among them ((name, source, first, end)
    slices of `ids`, reported on their own) and how text became ids (chat template or raw)."""

    ids: list[list[int]]
    sets: list[tuple[str, str, int, int]] = field(default_factory=list)
    format: str | None = None
    builtin: str | None = None  # prompts.BUILTIN_*_NOTE: neither the user's prompts nor a named set
    long: LongContexts | None = None  # --context-lengths: the long prompts, decoded on their own
    categories: list[str | None] = field(default_factory=list)  # each prompt's category (a JSONL field), or None


@dataclass
class Placement:
    """Where and how the pair runs: the device, the draft's dtype and the target's (None: the draft's),
    load_draft's options, and whether the target feeds its last layer after the final norm (as the engine
    serving the draft does)."""

    device: str
    dtype: Any
    target_dtype: Any = None
    draft_options: dict[str, Any] = field(default_factory=dict)
    last_layer_post_norm: bool = False


def end_to_end(ckpt: Checkpoint, target_dir: Path, prompts: Prompts, opts: ValidateOptions, *, block: int,
               sampling: SamplingUsed, placement: Placement, draft=None,
               progress: Callable[[str], None] | None = None, quiet: bool = False
               ) -> tuple[list[Check], AcceptanceStats | None, list[list[int]]]:
    """(checks, acceptance statistics, speculative outputs) of speculative decoding of `prompts` against the
    target at `target_dir` with `sampling` (its stop ids included), `block` slots a step (the K run: validate
    resolves it); `draft` is the numeric level's loaded draft when it ran. Each prompt is also decoded with full
    last blocks, for the figures as vLLM counts them."""
    say = progress or (lambda message: None)
    prompt_ids = prompts.ids
    target = _load_target(target_dir, opts, placement, say=say, quiet=quiet)
    decoding = runtime_sampling(sampling, opts.seed)
    _check_target_path(target, prompt_ids, opts.max_new_tokens, decoding, say)
    try:
        draft = _ready_draft(ckpt, draft, target, opts, placement, say=say)
    except NotRunnable as exc:  # the runtime's limit, not the draft's defect: no verdict
        raise DFlashError(f"could not run the draft: {exc}") from None
    except DFlashError as exc:
        return [make_check("pair_compatible", False, str(exc), level="end_to_end")], None, []
    checks = [make_check("pair_compatible", True, f"draft and target {target_dir} run together "
                     f"({target.num_layers} target layers, hidden {target.hidden_size})", level="end_to_end")]
    slots = draft.proposals(block)  # proposals per block: block - 1, or block when the anchor's slot predicts (dspark)
    decode = Decode(draft, target, opts, decoding, block)
    base_n = min(BASELINE_PROMPTS, len(prompt_ids))
    finished: list = []  # the speculative generations of the prompts done so far
    try:
        runs, full, rounds = _decode_prompts(decode, prompt_ids, opts, say, finished)
    except KeyboardInterrupt:  # Ctrl-C: what was measured, marked partial, goes up with the interrupt
        raise MeasuredSoFar(checks + [_partial_check(finished, len(prompt_ids), block, slots)]) from None
    whole = DecodeStats.merge([r.stats for r in runs])
    if sampling.temperature == 0:
        same = _greedy_check(checks, target, prompt_ids, runs, rounds[0][0], penalties=decoding.penalties,
                             proposals=slots, max_new_tokens=opts.max_new_tokens)
    else:  # samples cannot be compared token by token: the decode loop's exactness is checked greedily
        same = None
        _greedy_check(checks, target, prompt_ids[:base_n], *_greedy_pass(decode, prompt_ids[:base_n], say),
                      proposals=slots, max_new_tokens=opts.max_new_tokens,
                      sampled_at=sampling.temperature, penalties=decoding.penalties)
    _acceptance_checks(checks, whole, block, opts, slots)
    spec = DecodeStats.merge([g.stats for _, sr in rounds for g in sr])
    base = DecodeStats.merge([g.stats for br, _ in rounds for g in br])
    per_round = [_round_speedup(br, sr) for br, sr in rounds]
    speedup = _ratio(spec.tokens_per_s, base.tokens_per_s)
    checks.append(_speedup_check(speedup, per_round, spec.tokens_per_s, base.tokens_per_s, base_n,
                                 opts.timing_rounds, opts.min_speedup))
    if block != draft.block_size:
        checks.append(make_check("block_size_override", False, f"run at block size {block}; the draft was trained "
                             f"at {draft.block_size}", value=block, threshold=draft.block_size,
                             level="end_to_end", bad="warn"))
    stats = AcceptanceStats(
        prompts=len(runs), new_tokens=whole.new_tokens, block_size=block, max_new_tokens=opts.max_new_tokens,
        temperature=sampling.temperature, draft_sampling=opts.draft_sampling, acceptance_length=round(whole.tau, 4),
        per_position_rates=_rounded(whole.per_position_rates, slots),
        predicted_position_rates=_rounded(whole.predicted_rates, slots)
        if whole.predicted_rates else None,
        num_drafts=whole.num_drafts, accepted=whole.accepted,
        vllm_counting=counts(DecodeStats.merge([g.stats for g in full]), slots) if full else None,
        vllm_steps=[_step_decisions(g.decisions) for g in full] if full and full[0].decisions is not None else None,
        outputs_equal=None if same is None else sum(same), baseline_prompts=base_n,
        timing_rounds=opts.timing_rounds, target_attention=target.attention,
        target_compiled=target.compile if opts.compile else None, target_eager_reason=target.eager_reason,
        speculative_tokens_per_s=spec.tokens_per_s, target_tokens_per_s=base.tokens_per_s,
        speedup=speedup, speedup_range=[min(per_round), max(per_round)],
        speculative_tokens_per_s_range=_tps_range([sr for _, sr in rounds]),
        target_tokens_per_s_range=_tps_range([br for br, _ in rounds]), sampling=sampling,
        prompt_format=prompts.format, builtin_prompts=prompts.builtin, per_prompt_set={name: _set_stats(source, runs[first:end], slots)
                                                      for name, source, first, end in prompts.sets},
        per_prompt=[PromptStats(prompt=i + 1, prompt_tokens=len(p), new_tokens=r.stats.new_tokens,
                                steps=r.stats.num_drafts, acceptance_length=round(r.stats.tau, 4),
                                output_equal=None if same is None else same[i],
                                accepted_histogram=step_histogram(r.stats.per_position_rates, r.stats.num_drafts))
                    for i, (p, r) in enumerate(zip(prompt_ids, runs))])
    stats.synthetic = synthetic_acceptance(stats)
    stats.round_step_times = _round_step_times(rounds)
    stats.per_request_histogram = request_histogram([p.acceptance_length for p in stats.per_prompt], block)
    stats.per_output_bucket = [SliceAcceptance(**b) for b in output_buckets([r.accepted_per_step for r in runs], slots,
                                                                           opts.max_new_tokens)]
    if any(prompts.categories):
        stats.per_category = [SliceAcceptance(**c) for c in category_slices(
            prompts.categories, [r.accepted_per_step for r in runs], [r.stats.new_tokens for r in runs], same, slots)]
        checks += _category_checks(stats.per_category, opts, block)
    if prompts.long is not None:
        checks.append(_context_curve(decode, prompts.long, stats, slots, greedy=sampling.temperature == 0, say=say,
                                     vllm_counting=opts.engine == "vllm"))
    return checks, stats, [r.tokens for r in runs]


def _category_checks(slices: list[SliceAcceptance], opts: ValidateOptions, block: int) -> list[Check]:
    """--min-acceptance-length CATEGORY=X: one gate per category named, its name carrying the category."""
    out = []
    for s in slices:
        need = opts.min_category_acceptance_length.get(s.category)
        if need is not None:
            out.append(make_check(f"acceptance_length[{s.category}]", s.acceptance_length >= need,
                                  f"category {s.category}: tau {s.acceptance_length:.3f} over {s.num_drafts} draft "
                                  f"steps of {s.prompts} prompts (block {block}); required >= {need}",
                                  value=s.acceptance_length, threshold=need, level="end_to_end"))
    return out


def _context_curve(decode: Decode, long: LongContexts, stats: AcceptanceStats, slots: int, *, greedy: bool,
                   say, vllm_counting: bool = False) -> Check:
    """--context-lengths: each length's long prompts decoded as the run's prompts are and checked against the
    target's greedy output token by token (a greedy pass of them where the run samples), its figures in `stats`;
    the check fails on an output that is not the target's, and warns where tau falls below half the short prompts' tau. `vllm_counting`
    (--engine vllm): each length's prompts decoded again counted as vLLM counts (full last blocks, with their
    verify decisions), what the engine level compares vLLM's figures per length with."""
    target = decode.target
    dtype = str(target.dtype).removeprefix("torch.")
    slices, wrong = [], []
    for length, windows in long.windows.items():
        runs = []
        for i, p in enumerate(windows, 1):
            runs.append(decode.speculative(p))
            say(f"end to end: context {length} tokens, prompt {i}/{len(windows)}: tau {runs[-1].stats.tau:.2f}")
        # sampled outputs cannot be compared token by token: as for the run's own prompts, each long prompt is
        # decoded again greedily and that output judged (a defect that shows only at long context must fail)
        judged = runs if greedy else _greedy_speculative(decode, windows, say, f"context {length} tokens")
        found = [_partings(target, p, r, None, dtype, decode.sampling.penalties, proposals=slots,
                           max_new_tokens=decode.kw["max_new_tokens"]) for p, r in zip(windows, judged)]
        _refuse_beyond_rounding([(i, x) for i, f in enumerate(found) for x in f], where=f"{length} tokens, ")
        real = [any(not x.near_tie for x in f) for f in found]
        equal = real.count(False)
        wrong += [f"{length} tokens, prompt {i + 1}" for i, bad in enumerate(real) if bad]
        slices.append(SliceAcceptance(**context_slice(length, [r.accepted_per_step for r in runs],
                                    sum(r.stats.new_tokens for r in runs), slots, equal)))
        if vllm_counting:
            say(f"end to end: context {length} tokens again, counted as vLLM counts (full last blocks)")
            full = [decode.speculative(p, full_last_block=True, record_decisions=True) for p in windows]
            stats.vllm_context_counting.append(SliceAcceptance(**context_slice(
                length, [g.accepted_per_step for g in full], sum(g.stats.new_tokens for g in full), slots, None)))
            if greedy and all(g.decisions is not None for g in full):
                stats.vllm_context_steps = (stats.vllm_context_steps or []) + [[_step_decisions(g.decisions)
                                                                                 for g in full]]
            stats._context_outputs.append([r.tokens for r in runs])
    stats.per_context_length, stats.context_source = slices, long.source
    stats.context_half_tau_length = half_tau_length(stats.acceptance_length, slices)
    check = context_check("context_lengths", stats.acceptance_length, slices, stats.context_half_tau_length, wrong)
    if not greedy:
        check.message += (" (outputs checked on a greedy pass of the long prompts: the run itself samples at "
                          f"temperature {decode.sampling.temperature})")
    return check


def _greedy_speculative(decode: Decode, prompts: list[list[int]], say, what: str) -> list:
    """Greedy speculative generations of `prompts`, whatever the run samples with (the exactness check's)."""
    greedy = dict(sampling=dataclasses.replace(decode.sampling, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0))
    say(f"end to end: {what}: greedy pass over {len(prompts)} prompt(s) (the run samples; exactness is checked "
        "greedily)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return [decode.speculative(p, **greedy) for p in prompts]


def step_histogram(rates: list[float], num_drafts: int) -> list[int]:
    """One prompt's verify steps by drafts accepted, as vLLM's --per-request-spec-decode-metrics summary reports
    them: entry a = steps that accepted exactly a drafts, a = 0 .. len(rates). From the per-position rates
    (rates[k] = share of steps that accepted more than k drafts, so exactly a: rates[a - 1] - rates[a])."""
    at_least = [1.0, *rates, 0.0]
    return [round(num_drafts * (at_least[a] - at_least[a + 1])) for a in range(len(rates) + 1)]


def request_histogram(taus: list[float], block: int) -> list[int]:
    """Over the prompts, how many reached each tau band [1, 2), [2, 3), ..., [block - 1, block] (tau = block
    falls in the last)."""
    bands = [0] * max(block - 1, 1)
    for tau in taus:
        bands[min(max(int(tau) - 1, 0), len(bands) - 1)] += 1
    return bands


def synthetic_acceptance(stats: AcceptanceStats) -> SyntheticAcceptance | None:
    """vLLM's synthetic-sampler keys for the acceptance of `stats`, from the figures counted as vLLM counts when
    this run has them; None without draft steps."""
    counted = stats.vllm_counting
    rates = counted.per_position_rates if counted else stats.per_position_rates
    if not rates or not (counted or stats).num_drafts:
        return None
    return SyntheticAcceptance(num_speculative_tokens=len(rates), synthetic_acceptance_rates=rates,
                               counted="vllm" if counted else "last_block_shortened")


class MeasuredSoFar(KeyboardInterrupt):
    """Ctrl-C during the end-to-end level, with the checks made and the figures measured until then."""

    def __init__(self, checks: list[Check]):
        super().__init__()
        self.checks = checks


def _partial_check(finished: list, total: int, block: int, slots: int) -> Check:
    """The figures of the prompts decoded before a Ctrl-C (skip: no gate judges a partial run)."""
    if not finished:
        return make_check("end_to_end_partial", None, f"interrupted (Ctrl-C) before the first of {total} prompts "
                          "was decoded: nothing measured", level="end_to_end")
    merged = DecodeStats.merge([r.stats for r in finished])
    rates = _rounded(merged.per_position_rates, slots)
    return make_check("end_to_end_partial", None, f"interrupted (Ctrl-C) after {len(finished)}/{total} prompts: tau "
                      f"{merged.tau:.2f} over {merged.new_tokens} tokens ({merged.num_drafts} draft steps, block "
                      f"{block}); per position [{', '.join(f'{r:.2f}' for r in rates)}]; not checked: greedy output, speedup, thresholds",
                      value={"prompts": len(finished), "acceptance_length": round(merged.tau, 4),
                             "new_tokens": merged.new_tokens, "per_position_rates": rates},
                      threshold=f"{total} prompts", level="end_to_end")


def _decode_prompts(decode: Decode, prompt_ids: list[list[int]], opts: ValidateOptions, say, runs: list):
    """(speculative generations of every prompt, appended to `runs` as they finish, the same counted as vLLM
    counts them (full last blocks, with their verify decisions; only under --engine vllm, else None), the timing
    rounds over the first
    BASELINE_PROMPTS)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the block-size note is reported once, as a check
        say("end to end: warm-up")
        # one step of each path (first-call allocations and lazy initialisation): a longer warm-up costs
        # minutes at real size on CPU, where a draft that accepts little makes every token a verify step
        decode.speculative(prompt_ids[0], max_new_tokens=2)
        decode.target_only(prompt_ids[0], max_new_tokens=2)
        for i, p in enumerate(prompt_ids, 1):
            runs.append(decode.speculative(p))
            say(Step(f"end to end: prompt {i}/{len(prompt_ids)}: {runs[-1].stats.new_tokens} tokens, "
                     f"tau {runs[-1].stats.tau:.2f}", done=i, total=len(prompt_ids)))
        full = None
        if opts.engine == "vllm":  # a second pass: only runs compared with vLLM's counters need it
            say("end to end: the prompts again, counted as vLLM counts (full last blocks)")
            full = [decode.speculative(p, full_last_block=True, record_decisions=True) for p in prompt_ids]
        rounds = _timing_rounds(decode, prompt_ids[:BASELINE_PROMPTS], opts.timing_rounds, say)
    return runs, full, rounds


def _step_decisions(decisions) -> StepDecisions:
    """A prompt's dflash_runtime.ties.Decision list as the report holds it (inf: None, gaps to 6 digits)."""
    def gap(g: float) -> float | None:
        return None if math.isinf(g) else float(f"{g:.6g}")

    return StepDecisions(accepted=[d.accepted for d in decisions], margin=[gap(d.margin) for d in decisions],
                         next_margin=[gap(d.next_margin) for d in decisions])


def counts(stats: DecodeStats, slots: int) -> AcceptanceCounts:
    """The figures of `stats`, rates over the `slots` proposals of a block."""
    return AcceptanceCounts(num_drafts=stats.num_drafts, drafted=stats.drafted, accepted=stats.accepted,
                            acceptance_length=round(stats.tau, 4),
                            per_position_rates=_rounded(stats.per_position_rates, slots))


def _set_stats(source: str, runs, slots: int) -> PromptSetAcceptance:
    merged = DecodeStats.merge([r.stats for r in runs])
    return PromptSetAcceptance(source=source, prompts=len(runs), new_tokens=merged.new_tokens,
                               num_drafts=merged.num_drafts, accepted=merged.accepted,
                               acceptance_length=round(merged.tau, 4),
                               per_position_rates=_rounded(merged.per_position_rates, slots))


class Decode:
    """The two decoding paths of one pair, with the run's options; keyword overrides go to the runtime's call."""

    def __init__(self, draft, target, opts: ValidateOptions, sampling, block: int):
        self.draft, self.target = draft, target
        self.sampling = sampling  # dflash_runtime.Sampling
        self.kw = dict(max_new_tokens=opts.max_new_tokens, sampling=sampling)
        self.spec_kw = dict(self.kw, block_size=block, draft_sampling=opts.draft_sampling)

    def speculative(self, prompt: list[int], **over):
        from dflash_runtime import speculative_generate

        return speculative_generate(self.draft, self.target, prompt, **{**self.spec_kw, **over})

    def target_only(self, prompt: list[int], **over):
        from dflash_runtime import target_generate

        return target_generate(self.target, prompt, **{**self.kw, **over})


def _load_target(target_dir: Path, opts: ValidateOptions, placement: Placement, *, say, quiet: bool):
    from dflash_runtime import load_target

    device_map = opts.placed_by_device_map
    dtype = placement.target_dtype or placement.dtype
    stored = sum(p.stat().st_size for p in Path(target_dir).glob("*.safetensors"))
    size = f"{stored / 1e9:.1f} GB" if stored >= 1e9 else f"{stored / 1e6:.1f} MB"
    say(f"end to end: loading the target {target_dir} ({size} of weights; "
        f"{str(dtype).removeprefix('torch.')}, " + (f"device map {device_map}" if device_map else placement.device)
        + ")")
    with no_library_bar():  # our own status line (with its elapsed time) says what is loading
        target = load_target(target_dir, device=placement.device, dtype=dtype, attn_implementation=opts.target_backend,
                             trust_remote_code=False, device_map=device_map, max_memory=opts.max_memory,
                             compile=opts.compile)
    if placement.last_layer_post_norm:  # the engine feeds the draft the last layer's output after the final norm
        target.feed_after_final_norm({target.num_layers - 1})
    if target.offloaded:
        say("end to end: target placed as " + ", ".join(f"{n} module(s) on {d}" for d, n in target.offloaded.items())
            + f"; the draft runs on {target.draft_device}")
    return target


def _check_target_path(target, prompt_ids: list[list[int]], max_new_tokens: int, sampling, say) -> None:
    """Before any verdict: the runtime can undo rejected proposals in this target's cache, and its
    target-only greedy decoding of the first prompt (after another one, so that a reused cache must
    start clean) is transformers' own `generate`, with the run's stop ids and penalties (`sampling`, a
    dflash_runtime.Sampling; the check itself is greedy). Otherwise a wrong output would be blamed on the draft;
    raises DFlashError ("the runtime cannot run this target"). `generate` runs with a neutral generation
    config (the model's own would add what vLLM ignores) and the run's penalties as a logits processor
    that applies vLLM's rule (dflash_runtime.sampling), the same the runtime applies."""
    import torch
    from dflash_runtime import check_target, target_generate
    from transformers import GenerationConfig, LogitsProcessorList

    greedy = dataclasses.replace(sampling, temperature=0.0)
    stop, penalties = sampling.stop_token_ids, sampling.penalties
    check_target(target)
    say("end to end: checking the runtime's target path against transformers' generate")
    prompt = prompt_ids[0]
    target_generate(target, prompt_ids[-1] + prompt_ids[0], max_new_tokens=4, sampling=greedy)
    ours = target_generate(target, prompt, max_new_tokens=max_new_tokens, sampling=greedy).tokens
    own = target.model.generation_config
    processors = [VllmPenaltiesProcessor(penalties, len(prompt))] if penalties.active else []
    try:
        target.model.generation_config = GenerationConfig()
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ids = torch.tensor([prompt], device=target.device)
            out = target.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                        do_sample=False, eos_token_id=list(stop) or None,
                                        pad_token_id=(list(stop) or [0])[0],
                                        logits_processor=LogitsProcessorList(processors))
    finally:
        target.model.generation_config = own
    theirs = out[0, len(prompt):].tolist()
    n = min(len(ours), len(theirs))  # one may stop at an eos the other's generation config does not name
    at = next((i for i in range(n) if ours[i] != theirs[i]), None)
    if at is not None or n == 0:
        where = (f"token {at + 1} is {ours[at]} where transformers' generate gives {theirs[at]}" if at is not None
                 else "no token was generated")
        raise DFlashError(f"the runtime cannot run this target ({type(target.model).__name__}): its target-only "
                          f"greedy decoding of prompt 1 differs from transformers' generate ({where})")


def _ready_draft(ckpt: Checkpoint, draft, target, opts: ValidateOptions, placement: Placement, *, say):
    """The draft on the target's draft device, compiled when asked; raises DFlashError when the pair cannot run."""
    from dflash_runtime import check_pair, load_draft

    dtype, draft_options = placement.dtype, placement.draft_options
    if draft is None:  # not loaded by the numeric level
        say(f"end to end: loading the draft ({str(dtype).removeprefix('torch.')}, {target.draft_device})")
        draft = load_draft(ckpt, device=target.draft_device, dtype=dtype, backend=opts.backend, causal=opts.causal,
                           **draft_options)
    elif draft.device != target.draft_device:
        draft = load_draft(ckpt, device=target.draft_device, dtype=dtype, backend=draft.backend, causal=opts.causal,
                           **draft_options)
    if opts.compile:  # static caches and compiled steps; the warm-up compiles them
        draft = draft.with_backend(draft.backend, compile=True)
    check_pair(draft, target)
    return draft


def _timing_rounds(decode: Decode, prompts: list[list[int]], n: int, say) -> list[tuple[list, list]]:
    """Target-only and speculative decoding of `prompts`, interleaved (the order alternates per round) so
    that both see the same machine: [(target-only generations, speculative generations)] per round."""
    rounds: list[tuple[list, list]] = []
    for r in range(n):
        base_round, spec_round = [], []
        for p in prompts:
            if r % 2 == 0:
                base_round.append(decode.target_only(p))
                spec_round.append(decode.speculative(p))
            else:
                spec_round.append(decode.speculative(p))
                base_round.append(decode.target_only(p))
        rounds.append((base_round, spec_round))
        say(Step(f"end to end: timing round {r + 1}/{n}: speedup {_round_speedup(base_round, spec_round):.2f}x",
                 done=r + 1, total=n))
    return rounds


def _greedy_pass(decode: Decode, prompts: list[list[int]], say) -> tuple[list, list]:
    """(speculative, target-only) greedy generations of `prompts`, whatever the run samples with."""
    greedy = dict(sampling=dataclasses.replace(decode.sampling, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0))
    say(f"end to end: greedy pass over {len(prompts)} prompt(s) (the run samples; exactness is checked greedily)")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ([decode.speculative(p, **greedy) for p in prompts], [decode.target_only(p, **greedy) for p in prompts])


def _greedy_check(checks: list[Check], target, prompt_ids, runs, baselines, *, proposals: int, max_new_tokens: int,
                  sampled_at: float | None = None, penalties=None) -> list[bool]:
    """Appends greedy_output_equal; returns, per prompt, whether its output is the target's greedy output.
    `sampled_at`: the run samples at this temperature and `runs` are a greedy pass made for this check.
    A token that is not the target's greedy choice passes as a near-tie when the target's own verify block puts
    it there (validate.partings: the gap within the noise measured between the target's two paths); any other one
    fails. Where the two paths disagree beyond rounding, no verdict: DFlashError (exit 1)."""
    dtype = str(target.dtype).removeprefix("torch.")
    partings = [_partings(target, p, r, baselines[i].tokens if i < len(baselines) else None, dtype, penalties,
                          proposals=proposals, max_new_tokens=max_new_tokens)
                for i, (p, r) in enumerate(zip(prompt_ids, runs))]
    real = [(i, x) for i, found in enumerate(partings) for x in found if not x.near_tie]
    ties = [(i, x) for i, found in enumerate(partings) for x in found if x.near_tie]
    _refuse_beyond_rounding(real)
    equal = sum(not found for found in partings)
    n = len(runs)
    if not real and not ties:
        msg = (f"speculative output is the target's greedy output on all {n} prompts (every token the "
               f"target's argmax after the tokens before it; identical to target-only decoding on the first "
               f"{len(baselines)})")
    elif not real:
        msg = (f"speculative output is the target's greedy output on {equal}/{n} prompts; the other {n - equal} "
               "part from it only at near-ties: " + " | ".join(
                   f"prompt {i + 1}, token {x.at + 1}: {x.describe()}" for i, x in ties[:3])
               + (f" (+{len(ties) - 3} more)" if len(ties) > 3 else ""))
    else:
        i, x = real[0]
        msg = (f"prompt {i + 1}: token {x.at + 1} of the speculative output is not the target's greedy choice "
               f"({x.describe()}; {equal}/{n} prompts equal)")
    if sampled_at is not None:
        msg += (f" (a greedy pass made for this check: the run itself samples at temperature {sampled_at}, whose "
                "outputs cannot be compared token by token)")
    checks.append(make_check("greedy_output_equal", not real, msg, value=f"{equal}/{n}",
                         threshold=f"{n}/{n}", level="end_to_end"))
    return [not found for found in partings]


def _refuse_beyond_rounding(partings: list[tuple[int, PathParting]], where: str = "") -> None:
    """No verdict where the target's two paths disagree by more than rounding at a parting: DFlashError (exit 1)."""
    beyond = next(((i, x) for i, x in partings if not x.near_tie and x.beyond_rounding), None)
    if beyond is not None:
        i, x = beyond
        raise DFlashError(f"cannot judge greedy_output_equal: at {where}prompt {i + 1}, token {x.at + 1}, "
                          f"{x.describe()}: the target's verify block and its one-token decode disagree by more than "
                          "rounding, so this runtime does not run this target exactly on this device and dtype (try "
                          "--dtype float32 or another --device)")


def _partings(target, prompt: list[int], run, baseline: list[int] | None, dtype: str, penalties=None, *,
              proposals: int, max_new_tokens: int) -> list[PathParting]:
    """Where the speculative generation `run` is not the target's greedy output, each with the two tokens' logits
    in the target's one-token decode and in its verify blocks (dflash_runtime.paths, the run's penalties applied as
    vLLM counts them). One teacher-forced target pass finds the suspects cheaply; a prompt with any (or whose
    target-only decoding `baseline` took another token) is recomputed both ways, and the one-token decode is the
    reference."""
    import torch
    from dflash_runtime.paths import one_token_partings, verify_logits

    tokens = run.tokens
    target.set_capture([])
    target.reset()
    ids = torch.tensor(prompt + tokens, dtype=torch.long)
    # the prompt's last row, then the output's rows in one block: logits for the N new tokens only (all P+N rows
    # of a long prompt are gigabytes of float32 logits at a large vocabulary); each kept only until its argmax
    first, _ = target.forward(ids[:len(prompt)], 0, last_logits_only=True)  # [1, V]
    rest = target.forward(ids[len(prompt):-1], len(prompt))[0] if len(tokens) > 1 else first[:0]  # [N-1, V]
    target.reset()
    suspects = _teacher_forced_suspects(first[-1:], rest, ids[:len(prompt)], ids[len(prompt):], penalties)
    del first, rest
    if not suspects and (baseline is None or baseline == tokens):
        return []
    # the one-token decode is the reference; of both paths only the rows where it parts from the output are kept
    greedy, one = one_token_partings(target, prompt, tokens, max_new_tokens=max_new_tokens,
                                     penalties=penalties)  # {k: [V]}
    found = sorted(one)
    if not found:
        if baseline is None or baseline == tokens:
            return []
        k = first_difference(tokens, baseline)  # the one-token decode agrees, target-only decoding did not
        return [PathParting(k, baseline[k] if k < len(baseline) else None, tokens[k] if k < len(tokens) else None,
                            dtype)]
    try:
        verify = verify_logits(target, prompt, tokens, run.accepted_per_step, proposals=proposals,
                               max_new_tokens=max_new_tokens, penalties=penalties, rows=found)  # [len(found), V]
    except ValueError:  # steps not recorded as the tokens need (a truncated run): judged without the verify path
        verify = None

    def at(j: int, k: int) -> PathParting:
        taken, other = greedy[k], tokens[k]
        both = {} if verify is None else dict(verify_taken=float(verify[j, taken]),
                                              verify_other=float(verify[j, other]))
        return PathParting(k, taken, other, dtype, float(one[k][taken]), float(one[k][other]), **both)

    return [at(j, k) for j, k in enumerate(found)]


SUSPECT_ROWS = 256  # teacher-forced rows penalized and argmaxed at a time: the penalties' int64 counts stay small


def _teacher_forced_suspects(first, rest, prompt, out, penalties) -> bool:
    """Whether any row of the teacher-forced block ([first; rest]: row k the logits for out[k], penalized as the
    loop penalizes them) takes another token than the output: SUSPECT_ROWS rows at a time, each row's values
    those of the whole block penalized at once (penalize works row by row)."""
    import torch
    from dflash_runtime.sampling import penalize

    tokens = out.tolist()
    for a in range(0, len(tokens), SUSPECT_ROWS):
        b = min(a + SUSPECT_ROWS, len(tokens))
        block = torch.cat([first, rest[:b - 1]]) if a == 0 else rest[a - 1:b - 1]  # [b - a, V]
        greedy = penalize(block, penalties, prompt, out, a).argmax(dim=-1).tolist()
        if any(t != g for t, g in zip(tokens[a:b], greedy)):
            return True
    return False


def _acceptance_checks(checks: list[Check], whole: DecodeStats, block: int, opts: ValidateOptions,
                       slots: int | None = None) -> None:
    """acceptance_length (a gate with --min-acceptance-length, else a warning when almost nothing is
    accepted) and position_rates (with --min-position-rates); `slots`: proposals per block (block - 1 unless
    the anchor's slot predicts)."""
    slots = block - 1 if slots is None else slots
    tau, num, rates = whole.tau, whole.num_drafts, _padded(whole.per_position_rates, slots)
    if opts.min_acceptance_length is not None:
        # compared as reported (4 decimals): a threshold equal to the tau a report showed passes
        checks.append(make_check("acceptance_length", round(tau, 4) >= opts.min_acceptance_length,
                             f"tau {tau:.3f} over {num} draft steps (block {block}); required "
                             f">= {opts.min_acceptance_length}", value=round(tau, 4),
                             threshold=opts.min_acceptance_length, level="end_to_end"))
    else:
        floor = auto_tau_floor(slots + 1)
        checks.append(make_check("acceptance_length", tau >= floor,
                             f"tau {tau:.3f} over {num} draft steps (block {block}); no --min-acceptance-length "
                             f"given" if tau >= floor else f"tau {tau:.3f} at block {block} (below {floor}, 1 + "
                             f"{AUTO_ACCEPTED_SHARE_WARN:.0%} of the {slots} draft slots): the draft accepts almost "
                             f"nothing; likely causes: {LOW_TAU_CAUSES}; `inspect` and `validate --engine` show "
                             "how an engine reads it; --min-acceptance-length makes this a failure",
                             value=round(tau, 4), threshold=floor, level="end_to_end", bad="warn"))
    wanted = opts.min_position_rates
    if wanted:
        low = [f"position {k + 1}: {rates[k]:.3f} < {m}" for k, m in enumerate(wanted)
               if k < len(rates) and rates[k] < m]
        extra = len(wanted) > len(rates)
        checks.append(make_check("position_rates", not low and not extra,
                             "; ".join(low) if low else (f"{len(wanted)} thresholds for {len(rates)} "
                             "draft positions" if extra else "every position meets its threshold"),
                             value=[round(r, 4) for r in rates], threshold=list(wanted), level="end_to_end"))


def _rounded(rates: list[float], n: int) -> list[float]:
    """Per-position rates over n positions (missing ones 0), rounded as reported."""
    return [round(r, 4) for r in _padded(rates, n)]


def _padded(rates: list[float], n: int) -> list[float]:
    return (list(rates) + [0.0] * n)[:n]


def _ratio(a: float, b: float) -> float:
    return a / b if b else 0.0


def _round_speedup(base_round, spec_round) -> float:
    return _ratio(DecodeStats.merge([g.stats for g in spec_round]).tokens_per_s,
                  DecodeStats.merge([g.stats for g in base_round]).tokens_per_s)


def _round_step_times(rounds) -> list[list[float]]:
    """Per timing round: [draft step s, verify step s, target-only step s] (the cost model's inputs)."""
    out = []
    for base_round, spec_round in rounds:
        spec = DecodeStats.merge([g.stats for g in spec_round])
        base = DecodeStats.merge([g.stats for g in base_round])
        if spec.num_drafts and base.tokens_per_s > 0:
            out.append([spec.draft_time_s / spec.num_drafts, spec.verify_time_s / spec.num_drafts,
                        1.0 / base.tokens_per_s])
    return out


def _tps_range(rounds) -> list[float]:
    per_round = [DecodeStats.merge([g.stats for g in r]).tokens_per_s for r in rounds]
    return [min(per_round), max(per_round)]


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def machine_load() -> tuple[float | None, bool]:
    """(1-minute load average, whether it makes timings unreliable on the usable cores)."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None, False
    return load, load > BUSY_LOAD * usable_cores()


def _speedup_check(speedup: float, per_round: list[float], spec_tps: float, base_tps: float, prompts: int,
                   rounds: int, min_speedup: float | None) -> Check:
    """Speedup of the timed runs: a gate only with --min-speedup; a warning when the machine is busy."""
    import torch

    load, busy = machine_load()
    threads = torch.get_num_threads()
    msg = (f"speedup {speedup:.2f}x ({spec_tps:.1f} vs {base_tps:.1f} tok/s over {rounds} interleaved round(s) of "
           f"{prompts} prompt(s); per round {min(per_round):.2f}x-{max(per_round):.2f}x; {threads} thread(s))")
    if busy:
        msg += (f"; load average {load:.1f} on {usable_cores()} core(s): other work competes for the CPU, "
                + UNRELIABLE_TIMING)
    if min_speedup is not None:
        return make_check("speedup", speedup >= min_speedup, msg + f"; required >= {min_speedup}",
                      value=round(speedup, 4), threshold=min_speedup, level="end_to_end")
    return make_check("speedup", not busy, msg + "; informational (no --min-speedup given)", value=round(speedup, 4),
                  level="end_to_end", bad="warn")


class VllmPenaltiesProcessor:
    """transformers' generate with vLLM's penalties (a logits processor: input_ids [1, P+O] -> scores [1, V]):
    the prompt's first `prompt_len` ids count for repetition only, as the runtime counts them."""

    def __init__(self, penalties, prompt_len: int):
        self.penalties, self.prompt_len = penalties, prompt_len

    def __call__(self, input_ids, scores):
        from dflash_runtime.sampling import penalize

        ids = input_ids[0]
        out = ids[self.prompt_len:]
        return penalize(scores, self.penalties, ids[:self.prompt_len], out, out.numel()).to(scores.dtype)


@contextlib.contextmanager
def no_library_bar():
    """transformers' own weight-loading bar off (its public switch, restored after): it would draw a second
    bar inside the command's progress line, and print its frames into logs."""
    from transformers.utils import logging as transformers_logging

    was = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            transformers_logging.enable_progress_bar()
