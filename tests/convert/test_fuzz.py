"""Property-based tests of the CLI's contract on mutated inputs (hypothesis).

Starting from a valid draft saved by speculators itself (and its HF conversion), each example
mutates config.json or the safetensors header: one value anywhere in the tree replaced by a
hostile one (wrong type, bool, zero, negative, huge, NaN/Infinity, deep nesting, long string, any
dtype code), a key removed, added or renamed (to another tensor's name, a layer the config does
not have), or the config's bytes cut or corrupted. Whatever the mutation, `convert` and `inspect`
either succeed with valid output, or fail with exit 1 or 2 (inspect: 3, a reported problem) and
exactly one `Error:` line naming a file of the checkpoint, no traceback, no exception type in place
of a message, and nothing at or beside the destination. (Header rules themselves are compared
with the reference library in test_safetensors_format.py.)

Budget (README, "Exit codes"): CONFIG_EXAMPLES + RAW_EXAMPLES + HEADER_EXAMPLES generated cases,
derandomized (the same cases every run), deadline off.
"""

from __future__ import annotations

import json
import math
import re
import shutil
import struct
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import run_cli

CONFIG_EXAMPLES = 150
RAW_EXAMPLES = 50
HEADER_EXAMPLES = 60
FUZZ = settings(deadline=None, derandomize=True, suppress_health_check=list(HealthCheck), database=None)
EXCEPTION_NAME = re.compile(r"Error: [A-Za-z_.]*(Error|Exception|Interrupt|Exit)\b")

# One strategy per class of hostile value, drawn with equal weight (so each class is hit often),
# then anything hypothesis makes of each JSON type.
hostile_scalars = st.one_of(
    st.sampled_from([math.nan, math.inf, -math.inf]),  # not JSON: Python writes and reads them anyway
    st.booleans(),  # bool is an int subclass in Python
    st.none(),
    st.sampled_from([0, -1, 1, 2, 511, 512, 10**9, 2**63, -(2**63), 10**30, 10**300]),  # edges, absurd sizes
    st.integers(min_value=-10**6, max_value=10**6),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(["", "8", "1e-6", "qwen3", "sliding_attention", "full_attention", "DFlashDraftModel"]),
    st.text(max_size=20),
)
hostile_values = st.one_of(
    hostile_scalars,
    st.lists(hostile_scalars, max_size=5),
    st.dictionaries(st.text(max_size=8), hostile_scalars, max_size=4),
    st.integers(min_value=30, max_value=200).map(lambda d: json.loads("[" * d + "]" * d)),  # deep nesting
)
# Keys an "add" mutation puts beside existing ones: unknown ones (carried through) and known ones out of place.
ADDED_KEYS = ["x_unknown", "initializer_range", "block_size", "is_causal", "num_target_layers", "mask_token_id",
              "target_layer_ids", "eos_token_id", "rope_theta", "dflash_config", "draft_vocab_size", "head_dim"]


def paths_of(value, prefix=()):
    """Every path (tuple of keys / indices) in a JSON tree, containers included."""
    out = [prefix] if prefix else []
    if isinstance(value, dict):
        for k, v in value.items():
            out += paths_of(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += paths_of(v, prefix + (i,))
    return out


def value_at(tree, path: tuple):
    for key in path:
        tree = tree[key]
    return tree


def mutate(cfg: dict, path: tuple, how: str, value, new_key: str = "x_unknown") -> dict:
    cfg = json.loads(json.dumps(cfg))
    parent = cfg
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    if how == "delete":
        del parent[last]
    elif how == "rename":  # the value under another key (a tensor under another tensor's name)
        if isinstance(parent, dict):
            parent[value if isinstance(value, str) else str(value)] = parent.pop(last)
        else:
            parent.reverse()
    elif how == "add":  # a new key beside it (an unknown one, or a known one where it does not belong)
        if isinstance(parent, dict):
            parent[new_key] = value
        else:
            parent.append(value)
    else:
        parent[last] = value
    return cfg


@pytest.fixture(scope="module")
def sources(speculators_drafts, tiny_target, tmp_path_factory):
    """A speculators draft (pruned: d2t/t2d too) and its HF conversion, the fuzz test's valid starting points."""
    root = tmp_path_factory.mktemp("fuzz")
    hf = root / "hf"
    assert run_cli("convert", speculators_drafts["pruned"], "-o", hf, "--verifier", tiny_target).code == 0
    return {"speculators": speculators_drafts["pruned"], "hf": hf}


def check_contract(r, out: Path | None, src: Path) -> None:
    """exit 0 with a readable result, or exit 1/2 with one `Error:` line naming a file of the source
    checkpoint (its config, or the weights the config disagrees with) and nothing at DST."""
    assert "Traceback" not in r.err, r.err
    if r.code == 0:
        if out is not None:
            from dflash_convert.io.checkpoint import open_checkpoint

            json.loads((out / "config.json").read_text(), parse_constant=lambda c: 1 / 0)  # strict JSON
            open_checkpoint(out)  # what we wrote passes the validation we apply on reading
            assert not [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")]  # no staging left
        return
    assert r.code in (1, 2, 3), (r.code, r.err)
    if r.code == 3:  # inspect: the config was read, a check failed (a reported problem, not an error)
        return
    errors = [line for line in r.err.splitlines() if line.startswith("Error")]
    assert len(errors) == 1, r.err
    assert not EXCEPTION_NAME.match(errors[0]), errors[0]
    assert f"{src}/" in errors[0] or r.code == 2, errors[0]
    if out is not None:
        assert not out.exists(), errors[0]
        assert not [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}")], errors[0]


def run_both(src_dir: Path, config_bytes: bytes, file_name: str = "config.json") -> None:
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "src"
        shutil.copytree(src_dir, src)
        (src / file_name).write_bytes(config_bytes)
        out = Path(tmp) / "out"
        check_contract(run_cli("convert", src, "-o", out, "--no-verifier"), out, src)
        check_contract(run_cli("inspect", src), None, src)


@settings(FUZZ, max_examples=CONFIG_EXAMPLES)
@given(data=st.data(), fmt=st.sampled_from(["speculators", "hf"]),
       how=st.sampled_from(["replace", "replace", "replace", "delete", "add"]), value=hostile_values)
def test_mutated_configs_keep_the_contract(sources, data, fmt, how, value):
    cfg = json.loads((sources[fmt] / "config.json").read_text())
    paths = paths_of(cfg)
    leaves = [p for p in paths if not isinstance(value_at(cfg, p), (dict, list))]
    path = data.draw(st.sampled_from(leaves) | st.sampled_from(paths), label="path")  # leaves half the time
    mutated = mutate(cfg, path, how, value, data.draw(st.sampled_from(ADDED_KEYS), label="new key"))
    try:
        text = json.dumps(mutated)  # NaN/Infinity written as Python writes them (not JSON: must be refused)
    except (ValueError, RecursionError):
        return
    run_both(sources[fmt], text.encode())


@settings(FUZZ, max_examples=RAW_EXAMPLES)
@given(fmt=st.sampled_from(["speculators", "hf"]), cut=st.floats(0, 1),
       junk=st.binary(min_size=1, max_size=16), where=st.floats(0, 1))
def test_corrupted_config_bytes_keep_the_contract(sources, fmt, cut, junk, where):
    raw = (sources[fmt] / "config.json").read_bytes()
    at = int(where * len(raw))
    corrupted = raw[:at] + junk + raw[at:]
    corrupted = corrupted[: max(1, int(len(corrupted) * (0.5 + cut / 2)))] if cut < 0.3 else corrupted
    run_both(sources[fmt], corrupted)


TENSOR_NAMES = ["fc.weight", "norm.weight", "hidden_norm.weight", "d2t", "t2d", "lm_head.weight", "model.norm.weight",
                "layers.0.mlp.up_proj.weight", "layers.1.self_attn.q_proj.weight", "layers.2.mlp.up_proj.weight",
                "layers.99999999999999999999.mlp.up_proj.weight", "embed_tokens.weight", "__metadata__", "x"]


def header_values():
    from dflash_convert.format.dtypes import DTYPES

    return st.one_of(hostile_values, st.sampled_from([*DTYPES, "F4", "C64", "f32"]), st.sampled_from(TENSOR_NAMES),
                     st.lists(st.integers(-2, 70000), max_size=4))


@settings(FUZZ, max_examples=HEADER_EXAMPLES)
@given(data=st.data(), how=st.sampled_from(["replace", "replace", "rename", "rename", "delete", "add"]))
def test_mutated_safetensors_headers_keep_the_contract(sources, data, how):
    raw = (sources["speculators"] / "model.safetensors").read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    path = data.draw(st.sampled_from(paths_of(header)), label="path")
    value = data.draw(header_values(), label="value")
    try:
        text = json.dumps(mutate(header, path, how, value)).encode()
    except (ValueError, RecursionError):
        return
    text += b" " * (-len(text) % 8)
    run_both(sources["speculators"], struct.pack("<Q", len(text)) + text + raw[8 + n:], "model.safetensors")
