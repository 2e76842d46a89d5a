"""A target's decoder sizes read the same to every command (convert's and validate's target_info, predict's facts)
and as transformers' config classes read them: a field the config leaves out, or states null, takes its class's
default or rule, never a refusal in one command and a figure in another."""

import pytest

from dflash_convert.format.mapping import target_info
from dflash_convert.predict.facts import target_facts

# Mistral-style nulls: transformers reads a null num_key_value_heads as one per head and a null head_dim as
# hidden_size / num_attention_heads
LLAMA_NULLS = {"model_type": "llama", "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
               "num_key_value_heads": None, "head_dim": None, "intermediate_size": 14336, "vocab_size": 128256}
# google/gemma-3-27b-it's text_config states no vocab_size; this one leaves out head_dim and the KV heads too:
# Gemma3TextConfig's 256 and 4, not 5376 // 32 = 168 and 32
GEMMA3 = {"model_type": "gemma3", "architectures": ["Gemma3ForConditionalGeneration"],
          "text_config": {"model_type": "gemma3_text", "hidden_size": 5376, "intermediate_size": 21504,
                          "num_attention_heads": 32, "num_hidden_layers": 62, "sliding_window": 1024}}
QWEN3_MOE = {"model_type": "qwen3_moe", "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
             "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144, "moe_intermediate_size": 768,
             "num_experts": 128, "num_experts_per_tok": 8, "vocab_size": 151936}


@pytest.mark.parametrize("cls, raw", [("LlamaConfig", LLAMA_NULLS), ("Gemma3TextConfig", GEMMA3),
                                      ("Qwen3MoeConfig", QWEN3_MOE)])
def test_target_info_and_predict_read_a_targets_sizes_as_transformers_does(cls, raw):
    import transformers

    config = getattr(transformers, cls)(**raw.get("text_config", raw))
    want = (config.num_hidden_layers, config.hidden_size, config.vocab_size, config.num_attention_heads,
            config.num_key_value_heads, config.head_dim)
    info, facts = target_info(raw, "t"), target_facts(raw)
    assert (info.num_layers, info.hidden_size, info.vocab_size, info.num_attention_heads, info.num_key_value_heads,
            info.head_dim) == want
    assert (facts.layers, facts.hidden, facts.vocab, facts.heads, facts.kv_heads, facts.head_dim) == want
