"""`inspect`: what a checkpoint is and what engines will read from it, from headers only.

Reads config.json and safetensors headers; imports torch only for `scan=True` (NaN/Inf and
degenerate-value checks), so it answers in a fraction of a second even for an 8B-sized draft.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from . import catalogue, mapping
from .checkpoint import open_checkpoint
from .dtypes import DTYPES


def inspect_checkpoint(path: str | Path, *, scan: bool = False, allow_pickle: bool = False) -> dict[str, Any]:
    from .checks import checkpoint_checks

    ckpt = open_checkpoint(path, allow_pickle=allow_pickle)
    spec = ckpt.spec
    tensors = []
    params = 0
    for name in sorted(ckpt.tensors):
        info = ckpt.tensors[name]
        rule = catalogue.rule_for(name, spec.variant)
        tensors.append({"name": name, "dtype": info.dtype, "shape": list(info.shape),
                        "file": info.file.name, "role": rule.role if rule else "unknown"})
        if rule and catalogue.tensor_action(rule, "hf", spec.is_pruned_vocab) == "keep":
            params += math.prod(info.shape)
    float_dtypes = sorted({t["dtype"] for t in tensors if DTYPES[t["dtype"]].is_float})
    checks = checkpoint_checks(ckpt, scan=scan)
    aux = mapping.aux_ids_from_target(spec.target_layer_ids) if spec.target_layer_ids is not None else None
    return {
        "path": str(ckpt.path),
        "format": spec.source_format,
        "variant": spec.variant,
        "block_size": spec.block_size,
        "speculative_tokens": spec.block_size - 1 if spec.block_size else None,
        "mask_token_id": spec.mask_token_id,
        "target_layer_ids": spec.target_layer_ids,
        "aux_hidden_state_layer_ids": aux,
        "num_target_layers": spec.num_target_layers,
        "layer_types": spec.layer_types,
        "layer_causal": spec.layer_causal,
        "causal_flag": spec.causal_flag,
        "sliding_window": spec.sliding_window if "sliding_attention" in spec.layer_types else None,
        "vocab_size": spec.vocab_size,
        "draft_vocab_size": spec.draft_vocab_size or spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "target_hidden_size": spec.target_hidden_size or spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "verifier": spec.verifier.name_or_path if spec.verifier else None,
        "dtype": float_dtypes[0] if len(float_dtypes) == 1 else float_dtypes,
        "parameters": params,
        "files": [f.name for f in ckpt.input_files],
        "tensors": tensors,
        "checks": [c.model_dump() for c in checks],
        "problems": [c.model_dump() for c in checks if c.status in ("fail", "warn")],
        "ok": not any(c.status == "fail" for c in checks),
    }
