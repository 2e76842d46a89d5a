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
