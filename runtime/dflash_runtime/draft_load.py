"""Loading a draft: a checkpoint directory (either format) or an opened Checkpoint -> a DFlashDraft, after refusing
what the runtime cannot run exactly (an unknown kind, family keys its head does not apply, an unsupported RoPE).
Tensors are read through dflash_convert's checkpoint reader, one at a time from their byte ranges.
"""

from __future__ import annotations

from pathlib import Path

import torch

from dflash_convert.errors import DFlashError, NotRunnable
from dflash_convert.format import catalogue, compat, mapping
from dflash_convert.format.configs import DraftSpec
from dflash_convert.io.checkpoint import Checkpoint, open_checkpoint

from . import heads
from .attention import select_backend
from .draft import DFlashDraft
from .quantized import dequantizers
from .rope import SUPPORTED_ROPE, rope_kind


def resolve_layer_causal(spec: DraftSpec, causal: bool | None) -> list[bool]:
    """Per-layer causality: the checkpoint's (docs/formats.md section 5), or one explicit flag for all layers."""
    return [bool(causal)] * spec.num_layers if causal is not None else list(spec.layer_causal)


def _check_runnable(spec: DraftSpec, file: str) -> None:
    if spec.variant not in heads.KINDS:
        raise NotRunnable(f"{spec.variant} drafts are not supported by the runtime", file=file)
    try:
        mapping.check_complete(spec)  # block size, mask id and target ids: what every engine needs
    except DFlashError as exc:
        raise DFlashError(str(exc), file=file) from None
    applied = heads.KINDS[spec.variant].applies  # any other non-neutral family key is refused
    unsupported = [f for f in mapping.non_qwen3_features(spec) if f.partition("=")[0] not in applied]
    if unsupported:
        raise NotRunnable(f"config sets {', '.join(unsupported)}: the runtime implements the plain Qwen3 layer math "
                          "only, so its logits would not be this draft's", file=file)
    if rope_kind(spec) not in ("default", *SUPPORTED_ROPE):
        raise NotRunnable(f"RoPE type {rope_kind(spec)!r} is not supported by the runtime "
                          f"(supported: default, {', '.join(SUPPORTED_ROPE)})", file=file)
    compat.raise_first_failure([compat.mask_range_check(spec.mask_token_id, spec.vocab_size,
                                                        source="the draft config")], file=file)


def load_draft(source: str | Path | Checkpoint, *, device="cpu", dtype: torch.dtype = torch.float32,
               backend: str = "auto", causal: bool | None = None, compile: bool = False,
               window_per_query: bool = False, mask_embedding: torch.Tensor | None = None) -> DFlashDraft:
    """Load a draft from a checkpoint directory (either format) or an opened Checkpoint.

    Tensors are read one at a time from their byte ranges and cast to `dtype` on `device`.
    `causal` overrides every layer's causality; `compile` runs the decode step through torch.compile
    (CUDA graphs on CUDA; the first step of each shape compiles, which takes seconds to minutes).
    `window_per_query` gives sliding layers the serving engines' per-query window instead of training's.
    `mask_embedding` [H] embeds the mask slots, as vLLM and SGLang do with a draft's mask_embedding.pt (loaded by
    the caller, who consents to unpickling it: Checkpoint.load_mask_embedding).
    """
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise DFlashError("device cuda was asked for, but CUDA is not available on this machine")
    ckpt = source if isinstance(source, Checkpoint) else open_checkpoint(source)
    spec = ckpt.spec
    file = str(ckpt.config_file)
    _check_runnable(spec, file)
    layer_causal = resolve_layer_causal(spec, causal)
    sliding = any(t == "sliding_attention" for t in spec.layer_types) and spec.sliding_window is not None
    name = select_backend(backend, layer_causal, sliding, device, dtype)
    ckpt.check_tensors(spec)
    tensors: dict[str, torch.Tensor] = {}
    dequantized = dequantizers(ckpt, str(device))  # a quantized draft: compressed-tensors decompresses
    for tensor in catalogue.expected_shapes(spec):
        t = dequantized[tensor]() if tensor in dequantized else ckpt.load_tensor(tensor, str(device))
        tensors[tensor] = t.to(dtype) if t.is_floating_point() else t  # d2t stays integer
    if spec.is_pruned_vocab:
        ckpt.d2t_target_ids()  # raises on ids outside the target vocab or repeated
    return DFlashDraft(spec, tensors, layer_causal=layer_causal, backend=name, device=device, dtype=dtype,
                       compile=compile, window_per_query=window_per_query,
                       mask_embedding=mask_embedding)
