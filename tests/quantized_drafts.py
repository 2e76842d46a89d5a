"""Quantized copies of a draft, made with compressed-tensors the way llm-compressor makes them.

llm-compressor (0.14) pins transformers <= 5.17 and compressed-tensors 0.19, so the tests use compressed-tensors
alone: a preset scheme targets the draft's linear modules (`Linear`, lm_head ignored), each weight's scale and
zero point come from its min/max (llm-compressor's default min-max observer) through the library's
`calculate_qparams`, the library's compressor for the scheme's format writes the stored tensors, and
`ModelCompressor.update_config` writes `quantization_config` into config.json as llm-compressor's save does.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from compressed_tensors.compressors import BaseCompressor, ModelCompressor
from compressed_tensors.compressors.format import infer_module_format
from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus, preset_name_to_scheme
from compressed_tensors.quantization.utils import calculate_qparams
from compressed_tensors.utils.match import match_quantizable_tensors
from safetensors.torch import load_file, save_file

# name -> (compressed-tensors preset, weight group size to use at the tiny dims or None)
SCHEMES = {
    "fp8_dynamic": ("FP8_DYNAMIC", None),  # FP8 channel weights, FP8 per-token dynamic activations
    "w4a16": ("W4A16", 32),  # INT4 group weights packed into int32
    "w8a8_int8": ("W8A8", None),  # INT8 channel weights, INT8 per-token dynamic activations
    "w8a16_int8": ("W8A16", 32),
}
IGNORE = ["lm_head"]
# a dflash2 or DSpark draft: only the decoder layers and fc quantized (the family heads stay in float)
FAMILY_IGNORE = [*IGNORE, "re:.*_conv\\..*", "re:candidate_selector\\..*", "re:markov_head\\..*",
                 "re:confidence_head\\..*"]


def _observe(weight: torch.Tensor, args) -> tuple[torch.Tensor, torch.Tensor]:
    """(min, max) per the strategy's scale shape, as llm-compressor's min-max observer reduces them."""
    if args.strategy == "tensor":
        return weight.amin().reshape(1), weight.amax().reshape(1)
    if args.strategy == "channel":
        return weight.amin(dim=1, keepdim=True), weight.amax(dim=1, keepdim=True)
    out, inp = weight.shape
    grouped = weight.reshape(out, inp // args.group_size, args.group_size)
    return grouped.amin(dim=-1), grouped.amax(dim=-1)


def scheme_for(name: str, targets: list[str] | None = None):
    preset, group_size = SCHEMES[name]
    scheme = preset_name_to_scheme(preset, targets or ["Linear"])
    if group_size is not None:
        scheme.weights.group_size = group_size
    scheme.format = infer_module_format(torch.nn.Linear, scheme).value
    return scheme


def quantize_draft(src: Path, dest: Path, name: str, ignore: list[str] = IGNORE) -> Path:
    """A copy of the draft at `src` quantized with scheme `name` (a key of SCHEMES), written to `dest`, the modules
    `ignore` names left in float."""
    return quantize_draft_groups(src, dest, {"group_0": (name, ["Linear"])}, ignore)


def quantize_draft_groups(src: Path, dest: Path, groups: dict[str, tuple[str, list[str]]],
                          ignore: list[str] = IGNORE) -> Path:
    """A copy of the draft at `src` with one config group per entry of `groups` (group name -> (a key of SCHEMES,
    its targets)), each module quantized by the first group that targets it; with groups of different formats the
    model-level format is `mixed-precision`, as llm-compressor writes it."""
    schemes = {group: scheme_for(name, targets) for group, (name, targets) in groups.items()}
    tensors = load_file(src / "model.safetensors")
    out: dict[str, torch.Tensor] = {}
    for scheme in schemes.values():
        compressor = BaseCompressor.get_value_from_registry(scheme.format)
        for module, tensor in match_quantizable_tensors(tensors, ignore=ignore, targets=scheme.targets):
            weight = tensors.pop(tensor)
            if weight.ndim != 2:
                tensors[tensor] = weight
                continue
            scale, zero_point = calculate_qparams(*_observe(weight, scheme.weights), scheme.weights)
            state = {"weight": weight, "weight_scale": scale.to(weight.dtype), "weight_zero_point": zero_point}
            out.update({f"{module}.{k}": v.contiguous() for k, v in compressor.compress(state, scheme).items()})
    out.update(tensors)
    dest.mkdir(parents=True, exist_ok=True)
    save_file(out, dest / "model.safetensors")
    shutil.copy(src / "config.json", dest / "config.json")
    formats = {scheme.format for scheme in schemes.values()}
    config = QuantizationConfig(config_groups=schemes, ignore=list(ignore),
                                format=formats.pop() if len(formats) == 1 else "mixed-precision",
                                quantization_status=QuantizationStatus.COMPRESSED)
    ModelCompressor(quantization_config=config).update_config(str(dest))
    return dest


def make_modelopt_fp8(src: Path, dest: Path) -> Path:
    """A ModelOpt FP8 copy in the public form vLLM's modelopt reader accepts (per-tensor FP8 weights, float32
    scalar weight and input scales, quant_algo FP8 in config.json), built by hand: nvidia-modelopt is not
    installable here."""
    tensors = load_file(src / "model.safetensors")
    out = {}
    for name, weight in tensors.items():
        if weight.ndim == 2 and name.endswith(".weight"):
            module = name[: -len(".weight")]
            scale = (weight.float().abs().amax() / torch.finfo(torch.float8_e4m3fn).max).reshape(())
            out[name] = (weight.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
            out[f"{module}.weight_scale"] = scale
            out[f"{module}.input_scale"] = torch.tensor(1.0 / 64)
        else:
            out[name] = weight
    dest.mkdir(parents=True, exist_ok=True)
    save_file(out, dest / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "FP8", "exclude_modules": ["lm_head"]}
    (dest / "config.json").write_text(json.dumps(config, indent=2))
    return dest
