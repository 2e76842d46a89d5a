"""`predict`'s model of what a target stores and reads, hand-worked on published shapes (each config written here as
the fields the model reads): GPU memory units, MLA under tensor parallelism, hybrid targets' state slots,
Gemma-3's defaults and sliding pattern, Llama-4's interleaved MoE, quantization schemes."""

from __future__ import annotations

import pytest

from dflash_convert.predict.facts import ModelFacts, target_facts
from dflash_convert.predict.gpus import GPUS, gpu
from dflash_convert.predict.memory import USABLE_FRACTION, memory_need

DRAFT = ModelFacts(hidden=1024, layers=1, heads=8, kv_heads=8, head_dim=128, intermediate=4096, vocab=32000,
                   context_features=2 * 1024)

# meta-llama/Llama-3.1-70B's shape with compressed-tensors fp8 weights (w8a8, the lm_head left in bf16)
LLAMA_70B_FP8 = {"hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64, "num_key_value_heads": 8,
                 "intermediate_size": 28672, "vocab_size": 128256, "tie_word_embeddings": False,
                 "torch_dtype": "bfloat16", "quantization_config": {
                     "quant_method": "compressed-tensors", "config_groups": {"group_0": {
                         "weights": {"num_bits": 8, "type": "float"},
                         "input_activations": {"num_bits": 8, "type": "float"}}}}}


def test_a_gpu_s_nominal_gb_are_gib():
    """An H100 80GB reports 81,559 MiB to CUDA: 80 x 2^30 bytes is within 0.5 % of it, 80e9 is 6.5 % under."""
    h100 = gpu("H100")
    assert h100.memory_bytes == 80 * 2 ** 30
    assert h100.memory_bytes / (81559 * 2 ** 20) - 1 == pytest.approx(0.0, abs=0.005)
    assert GPUS["H200"].memory_bytes / (143771 * 2 ** 20) - 1 == pytest.approx(0.0, abs=0.005)
    # Llama-70B fp8 alone, 1536 positions: per layer 150,994,944 attention + 704,643,072 MLP weights at 1 byte, x 80
    # = 68,451,041,280; embedding and lm_head 2 x 128256 x 8192 x 2 = 4,202,692,608; KV 1536 x 80 x 4096 =
    # 503,316,480: 73,157,050,368 bytes, within 90 % of 80 GiB (77,309,411,328) though over 90 % of 80e9
    need = memory_need(target_facts(LLAMA_70B_FP8), DRAFT, h100, batch=1, tokens=1536)
    assert need.plain == 73_157_050_368
    assert need.usable == USABLE_FRACTION * 80 * 2 ** 30
    assert need.fits(need.plain) and need.plain > USABLE_FRACTION * 80e9


# ----------------------------------------------------------------------------- MLA

# DeepSeek-V3's attention at a small width: 8 heads, kv_lora_rank 512, qk_rope_head_dim 64, no q_lora_rank
MLA = {"hidden_size": 1024, "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 8,
       "intermediate_size": 4096, "vocab_size": 32000, "kv_lora_rank": 512, "qk_rope_head_dim": 64,
       "qk_nope_head_dim": 128, "v_head_dim": 128, "torch_dtype": "bfloat16"}


def test_an_mla_latent_cache_is_whole_on_every_tp_gpu_and_gqa_heads_fewer_than_tp_are_copied():
    """2 sequences x 1000 positions x 2 layers x (512 + 64) x 2 bytes = 4,608,000 bytes: on each of 4 GPUs, not a
    quarter. A GQA cache of 2 KV heads (2 x 2 x 128 x 2 = 1024 bytes per position and layer, 4,096,000 in all)
    splits over 2 GPUs at TP 4, the other two holding copies: 2,048,000 each."""
    from dflash_convert.predict.cost import target_pass
    from dflash_convert.predict.calibration import ENGINES

    mla = target_facts(MLA)
    assert memory_need(mla, DRAFT, gpu("H100"), batch=2, tokens=1000, tp=4).target_cache == 4_608_000
    assert memory_need(mla, DRAFT, gpu("H100"), batch=2, tokens=1000, tp=1).target_cache == 4_608_000
    gqa = target_facts({k: v for k, v in MLA.items() if "lora" not in k and "head_dim" not in k}
                       | {"num_key_value_heads": 2, "head_dim": 128})
    assert memory_need(gqa, DRAFT, gpu("H100"), batch=2, tokens=1000, tp=1).target_cache == 4_096_000
    assert memory_need(gqa, DRAFT, gpu("H100"), batch=2, tokens=1000, tp=4).target_cache == 2_048_000
    # and each GPU reads what it holds: the verify's KV bytes per GPU are the whole latent
    p1 = target_pass(mla, batch=2, tokens_per_seq=1, context=1000, gpu=gpu("H100"), constants=ENGINES["vllm"], tp=1)
    p4 = target_pass(mla, batch=2, tokens_per_seq=1, context=1000, gpu=gpu("H100"), constants=ENGINES["vllm"], tp=4)
    assert p4.bytes_by_term["KV cache"] / 4 == p1.bytes_by_term["KV cache"] == 4_608_000


def test_mla_attention_flops_are_absorbed_decode_s_latent_widths():
    """One token over 1000 cached positions, 2 layers, 8 heads: scores over 512 + 64 and values over 512 per head,
    2 FLOPs per multiply-add: 1000 x 2 x 8 x 2 x (576 + 512) = 34,816,000, at the bf16 peak. hidden / heads (128)
    as the head width would give 4 x 8 x 128 x 2000 = 8,192,000."""
    from dflash_convert.predict.cost import EngineConstants, target_pass
    from dflash_convert.predict.gpus import GPU

    card = GPU("round", 1000, 100, 200, 80, 100)
    mla = target_facts(MLA)
    assert mla.attention_flops_per_position == 2 * 8 * (576 + 512)
    p = target_pass(mla, batch=1, tokens_per_seq=1, context=1000, gpu=card, constants=EngineConstants(1, 1, 0, 0),
                    tp=1)
    weights = 2 * (mla.dense_params + mla.vocab * mla.hidden)
    assert p.flops - weights == 34_816_000
    assert p.compute_s == pytest.approx((weights + 34_816_000) / 100e12)


# ----------------------------------------------------------------------------- hybrid

# 4 layers, every 4th full attention (3 Gated DeltaNet layers of 4 value heads of 64 x 64 float32: 65,536 bytes)
HYBRID = {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
          "head_dim": 128, "intermediate_size": 4096, "vocab_size": 32000, "full_attention_interval": 4,
          "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 64,
          "linear_value_head_dim": 64, "torch_dtype": "bfloat16"}


def test_a_hybrid_target_speculating_k_holds_k_plus_1_state_slots_per_sequence():
    """10 sequences of 100 positions: plain, one KV layer (100 x 2 x 2 x 128 x 2 = 102,400) and 3 states (196,608)
    each, 2,990,080 bytes; speculating K 7, 7 slots more per sequence and layer: 10 x 7 x 3 x 65,536 = 13,762,560."""
    from dflash_convert.predict.prediction import Inputs, predict

    hybrid = target_facts(HYBRID)
    assert (hybrid.linear_layers, hybrid.linear_state_bytes) == (3, 65_536)
    plain = memory_need(hybrid, DRAFT, gpu("H100"), batch=10, tokens=100)
    spec = memory_need(hybrid, DRAFT, gpu("H100"), batch=10, tokens=100, k=7)
    assert plain.target_cache == spec.target_cache == 2_990_080
    assert (plain.speculative_states, spec.speculative_states) == (0, 13_762_560)
    assert spec.speculative - plain.speculative == 13_762_560 and spec.plain == plain.plain
    # TP 2 splits both over the value and KV heads
    assert memory_need(hybrid, DRAFT, gpu("H100"), batch=10, tokens=100, k=7, tp=2).speculative_states == 6_881_280
    # each row states its own K's need
    rows = predict(Inputs(hybrid, DRAFT, "t", "d"), [gpu("H100")], {1: 1.5, 7: 3.0}, concurrency=[1000],
                   input_len=60, output_len=40).predictions
    assert (rows[1].memory_per_gpu_gb - rows[0].memory_per_gpu_gb) * 1e9 == pytest.approx(1000 * 6 * 3 * 65_536,
                                                                                            abs=1e7)


# ----------------------------------------------------------------------------- Gemma-3, Llama-4

# google/gemma-3-27b-it's config.json as published: its text_config leaves out vocab_size and the sliding pattern
GEMMA3_27B = {"architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3", "torch_dtype": "bfloat16",
              "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504,
                              "model_type": "gemma3_text", "num_attention_heads": 32, "num_hidden_layers": 62,
                              "num_key_value_heads": 16, "sliding_window": 1024},
              "vision_config": {"hidden_size": 1152, "model_type": "siglip_vision_model"}}


def test_gemma3_reads_its_config_class_defaults_and_counts_sliding_layers_from_the_pattern():
    """Pattern 6 over 62 layers: layers 6, 12, ..., 60 full (10), 52 sliding at 1024. KV per position and layer
    2 x 16 x 128 x 2 = 8192 bytes; at 131,072 positions: 10 x 131072 x 8192 + 52 x 1024 x 8192 = 11,173,625,856
    bytes (11.2 GB), where 62 full layers would hold 66,571,993,088 (66.6 GB)."""
    gemma = target_facts(GEMMA3_27B)
    assert (gemma.vocab, gemma.sliding_layers, gemma.sliding_window, gemma.tied_embeddings) == (262208, 52, 1024, True)
    need = memory_need(gemma, DRAFT, gpu("H200"), batch=1, tokens=131072)
    assert need.target_cache == 11_173_625_856
    # a stated field wins over the default; layer_types, where given, over the pattern
    assert target_facts({**GEMMA3_27B, "text_config": {**GEMMA3_27B["text_config"], "vocab_size": 1000}}).vocab == 1000
    listed = {**GEMMA3_27B["text_config"], "layer_types": ["full_attention"] * 62}
    assert target_facts({**GEMMA3_27B, "text_config": listed}).sliding_layers == 0


def test_the_stated_model_type_defaults_are_transformers_own():
    from transformers import Gemma3TextConfig, Llama4TextConfig

    from dflash_convert.format.sizes import MODEL_TYPE_DEFAULTS

    for cls, model_type in ((Gemma3TextConfig, "gemma3_text"), (Llama4TextConfig, "llama4_text")):
        config = cls()
        for key, value in MODEL_TYPE_DEFAULTS[model_type].items():
            if key == "n_shared_experts":  # Llama-4's architecture (one shared expert), not a config field
                continue
            got = getattr(config, "_sliding_window_pattern", None) if key == "sliding_window_pattern" else \
                getattr(config, key)
            assert got == value, (model_type, key)


# meta-llama/Llama-4-Maverick-17B-128E's text_config: MoE every 2nd layer (128 experts, top 1, plus a shared one of
# intermediate_size), dense layers of intermediate_size_mlp
LLAMA4_MAVERICK = {"model_type": "llama4", "torch_dtype": "bfloat16", "tie_word_embeddings": False, "text_config": {
    "model_type": "llama4_text", "hidden_size": 5120, "intermediate_size": 8192, "intermediate_size_mlp": 16384,
    "num_local_experts": 128, "num_experts_per_tok": 1, "interleave_moe_layer_step": 2, "num_hidden_layers": 48,
    "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 202048,
    "tie_word_embeddings": False}}


def test_llama4_maverick_has_its_published_400b_total_and_17b_active_parameters():
    """Per layer, attention 2 x 5120 x 5120 + 2 x 5120 x 1024 = 62,914,560 (48 layers); 24 dense MLPs of
    3 x 5120 x 16384 = 251,658,240; 24 MoE layers of 128 experts + 1 shared of 3 x 5120 x 8192 = 125,829,120 and a
    router of 5120 x 128; embedding and lm_head 2 x 202048 x 5120. Total 400.7 B (bf16: 801 GB), active 17.2 B."""
    from dflash_convert.predict.memory import target_weight_bytes

    m = target_facts(LLAMA4_MAVERICK)
    assert (m.dense_layers, m.moe_layers, m.intermediate, m.expert_intermediate, m.shared_intermediate) == (
        24, 24, 16384, 8192, 8192)
    attention, dense, expert, router = 62_914_560, 251_658_240, 125_829_120, 5120 * 128
    embeddings = 202048 * 5120
    total = 48 * attention + 24 * dense + 24 * (129 * expert + router) + 2 * embeddings
    assert target_weight_bytes(m) == 2 * total == 801_422_704_640
    active = m.dense_params + m.moe_layers * m.top_k * m.expert_params + 2 * embeddings
    assert active == 48 * attention + 24 * dense + 24 * (2 * expert + router) + 2 * embeddings
    assert round(total / 1e9) == 401 and round(active / 1e9, 1) == 17.2
    # its RoPE layers (3 of every 4) attend within 8192-token chunks (vLLM's ChunkedLocalAttention): at 131,072
    # positions the cache is (12 x 131072 + 36 x 8192) x 2 x 8 x 128 x 2 = 7,650,410,496 bytes, not 48 full layers'
    assert (m.sliding_layers, m.sliding_window) == (36, 8192)
    assert memory_need(m, DRAFT, gpu("H200"), batch=1, tokens=131072).target_cache == 7_650_410_496


# ----------------------------------------------------------------------------- quantization schemes

SMALL = {"hidden_size": 1024, "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 8,
         "head_dim": 128, "intermediate_size": 4096, "vocab_size": 32000, "torch_dtype": "bfloat16"}


@pytest.mark.parametrize("q, per_weight, compute", [
    # NVFP4: 4 bits and an fp8 scale per 16 weights = 4.5 bits
    ({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16}, 0.5 + 1 / 16, "bf16"),
    ({"quant_method": "modelopt", "quant_algo": "FP8"}, 1.0, "fp8"),
    # bitsandbytes nf4: 4 bits and an fp32 absmax per 64; double quant: an 8-bit absmax per 64, an fp32 per 256 blocks
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"}, 0.5 + 4 / 64, "bf16"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_use_double_quant": True},
     0.5 + 1 / 64 + 4 / 16384, "bf16"),
    ({"quant_method": "bitsandbytes", "load_in_8bit": True}, 1.0, "bf16"),
    ({"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "fp8_e4m3"},
                                                       "input_tensors": {"dtype": "fp8_e4m3"}}}, 1.0, "fp8"),
])
def test_quantization_schemes_beyond_the_first_ones_are_read(q, per_weight, compute):
    m = target_facts({**SMALL, "quantization_config": q})
    assert (m.weight_bytes, m.compute, m.storage_warning) == (pytest.approx(per_weight), compute, "")


def test_dtype_wins_over_the_older_torch_dtype_as_transformers_reads_a_config_stating_both():
    from transformers import LlamaConfig

    both = {**SMALL, "dtype": "float32", "torch_dtype": "bfloat16"}
    assert str(LlamaConfig.from_dict(both).dtype) == "torch.float32"
    # served at 2 bytes either way (the engines' dtype "auto" downcasts float32); the dtype read shows in the line
    # that names an unread scheme
    facts = target_facts({**both, "quantization_config": {"quant_method": "someday"}})
    assert (facts.weight_bytes, "(float32)" in facts.storage_warning) == (2.0, True)


def test_a_scheme_it_cannot_read_is_a_warning_naming_it_in_the_text_and_the_json():
    from dflash_convert.predict.prediction import Inputs, predict, text_lines

    m = target_facts({**SMALL, "quantization_config": {"quant_method": "hqq", "nbits": 4}})
    assert m.weight_bytes == 2.0 and "'hqq'" in m.storage_warning and "2 bytes (bfloat16)" in m.storage_warning
    report = predict(Inputs(m, DRAFT, "t", "d"), [gpu("H100")], {7: 4.0}, concurrency=[1], input_len=10, output_len=10)
    assert report.notes[0] == "warning: the target's " + m.storage_warning
    assert "note: warning: the target's quantization_config 'hqq'" in "\n".join(text_lines(report))
    assert target_facts(SMALL).storage_warning == ""  # no quantization_config: nothing to warn of


def test_a_compressed_tensors_group_that_is_not_an_object_names_the_field():
    from dflash_convert.errors import DFlashError

    q = {"quant_method": "compressed-tensors", "config_groups": {"group_0": [1, 2]}}
    with pytest.raises(DFlashError, match=r"quantization_config\.config_groups\.group_0` is \[1, 2\], not an object"):
        target_facts({**SMALL, "quantization_config": q}, "x.json")
