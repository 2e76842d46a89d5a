"""`inspect`: what a checkpoint is and what each engine will do with it, from headers only.

Reads config.json and safetensors headers; imports torch only for `scan=True` (NaN/Inf and
degenerate-value checks), so it answers in a fraction of a second even for an 8B-sized draft.
The report is `InspectReport` (schema: `schemas/inspect-report.schema.json`); the per-engine
part comes from `engine_views.checkpoint_views`, the same reading rules `validate --engine` and
`diff` use.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field

from dflash_convert.format import catalogue, engine_views, mapping, quantization
from dflash_convert.io.checkpoint import open_checkpoint
from dflash_convert.validate.static import Check, make_check
from dflash_convert.format.configs import Format, LayerType, Variant
from dflash_convert.format.dtypes import DTYPES
from dflash_convert.format.engine_views import EngineView
from dflash_convert.format.serving import ServingConfig, serving_checks


class TensorRow(BaseModel):
    name: str
    dtype: str
    shape: list[int]
    file: str
    role: str


class InspectReport(BaseModel):
    """What `inspect --json` prints: the trained semantics, each engine's view, tensors and problems."""

    path: str
    revision: str | None = Field(None, description="resolved Hub commit when PATH was a Hub id")
    format: Format
    variant: Variant
    block_size: int | None
    speculative_tokens: int | None
    mask_token_id: int | None
    target_layer_ids: list[int] | None = Field(description="z-lab convention: layers whose output is used")
    aux_hidden_state_layer_ids: list[int] | None = Field(description="speculators convention: target ids + 1")
    num_target_layers: int | None
    layer_types: list[LayerType]
    layer_causal: list[bool] = Field(description="per-layer block causality the draft was trained with")
    causal_flag: bool | None
    sliding_window: int | None
    rope_type: str = Field("default", description="transformers' RoPE type (default, linear, dynamic, yarn, "
                           "longrope, llama3, ...)")
    rope_theta: float | None = None
    rope_scaling: dict[str, Any] | None = Field(None, description="the scaling parameters of a non-default RoPE")
    vocab_size: int
    draft_vocab_size: int
    hidden_size: int
    target_hidden_size: int
    num_hidden_layers: int
    verifier: str | None
    dtype: str | list[str]
    parameters: int
    files: list[str]
    engines: list[EngineView] = Field(description="per engine: what it applies and where it differs from training")
    tensors: list[TensorRow]
    checks: list[Check]
    problems: list[Check] = Field(description="the checks that failed or warned")
    ok: bool = Field(description="no check failed (an engine view that errs is a failed `engine_view.*` check)")
    scanned: bool = Field(False, description="tensor values were read (--scan): NaN/Inf and degenerate values "
                          "checked; otherwise only the config and the tensor headers")

    def render(self, console, quiet: bool = False) -> None:
        """The summary, the tensor table, the problems, each engine's view and a verdict line, on `console`.

        quiet: only the problems, the engines that do not serve the draft as trained, and the verdict.
        """
        from rich import box
        from rich.markup import escape
        from rich.table import Column, Table

        if not quiet:
            summary = Table(Column(no_wrap=True), Column(overflow="fold"), show_header=False, box=None,
                            pad_edge=False)
            for key, value in self.model_dump(mode="json").items():
                if key in ("tensors", "checks", "problems", "files", "ok", "engines", "scanned") or \
                        (key == "revision" and value is None):
                    continue
                summary.add_row(key, escape(_human(key, value)))
            console.print(summary)
            width = max((len(t.name) for t in self.tensors), default=6)
            # names whole: the role column wraps instead (80-column logs)
            tensors = Table(Column("tensor", no_wrap=True, min_width=width), Column("dtype", no_wrap=True),
                            Column("shape", no_wrap=True), Column("role", ratio=1, overflow="fold"),
                            title=f"{len(self.tensors)} tensors", title_justify="left", box=box.SIMPLE_HEAD,
                            pad_edge=False)
            for t in self.tensors:
                tensors.add_row(escape(t.name), t.dtype, "[" + ", ".join(map(str, t.shape)) + "]", escape(t.role))
            console.print(tensors)
            # a quantized draft: its schemes and what each engine does with it, passed or not; --gpu's answer where
            # the full batch stays memory-bound (the warning, where it does not, is among the problems)
            for c in self.checks:
                if c.name == "quantization" or (c.name.startswith("quantized_serving.") and c.status == "pass") or \
                        (c.name == "verify_compute_bound" and c.status == "pass"):
                    console.print(f"{escape(c.name)}: {escape(c.message)}")
        for c in self.problems:
            colour = "red" if c.status == "fail" else "yellow"
            console.print(f"[{colour}]{c.status.upper()}[/{colour}] {escape(c.name)}: {escape(c.message)}")
        notes: dict[str, list[str]] = {}  # one line per note, naming the engines it holds for
        for view in self.engines:
            if quiet and view.as_trained:
                continue
            via = f" (as converted by `convert --to {view.reads}`)" if view.via_conversion else ""
            state = engine_views.view_state(view)
            console.print(f"{engine_views.rules_label(view)}{via}: {state}", markup=False)
            if engine_views.format_cannot_hold(view) and len(self.engines) > 1:  # a problem only when asked for
                console.print("  " + next(d.consequence for d in view.divergences if d.field == "format"),
                              markup=False)
                continue
            if engine_views.lacks_target_layer_count(view) and len(self.engines) > 1:  # likewise
                d = next(d for d in view.divergences if d.field == "num_target_layers")
                console.print(f"  {d.consequence}. Fix: {d.fix}", markup=False)
                continue
            if engine_views.runtime_only(view):  # the kind's, said once for every engine: a note, not a problem
                notes.setdefault(next(d.consequence for d in view.divergences if d.field == "engine_support"),
                                 []).append(view.title)
                continue
            if not view.as_trained or len(self.engines) == 1:
                for line in engine_views.render_view(view)[1:2]:
                    console.print(line, markup=False)
            for d in view.divergences:
                if d.severity == "error":
                    console.print(f"  ERROR {d.field}: {d.consequence}. Fix: {d.fix}", markup=False)
                elif d.field != "format" or not view.via_conversion:  # `via conversion` says it already
                    notes.setdefault(f"{d.field}: {d.consequence}. Fix: {d.fix}", []).append(view.title)
        if not quiet:
            for text, titles in notes.items():
                who = "every engine" if len(titles) == len(self.engines) > 1 else ", ".join(titles)
                console.print(f"  note ({who}) {text}", markup=False)
        console.print(self.verdict(), markup=False)

    def verdict(self) -> str:
        n_fail = sum(c.status == "fail" for c in self.problems)
        n_warn = len(self.problems) - n_fail
        found = (f"FAILED: {n_fail} failed, {n_warn} warning(s)" if n_fail else
                 f"{n_warn} warning(s), no failure" if n_warn else "no problems found")
        where = "in the config, tensor headers and values" if self.scanned else \
            "in the config and tensor headers (values not read: --scan reads them)"
        return f"{self.path}: {found} {where}"


def _human(key: str, value: Any) -> str:
    """A summary value as people write it: no None, no Python list or bool syntax."""
    if value is None:
        return {"sliding_window": "none (no sliding layer)", "causal_flag": "not set (per layer)"}.get(
            key, "not recorded")
    if key == "layer_causal":
        return ", ".join("causal" if c else "non-causal" for c in value)
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}" if key == "parameters" else str(value)
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return str(value)


def _verify_compute_check(gpu: str, serving: ServingConfig, target_config: Path | None) -> Check:
    """A warning where the launch's full batch makes the target's verify compute-bound on the GPU."""
    from dflash_convert.io.reading import read_json
    from dflash_convert.predict.facts import target_facts
    from dflash_convert.predict.gpus import gpu as known_gpu
    from dflash_convert.predict.gpus import variant_note
    from dflash_convert.predict.prediction import verify_compute_note

    target = None
    if target_config is not None:
        config = target_config / "config.json" if Path(target_config).is_dir() else Path(target_config)
        target = target_facts(read_json(config), str(config))
    bound, message = verify_compute_note(known_gpu(gpu), serving.engine, serving.num_speculative_tokens,
                                         serving.max_num_seqs, target)
    picked = variant_note(gpu)
    message += f" ({picked})" if picked else ""
    return make_check("verify_compute_bound", not bound, message, value=serving.max_num_seqs *
                      (serving.num_speculative_tokens + 1), level="static", bad="warn")


def inspect_checkpoint(path: str | Path, *, scan: bool = False, allow_pickle: bool = False,
                       engine: str | None = None, serving: ServingConfig | None = None, gpu: str | None = None,
                       target_config: Path | None = None, max_model_len: int | None = None) -> InspectReport:
    """Inspect a checkpoint; `engine` (vllm, sglang, zlab) narrows the engine views to that engine; `serving`
    adds the checks of a launch's settings against that engine's rules (format/serving.py); `gpu` (with a
    serving launch's max_num_seqs) whether its full batch's verify is compute-bound there, for the target of
    `target_config` when given (predict/); `max_model_len`: the context a deployment serves, against the
    positions the draft was trained for (trained_context.py)."""
    from dflash_convert.validate.trained_context import trained_context_check

    from dflash_convert.validate.quantized_checks import catalogue_shapes
    from dflash_convert.validate.static import checkpoint_checks

    ckpt = open_checkpoint(path, allow_pickle=allow_pickle)
    spec = ckpt.spec
    tensors = []
    params = 0
    for name in sorted(ckpt.tensors):
        info = ckpt.tensors[name]
        rule = catalogue.rule_for(name, spec.variant)
        tensors.append(TensorRow(name=catalogue.layout_name(name, spec.source_format), dtype=info.dtype,
                                 shape=list(info.shape), file=info.file.name,
                                 role=rule.role if rule else quantization.role(name) or "unknown"))
    for name, shape in catalogue_shapes(ckpt).items():  # a quantized weight counts by its unquantized shape
        rule = catalogue.rule_for(name, spec.variant)
        if rule and catalogue.loaded_by_engines(rule, spec):
            params += math.prod(shape)
    float_dtypes = sorted({t.dtype for t in tensors if DTYPES[t.dtype].is_float})
    views = engine_views.checkpoint_views(ckpt, engine)
    checks = checkpoint_checks(ckpt, scan=scan) + engine_checks(views, asked=engine is not None)
    if serving is not None:
        checks += serving_checks(spec, ckpt.raw_config, serving)
    if gpu is not None and serving is not None and serving.max_num_seqs is not None:
        checks.append(_verify_compute_check(gpu, serving, target_config))
    checks.append(trained_context_check(spec, views, max_model_len=max_model_len))
    aux = mapping.aux_ids_from_target(spec.target_layer_ids) if spec.target_layer_ids is not None else None
    return InspectReport(
        path=str(ckpt.path),
        format=spec.source_format,
        variant=spec.variant,
        block_size=spec.block_size,
        speculative_tokens=spec.block_size - 1 if spec.block_size else None,
        mask_token_id=spec.mask_token_id,
        target_layer_ids=spec.target_layer_ids,
        aux_hidden_state_layer_ids=aux,
        num_target_layers=spec.num_target_layers,
        layer_types=spec.layer_types,
        layer_causal=spec.layer_causal,
        causal_flag=spec.causal_flag,
        sliding_window=spec.sliding_window if "sliding_attention" in spec.layer_types else None,
        rope_type=(spec.rope_scaling or {}).get("rope_type") or (spec.rope_scaling or {}).get("type") or "default",
        rope_theta=spec.rope_theta,
        rope_scaling={k: v for k, v in spec.rope_scaling.items() if k not in ("rope_type", "type", "rope_theta")}
        if spec.rope_scaling else None,
        vocab_size=spec.vocab_size,
        draft_vocab_size=spec.draft_vocab,
        hidden_size=spec.hidden_size,
        target_hidden_size=spec.target_hidden,
        num_hidden_layers=spec.num_layers,
        verifier=spec.verifier.name_or_path if spec.verifier else None,
        dtype=float_dtypes[0] if len(float_dtypes) == 1 else float_dtypes,
        parameters=params,
        files=[f.name for f in ckpt.input_files],
        engines=views,
        tensors=tensors,
        checks=checks,
        problems=[c for c in checks if c.status in ("fail", "warn")],
        ok=not any(c.status == "fail" for c in checks),
        scanned=scan,
    )


def engine_checks(views: list[EngineView], *, asked: bool = False) -> list[Check]:
    """Each engine view that errs (the engine does not load the draft, or serves it differently at every step)
    as a failed check naming the engine and the fields: a problem like any other, in the verdict line, the JSON
    and the exit code. Warnings (some deployments only) stay notes of the view. An engine whose own format
    cannot hold the draft at all (transformers' layout and a causal draft) serves another kind of draft: its view
    says so, and it is a problem only when that engine was `asked` for (`inspect --engine E`); so is a kind no engine
    serves (runtime only), which the views note, and a config without the target's layer count that only an engine
    needing it beside the ids (z-lab's loader) misses."""
    checks = []
    for view in views:
        if not asked and engine_views.problem_only_when_asked(view):
            continue
        errors = [d.field for d in view.divergences if d.severity == "error"]
        if errors or not view.loads:
            via = " as converted" if view.via_conversion else ""
            checks.append(make_check(f"engine_view.{view.engine}", False, f"{engine_views.rules_label(view)}{via}: "
                                     f"{engine_views.view_state(view)}" + (f" ({', '.join(errors)})" if errors else "")
                                     + ": see its ERROR lines", value=errors or None))
    return checks


def inspect_report_schema() -> dict[str, Any]:
    return InspectReport.model_json_schema(mode="serialization")
