"""`validate`: static, numeric and end-to-end checks of a draft, as many levels as the inputs allow.

- static: `checks.checkpoint_checks` (headers, config, small int tensors) and, with a target config,
  `checks.target_checks` (shapes on the meta device: no weights read).
- numeric (draft only): the draft runs on synthetic context features with every attention backend
  that serves it on the device (or the one asked for): outputs finite, backends agree with `eager`
  within the dtype's tolerance, each layer causal or not as declared (perturb the last block slot:
  earlier slots must not move in a causal layer, must move in a non-causal one). Also the value
  scan: NaN/Inf, all-zero and constant tensors.
- end to end (target weights): speculative decoding on prompts; greedy output must equal the
  target's own greedy output; tau, per-position rates and speedup measured against thresholds.

Before anything is loaded a memory plan (`memory.plan`) says whether draft and target fit at the run's
dtype (by default each checkpoint's own) and refuses the run in one line when they do not. A failed
static level skips the expensive levels unless `keep_going`. `progress` receives one status line per
level and phase (the CLI prints them on stderr).

Each level is a function of the run so far (`Run`: the checkpoint, the options, what earlier levels
found); `validate` calls them in order. The levels' own code is in numeric.py and end_to_end.py.
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
from dflash_convert.format import catalogue, engine_views, engines, mapping, quantization, serving
from dflash_convert.io.checkpoint import Checkpoint, open_checkpoint
from dflash_convert.io.reading import read_json
from dflash_convert.validate import memory
from dflash_convert.validate.checks import (Check, make_check, checkpoint_checks, duplicate_tensors_check, scan_checks,
                                            target_checks, verifier_against)
from dflash_convert.validate.end_to_end import Placement, Prompts, end_to_end, machine_load, usable_cores
from dflash_convert.validate.numeric import CONTEXT_TOKENS, numeric_checks
from dflash_convert.validate.options import LEVELS, ValidateOptions
from dflash_convert.validate import served, sweep
from dflash_convert.validate.histogram import request_histogram
from dflash_convert.validate.turns import answer_turns
from dflash_convert.validate.baseline import SAMPLING_KEYS, check_same_settings, load_baseline, prompt_ids_sha256
from dflash_convert.validate.baseline import compare as compare_baseline
from dflash_convert.validate.prompts import (BUILTIN_TEXT_PROMPTS, chat_template, load_tokenizer, pending_turn,
                                             read_prompts, tokenize_prompts)
from dflash_convert.validate.compare import compare_to_source
from dflash_convert.validate.quantized_checks import activation_caveat
from dflash_convert.validate.report import AcceptanceStats, EngineStats, Environment, SamplingUsed, ValidationReport
from dflash_convert.validate.sampling import (generation_config, resolve_sampling, runtime_sampling,
                                              stop_token_ids)

TINY_MODEL_BYTES = 256 << 20  # below this (target + draft) one CPU thread is fastest: no hand-offs per small op
EXPENSIVE = ("numeric", "end_to_end")


@dataclass
class Run:
    """One validation run: what it was given and what its levels found so far."""

    path: str | Path
    opts: ValidateOptions
    say: Callable[[str], None]
    quiet: bool  # no progress wanted: transformers' own loading bar stays off too
    ckpt: Checkpoint  # as run: the engine's reading of it under --engine
    trained: Checkpoint  # as given
    wanted: list[str]
    target_dir: Path | None = None
    target_config: Path | None = None
    target_has_weights: bool = False
    info: mapping.TargetInfo | None = None
    view: Any = None  # engine_views.EngineView under --engine
    draft_options: dict[str, Any] = field(default_factory=dict)  # how load_draft runs the draft as served
    mask_check: Check | None = None
    prompt_ids: list[list[int]] | None = None
    prompt_sets: list[tuple[str, str, int, int]] = field(default_factory=list)  # (name, source, first, end) of prompt_ids
    prompt_format: str | None = None
    sampling: SamplingUsed | None = None
    checks: list[Check] = field(default_factory=list)
    run: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)
    backends: dict[str, bool] = field(default_factory=dict)
    draft_backend: str | None = None
    loaded: Any = None  # the draft the numeric level loaded, reused end to end
    device: str = "auto"
    dtype_name: str = "auto"
    torch_dtype: Any = None
    target_dtype_name: str | None = None
    target_torch_dtype: Any = None
    threads: int | None = None
    stats: AcceptanceStats | None = None
    blocks: list[int | None] = field(default_factory=lambda: [None])  # one end-to-end run per block (per K)
    per_k: list[AcceptanceStats] = field(default_factory=list)  # every K's run, the first is `stats`
    outputs: list[list[int]] = field(default_factory=list)  # our speculative outputs, end to end
    per_k_outputs: list[list[list[int]]] = field(default_factory=list)  # each K's (per_k's) speculative outputs
    engine_run: EngineStats | None = None  # the first K's, served by the engine
    per_k_engine: dict[int, EngineStats] = field(default_factory=dict)  # K -> vLLM's run of it (--engine-python)
    batch_times: list[Any] = field(default_factory=list)  # batch_costs.BatchTimes per --concurrency other than 1
    incomplete: str | None = None  # why the run stopped before its levels did (Ctrl-C)
    baseline: ValidationReport | None = None  # --baseline, read before any slow work
    pending: dict[int, list] = field(default_factory=dict)  # prompt index -> chat with turns the target answers
    render: dict[str, Any] = field(default_factory=dict)  # how prompts were rendered (tokenizer, template, ...)

    def skip(self, levels, why: str) -> None:
        for lv in levels:
            if lv in self.wanted:
                self.skipped[lv] = why
        self.wanted = [lv for lv in self.wanted if lv not in self.skipped]

    @property
    def end_to_end_runs(self) -> bool:
        return "end_to_end" in self.wanted and self.target_has_weights


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
    if checkpoint_path is None:
        return _endpoint_only(opts, progress or (lambda message: None), t0)
    if opts.endpoint is not None and opts.engine is None and opts.target is not None:
        opts = _endpoint_engine(opts)
    duplicates = duplicate_tensors_check(checkpoint_path)
    if duplicates.failed:  # the checkpoint cannot be opened: report the one problem found
        return ValidationReport(
            tool_version=__version__, checkpoint=str(checkpoint_path), checkpoint_revision=opts.checkpoint_revision,
            target=_target_name(opts), target_revision=opts.target_revision, levels_run=["static"],
            levels_skipped={lv: "the checkpoint stores a tensor twice" for lv in LEVELS[1:]}, checks=[duplicates],
            environment=_environment(opts),
            options=opts.model_dump(mode="json"), duration_s=round(time.perf_counter() - t0, 3), passed=False)
    ckpt = open_checkpoint(checkpoint_path, allow_pickle=opts.allow_pickle)
    run = Run(checkpoint_path, opts, progress or (lambda message: None), progress is None, ckpt, ckpt, list(opts.levels),
              device=opts.device, dtype_name=opts.dtype)
    run.blocks = opts.blocks(serving.anchor_proposes(ckpt.spec))
    if opts.num_speculative_tokens:  # the first K is the run the checks, --baseline and the engine see
        run.opts = opts.model_copy(update={"block_size": run.blocks[0]})
    try:
        _run_levels(run, duplicates)
    except KeyboardInterrupt as exc:  # Ctrl-C: the report of what was measured, marked incomplete
        if not report_interrupted:
            raise
        run.checks += getattr(exc, "checks", [])
        run.incomplete = "interrupted (Ctrl-C)"
        for lv in run.wanted:
            if lv not in run.run:
                run.skipped[lv] = run.incomplete
    for lv in LEVELS:
        if lv not in run.run and lv not in run.skipped:
            run.skipped[lv] = "not requested"
    if opts.require_end_to_end and "end_to_end" not in run.run:
        run.checks.append(make_check("end_to_end_ran", False, "--require-end-to-end: the end-to-end level did not "
                                     f"run ({run.skipped['end_to_end']})", level="end_to_end"))
    if run.stats is not None:
        run.stats.prompt_ids_sha256 = prompt_ids_sha256(run.prompt_ids)
        run.stats.per_request_histogram = request_histogram([p.acceptance_length for p in run.stats.per_prompt],
                                                            run.stats.block_size)
    report = ValidationReport(
        tool_version=__version__, checkpoint=str(checkpoint_path), checkpoint_format=ckpt.format,
        checkpoint_revision=opts.checkpoint_revision, target=_target_name(opts), target_revision=opts.target_revision,
        levels_run=run.run, levels_skipped=run.skipped, checks=run.checks, acceptance=run.stats,
        engine_run=run.engine_run,
        per_num_speculative_tokens=[r for r in (sweep.k_run(s, run.per_k_engine.get(len(s.per_position_rates)),
                                                            run.batch_times) for s in run.per_k) if r],
        recommendation=sweep.recommendations(run.per_k, sweep.device_name(run.device), run.batch_times)
        if run.per_k else [],
        environment=_environment(opts, run), options=opts.model_dump(mode="json"), incomplete=run.incomplete,
        duration_s=round(time.perf_counter() - t0, 3),
        passed=run.incomplete is None and not any(c.status == "fail" for c in run.checks))
    if opts.endpoint is not None and run.incomplete is None:
        _endpoint_level(run, report)
    if run.baseline is not None:
        _baseline_gate(run, report)
    if opts.compare_to is not None:
        compare_to_source(report, opts, validate, progress)
    return report


def _run_levels(run: Run, duplicates: Check) -> None:
    _prepare(run)
    if "static" in run.wanted:
        _static_level(run, duplicates)
    if run.view is not None:
        _engine_level(run)
    needs_torch = "numeric" in run.wanted or run.end_to_end_runs
    with _resources(run) if needs_torch else contextlib.nullcontext():
        if "numeric" in run.wanted:
            _numeric_level(run)
        if "end_to_end" in run.wanted:
            _end_to_end_level(run)


def _endpoint_prompts(opts: ValidateOptions) -> list[tuple[str | None, Any]]:
    """(set name or None, prompt) of every prompt the endpoint is sent, as given (the server tokenizes)."""
    given = read_prompts(opts.prompts) if isinstance(opts.prompts, (str, Path)) else opts.prompts
    if given is None and not opts.prompt_sets:
        given = list(BUILTIN_TEXT_PROMPTS)
    return [(None, p) for p in given or []] + [(s.name, p) for s in opts.prompt_sets for p in s.prompts]


def _endpoint_engine(opts: ValidateOptions) -> ValidateOptions:
    """The options with --engine set to the engine the endpoint is (its /v1/models says), so that the offline
    levels emulate it and count as it counts; unchanged for a server that does not say."""
    from dflash_convert.validate.endpoint import Deadline, Endpoint, served_model

    endpoint = Endpoint(opts.endpoint, key_variable=opts.endpoint_key_env, deadline=Deadline(opts.endpoint_timeout))
    try:
        _, engine = served_model(endpoint, opts.endpoint_model)
    finally:
        endpoint.close()
    return opts.model_copy(update={"engine": engine}) if engine in engines.ENGINE_NAMES else opts


def _endpoint_level(run: Run, report: ValidationReport) -> None:
    """--endpoint with a checkpoint: the live server measured, beside the offline emulation where it ran."""
    from dflash_convert.validate.endpoint_level import endpoint_level

    offline = run.stats.vllm_counting if run.stats is not None else None
    steps = run.stats.vllm_steps if run.stats is not None else None
    checks, report.endpoint = endpoint_level(run.opts, _endpoint_prompts(run.opts), say=run.say, offline=offline,
                                             offline_steps=steps)
    report.checks += checks
    report.passed = not any(c.status == "fail" for c in report.checks)


def _endpoint_only(opts: ValidateOptions, say: Callable[[str], None], t0: float) -> ValidationReport:
    """--endpoint without a checkpoint: the served figures only, no verdict on the draft's fidelity."""
    from dflash_convert.errors import UsageError
    from dflash_convert.validate.endpoint_level import endpoint_level

    if opts.endpoint is None:
        raise UsageError("give a CHECKPOINT, or --endpoint URL to measure a live server")
    baseline = load_baseline(opts.baseline) if opts.baseline is not None else None
    checks, stats = endpoint_level(opts, _endpoint_prompts(opts), say=say)
    report = ValidationReport(
        tool_version=__version__, checkpoint=None, target=_target_name(opts), levels_run=["end_to_end"],
        levels_skipped={lv: "no checkpoint given (--endpoint alone)" for lv in LEVELS[:-1]}, checks=checks,
        endpoint=stats, environment=_environment(opts), options=opts.model_dump(mode="json"),
        duration_s=round(time.perf_counter() - t0, 3), passed=not any(c.status == "fail" for c in checks))
    if baseline is not None:
        check, report.baseline = compare_baseline(baseline, opts.baseline, report, opts.max_regression)
        report.checks.append(check)
        report.passed = not any(c.status == "fail" for c in report.checks)
    return report


def _baseline_gate(run: Run, report: ValidationReport) -> None:
    """--baseline: the regression check of this run's figures against the earlier report's."""
    if report.acceptance is None and report.endpoint is None:
        check = make_check("regression", None, f"no end-to-end figures in this run to compare with {run.opts.baseline}",
                       level="end_to_end")
    else:
        check, report.baseline = compare_baseline(run.baseline, run.opts.baseline, report, run.opts.max_regression)
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


def _target_name(opts: ValidateOptions) -> str | None:
    return opts.target_name or (str(opts.target) if opts.target is not None else None)


def _prepare(run: Run) -> None:
    """Read the target's config, the engine's reading, the mask embedding and the prompts: everything
    that can fail on bad input, before any slow work."""
    opts = run.opts
    if opts.target is not None:
        run.target_dir, run.target_config, run.target_has_weights = _target_paths(opts.target)
        run.info = mapping.target_info(read_json(run.target_config), _target_name(opts), file=str(run.target_config))
    if opts.engine is not None:
        run.view = engine_views.serving_view(run.ckpt, opts.engine,
                                             num_target_layers=run.info.num_layers if run.info else None)
        run.ckpt = engine_views.applied_checkpoint(run.ckpt, run.view)
    rule = engines.ENGINES_BY_KEY[run.view.engine] if run.view is not None else None
    per_query = run.view is not None and run.view.window_semantics == engines.WindowSemantics.PER_QUERY
    run.draft_options = {"window_per_query": per_query}
    run.mask_check, run.draft_options["mask_embedding"] = _mask_embedding(
        run.ckpt, allow_pickle=opts.allow_pickle,
        # vLLM 0.33's and SGLang 0.5.23's DSpark loaders drop a mask embedding (the mask slots embed the vocab row)
        ignored=rule is not None and rule.mask_embedding == engines.MaskEmbedding.IGNORED
        or run.ckpt.spec.variant == "dspark")
    run.draft_options["last_layer_post_norm"] = rule is not None and rule.last_layer == engines.LastLayer.POST_NORM
    prompts = opts.prompts
    prompt_list = read_prompts(prompts) if isinstance(prompts, (str, Path)) else prompts
    if opts.baseline is not None:
        run.baseline = load_baseline(opts.baseline)
    if run.end_to_end_runs:
        _prepare_decoding(run, prompt_list, str(prompts) if isinstance(prompts, (str, Path)) else "prompts")
        if run.baseline is not None and not run.pending:  # else once the target answered the earlier turns
            check_same_settings(run.baseline, opts.baseline, _settings(run))


def _settings(run: Run) -> dict[str, Any]:
    """This run's settings as baseline.settings names them, known before decoding."""
    s = run.sampling
    out = {"prompt token ids (SHA-256)": prompt_ids_sha256(run.prompt_ids), "prompts": len(run.prompt_ids),
           "block size": run.opts.block_size or run.ckpt.spec.block_size, "max new tokens": run.opts.max_new_tokens,
           "draft sampling": run.opts.draft_sampling, "prompt lengths": [len(p) for p in run.prompt_ids]}
    return out | {k: getattr(s, k) for k in SAMPLING_KEYS}


def _prepare_decoding(run: Run, prompt_list, source: str) -> None:
    """Token ids of the prompts (and of each named prompt set), through the chat template as the engine
    applies it; the sampling parameters and stop ids, as vLLM resolves them for the target."""
    opts, info = run.opts, run.info
    avoid = {i for i in (run.ckpt.spec.mask_token_id, info.pad_token_id, *info.eos_token_ids) if i is not None}
    tokenizer = load_tokenizer(run.target_dir)
    template, run.prompt_format = (chat_template(tokenizer, opts.chat_template, run.target_dir) if tokenizer is not None
                                   else (None, "token ids (the target ships no tokenizer)"))
    if template is not None and opts.chat_template_kwargs:
        run.prompt_format += f" with {json.dumps(opts.chat_template_kwargs, sort_keys=True)}"
    how = dict(tokenizer=tokenizer, template=template, template_kwargs=opts.chat_template_kwargs,
               template_name=opts.chat_template if opts.chat_template not in ("auto", "none") else str(run.target_dir))
    groups: list[tuple[str | None, str, list[list[int]], list]] = []
    if prompt_list is not None or not opts.prompt_sets:
        ids, described = tokenize_prompts(prompt_list, run.target_dir, info.vocab_size, avoid, source=source, **how)
        groups.append((None, described, ids, list(prompt_list or [])))
    for named in opts.prompt_sets:
        ids, _ = tokenize_prompts(named.prompts, run.target_dir, info.vocab_size, avoid, source=named.source, **how)
        groups.append((named.name, named.source, ids, named.prompts))
    run.prompt_ids = []
    run.render = how
    for name, described, ids, raw in groups:
        run.pending |= {len(run.prompt_ids) + k: p for k, p in enumerate(raw) if pending_turn(p) is not None}
        if name is not None:
            run.prompt_sets.append((name, described, len(run.prompt_ids), len(run.prompt_ids) + len(ids)))
        run.prompt_ids += ids
    gen, gen_path = generation_config(run.target_dir)
    run.sampling = resolve_sampling(opts, gen, gen_path)
    stops = stop_token_ids(info.eos_token_ids, gen, gen_path, tokenizer)
    run.sampling.stop_token_sources = stops
    run.sampling.stop_token_ids = sorted({i for ids in stops.values() for i in ids})


def _static_level(run: Run, duplicates: Check) -> None:
    run.say("static: config, tensor headers" + (" and the target's config" if run.info is not None else ""))
    checks = [duplicates, *checkpoint_checks(run.trained, scan=False)]
    if run.info is not None:  # the target answers what the draft config alone could not
        answered = {"target_layer_ids_range", "mask_token_id_special"}
        checks = [c for c in checks if not (c.status == "skip" and c.name in answered)]
        checks += target_checks(run.ckpt.spec, run.info, ckpt=run.ckpt)
        named = verifier_against(run.ckpt.spec, _target_name(run.opts), run.target_dir)
        checks = [named if c.name == "verifier" and named is not None else c for c in checks]
    checks += [c for c in (_causal_override_check(run.ckpt, run.opts.causal), run.mask_check) if c is not None]
    run.checks += checks
    run.run.append("static")
    failed = [c.name for c in checks if c.status == "fail"]
    run.say(f"static: {len(checks)} checks, " + (f"failed: {', '.join(failed)}" if failed else "none failed"))
    if failed and not run.opts.keep_going:
        run.skip(EXPENSIVE, f"static checks failed ({', '.join(failed)}); --keep-going runs it anyway")


def _engine_level(run: Run) -> None:
    run.checks.append(_engine_fidelity_check(run.view))
    if not run.view.loads:
        run.skip(EXPENSIVE, f"{engine_views.rules_label(run.view)}, would not load this checkpoint (engine_fidelity)")


@contextlib.contextmanager
def _resources(run: Run) -> Iterator[None]:
    """Device, dtypes, the memory plan (before anything is loaded) and CPU threads for the runtime
    levels; the caller's thread count is restored on exit."""
    import torch

    from dflash_runtime.device import resolve_device, resolve_dtype

    opts = run.opts
    dev = resolve_device(opts.device)
    run.device = str(dev)
    run.torch_dtype = resolve_dtype(opts.dtype if opts.dtype != "auto" else
                                    _own_dtype({"dtype": run.ckpt.spec.dtype}, run.ckpt.tensors))
    run.dtype_name = str(run.torch_dtype).removeprefix("torch.")
    if run.end_to_end_runs:
        run.target_torch_dtype = resolve_dtype(opts.dtype if opts.dtype != "auto" else _own_dtype(
            read_json(run.target_config), memory.weight_headers(run.target_dir)))
        run.target_dtype_name = str(run.target_torch_dtype).removeprefix("torch.")
    plan = _memory_plan(run)
    if not plan.fits:
        raise DFlashError(plan.refusal())
    run.say(f"memory plan: {plan.describe()}")
    previous = torch.get_num_threads()
    if dev.type == "cpu":
        tiny = plan.draft_bytes + plan.target_bytes < TINY_MODEL_BYTES
        run.threads = opts.threads or (1 if tiny else previous)
        torch.set_num_threads(run.threads)
        run.say(f"CPU threads: {run.threads}" + ("" if opts.threads else " (tiny models run fastest on one)"
                                                 if tiny else " (torch's default)"))
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _memory_plan(run: Run) -> memory.MemoryPlan:
    opts, spec, e2e = run.opts, run.ckpt.spec, run.end_to_end_runs
    draft_tensors = quantization.memory_plan_tensors(run.ckpt.quantized_modules(), run.ckpt.tensors,
                                                     catalogue.expected_shapes(spec))  # quantized: as dequantized
    block = max(b or opts.block_size or spec.block_size for b in run.blocks)
    sequence = (max(map(len, run.prompt_ids)) if run.prompt_ids else CONTEXT_TOKENS) + opts.max_new_tokens + block
    sequence += opts.max_new_tokens if run.pending else 0  # an earlier turn's answer joins the prompt
    return memory.plan(draft_tensors, run.dtype_name, device=run.device, target_dir=run.target_dir if e2e else None,
                       target_dtype=run.target_dtype_name, draft_layers=spec.num_layers,
                       draft_kv_width=spec.num_kv_heads * spec.head_dim, sequence=sequence, block=block,
                       device_map=opts.placed_by_device_map if e2e else None, max_memory=opts.max_memory)


def _numeric_level(run: Run) -> None:
    run.say("numeric: value scan")
    run.checks += scan_checks(run.ckpt)
    opts = run.opts
    numeric, run.backends, run.loaded = numeric_checks(
        run.ckpt, device=run.device, dtype=run.torch_dtype, backend=opts.backend, causal=opts.causal,
        block_size=opts.block_size, seed=opts.seed, progress=run.say, draft_options=_load_options(run))
    run.draft_backend = run.loaded.backend if run.loaded is not None else None
    run.checks += numeric
    run.run.append("numeric")
    failed = [c.name for c in numeric if c.status == "fail"]
    run.say("numeric: " + (f"failed: {', '.join(failed)}" if failed else "none failed"))


def _load_options(run: Run) -> dict[str, Any]:
    """What load_draft takes of the draft options (the last-layer feed is the target's business)."""
    return {k: v for k, v in run.draft_options.items() if k != "last_layer_post_norm"}


def _end_to_end_level(run: Run) -> None:
    if run.opts.target is None:
        run.skipped["end_to_end"] = "no --target given" + _recorded_target(run.ckpt.spec)
    elif not run.target_has_weights:
        run.skipped["end_to_end"] = f"target {run.opts.target} has no weights (config only)"
    elif any(c.name in ("draft_loads", "backend") and c.status == "fail" for c in run.checks):
        run.skipped["end_to_end"] = "the draft cannot be loaded (see the numeric checks)"
    else:
        if run.pending:
            _answer_earlier_turns(run)
        placement = Placement(device=run.device, dtype=run.torch_dtype, target_dtype=run.target_torch_dtype,
                              draft_options=_load_options(run),
                              last_layer_post_norm=run.draft_options["last_layer_post_norm"])
        checks, run.stats, run.outputs = end_to_end(
            run.ckpt, run.target_dir, Prompts(run.prompt_ids, run.prompt_sets, run.prompt_format), run.opts,
            sampling=run.sampling, placement=placement, draft=run.loaded, progress=run.say, quiet=run.quiet)
        run.checks += checks
        run.run.append("end_to_end")
        run.per_k = [run.stats] if run.stats is not None else []
        run.per_k_outputs = [run.outputs] if run.stats is not None else []
        for block in run.blocks[1:] if run.stats is not None else ():
            _another_k(run, placement, block)
        if run.stats is not None and set(run.opts.concurrency) - {1}:
            _batch_costs(run)
        if run.opts.engine_python is not None and run.stats is not None:
            _served_level(run)
        if run.opts.engine == "transformers" and run.stats is not None:
            _transformers_level(run)


def _another_k(run: Run, placement: Placement, block: int) -> None:
    """One more end-to-end run at another K: its checks named with their K, its figures beside the first's."""
    k = block - (0 if serving.anchor_proposes(run.ckpt.spec) else 1)
    run.say(f"end to end: num_speculative_tokens {k} (block of {block})")
    checks, stats, outputs = end_to_end(
        run.ckpt, run.target_dir, Prompts(run.prompt_ids, run.prompt_sets, run.prompt_format),
        run.opts.model_copy(update={"block_size": block}), sampling=run.sampling, placement=placement,
        draft=run.loaded, progress=run.say, quiet=run.quiet)
    run.checks += _named_k(checks, k)
    if stats is not None:
        run.per_k.append(stats)
        run.per_k_outputs.append(outputs)


def _batch_costs(run: Run) -> None:
    """--concurrency: the target's verify and target-only steps timed at each batch size other than 1 (batch
    1 is the decode loop's), for every K run (batch_costs.py); a check says where they cannot be timed."""
    from dflash_runtime import load_target

    from dflash_convert.validate import batch_costs

    opts = run.opts
    batches = sorted(set(opts.concurrency) - {1})
    run.say(f"end to end: step costs at batch {', '.join(map(str, batches))} ({opts.timing_rounds} round(s))")
    target = load_target(run.target_dir, device=run.device, dtype=run.target_torch_dtype or run.torch_dtype,
                         attn_implementation=opts.target_backend, device_map=opts.placed_by_device_map,
                         max_memory=opts.max_memory)
    why = batch_costs.cannot_batch(target)
    if why is None:
        run.batch_times = batch_costs.time_batches(target, run.prompt_ids[0], batches,
                                                   [len(s.per_position_rates) + 1 for s in run.per_k],
                                                   opts.timing_rounds)
    run.checks.append(make_check(
        "batch_costs", why is None, f"verify and target-only steps timed at batch {', '.join(map(str, batches))}"
        if why is None else f"--concurrency {','.join(map(str, batches))}: the target's batched steps cannot be "
        f"timed ({why}); the recommendation is batch 1's only", level="end_to_end", bad="warn"))
    del target


def _named_k(checks: list[Check], k: int) -> list[Check]:
    """The checks of a K after the first, named with their K (the first K's keep their names)."""
    return [c.model_copy(update={"name": f"{c.name} (K={k})"}) for c in checks]


def _answer_earlier_turns(run: Run) -> None:
    """Multi-turn prompts: the target answers the turns before the one measured (turns.py), then the
    baseline's prompts are checked again against the prompts as completed."""
    from dflash_runtime import load_target

    opts = run.opts
    run.say(f"end to end: the target answers the earlier turns of {len(run.pending)} multi-turn prompt(s)")
    target = load_target(run.target_dir, device=run.device, dtype=run.target_torch_dtype or run.torch_dtype,
                         attn_implementation=opts.target_backend, device_map=opts.placed_by_device_map,
                         max_memory=opts.max_memory)
    answer_turns(target, run.pending, run.prompt_ids, how=run.render, max_new_tokens=opts.max_new_tokens,
                 sampling=runtime_sampling(run.sampling, opts.seed), say=run.say)
    del target
    if run.baseline is not None:
        check_same_settings(run.baseline, opts.baseline, _settings(run))


def _served_level(run: Run) -> None:
    """The pair in real vLLM, checked against the emulation counted as vLLM counts (served.py): every K of the run
    served one after another in one vLLM process, each against the emulation of that K."""
    opts, spec = run.opts, run.ckpt.spec
    python = served.engine_python(opts.engine_python)
    refused = engine_views.vllm_cannot_serve_here(spec)
    if refused is not None and not _has_cuda():
        # no GPU here, so vLLM runs its CPU build (V1 model runner only): say why, keep the emulation's verdict
        run.skipped["served"] = refused
        run.say(f"engine: {refused}; the emulation above is the vLLM verdict")
        return
    mixed = len(set(spec.layer_types)) > 1
    request = served.EngineRequest(
        target=run.target_dir, prompts=run.prompt_ids, max_tokens=opts.max_new_tokens,
        stop_token_ids=list(run.sampling.stop_token_ids), engine_args=opts.engine_args,
        sampling=served.engine_sampling(run.sampling, opts.seed),
        # vLLM's num_speculative_tokens: the proposals of a block (block_size - 1; block_size when the anchor drafts)
        drafts=[{"draft": str(run.path), "num_speculative_tokens": len(s.per_position_rates),
                 "mixed_layer_types": mixed} for s in run.per_k])
    answer = served.run_vllm(request, python=python, timeout_s=opts.engine_timeout,
                             kv_cache_gib=opts.engine_kv_cache_gib, say=run.say)
    for i, (stats, outputs, engine_run) in enumerate(zip(run.per_k, run.per_k_outputs, answer["drafts"])):
        checks, stats_k = _served_k(run, {**answer, "drafts": [engine_run]}, stats, outputs, request, python)
        checks = activation_caveat(run.ckpt, checks)  # a W8A8 draft: the runtime's activations are float
        k = len(stats.per_position_rates)
        run.checks += checks if i == 0 else _named_k(checks, k)
        run.per_k_engine[k] = stats_k
    run.engine_run = run.per_k_engine[len(run.stats.per_position_rates)]
    fidelity = next((c for c in run.checks if c.name == "engine_fidelity"), None)
    if fidelity is not None:  # the rules applied are one version's; the engine that ran may be another
        fidelity.message += f" (vLLM {run.engine_run.version} ran the pair below)"


def _served_k(run: Run, answer: dict[str, Any], stats: AcceptanceStats, outputs: list[list[int]],
              request: served.EngineRequest, python: str) -> tuple[list[Check], EngineStats]:
    """vLLM's run of one K (`answer` holds that draft's run alone) against the emulation of that K."""
    opts = run.opts
    checks, engine_run = served.served_checks(
        answer, outputs, stats.vllm_counting, block=stats.block_size, engine_args=opts.engine_args, python=python,
        min_acceptance_length=opts.min_acceptance_length, min_position_rates=opts.min_position_rates,
        sampling=request.sampling, steps=stats.vllm_steps,
        emulated_dtypes=[d for d in (run.dtype_name, run.target_dtype_name) if d])
    equal = engine_run.outputs_equal
    k = "" if len(run.per_k) < 2 else f" at num_speculative_tokens {len(stats.per_position_rates)}"
    run.say(f"engine: vLLM {engine_run.version}{k}: tau {engine_run.counts.acceptance_length:.3f}, "
            + (f"outputs equal on {equal}/{engine_run.prompts} prompts" if equal is not None else "sampled"))
    return checks, engine_run


def _transformers_level(run: Run) -> None:
    """The pair in transformers' own generate(speculation_type="dflash"), in-process, against our decode loop run
    with transformers' semantics (transformers_engine.py): greedy, step for step."""
    from dflash_convert.validate import transformers_engine

    from dflash_runtime import load_draft, load_target

    opts, spec = run.opts, run.trained.spec
    why = None
    if spec.source_format != "transformers":
        why = "transformers reads only its own layout: convert --to transformers (--non-causal), then validate that"
    elif run.sampling.temperature > 0:
        why = "sampled: transformers draws from a random stream of its own; it is compared greedy only"
    else:
        why = transformers_engine.cannot_compare(spec, run.prompt_ids, opts.max_new_tokens)
    if why is not None:
        run.skipped["served"] = why
        run.say(f"engine: transformers not run: {why}")
        return
    dtype = run.torch_dtype
    draft = run.loaded if run.loaded is not None else load_draft(run.ckpt, dtype=dtype, **_load_options(run))
    target = load_target(run.target_dir, dtype=run.target_torch_dtype or dtype)
    checks, run.engine_run = transformers_engine.transformers_checks(
        Path(run.path), run.target_dir, run.prompt_ids, opts.max_new_tokens, our_draft=draft, our_target=target,
        dtype=dtype, say=run.say)
    e = run.engine_run
    run.say(f"engine: transformers {e.version}: tau {e.counts.acceptance_length:.3f} (emulation "
            f"{e.emulated.acceptance_length:.3f}), outputs equal on {e.outputs_equal}/{e.prompts}, acceptance equal "
            f"step for step on {e.steps_equal}/{e.prompts} prompts")
    run.checks += checks


def _has_cuda() -> bool:
    torch = sys.modules.get("torch")
    return bool(torch is not None and torch.cuda.is_available())


# ----------------------------------------------------------------------------- target

def _target_paths(target: str | Path) -> tuple[Path, Path, bool]:
    """(model dir, config.json, has weights) of a --target given as a directory or a config.json."""
    path = Path(target)
    if path.is_file():
        return path.parent, path, False if path.name == "config.json" else True
    if not path.is_dir():
        raise DFlashError("target is neither a model directory nor a config.json", file=path)
    config = path / "config.json"
    if not config.exists():
        raise DFlashError("target directory has no config.json", file=path)
    weights = any(path.glob("*.safetensors"))
    return path, config, weights


# ----------------------------------------------------------------------------- the command

def _environment(opts: ValidateOptions, run: Run | None = None) -> Environment:
    versions: dict[str, str | None] = {"python": platform.python_version(), "dflash_convert": __version__}
    for mod in ("torch", "transformers", "numpy"):
        m = sys.modules.get(mod)
        versions[mod] = getattr(m, "__version__", None) if m is not None else None
    torch = sys.modules.get("torch")
    load, _ = machine_load()
    threads = (run.threads if run else None) or (torch.get_num_threads() if torch is not None else None)
    return Environment(versions=versions, platform=platform.platform(), device=run.device if run else opts.device,
                       dtype=run.dtype_name if run else opts.dtype, target_dtype=run.target_dtype_name if run else None,
                       device_map=opts.placed_by_device_map, draft_sampling=opts.draft_sampling,
                       backends=run.backends if run else {}, draft_backend=run.draft_backend if run else None,
                       target_backend=opts.target_backend if run and "end_to_end" in run.run else None,
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


def _mask_embedding(ckpt: Checkpoint, *, allow_pickle: bool, ignored: bool) -> tuple[Check | None, Any]:
    """(check, the vector the runtime levels embed the mask slots with, or None) for a mask_embedding.pt beside
    the weights: loaded once (pass; as vLLM and SGLang use it), unusable (fail), or present but a pickle not
    allowed (warn). No check: no file, or an engine that ignores it (--engine zlab: engine_fidelity says so)."""
    name = catalogue.MASK_EMBEDDING_FILE
    if ignored or not any(f.name == name for f in ckpt.companion_files):
        return None, None
    if not allow_pickle:
        return Check(name="mask_embedding", status="warn", value="not loaded", message=f"{name} is a pickle and "
                     "was not loaded: the runtime levels embed the mask slots with the target's row of mask_token_id "
                     "(as z-lab does), vLLM and SGLang with this file; --allow-pickle loads it (weights_only)"), None
    try:
        vector = ckpt.load_mask_embedding(allow_pickle=True)
    except DFlashError as exc:
        return Check(name="mask_embedding", status="fail", value=name, message=str(exc)), None
    return Check(name="mask_embedding", status="pass", value=list(vector.shape),
                 message=f"{name} loaded (weights_only): the runtime levels embed the mask slots with it, as vLLM "
                         "and SGLang do"), vector


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
