"""`validate`: static, numeric and end-to-end checks of a draft, as many levels as the inputs allow.

- static: `static.checkpoint_checks` (headers, config, small int tensors) and, with a target config,
  `static.target_checks` (shapes on the meta device: no weights read).
- numeric (draft only): the draft runs on synthetic context features with every attention backend
  that serves it on the device (or the one asked for): outputs finite, backends agree with `eager`
  within the dtype's tolerance, each layer causal or not as declared (perturb the last block slot:
  earlier slots must not move in a causal layer, must move in a non-causal one). Also the value
  scan: NaN/Inf, all-zero and constant tensors.
- end to end (target weights): speculative decoding on prompts; greedy output must equal the
  target's own greedy output; tau, per-position rates and speedup measured against thresholds.
- engine (--engine vllm with --engine-python, --engine transformers): the pair in the real engine (engine/).
- endpoint (--endpoint): a live server measured (endpoint/).

Before anything is loaded a memory plan (`memory.plan`) says whether draft and target fit at the run's
dtype (by default each checkpoint's own) and refuses the run in one line when they do not. A failed
static level skips the expensive levels unless `keep_going`. `progress` receives one status line per
level and phase (the CLI prints them on stderr).

Each level is a function of what the run prepared (`prepare.Prepared`: the checkpoint, the options, the target,
the prompts, read before any slow work) and adds to what the run found (`Found`); `validate` calls them in order.
The levels' own code is in static.py, numeric.py, end_to_end.py, engine/ and endpoint/.
"""


from __future__ import annotations

import contextlib
import json
import platform
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from dflash_convert import __version__
from dflash_convert.errors import DFlashError
from dflash_convert.format import engine_views, engines, serving
from dflash_convert.io.checkpoint import Checkpoint, open_checkpoint
from dflash_convert.io.reading import read_json
from dflash_convert.validate import memory
from dflash_convert.validate.static import (Check, make_check, checkpoint_checks, duplicate_tensors_check, scan_checks,
                                            target_checks, verifier_against)
from dflash_convert.validate.end_to_end import Placement, end_to_end, machine_load, usable_cores
from dflash_convert.validate.numeric import CONTEXT_TOKENS, numeric_checks
from dflash_convert.validate.options import LEVELS, ValidateOptions
from dflash_convert.validate import sweep
from dflash_convert.validate.engine.level import transformers_level, vllm_level
from dflash_convert.validate.compare import compare_to_source
from dflash_convert.validate.quantized_checks import activation_caveat
from dflash_convert.validate.baseline import load_baseline, prompt_ids_sha256
from dflash_convert.validate.baseline import compare as compare_baseline
from dflash_convert.validate.prepare import Prepared, answer_earlier_turns, checked_categories, prepare, target_name
from dflash_convert.validate.prompts import BUILTIN_TEXT_PROMPTS, read_prompts
from dflash_convert.validate.report import (AcceptanceStats, EngineStats, Environment, SliceAcceptance,
                                            ValidationReport)

TINY_MODEL_BYTES = 256 << 20  # below this (target + draft) one CPU thread is fastest: no hand-offs per small op
EXPENSIVE = ("numeric", "end_to_end")


@dataclass
class Resources:
    """Where the runtime levels run, resolved when they start: the device, each model's dtype (its name and
    torch's), and the CPU threads."""

    device: str
    draft_dtype_name: str
    draft_dtype: Any = None
    target_dtype_name: str | None = None
    target_dtype: Any = None
    threads: int | None = None

    @property
    def target_load_dtype(self) -> Any:
        """The torch dtype the target loads in: its own, else the draft's."""
        return self.target_dtype or self.draft_dtype


@dataclass
class KRun:
    """One end-to-end run at one K (block): its figures, our speculative outputs, and vLLM's run of the same K
    (--engine-python; None until served)."""

    stats: AcceptanceStats
    outputs: list[list[int]]
    served: EngineStats | None = None


@dataclass
class Found:
    """What the levels found so far, and the levels still to run."""

    wanted: list[str]  # the levels still to run: those asked for, less those skipped
    resources: Resources
    checks: list[Check] = field(default_factory=list)
    levels_run: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # level -> why it did not run
    backends: dict[str, bool] = field(default_factory=dict)  # attention backend -> serves this draft here
    draft_backend: str | None = None
    loaded_draft: Any = None  # the draft the numeric level loaded, reused end to end
    per_k: list[KRun] = field(default_factory=list)  # one end-to-end run per K; the first is the run's
    engine_run: EngineStats | None = None  # the first K's, run by the engine
    batch_times: list[Any] = field(default_factory=list)  # batch_costs.BatchTimes per --concurrency other than 1
    incomplete: str | None = None  # why the run stopped before its levels did (Ctrl-C)

    def skip(self, levels, why: str) -> None:
        for lv in levels:
            if lv in self.wanted:
                self.skipped[lv] = why
        self.wanted = [lv for lv in self.wanted if lv not in self.skipped]

    @property
    def stats(self) -> AcceptanceStats | None:
        """The first K's end-to-end figures: the report's acceptance."""
        return self.per_k[0].stats if self.per_k else None


def _end_to_end_runs(prep: Prepared, found: Found) -> bool:
    return "end_to_end" in found.wanted and prep.target_has_weights


def validate(checkpoint_path: str | Path | None, opts: ValidateOptions | None = None, *,
             progress: Callable[[str], None] | None = None, report_interrupted: bool = False) -> ValidationReport:
    """Run every level the inputs allow (or those in `opts.levels`) and report which ran and why others
    did not. Raises UsageError for options out of range and DFlashError, before loading anything, when
    the memory plan says the run does not fit.

    `opts.engine` (vllm, sglang, zlab): run the draft as that engine would serve it (its ids order, per-layer
    causality, block size, vocabulary handling) and fail `engine_fidelity` where it differs from training;
    that failure does not skip the runtime levels, whose acceptance is then what the deployment gets.
    dtype "auto" loads each checkpoint in its own dtype (its config's `dtype`/`torch_dtype`, else the
    dtype its weights are stored in). `report_interrupted` (the validate command): a Ctrl-C returns the report
    of what was measured, `incomplete` set; otherwise (convert --validate, library callers) it propagates."""
    t0 = time.perf_counter()
    opts = opts or ValidateOptions()
    opts.check()
    if opts.compare_thinking:
        return _compare_thinking(checkpoint_path, opts, progress, report_interrupted)
    if checkpoint_path is None:
        return _endpoint_only(opts, progress or (lambda message: None), t0)
    if opts.endpoint is not None and opts.engine is None and opts.target is not None:
        opts = _endpoint_engine(opts)
    duplicates = duplicate_tensors_check(checkpoint_path)
    if duplicates.failed:  # the checkpoint cannot be opened: report the one problem found
        return ValidationReport(
            tool_version=__version__, checkpoint=str(checkpoint_path), checkpoint_revision=opts.checkpoint_revision,
            target=target_name(opts), target_revision=opts.target_revision, levels_run=["static"],
            levels_skipped={lv: "the checkpoint stores a tensor twice" for lv in LEVELS[1:]}, checks=[duplicates],
            environment=_environment(opts),
            options=opts.model_dump(mode="json"), duration_s=round(time.perf_counter() - t0, 3), passed=False)
    ckpt = open_checkpoint(checkpoint_path, allow_pickle=opts.allow_pickle, block_size=opts.block_size)
    prep = Prepared(checkpoint_path, opts, progress or (lambda message: None), progress is None, ckpt, ckpt)
    found = Found(list(opts.levels), Resources(device=opts.device, draft_dtype_name=opts.dtype))
    try:
        _run_levels(prep, found, duplicates)
    except KeyboardInterrupt as exc:  # Ctrl-C: the report of what was measured, marked incomplete
        if not report_interrupted:
            raise
        found.checks += getattr(exc, "checks", [])
        found.incomplete = "interrupted (Ctrl-C)"
        for lv in found.wanted:
            if lv not in found.levels_run:
                found.skipped[lv] = found.incomplete
    report = _report(prep, found, t0)
    if opts.endpoint is not None and found.incomplete is None:
        _endpoint_level(prep, found, report)
    if prep.baseline is not None:
        _baseline_gate(prep, report)
    if opts.compare_to is not None:
        compare_to_source(report, opts, validate, progress)
    return report


THINKING_MODES = (("thinking on", True), ("thinking off", False))  # --compare-thinking, in the order run


def _compare_thinking(path, opts: ValidateOptions, progress, report_interrupted: bool) -> ValidationReport:
    """--compare-thinking: the run with enable_thinking true (every level asked for), then its end-to-end (and
    endpoint) measurement again with enable_thinking false; the first report, with tau per mode side by side
    and the second run's checks named `(thinking off)`."""
    from dflash_convert.validate.breakdown import mode_slice

    say = progress or (lambda message: None)
    runs = []
    for i, (label, on) in enumerate(THINKING_MODES):
        say(f"--compare-thinking: {label} (enable_thinking {str(on).lower()})")
        levels = opts.levels if i == 0 else [lv for lv in opts.levels if lv == "end_to_end"] or opts.levels
        runs.append(validate(path, opts.model_copy(update={
            "compare_thinking": False, "levels": levels,
            "chat_template_kwargs": (opts.chat_template_kwargs or {}) | {"enable_thinking": on}}),
            progress=progress, report_interrupted=report_interrupted))
        if runs[-1].incomplete:
            break
    report = runs[0]
    report.per_thinking_mode = [SliceAcceptance(**s) for s in (mode_slice(label, r) for (label, _), r in
                                                              zip(THINKING_MODES, runs)) if s]
    if len(runs) == 2:
        off = runs[1]
        report.checks += [c.model_copy(update={"name": f"{c.name} (thinking off)"}) for c in off.checks
                          if c.level == "end_to_end"]
        same = [r.acceptance.prompt_ids_sha256 for r in runs if r.acceptance is not None]
        if len(same) == 2 and same[0] == same[1]:
            report.checks.append(make_check(
                "compare_thinking", False, "the chat template renders every prompt the same with enable_thinking "
                "true and false (it has no such switch, or the prompts are token ids): the two modes are one run",
                level="end_to_end", bad="warn"))
        report.incomplete = off.incomplete
        if report.speculation_profile is not None and off.speculation_profile is not None:
            # --profile-out: the thinking-off profiles beside the thinking-on ones, each naming its mode
            off_main = {k: v for k, v in off.speculation_profile.items() if k != "profiles"}
            report.speculation_profile["profiles"] += [off_main, *off.speculation_profile.get("profiles", [])]
    report.options = opts.model_dump(mode="json")
    report.passed = report.incomplete is None and not any(c.status == "fail" for c in report.checks)
    return report


def _report(prep: Prepared, found: Found, t0: float) -> ValidationReport:
    """The report of what the levels found (the endpoint level and --baseline's gate are added after)."""
    opts = prep.opts
    for lv in LEVELS:
        if lv not in found.levels_run and lv not in found.skipped:
            found.skipped[lv] = "not requested"
    if opts.require_end_to_end and "end_to_end" not in found.levels_run:
        found.checks.append(make_check("end_to_end_ran", False, "--require-end-to-end: the end-to-end level did "
                                       f"not run ({found.skipped['end_to_end']})", level="end_to_end"))
    if found.stats is not None:
        found.stats.prompt_ids_sha256 = prompt_ids_sha256(prep.prompts.ids)
    per_k = [kr.stats for kr in found.per_k]
    report = ValidationReport(
        tool_version=__version__, checkpoint=str(prep.path), checkpoint_format=prep.given.format,
        checkpoint_revision=opts.checkpoint_revision, target=target_name(opts), target_revision=opts.target_revision,
        levels_run=found.levels_run, levels_skipped=found.skipped, checks=found.checks, acceptance=found.stats,
        engine_run=found.engine_run,
        per_num_speculative_tokens=[r for r in (sweep.k_run(kr.stats, kr.served, found.batch_times)
                                                for kr in found.per_k) if r],
        recommendation=sweep.recommendations(per_k, sweep.device_name(found.resources.device), found.batch_times)
        if per_k else [],
        speculation_profile=_profile(prep, found),
        environment=_environment(opts, found), options=opts.model_dump(mode="json"), incomplete=found.incomplete,
        duration_s=round(time.perf_counter() - t0, 3),
        passed=found.incomplete is None and not any(c.status == "fail" for c in found.checks))
    if opts.predict_gpu:
        _gpu_prediction(prep, report)
    return report


def _gpu_prediction(prep: Prepared, report: ValidationReport) -> None:
    """--predict-gpu: the cost model's prediction from this run's tau per K (a warning where none was measured)."""
    from dflash_convert.io.reading import read_json
    from dflash_convert.validate.gpu_prediction import gpu_prediction

    target = prep.target
    report.prediction, skipped = gpu_prediction(
        report, prep.opts, target.config if target else None, read_json(target.config) if target else None,
        prep.ckpt.raw_config, str(prep.ckpt.config_file))
    if skipped is not None:
        report.checks.append(skipped)


def _profile(prep: Prepared, found: Found) -> dict[str, Any] | None:
    """The measured acceptance as a speculation_profile.json (validate/profile.py), under the conditions it ran."""
    from dflash_convert.validate.profile import run_profiles

    opts = prep.opts
    given = opts.prompts
    dataset = (str(given) if isinstance(given, (str, Path)) else "prompts given by the caller" if given
               else "built-in prompts" if not opts.prompt_sets else "")
    dataset = " + ".join(filter(None, [dataset, *(f"{s.name} ({s.source})" for s in opts.prompt_sets)]))
    engine = "dflash_runtime (PyTorch)" + (f", the draft as {opts.engine} serves it" if opts.engine else "")
    parts = [p for p in str(prep.path).replace("\\", "/").split("/") if p]
    kwargs = opts.chat_template_kwargs if prep.template_skipped is None else None  # only what rendered the prompts
    return run_profiles([kr.stats for kr in found.per_k], method=prep.ckpt.spec.variant, draft="/".join(parts[-2:]),
                        target=target_name(opts), engine=engine, dataset=dataset, template_kwargs=kwargs)


def _run_levels(prep: Prepared, found: Found, duplicates: Check) -> None:
    prepare(prep)
    if "static" in found.wanted:
        _static_level(prep, found, duplicates)
    if prep.view is not None:
        _engine_fidelity(prep, found)
    needs_torch = "numeric" in found.wanted or _end_to_end_runs(prep, found)
    with _resources(prep, found) if needs_torch else contextlib.nullcontext():
        if "numeric" in found.wanted:
            _numeric_level(prep, found)
        if "end_to_end" in found.wanted:
            _end_to_end_level(prep, found)


def _endpoint_categories(opts: ValidateOptions) -> list[str | None]:
    """Each prompt's category (a JSONL `category` of the prompts file), in the order _endpoint_prompts sends them."""
    categories: list[str | None] = []
    if isinstance(opts.prompts, (str, Path)):
        read_prompts(opts.prompts, categories)
    return checked_categories(opts, categories, len(_endpoint_prompts(opts)))  # a category gate names one carried


def _endpoint_prompts(opts: ValidateOptions) -> list[tuple[str | None, Any]]:
    """(set name or None, prompt) of every prompt the endpoint is sent, as given (the server tokenizes)."""
    given = read_prompts(opts.prompts) if isinstance(opts.prompts, (str, Path)) else opts.prompts
    if given is None and not opts.prompt_sets:
        given = list(BUILTIN_TEXT_PROMPTS)
    return [(None, p) for p in given or []] + [(s.name, p) for s in opts.prompt_sets for p in s.prompts]


def _endpoint_engine(opts: ValidateOptions) -> ValidateOptions:
    """The options with --engine set to the engine the endpoint is (its /v1/models says), so that the offline
    levels emulate it and count as it counts; unchanged for a server that does not say."""
    from dflash_convert.validate.endpoint.client import Deadline, Endpoint, served_model

    endpoint = Endpoint(opts.endpoint, key_variable=opts.endpoint_key_env, deadline=Deadline(opts.endpoint_timeout))
    try:
        _, engine = served_model(endpoint, opts.endpoint_model)
    finally:
        endpoint.close()
    return opts.model_copy(update={"engine": engine}) if engine in engines.ENGINE_NAMES else opts


def _endpoint_level(prep: Prepared, found: Found, report: ValidationReport) -> None:
    """--endpoint with a checkpoint: the live server measured, beside the offline emulation where it ran."""
    from dflash_convert.validate.endpoint.level import endpoint_level

    offline = found.stats.vllm_counting if found.stats is not None else None
    steps = found.stats.vllm_steps if found.stats is not None else None
    long = prep.prompts.long if found.stats is not None else None  # the windows the runtime decoded
    checks, report.endpoint = endpoint_level(prep.opts, _endpoint_prompts(prep.opts), say=prep.say, offline=offline,
                                             offline_steps=steps, categories=_endpoint_categories(prep.opts),
                                             long=long)
    report.checks += checks
    report.passed = not any(c.status == "fail" for c in report.checks)


def _endpoint_only(opts: ValidateOptions, say: Callable[[str], None], t0: float) -> ValidationReport:
    """--endpoint without a checkpoint: the served figures only, no verdict on the draft's fidelity."""
    from dflash_convert.errors import UsageError
    from dflash_convert.validate.endpoint.level import endpoint_level

    if opts.endpoint is None:
        raise UsageError("give a CHECKPOINT, or --endpoint URL to measure a live server")
    baseline = load_baseline(opts.baseline) if opts.baseline is not None else None
    checks, stats = endpoint_level(opts, _endpoint_prompts(opts), say=say, categories=_endpoint_categories(opts))
    report = ValidationReport(
        tool_version=__version__, checkpoint=None, target=target_name(opts), levels_run=["end_to_end"],
        levels_skipped={lv: "no checkpoint given (--endpoint alone)" for lv in LEVELS[:-1]}, checks=checks,
        endpoint=stats, environment=_environment(opts), options=opts.model_dump(mode="json"),
        duration_s=round(time.perf_counter() - t0, 3), passed=not any(c.status == "fail" for c in checks))
    if baseline is not None:
        check, report.baseline = compare_baseline(baseline, opts.baseline, report, opts.max_regression)
        report.checks.append(check)
        report.passed = not any(c.status == "fail" for c in report.checks)
    return report


def _baseline_gate(prep: Prepared, report: ValidationReport) -> None:
    """--baseline: the regression check of this run's figures against the earlier report's."""
    opts = prep.opts
    if report.acceptance is None and report.endpoint is None:
        check = make_check("regression", None, f"no end-to-end figures in this run to compare with {opts.baseline}",
                           level="end_to_end")
    else:
        check, report.baseline = compare_baseline(prep.baseline, opts.baseline, report, opts.max_regression)
    report.checks.append(check)
    report.passed = report.incomplete is None and not any(c.status == "fail" for c in report.checks)


def _recorded_target(spec) -> str:
    """The target the draft's config names, suggested when it is a directory at hand (else only named)."""
    named = spec.verifier.name_or_path if spec.verifier is not None else None
    if not named:
        return ""
    if (Path(named) / "config.json").is_file():
        return f"; the draft names {named}, found here: add --target {named}"
    return f"; the draft names {named}"


def _static_level(prep: Prepared, found: Found, duplicates: Check) -> None:
    target = prep.target
    prep.say("static: config, tensor headers" + (" and the target's config" if target is not None else ""))
    checks = [duplicates, *checkpoint_checks(prep.given, scan=False)]
    if target is not None:  # the target answers what the draft config alone could not
        answered = {"target_layer_ids_range", "mask_token_id_special"}
        checks = [c for c in checks if not (c.status == "skip" and c.name in answered)]
        checks += target_checks(prep.ckpt.spec, target.info, ckpt=prep.ckpt)
        named = verifier_against(prep.ckpt.spec, target_name(prep.opts), target.dir)
        checks = [named if c.name == "verifier" and named is not None else c for c in checks]
    checks += [c for c in (_causal_override_check(prep.ckpt, prep.opts.causal), prep.mask_check) if c is not None]
    checks.append(_trained_context(prep))
    found.checks += checks
    found.levels_run.append("static")
    failed = [c.name for c in checks if c.status == "fail"]
    prep.say(f"static: {len(checks)} checks, " + (f"failed: {', '.join(failed)}" if failed else "none failed"))
    if failed and not prep.opts.keep_going:
        found.skip(EXPENSIVE, f"static checks failed ({', '.join(failed)}); --keep-going runs it anyway")


def _trained_context(prep: Prepared) -> Check:
    """The draft's trained positions, window and layer types against the target's and the served context."""
    from dflash_convert.validate.trained_context import target_positions, trained_context_check

    positions, _ = target_positions(read_json(prep.target.config)) if prep.target is not None else (None, "")
    return trained_context_check(prep.given.spec, engine_views.checkpoint_views(prep.given),
                                 target_positions=positions,
                                 max_model_len=prep.opts.max_model_len, context_lengths=prep.opts.context_lengths)


def _measured_past(found: Found) -> None:
    """The trained_context check, told what the measured context-length curve shows past the trained positions."""
    from dflash_convert.validate.breakdown import past_sentence, trained_positions

    trained, stats = trained_positions(found), found.stats
    check = next((c for c in found.checks if c.name == "trained_context"), None)
    if check is not None and trained and stats is not None and stats.per_context_length:
        check.message += "; measured:" + past_sentence(stats, trained).removeprefix(" ")


def _engine_fidelity(prep: Prepared, found: Found) -> None:
    found.checks.append(_engine_fidelity_check(prep.view))
    if not prep.view.loads:
        found.skip(EXPENSIVE, f"{engine_views.rules_label(prep.view)}, would not load this checkpoint "
                              "(engine_fidelity)")


@contextlib.contextmanager
def _resources(prep: Prepared, found: Found) -> Iterator[None]:
    """Device, dtypes, the memory plan (before anything is loaded) and CPU threads for the runtime
    levels; the caller's thread count is restored on exit."""
    import torch

    from dflash_runtime.device import resolve_device, resolve_dtype

    opts, res = prep.opts, found.resources
    dev = resolve_device(opts.device)
    res.device = str(dev)
    res.draft_dtype = resolve_dtype(opts.dtype if opts.dtype != "auto" else
                                    _own_dtype({"dtype": prep.ckpt.spec.dtype}, prep.ckpt.tensors))
    res.draft_dtype_name = str(res.draft_dtype).removeprefix("torch.")
    if _end_to_end_runs(prep, found):
        res.target_dtype = resolve_dtype(opts.dtype if opts.dtype != "auto" else _own_dtype(
            read_json(prep.target.config), memory.weight_headers(prep.target.dir)))
        res.target_dtype_name = str(res.target_dtype).removeprefix("torch.")
    plan = _memory_plan(prep, found)
    if not plan.fits:
        raise DFlashError(plan.refusal())
    prep.say(f"memory plan: {plan.describe()}")
    previous = torch.get_num_threads()
    if dev.type == "cpu":
        tiny = plan.draft_bytes + plan.target_bytes < TINY_MODEL_BYTES
        res.threads = opts.threads or (1 if tiny else previous)
        torch.set_num_threads(res.threads)
        prep.say(f"CPU threads: {res.threads}" + ("" if opts.threads else " (tiny models run fastest on one)"
                                                  if tiny else " (torch's default)"))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _memory_plan(prep: Prepared, found: Found) -> memory.MemoryPlan:
    opts, spec, e2e, res = prep.opts, prep.ckpt.spec, _end_to_end_runs(prep, found), found.resources
    draft_tensors = memory.draft_tensors(prep.ckpt)  # quantized: as dequantized
    block = max(prep.blocks)
    ids = prep.prompts.ids if prep.prompts is not None else None
    sequence = max([*map(len, ids or [[0] * CONTEXT_TOKENS]), *(opts.context_lengths or [])]) + opts.max_new_tokens + block
    sequence += opts.max_new_tokens if prep.chats else 0  # an earlier turn's answer joins the prompt
    return memory.plan(draft_tensors, res.draft_dtype_name, device=res.device,
                       target_dir=prep.target.dir if e2e else None, target_dtype=res.target_dtype_name,
                       draft_layers=spec.num_layers, draft_kv_width=spec.num_kv_heads * spec.head_dim,
                       sequence=sequence, block=block, device_map=opts.placed_by_device_map if e2e else None,
                       max_memory=opts.max_memory, attention=opts.target_backend,
                       # a prefill keeps its last row of logits, a verify its block, the greedy check its new tokens
                       logit_rows=max(opts.max_new_tokens, block))


def _numeric_level(prep: Prepared, found: Found) -> None:
    prep.say("numeric: value scan")
    found.checks += scan_checks(prep.ckpt)
    opts, res = prep.opts, found.resources
    numeric, found.backends, found.loaded_draft = numeric_checks(
        prep.ckpt, device=res.device, dtype=res.draft_dtype, backend=opts.backend, causal=opts.causal,
        block_size=prep.block, seed=opts.seed, progress=prep.say, draft_options=prep.draft_options)
    found.draft_backend = found.loaded_draft.backend if found.loaded_draft is not None else None
    found.checks += numeric
    found.levels_run.append("numeric")
    failed = [c.name for c in numeric if c.status == "fail"]
    prep.say("numeric: " + (f"failed: {', '.join(failed)}" if failed else "none failed"))


def _end_to_end_level(prep: Prepared, found: Found) -> None:
    if prep.opts.target is None:
        found.skipped["end_to_end"] = "no --target given" + _recorded_target(prep.ckpt.spec)
    elif not prep.target_has_weights:
        found.skipped["end_to_end"] = f"target {prep.opts.target} has no weights (config only)"
    elif any(c.name in ("draft_loads", "backend") and c.status == "fail" for c in found.checks):
        found.skipped["end_to_end"] = "the draft cannot be loaded (see the numeric checks)"
    else:
        res = found.resources
        if prep.chats:
            answer_earlier_turns(prep, device=res.device, dtype=res.target_load_dtype)
        placement = Placement(device=res.device, dtype=res.draft_dtype, target_dtype=res.target_dtype,
                              draft_options=prep.draft_options, last_layer_post_norm=prep.last_layer_post_norm)
        checks, stats, outputs = end_to_end(
            prep.ckpt, prep.target.dir, prep.prompts, prep.opts, block=prep.block, sampling=prep.sampling,
            placement=placement, draft=found.loaded_draft, progress=prep.say, quiet=prep.quiet)
        found.checks += checks
        if prep.opts.chat_template_kwargs and prep.template_skipped:  # the user meant them to change the prompts
            found.checks.append(make_check(
                "chat_template_kwargs", False, f"--chat-template-kwargs "
                f"{json.dumps(prep.opts.chat_template_kwargs, sort_keys=True)} has no effect: {prep.template_skipped}",
                level="end_to_end", bad="warn"))
        found.levels_run.append("end_to_end")
        found.per_k = [KRun(stats, outputs)] if stats is not None else []
        _measured_past(found)
        for block in prep.blocks[1:] if found.per_k else ():
            _another_k(prep, found, placement, block)
        if found.per_k and set(prep.opts.concurrency) - {1}:
            _batch_costs(prep, found)
        if found.per_k and (prep.opts.engine_python is not None or prep.opts.engine == "transformers"):
            _engine_level(prep, found)


def _another_k(prep: Prepared, found: Found, placement: Placement, block: int) -> None:
    """One more end-to-end run at another K: its checks named with their K, its figures beside the first's."""
    k = block - (0 if serving.anchor_proposes(prep.ckpt.spec) else 1)
    prep.say(f"end to end: num_speculative_tokens {k} (block of {block})")
    checks, stats, outputs = end_to_end(
        prep.ckpt, prep.target.dir, prep.prompts, prep.opts, block=block, sampling=prep.sampling,
        placement=placement, draft=found.loaded_draft, progress=prep.say, quiet=prep.quiet)
    found.checks += _named_k(checks, k)
    if stats is not None:
        found.per_k.append(KRun(stats, outputs))


def _batch_costs(prep: Prepared, found: Found) -> None:
    """--concurrency: the target's verify and target-only steps timed at each batch size other than 1 (batch
    1 is the decode loop's), for every K run (batch_costs.py); a check says where they cannot be timed."""
    from dflash_runtime import load_target

    from dflash_convert.validate import batch_costs

    opts = prep.opts
    batches = sorted(set(opts.concurrency) - {1})
    prep.say(f"end to end: step costs at batch {', '.join(map(str, batches))} ({opts.timing_rounds} round(s))")
    target = load_target(prep.target.dir, device=found.resources.device, dtype=found.resources.target_load_dtype,
                         attn_implementation=opts.target_backend, device_map=opts.placed_by_device_map,
                         max_memory=opts.max_memory)
    why = batch_costs.cannot_batch(target)
    if why is None:
        found.batch_times = batch_costs.time_batches(target, prep.prompts.ids[0], batches,
                                                     [len(kr.stats.per_position_rates) + 1 for kr in found.per_k],
                                                     opts.timing_rounds)
    found.checks.append(make_check(
        "batch_costs", why is None, f"verify and target-only steps timed at batch {', '.join(map(str, batches))}"
        if why is None else f"--concurrency {','.join(map(str, batches))}: the target's batched steps cannot be "
        f"timed ({why}); the recommendation is batch 1's only", level="end_to_end", bad="warn"))
    del target


def _named_k(checks: list[Check], k: int) -> list[Check]:
    """The checks of a K after the first, named with their K (the first K's keep their names)."""
    return [c.model_copy(update={"name": f"{c.name} (K={k})"}) for c in checks]


def _engine_level(prep: Prepared, found: Found) -> None:
    """The pair in the real engine (engine/level.py): vLLM (--engine-python), every K against its emulation; or
    transformers' own generate (--engine transformers). Where it cannot run here, the level is skipped, saying why."""
    res = found.resources
    if prep.opts.engine_python is not None:
        checks, runs, why = vllm_level(prep, [(kr.stats, kr.outputs) for kr in found.per_k],
                                       emulated_dtypes=[d for d in (res.draft_dtype_name, res.target_dtype_name) if d],
                                       device=res.device, target_dtype=res.target_load_dtype)
        for i, (kr, k_checks, k_run) in enumerate(zip(found.per_k, checks, runs)):
            k_checks = activation_caveat(prep.ckpt, k_checks)  # a W8A8 draft: the runtime's activations are float
            found.checks += k_checks if i == 0 else _named_k(k_checks, len(kr.stats.per_position_rates))
            kr.served = k_run
        if why is not None:
            found.skipped["served"] = why
        else:
            found.engine_run = found.per_k[0].served
            fidelity = next((c for c in found.checks if c.name == "engine_fidelity"), None)
            if fidelity is not None:  # the rules applied are one version's; the engine that ran may be another
                fidelity.message += f" (vLLM {found.engine_run.version} ran the pair below)"
    elif prep.opts.engine == "transformers":  # --engine-python is --engine vllm only
        checks, found.engine_run, why = transformers_level(prep, draft=found.loaded_draft, dtype=res.draft_dtype,
                                                           target_dtype=res.target_load_dtype)
        found.checks += checks
        if why is not None:
            found.skipped["served"] = why


# ----------------------------------------------------------------------------- the command

def _environment(opts: ValidateOptions, found: Found | None = None) -> Environment:
    versions: dict[str, str | None] = {"python": platform.python_version(), "dflash_convert": __version__}
    for mod in ("torch", "transformers", "numpy"):
        m = sys.modules.get(mod)
        versions[mod] = getattr(m, "__version__", None) if m is not None else None
    torch = sys.modules.get("torch")
    load, _ = machine_load()
    res = found.resources if found else None
    threads = (res.threads if res else None) or (torch.get_num_threads() if torch is not None else None)
    return Environment(versions=versions, platform=platform.platform(), device=res.device if res else opts.device,
                       dtype=res.draft_dtype_name if res else opts.dtype,
                       target_dtype=res.target_dtype_name if res else None,
                       device_map=opts.placed_by_device_map, draft_sampling=opts.draft_sampling,
                       backends=found.backends if found else {}, draft_backend=found.draft_backend if found else None,
                       target_backend=opts.target_backend if found and "end_to_end" in found.levels_run else None,
                       causal_override=opts.causal, threads=threads, cores=usable_cores(),
                       load_average=round(load, 2) if load is not None else None)


def _causal_override_check(ckpt: Checkpoint, causal: bool | None) -> Check | None:
    if causal is None:
        return None
    declared = list(ckpt.spec.layer_causal)
    differ = [i for i, c in enumerate(declared) if c != causal]
    mode = "causal" if causal else "non-causal"
    return make_check("causal_override", not differ,
                  f"run forced {mode}; layers {differ} were trained " + ("non-causal" if causal else "causal") +
                  ": a deployment forcing this mode runs the draft unlike its training" if differ else
                  f"run forced {mode}, as every layer declares", value=mode, threshold=declared, level="static")


def _own_dtype(raw_config: dict, tensors) -> str:
    """A checkpoint's own dtype: its config's, else the one its floating weights are stored in, else float32."""
    return memory.config_dtype(raw_config) or memory.stored_dtype(tensors) or "float32"


def _engine_fidelity_check(view) -> Check:
    errors = [d for d in view.divergences if d.severity == "error"]
    warns = [d for d in view.divergences if d.severity == "warning"]
    shown = errors or warns
    message = (f"{engine_views.rules_label(view)}: " + ("; ".join(f"{d.field}: {d.consequence} (fix: {d.fix})"
                                                          for d in shown) if shown else "serves the draft as trained"))
    return Check(name="engine_fidelity", status="fail" if errors or not view.loads else "warn" if warns else "pass",
                 value=view.engine, threshold="as trained", message=message, level="static")


def validate_output_dir(path: str | Path, progress: Callable[[str], None] | None = None) -> ValidationReport:
    """Static + numeric validation of a freshly converted checkpoint (convert --validate, before the rename)."""
    return validate(path, ValidateOptions(levels=["static", "numeric"]), progress=progress)
