"""safetensors without torch: parse headers, write headers, copy tensor byte ranges.

A safetensors file is `u64 little-endian header length N | N bytes of JSON | data`. The JSON maps
tensor names to {dtype, shape, data_offsets: [begin, end]} (relative to the data start), plus an
optional `__metadata__` string map. Conversion writes a new header and copies each kept tensor's
bytes straight from the source (in-kernel where the OS allows), so memory never grows with size.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from .dtypes import DTYPES
from .errors import DFlashError

MAX_HEADER_BYTES = 100 * 1024 * 1024  # the reference implementation's limit
INDEX_NAME = "model.safetensors.index.json"
SINGLE_NAME = "model.safetensors"


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # safetensors code: F32, BF16, I64, BOOL, ...
    shape: tuple[int, ...]
    file: Path
    start: int  # absolute byte offsets in `file`
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Tensors and `__metadata__` of one safetensors file; every structural fault is one clear error."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise DFlashError(f"truncated safetensors file ({size} bytes, no header length)", file=path)
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise DFlashError(f"bad safetensors header length {n} for a file of {size} bytes", file=path)
            raw = f.read(n)
    except OSError as exc:
        raise DFlashError(f"cannot read: {exc.strerror}", file=path) from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DFlashError(f"safetensors header is not valid JSON ({exc})", file=path) from None
    if not isinstance(header, dict):
        raise DFlashError("safetensors header is not a JSON object", file=path)
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise DFlashError("safetensors `__metadata__` is not an object", file=path)
    base = 8 + n
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        try:
            dtype, shape, (begin, end) = entry["dtype"], tuple(int(x) for x in entry["shape"]), entry["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise DFlashError(f"tensor `{name}`: malformed header entry {entry!r}"[:200], file=path) from None
        if not isinstance(dtype, str) or dtype not in DTYPES:
            raise DFlashError(f"tensor `{name}`: unknown dtype {dtype!r}"[:200], file=path)
        if not (isinstance(begin, int) and isinstance(end, int) and 0 <= begin <= end):
            raise DFlashError(f"tensor `{name}`: bad data_offsets {[begin, end]}", file=path)
        if base + end > size:
            raise DFlashError(f"tensor `{name}`: data_offsets {[begin, end]} run past the end of the file "
                              f"({size - base} data bytes); the file is truncated", file=path)
        if end - begin != math.prod(shape) * DTYPES[dtype].itemsize:
            raise DFlashError(f"tensor `{name}`: {end - begin} bytes for {dtype} {list(shape)}", file=path)
        tensors[name] = TensorInfo(name, dtype, shape, path, base + begin, base + end)
    return tensors, {str(k): str(v) for k, v in metadata.items()}


def header_bytes(entries: Iterable[tuple[str, str, tuple[int, ...]]], metadata: dict[str, str] | None) -> tuple[bytes, list[tuple[int, int]]]:
    """Serialized header (length prefix included, padded to 8 bytes) and each entry's data offsets."""
    header: dict = {}
    if metadata:
        header["__metadata__"] = metadata
    offsets, pos = [], 0
    for name, dtype, shape in entries:
        nbytes = math.prod(shape) * DTYPES[dtype].itemsize
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [pos, pos + nbytes]}
        offsets.append((pos, pos + nbytes))
        pos += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw, offsets


def copy_range(src, dst, start: int, length: int) -> None:
    """Copy `length` bytes of `src` at `start` to the current end of `dst` (both open binary files)."""
    out = dst.tell()
    try:
        while length:
            n = os.copy_file_range(src.fileno(), dst.fileno(), length, start, out)
            if n == 0:
                raise DFlashError("source ended early while copying", file=src.name)
            start, out, length = start + n, out + n, length - n
        dst.seek(out)
        return
    except (AttributeError, OSError):  # no copy_file_range (macOS, some filesystems): plain chunks
        pass
    src.seek(start)
    dst.seek(out)
    while length:
        chunk = src.read(min(length, 16 << 20))
        if not chunk:
            raise DFlashError("source ended early while copying", file=src.name)
        dst.write(chunk)
        length -= len(chunk)


def parse_size(text: str) -> int:
    """'5GB', '500MB', '2GiB', '1000' -> bytes (HF `max_shard_size` syntax)."""
    m = __import__("re").fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)\s*", str(text), flags=2)
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 5GB, 500MB)")
    unit = m.group(2).upper().rstrip("B")
    scale = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
             "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}[unit]
    return int(float(m.group(1)) * scale)


def shard_names(n: int) -> list[str]:
    return [SINGLE_NAME] if n == 1 else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def plan_shards(sizes: list[int], max_shard_bytes: int | None) -> list[list[int]]:
    """Group tensor indices (in order) into shards of at most `max_shard_bytes` (a bigger tensor gets its own)."""
    if not max_shard_bytes:
        return [list(range(len(sizes)))]
    shards: list[list[int]] = [[]]
    used = 0
    for i, size in enumerate(sizes):
        if shards[-1] and used + size > max_shard_bytes:
            shards.append([])
            used = 0
        shards[-1].append(i)
        used += size
    return shards


def write_index(directory: Path, weight_map: dict[str, str], total_size: int, metadata: dict | None = None) -> None:
    index = {"metadata": {**(metadata or {}), "total_size": total_size}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
