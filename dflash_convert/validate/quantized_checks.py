"""inspect / validate checks of a quantized draft: its scheme per config group, and what each engine does with it
(format/engines.py QUANTIZED_SERVING, read from the engines' loaders)."""

from __future__ import annotations

from dflash_convert.format import quantization
from dflash_convert.format.compat import Check, make_check
from dflash_convert.format.engines import QUANTIZED_SERVING, QuantizedServing
from dflash_convert.io.checkpoint import Checkpoint


def _engine_check(row: QuantizedServing, q: quantization.Quantization, modules) -> Check:
    name, who = f"quantized_serving.{row.key}", f"{row.title} {row.version}"
    if q.method not in row.methods:
        return make_check(name, False, f"{who} does not apply quant_method {q.method!r}: it loads the stored "
                          "values without their scales (wrong drafts)", value=q.method, bad="warn")
    fc = next((m for m in modules if m.module == "fc"), None)
    if fc is not None and not row.fc_quantized:
        return make_check(name, False, f"{who} builds `fc` as a plain nn.Linear: the quantized fc's scales are "
                          "ignored (pack-quantized: fc.weight is never loaded), so the drafts are wrong; keep fc "
                          "unquantized (add `fc` to the ignore list)", value="fc", bad="warn")
    cpu = f"; CPU build kernels: {row.cpu_kernels}" if row.cpu_kernels else ""
    return make_check(name, True, f"{who}: linear layers run through the {q.method} method; context K/V: "
                      f"{row.context_kv}{cpu}", value=q.method)


def quantized_checks(ckpt: Checkpoint) -> list[Check]:
    """`quantization` (the scheme of each config group, what it quantizes) and one check per engine row."""
    q = ckpt.quantization
    if q is None:
        return []
    modules = ckpt.quantized_modules()
    checks = [make_check("quantization", True, "; ".join(quantization.summary(q, modules)),
                         value=[s.label for s in q.schemes])]
    return checks + [_engine_check(row, q, modules) for row in QUANTIZED_SERVING]
