"""Bad input: one line naming the file and the field or tensor, a documented exit code, nothing at DST."""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from factories import read_config
from processes import stop_signals_at_default


def broken_copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def edit_config(path: Path, fn) -> None:
    cfg = read_config(path)
    fn(cfg)
    (path / "config.json").write_text(json.dumps(cfg))


def assert_clean_failure(r, out: Path, code: int, *needles: str):
    assert r.code == code, (r.code, r.err)
    lines = [line for line in r.err.strip().splitlines() if line.strip()]
    assert len(lines) == 1, r.err  # one line, no traceback
    assert lines[0].startswith("Error: ")
    assert "Traceback" not in r.err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    assert not out.exists()
    assert not any(p.name.startswith(f".{out.name}.") for p in out.parent.iterdir())


def write_header(f: Path, header: dict, data: bytes = b"") -> None:
    raw = json.dumps(header).encode()
    f.write_bytes(struct.pack("<Q", len(raw)) + raw + data)


@pytest.fixture
def full(speculators_drafts, tmp_path):
    return broken_copy(speculators_drafts["full"], tmp_path / "src")


@pytest.mark.parametrize("edit, needles", [
    (lambda c: c.pop("transformer_layer_config"), ["config.json", "transformer_layer_config"]),
    (lambda c: c.update(block_size="eight"), ["config.json", "block_size"]),
    (lambda c: c["transformer_layer_config"].update(hidden_size=None), ["transformer_layer_config.hidden_size"]),
    (lambda c: c.update(aux_hidden_state_layer_ids=[0, 4, 6]), ["aux_hidden_state_layer_ids", "embedding"]),
    (lambda c: c.update(mask_token_id=None), ["mask_token_id", "--mask-token-id"]),
    (lambda c: c.update(aux_hidden_state_layer_ids=[1, 4]), ["fc.weight", "[64, 128]"]),
    # a dflash draft relabelled dspark: speculators would build a rank-256 Markov head it does not have
    (lambda c: c.update(speculators_model_type="dspark"), ["markov_head.markov_w1.weight", "markov_rank=256"]),
    (lambda c: c.update(speculators_model_type="xpress"), ["xpress"]),
    (lambda c: c.update(speculators_model_type="eagle3"), ["eagle3", "EAGLE-3"]),
    (lambda c: c.update(speculators_model_type="medusa"), ["medusa"]),
    (lambda c: c.update(sample_from_anchor=True), ["sample_from_anchor"]),
])
def test_bad_config(cli, full, tmp_path, edit, needles):
    edit_config(full, edit)
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", full, "-o", out), out, 1, *needles)


def test_speculators_and_hf_layer_ids_that_contradict(cli, full, tmp_path):
    """Both formats' keys in one config.json: read as speculators (as vLLM does), the HF key SGLang reads
    naming other layers is an error naming both fields; agreeing keys are fine."""
    aux = read_config(full)["aux_hidden_state_layer_ids"]
    edit_config(full, lambda c: c.update(dflash_config={"target_layer_ids": [i - 1 for i in aux]}))
    assert cli("convert", full, "-o", tmp_path / "ok").code == 0
    edit_config(full, lambda c: c.update(dflash_config={"target_layer_ids": list(aux)}))  # the off-by-one
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", full, "-o", out), out, 1, "config.json", "dflash_config.target_layer_ids",
                         "aux_hidden_state_layer_ids", str(list(aux)))
    assert cli("inspect", full).code == 1


def test_not_a_dflash_config(cli, tiny_target, tmp_path):
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", tiny_target, "-o", out), out, 1, "config.json", "Qwen3ForCausalLM")


def test_config_not_json(cli, full, tmp_path):
    (full / "config.json").write_text("{not json")
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", full, "-o", out), out, 1, "config.json", "not valid JSON")



BOM_SAYS = "starts with a UTF-8 byte-order mark"


@pytest.mark.parametrize("command", ["convert", "inspect", "validate", "diff"])
def test_a_config_with_a_byte_order_mark_is_refused_by_every_command(cli, full, tmp_path, command):
    """transformers (and so vLLM and SGLang) parse config.json as plain UTF-8 and stop at a BOM: a draft
    that passed here would fail at serving time, so every command refuses it, naming the file (exit 1)."""
    path = full / "config.json"
    path.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    out = tmp_path / "out"
    args = {"convert": ["convert", full, "-o", out], "inspect": ["inspect", full],
            "validate": ["validate", full, "--levels", "static"], "diff": ["diff", full, full]}[command]
    assert_clean_failure(cli(*args), out, 1, "config.json", BOM_SAYS)


def test_a_target_config_or_index_with_a_byte_order_mark_is_refused(cli, speculators_drafts, tiny_target,
                                                                     tmp_path):
    target = broken_copy(tiny_target, tmp_path / "target")
    cfg = target / "config.json"
    cfg.write_bytes(b"\xef\xbb\xbf" + cfg.read_bytes())
    out = tmp_path / "out"
    r = cli("convert", speculators_drafts["full"], "-o", out, "--to", "hf", "--verifier", target)
    assert_clean_failure(r, out, 1, str(cfg), BOM_SAYS)
    sharded = broken_copy(speculators_drafts["full"], tmp_path / "sharded")
    (sharded / "model.safetensors").rename(sharded / "model-00001-of-00001.safetensors")
    from dflash_convert.io.safetensors import read_header

    names = list(read_header(sharded / "model-00001-of-00001.safetensors")[0])
    index = {"metadata": {}, "weight_map": {n: "model-00001-of-00001.safetensors" for n in names}}
    (sharded / "model.safetensors.index.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(index).encode())
    assert_clean_failure(cli("inspect", sharded), out, 1, "model.safetensors.index.json", BOM_SAYS)


def test_truncated_safetensors(cli, full, tmp_path):
    f = full / "model.safetensors"
    f.write_bytes(f.read_bytes()[:-100])
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", full, "-o", out), out, 1, "model.safetensors", "truncated")


def test_bad_header_length(cli, full, tmp_path):
    f = full / "model.safetensors"
    data = bytearray(f.read_bytes())
    data[:8] = struct.pack("<Q", 10**12)
    f.write_bytes(bytes(data))
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", full, "-o", out), out, 1, "model.safetensors", "header length")


def test_header_not_json(cli, full, tmp_path):
    f = full / "model.safetensors"
    f.write_bytes(struct.pack("<Q", 8) + b"garbage!")
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", full, "-o", out), out, 1, "model.safetensors", "not valid JSON")


def test_offsets_past_end(cli, full, tmp_path):
    write_header(full / "model.safetensors", {"fc.weight": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, b"1234")
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", full, "-o", out), out, 1, "model.safetensors", "fc.weight", "past the end")


def test_wrong_tensor_shape(cli, full, tmp_path):
    from safetensors.torch import load_file, save_file

    t = load_file(full / "model.safetensors")
    t["layers.1.self_attn.q_proj.weight"] = t["layers.1.self_attn.q_proj.weight"][:32]
    save_file(t, full / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", full, "-o", out), out, 1, "layers.1.self_attn.q_proj.weight", "[32, 64]")


def test_missing_and_unexpected_tensors(cli, full, tmp_path):
    from safetensors.torch import load_file, save_file

    t = load_file(full / "model.safetensors")
    del t["norm.weight"]
    save_file(t, full / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", full, "-o", out), out, 1, "model.safetensors", "norm.weight", "missing")
    t["norm.weight"] = t["hidden_norm.weight"].clone()
    t["markov_head.weight"] = t["hidden_norm.weight"].clone()
    save_file(t, full / "model.safetensors", metadata={"format": "pt"})
    assert_clean_failure(cli("convert", full, "-o", out), out, 1, "markov_head.weight", "unexpected")


@pytest.mark.parametrize("index", ["9" * 5000, "1" + "0" * 6, "00000000000000000000003"])
def test_layer_index_of_absurd_length_is_an_unexpected_tensor(cli, full, tmp_path, index):
    """A layer index is at most 6 digits: longer is an unknown tensor, never an int() of thousands of digits
    (Python refuses past 4300 with a bare ValueError); the error line names the file and stays short."""
    from safetensors.torch import load_file, save_file

    t = load_file(full / "model.safetensors")
    t[f"layers.{index}.input_layernorm.weight"] = t["hidden_norm.weight"].clone()
    save_file(t, full / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out"
    r = cli("convert", full, "-o", out)
    assert_clean_failure(r, out, 1, "model.safetensors", "unexpected tensor")
    assert len(r.err) < 400
    r = cli("inspect", full, "--json")
    assert r.code == 3 and "unexpected_tensors" in {c["name"] for c in r.json()["checks"] if c["status"] == "fail"}


def test_pruned_lm_head_without_d2t(cli, speculators_drafts, tmp_path):
    from safetensors.torch import load_file, save_file

    src = broken_copy(speculators_drafts["pruned"], tmp_path / "src")
    t = load_file(src / "model.safetensors")
    del t["d2t"], t["t2d"]
    save_file(t, src / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", src, "-o", out), out, 1, "d2t", "pruned lm_head")


def test_inconsistent_t2d(cli, speculators_drafts, tmp_path):
    from safetensors.torch import load_file, save_file

    src = broken_copy(speculators_drafts["pruned"], tmp_path / "src")
    t = load_file(src / "model.safetensors")
    t["t2d"] = t["t2d"].roll(1)
    save_file(t, src / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", src, "-o", out), out, 1, "t2d", "d2t")


def test_duplicate_tensor_across_shards(cli, speculators_drafts, tmp_path):
    sharded = tmp_path / "sharded"
    assert cli("convert", speculators_drafts["full"], "-o", sharded, "--max-shard-size", "100KB").code == 0
    shards = sorted(sharded.glob("model-*.safetensors"))
    shutil.copy(shards[0], shards[1])
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", sharded, "-o", out), out, 1, "appears twice")


def test_pickle_refused_then_loaded_safely(cli, speculators_drafts, tmp_path):
    import torch
    from safetensors.torch import load_file

    src = tmp_path / "pkl"
    src.mkdir()
    shutil.copy(speculators_drafts["full"] / "config.json", src)
    state = load_file(speculators_drafts["full"] / "model.safetensors")
    torch.save(state, src / "pytorch_model.bin")
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", src, "-o", out), out, 1, "pytorch_model.bin", "--allow-pickle")
    r = cli("convert", src, "-o", out, "--allow-pickle")
    assert r.code == 0, r.err
    assert cli("diff", speculators_drafts["full"], out).code == 0


def test_malicious_pickle_not_executed(cli, speculators_drafts, tmp_path):
    import pickle

    src = tmp_path / "evil"
    src.mkdir()
    shutil.copy(speculators_drafts["full"] / "config.json", src)
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    (src / "pytorch_model.bin").write_bytes(pickle.dumps({"x": Evil()}))
    out = tmp_path / "out"
    r = cli("convert", src, "-o", out, "--allow-pickle")
    assert r.code == 1 and "weights_only" in r.err
    assert not marker.exists() and not out.exists()


def test_destination_inside_source(cli, full):
    r = cli("convert", full, "-o", full / "converted")
    assert r.code == 1 and "inside the source" in r.err
    assert not (full / "converted").exists()


def test_usage_errors_exit_2(cli, full, tmp_path):
    out = tmp_path / "out"
    assert cli("convert", full, "-o", out, "--to", "gguf").code == 2
    assert cli("convert", full, "-o", out, "--target-layer-ids", "a,b").code == 2
    assert cli("convert", full, "-o", out, "--max-shard-size", "lots").code == 2
    assert cli("convert", full).code == 2
    assert cli("no-such-command").code == 2
    assert not out.exists()


@pytest.mark.parametrize("edit, needles", [
    (lambda c: c.update(hidden_size=128), ["config.json", "hidden_size 128"]),
    (lambda c: c.update(num_hidden_layers=5), ["target_layer_ids [5]", "5 layers"]),
    (lambda c: c.update(vocab_size=1000), ["vocab_size 1000"]),
])
def test_verifier_mismatch(cli, speculators_drafts, tiny_target, tmp_path, edit, needles):
    verifier = tmp_path / "verifier"
    verifier.mkdir()
    cfg = read_config(tiny_target)
    edit(cfg)
    (verifier / "config.json").write_text(json.dumps(cfg))
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", speculators_drafts["full"], "-o", out, "--verifier", verifier), out, 1,
                         str(verifier / "config.json"), *needles)


def test_mask_id_outside_vocab_with_verifier(cli, speculators_drafts, tiny_target, tmp_path):
    out = tmp_path / "out"
    r = cli("convert", speculators_drafts["full"], "-o", out, "--verifier", tiny_target, "--mask-token-id", "512")
    assert_clean_failure(r, out, 1, "mask_token_id 512")


def test_causal_full_layers_cannot_go_to_speculators(cli, speculators_drafts, tmp_path):
    hf = tmp_path / "hf"
    assert cli("convert", speculators_drafts["all_full"], "-o", hf, "--causal").code == 0
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", hf, "-o", out), out, 1, "full_attention and causal")


def test_debug_shows_traceback(full, tmp_path):
    (full / "config.json").write_text("{}")
    env = {**os.environ, "NO_COLOR": "1"}
    r = subprocess.run([sys.executable, "-m", "dflash_convert", "--debug", "convert", str(full), "-o", str(tmp_path / "o")],
                       capture_output=True, text=True, env=env)
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_kill_leaves_destination_absent_or_complete(speculators_drafts, tmp_path):
    """SIGKILL at many moments of a conversion: DST is either absent or a complete, equivalent checkpoint."""
    import torch
    from safetensors.torch import save_file

    from dflash_convert.convert.diff import diff_checkpoints

    big = broken_copy(speculators_drafts["full"], tmp_path / "big")
    t = {k: v for k, v in __import__("safetensors.torch", fromlist=["load_file"]).load_file(big / "model.safetensors").items()}
    cfg = read_config(big)
    cfg["transformer_layer_config"]["intermediate_size"] = 64 * 1024  # ~100 MB of MLP weights
    for i in range(2):
        for n in ("gate_proj", "up_proj"):
            t[f"layers.{i}.mlp.{n}.weight"] = torch.randn(64 * 1024, 64)
        t[f"layers.{i}.mlp.down_proj.weight"] = torch.randn(64, 64 * 1024)
    save_file(t, big / "model.safetensors", metadata={"format": "pt"})
    (big / "config.json").write_text(json.dumps(cfg))
    cmd = [sys.executable, "-m", "dflash_convert", "convert", str(big), "-o"]
    start = time.perf_counter()
    subprocess.run(cmd + [str(tmp_path / "timed")], check=True, capture_output=True)
    full = time.perf_counter() - start  # kill at fractions of a whole run, whatever this machine's speed
    assert diff_checkpoints(big, tmp_path / "timed").equivalent
    outcomes = set()
    for i, fraction in enumerate([0.05, 0.2, 0.4, 0.6, 0.75, 0.9, 1.0]):
        out = tmp_path / f"out{i}"
        delay = fraction * full
        p = subprocess.Popen(cmd + [str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        time.sleep(delay)
        p.send_signal(signal.SIGKILL)
        p.wait()
        if out.exists():
            assert diff_checkpoints(big, out).equivalent
            assert (out / "conversion.json").exists()
            outcomes.add("complete")
        else:
            outcomes.add("absent")
    # SIGTERM is handled: the staging directory is removed too
    out = tmp_path / "term"
    p = subprocess.Popen([sys.executable, "-m", "dflash_convert", "convert", str(big), "-o", str(out)],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, preexec_fn=stop_signals_at_default)
    time.sleep(0.5 * full)
    p.terminate()
    p.wait()
    if not out.exists():
        assert not any(q.name.startswith(".term.") for q in tmp_path.iterdir())
    assert "absent" in outcomes, outcomes  # the early kills did interrupt the conversion


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_nan_or_inf_tensor_refused(cli, full, tmp_path, dtype):
    import torch
    from safetensors.torch import load_file, save_file

    t = {k: (v.to(getattr(torch, dtype)) if v.is_floating_point() else v)
         for k, v in load_file(full / "model.safetensors").items()}
    t["layers.1.mlp.up_proj.weight"][3, 7] = float("nan") if dtype != "float16" else float("inf")
    save_file(t, full / "model.safetensors", metadata={"format": "pt"})
    out = tmp_path / "out"
    assert_clean_failure(cli("convert", full, "-o", out), out, 1, "model.safetensors",
                         "layers.1.mlp.up_proj.weight", "NaN or Inf")
