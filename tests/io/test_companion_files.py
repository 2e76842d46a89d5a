"""Files beside the weights that engines read (catalogue.COMPANION_FILES: mask_embedding.pt, which vLLM and
SGLang load in place of the target's embedding of the mask token).

What a user relies on: conversion carries them byte for byte in both directions and records their hash,
nothing here ever unpickles them, diff counts them, and a hostile one (a FIFO, a dangling link, an absurd
size) is one error naming the file with nothing left at DST. (A Hub draft brings them along: tests/hub/test_hub.py.)
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
from pathlib import Path

import pytest

from dflash_convert.format import catalogue

MASK_EMBEDDING = catalogue.MASK_EMBEDDING_FILE

pytestmark = pytest.mark.usefixtures("one_timing_round")  # no test here reads the speedup


def with_mask_embedding(src, dest, data: bytes | None = None):
    """A copy of a draft with a mask_embedding.pt saved the way vLLM and SGLang read it (a torch.save dict)."""
    import io

    import torch

    shutil.copytree(src, dest)
    if data is None:
        buf = io.BytesIO()
        hidden = json.loads((src / "config.json").read_text())["transformer_layer_config"]["hidden_size"]
        torch.save({"embedding": torch.randn(hidden, generator=torch.Generator().manual_seed(0)),
                    "mask_token_id": 511}, buf)
        data = buf.getvalue()
    (dest / MASK_EMBEDDING).write_bytes(data)
    return dest


def test_carried_byte_for_byte_both_ways_and_recorded(cli, speculators_drafts, tmp_path):
    import hashlib

    src = with_mask_embedding(speculators_drafts["full"], tmp_path / "src")
    data = (src / MASK_EMBEDDING).read_bytes()
    hf, back = tmp_path / "hf", tmp_path / "back"
    assert cli("convert", src, "-o", hf).code == 0
    assert cli("convert", hf, "-o", back, "--no-verifier").code == 0
    for out in (hf, back):
        assert (out / MASK_EMBEDDING).read_bytes() == data
        record = json.loads((out / "conversion.json").read_text())
        assert record["files_carried"] == [MASK_EMBEDDING]
        assert record["input_files"][MASK_EMBEDDING] == hashlib.sha256(data).hexdigest()
    r = cli("diff", src, back, "--json")
    assert r.code == 0 and r.json()["files"] == {MASK_EMBEDDING: "equal"} and r.json()["equivalent"]


def test_diff_counts_a_missing_or_changed_mask_embedding(cli, speculators_drafts, tmp_path):
    a = with_mask_embedding(speculators_drafts["full"], tmp_path / "a")
    b = with_mask_embedding(speculators_drafts["full"], tmp_path / "b", data=b"other bytes")
    r = cli("diff", a, speculators_drafts["full"], "--json")
    assert r.code == 3 and r.json()["files"] == {MASK_EMBEDDING: "only_in_a"} and not r.json()["equivalent"]
    r = cli("diff", a, b, "--json")
    assert r.code == 3 and r.json()["files"] == {MASK_EMBEDDING: "differs"}


def test_never_unpickled(cli, speculators_drafts, tmp_path):
    """A mask_embedding.pt that runs code when unpickled: convert, inspect and diff copy and hash it, never load it."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    src = with_mask_embedding(speculators_drafts["full"], tmp_path / "src", data=pickle.dumps(Evil()))
    out = tmp_path / "out"
    assert cli("convert", src, "-o", out).code == 0
    inspected = cli("inspect", out, "--json")  # an engine that ignores the embedding is inspect's only problem
    assert inspected.code in (0, 3) and all(n.startswith("engine_view.") for n in inspected.failed_checks())
    assert cli("diff", src, out).code == 0
    assert not marker.exists()
    assert (out / MASK_EMBEDDING).read_bytes() == (src / MASK_EMBEDDING).read_bytes()


def test_not_taken_for_pickle_weights(cli, speculators_drafts, tmp_path):
    """A pickle checkpoint (--allow-pickle) with a mask embedding beside it: the embedding is not a state dict."""
    import torch
    from safetensors.torch import load_file

    src = with_mask_embedding(speculators_drafts["full"], tmp_path / "src")
    torch.save(load_file(src / "model.safetensors"), src / "pytorch_model.bin")
    (src / "model.safetensors").unlink()
    out = tmp_path / "out"
    r = cli("convert", src, "-o", out, "--allow-pickle")
    assert r.code == 0, r.err
    assert (out / MASK_EMBEDDING).read_bytes() == (src / MASK_EMBEDDING).read_bytes()


@pytest.mark.parametrize("kind", ["fifo", "dangling_link", "directory", "too_large"])
def test_hostile_mask_embedding_is_one_error_and_nothing_written(cli, speculators_drafts, tmp_path, kind):
    src = tmp_path / "src"
    shutil.copytree(speculators_drafts["full"], src)
    f = src / MASK_EMBEDDING
    if kind == "fifo":
        os.mkfifo(f)
    elif kind == "dangling_link":
        f.symlink_to(tmp_path / "nowhere")
    elif kind == "directory":
        f.mkdir()
    else:
        with open(f, "wb") as fh:  # sparse: the size is what counts
            fh.truncate(catalogue.MAX_COMPANION_BYTES + 1)
    out = tmp_path / "out"
    r = cli("convert", src, "-o", out)
    assert r.code == 1 and r.err.startswith("Error:") and MASK_EMBEDDING in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1 and "Traceback" not in r.err
    assert not out.exists() and [p.name for p in tmp_path.iterdir()] == ["src"]


# ----------------------------------------------------------------------------- validate runs it as vLLM and SGLang do

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"


@pytest.fixture(scope="module")
def pair_prompts(tmp_path_factory) -> Path:
    prompts = tmp_path_factory.mktemp("prompts") / "prompts.txt"
    prompts.write_text("\n".join((PAIR / "prompts.txt").read_text().splitlines()[:3]) + "\n")
    return prompts


def pair_with(tmp_path, state) -> Path:
    import torch

    draft = Path(shutil.copytree(PAIR / "draft", tmp_path / "draft"))
    torch.save(state, draft / MASK_EMBEDDING)
    return draft


def run_pair(cli, draft, prompts, *extra):
    r = cli("validate", draft, "--target", PAIR / "target", "--prompts", prompts, "--max-new-tokens", "32",
            "--threads", "1", "--levels", "static,end_to_end", "--sampling", "greedy", "--json", *extra)
    report = r.json()
    return r.code, {c["name"]: c for c in report["checks"]}, report.get("acceptance")


def target_mask_row():
    from safetensors.torch import load_file

    return load_file(PAIR / "target" / "model.safetensors")["model.embed_tokens.weight"][511].float()


def test_validate_embeds_the_mask_slots_with_it_only_when_allowed(cli, pair_prompts, tmp_path):
    """The target's own mask row saved as the mask embedding changes nothing; a random one, loaded with
    --allow-pickle, wrecks acceptance (so it is really used); without --allow-pickle it is a warning, unused."""
    import torch

    code, checks, same = run_pair(cli, pair_with(tmp_path / "same", {"embedding": target_mask_row(),
                                                                     "mask_token_id": 511}), pair_prompts,
                                  "--allow-pickle")
    assert code == 0 and checks["mask_embedding"]["status"] == "pass"
    noise = {"embedding": 10 * torch.randn(64, generator=torch.Generator().manual_seed(0)), "mask_token_id": 511}
    code, checks, wrecked = run_pair(cli, pair_with(tmp_path / "noise", noise), pair_prompts, "--allow-pickle")
    assert code == 0 and checks["mask_embedding"]["status"] == "pass"
    assert wrecked["acceptance_length"] < 0.5 * same["acceptance_length"]
    assert wrecked["outputs_equal"] == wrecked["prompts"]  # lossless still
    code, checks, unused = run_pair(cli, tmp_path / "noise" / "draft", pair_prompts)
    assert code == 0 and checks["mask_embedding"]["status"] == "warn" and "--allow-pickle" in \
        checks["mask_embedding"]["message"]
    assert unused["acceptance_length"] == same["acceptance_length"]


@pytest.mark.parametrize("state, needle", [
    ({"embedding": "tensor", "mask_token_id": 7}, "`mask_token_id` is 7"),
    ({"embedding": "tensor", "mask_token_id": 511, "per_position": True}, "per-position"),
    ({"embedding": "short"}, "hidden size is 64"),
    ({"embedding": "nan"}, "NaN"),
    ([1, 2, 3], "no float tensor"),
])
def test_validate_fails_a_mask_embedding_engines_refuse(cli, pair_prompts, tmp_path, state, needle):
    import torch

    if isinstance(state, dict):
        e = {"tensor": torch.zeros(64), "short": torch.zeros(32), "nan": torch.full((64,), float("nan"))}
        state = {**state, "embedding": e[state["embedding"]]}
    code, checks, _ = run_pair(cli, pair_with(tmp_path, state), pair_prompts, "--allow-pickle")
    assert code == 3 and checks["mask_embedding"]["status"] == "fail"
    assert needle in checks["mask_embedding"]["message"] and MASK_EMBEDDING in checks["mask_embedding"]["message"]


def test_validate_engine_zlab_ignores_it(cli, pair_prompts, tmp_path):
    draft = pair_with(tmp_path, {"embedding": target_mask_row(), "mask_token_id": 511})
    code, checks, _ = run_pair(cli, draft, pair_prompts, "--allow-pickle", "--engine", "zlab")
    assert "mask_embedding" not in checks and "mask_embedding" in checks["engine_fidelity"]["message"]
    code, checks, _ = run_pair(cli, draft, pair_prompts, "--allow-pickle", "--engine", "vllm")
    assert code == 0 and checks["mask_embedding"]["status"] == "pass"


def test_the_compiled_step_embeds_mask_slots_with_it_too(tmp_path):
    import torch

    from dflash_runtime import load_draft, load_target, speculative_generate

    noise = {"embedding": 10 * torch.randn(64, generator=torch.Generator().manual_seed(0)), "mask_token_id": 511}
    draft_dir = pair_with(tmp_path, noise)
    target = load_target(PAIR / "target")
    prompt = [int(t) for t in (PAIR / "prompts.txt").read_text().split("\n")[0].split()]
    accepted = {}
    from dflash_convert.io.checkpoint import open_checkpoint

    vector = open_checkpoint(draft_dir).load_mask_embedding(allow_pickle=True)
    for name, kw in {"plain": {}, "eager": {"mask_embedding": vector},
                     "compiled": {"mask_embedding": vector, "compile": True, "backend": "sdpa"}}.items():
        out = speculative_generate(load_draft(draft_dir, **kw), target, prompt, max_new_tokens=32)
        accepted[name] = out.stats.accepted
    assert accepted["compiled"] == accepted["eager"] < accepted["plain"] / 2
