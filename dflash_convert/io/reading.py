"""One bounded reader for every file the tool reads (configs, shard indexes, prompts, tokenizer and
template files; safetensors headers open through `open_regular` too): a regular file only (a FIFO or a
device never blocks a run), a size cap checked before parsing, and for JSON the nesting depth,
duplicate keys, absurd integers, NaN/Infinity and terminal control characters refused. Each fault is
one DFlashError naming the file (and the key).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, Iterator

from dflash_convert.errors import DFlashError

MAX_TEXT_BYTES = 64 << 20  # prompt files, tokenizer files, chat templates

MAX_CONFIG_BYTES = 8 << 20  # config.json, conversion.json: real ones are a few KB
MAX_INDEX_BYTES = 64 << 20  # a shard index lists every tensor name once: tens of MB at the very most
MAX_JSON_DEPTH = 32  # real configs nest 3-4 levels
MAX_JSON_INT = 1 << 64  # no config value needs more; bigger is hostile or corrupt


@contextmanager
def open_regular(path: Path) -> Iterator[BinaryIO]:
    """A regular file opened for reading (symlinks followed); anything else is one error naming it."""
    try:
        # O_NONBLOCK: a FIFO planted as config.json must not hang the run waiting for a writer
        f = open(os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0)), "rb")
    except FileNotFoundError:
        raise DFlashError("file not found", file=path) from None
    except OSError as exc:
        raise DFlashError(f"cannot read: {exc.strerror or exc}", file=path) from None
    with f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise DFlashError("not a regular file", file=path)
        yield f


def read_bounded(path: Path, max_bytes: int, what: str) -> bytes:
    """The bytes of a regular file of at most `max_bytes`, else one error naming it."""
    with open_regular(path) as f:
        try:
            data = f.read(max_bytes + 1)
        except OSError as exc:
            raise DFlashError(f"cannot read: {exc.strerror or exc}", file=path) from None
    if len(data) > max_bytes:
        raise DFlashError(f"file is larger than {max_bytes >> 20} MB: not {what}", file=path)
    return data


def read_text(path: Path, what: str, *, max_bytes: int = MAX_TEXT_BYTES) -> str:
    """A bounded UTF-8 text file (a BOM is dropped); not UTF-8 is one error naming the byte."""
    data = read_bounded(path, max_bytes, what)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DFlashError(f"not UTF-8 text (byte {exc.start}): not {what}", file=path) from None


def unique_keys(items: list[tuple[str, Any]], duplicate: type[Exception]) -> dict[str, Any]:
    """json's object_pairs_hook that refuses a key given twice (which one applies is undefined):
    raises `duplicate(key)`."""
    obj = dict(items)
    if len(obj) != len(items):
        seen: set[str] = set()
        raise duplicate(next(k for k, _ in items if k in seen or seen.add(k)))
    return obj


UTF8_BOM = b"\xef\xbb\xbf"


def read_json(path: Path, *, max_bytes: int = MAX_CONFIG_BYTES, allow_bom: bool = False,
              what: str = "a config this tool reads") -> dict[str, Any]:
    """A JSON object from a file, bounded before it is parsed and checked after: size, nesting depth,
    duplicate keys, integers of absurd size and NaN/Infinity (not JSON; Python's parser accepts them)
    are each one error naming the file (and the key, where there is one).

    A leading UTF-8 byte-order mark is refused unless `allow_bom` (this tool's own reports): transformers
    opens configs as plain UTF-8 and json.loads stops at the BOM, so vLLM, SGLang and transformers cannot
    load a checkpoint or target whose config.json, index or generation_config.json starts with one."""
    path = Path(path)
    data = read_bounded(path, max_bytes, what)  # `what`: the file's kind, as the size error names it
    if data.startswith(UTF8_BOM) and not allow_bom:
        raise DFlashError("starts with a UTF-8 byte-order mark, which transformers, vLLM and SGLang refuse to "
                          "parse (json: Unexpected UTF-8 BOM); save it without the BOM (its first 3 bytes)",
                          file=path)
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise DFlashError(f"not valid JSON (not UTF-8 text: byte {exc.start})", file=path) from None

    try:
        value = json.loads(text, object_pairs_hook=lambda items: unique_keys(items, _Duplicate))
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


# ----------------------------------------------------------------------------- Hub cache files: named by their hash

def hasher(kind: str, size: int):
    """sha256 ("sha256"), or ("git") the git blob id the Hub announces for a file not stored in LFS."""
    return hashlib.sha256() if kind == "sha256" else hashlib.sha1(b"blob %d\0" % size)


def file_digest(path: str | Path, kind: str) -> str:
    path = Path(path)
    h = hasher(kind, path.stat().st_size)
    with open(path, "rb") as f:
        while chunk := f.read(8 << 20):
            h.update(chunk)
    return h.hexdigest()


def announced_by_cache_name(path: str | Path) -> tuple[str, str] | None:
    """(kind, hash) a Hub cache file was downloaded under, or None for any other file: the cache names each
    blob by the etag the Hub announced, the sha256 of an LFS file and the git blob id of another."""
    blob = Path(os.path.realpath(path))
    if blob.parent.name != "blobs":
        return None
    if re.fullmatch(r"[0-9a-f]{64}", blob.name):
        return "sha256", blob.name
    if re.fullmatch(r"[0-9a-f]{40}", blob.name):
        return "git", blob.name
    return None


def discard(path: str | Path) -> None:
    """Remove a file that failed its hash check: a cache link and the blob it points to (the next run
    downloads it again), or a plain file."""
    path = Path(path)
    if path.is_symlink():
        Path(os.path.realpath(path)).unlink(missing_ok=True)
    path.unlink(missing_ok=True)
