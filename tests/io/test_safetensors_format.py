"""safetensors headers: we refuse every file the reference library refuses, and read every valid one alike.

Hand-built files cover each rule of the format by name; a hypothesis test mutates valid headers
(offsets, shapes, dtypes, metadata, padding, trailing bytes, the length prefix) and compares our
reader with the reference `safetensors` library on every case. Three documented differences: we also
refuse a duplicate key anywhere (the reference keeps the last `__metadata__` value), valid dtypes
we cannot convert (sub-byte floats, complex) with their own message, and headers of more than
MAX_HEADER_VALUES JSON values (bounded before parsing: the reference takes minutes and gigabytes).
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dflash_convert.errors import DFlashError
from dflash_convert.format.dtypes import DTYPES
from dflash_convert.io.safetensors import read_header

T = '{"dtype":"F32","shape":[2],"data_offsets":[0,8]}'
T2 = '{"dtype":"F32","shape":[2],"data_offsets":[8,16]}'


def build(path: Path, header: str | bytes, data: bytes, length: int | None = None) -> Path:
    raw = header.encode() if isinstance(header, str) else header
    path.write_bytes(struct.pack("<Q", len(raw) if length is None else length) + raw + data)
    return path


def reference_reads(path: Path):
    """(name -> (dtype, shape)) as the reference library reads the file, or None if it refuses it."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), "np") as f:
            return {k: (f.get_slice(k).get_dtype(), tuple(f.get_slice(k).get_shape())) for k in f.keys()}
    except Exception:  # noqa: BLE001 - the reference raises SafetensorError, and others for some faults
        return None


def ours_reads(path: Path):
    try:
        tensors, _ = read_header(path)
    except DFlashError as exc:
        message = str(exc)
        assert "\n" not in message and message.startswith(str(path)), message
        return None
    return {k: (t.dtype, t.shape) for k, t in tensors.items()}


REFUSED = {  # name: (header, data, words the error must contain)
    "duplicate tensor": ('{"a":%s,"a":%s}' % (T, T2), b"x" * 16, ["`a`", "twice"]),
    "duplicate tensor, same offsets": ('{"a":%s,"a":%s}' % (T, T), b"x" * 8, ["`a`", "twice"]),
    "duplicate escaped name": ('{"a":%s,"\\u0061":%s}' % (T, T2), b"x" * 16, ["`a`", "twice"]),
    "duplicate field": ('{"a":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}}', b"x" * 8, ["dtype", "twice"]),
    "duplicate __metadata__": ('{"__metadata__":{},"__metadata__":{},"a":%s}' % T, b"x" * 8, ["__metadata__", "twice"]),
    "gap": ('{"a":%s,"b":{"dtype":"F32","shape":[2],"data_offsets":[12,20]}}' % T, b"x" * 20, ["`b`", "gap", "contiguous"]),
    "overlap": ('{"a":%s,"b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}' % T, b"x" * 12, ["`b`", "overlap"]),
    "overlap, same range": ('{"a":%s,"b":%s}' % (T, T), b"x" * 8, ["overlap"]),
    "not starting at 0": ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}}', b"x" * 12, ["`a`", "offset 0"]),
    "trailing bytes": ('{"a":%s}' % T, b"x" * 9, ["end exactly at the end"]),
    "no tensors, trailing bytes": ("{}", b"x", ["end exactly at the end"]),
    "truncated data": ('{"a":%s}' % T, b"x" * 7, ["`a`", "truncated"]),
    "size != dtype x shape": ('{"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}}', b"x" * 8, ["`a`", "dtype size x shape"]),
    "shape product overflows u64": ('{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}}', b"x" * 8, ["`a`"]),
    "float shape": ('{"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}}', b"x" * 8, ["`a`", "shape"]),
    "exponent shape": ('{"a":{"dtype":"F32","shape":[2e0],"data_offsets":[0,8]}}', b"x" * 8, ["`a`", "shape"]),
    "negative shape": ('{"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}}', b"x" * 8, ["`a`", "shape"]),
    "negative zero shape": ('{"a":{"dtype":"F32","shape":[-0],"data_offsets":[0,0]}}', b"", ["`a`", "shape"]),
    "bool shape": ('{"a":{"dtype":"F32","shape":[true],"data_offsets":[0,4]}}', b"x" * 4, ["`a`", "shape"]),
    "string shape": ('{"a":{"dtype":"F32","shape":["2"],"data_offsets":[0,8]}}', b"x" * 8, ["`a`", "shape"]),
    "shape not a list": ('{"a":{"dtype":"F32","shape":2,"data_offsets":[0,8]}}', b"x" * 8, ["`a`", "shape"]),
    "shape beyond u64": ('{"a":{"dtype":"F32","shape":[18446744073709551617],"data_offsets":[0,8]}}', b"x" * 8, ["`a`"]),
    "shape of 5000 digits": ('{"a":{"dtype":"F32","shape":[%s],"data_offsets":[0,8]}}' % ("9" * 5000), b"x" * 8, ["`a`"]),
    "NaN shape": ('{"a":{"dtype":"F32","shape":[NaN],"data_offsets":[0,8]}}', b"x" * 8, ["NaN"]),
    "float offset": ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}}', b"x" * 8, ["`a`", "data_offsets"]),
    "bool offset": ('{"a":{"dtype":"BOOL","shape":[1],"data_offsets":[false,true]}}', b"x", ["`a`", "data_offsets"]),
    "three offsets": ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}}', b"x" * 8, ["`a`", "data_offsets"]),
    "reversed offsets": ('{"a":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}}', b"x" * 8, ["`a`", "data_offsets"]),
    "unknown dtype": ('{"a":{"dtype":"F31","shape":[2],"data_offsets":[0,8]}}', b"x" * 8, ["`a`", "unknown dtype"]),
    "lower-case dtype": ('{"a":{"dtype":"f32","shape":[2],"data_offsets":[0,8]}}', b"x" * 8, ["`a`", "unknown dtype"]),
    "dtype not a string": ('{"a":{"dtype":4,"shape":[2],"data_offsets":[0,8]}}', b"x" * 8, ["`a`", "unknown dtype"]),
    "missing field": ('{"a":{"dtype":"F32","shape":[2]}}', b"x" * 8, ["`a`", "data_offsets", "missing"]),
    "entry null": ('{"a":null}', b"", ["`a`"]),
    "entry a list": ('{"a":[1,2]}', b"", ["`a`"]),
    "metadata value int": ('{"__metadata__":{"k":1},"a":%s}' % T, b"x" * 8, ["__metadata__"]),
    "metadata value null": ('{"__metadata__":{"k":null},"a":%s}' % T, b"x" * 8, ["__metadata__"]),
    "metadata a list": ('{"__metadata__":[],"a":%s}' % T, b"x" * 8, ["__metadata__"]),
    "metadata a tensor": ('{"__metadata__":%s}' % T, b"x" * 8, ["__metadata__"]),
    "header a list": ("[]", b"", ["not an object"]),
    "header a string": ('"{}"', b"", ["not an object"]),
    "header empty": ("", b"", ["not valid JSON"]),
    "header NUL padded": ('{"a":%s}\0\0' % T, b"x" * 8, ["not valid JSON"]),
    "header with BOM": (b"\xef\xbb\xbf" + ('{"a":%s}' % T).encode(), b"x" * 8, ["not valid JSON"]),
    "trailing comma": ('{"a":%s,}' % T, b"x" * 8, ["not valid JSON"]),
    "invalid UTF-8": (b'{"\xff":' + T.encode() + b"}", b"x" * 8, ["UTF-8"]),
    "lone surrogate": ('{"\\ud800":%s}' % T, b"x" * 8, ["surrogate"]),
    "nested too deep": ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":%s%s}}' % ("[" * 200, "]" * 200), b"x" * 8, ["nested"]),
    "nested 100000 deep": ('{"a":%s%s}' % ("[" * 100000, "]" * 100000), b"", ["nested"]),
}

ACCEPTED = {  # name: (header, data)
    "one tensor": ('{"a":%s}' % T, b"x" * 8),
    "no tensors": ("{}", b""),
    "space padded (what writers do)": ('{"a":%s}     ' % T, b"x" * 8),
    "leading whitespace": ('  \n{"a":%s}' % T, b"x" * 8),
    "metadata null": ('{"__metadata__":null,"a":%s}' % T, b"x" * 8),
    "metadata strings": ('{"__metadata__":{"format":"pt","k":""},"a":%s}' % T, b"x" * 8),
    "unknown extra field ignored": ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":[1.5,null]}}', b"x" * 8),
    "scalar": ('{"a":{"dtype":"F32","shape":[],"data_offsets":[0,4]}}', b"x" * 4),
    "zero-size tensors share an offset": ('{"a":{"dtype":"F32","shape":[0],"data_offsets":[0,0]},'
                                          '"b":{"dtype":"F32","shape":[0,3],"data_offsets":[0,0]},"c":%s}' % T, b"x" * 8),
    "entries out of offset order": ('{"b":%s,"a":%s}' % (T2, T), b"x" * 16),
    "empty name": ('{"":%s}' % T, b"x" * 8),
    "escaped name": ('{"\\u00e9\\ud83d\\ude00":%s}' % T, b"x" * 8),
    "nested 100 deep in an extra field": ('{"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":%s%s}}'
                                          % ("[" * 100, "]" * 100), b"x" * 8),
}


@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refused_with_the_rule_named(tmp_path, case):
    header, data, needles = REFUSED[case]
    f = build(tmp_path / "model.safetensors", header, data)
    with pytest.raises(DFlashError) as exc:
        read_header(f)
    message = str(exc.value)
    assert message.startswith(str(f)) and "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)
    if case not in ("duplicate tensor, same offsets",):  # the one fault the reference lets through
        assert reference_reads(f) is None, "the reference library accepts this file: not a format fault"


@pytest.mark.parametrize("case", sorted(ACCEPTED))
def test_valid_files_read_as_the_reference_reads_them(tmp_path, case):
    header, data = ACCEPTED[case]
    f = build(tmp_path / "model.safetensors", header, data)
    assert reference_reads(f) is not None
    assert ours_reads(f) == reference_reads(f)


@pytest.mark.parametrize("length, needle", [(0, "not valid JSON"), (1, "not valid JSON"),
                                            (100_000_001, "header length"), (2**64 - 1, "header length")])
def test_header_length_bounds(tmp_path, length, needle):
    f = build(tmp_path / "model.safetensors", "{}", b"", length=length)
    assert reference_reads(f) is None
    with pytest.raises(DFlashError, match=needle):
        read_header(f)


def test_short_file_and_non_regular_file(tmp_path):
    import os

    short = tmp_path / "short.safetensors"
    short.write_bytes(b"\x02\0\0")
    with pytest.raises(DFlashError, match="truncated"):
        read_header(short)
    fifo = tmp_path / "fifo.safetensors"
    os.mkfifo(fifo)
    with pytest.raises(DFlashError, match="not a regular file"):
        read_header(fifo)  # must not block waiting for a writer


def test_header_value_count_is_bounded_before_parsing(tmp_path, monkeypatch):
    import dflash_convert.io.safetensors as sio

    monkeypatch.setattr(sio, "MAX_HEADER_VALUES", 1000)  # the rule, at a size a test builds quickly
    shape = ",".join(["1"] * 997)  # 996 commas in the shape, 3 more in the entry: 999
    f = build(tmp_path / "model.safetensors", '{"a":{"dtype":"U8","shape":[%s],"data_offsets":[0,1]}}' % shape, b"x")
    assert ours_reads(f) == reference_reads(f) == {"a": ("U8", (1,) * 997)}
    f = build(tmp_path / "model.safetensors", '{"a":{"dtype":"U8","shape":[%s,1],"data_offsets":[0,1]}}' % shape,
              b"x")
    with pytest.raises(DFlashError, match="over 1000 JSON values; refused before parsing"):
        read_header(f)
    assert reference_reads(f) is not None  # valid: refused for its cost, not its form


def test_valid_dtypes_we_cannot_convert_are_named(tmp_path):
    for dtype, shape, nbytes in [("F4", [2], 1), ("C64", [1], 8), ("F6_E2M3", [4], 3)]:
        f = build(tmp_path / "model.safetensors", '{"a":{"dtype":"%s","shape":%s,"data_offsets":[0,%d]}}'
                  % (dtype, shape, nbytes), b"x" * nbytes)
        with pytest.raises(DFlashError, match=f"dtype {dtype} is valid safetensors but not supported"):
            read_header(f)


# ----------------------------------------------------------------------------- differential fuzz

CODES = sorted(DTYPES)
JSON_VALUES = st.one_of(st.integers(-3, 40), st.floats(allow_nan=False, allow_infinity=False, width=32),
                        st.booleans(), st.none(), st.text(max_size=3), st.lists(st.integers(0, 4), max_size=3))


@st.composite
def mutated_files(draw):
    """A valid header of 1-4 tensors, then 0-3 mutations of the kinds writers and attackers produce."""
    n = draw(st.integers(1, 4))
    tensors, pos = {}, 0
    for i in range(n):
        dtype = draw(st.sampled_from(CODES))
        shape = draw(st.lists(st.integers(0, 3), max_size=3))
        size = DTYPES[dtype].itemsize
        for d in shape:
            size *= d
        tensors[f"t{i}"] = {"dtype": dtype, "shape": shape, "data_offsets": [pos, pos + size]}
        pos += size
    header: dict = dict(tensors)
    if draw(st.booleans()):
        header["__metadata__"] = {"format": "pt"}
    data_len, pad, prefix_delta = pos, "", 0
    names = list(tensors)
    for _ in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from(["offset", "shape", "shape_value", "dtype", "metadata", "data_len", "pad",
                                     "prefix", "drop_field", "entry"]))
        name = draw(st.sampled_from(names))
        entry = header[name] if isinstance(header[name], dict) else {}  # an earlier mutation replaced it
        if kind == "offset" and isinstance(entry.get("data_offsets"), list):
            entry["data_offsets"][draw(st.integers(0, 1))] += draw(st.integers(-9, 9))
        elif kind == "shape":
            entry["shape"] = draw(st.lists(st.integers(0, 4), max_size=3))
        elif kind == "shape_value" and isinstance(entry.get("shape"), list) and entry["shape"]:
            entry["shape"][0] = draw(JSON_VALUES)
        elif kind == "dtype":
            entry["dtype"] = draw(st.sampled_from(CODES + ["F4", "C64", "f32", "", "FP32"]))
        elif kind == "metadata":
            header["__metadata__"] = draw(st.one_of(st.none(), st.dictionaries(st.text(max_size=3), JSON_VALUES,
                                                                                max_size=2)))
        elif kind == "data_len":
            data_len = max(0, data_len + draw(st.integers(-9, 9)))
        elif kind == "pad":
            pad = draw(st.sampled_from([" ", "   ", "\n", "\t", "\0", "x", " }"]))
        elif kind == "prefix":
            prefix_delta = draw(st.integers(-3, 3))
        elif kind == "drop_field":
            entry.pop(draw(st.sampled_from(["dtype", "shape", "data_offsets"])), None)
        elif kind == "entry":
            header[name] = draw(JSON_VALUES)
    raw = json.dumps(header).encode() + pad.encode()
    return raw, b"\x3f" * data_len, len(raw) + prefix_delta


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=mutated_files())
def test_fuzz_agrees_with_the_reference(tmp_path, case):
    raw, data, length = case
    f = tmp_path / "fuzz.safetensors"
    f.write_bytes(struct.pack("<Q", max(length, 0)) + raw + data)
    theirs = reference_reads(f)
    ours = ours_reads(f)
    if theirs is not None and any(dtype not in DTYPES for dtype, _ in theirs.values()):
        assert ours is None  # valid, but a dtype we refuse by name (checked above)
        return
    assert ours == theirs


# ----------------------------------------------------------------------------- through the CLI

def _rewrite_header(f: Path, edit) -> None:
    """Apply `edit(header_dict) -> header text` to a real safetensors file, keeping its data."""
    blob = f.read_bytes()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    text, data = edit(header, blob[8 + n:])
    raw = text.encode()
    f.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


def _dup_norm(h, data):
    # the laundering case: a second `norm.weight` entry pointing at another tensor's bytes
    other = h["hidden_norm.weight"]
    body = json.dumps(h)[1:-1]
    return "{" + body + ', "norm.weight": ' + json.dumps(other) + "}", data


def _gap(h, data):
    name = max((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
    h[name]["data_offsets"] = [o + 4 for o in h[name]["data_offsets"]]
    return json.dumps(h), data + b"\0" * 4


def _overlap(h, data):
    name = max((k for k in h if k != "__metadata__"), key=lambda k: h[k]["data_offsets"][0])
    h[name]["data_offsets"] = [o - 4 for o in h[name]["data_offsets"]]
    return json.dumps(h), data[:-4]


def _float_shape(h, data):
    h["norm.weight"]["shape"] = [float(x) for x in h["norm.weight"]["shape"]]
    return json.dumps(h), data


def _meta_int(h, data):
    h["__metadata__"] = {"format": "pt", "step": 3}
    return json.dumps(h), data


def _trailing(h, data):
    return json.dumps(h), data + b"junk"


@pytest.mark.parametrize("edit, needles", [
    (_dup_norm, ["norm.weight", "twice"]),
    (_gap, ["gap"]),
    (_overlap, ["overlap"]),
    (_float_shape, ["norm.weight", "shape"]),
    (_meta_int, ["__metadata__"]),
    (_trailing, ["end exactly"]),
], ids=["duplicate", "gap", "overlap", "float-shape", "metadata-int", "trailing"])
def test_inspect_and_convert_refuse_malformed_files(cli, speculators_drafts, tmp_path, edit, needles):
    src = tmp_path / "src"
    shutil.copytree(speculators_drafts["full"], src)
    _rewrite_header(src / "model.safetensors", edit)
    assert reference_reads(src / "model.safetensors") is None
    r = cli("inspect", src)
    assert r.code == 1, (r.code, r.out, r.err)
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: ") and "model.safetensors" in lines[0], r.err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    out = tmp_path / "out"
    r = cli("convert", src, "-o", out)
    assert r.code == 1 and "model.safetensors" in r.err and "Traceback" not in r.err, r.err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["src"]
