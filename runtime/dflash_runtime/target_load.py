"""Loading a target: a local model directory (safetensors only) or a transformers PreTrainedModel -> a Target.

Loading refuses incomplete weights before any tensor is read (transformers would fill missing parameters with
random values): the weight files' headers are compared with the model built from its config on the meta device.
A target larger than one device can be placed by transformers + accelerate (`device_map`, `max_memory`: GPUs,
then CPU memory, then disk offload); the draft then runs on the device of the target's last layers
(`Target.draft_device`).
"""

from __future__ import annotations

import logging
import re
import tempfile
import warnings
from pathlib import Path

import torch

from dflash_convert.errors import DFlashError
from dflash_convert.io.checkpoint import weight_headers

from .target import Target


def _model_names(model, stored: list[str]) -> dict[str, str] | None:
    """Stored name -> the model's parameter name, renamed as transformers renames on load; None when
    a weight converter (fused or split tensors) applies, so names cannot be compared one to one."""
    meta = model.state_dict()
    prefix = getattr(model, "base_model_prefix", "") or None
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        transforms = get_model_conversion_mapping(model, None, None)
        renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
    except (ImportError, TypeError, AttributeError):  # another transformers: its base-prefix rule only
        renamings = converters = None
    out = {}
    for key in stored:
        if renamings is not None:
            new, converted = rename_source_key(key, renamings, converters, prefix, meta)
            if converted is not None:
                return None
        else:
            new = key
            if prefix and new not in meta and f"{prefix}.{new}" in meta:
                new = f"{prefix}.{new}"
            elif prefix and new.startswith(prefix + ".") and new[len(prefix) + 1:] in meta:
                new = new[len(prefix) + 1:]
        out[key] = new
    return out


def check_target_weights(model, path: Path) -> None:
    """Refuse weight files that do not hold exactly the model's parameters and persistent buffers
    (`model` built on the meta device from the config; nothing is loaded). Tied parameters count as
    present when any of their group is stored; the model's own ignore patterns are respected."""
    stored = {name: info.shape for name, info in weight_headers(path).items()}
    names = _model_names(model, list(stored))
    if names is None:
        return  # fused/split conversions: transformers' loading report is checked after loading instead
    expected = model.state_dict()  # persistent only: rotary inv_freq and other non-persistent buffers are not in it
    present = set(names.values())
    tied = dict(getattr(model, "all_tied_weights_keys", None) or {})
    for target_name, source_name in list(tied.items()):
        if target_name in present or source_name in present:
            present |= {target_name, source_name}
    ignore_missing = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_missing", None) or []]
    ignore_unexpected = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []]
    missing = [k for k in expected if k not in present and not any(p.search(k) for p in ignore_missing)]
    if missing:
        more = f" and {len(missing) - 1} more of its {len(expected)} parameters are" if len(missing) > 1 else " is"
        raise DFlashError(f"target weights are incomplete: `{missing[0]}`{more} missing from its safetensors files "
                          "(transformers would fill them with random values)", file=path)
    ignored = {k for k, new in names.items() if new not in expected and any(p.search(k) for p in ignore_unexpected)}
    unexpected = [k for k, new in names.items() if new not in expected and k not in ignored]
    if unexpected:
        more = f" and {len(unexpected) - 1} more stored tensors are" if len(unexpected) > 1 else " is"
        raise DFlashError(f"target weights do not match its config: `{unexpected[0]}`{more} not parameters of "
                          f"{type(model).__name__}", file=path)
    for key, new in names.items():
        if key in ignored:  # a part transformers does not load (a vision tower, MTP heads)
            continue
        want = tuple(expected[new].shape)
        if tuple(stored[key]) != want:
            raise DFlashError(f"target tensor `{key}` has shape {list(stored[key])}, its config implies {list(want)}",
                              file=path)


def auto_class(config, path=None):
    """transformers' Auto class that builds this target: its causal LM, else (a multimodal wrapper with
    no causal-LM class, like Kimi-K2.5) its image-text-to-text model, which generates text the same way."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText):
        if type(config) in auto._model_mapping:
            return auto
    if getattr(config, "auto_map", None):  # remote code: transformers itself decides (trust_remote_code)
        return AutoModelForCausalLM
    raise DFlashError(f"transformers {transformers.__version__} has no causal-LM (or image-text-to-text) class for "
                      f"model_type {getattr(config, 'model_type', '?')!r}", file=path)


def meta_model(path: Path, trust_remote_code: bool = False):
    """The target's model class built from its config on the meta device (no memory, no weights)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return auto_class(config, path).from_config(config, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        raise DFlashError(f"cannot build the target model from its config: {str(exc).splitlines()[0]}",
                          file=path) from None


def default_attention(model) -> str:
    """The attention implementation a target runs with unless told: sdpa where its class supports it,
    else eager (gpt-oss: its attention sinks have no sdpa path in transformers)."""
    return "sdpa" if getattr(model, "_supports_sdpa", False) else "eager"


def load_target(source, *, device="cpu", dtype: torch.dtype = torch.float32, attn_implementation: str | None = None,
                trust_remote_code: bool = False, device_map: str | dict | None = None,
                max_memory: dict | None = None, compile: bool = False) -> Target:
    """A Target from a local model directory (safetensors only) or a transformers PreTrainedModel.

    `device_map` ("auto", "balanced", "sequential" or an explicit map) and `max_memory` ({0: bytes,
    "cpu": bytes}) hand placement to transformers + accelerate; what fits nowhere is offloaded to a
    temporary folder kept as long as the Target lives. Without them the whole target goes to `device`.
    `compile`: static cache and compiled verify step (see the module docstring); `attn_implementation`:
    transformers' name, None for default_attention.
    """
    from transformers import PreTrainedModel

    if isinstance(source, PreTrainedModel):
        model = source
        attn_implementation = attn_implementation or default_attention(model)
        if getattr(model.config, "_attn_implementation", None) != attn_implementation:
            model.set_attn_implementation(attn_implementation)
        model = model.to(device=device, dtype=dtype)
        return Target(model, compile=compile)
    path = Path(source)
    if not (path / "config.json").exists():
        raise DFlashError("not a model directory (no config.json)", file=path)
    meta = meta_model(path, trust_remote_code)
    check_target_weights(meta, path)
    attn_implementation = attn_implementation or default_attention(meta)
    auto = auto_class(meta.config, path)
    del meta
    offload = None
    kwargs = {}
    if max_memory is not None and device_map is None:
        device_map = "auto"
    if device_map is not None:
        offload = tempfile.TemporaryDirectory(prefix="dflash-offload-")
        kwargs = dict(device_map=device_map, offload_folder=offload.name,
                      max_memory={int(k) if str(k).isdigit() else k: v for k, v in max_memory.items()}
                      if max_memory else None)
    elif torch.device(device).type == "cuda":
        kwargs = dict(device_map=str(torch.device(device)))  # straight to the GPU, no CPU copy
    placement_log = logging.getLogger("accelerate.big_modeling")  # "some parameters are on the meta device"
    level = placement_log.level
    placement_log.setLevel(logging.ERROR)  # the placement is reported by the caller (Target.offloaded)
    try:
        model, info = auto.from_pretrained(
            str(path), dtype=dtype, attn_implementation=attn_implementation, trust_remote_code=trust_remote_code,
            use_safetensors=True, output_loading_info=True, **kwargs)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise DFlashError(f"cannot load the target model: {str(exc).splitlines()[0]}", file=path) from None
    finally:
        placement_log.setLevel(level)
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # transformers' own report, for checkpoints whose names a converter rewrites
        raise DFlashError(f"target weights are incomplete: `{missing[0]}` and {len(missing) - 1} more were not in "
                          "its files (transformers filled them with random values)", file=path)
    target = Target(model if device_map is not None or torch.device(device).type == "cuda" else model.to(device),
                    compile=compile)
    target._offload_folder = offload  # removed with the Target
    return target
