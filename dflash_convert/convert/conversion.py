"""Convert a DFlash checkpoint between the speculators, HF / z-lab and transformers' own formats.

Plan, then execute. The plan is pure (config mapping + one decision per tensor from
the tensor catalogue); execution streams: it writes each destination header, then copies every
kept tensor's byte range straight from the source file. torch is imported only to cast dtypes.
Output is staged beside the destination and renamed into place only when complete.
"""

from __future__ import annotations

import hashlib
import json
import queue
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, get_args

import numpy as np
from pydantic import ConfigDict, Field

from dflash_convert import __version__
from dflash_convert.format import catalogue, compat, mapping, quantization
from dflash_convert.io.checkpoint import Checkpoint, open_checkpoint, read_companion
from dflash_convert.io.staging import check_destination, staged_directory
from dflash_convert.io.reading import announced_by_cache_name, discard, hasher, read_json
from dflash_convert.flags import ALLOW_PICKLE_HELP, CAUSAL_HELP, CommandOptions, Flag
from dflash_convert.format.configs import (
    MAX_BLOCK_SIZE, MIN_BLOCK_SIZE, ConversionRecord, DraftSpec, Format, VerifierRef
)
from dflash_convert.format.dtypes import CAST_TARGETS, DTYPE_CHOICES, DTYPES, torch_dtype
from dflash_convert.errors import DFlashError, UsageError
from dflash_convert.io.safetensors import (
    TensorInfo,
    copy_range,
    header_bytes,
    parse_size,
    plan_shards,
    shard_names,
    write_index,
)

RECORD_NAME = "conversion.json"


class ConvertOptions(CommandOptions):
    """Options of `convert`, each declared once: type, default and help here, its flag in its `Flag` (the CLI's
    options are generated from this model; tests/cli/test_cli_options.py holds them together)."""

    model_config = ConfigDict(extra="forbid")

    to: Annotated[str | None, Flag("--to", choices=get_args(Format))] = Field(
        None, description="Destination format (default: the other one; hf from transformers' own).")
    verifier: Annotated[str | Path | None, Flag("--verifier", type=str)] = Field(
        None, description="Target model directory, its config.json, or Hub id: fills num_target_layers and the "
        "verifier block, and checks the pair.")
    verifier_name: Annotated[str | None, Flag(None, why="the CLI: the --verifier as given (a Hub id)")] = Field(
        None, description="what to record as verifier.name_or_path (default: the path / hub id)")
    mask_token_id: Annotated[int | None, Flag("--mask-token-id")] = Field(
        None, description="Override/supply the mask token id.")
    target_layer_ids: Annotated[list[int] | None, Flag("--target-layer-ids", parse="ints")] = Field(
        None, description="Override/supply z-lab target layer ids (0-based layer outputs), e.g. 1,9,17,25,33.")
    derive_target_layer_ids: Annotated[bool, Flag("--derive-target-layer-ids")] = Field(
        False, description="Derive missing ids with the published z-lab/SGLang rule (needs --verifier); never done "
        "silently.")
    block_size: Annotated[int | None, Flag("--block-size")] = Field(
        None, description="Override/supply the block size.")
    causal: Annotated[bool | None, Flag("--causal/--non-causal")] = Field(None, description=CAUSAL_HELP)
    dtype: Annotated[str, Flag("--dtype", choices=DTYPE_CHOICES, parse="dtype")] = Field(
        "auto", description="Floating-point dtype written (auto keeps each tensor's).")
    max_shard_size: Annotated[str | None, Flag("--max-shard-size")] = Field(
        None, description="Shard the output, HF syntax (e.g. 5GB).")
    overwrite: Annotated[bool, Flag("--overwrite")] = Field(False, description="Replace a non-empty destination.")
    allow_pickle: Annotated[bool, Flag("--allow-pickle")] = Field(False, description=ALLOW_PICKLE_HELP)
    no_verifier: Annotated[bool, Flag("--no-verifier")] = Field(
        False, description="Write a speculators output that names no verifier (vLLM cannot serve it).")
    source_revision: Annotated[str | None, Flag(None, why="the CLI: the source's resolved commit")] = None
    source_id: Annotated[str | None, Flag(None, why="the CLI: the Hub repo id the source came from (recorded "
                                          "instead of the cache path)")] = None

    def model_post_init(self, context: Any) -> None:  # noqa: ARG002
        if self.max_shard_size is not None:
            try:
                parse_size(self.max_shard_size)
            except ValueError as exc:
                raise UsageError(f"--max-shard-size: {exc}") from None

    def record(self) -> dict[str, Any]:
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in self.__dict__.items()}


@dataclass
class TensorStep:
    source: str | None  # canonical source name (None for derived tensors)
    dest: str | None  # name written (None = dropped)
    action: str  # keep | drop | derive
    reason: str = ""
    dtype: str = ""  # safetensors dtype written
    shape: tuple[int, ...] = ()

    @property
    def nbytes(self) -> int:
        """Bytes written for this tensor (in the output dtype)."""
        return int(np.prod(self.shape, dtype=np.int64)) * DTYPES[self.dtype].itemsize


@dataclass
class ConversionPlan:
    checkpoint: Checkpoint
    spec: DraftSpec  # the destination's spec (overrides applied)
    dest_format: str
    config: dict[str, Any]
    steps: list[TensorStep]
    warnings: list[str] = field(default_factory=list)
    derived: dict[str, bytes] = field(default_factory=dict)  # dest name -> raw little-endian bytes

    @property
    def kept(self) -> list[TensorStep]:
        return [s for s in self.steps if s.dest is not None]

    @property
    def output_bytes(self) -> int:
        return sum(s.nbytes for s in self.kept)

    @property
    def dropped(self) -> dict[str, str]:
        return {s.source: s.reason for s in self.steps if s.action == "drop"}


# ----------------------------------------------------------------------------- planning

def _apply_overrides(spec: DraftSpec, opts: ConvertOptions, warnings: list[str]) -> DraftSpec:
    upd: dict[str, Any] = {}
    if opts.mask_token_id is not None:
        upd["mask_token_id"] = opts.mask_token_id
    if opts.block_size is not None:
        if not MIN_BLOCK_SIZE <= opts.block_size <= MAX_BLOCK_SIZE:
            raise UsageError(f"--block-size must be in [{MIN_BLOCK_SIZE}, {MAX_BLOCK_SIZE}] (an anchor and at least "
                             f"one draft slot), got {opts.block_size}")
        upd["block_size"] = opts.block_size
    if opts.causal is not None:
        upd["layer_causal"] = [opts.causal] * spec.num_layers
        upd["causal_flag"] = opts.causal
    if opts.target_layer_ids is not None:
        if opts.derive_target_layer_ids:
            raise UsageError("give --target-layer-ids or --derive-target-layer-ids, not both")
        upd["target_layer_ids"] = list(opts.target_layer_ids)
    if opts.dtype != "auto":
        upd["dtype"] = opts.dtype
    spec = spec.model_copy(update=upd)
    if opts.verifier is not None:
        spec = _apply_verifier(spec, opts, warnings)
    if opts.derive_target_layer_ids:
        if spec.target_layer_ids is not None:
            warnings.append(f"--derive-target-layer-ids ignored: the checkpoint has target_layer_ids {spec.target_layer_ids}")
        elif spec.num_target_layers is None:
            raise UsageError("--derive-target-layer-ids needs the target's layer count: pass --verifier")
        else:
            ids = mapping.build_target_layer_ids(spec.num_target_layers, spec.num_layers)
            warnings.append(f"target_layer_ids were missing and have been DERIVED with the published rule "
                            f"(z-lab/SGLang build_target_layer_ids({spec.num_target_layers}, {spec.num_layers})) = {ids}; "
                            "if the draft was trained on other layers acceptance will collapse")
            spec = spec.model_copy(update={"target_layer_ids": ids})
    return spec


def _apply_verifier(spec: DraftSpec, opts: ConvertOptions, warnings: list[str]) -> DraftSpec:
    """Record the verifier (its layer count and name) and hold the draft to compat.compatibility_checks:
    the first failure is raised, warnings (a pad mask id) are kept."""
    vpath = Path(opts.verifier)
    cfg_file = vpath if vpath.name == "config.json" else vpath / "config.json"
    name = opts.verifier_name or str(opts.verifier if vpath.name != "config.json" else vpath.parent)
    target = mapping.target_info(read_json(cfg_file), name, file=str(cfg_file))
    if spec.num_target_layers not in (None, target.num_layers):
        warnings.append(f"num_target_layers {spec.num_target_layers} replaced by the verifier's {target.num_layers}")
    spec = spec.model_copy(update={"num_target_layers": target.num_layers,
                                   "verifier": VerifierRef(name_or_path=name, architectures=target.architectures)})
    checks = compat.compatibility_checks(spec, target)
    compat.raise_first_failure(checks, file=cfg_file)
    warnings += [c.message for c in checks if c.status == "warn"]
    return spec


def plan_conversion(ckpt: Checkpoint, opts: ConvertOptions) -> ConversionPlan:
    dest = opts.to or {"speculators": "hf", "hf": "speculators", "transformers": "hf"}[ckpt.format]
    if dest not in get_args(Format):
        raise UsageError(f"--to must be one of {', '.join(get_args(Format))}, not {dest!r}")
    warnings: list[str] = []
    if dest == ckpt.format:
        warnings.append(f"the source is already in the {dest} format: writing a normalized copy (config rewritten "
                        "the way this tool writes it, training-only tensors dropped, overrides applied)")
    if legacy := mapping.legacy_speculative_tokens_warning(ckpt.spec):
        warnings.append(legacy)  # the spec's block_size is kept; both writers derive speculative_tokens from it
    spec = _apply_overrides(ckpt.spec, opts, warnings)
    if dest == "speculators" and spec.verifier is None and not opts.no_verifier:
        raise DFlashError("field `speculators_config.verifier.name_or_path` would be empty: vLLM serves a "
                          "speculators draft only with its verifier named. Pass --verifier (target directory, "
                          "config.json or Hub id), or --no-verifier to write it anyway", file=ckpt.config_file)
    mapping.check_complete(spec, file=ckpt.config_file, raw=ckpt.raw_config)
    config, config_warnings = mapping.spec_to_config(spec, dest)
    config = quantization.carry_config(ckpt.raw_config, config, dest, ckpt.config_file)
    warnings += config_warnings
    ckpt.check_tensors(spec)
    out_dtype = CAST_TARGETS.get(opts.dtype) if opts.dtype != "auto" else None
    if opts.dtype not in ("auto", *CAST_TARGETS):
        raise UsageError(f"--dtype must be one of auto, {', '.join(CAST_TARGETS)}")
    steps: list[TensorStep] = []
    derived: dict[str, bytes] = {}
    for name in sorted(ckpt.tensors):
        info = ckpt.tensors[name]
        rule = catalogue.rule_for(quantization.governing_tensor(name), spec.variant)  # companions: their weight's
        action = catalogue.tensor_action(rule, dest, spec.is_pruned_vocab)
        if action == "drop":
            steps.append(TensorStep(name, None, "drop", rule.drop_reason, info.dtype, info.shape))
        elif action == "derive":
            continue  # written below from d2t (a source copy is checked against it)
        else:
            # --dtype casts the float weights among the cast targets; float8 and integer tensors keep theirs
            dtype = out_dtype if (out_dtype and info.dtype in CAST_TARGETS.values()) else info.dtype
            if dtype != info.dtype and name in ckpt.quantized_names:
                raise DFlashError(f"--dtype {opts.dtype} would cast tensor `{name}`, stored by the draft's "
                                  "quantization scheme: a quantized draft converts with --dtype auto", file=info.file)
            steps.append(TensorStep(name, catalogue.layout_name(name, dest), "keep", "", dtype, info.shape))
    if spec.is_pruned_vocab:
        t2d_name, t2d_rule = catalogue.name("t2d"), catalogue.BY_KEY["t2d"]
        target_ids = ckpt.d2t_target_ids()
        t2d = np.zeros(spec.vocab_size, dtype=bool)
        t2d[target_ids] = True
        if t2d_name in ckpt.tensors:
            found = ckpt.int_values(t2d_name).astype(bool)
            if not np.array_equal(found, t2d):
                raise DFlashError(f"tensor `{t2d_name}` disagrees with `{catalogue.name('d2t')}` (they must describe "
                                  "the same draft vocab)", file=ckpt.tensors[t2d_name].file)
        if catalogue.tensor_action(t2d_rule, dest, True) == "derive":
            derived[t2d_name] = t2d.astype(np.uint8).tobytes()
            steps.append(TensorStep(None, t2d_name, "derive", "rebuilt from d2t", t2d_rule.dtype,
                                    t2d_rule.shape(spec)))
    return ConversionPlan(ckpt, spec, dest, config, steps, warnings, derived)


# ----------------------------------------------------------------------------- execution

class CorruptInput(DFlashError):
    """An input file whose bytes are not those its Hub cache name announces: removed once nothing reads it."""

    def __init__(self, path: Path, message: str):
        super().__init__(message, file=path)
        self.path = path


class _Hashing:
    """hashlib objects fed on a thread of their own (hashlib lets go of the GIL), so that hashing a chunk
    and scanning it for NaN/Inf run side by side; a daemon: a stop signal never waits for it."""

    def __init__(self, *hashes):
        self.hashes, self.chunks, self.done = hashes, queue.Queue(maxsize=4), threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self) -> None:
        while (chunk := self.chunks.get()) is not None:
            for h in self.hashes:
                h.update(chunk)
        self.done.set()

    def update(self, chunk: bytes) -> None:
        self.chunks.put(chunk)

    def finish(self) -> None:
        self.chunks.put(None)
        self.done.wait()


def _has_nonfinite(chunk: bytes, d, scratch: dict) -> bool:
    """Any NaN/Inf among the chunk's values: `bits & nan_mask == nan_value` for some value. Where the
    two are equal (IEEE formats), that is `max(bits & nan_mask) == nan_mask`: two passes, no temporaries."""
    words = np.frombuffer(chunk, dtype=d.bits)
    if d.nan_mask != d.nan_value:
        return bool(((words & d.nan_mask) == d.nan_value).any())
    buf = scratch.get(d.bits)
    if buf is None or len(buf) < len(words):
        buf = scratch[d.bits] = np.empty(len(words), dtype=d.bits)
    masked = np.bitwise_and(words, d.nan_mask, out=buf[:len(words)])
    return len(words) > 0 and int(masked.max()) == d.nan_mask


def _read_inputs(ckpt: Checkpoint, hashes: dict[str, str], nonfinite: list[str], origin: str = "") -> None:
    """sha256 of every input file and the names of float tensors holding NaN/Inf, in one read.

    Runs on the other core while the kernel copies: both passes read from the page cache. A file
    from the Hub cache is also checked against the hash its blob is named by (the one the Hub
    announced): a corrupt download or a blob damaged since ends the conversion and is removed.
    """
    by_file: dict[Path, list[TensorInfo]] = {}
    for info in ckpt.tensors.values():
        by_file.setdefault(info.file, []).append(info)
    scratch: dict = {}
    for f in ckpt.input_files:
        announced = announced_by_cache_name(f)
        h = hashlib.sha256()
        git = hasher("git", f.stat().st_size) if announced and announced[0] == "git" else None
        hashing = _Hashing(h, *([git] if git else []))
        update = hashing.update
        with open(f, "rb") as fh:
            pos = 0
            scan = [] if f.suffix != ".safetensors" else sorted(by_file.get(f, []), key=lambda t: t.start)
            for info in scan:
                if info.start > pos:  # header and padding
                    update(fh.read(info.start - pos))
                d = DTYPES[info.dtype]
                left, bad = info.nbytes, False
                while left:
                    chunk = fh.read(min(left, 8 << 20))
                    if not chunk:
                        raise DFlashError(f"tensor `{info.name}`: file ended early", file=f)
                    update(chunk)
                    if d.is_float and not bad:
                        bad = _has_nonfinite(chunk, d, scratch)
                    left -= len(chunk)
                if bad:
                    nonfinite.append(info.name)
                pos = info.end
            while chunk := fh.read(8 << 20):
                update(chunk)
        hashing.finish()
        hashes[f.name] = h.hexdigest()
        if announced is not None:
            got = (git or h).hexdigest()
            if got != announced[1]:
                label = "sha256" if git is None else "git blob id"
                raise CorruptInput(f, f"{origin}{f.name}: the bytes do not match the {label} the "
                                  f"Hub announced for this file ({announced[1][:16]}..., got {got[:16]}...): the "
                                  "download is corrupt or the cached blob was damaged; it was removed from the "
                                  "cache (rerun to download it again) and nothing was written")


def _write_tensor(plan: ConversionPlan, step: TensorStep, src_handles: dict, dst) -> None:
    ckpt = plan.checkpoint
    if step.source is None:
        dst.write(plan.derived[step.dest])
        return
    info: TensorInfo = ckpt.tensors[step.source]
    if step.dtype == info.dtype and step.source not in ckpt.pickled:
        src = src_handles.get(info.file)
        if src is None:
            src = src_handles[info.file] = open(info.file, "rb")
        copy_range(src, dst, info.start, info.nbytes)
        return
    import torch  # only casts and pickle sources get here

    tensor = ckpt.load_tensor(step.source).to(torch_dtype(step.dtype, tensor=step.dest)).contiguous()
    dst.write(tensor.view(torch.uint8).numpy())  # the buffer itself: no second copy of a cast tensor


def execute(plan: ConversionPlan, dest: Path, opts: ConvertOptions, *,
            on_progress: Callable[[int], None] | None = None,
            before_commit: Callable[[Path], None] | None = None) -> ConversionRecord:
    ckpt = plan.checkpoint
    hashes: dict[str, str] = {}
    nonfinite: list[str] = []
    failure: list[BaseException] = []

    def read_inputs() -> None:
        try:
            _read_inputs(ckpt, hashes, nonfinite, origin=f"Hub repo {opts.source_id}@{opts.source_revision}, "
                         if opts.source_id else "")
        except BaseException as exc:  # noqa: BLE001 - re-raised in the main thread
            failure.append(exc)

    reader = threading.Thread(target=read_inputs, daemon=True)
    reader.start()
    record_warnings = list(plan.warnings)
    with staged_directory(dest, overwrite=opts.overwrite, notes=record_warnings) as tmp:
        _write_weights(plan, tmp, opts.max_shard_size, on_progress)
        (tmp / "config.json").write_text(json.dumps(plan.config, indent=2, allow_nan=False) + "\n")
        for f in ckpt.companion_files:  # engines read them beside the weights; bounded, never unpickled
            (tmp / f.name).write_bytes(read_companion(f))
        reader.join()
        if failure:
            if isinstance(failure[0], CorruptInput):  # the copy is done with it: out of the cache
                discard(failure[0].path)
            raise failure[0]
        nonfinite += [n for n, t in ckpt.pickled.items() if t.is_floating_point() and not t.isfinite().all()]
        if nonfinite:
            raise DFlashError(f"tensor `{nonfinite[0]}` contains NaN or Inf values"
                              + (f" (and {len(nonfinite) - 1} more)" if len(nonfinite) > 1 else ""),
                              file=ckpt.tensors[nonfinite[0]].file)
        record = _record(plan, opts, hashes, record_warnings)
        (tmp / RECORD_NAME).write_text(record.model_dump_json(indent=2) + "\n")
        if before_commit:
            before_commit(tmp)
    return record


def _write_weights(plan: ConversionPlan, tmp: Path, max_shard_size: str | None,
                   on_progress: Callable[[int], None] | None) -> None:
    """The kept tensors into safetensors shards in `tmp` (and their index when there are several), streamed one
    tensor at a time from the source files in the catalogue's order."""
    kept = plan.kept
    sizes = [s.nbytes for s in kept]
    shards = plan_shards(sizes, parse_size(max_shard_size) if max_shard_size else None)
    metadata = dict(plan.checkpoint.metadata) or {"format": "pt"}
    handles: dict = {}
    try:
        weight_map: dict[str, str] = {}
        for shard_name, idx in zip(shard_names(len(shards)), shards):
            head, _ = header_bytes([(kept[i].dest, kept[i].dtype, kept[i].shape) for i in idx], metadata)
            with open(tmp / shard_name, "wb") as dst:
                dst.write(head)
                for i in idx:
                    _write_tensor(plan, kept[i], handles, dst)
                    weight_map[kept[i].dest] = shard_name
                    if on_progress:
                        on_progress(sizes[i])
        if len(shards) > 1:
            write_index(tmp, weight_map, sum(sizes))
    finally:
        for h in handles.values():
            h.close()


def _record(plan: ConversionPlan, opts: ConvertOptions, hashes: dict[str, str], warnings: list[str]
            ) -> ConversionRecord:
    """conversion.json: what was read (with its hashes), what was kept, dropped, renamed and added, and why."""
    ckpt, kept = plan.checkpoint, plan.kept
    return ConversionRecord(
        tool_version=__version__,
        source=opts.source_id or str(ckpt.path),
        source_format=ckpt.format,
        source_revision=opts.source_revision,
        destination_format=plan.dest_format,
        input_files=hashes,
        options=opts.record(),
        tensors_kept=[s.dest for s in kept if s.action == "keep"],
        tensors_dropped=plan.dropped,
        tensors_renamed={ckpt.source_names[s.source]: s.dest for s in kept
                         if s.source and ckpt.source_names[s.source] != s.dest},
        tensors_added={s.dest: s.reason for s in kept if s.action == "derive"},
        files_carried=[f.name for f in ckpt.companion_files],
        config_changes=mapping.config_changes(ckpt.raw_config, ckpt.format, plan.config, plan.dest_format),
        warnings=warnings,
    )


@dataclass
class Converted:
    """What a conversion did: the record written, and (publish.convert_and_publish) the validation
    report and the push."""

    output: Path
    record: ConversionRecord
    validation: Any = None  # validate.report.ValidationReport
    push: Any = None  # hub.client.PushResult

    def to_dict(self) -> dict[str, Any]:
        r = self.record
        out = {"output": str(self.output), "source_format": r.source_format, "destination_format": r.destination_format,
               "tensors_kept": len(r.tensors_kept), "tensors_dropped": r.tensors_dropped,
               "tensors_added": r.tensors_added, "config_changes": [c.model_dump(mode="json") for c in r.config_changes],
               "warnings": r.warnings, "source_revision": r.source_revision}
        if self.validation is not None:
            out["validation"] = self.validation.summary().model_dump(mode="json")
        if self.push is not None:
            out["push"] = self.push.to_dict()
        return out


def convert(src: str | Path, dest: str | Path, opts: ConvertOptions | None = None, *,
            on_progress: Callable[[int, int], None] | None = None,
            on_warning: Callable[[str], None] | None = None,
            before_commit: Callable[[Path], None] | None = None) -> Converted:
    """Library entry point: convert the checkpoint at `src` into `dest` (see ConvertOptions).

    on_progress(bytes_written, total_bytes) counts output bytes; on_warning gets each planning warning
    before any byte is written; before_commit(staged_dir) runs on the complete staged output before it
    is renamed into place (an exception there leaves nothing at `dest`): publish.convert_and_publish
    validates there.
    """
    opts = opts or ConvertOptions()
    dest = Path(dest)
    ckpt = open_checkpoint(src, allow_pickle=opts.allow_pickle, block_size=opts.block_size)
    check_destination(dest, opts.overwrite, sources=(ckpt.path,))
    plan = plan_conversion(ckpt, opts)
    for w in plan.warnings if on_warning else ():
        on_warning(w)
    total, done = plan.output_bytes, 0

    def advance(n: int) -> None:
        nonlocal done
        done += n
        on_progress(done, total)

    record = execute(plan, dest, opts, on_progress=advance if on_progress else None, before_commit=before_commit)
    return Converted(dest, record)
