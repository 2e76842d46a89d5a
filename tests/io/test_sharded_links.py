"""Sharded checkpoints whose files are symlinks, laid out as the Hub cache lays them out.

snapshots/<rev>/<name> -> ../../blobs/<sha256>: the shard names in weight_map are checked (plain
file names in the checkpoint directory), not where the links resolve to.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest


def hub_cache_layout(src: Path, root: Path) -> Path:
    """Move every file of `src` into root/blobs/<sha256> and link it from root/snapshots/<rev>/."""
    blobs, snap = root / "blobs", root / "snapshots" / ("a" * 40)
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for f in sorted(src.iterdir()):
        digest = hashlib.sha256(f.read_bytes()).hexdigest()
        shutil.copy(f, blobs / digest)
        os.symlink(Path("..") / ".." / "blobs" / digest, snap / f.name)
    return snap


@pytest.fixture(scope="module")
def sharded(speculators_drafts, tmp_path_factory):
    from conftest import run_cli

    out = tmp_path_factory.mktemp("sharded") / "sharded"
    r = run_cli("convert", speculators_drafts["full"], "-o", out, "--to", "speculators", "--max-shard-size", "100KB")
    assert r.code == 0, r.err
    assert len(list(out.glob("model-*.safetensors"))) > 1
    return out


def test_hub_cache_symlinked_shards_convert_and_inspect(cli, sharded, speculators_drafts, tmp_path):
    snap = hub_cache_layout(sharded, tmp_path / "models--org--draft")
    assert all((snap / f.name).is_symlink() for f in sharded.iterdir())
    r = cli("inspect", snap, "--json")
    assert r.code == 0, r.err
    assert r.json()["ok"]
    out = tmp_path / "hf"
    r = cli("convert", snap, "-o", out)
    assert r.code == 0, r.err
    assert cli("diff", speculators_drafts["full"], out).code == 0
    record = json.loads((out / "conversion.json").read_text())
    # the blob names are the files' sha256: the record's input hashes are those
    for name, digest in record["input_files"].items():
        assert (snap / name).resolve().name == digest


def test_shards_linked_anywhere_are_read(cli, sharded, speculators_drafts, tmp_path):
    """A local checkpoint whose shards are absolute links to another directory."""
    store, ckpt = tmp_path / "store", tmp_path / "ckpt"
    shutil.copytree(sharded, store)
    ckpt.mkdir()
    for f in store.iterdir():
        (ckpt / f.name).symlink_to(f.resolve() if f.suffix == ".safetensors" else f)
    out = tmp_path / "out"
    assert cli("convert", ckpt, "-o", out, "--to", "hf").code == 0
    assert cli("diff", speculators_drafts["full"], out).code == 0


def _point_index_at(ckpt: Path, shard_name: str) -> None:
    index = ckpt / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    first = sorted(data["weight_map"])[0]
    data["weight_map"][first] = shard_name
    index.unlink()  # it may be a link into blobs/: never write through it
    index.write_text(json.dumps(data))


@pytest.mark.parametrize("shard_name", ["../outside.safetensors", "ABSOLUTE", "sub/model.safetensors", "..", ".",
                                        "", "a\\..\\b.safetensors"])
def test_weight_map_outside_the_directory_is_refused(cli, sharded, tmp_path, shard_name):
    ckpt = tmp_path / "snap"
    shutil.copytree(sharded, ckpt)
    outside = tmp_path / "outside.safetensors"
    shutil.copy(sorted(sharded.glob("model-*.safetensors"))[0], outside)  # a real file exists out there
    (ckpt / "sub").mkdir()
    shutil.copy(outside, ckpt / "sub" / "model.safetensors")
    if shard_name == "ABSOLUTE":
        shard_name = str(outside)
    _point_index_at(ckpt, shard_name)
    for cmd in (["inspect", ckpt], ["convert", ckpt, "-o", tmp_path / "out"]):
        r = cli(*cmd)
        assert r.code == 1, (cmd, r.err)
        lines = [line for line in r.err.splitlines() if line.strip()]
        assert len(lines) == 1 and "model.safetensors.index.json" in lines[0] and "plain file name" in lines[0], r.err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("value", [["model-00001.safetensors"], 3, None, {"a": 1}])
def test_weight_map_value_not_a_string(cli, sharded, tmp_path, value):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(sharded, ckpt)
    index = ckpt / "model.safetensors.index.json"
    data = json.loads(index.read_text())
    data["weight_map"][sorted(data["weight_map"])[0]] = value
    index.write_text(json.dumps(data))
    r = cli("inspect", ckpt)
    assert r.code == 1 and "model.safetensors.index.json" in r.err and "Traceback" not in r.err, r.err


def test_shard_link_to_a_fifo_or_directory_is_refused(cli, sharded, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(sharded, ckpt)
    shard = sorted(ckpt.glob("model-*.safetensors"))[0]
    shard.unlink()
    os.mkfifo(tmp_path / "fifo")
    shard.symlink_to(tmp_path / "fifo")  # opening it would block forever
    r = cli("inspect", ckpt)
    assert r.code == 1 and shard.name in r.err and "not a file" in r.err, r.err
    shard.unlink()
    shard.symlink_to(tmp_path)
    r = cli("inspect", ckpt)
    assert r.code == 1 and shard.name in r.err and "not a file" in r.err, r.err
