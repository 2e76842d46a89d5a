"""A checkpoint directory on disk: its config (as a DraftSpec), its tensors, and how to read them.

Opening reads config.json and safetensors headers only (no torch). Tensor values are read one at
a time, on demand, by `load_tensor` (torch). Pickle `.bin` weights are refused unless the caller
asks for them, and are then loaded with `weights_only=True`.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import re
import shutil
import signal
import socket
import stat
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

from . import catalogue, mapping
from .configs import DraftSpec
from .dtypes import DTYPES, code_for_torch, torch_dtype
from .errors import DFlashError, Interrupted
from .safetensors_io import INDEX_NAME, SINGLE_NAME, TensorInfo, read_header

CONFIG_NAME = "config.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")  # torch.save files: they can run code when unpickled


def is_pickle_weight_file(name: str) -> bool:
    """A pickle weight file by its name (a companion such as mask_embedding.pt is not weights)."""
    return name.endswith(PICKLE_SUFFIXES) and Path(name).name not in catalogue.COMPANION_FILES


MAX_CONFIG_BYTES = 8 << 20  # config.json, conversion.json: real ones are a few KB
MAX_INDEX_BYTES = 64 << 20  # a shard index lists every tensor name once: tens of MB at the very most
MAX_JSON_DEPTH = 32  # real configs nest 3-4 levels
MAX_JSON_INT = 1 << 64  # no config value needs more; bigger is hostile or corrupt


def read_bounded(path: Path, max_bytes: int, what: str) -> bytes:
    """The bytes of a regular file of at most `max_bytes` (symlinks followed), else one error naming it."""
    try:
        # O_NONBLOCK: a FIFO planted as config.json must not hang the run waiting for a writer
        with open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise DFlashError("not a regular file", file=path)
            data = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise DFlashError("file not found", file=path) from None
    except OSError as exc:
        raise DFlashError(f"cannot read: {exc.strerror or exc}", file=path) from None
    if len(data) > max_bytes:
        raise DFlashError(f"file is larger than {max_bytes >> 20} MB: not {what}", file=path)
    return data


def read_json(path: Path, *, max_bytes: int = MAX_CONFIG_BYTES) -> dict[str, Any]:
    """A JSON object from a file, bounded before it is parsed and checked after: size, nesting depth,
    duplicate keys, integers of absurd size and NaN/Infinity (not JSON; Python's parser accepts them)
    are each one error naming the file (and the key, where there is one)."""
    path = Path(path)
    data = read_bounded(path, max_bytes, "a config this tool reads")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DFlashError(f"not valid JSON (not UTF-8 text: byte {exc.start})", file=path) from None

    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        obj = dict(items)
        if len(obj) != len(items):
            seen: set[str] = set()
            dup = next(k for k, _ in items if k in seen or seen.add(k))
            raise _Duplicate(dup)
        return obj

    try:
        value = json.loads(text, object_pairs_hook=pairs)
    except _Duplicate as exc:
        raise DFlashError(f"key `{exc.args[0]}` appears twice in one object (which one applies is undefined)",
                          file=path) from None
    except RecursionError:
        raise DFlashError(f"not valid JSON (nested more than {MAX_JSON_DEPTH} levels deep)", file=path) from None
    except json.JSONDecodeError as exc:
        raise DFlashError(f"not valid JSON ({exc})", file=path) from None
    except ValueError as exc:  # Python's cap on integer digits: "Exceeds the limit (4300 digits) ..."
        raise DFlashError(f"not valid JSON: an integer too long to be a config value ({str(exc)[:60]})",
                          file=path) from None
    if not isinstance(value, dict):
        raise DFlashError("not a JSON object", file=path)
    _check_json_values(value, path)
    return value


class _Duplicate(Exception):
    pass


_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 (but tab, newline), DEL, C1: terminal escapes


def _check_json_values(value: Any, path: Path) -> None:
    """Depth, integer size, finiteness and printable strings of every value and key, iteratively (no
    recursion to exhaust). Config strings reach terminals (inspect, diff): no escape sequences."""
    stack: list[tuple[Any, str, int]] = [(value, "", 0)]
    while stack:
        item, where, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise DFlashError(f"not valid JSON for a config: nested more than {MAX_JSON_DEPTH} levels deep "
                              f"(at `{where}`)", file=path)
        if isinstance(item, dict):
            for k, v in item.items():
                key = f"{where}.{k}" if where else k
                if _CONTROL.search(k):
                    _refuse_control(key, path)
                stack.append((v, key, depth + 1))
        elif isinstance(item, list):
            stack.extend((v, f"{where}[{i}]", depth + 1) for i, v in enumerate(item))
        elif isinstance(item, str) and _CONTROL.search(item):
            _refuse_control(where, path)
        elif isinstance(item, float) and not math.isfinite(item):
            raise DFlashError(f"field `{where}` is {item}: NaN and Infinity are not JSON numbers", file=path)
        elif isinstance(item, int) and not isinstance(item, bool) and abs(item) >= MAX_JSON_INT:
            raise DFlashError(f"field `{where}` is an integer of {len(str(abs(item)))} digits: out of any "
                              "config value's range", file=path)


def _refuse_control(where: str, path: Path) -> None:
    shown = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", where)[:200]
    char = _CONTROL.search(where)
    what = f"key `{shown}`" if char else f"field `{shown}`"
    raise DFlashError(f"{what} holds a control character (terminal escapes are refused)", file=path)


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
        problems = catalogue.tensor_problems(spec, {n: i.shape for n, i in self.tensors.items()})
        if problems:
            p = problems[0]
            info = self.tensors.get(p.tensor)
            where = info.file if info else (self.weight_files[0] if self.weight_files else self.path)
            raise DFlashError(p.message, file=where)

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


def open_checkpoint(path: str | Path, *, allow_pickle: bool = False) -> Checkpoint:
    """Read config and tensor headers of a checkpoint directory (no tensor data, no torch)."""
    path = Path(path)
    if path.is_file() and path.name == CONFIG_NAME:
        path = path.parent
    if not path.is_dir():
        raise DFlashError("not a checkpoint directory (does not exist or is a file)", file=path)
    raw = read_json(path / CONFIG_NAME)
    spec = mapping.spec_from_config(raw, file=str(path / CONFIG_NAME))
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
            canon = catalogue.canonical_name(name)
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
            canon = catalogue.canonical_name(name)
            pickled[canon] = tensor
            source_names[canon] = name
            tensors[canon] = TensorInfo(canon, code_for_torch(tensor.dtype, tensor=name, file=f),
                                        tuple(tensor.shape), f, 0, tensor.numel() * tensor.element_size())
    _check_config_against_tensors(spec, tensors, path / CONFIG_NAME)
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


def _check_config_against_tensors(spec: DraftSpec, tensors: dict[str, TensorInfo], config_file: Path) -> None:
    """What the config says against what the files hold, for every command: no tensor of a layer the
    config does not have, and every tensor in a dtype kind its catalogue entry allows (an int
    `fc.weight` is not a draft any engine can run; only the vocab maps hold integers)."""
    for name, info in tensors.items():
        rule, layer = catalogue.match(name, spec.variant)
        if rule is None:
            continue  # unknown tensors: the tensor-set checks name them
        kind = DTYPES[info.dtype].kind if info.dtype in DTYPES else None
        if kind not in rule.kinds:
            allowed = sorted(c for c, d in DTYPES.items() if d.kind in rule.kinds)
            raise DFlashError(f"tensor `{name}` is {info.dtype}; it must be {' or '.join(rule.kinds)} "
                              f"({', '.join(allowed)}): only the vocab maps hold integers", file=info.file)
        if layer is not None and layer >= spec.num_layers:
            raise DFlashError(f"field `num_hidden_layers` is {spec.num_layers} but the weights hold tensor "
                              f"`{name[:80]}` (layer {layer}): the config and the weights describe different "
                              "drafts", file=config_file)


# ----------------------------------------------------------------------------- staging

# Signals that end a write: each removes the staging directory and raises Interrupted (CLI exit 1).
# SIGHUP is what a dropped SSH session sends; SIGQUIT is Ctrl-\. A signal that was ignored when
# the run started (nohup ignores SIGHUP) stays ignored.
STOP_SIGNALS = tuple(getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT") if hasattr(signal, n))
_STAGING_RE = re.compile(r"\.(?P<label>.+)\.dflash-(?P<kind>staging|old)-(?P<host>[0-9a-f]{6})-(?P<pid>\d+)-[0-9a-f]{8}")


def _label(dest: Path) -> str:
    """dest's name, or a hash of it when too long for `.<name>.dflash-staging-...` to fit NAME_MAX (255)."""
    name = dest.name
    return name if len(name.encode("utf-8", "surrogateescape")) <= 200 else hashlib.sha256(
        name.encode("utf-8", "surrogateescape")).hexdigest()[:20]


def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def _sibling(dest: Path, base: Path, kind: str) -> Path:
    return base / f".{_label(dest)}.dflash-{kind}-{_host()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _staging_base(dest: Path) -> Path:
    """Where staging goes: dest's parent, or its nearest existing ancestor (parents are made at commit)."""
    base = dest.parent
    while not base.exists() and base != base.parent:
        base = base.parent
    return base


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid() or os.name == "nt":  # on Windows os.kill(pid, 0) would terminate the process
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # someone else's process (or not ours to judge): leave its files alone
    return True


def staging_leftovers(dest: str | Path) -> list[Path]:
    """Staging and `.old` directories of runs on `dest` (from this module's naming), live or dead."""
    dest = Path(os.path.abspath(dest))
    base = _staging_base(dest)
    try:
        entries = list(base.iterdir())
    except OSError:
        return []
    found = []
    for p in entries:
        m = _STAGING_RE.fullmatch(p.name)
        if m and m["label"] == _label(dest):
            found.append(p)
    return found


def remove_stale_staging(dest: str | Path) -> tuple[list[Path], list[Path]]:
    """Remove what killed runs on `dest` left beside it; (removed, kept) where kept are other hosts' or live."""
    removed, kept = [], []
    for p in staging_leftovers(dest):
        m = _STAGING_RE.fullmatch(p.name)
        if m["host"] == _host() and not _pid_alive(int(m["pid"])):
            shutil.rmtree(p, ignore_errors=True)
            (kept if p.exists() else removed).append(p)
        else:
            kept.append(p)
    return removed, kept


def check_destination(dest: Path, overwrite: bool, sources: tuple[Path, ...] = ()) -> None:
    dest = Path(os.path.abspath(dest))  # `.` and `x/..` name their directory; `/` names none
    if not dest.name:
        raise DFlashError("destination must name a directory to create or replace", file=dest)
    for src in sources:
        s, d = Path(src).resolve(), dest.resolve()
        if d == s or s in d.parents:
            raise DFlashError(f"destination is inside the source checkpoint {src}", file=dest)
        if d in s.parents:
            raise DFlashError(f"destination contains the source checkpoint {src}", file=dest)
    if dest.is_symlink():
        # Replacing it would swap the link for a directory (and leave the old link behind);
        # writing through it would stage on the link's file system, not the target's.
        raise DFlashError(f"destination is a symbolic link (to {os.readlink(dest)}); give the directory itself",
                          file=dest)
    base = _staging_base(dest)
    if not base.is_dir():
        raise DFlashError(f"{base} is not a directory", file=dest)
    if dest.exists() and not dest.is_dir():
        raise DFlashError("destination exists and is not a directory", file=dest)
    if dest.exists() and any(dest.iterdir()) and not overwrite:
        raise DFlashError("destination is not empty (pass --overwrite to replace it)", file=dest)


def _write_error(exc: OSError, dest: Path) -> DFlashError:
    if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return DFlashError(f"out of disk space while writing ({exc.strerror or exc}); nothing was written", file=dest)
    if exc.errno == errno.EFBIG:
        return DFlashError("a file is larger than the file system allows (try --max-shard-size); nothing was written",
                           file=dest)
    where = f" ({exc.filename})" if exc.filename else ""
    return DFlashError(f"cannot write: {exc.strerror or exc}{where}; nothing was written", file=dest)


@contextmanager
def staged_directory(dest: str | Path, *, overwrite: bool = False, notes: list[str] | None = None) -> Iterator[Path]:
    """Yield a hidden staging directory beside `dest`; rename it onto `dest` only if the block succeeds.

    Any exception, and every signal of STOP_SIGNALS, removes the staging directory, and `dest` is
    then untouched (missing parent directories are created only at the commit). Signals that come
    during the commit are held until it is done. A SIGKILL can only leave a hidden
    `.<name>.dflash-staging-<host>-<pid>-*` sibling: the next run on `dest` removes it once that
    pid is gone (and says so in `notes`). Out of space is one error naming `dest`.
    """
    dest = Path(os.path.abspath(dest))
    if not dest.name:
        raise DFlashError("destination must name a directory to create or replace", file=dest)
    removed, kept = remove_stale_staging(dest)
    if notes is not None:
        notes += [f"removed {p} left by a killed run" for p in removed]
        notes += [f"{p} belongs to a run still going (or on another host); left as is" for p in kept]
    held: list[int] = []
    state = {"hold": False}

    def on_signal(signum, frame):  # noqa: ARG001
        if state["hold"]:
            held.append(signum)
            return
        raise Interrupted(f"interrupted by {signal.Signals(signum).name}; nothing was written", file=dest)

    previous = {}
    for sig in STOP_SIGNALS:
        try:
            if signal.getsignal(sig) != signal.SIG_IGN:
                previous[sig] = signal.signal(sig, on_signal)
        except (ValueError, OSError):  # not the main thread: keep the handlers as they are
            break
    base = _staging_base(dest)
    tmp = _sibling(dest, base, "staging")
    try:
        tmp.mkdir()
    except OSError as exc:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        raise DFlashError(f"cannot create a staging directory in {base}: {exc.strerror or exc}", file=dest) from None
    try:
        try:
            yield tmp
            state["hold"] = True
            # No fsync: the rename makes DST atomic against process death (kill -9, Ctrl-C), which is
            # what users hit; forcing 2 GB to disk first would triple the cost of a conversion.
            dest.parent.mkdir(parents=True, exist_ok=True)
            if dest.is_symlink():
                raise DFlashError("destination became a symbolic link during the conversion", file=dest)
            if dest.exists():
                if not overwrite and any(dest.iterdir()):
                    raise DFlashError("destination appeared and is not empty", file=dest)
                trash = _sibling(dest, dest.parent, "old")
                dest.rename(trash)
                try:
                    tmp.rename(dest)
                except OSError:
                    trash.rename(dest)  # put the old output back: a failed overwrite changes nothing
                    raise
                shutil.rmtree(trash, ignore_errors=True)
            else:
                tmp.rename(dest)
        except OSError as exc:
            raise _write_error(exc, dest) from None
    finally:
        state["hold"] = True  # a second Ctrl-C must not stop the cleanup half-way
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    if held:  # a signal that came during the commit ends the run now that DST is complete
        raise Interrupted(f"interrupted by {signal.Signals(held[0]).name} just after the output was written "
                          "(it is complete)", file=dest)
