"""Every RoPE type transformers' Qwen3 rotary embedding accepts runs in the draft, rotating exactly as
that embedding does for the same config and the same call's positions; a type the runtime lacks ends
"could not run" (exit 1), never a failed check."""

from __future__ import annotations

import json

import pytest
import torch

from dflash_convert.errors import NotRunnable
from dflash_runtime import load_draft
from dflash_runtime.rope import apply_rope, rope_tables
from runtime_helpers import one_torch_thread, write_hf_draft  # noqa: F401 (autouse fixture)

HEAD_DIM = 16
ROPES = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0},
    "yarn": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 64},
    "longrope": {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 64,
                 "short_factor": [1.0 + 0.1 * i for i in range(HEAD_DIM // 2)],
                 "long_factor": [2.0 + 0.5 * i for i in range(HEAD_DIM // 2)]},
    "llama3": {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
}


def _draft(tmp_path, rope: dict):
    path = write_hf_draft(tmp_path / rope["rope_type"], head_dim=HEAD_DIM)
    cfg = json.loads((path / "config.json").read_text())
    del cfg["rope_theta"]
    cfg["rope_parameters"] = rope
    cfg["max_position_embeddings"] = 128  # dynamic and longrope scale past it / past 64
    (path / "config.json").write_text(json.dumps(cfg))
    return path, cfg


def _reference(cfg):
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding

    decoder = {k: v for k, v in cfg.items() if k not in ("dflash_config", "architectures", "block_size",
                                                         "num_target_layers")}
    return Qwen3RotaryEmbedding(Qwen3Config(**decoder))


def _ours(draft, positions: torch.Tensor, length: int):
    inv = draft.inv_freq if draft.length_rope is None else draft.length_rope.inv_freq(length)
    return rope_tables(positions, inv, draft.rope_scale, torch.float32)


@pytest.mark.parametrize("kind", list(ROPES))
def test_rope_type_rotates_as_transformers(kind, tmp_path):
    """Blocks below and beyond the scaled lengths: cos/sin of the draft's step equal transformers' Qwen3
    rotary embedding called on the same positions (a fresh embedding per call: no earlier call's state)."""
    path, cfg = _draft(tmp_path, ROPES[kind])
    draft = load_draft(path)
    x = torch.randn(1, 2, 8, HEAD_DIM)
    for start in (0, 40, 60, 120, 300):  # around 64 (longrope) and 128 (dynamic)
        positions = torch.arange(start, start + 8)
        cos, sin = _reference(cfg)(x, positions[None])
        ours_cos, ours_sin = _ours(draft, positions, start + 8)
        assert torch.allclose(ours_cos, cos[0], atol=2e-6) and torch.allclose(ours_sin, sin[0], atol=2e-6), start
        ref = x * cos[:, None] + torch.cat((-x[..., 8:], x[..., :8]), -1) * sin[:, None]
        assert torch.allclose(apply_rope(x, ours_cos, ours_sin), ref, atol=1e-5)


@pytest.mark.parametrize("kind", ["dynamic", "longrope"])
def test_length_dependent_rope_runs_in_the_decode_loop(kind, tmp_path, tiny_target):
    """A whole speculative run with a draft whose RoPE depends on length, past the scaled length, eager
    and compiled steps giving the same proposals."""
    from dflash_runtime import load_target, speculative_generate

    path, _ = _draft(tmp_path, ROPES[kind])
    cfg = json.loads((path / "config.json").read_text())
    cfg["dflash_config"].update(target_layer_ids=[0, 3, 7])
    (path / "config.json").write_text(json.dumps(cfg))
    target = load_target(tiny_target)
    prompt = list(range(30, 130))  # 100 tokens: the steps cross 128
    eager = speculative_generate(load_draft(path), target, prompt, max_new_tokens=40)
    compiled = speculative_generate(load_draft(path, compile=True, backend="sdpa"), target, prompt,
                                    max_new_tokens=40)
    assert eager.tokens == compiled.tokens and eager.stats.accepted == compiled.stats.accepted


def test_unknown_rope_type_is_could_not_run(tmp_path, cli, tiny_target):
    path, cfg = _draft(tmp_path, {"rope_type": "proportional", "rope_theta": 10000.0, "factor": 2.0})
    with pytest.raises(NotRunnable, match="RoPE type 'proportional' is not supported by the runtime"):
        load_draft(path)
    r = cli("validate", path, "--levels", "static,numeric", "--device", "cpu", "--json")
    assert r.code == 1, r.out
    assert r.json()["error"]["message"].startswith("could not run the draft: ")


def test_inspect_shows_the_rope_type_and_scaling(tmp_path, cli):
    path, _ = _draft(tmp_path, ROPES["yarn"])
    r = cli("inspect", path, "--json")
    report = r.json()
    assert (report["rope_type"], report["rope_theta"]) == ("yarn", 10000.0)
    assert report["rope_scaling"] == {"factor": 4.0, "original_max_position_embeddings": 64}
