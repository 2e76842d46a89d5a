"""copy_range, the one function every tensor byte goes through: bit-exact on every path it can take.

Paths: the kernel copy (os.copy_file_range) whole, in short counts, failing part-way over to the
plain copy, and the plain read/write copy alone (macOS, Windows, file systems without it).
"""

from __future__ import annotations

import errno
import os
import random

import pytest

import dflash_convert.io.safetensors as sio

RANGES = [(0, 1), (3, 4097), (5000, 0), (77, 123_457), (200_001, 31), (1, 199_999)]


def copy_all(tmp_path, data: bytes) -> bytes:
    """Copy RANGES of `data` one after another behind a 5-byte prefix, as conversion does."""
    src_file, dst_file = tmp_path / "src.bin", tmp_path / "dst.bin"
    src_file.write_bytes(data)
    with open(src_file, "rb") as src, open(dst_file, "wb") as dst:
        dst.write(b"HEAD!")  # buffered, like the safetensors header written before the tensors
        for start, length in RANGES:
            sio.copy_range(src, dst, start, length)
        dst.write(b"TAIL")
    return dst_file.read_bytes()


def expected(data: bytes) -> bytes:
    return b"HEAD!" + b"".join(data[s:s + n] for s, n in RANGES) + b"TAIL"


@pytest.fixture
def data():
    return random.Random(0).randbytes(250_000)


def test_kernel_copy(tmp_path, data):
    if not hasattr(os, "copy_file_range"):
        pytest.skip("no os.copy_file_range on this platform (the plain path is tested below)")
    assert copy_all(tmp_path, data) == expected(data)


@pytest.mark.parametrize("chunk", [7, 4096, 16 << 20])
def test_plain_copy_without_copy_file_range(tmp_path, data, monkeypatch, chunk):
    monkeypatch.delattr(os, "copy_file_range", raising=False)
    monkeypatch.setattr(sio, "COPY_CHUNK", chunk)
    assert copy_all(tmp_path, data) == expected(data)


def _fake_kernel_copy(monkeypatch, behave):
    """os.copy_file_range done in Python (works on every platform), shaped by `behave(call, count)`."""
    calls = []

    def copy_file_range(src, dst, count, offset_src=None, offset_dst=None):
        calls.append(count)
        count = behave(len(calls), count)
        chunk = os.pread(src, count, offset_src)
        return os.pwrite(dst, chunk, offset_dst)

    monkeypatch.setattr(os, "copy_file_range", copy_file_range, raising=False)
    return calls


def test_kernel_copy_in_short_counts(tmp_path, data, monkeypatch):
    calls = _fake_kernel_copy(monkeypatch, lambda call, count: min(count, 1 + call % 13))
    assert copy_all(tmp_path, data) == expected(data)
    assert len(calls) > 1000  # the short-count loop really ran


@pytest.mark.parametrize("code", [errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP])
def test_kernel_copy_failing_part_way_goes_on_plainly(tmp_path, data, monkeypatch, code):
    def behave(call, count):
        if call > 3:
            raise OSError(code, os.strerror(code))
        return min(count, 1000)

    _fake_kernel_copy(monkeypatch, behave)
    monkeypatch.setattr(sio, "COPY_CHUNK", 4096)
    assert copy_all(tmp_path, data) == expected(data)


def test_real_write_errors_are_not_retried(tmp_path, data, monkeypatch):
    """ENOSPC from the kernel copy is the disk, not the platform: it must surface, not be papered over."""
    def behave(call, count):
        raise OSError(errno.ENOSPC, "No space left on device")

    _fake_kernel_copy(monkeypatch, behave)
    with pytest.raises(OSError) as exc:
        copy_all(tmp_path, data)
    assert exc.value.errno == errno.ENOSPC


def test_source_shorter_than_the_range(tmp_path, monkeypatch):
    from dflash_convert.errors import DFlashError

    (tmp_path / "src.bin").write_bytes(b"x" * 10)
    for plain in (False, True):
        if plain:
            monkeypatch.delattr(os, "copy_file_range", raising=False)
        with open(tmp_path / "src.bin", "rb") as src, open(tmp_path / "dst.bin", "wb") as dst:
            with pytest.raises(DFlashError, match="ended early"):
                sio.copy_range(src, dst, 4, 20)


def test_conversion_without_copy_file_range_is_bit_exact(cli, speculators_drafts, tmp_path, monkeypatch):
    src = speculators_drafts["pruned"]
    assert cli("convert", src, "-o", tmp_path / "kernel", "--max-shard-size", "60KB").code == 0
    monkeypatch.delattr(os, "copy_file_range", raising=False)
    monkeypatch.setattr(sio, "COPY_CHUNK", 1000)  # many chunks per tensor
    assert cli("convert", src, "-o", tmp_path / "plain", "--max-shard-size", "60KB").code == 0
    shards = sorted(p.name for p in (tmp_path / "kernel").glob("*.safetensors"))
    assert len(shards) > 1
    assert shards == sorted(p.name for p in (tmp_path / "plain").glob("*.safetensors"))
    for name in shards:
        assert (tmp_path / "kernel" / name).read_bytes() == (tmp_path / "plain" / name).read_bytes()
    # and each tensor holds its source bytes
    from dflash_convert.io.checkpoint import open_checkpoint

    before, after = open_checkpoint(src), open_checkpoint(tmp_path / "plain")
    for name, info in after.tensors.items():
        if name in before.tensors:
            with open(before.tensors[name].file, "rb") as a, open(info.file, "rb") as b:
                a.seek(before.tensors[name].start)
                b.seek(info.start)
                assert a.read(info.nbytes) == b.read(info.nbytes), name
