"""safetensors without torch: parse headers, write headers, copy tensor byte ranges.

A safetensors file is `u64 little-endian header length N | N bytes of JSON | data`. The JSON maps
tensor names to {dtype, shape, data_offsets: [begin, end]} (relative to the data start), plus an
optional `__metadata__` string map. Conversion writes a new header and copies each kept tensor's
bytes straight from the source (in-kernel where the OS allows), so memory never grows with size.
"""

from __future__ import annotations

import errno
import json
import math
import os
import re
import struct
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Iterable

from dflash_convert.format.dtypes import DTYPES
from dflash_convert.errors import DFlashError
from dflash_convert.io.reading import open_regular, unique_keys

# Valid dtypes of the format; those missing from DTYPES (sub-byte floats, complex) are refused by name.
ALL_DTYPES = {*DTYPES, "F4", "F6_E2M3", "F6_E3M2", "C64"}
MAX_HEADER_BYTES = 100_000_000  # the reference implementation's limit
MAX_JSON_DEPTH = 127  # nested arrays/objects the reference parser accepts
# Parsing costs memory and time per JSON value: a 100 MB header of one shape with 49M entries took
# 4 GB and minutes. Real headers hold ~7 values per tensor (a 100k-tensor shard stays well under).
MAX_HEADER_VALUES = 1_000_000
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


class _Malformed(ValueError):
    """A fault in a safetensors header; read_header adds the file name."""


class _Unsupported(_Malformed):
    """Valid safetensors that dflash-convert does not handle."""


class _DuplicateKey(_Malformed):
    def __str__(self) -> str:
        return f"key `{self.args[0]}` appears twice in one JSON object (the format allows one entry per name)"


def _json_object(pairs: list[tuple[str, object]]) -> dict:
    return unique_keys(pairs, _DuplicateKey)


def _json_int(text: str) -> int | float:
    # The reference parser reads integers as u64, and what does not fit (or `-0`) as a float, which
    # no shape or offset accepts; reading it as a float here also bounds int() on huge digit strings.
    if len(text) > 20 or text == "-0":
        return float(text)
    return int(text)


def _json_constant(text: str):
    raise _Malformed(f"`{text}` is not JSON")


def _check_strings(value: object) -> None:
    """Lone UTF-16 surrogates (legal in Python's JSON, not in the format's) and nesting over the parser's depth."""
    stack = [(value, 0)]  # containers only: scalars are checked in place
    while stack:
        item, depth = stack.pop()
        if depth >= MAX_JSON_DEPTH:
            raise _Malformed(f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        for child in chain(item.keys(), item.values()) if isinstance(item, dict) else item:
            if isinstance(child, str):
                child.encode("utf-8")  # UnicodeEncodeError on a lone surrogate
            elif isinstance(child, (dict, list)):
                stack.append((child, depth + 1))


def _is_u64(x: object) -> bool:
    return type(x) is int and 0 <= x < 1 << 64  # type(): bool is an int subclass, and not allowed


def _tensor_entry(name: str, entry: object) -> tuple[str, tuple[int, ...], int, int]:
    """(dtype, shape, begin, end) of one header entry, or a one-line reason it breaks the format."""
    if not isinstance(entry, dict):
        raise _Malformed(f"tensor `{name}`: entry is {type(entry).__name__}, not an object")
    missing = [k for k in ("dtype", "shape", "data_offsets") if k not in entry]
    if missing:
        raise _Malformed(f"tensor `{name}`: field `{missing[0]}` is missing")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if not isinstance(dtype, str) or dtype not in ALL_DTYPES:
        raise _Malformed(f"tensor `{name}`: unknown dtype {str(dtype)[:40]!r}")
    if dtype not in DTYPES:
        raise _Unsupported(f"tensor `{name}`: dtype {dtype} is valid safetensors but not supported by dflash-convert")
    if not isinstance(shape, list) or not all(_is_u64(x) for x in shape):
        raise _Malformed(f"tensor `{name}`: shape {_short(shape)} is not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_u64(x) for x in offsets)):
        raise _Malformed(f"tensor `{name}`: data_offsets {_short(offsets)} is not a pair of non-negative integers")
    begin, end = offsets
    if begin > end:
        raise _Malformed(f"tensor `{name}`: data_offsets {offsets} end before they begin")
    if end - begin != math.prod(shape) * DTYPES[dtype].itemsize:
        raise _Malformed(f"tensor `{name}`: data_offsets {offsets} hold {end - begin} bytes but {dtype} {shape} "
                         f"needs {math.prod(shape) * DTYPES[dtype].itemsize} (size must be dtype size x shape)")
    return dtype, tuple(shape), begin, end


def _short(value: object) -> str:
    text = json.dumps(value) if not isinstance(value, float) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Tensors and `__metadata__` of one safetensors file, refusing everything the format forbids.

    The rules (those of the reference implementation, plus one entry per name everywhere): an 8-byte
    little-endian header length of at most 100 MB; a UTF-8 JSON object (space padding allowed);
    `__metadata__` absent, null or a string-to-string map; every other entry {dtype, shape,
    data_offsets} with a known dtype, non-negative integer shape and offsets, size = dtype size x
    shape; tensors (ordered by offsets) contiguous from 0 to exactly the end of the file.
    """
    path = Path(path)
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise DFlashError(f"truncated safetensors file ({size} bytes, no header length)", file=path)
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise DFlashError(f"bad safetensors header length {n} for a file of {size} bytes", file=path)
            raw = f.read(n)
            if raw.count(b",") >= MAX_HEADER_VALUES:  # bounded before parsing (a few ms per MB)
                raise DFlashError(f"safetensors header holds over {MAX_HEADER_VALUES} JSON values; refused before "
                                  "parsing (a draft checkpoint has a few thousand)", file=path)
    except OSError as exc:
        raise DFlashError(f"cannot read: {exc.strerror}", file=path) from None
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_json_object, parse_int=_json_int,
                            parse_constant=_json_constant)
        if isinstance(header, str):
            header.encode("utf-8")
        elif isinstance(header, (dict, list)):
            _check_strings(header)
        if not isinstance(header, dict):
            raise _Malformed(f"it is a JSON {type(header).__name__}, not an object")
        metadata = header.pop("__metadata__", None)
        if metadata is None:
            metadata = {}
        if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
            raise _Malformed("`__metadata__` must be a map of strings to strings")
        entries = sorted(((_tensor_entry(name, entry), name) for name, entry in header.items()),
                         key=lambda e: (e[0][2], e[0][3]))
    except _Malformed as exc:
        raise DFlashError(f"{'' if isinstance(exc, _Unsupported) else 'malformed safetensors header: '}{exc}",
                          file=path) from None
    except UnicodeError:
        raise DFlashError("malformed safetensors header: not valid UTF-8 (or a lone UTF-16 surrogate)", file=path) from None
    except (json.JSONDecodeError, RecursionError) as exc:
        why = str(exc).splitlines()[0][:120] if isinstance(exc, json.JSONDecodeError) else "nested too deeply"
        raise DFlashError(f"safetensors header is not valid JSON ({why})", file=path) from None
    base = 8 + n
    data_size = size - base
    tensors: dict[str, TensorInfo] = {}
    pos = 0
    for (dtype, shape, begin, end), name in entries:
        if begin != pos:
            rule = ("do not start at 0 (tensor data must start at offset 0)" if not tensors else
                    "leave a gap after the previous tensor (tensor data must be contiguous)" if begin > pos else
                    "overlap the previous tensor (tensor data must be contiguous)")
            raise DFlashError(f"malformed safetensors header: tensor `{name}`: data_offsets {[begin, end]} {rule}",
                              file=path)
        if end > data_size:
            raise DFlashError(f"tensor `{name}`: data_offsets {[begin, end]} run past the end of the file "
                              f"({data_size} data bytes); the file is truncated", file=path)
        tensors[name] = TensorInfo(name, dtype, shape, path, base + begin, base + end)
        pos = end
    if pos != data_size:
        raise DFlashError(f"malformed safetensors header: the tensors cover {pos} of the file's {data_size} data "
                          "bytes (tensor data must end exactly at the end of the file)", file=path)
    return tensors, dict(metadata)


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


COPY_CHUNK = 16 << 20  # bytes per read/write when the kernel cannot copy for us
# copy_file_range errors that mean "not here" (old kernel, cross-device, file system without it,
# a sandbox forbidding it): the plain copy takes over. Others (ENOSPC, EIO, ...) are real failures.
_NO_KERNEL_COPY = {getattr(errno, n) for n in ("ENOSYS", "EXDEV", "EINVAL", "EOPNOTSUPP", "ENOTSUP", "EPERM",
                                               "EBADF", "ETXTBSY") if hasattr(errno, n)}


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
    except AttributeError:  # no copy_file_range (macOS, Windows)
        pass
    except OSError as exc:
        if exc.errno not in _NO_KERNEL_COPY:
            raise
    src.seek(start)  # go on from where the kernel copy stopped
    dst.seek(out)
    while length:
        chunk = src.read(min(length, COPY_CHUNK))
        if not chunk:
            raise DFlashError("source ended early while copying", file=src.name)
        dst.write(chunk)
        length -= len(chunk)


def parse_size(text: str) -> int:
    """'5GB', '500MB', '2GiB', '1000' -> bytes (HF `max_shard_size` syntax)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?i?B?)\s*", str(text), flags=re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 5GB, 500MB)")
    unit = m.group(2).upper().rstrip("B")
    scale = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
             "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}[unit]
    size = float(m.group(1)) * scale
    if not 1 <= size < 2**63:  # "0", "0.1B", a number of hundreds of digits (float infinity)
        raise ValueError(f"not a size: {text!r} (at least 1 byte, e.g. 5GB, 500MB)")
    return int(size)


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
