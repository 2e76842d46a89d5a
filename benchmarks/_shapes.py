"""Build a Qwen3-8B-DFlash-b16-shaped draft (docs/formats.md sections 2 and 8) on disk without torch.

Random, finite bf16 values; speculators or HF layout. `layers` scales the draft (5 = the real
shape, ~2.1 GB; 10 = twice the body). Writing uses the same torch-free header code as the
converter, and tiles one random block so that building 2 GB takes seconds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from dflash_convert.format.catalogue import expected_shapes
from dflash_convert.format.mapping import spec_from_config
from dflash_convert.io.safetensors import header_bytes

H, HEADS, KV, HEAD_DIM, INTER, VOCAB, N_TARGET = 4096, 32, 8, 128, 12288, 151936, 36
TARGET_IDS = [1, 9, 17, 25, 33]
MASK = 151669


def draft_shapes(layers: int = 5) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor of the draft, with its shape, as the tensor catalogue sizes it for this config."""
    spec = spec_from_config(config("hf", layers))
    return list(expected_shapes(spec).items())


def decoder_config(layers: int) -> dict:
    return {"model_type": "qwen3", "hidden_size": H, "intermediate_size": INTER, "num_hidden_layers": layers,
            "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HEAD_DIM, "vocab_size": VOCAB,
            "rms_norm_eps": 1e-6, "hidden_act": "silu", "attention_bias": False, "max_position_embeddings": 40960,
            "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "layer_types": ["full_attention"] * layers, "use_sliding_window": False, "sliding_window": None,
            "tie_word_embeddings": False}


def config(fmt: str, layers: int) -> dict:
    dec = decoder_config(layers)
    if fmt == "hf":
        return {"architectures": ["DFlashDraftModel"], **dec, "block_size": 16, "num_target_layers": N_TARGET,
                "dtype": "bfloat16",
                "dflash_config": {"mask_token_id": MASK, "target_layer_ids": TARGET_IDS, "block_size": 16}}
    return {"architectures": ["DFlashDraftModel"], "speculators_model_type": "dflash", "transformer_layer_config": dec,
            "aux_hidden_state_layer_ids": [i + 1 for i in TARGET_IDS], "mask_token_id": MASK, "block_size": 16,
            "draft_vocab_size": VOCAB, "target_hidden_size": None, "sliding_window_non_causal": False,
            "sample_from_anchor": False, "dtype": "bfloat16",
            "speculators_config": {"algorithm": "dflash", "default_proposal_method": "greedy",
                                   "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 15,
                                                         "verifier_accept_k": 1, "accept_tolerance": 0.0}],
                                   "verifier": {"name_or_path": "Qwen/Qwen3-8B", "architectures": ["Qwen3ForCausalLM"]}},
            "speculators_version": "0.9.0"}


def random_bf16_block(nbytes: int, seed: int = 0) -> bytes:
    """Finite bf16 values ~ N(0, 0.02): the high halves of float32 normals."""
    f32 = (np.random.default_rng(seed).standard_normal(nbytes // 2, dtype=np.float32) * 0.02)
    return (f32.view(np.uint32) >> 16).astype(np.uint16).tobytes()


def target_config() -> dict:
    """config.json of a Qwen3-8B target (for static checks; no weights)."""
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": H, "intermediate_size": INTER,
            "num_hidden_layers": N_TARGET, "num_attention_heads": HEADS, "num_key_value_heads": KV, "head_dim": HEAD_DIM,
            "vocab_size": VOCAB, "rms_norm_eps": 1e-6, "max_position_embeddings": 40960, "eos_token_id": 151645,
            "bos_token_id": 151643, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
            "tie_word_embeddings": False}


def write_draft(directory: Path, fmt: str = "hf", layers: int = 5) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    shapes = draft_shapes(layers)
    head, offsets = header_bytes([(n, "BF16", s) for n, s in shapes], {"format": "pt"})
    block = random_bf16_block(64 << 20)
    with open(directory / "model.safetensors", "wb") as f:
        f.write(head)
        for (name, shape), (begin, end) in zip(shapes, offsets):
            left = end - begin
            while left:
                n = min(left, len(block))
                f.write(block[:n])
                left -= n
    (directory / "config.json").write_text(json.dumps(config(fmt, layers), indent=2))
    return directory


def size_bytes(layers: int = 5) -> int:
    return sum(math.prod(s) * 2 for _, s in draft_shapes(layers))
