"""Quantized drafts: the `quantization_config` a draft's config.json carries, read as the libraries that write it
define it, and the companion tensors each scheme stores beside (or instead of) a linear module's `weight`.

Two writers are read:
- compressed-tensors (what llm-compressor saves, `quant_method: compressed-tensors`): `config_groups`, each a scheme
  with `targets`, `weights` and `input_activations` quantization args; a `format` per group or for the whole model
  (`float-quantized`, `int-quantized`, `naive-quantized`: one 8-bit value per weight element; `pack-quantized`:
  several sub-8-bit integers packed into int32 words); an `ignore` list; `kv_cache_scheme`. The args' defaults are
  the library's (8 bits, int, symmetric, static; the strategy is `group` when a group size is given, else `tensor`).
- ModelOpt FP8 (`quant_method: modelopt`, `quant_algo: FP8`), in the public form vLLM's reader accepts: per-tensor
  float8_e4m3 weights with a float32 scalar `weight_scale` and static `input_scale`, `exclude_modules` (or `ignore`).

Each quantized module `M` with weight [out, in] stores, by scheme:
- 8-bit formats: `M.weight` in the quantized dtype (F8_E4M3 for float, I8 for int), shape [out, in];
- pack-quantized: `M.weight_packed` I32 [out, ceil(in * bits / 32)] and `M.weight_shape` I64 [2] = [out, in];
- static weights: `M.weight_scale` (a float dtype) of shape [1] (tensor), [out, 1] (channel),
  [out, ceil(in / group)] (group), [ceil(out / b0), ceil(in / b1)] (block); asymmetric ones `M.weight_zero_point`
  (pack-quantized: packed along the output dimension into I32 [ceil(out * bits / 32), groups]);
- static input activations: `M.input_scale` [1] (and `M.input_zero_point` when asymmetric); dynamic ones store none;
- a kv-cache scheme: `self_attn.k_scale` and `self_attn.v_scale` per attention layer.

Nothing here imports torch: shapes and dtype codes come from the safetensors headers, the packed `weight_shape`
values from a reader the caller passes.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Callable

from dflash_convert.errors import DFlashError
from dflash_convert.format.dtypes import DTYPES

CONFIG_KEY = "quantization_config"
COMPRESSED_TENSORS = "compressed-tensors"
MODELOPT = "modelopt"
# compressed-tensors formats whose values this project reads and dequantizes; the others (nvfp4/mxfp4 packing,
# sparse formats) are named in the refusal.
EIGHT_BIT_FORMATS = ("float-quantized", "int-quantized", "naive-quantized")
PACKED_FORMAT = "pack-quantized"
READ_FORMATS = (*EIGHT_BIT_FORMATS, PACKED_FORMAT)
# Every tensor suffix a quantized linear module may carry besides `weight`.
COMPANION_SUFFIXES = ("weight_packed", "weight_shape", "weight_scale", "weight_zero_point", "weight_global_scale",
                      "input_scale", "input_zero_point", "input_global_scale", "output_scale")
KV_SCALE_SUFFIXES = ("k_scale", "v_scale")
_MODULE_RE = re.compile(r"(.+)\.(" + "|".join(COMPANION_SUFFIXES + ("weight",)) + r")")


@dataclass(frozen=True)
class Args:
    """One tensor's quantization arguments (compressed-tensors' QuantizationArgs, the fields that set storage)."""

    num_bits: int
    type: str  # "int" or "float"
    strategy: str  # tensor, channel, group, block, token, tensor_group
    symmetric: bool
    dynamic: bool | str
    group_size: int | None = None
    block_structure: tuple[int, int] | None = None

    @property
    def label(self) -> str:
        how = f"group {self.group_size}" if self.strategy == "group" else self.strategy
        kind = "FP" if self.type == "float" else "INT"
        return f"{kind}{self.num_bits} {how}{'' if self.symmetric else ' asymmetric'}"


@dataclass(frozen=True)
class Scheme:
    group: str  # the config group's name
    targets: tuple[str, ...]
    weights: Args | None
    input_activations: Args | None
    format: str

    @property
    def label(self) -> str:
        """W8A8 / W4A16 style, then the storage: e.g. `W8A8 (weights FP8 channel, activations FP8 token dynamic)`."""
        w = self.weights.num_bits if self.weights else 16
        a = self.input_activations.num_bits if self.input_activations else 16
        parts = [f"weights {self.weights.label}"] if self.weights else []
        if self.input_activations:
            act = self.input_activations
            parts.append(f"activations {act.label} {'dynamic' if act.dynamic else 'static'}")
        return f"W{w}A{a} ({', '.join(parts)}; {self.format})"


@dataclass(frozen=True)
class Quantization:
    method: str  # compressed-tensors or modelopt
    schemes: tuple[Scheme, ...]
    ignore: tuple[str, ...]
    kv_cache: dict | None
    raw: dict

    def scheme_for(self, module: str) -> Scheme | None:
        """The scheme a linear module is quantized with (None: left in its float dtype), as compressed-tensors
        matches names (`matches`), `Linear` any linear module; the first group that targets it."""
        if any(matches(module, pattern) for pattern in self.ignore):
            return None
        for scheme in self.schemes:
            if "Linear" in scheme.targets or any(matches(module, t) for t in scheme.targets):
                return scheme
        return None


def matches(module: str, pattern: str) -> bool:
    """Whether a config target / ignore entry names this module, as compressed-tensors' `match_name` (0.20) and vLLM's
    readers match: a `re:` pattern by `re.match` (anchored at the start only), any other name exactly, so a bare
    projection name (`down_proj`) names no module `layers.N.mlp.down_proj`; ModelOpt's `*` wildcards over the whole
    name."""
    if pattern.startswith("re:"):
        return re.match(pattern[3:], module) is not None
    if "*" in pattern:  # ModelOpt's exclude_modules are wildcards
        return re.fullmatch(re.escape(pattern).replace(r"\*", ".*"), module) is not None
    return module == pattern


def _error(message: str, file) -> DFlashError:
    return DFlashError(f"field `{CONFIG_KEY}`: {message}", file=file)


def _args(raw: Any, where: str, file) -> Args | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _error(f"`{where}` must be an object", file)
    group_size = raw.get("group_size")
    strategy = raw.get("strategy") or ("group" if group_size else "tensor")
    kind = raw.get("type", "int")
    bits = raw.get("num_bits", 8)
    if kind not in ("int", "float") or type(bits) is not int or not 1 <= bits <= 8:
        raise _error(f"`{where}` has type {kind!r} with num_bits {bits!r}: only int or float, 1 to 8 bits", file)
    if strategy == "group" and (type(group_size) is not int or group_size < 1):
        raise _error(f"`{where}` has strategy group without a positive group_size", file)
    block = raw.get("block_structure")
    if strategy == "block" and not (isinstance(block, list) and len(block) == 2):
        raise _error(f"`{where}` has strategy block without a block_structure [rows, columns]", file)
    return Args(bits, kind, strategy, bool(raw.get("symmetric", True)), raw.get("dynamic", False), group_size,
                tuple(block) if block else None)


def _compressed_tensors(raw: dict, file) -> Quantization:
    groups = raw.get("config_groups")
    if not isinstance(groups, dict) or not groups:
        raise _error("`config_groups` must be a non-empty object", file)
    model_format = raw.get("format")
    schemes = []
    for name, group in groups.items():
        if not isinstance(group, dict) or not isinstance(group.get("targets"), list):
            raise _error(f"`config_groups.{name}.targets` must be a list", file)
        fmt = group.get("format") or model_format or "naive-quantized"
        if fmt not in READ_FORMATS:
            raise _error(f"format {fmt!r} of group `{name}` is not read here (read: {', '.join(READ_FORMATS)})",
                         file)
        weights = _args(group.get("weights"), f"config_groups.{name}.weights", file)
        if weights is None:
            raise _error(f"group `{name}` quantizes no weights (activation-only schemes are not read here)", file)
        if fmt == PACKED_FORMAT and weights.type != "int":
            raise _error(f"group `{name}` packs {weights.type} weights: pack-quantized holds integers", file)
        schemes.append(Scheme(name, tuple(group["targets"]), weights,
                              _args(group.get("input_activations"), f"config_groups.{name}.input_activations", file),
                              fmt))
    ignore = raw.get("ignore") or []
    if not isinstance(ignore, list):
        raise _error("`ignore` must be a list", file)
    return Quantization(COMPRESSED_TENSORS, tuple(schemes), tuple(ignore), raw.get("kv_cache_scheme"), raw)


def _modelopt(raw: dict, file) -> Quantization:
    inner = raw.get("quantization", raw)
    algo = str(inner.get("quant_algo", "")).upper()
    if algo != "FP8":
        raise _error(f"ModelOpt quant_algo {algo or None!r} is not read here (read: FP8, per-tensor)", file)
    fp8 = Args(8, "float", "tensor", True, False)
    scheme = Scheme("FP8", ("Linear",), fp8, fp8, "float-quantized")
    ignore = inner.get("exclude_modules", inner.get("ignore", []))
    kv = {"type": "float", "num_bits": 8} if inner.get("kv_cache_quant_algo") else inner.get("kv_cache_scheme")
    return Quantization(MODELOPT, (scheme,), tuple(ignore), kv, raw)


def read(config: dict, file=None) -> Quantization | None:
    """The draft's quantization (None: not quantized), or a one-line error naming the field."""
    raw = config.get(CONFIG_KEY)
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise _error("must be an object", file)
    method = raw.get("quant_method")
    if method == COMPRESSED_TENSORS:
        return _compressed_tensors(raw, file)
    if method == MODELOPT:
        return _modelopt(raw, file)
    raise _error(f"quant_method {method!r} is not read here (read: {COMPRESSED_TENSORS}, {MODELOPT} FP8)", file)


# ----------------------------------------------------------------------------- companion tensors

def split_name(tensor: str) -> tuple[str, str] | None:
    """(module, suffix) of a weight or companion tensor name, None for any other."""
    m = _MODULE_RE.fullmatch(tensor)
    return (m.group(1), m.group(2)) if m else None


def role(tensor: str) -> str | None:
    """What a quantization tensor is, for inspect's tensor table (None: not one)."""
    parts = split_name(tensor)
    if parts and parts[1] != "weight":
        return f"{parts[1]} (quantization)"
    if tensor.rsplit(".", 1)[-1] in KV_SCALE_SUFFIXES:
        return "quantization: kv-cache scale"
    return None


def governing_tensor(tensor: str) -> str:
    """The catalogue tensor whose conversion rule a stored tensor follows: a companion its module's `weight`, a
    kv-cache scale its layer's `k_proj.weight`; any other tensor itself."""
    parts = split_name(tensor)
    if parts and parts[1] != "weight":
        return f"{parts[0]}.weight"
    head, _, last = tensor.rpartition(".")
    if last in KV_SCALE_SUFFIXES and head.endswith("self_attn"):
        return f"{head}.k_proj.weight"
    return tensor


def carry_config(source_config: dict, config: dict, dest_format: str, file=None) -> dict:
    """The output config with the source's `quantization_config` at its top level, where vLLM (either format: its
    config loader copies the key from config.json onto the draft's config) and SGLang read it; refused for the
    transformers layout, whose renamed modules (`encoder.fc`) the config's targets and ignore list do not name."""
    raw = source_config.get(CONFIG_KEY)
    if raw is None:
        return config
    if dest_format == "transformers":
        raise DFlashError(f"field `{CONFIG_KEY}`: a quantized draft is not written in transformers' layout (its "
                          "module names differ from those the quantization config targets); convert --to hf",
                          file=file)
    return {**config, CONFIG_KEY: raw}


def _scale_shape(args: Args, out: int, inp: int) -> tuple[int, ...]:
    if args.strategy == "tensor":
        return (1,)
    if args.strategy == "channel":
        return (out, 1)
    if args.strategy == "group":
        return (out, math.ceil(inp / args.group_size))
    if args.strategy == "block":
        return (math.ceil(out / args.block_structure[0]), math.ceil(inp / args.block_structure[1]))
    raise ValueError(args.strategy)


def stored_weight_dtype(scheme: Scheme) -> str:
    if scheme.format == PACKED_FORMAT:
        return "I32"
    return "F8_E4M3" if scheme.weights.type == "float" else "I8"


def expected_companions(q: Quantization, scheme: Scheme, out: int, inp: int) -> dict[str, tuple[tuple, str | None]]:
    """Suffix -> (shape, dtype code; None: any float dtype) of everything a module [out, in] of `scheme` stores
    (`weight` / `weight_packed` included). A scalar ModelOpt scale may also be stored with shape []."""
    w, act = scheme.weights, scheme.input_activations
    want: dict[str, tuple[tuple, str | None]] = {}
    if scheme.format == PACKED_FORMAT:
        want["weight_packed"] = ((out, math.ceil(inp * w.num_bits / 32)), "I32")
        want["weight_shape"] = ((2,), "I64")
    else:
        want["weight"] = ((out, inp), stored_weight_dtype(scheme))
    scale_dtype = "F32" if q.method == MODELOPT else None
    if not w.dynamic:
        want["weight_scale"] = (_scale_shape(w, out, inp), scale_dtype)
        if not w.symmetric:
            zp = _scale_shape(w, out, inp)
            if scheme.format == PACKED_FORMAT and w.strategy in ("group", "channel"):
                want["weight_zero_point"] = ((math.ceil(out * w.num_bits / 32), zp[1]), "I32")
            else:
                want["weight_zero_point"] = (zp, "I8" if w.type == "int" else None)
    if act is not None and act.dynamic is False:
        want["input_scale"] = ((1,), scale_dtype)
        if not act.symmetric:
            want["input_zero_point"] = ((1,), "I8" if act.type == "int" else None)
    return want


@dataclass(frozen=True)
class QuantizedModule:
    module: str
    scheme: Scheme
    shape: tuple[int, int]  # the unquantized weight's [out, in]
    tensors: dict[str, str]  # suffix -> stored tensor name


def _dtype_ok(code: str, want: str | None) -> bool:
    return DTYPES.get(code) is not None and (DTYPES[code].is_float if want is None else code == want)


def _logical_shape(module: str, have: dict, read_ints: Callable[[str], list[int]]) -> tuple[int, int]:
    if f"{module}.weight_packed" in have:
        values = read_ints(f"{module}.weight_shape") if f"{module}.weight_shape" in have else None
        if not values or len(values) != 2:
            raise DFlashError(f"tensor `{module}.weight_shape` is missing or not two values ([out, in] of the "
                              f"packed `{module}.weight_packed`)")
        return int(values[0]), int(values[1])
    shape = have[f"{module}.weight"][0]
    if len(shape) != 2:
        raise DFlashError(f"tensor `{module}.weight` has shape {list(shape)}: a quantized linear weight is 2-D")
    return shape[0], shape[1]


def quantized_modules(q: Quantization, have: dict[str, tuple[tuple, str]],
                      read_ints: Callable[[str], list[int]]) -> list[QuantizedModule]:
    """Every module the config quantizes, its stored tensors checked (shapes and dtypes) against the scheme.

    `have`: stored tensor name -> (shape, dtype code). A module counts as targeted when it is linear (a 2-D
    weight or a packed one, not a norm or an embedding), matched by a scheme and not ignored; one the `Linear`
    class target alone matches and that is stored in float with no companion is taken for a module of another
    class (names do not say which modules were nn.Linear). Raises the first problem, one line naming the
    tensor: a companion nothing targets, a missing or mis-shaped one.
    """
    modules: dict[str, None] = {}
    for name, (shape, _dtype) in have.items():
        parts = split_name(name)
        if parts and (parts[1] != "weight" or len(shape) == 2):
            modules.setdefault(parts[0])
    found = []
    for module in modules:
        stored = {s: f"{module}.{s}" for s in ("weight", *COMPANION_SUFFIXES) if f"{module}.{s}" in have}
        linear = not module.endswith("norm") and not module.endswith("embed_tokens")
        scheme = q.scheme_for(module) if linear else None
        if scheme is None:
            extra = sorted(set(stored) - {"weight"})
            if extra:
                raise DFlashError(f"tensor `{stored[extra[0]]}` is a quantization tensor, but `{CONFIG_KEY}` "
                                  f"quantizes no module `{module}` (ignored or matched by no config group)")
            continue
        unquantized = DTYPES[have[stored["weight"]][1]] if set(stored) == {"weight"} else None
        if unquantized is not None and unquantized.is_float and unquantized.itemsize >= 2 and \
                not any(t != "Linear" and matches(module, t) for t in scheme.targets):
            continue  # matched by class only, stored in float: not an nn.Linear where it was quantized
        out, inp = _logical_shape(module, have, read_ints)
        want = expected_companions(q, scheme, out, inp)
        for suffix, (shape, dtype) in want.items():
            name = f"{module}.{suffix}"
            if name not in have:
                raise DFlashError(f"tensor `{name}` is missing: group `{scheme.group}` ({scheme.label}) stores it "
                                  f"for module `{module}`")
            got_shape, got_dtype = have[name]
            scalar = q.method == MODELOPT and shape == (1,) and tuple(got_shape) == ()
            if tuple(got_shape) != shape and not scalar:
                raise DFlashError(f"tensor `{name}` has shape {list(got_shape)}, group `{scheme.group}` "
                                  f"({scheme.label}) stores {list(shape)} for a [{out}, {inp}] weight")
            if not _dtype_ok(got_dtype, dtype):
                raise DFlashError(f"tensor `{name}` is {got_dtype}, group `{scheme.group}` ({scheme.label}) "
                                  f"stores {dtype or 'a float dtype'}")
        unknown = sorted(set(stored) - set(want))
        if unknown:
            raise DFlashError(f"tensor `{stored[unknown[0]]}` is not stored by group `{scheme.group}` "
                              f"({scheme.label})")
        found.append(QuantizedModule(module, scheme, (out, inp), {s: stored[s] for s in want}))
    return found


def logical_shapes(q: Quantization | None, have: dict[str, tuple[tuple, str]],
                   read_ints: Callable[[str], list[int]]) -> dict[str, tuple]:
    """Name -> shape of the unquantized tensors the stored ones stand for: what the tensor catalogue checks
    (companions left out, a packed weight as its [out, in]). Unquantized drafts: the stored shapes."""
    if q is None:
        return {n: s for n, (s, _d) in have.items()}
    modules = {m.module: m for m in quantized_modules(q, have, read_ints)}
    shapes = {}
    for name, (shape, _dtype) in have.items():
        parts = split_name(name)
        if parts and parts[0] in modules:
            if parts[1] in ("weight", "weight_packed"):
                shapes[f"{parts[0]}.weight"] = modules[parts[0]].shape
        elif not (q.kv_cache and name.rsplit(".", 1)[-1] in KV_SCALE_SUFFIXES):
            shapes[name] = shape
    return shapes


def kv_scale_tensors(q: Quantization | None, names) -> list[str]:
    return [n for n in names if q is not None and q.kv_cache and n.rsplit(".", 1)[-1] in KV_SCALE_SUFFIXES]


def summary(q: Quantization, modules: list[QuantizedModule]) -> list[str]:
    """One line per config group: its scheme and the modules it quantizes; then what is left unquantized."""
    lines = []
    for scheme in q.schemes:
        mine = [m.module for m in modules if m.scheme is scheme]
        lines.append(f"{q.method} group `{scheme.group}`: {scheme.label}, {len(mine)} modules"
                     + (f" ({_short(mine)})" if mine else ""))
    if q.ignore:
        lines.append(f"ignored (kept in float): {', '.join(q.ignore)}")
    if q.kv_cache:
        lines.append(f"kv cache: {q.kv_cache.get('type', '?')}{q.kv_cache.get('num_bits', '?')}")
    return lines


def _short(modules: list[str]) -> str:
    kinds = sorted({re.sub(r"layers\.\d+\.", "layers.*.", m) for m in modules})
    return ", ".join(kinds)


def memory_plan_tensors(modules: list[QuantizedModule], tensors: dict, names) -> list:
    """The memory plan's view of the draft tensors `names` (infos from `tensors`): a quantized module's weight
    counted as the float tensor of its unquantized shape that the runtime holds once dequantized (the stored
    bytes are read and freed module by module)."""
    from dataclasses import replace

    by_weight = {f"{m.module}.weight": m for m in modules}
    out = [tensors[n] for n in names if n in tensors and n not in by_weight]
    for name in names:
        if name in by_weight:
            m = by_weight[name]
            stored = tensors[next(iter(m.tensors.values()))]
            out.append(replace(stored, name=name, dtype="F32", shape=tuple(m.shape)))
    return out
