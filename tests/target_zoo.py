"""Tiny random-weight targets of every architecture the runtime verifies drafts against, built by
transformers' own classes and saved with save_pretrained (config.json + model.safetensors).

Each has vocabulary 512 (pad 509, eos 510), hidden size 64 and 4 decoder layers; hybrid ones alternate
linear-attention (Gated DeltaNet) and full-attention layers. `make(kind, path)` returns the directory,
or raises pytest.skip when the installed transformers lacks the class."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

VOCAB, HIDDEN, LAYERS = 512, 64, 4
SPECIAL = dict(vocab_size=VOCAB, eos_token_id=VOCAB - 2, pad_token_id=VOCAB - 3, bos_token_id=None)
ATTENTION = dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=2,
                 head_dim=16, max_position_embeddings=256)
LINEAR = dict(linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16,
              linear_conv_kernel_dim=4, full_attention_interval=2)
MOE = dict(moe_intermediate_size=32, num_experts=4, num_experts_per_tok=2)

KINDS = ("llama", "qwen3", "qwen3_moe", "gpt_oss", "deepseek_v3", "qwen3_next", "qwen3_5", "qwen3_5_conditional",
         "qwen3_5_moe", "kimi_k25")
HYBRID = ("qwen3_next", "qwen3_5", "qwen3_5_conditional", "qwen3_5_moe")


def _classes(kind: str):
    """(config class, model class, config kwargs) for `kind`."""
    import transformers

    def get(module: str, *names: str):
        try:
            mod = __import__(f"transformers.models.{module}", fromlist=list(names))
            return [getattr(mod, n) for n in names]
        except (ImportError, AttributeError):
            pytest.skip(f"transformers {transformers.__version__} has no {names[-1]}")

    base = dict(SPECIAL, tie_word_embeddings=False)
    if kind == "llama":
        return *get("llama", "LlamaConfig", "LlamaForCausalLM"), dict(base, **ATTENTION, intermediate_size=96)
    if kind == "qwen3":
        return *get("qwen3", "Qwen3Config", "Qwen3ForCausalLM"), dict(base, **ATTENTION, intermediate_size=96)
    if kind == "qwen3_moe":
        return *get("qwen3_moe", "Qwen3MoeConfig", "Qwen3MoeForCausalLM"), dict(base, **ATTENTION, **MOE,
                                                                                  intermediate_size=96)
    if kind == "gpt_oss":  # attention sinks, alternating sliding-window and full layers
        return *get("gpt_oss", "GptOssConfig", "GptOssForCausalLM"), dict(
            base, **dict(ATTENTION, max_position_embeddings=131072), intermediate_size=32, num_local_experts=4,
            num_experts_per_tok=2, sliding_window=8)
    deepseek = dict(hidden_size=HIDDEN, num_hidden_layers=LAYERS, num_attention_heads=4, num_key_value_heads=4,
                    intermediate_size=96, moe_intermediate_size=32, n_routed_experts=4, num_experts_per_tok=2,
                    n_shared_experts=1, first_k_dense_replace=1, n_group=1, topk_group=1, q_lora_rank=32,
                    kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16,
                    max_position_embeddings=256)
    if kind == "deepseek_v3":  # MLA + MoE (first layer dense)
        return *get("deepseek_v3", "DeepseekV3Config", "DeepseekV3ForCausalLM"), dict(base, **deepseek)
    if kind == "kimi_k25":  # a multimodal wrapper around a DeepSeek-V3 text model, no causal-LM class
        vision = dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32, patch_size=4,
                      mm_hidden_size=32, text_hidden_size=HIDDEN)
        config_cls, model_cls = get("kimi_k25", "Kimi_K25Config", "Kimi_K25ForConditionalGeneration")
        return config_cls, model_cls, dict(text_config=dict(SPECIAL, **deepseek, model_type="deepseek_v3"),
                                           vision_config=vision, tie_word_embeddings=False)
    if kind == "qwen3_next":
        return *get("qwen3_next", "Qwen3NextConfig", "Qwen3NextForCausalLM"), dict(
            base, **ATTENTION, **LINEAR, **MOE, intermediate_size=96, shared_expert_intermediate_size=32)
    if kind == "qwen3_5":
        return *get("qwen3_5", "Qwen3_5TextConfig", "Qwen3_5ForCausalLM"), dict(
            base, **ATTENTION, **LINEAR, intermediate_size=96)
    if kind == "qwen3_5_moe":
        return *get("qwen3_5_moe", "Qwen3_5MoeTextConfig", "Qwen3_5MoeForCausalLM"), dict(
            base, **ATTENTION, **LINEAR, **MOE, shared_expert_intermediate_size=32)
    if kind == "qwen3_5_conditional":  # as published: text model + vision tower (+ MTP heads, added below)
        vision = dict(depth=1, hidden_size=32, num_heads=2, intermediate_size=32, out_hidden_size=HIDDEN,
                      patch_size=4, temporal_patch_size=2, spatial_merge_size=2)
        text = dict(SPECIAL, **ATTENTION, **LINEAR, intermediate_size=96)
        config_cls, model_cls = get("qwen3_5", "Qwen3_5Config", "Qwen3_5ForConditionalGeneration")
        return config_cls, model_cls, dict(text_config=text, vision_config=vision, tie_word_embeddings=False)
    raise ValueError(kind)


def make(kind: str, path: Path, *, seed: int = 0) -> Path:
    path = Path(path)
    if (path / "config.json").exists():
        return path
    config_cls, model_cls, kwargs = _classes(kind)
    torch.manual_seed(seed)
    model = model_cls(config_cls(**kwargs)).eval()
    if kind in HYBRID:  # random Gated DeltaNet weights barely move the logits: make the state matter
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "linear_attn.out_proj" in name:
                    p.mul_(8)
    model.save_pretrained(path)
    if kind == "qwen3_5_conditional":  # the published checkpoints also hold multi-token-prediction heads
        from safetensors.torch import load_file, save_file

        tensors = load_file(path / "model.safetensors")
        tensors["mtp.fc.weight"] = torch.zeros(HIDDEN, 2 * HIDDEN)
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return path


def config_of(path: Path) -> dict:
    return json.loads((Path(path) / "config.json").read_text())
