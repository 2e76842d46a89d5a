"""Compare two checkpoints, also across formats: what engines would run, field by field and tensor by tensor.

Configs are compared as DraftSpecs (so aux ids and target ids, or `sliding_window_non_causal`
and `dflash_config.causal`, compare by meaning), through `engine_views.trained_view`. Config keys that
no engine reads (`auto_map`, version stamps, ...) and engines that would serve one side unlike its
training but not the other are reported as informational: they do not make two drafts different. Tensors are compared by canonical name; byte-equal
tensors are settled without torch, others get a max absolute difference. Tensors that a conversion
drops by design (verifier copies, t2d) are listed but do not make two drafts different. Files beside
the weights that engines read (mask_embedding.pt) are compared byte for byte, and count.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field, computed_field

from dflash_convert.format import catalogue, engine_views, engines, mapping
from dflash_convert.io.checkpoint import Checkpoint, open_checkpoint, read_companion
from dflash_convert.format.configs import ConfigChange, Format
from dflash_convert.errors import UsageError


# Fields one side may simply not know (z-lab configs name no verifier): differ only when both are known.
OPTIONAL_FIELDS = ("num_target_layers", "verifier")
# Provenance: what the draft says about where it came from, not what it computes (the verifier it names, which a
# conversion with --verifier rewrites). Listed apart; a difference counts only with --strict.
METADATA_FIELDS = ("verifier",)


TensorStatus = Literal["equal", "differs", "shape_differs", "only_in_a", "only_in_b"]
FileStatus = Literal["equal", "differs", "only_in_a", "only_in_b"]


class ConfigDifference(BaseModel):
    """One engine-read config value that differs: its value in A and in B."""

    a: Any
    b: Any


class EngineServing(BaseModel):
    """An engine that serves one side as trained and the other not (informational)."""

    a: bool
    b: bool
    a_engine: str = Field(description="engine table row that reads A (vLLM: per format)")
    b_engine: str
    divergences: list[str] = Field(default_factory=list, description="'A: field: consequence' / 'B: ...'")


class TensorDifference(BaseModel):
    """One tensor an engine loads, compared by canonical name."""

    status: TensorStatus
    dtype: tuple[str, str] | None = Field(None, description="safetensors dtype in A and in B (null when one "
                                          "side lacks the tensor)")
    shape: tuple[list[int], list[int]] | None = None
    max_abs_diff: float | str | None = Field(None, description="max |a - b| (0 when byte-equal); a string "
                                             "('nan', 'inf') when not finite; null when not compared")


class DiffReport(BaseModel):
    """`diff --json`: two checkpoints compared by what an engine would run (schemas/diff-report.schema.json)."""

    a: str
    b: str
    format_a: Format
    format_b: Format
    tolerance: float = 0.0
    config_differences: dict[str, ConfigDifference] = Field(default_factory=dict,
                                                            description="engine-read config field -> values")
    metadata_differences: dict[str, ConfigDifference] = Field(
        default_factory=dict, description="provenance fields (the verifier the draft names) -> values: they count "
        "only with --strict")
    strict: bool = Field(False, description="--strict: metadata differences count")
    tensors: dict[str, TensorDifference] = Field(default_factory=dict, description="canonical name -> comparison")
    ignored_tensors: dict[str, str] = Field(default_factory=dict, description="'a:NAME' / 'b:NAME' -> why it "
                                            "does not count (dropped by conversion by design)")
    informational: list[ConfigChange] = Field(default_factory=list, description="config keys that differ but no "
                                              "engine reads (A -> B); they do not count")
    engines: dict[str, EngineServing] = Field(default_factory=dict, description="engine -> whether it serves A and "
                                              "B as trained, where that differs (informational)")
    files: dict[str, FileStatus] = Field(default_factory=dict, description="files beside the weights that engines "
                                         "read (mask_embedding.pt), compared byte for byte")

    @computed_field(description="no config difference (no metadata difference either, with --strict), every tensor "
                                "equal (within tolerance), every engine-read file beside the weights equal")
    @property
    def equivalent(self) -> bool:
        return (not self.config_differences and not (self.strict and self.metadata_differences)
                and all(t.status == "equal" for t in self.tensors.values())
                and all(f == "equal" for f in self.files.values()))

    def render(self, console, quiet: bool = False) -> None:
        """Differences, then a one-line verdict, on `console` (stdout); quiet: without the info lines."""
        from rich.markup import escape

        if not quiet:
            console.print(escape(f"{self.a} ({self.format_a}) vs {self.b} ({self.format_b})"))
        for key, v in self.config_differences.items():
            console.print(escape(f"  config {key}: {_shown(v.a)} != {_shown(v.b)}"))
        for key, v in self.metadata_differences.items():
            console.print(escape(f"  metadata {key}: {_shown(v.a)} != {_shown(v.b)}"
                                 + ("" if self.strict else " (provenance: counts only with --strict)")))
        for name, t in self.tensors.items():
            if t.status != "equal":
                extra = f" (max abs diff {t.max_abs_diff})" if t.max_abs_diff is not None else ""
                console.print(escape(f"  tensor {name}: {t.status}{extra}"))
        for name, f in self.files.items():
            if f != "equal":
                console.print(escape(f"  file {name}: {f}"))
        for c in ([] if quiet else self.informational):
            console.print(escape(f"  info: config key {c.key} {c.change} (no engine reads it)"))
        for name, e in ({} if quiet else self.engines).items():
            console.print(escape(f"  info: {name} serves A {'as trained' if e.a else 'unlike its training'} and B "
                                 f"{'as trained' if e.b else 'unlike its training'}: " + "; ".join(e.divergences)))
        equal = sum(t.status == "equal" for t in self.tensors.values())
        console.print(f"{equal}/{len(self.tensors)} tensors equal, {len(self.config_differences)} config differences, "
                      + (f"{len(self.metadata_differences)} metadata difference(s)"
                         f"{'' if self.strict else ' (not counted)'}, " if self.metadata_differences else "") +
                      f"{len(self.ignored_tensors)} tensors ignored (dropped by design)"
                      + (f", {sum(f == 'equal' for f in self.files.values())}/{len(self.files)} files equal"
                         if self.files else "") + ": "
                      + ("[green]equivalent[/green]" if self.equivalent else "[red]different[/red]"))


def _shown(value: Any) -> str:
    """A config value as JSON writes it (`absent` for a missing key), not as Python's repr."""
    import json

    return "absent" if value is None else json.dumps(value)


def diff_report_schema() -> dict[str, Any]:
    return DiffReport.model_json_schema(mode="serialization")


def _same_bytes(a, b) -> bool:
    if a.nbytes != b.nbytes:
        return False
    with open(a.file, "rb") as fa, open(b.file, "rb") as fb:
        fa.seek(a.start)
        fb.seek(b.start)
        left = a.nbytes
        while left:
            n = min(left, 16 << 20)
            if fa.read(n) != fb.read(n):
                return False
            left -= n
    return True


def _engine_tensors(ckpt: Checkpoint) -> tuple[set[str], dict[str, str]]:
    """Names an engine loads (what survives conversion to HF), and the rest with the reason."""
    used, ignored = set(), {}
    for name in ckpt.tensors:
        rule = catalogue.rule_for(name)
        if rule is None:
            used.add(name)  # unknown tensors count: they make a difference
            continue
        if catalogue.loaded_by_engines(rule, ckpt.spec):
            used.add(name)
        else:
            ignored[name] = rule.drop_reason
    return used, ignored


def diff_checkpoints(a: str | Path, b: str | Path, *, tolerance: float = 0.0, allow_pickle: bool = False,
                     strict: bool = False) -> DiffReport:
    """`strict`: a difference in provenance (METADATA_FIELDS) makes the two different too."""
    if not (math.isfinite(tolerance) and tolerance >= 0):
        raise UsageError(f"--tolerance must be a finite number >= 0, got {tolerance}")
    ca, cb = open_checkpoint(a, allow_pickle=allow_pickle), open_checkpoint(b, allow_pickle=allow_pickle)
    result = DiffReport(a=str(a), b=str(b), format_a=ca.format, format_b=cb.format, tolerance=tolerance,
                        strict=strict)
    va, vb = engine_views.trained_view(ca.spec), engine_views.trained_view(cb.spec)
    for key in {**va, **vb}:  # both sides' keys: a family key only one side has is a difference too
        x, y = va.get(key), vb.get(key)
        if x != y and not (key in OPTIONAL_FIELDS and (x is None or y is None)):
            found = result.metadata_differences if key in METADATA_FIELDS else result.config_differences
            found[key] = ConfigDifference(a=x, b=y)
    schemes_a, schemes_b = ([s.label for s in c.quantization.schemes] if c.quantization else None for c in (ca, cb))
    if schemes_a != schemes_b:  # a quantized copy against its source (format/quantization.py)
        result.config_differences["quantization_config"] = ConfigDifference(a=schemes_a, b=schemes_b)
    result.informational = [ConfigChange(**c) for c in mapping.config_changes(ca.raw_config, ca.format,
                                                                             cb.raw_config, cb.format)
                            if not engines.engine_reads(c["key"])]
    for name in engines.ENGINE_NAMES:
        view_a, view_b = engine_views.serving_view(ca, name), engine_views.serving_view(cb, name)
        if view_a.as_trained != view_b.as_trained:
            result.engines[name] = EngineServing(
                a=view_a.as_trained, b=view_b.as_trained, a_engine=view_a.engine, b_engine=view_b.engine,
                divergences=[f"{side}: {d.field}: {d.consequence}" for side, v in (("A", view_a), ("B", view_b))
                             for d in v.divergences if d.severity == "error"])
    used_a, ignored_a = _engine_tensors(ca)
    used_b, ignored_b = _engine_tensors(cb)
    result.ignored_tensors = {**{f"a:{k}": v for k, v in ignored_a.items()},
                              **{f"b:{k}": v for k, v in ignored_b.items()}}
    for name in sorted(used_a | used_b):
        ta, tb = ca.tensors.get(name) if name in used_a else None, cb.tensors.get(name) if name in used_b else None
        if ta is None or tb is None:
            result.tensors[name] = TensorDifference(status="only_in_a" if tb is None else "only_in_b")
            continue
        entry: dict[str, Any] = {"dtype": (ta.dtype, tb.dtype), "shape": (list(ta.shape), list(tb.shape))}
        if ta.shape != tb.shape:
            entry["status"] = "shape_differs"
        elif ta.dtype == tb.dtype and name not in ca.pickled and name not in cb.pickled and _same_bytes(ta, tb):
            entry.update(status="equal", max_abs_diff=0.0)
        else:
            import torch

            x, y = ca.load_tensor(name), cb.load_tensor(name)
            if x.is_floating_point() or y.is_floating_point():
                d = (x.double() - y.double()).abs().max().item() if x.numel() else 0.0
            else:
                d = float((x.long() - y.long()).abs().max().item()) if x.numel() else 0.0
            finite = bool(torch.isfinite(torch.tensor(d)))
            entry.update(max_abs_diff=d if finite else str(d),
                         status="equal" if finite and d <= tolerance else "differs")
        result.tensors[name] = TensorDifference(**entry)
    files_a, files_b = ({f.name: f for f in c.companion_files} for c in (ca, cb))
    for name in sorted(files_a.keys() | files_b.keys()):
        fa, fb = files_a.get(name), files_b.get(name)
        result.files[name] = ("only_in_a" if fb is None else "only_in_b" if fa is None else
                              "equal" if read_companion(fa) == read_companion(fb) else "differs")
    return result
