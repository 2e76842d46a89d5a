"""inspect / validate checks of a quantized draft: its scheme per config group, and what each engine does with it
(format/engines.py QUANTIZED_SERVING, read from the engines' loaders)."""

from __future__ import annotations

from dflash_convert.errors import DFlashError
from dflash_convert.format import catalogue, quantization
from dflash_convert.format.compat import Check, make_check
from dflash_convert.format.engines import QUANTIZED_SERVING, QuantizedServing
from dflash_convert.io.checkpoint import Checkpoint


def _layer_specific(q: quantization.Quantization, layer_modules: list[str]) -> str | None:
    """An ignore entry or target that matches a decoder layer's module by its `layers.N.` name but not by its bare
    projection name, or the reverse: what an engine that drops the layer names decides differently."""
    for entry in [*q.ignore, *(t for s in q.schemes for t in s.targets if t != "Linear")]:
        if any(quantization.matches(m, entry) != quantization.matches(m.rsplit(".", 1)[-1], entry)
               for m in layer_modules):
            return entry
    return None


def _engine_check(row: QuantizedServing, q: quantization.Quantization, modules, layer_modules) -> Check:
    name, who = f"quantized_serving.{row.key}", f"{row.title} {row.version}"
    if q.method not in row.methods:
        return make_check(name, False, f"{who} does not apply quant_method {q.method!r}: it loads the stored "
                          "values without their scales (wrong drafts)", value=q.method, bad="warn")
    fc = next((m for m in modules if f"{m.module}.weight" == catalogue.name("fc")), None)
    if fc is not None and not row.fc_quantized:
        return make_check(name, False, f"{who} builds `fc` as a plain nn.Linear: the quantized fc's scales are "
                          "ignored (pack-quantized: fc.weight is never loaded), so the drafts are wrong; keep fc "
                          "unquantized (add `fc` to the ignore list)", value="fc", bad="warn")
    entry = None if row.layer_names else _layer_specific(q, layer_modules)
    if entry is not None:
        return make_check(name, False, f"{who} matches the quantization config against its decoder layers' bare "
                          f"projection names (no `layers.N.`): `{entry}` selects other modules there than in "
                          "the checkpoint, which it then loads with the wrong method", value=entry, bad="warn")
    cpu = f"; CPU build: {row.cpu_kernels}" if row.cpu_kernels else ""
    return make_check(name, True, f"{who}: linear layers run through the {q.method} method; context K/V: "
                      f"{row.context_kv}{cpu}", value=q.method)


def catalogue_shapes(ckpt: Checkpoint) -> dict[str, tuple]:
    """What the checks hold against the tensor catalogue: the unquantized shapes the stored tensors stand for;
    where the quantization tensors disagree with the config (the `quantization` check fails, naming the tensor),
    the stored tensors the catalogue knows, so that one defect is not reported again as unknown tensors."""
    try:
        return ckpt.logical_shapes()
    except DFlashError:
        return {n: i.shape for n, i in ckpt.tensors.items() if catalogue.rule_for(n) is not None}


def quantized_tensor_names(ckpt: Checkpoint) -> frozenset[str]:
    """The stored tensors of the quantized modules (none where they disagree with the config)."""
    try:
        return ckpt.quantized_names
    except DFlashError:
        return frozenset()


def quantized_checks(ckpt: Checkpoint) -> list[Check]:
    """`quantization` (the scheme of each config group, what it quantizes) and one check per engine row; a
    quantization tensor that disagrees with the config fails `quantization`, naming it."""
    try:
        q = ckpt.quantization
        if q is None:
            return []
        modules = ckpt.quantized_modules()
    except DFlashError as exc:
        return [make_check("quantization", False, str(exc))]
    checks = [make_check("quantization", True, "; ".join(quantization.summary(q, modules)),
                         value=[s.label for s in q.schemes])]
    # the decoder layers' linear modules: the catalogue's per-layer matrices
    layer_modules = [n.removesuffix(".weight") for n, shape in catalogue_shapes(ckpt).items()
                     if len(shape) == 2 and (rule := catalogue.rule_for(n)) is not None and rule.per_layer]
    return checks + [_engine_check(row, q, modules, layer_modules) for row in QUANTIZED_SERVING]


def activation_caveat(ckpt: Checkpoint, checks: list[Check]) -> list[Check]:
    """The real engine quantizes a W8A8 draft's activations, the runtime computes them in float: a step where their
    acceptance differs is then no verdict on the draft, so engine_acceptance_agrees warns instead of failing and
    says why (the outputs must still be equal: they are the target's)."""
    q = ckpt.quantization
    quantized_inputs = [s for s in q.schemes if s.input_activations] if q else []
    if not quantized_inputs:
        return checks
    why = (f"; not a verdict on the draft: the engine quantizes its activations ({quantized_inputs[0].label}), "
           "the runtime computes them in float")
    return [c.model_copy(update={"status": "warn", "message": c.message + why})
            if c.name.startswith("engine_acceptance_agrees") and c.status == "fail" else c for c in checks]
