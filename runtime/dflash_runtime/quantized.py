"""Quantized drafts in the runtime: each quantized module's weight dequantized on load by compressed-tensors' own
compressor for its scheme (the library's `decompress`, the path its model-free dequantizer takes), then run in
the runtime's compute dtype like any other weight.

What this runs is the weights' quantization error only: activations (W8A8's per-token input quantization) and a
quantized kv cache are computed unquantized, so a kv-cache scheme is refused (NotRunnable: validate exits 1).
ModelOpt FP8 is per-tensor float8_e4m3 with a float32 scale: it is decompressed through the same compressor with
the equivalent compressed-tensors scheme.
"""

from __future__ import annotations

import functools
from typing import Callable

import torch

from dflash_convert.errors import NotRunnable
from dflash_convert.format import quantization
from dflash_convert.io.checkpoint import Checkpoint


def library_scheme(q: quantization.Quantization, group: str):
    """compressed-tensors' QuantizationScheme of config group `group`, its format resolved as the library does."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig, QuantizationScheme

    if q.method == quantization.MODELOPT:
        fp8 = QuantizationArgs(num_bits=8, type="float", strategy="tensor", symmetric=True, dynamic=False)
        return QuantizationScheme(targets=["Linear"], weights=fp8, format="float-quantized")
    config = QuantizationConfig.model_validate(q.raw)
    scheme = config.config_groups[group]
    scheme.format = scheme.format or config.format
    return scheme


def dequantizers(ckpt: Checkpoint, device: str = "cpu") -> dict[str, Callable[[], torch.Tensor]]:
    """`M.weight` -> a function giving the dequantized weight of quantized module M (in its scale's dtype), via the
    library: called one module at a time as the draft loads, so only one float copy is transient at once."""
    q = ckpt.quantization
    if q is None:
        return {}
    if q.kv_cache:
        raise NotRunnable(f"field `{quantization.CONFIG_KEY}.kv_cache_scheme`: the runtime computes the draft's "
                          "kv cache unquantized, so it cannot run this draft as served", file=ckpt.config_file)
    schemes = {s.group: library_scheme(q, s.group) for s in q.schemes}

    def dequantize(module: quantization.QuantizedModule) -> torch.Tensor:
        from compressed_tensors.compressors import BaseCompressor

        scheme = schemes[module.scheme.group]
        state = {suffix: ckpt.load_tensor(name, device) for suffix, name in module.tensors.items()}
        return BaseCompressor.get_value_from_registry(scheme.format).decompress(state, scheme)["weight"]

    return {f"{m.module}.weight": functools.partial(dequantize, m) for m in ckpt.quantized_modules()}
