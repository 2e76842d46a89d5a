"""A checkpoint directory on disk: its config (as a DraftSpec), its tensors, and how to read them.

Opening reads config.json and safetensors headers only (no torch). Tensor values are read one at
a time, on demand, by `load_tensor` (torch). Pickle `.bin` weights are refused unless the caller
asks for them, and are then loaded with `weights_only=True`.
"""

from __future__ import annotations

import stat
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from dflash_convert.format import catalogue, foreign, mapping, quantization
from dflash_convert.format.configs import DraftSpec
from dflash_convert.format.dtypes import DTYPES, code_for_torch, torch_dtype
from dflash_convert.errors import DFlashError
from dflash_convert.io.reading import MAX_INDEX_BYTES, read_bounded, read_json
from dflash_convert.io.safetensors import INDEX_NAME, SINGLE_NAME, TensorInfo, read_header

CONFIG_NAME = "config.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")  # torch.save files: they can run code when unpickled


def is_pickle_weight_file(name: str) -> bool:
    """A pickle weight file by its name (a companion such as mask_embedding.pt is not weights)."""
    return name.endswith(PICKLE_SUFFIXES) and Path(name).name not in catalogue.COMPANION_FILES


@dataclass
class Checkpoint:
    path: Path
    raw_config: dict[str, Any]
    spec: DraftSpec
    tensors: dict[str, TensorInfo]  # canonical name -> where its bytes are
    source_names: dict[str, str]  # canonical name -> name in the file (differs only after a RENAME)
    weight_files: list[Path]
    index_file: Path | None
    metadata: dict[str, str]  # safetensors __metadata__ (of the first shard)
    pickled: dict[str, Any] = field(default_factory=dict)  # name -> torch.Tensor, only with allow_pickle
    companion_files: list[Path] = field(default_factory=list)  # catalogue.COMPANION_FILES present beside the weights

    @property
    def format(self) -> str:
        return self.spec.source_format

    @property
    def config_file(self) -> Path:
        return self.path / CONFIG_NAME

    @property
    def input_files(self) -> list[Path]:
        return [self.config_file, *([self.index_file] if self.index_file else []), *self.weight_files,
                *self.companion_files]

    def check_tensors(self, spec: DraftSpec | None = None) -> None:
        """Every tensor the spec implies is present with its shape, and nothing unknown is (raises the first
        problem catalogue.tensor_problems finds)."""
        spec = spec or self.spec
        problems = catalogue.tensor_problems(spec, self.logical_shapes())
        if problems:
            p = problems[0]
            info = self.tensors.get(p.tensor)
            where = info.file if info else (self.weight_files[0] if self.weight_files else self.path)
            raise DFlashError(p.message, file=where)

    @cached_property
    def quantization(self) -> quantization.Quantization | None:
        return quantization.read(self.raw_config, self.config_file)

    def quantized_modules(self) -> list[quantization.QuantizedModule]:
        """The modules the config quantizes, their stored tensors checked against it (format/quantization.py)."""
        return [] if self.quantization is None else self._against_config(quantization.quantized_modules)

    @cached_property
    def quantized_names(self) -> frozenset[str]:
        """Every stored tensor of a quantized module (its quantized weight and companions) and kv-cache scales."""
        names = {n for m in self.quantized_modules() for n in m.tensors.values()}
        return frozenset(names | set(quantization.kv_scale_tensors(self.quantization, self.tensors)))

    def logical_shapes(self) -> dict[str, tuple]:
        """Name -> shape of the unquantized tensors the stored ones stand for (format/quantization.py): what the
        tensor catalogue checks. A quantization tensor that disagrees with the config raises, naming it."""
        return self._against_config(quantization.logical_shapes)

    def _against_config(self, read):
        """`read(quantization, stored name -> (shape, dtype), int values of a tensor)`, where a stored tensor that
        disagrees with the config is an error of the weights file (a bad quantization_config is config.json's)."""
        q = self.quantization
        have = {n: (i.shape, i.dtype) for n, i in self.tensors.items()}
        try:
            return read(q, have, lambda n: self.int_values(n).tolist())
        except DFlashError as exc:
            raise DFlashError(str(exc), file=self.weight_files[0] if self.weight_files else self.path) from None

    def int_values(self, name: str):
        """A small integer / bool tensor (the vocab maps) as a numpy array, read without torch."""
        import numpy as np

        if name in self.pickled:  # torch is loaded already for pickle checkpoints
            return self.pickled[name].cpu().numpy()
        info = self.tensors[name]
        with open(info.file, "rb") as f:
            f.seek(info.start)
            data = f.read(info.nbytes)
        d = DTYPES[info.dtype]
        if d.is_float:
            raise DFlashError(f"tensor `{name}` is {info.dtype}; expected an integer or bool tensor", file=info.file)
        return np.frombuffer(data, dtype=d.numpy).reshape(info.shape)

    def d2t_target_ids(self):
        """Target id of every draft id of a pruned draft (catalogue.d2t_target_ids), checked."""
        d2t = catalogue.name("d2t")
        ids = catalogue.d2t_target_ids(self.int_values(d2t))
        vocab, file = self.spec.vocab_size, self.tensors[d2t].file
        lo, hi, dup = catalogue.target_id_span(ids)
        if lo < 0 or hi >= vocab:
            raise DFlashError(f"tensor `{d2t}` maps draft ids outside the target vocab [0, {vocab})", file=file)
        if dup:
            raise DFlashError(f"tensor `{d2t}` maps two draft ids to the same target id", file=file)
        return ids

    def load_mask_embedding(self, *, allow_pickle: bool):
        """The trained mask embedding [hidden] in mask_embedding.pt, as vLLM and SGLang read it (a tensor, or a dict
        with `embedding` and a `mask_token_id` that must be the draft's), or None when there is none.

        The file is a pickle: without `allow_pickle` this raises instead of opening it; with it, torch.load
        runs with weights_only=True on bytes read bounded.
        """
        f = next((p for p in self.companion_files if p.name == catalogue.MASK_EMBEDDING_FILE), None)
        if f is None:
            return None
        if not allow_pickle:
            raise DFlashError("a pickle; pass --allow-pickle to load it with torch.load(weights_only=True)", file=f)
        import io

        import torch

        data = read_companion(f)
        try:
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - torch raises many types for corrupt/unsafe pickles
            raise DFlashError(f"cannot load with weights_only=True: {str(exc).splitlines()[0][:200]}", file=f) from None
        if isinstance(state, dict):
            if state.get("per_position"):
                raise DFlashError("per-position mask embeddings are served by no engine (SGLang refuses them)", file=f)
            saved_id = state.get("mask_token_id", self.spec.mask_token_id)
            if type(saved_id) is not int or saved_id != self.spec.mask_token_id:
                shown = saved_id if type(saved_id) is int else repr(saved_id)[:40]
                raise DFlashError(f"field `mask_token_id` is {shown}, the draft's is "
                                  f"{self.spec.mask_token_id}: engines refuse the pair", file=f)
            state = state.get("embedding")
        if not isinstance(state, torch.Tensor) or not state.is_floating_point():
            raise DFlashError("holds no float tensor (expected a tensor or a dict with `embedding`)", file=f)
        if state.numel() != self.spec.hidden_size:
            raise DFlashError(f"embedding of shape {list(state.shape)}: {state.numel()} values, the draft's hidden "
                              f"size is {self.spec.hidden_size}", file=f)
        if not bool(state.isfinite().all()):
            raise DFlashError("embedding contains NaN or Inf values", file=f)
        return state.reshape(-1)

    def load_tensor(self, name: str, device: str = "cpu"):
        """One tensor as torch.Tensor, read from its byte range (never the whole file)."""
        import torch

        if name in self.pickled:
            return self.pickled[name].to(device)
        info = self.tensors[name]
        dtype = torch_dtype(info.dtype, tensor=name, file=info.file)
        with open(info.file, "rb") as f:
            f.seek(info.start)
            buf = bytearray(info.nbytes)
            if f.readinto(buf) != info.nbytes:
                raise DFlashError(f"tensor `{name}`: file ended early", file=info.file)
        if not buf:
            return torch.empty(info.shape, dtype=dtype, device=device)
        return torch.frombuffer(buf, dtype=dtype).reshape(info.shape).to(device)


def _shard_path(path: Path, name: object, index: Path) -> Path:
    """The file a weight_map entry names: a plain file name in the checkpoint directory.

    The name is checked, not where it resolves to: in the Hub cache every file is a symlink into
    ../../blobs/, and a local checkpoint may link its shards anywhere its owner chose.
    """
    if not isinstance(name, str):
        raise DFlashError(f"weight_map entry {str(name)[:60]!r} is not a file name", file=index)
    if (not name or name in (".", "..") or "/" in name or "\\" in name or "\0" in name
            or Path(name).is_absolute() or len(name.encode("utf-8", "replace")) > 255):
        raise DFlashError(f"weight_map names {name[:80]!r}: a shard must be a plain file name in the checkpoint "
                          "directory (no '/', '..' or absolute path)", file=index)
    f = path / name
    if not f.exists():
        raise DFlashError(f"shard {name!r} listed in weight_map does not exist", file=index)
    if not f.is_file():
        raise DFlashError(f"shard {name!r} listed in weight_map is not a file", file=index)
    return f


@dataclass
class WeightFiles:
    """Where a checkpoint directory's weights are: safetensors files (with the index and its checked
    weight_map when sharded), or pickle files."""

    files: list[Path]
    index: Path | None = None
    weight_map: dict[str, str] = field(default_factory=dict)
    pickles: list[Path] = field(default_factory=list)


def find_weight_files(path: Path, allow_pickle: bool) -> WeightFiles:
    """The weight files of a checkpoint directory (the index is read once, here)."""
    index = path / INDEX_NAME
    if index.exists():
        data = read_json(index, max_bytes=MAX_INDEX_BYTES)
        weight_map = data.get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise DFlashError("field `weight_map` missing or empty", file=index)
        files = [_shard_path(path, name, index) for name in weight_map.values()]
        return WeightFiles(list(dict.fromkeys(files)), index, weight_map)
    if (path / SINGLE_NAME).exists():
        return WeightFiles([path / SINGLE_NAME])
    others = sorted(p for p in path.glob("*.safetensors"))
    if others:
        return WeightFiles(others)
    pickles = [p for suffix in PICKLE_SUFFIXES for p in sorted(path.glob("*" + suffix))
               if is_pickle_weight_file(p.name)]
    if pickles:
        if not allow_pickle:
            raise DFlashError("only pickle weights found (.bin/.pt); they can run code when loaded. "
                              "Pass --allow-pickle to load them with torch.load(weights_only=True)", file=pickles[0])
        return WeightFiles([], pickles=pickles)
    raise DFlashError("no model.safetensors, shards or index found", file=path)


def weight_headers(model_dir: Path) -> dict[str, TensorInfo]:
    """Every tensor of a model directory's safetensors files (headers only), by its stored name."""
    tensors: dict[str, TensorInfo] = {}
    for f in find_weight_files(Path(model_dir), allow_pickle=False).files:
        tensors.update(read_header(f)[0])
    return tensors


def _draft_spec(path: Path, raw: dict[str, Any]) -> DraftSpec:
    """The draft's spec; a target checkpoint that ships its DSpark draft in SGLang's subfolder is told so."""
    file, draft = str(path / CONFIG_NAME), path / foreign.DRAFT_SUBFOLDER
    if (draft / CONFIG_NAME).is_file() and foreign.identify(raw) is None:
        try:
            mapping.detect_format(raw, file)
        except DFlashError as exc:
            said = str(exc).removeprefix(f"{file}: ")
            raise DFlashError(f"{said}; {foreign.subfolder_hint(str(draft))}", file=file) from None
    return mapping.spec_from_config(raw, file=file)


def open_checkpoint(path: str | Path, *, allow_pickle: bool = False, block_size: int | None = None) -> Checkpoint:
    """Read config and tensor headers of a checkpoint directory (no tensor data, no torch). `block_size` (the
    user's --block-size) supplies the block of a config that states none, read as if the config held it."""
    path = Path(path)
    if path.is_file() and path.name == CONFIG_NAME:
        path = path.parent
    if not path.is_dir():
        raise DFlashError("not a checkpoint directory (does not exist or is a file)", file=path)
    raw = read_json(path / CONFIG_NAME)
    if block_size is not None:
        raw = mapping.with_block_size(raw, block_size)
    spec = _draft_spec(path, raw)
    found_files = find_weight_files(path, allow_pickle)
    files, index, pickles = found_files.files, found_files.index, found_files.pickles
    tensors: dict[str, TensorInfo] = {}
    source_names: dict[str, str] = {}
    metadata: dict[str, str] = {}
    pickled: dict[str, Any] = {}
    for i, f in enumerate(files):
        found, meta = read_header(f)
        if i == 0:
            metadata = meta
        for name, info in found.items():
            canon = catalogue.canonical_name(name, spec.source_format)
            if canon in tensors:
                raise DFlashError(f"tensor `{name}` appears twice (also in {tensors[canon].file.name})", file=f)
            tensors[canon] = info
            source_names[canon] = name
    if index is not None:
        weight_map = found_files.weight_map
        for name, info in tensors.items():
            listed = weight_map.get(source_names[name])
            if listed is not None and listed != info.file.name:
                raise DFlashError(f"tensor `{source_names[name]}` is in {info.file.name} but weight_map says {listed}",
                                  file=index)
        missing = set(weight_map) - set(source_names.values())
        if missing:
            raise DFlashError(f"tensor `{sorted(missing)[0]}` is in weight_map but in no shard", file=index)
    for f in pickles:
        import torch

        try:
            state = torch.load(f, map_location="cpu", weights_only=True)
        except Exception as exc:  # noqa: BLE001 - torch raises many types for corrupt/unsafe pickles
            raise DFlashError(f"cannot load with weights_only=True: {str(exc).splitlines()[0]}", file=f) from None
        state = state.get("state_dict", state) if isinstance(state, dict) else state
        if not isinstance(state, dict):
            raise DFlashError(f"holds a {type(state).__name__}, not a dict of tensors", file=f)
        for name, tensor in state.items():
            if not isinstance(tensor, torch.Tensor):
                raise DFlashError(f"entry `{name}` is a {type(tensor).__name__}, not a tensor"[:200], file=f)
            canon = catalogue.canonical_name(name, spec.source_format)
            pickled[canon] = tensor
            source_names[canon] = name
            tensors[canon] = TensorInfo(canon, code_for_torch(tensor.dtype, tensor=name, file=f),
                                        tuple(tensor.shape), f, 0, tensor.numel() * tensor.element_size())
    _check_config_against_tensors(spec, tensors, path / CONFIG_NAME, quantization.CONFIG_KEY in raw)
    return Checkpoint(path=path, raw_config=raw, spec=spec, tensors=tensors, source_names=source_names,
                      weight_files=files or pickles, index_file=index, metadata=metadata, pickled=pickled,
                      companion_files=find_companion_files(path))


def read_companion(f: Path) -> bytes:
    """The bytes of a companion file (catalogue.COMPANION_FILES), bounded; never unpickled here."""
    return read_bounded(f, catalogue.MAX_COMPANION_BYTES, f"a {f.name} an engine reads")


def find_companion_files(path: Path) -> list[Path]:
    """The catalogue's companion files present in a checkpoint directory, each a regular file (links followed,
    as in the Hub cache) within MAX_COMPANION_BYTES."""
    found = []
    for name in catalogue.COMPANION_FILES:
        f = path / name
        if not (f.exists() or f.is_symlink()):
            continue
        try:
            st = f.stat()
        except OSError as exc:
            raise DFlashError(f"cannot read: {exc.strerror or exc}", file=f) from None
        if not stat.S_ISREG(st.st_mode):
            raise DFlashError("not a regular file", file=f)
        if st.st_size > catalogue.MAX_COMPANION_BYTES:
            raise DFlashError(f"file is larger than {catalogue.MAX_COMPANION_BYTES >> 20} MB: not a "
                              f"{name} an engine reads", file=f)
        found.append(f)
    return found


def _check_config_against_tensors(spec: DraftSpec, tensors: dict[str, TensorInfo], config_file: Path,
                                  quantized: bool = False) -> None:
    """What the config says against what the files hold, for every command: no tensor of a layer the
    config does not have, and every tensor in a dtype kind its catalogue entry allows (an int
    `fc.weight` is not a draft any engine can run; only the vocab maps hold integers)."""
    for name, info in tensors.items():
        rule, layer = catalogue.match(name, spec.variant)
        if rule is None:
            continue  # unknown tensors: the tensor-set checks name them
        kind = DTYPES[info.dtype].kind if info.dtype in DTYPES else None
        int_quantized = quantized and kind == "int" and name.endswith(".weight") and \
            f"{name.removesuffix('.weight')}.weight_scale" in tensors  # the scheme checks its dtype
        if kind not in rule.kinds and not int_quantized:
            allowed = sorted(c for c, d in DTYPES.items() if d.kind in rule.kinds)
            raise DFlashError(f"tensor `{name}` is {info.dtype}; it must be {' or '.join(rule.kinds)} "
                              f"({', '.join(allowed)}): only the vocab maps hold integers", file=info.file)
        if layer is not None and layer >= spec.num_layers:
            raise DFlashError(f"field `num_hidden_layers` is {spec.num_layers} but the weights hold tensor "
                              f"`{name[:80]}` (layer {layer}): the config and the weights describe different "
                              "drafts", file=config_file)
