"""A config.json's integer sizes, declared once (keys, bounds, the default where a config leaves one out), and the
one reader of a target's decoder: its text_config (multimodal wrappers) with its model type's class defaults filled
in. The convert / validate target checks (mapping.target_info) and the cost model (predict/facts.py) both read
through it, so a config reads the same to every command.
"""

from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any, Callable

from dflash_convert.errors import DFlashError
from dflash_convert.format.configs import (MAX_HEAD_DIM, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS,
                                           MAX_POSITIONS, MAX_VOCAB)

# The most experts a MoE layer may have (real ones: 8 to 512); the other bounds are the ones every command
# applies to a config (format/configs.py). A value outside them is an error naming the field, not a figure.
MAX_EXPERTS = 1 << 16


@dataclass(frozen=True)
class Size:
    """An integer field of a config: its key and the other spellings configs give it (the first present wins),
    its bounds, inclusive, and its value where a config leaves it out (None: required unless the caller gives one).
    `high` may name another fact (top-k at most the experts); `default` may be a rule over the reader."""

    keys: tuple[str, ...]
    low: int
    high: int | str
    default: int | Callable[[Reader], int] | None = None


# What is read of a config.json's decoder (and its quantization_config), one declaration each. A JSON null is an
# absent field; a bool, a string, a float or a value out of bounds is refused, naming the file and the field.
SIZES: dict[str, Size] = {
    "hidden": Size(("hidden_size", "n_embd"), 1, MAX_HIDDEN),
    "layers": Size(("num_hidden_layers", "n_layer"), 1, MAX_LAYERS),
    "heads": Size(("num_attention_heads", "n_head"), 1, MAX_HEADS),
    # transformers' rules where a config leaves them out (or null): one KV head per head (MHA), hidden / heads
    "kv_heads": Size(("num_key_value_heads",), 1, "heads", lambda read: read("heads")),
    "head_dim": Size(("head_dim",), 1, MAX_HEAD_DIM, lambda read: max(1, read("hidden") // read("heads"))),
    "intermediate": Size(("intermediate_size", "ffn_hidden_size"), 0, MAX_INTERMEDIATE),
    "vocab": Size(("vocab_size",), 1, MAX_VOCAB),
    "experts": Size(("num_experts", "num_local_experts", "n_routed_experts"), 0, MAX_EXPERTS),
    "top_k": Size(("num_experts_per_tok", "num_experts_per_token", "moe_topk"), 1, "experts"),
    "expert_intermediate": Size(("moe_intermediate_size",), 1, MAX_INTERMEDIATE),
    "shared_intermediate": Size(("shared_expert_intermediate_size",), 0, MAX_INTERMEDIATE),
    "shared_experts": Size(("n_shared_experts",), 0, MAX_EXPERTS),
    "dense_layers": Size(("first_k_dense_replace",), 0, "layers"),
    "full_attention_interval": Size(("full_attention_interval",), 1, MAX_LAYERS),
    "linear_key_heads": Size(("linear_num_key_heads",), 0, MAX_HEADS),
    "linear_value_heads": Size(("linear_num_value_heads",), 0, MAX_HEADS),
    "linear_key_dim": Size(("linear_key_head_dim",), 0, MAX_HEAD_DIM),
    "linear_value_dim": Size(("linear_value_head_dim",), 0, MAX_HEAD_DIM),
    "sliding_window": Size(("sliding_window",), 0, MAX_POSITIONS),
    "positions": Size(("max_position_embeddings",), 1, MAX_POSITIONS),
    # every Nth layer full attention, the others sliding (Gemma-3), where layer_types is absent
    "sliding_window_pattern": Size(("sliding_window_pattern",), 1, MAX_LAYERS),
    # every Nth layer MoE, the others dense (Llama-4's interleave_moe_layer_step, Qwen2-MoE's decoder_sparse_step)
    # Llama-4: every Nth layer global attention (no RoPE), the others chunked local attention over attention_chunk_size
    "attention_chunk_size": Size(("attention_chunk_size",), 1, MAX_POSITIONS),
    "chunk_layer_interval": Size(("no_rope_layer_interval",), 1, MAX_LAYERS),
    "moe_layer_step": Size(("interleave_moe_layer_step", "decoder_sparse_step"), 1, MAX_LAYERS),
    "dense_intermediate": Size(("intermediate_size_mlp",), 1, MAX_INTERMEDIATE),  # Llama-4's dense layers' MLP
    "kv_lora_rank": Size(("kv_lora_rank",), 1, MAX_INTERMEDIATE),
    "q_lora_rank": Size(("q_lora_rank",), 1, MAX_INTERMEDIATE),
    "qk_rope_head_dim": Size(("qk_rope_head_dim",), 0, MAX_HEAD_DIM),
    "qk_nope_head_dim": Size(("qk_nope_head_dim",), 0, MAX_HEAD_DIM),
    "v_head_dim": Size(("v_head_dim",), 1, MAX_HEAD_DIM),
    # quantization_config's
    "bits": Size(("bits", "w_bit"), 1, 16),
    "group_size": Size(("group_size", "q_group_size"), -1, MAX_INTERMEDIATE),  # -1: one scale per output channel
}


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxdict, _REPR.maxlevel = 60, 60, 6, 4, 2


def short_repr(value: Any) -> str:
    """A bounded repr for an error line (a hostile value may be megabytes long)."""
    return _REPR.repr(value)


class Reader:
    """Reads a config's fields as SIZES declares them, keeping what it read so that a bound may name it."""

    def __init__(self, cfg: dict[str, Any], file: str, prefix: str = "", *, lead: str = "field", need: str = ""):
        self.cfg, self.file, self.prefix = cfg, file, prefix
        self.lead, self.need = lead, need  # an error's first words, and why a missing field is needed
        self.read: dict[str, int] = {}
        self.keys: dict[str, str] = {}  # the key each value was read from (or the declared one, a default's)

    def present(self, name: str) -> bool:
        return any(self.cfg.get(k) is not None for k in SIZES[name].keys)

    def __call__(self, name: str, default: int | None = None) -> int:
        """The field's value; where it is absent, `default`, else its declared one (neither: it is required)."""
        size = SIZES[name]
        key = next((k for k in size.keys if self.cfg.get(k) is not None), None)
        if key is None:
            default = size.default if default is None else default
            default = default(self) if callable(default) else default
            if default is None:
                raise DFlashError(f"{self.lead} `{self.prefix}{size.keys[0]}` is missing"
                                  + (f": {self.need}" if self.need else ""), file=self.file)
            self.read[name], self.keys[name] = default, f"{self.prefix}{size.keys[0]}"
            return default
        value = self.cfg[key]
        high = self.read[size.high] if isinstance(size.high, str) else size.high
        if type(value) is not int or not size.low <= value <= high:  # a bool is an int subclass: refused too
            bound = f"{self.keys[size.high]} ({high})" if isinstance(size.high, str) else high
            raise DFlashError(f"{self.lead} `{self.prefix}{key}` is {short_repr(value)}, not an integer in "
                              f"[{size.low}, {bound}]", file=self.file)
        self.read[name], self.keys[name] = value, f"{self.prefix}{key}"
        return value

    def flag(self, key: str) -> bool:
        value = self.cfg.get(key)
        if value is not None and type(value) is not bool:
            raise DFlashError(f"{self.lead} `{self.prefix}{key}` is {short_repr(value)}, not true or false",
                              file=self.file)
        return bool(value)

    def layer_types(self, layers: int) -> list[str] | None:
        value = self.cfg.get("layer_types")
        if value is None:
            return None
        if not (isinstance(value, list) and len(value) == layers and all(isinstance(t, str) for t in value)):
            raise DFlashError(f"{self.lead} `{self.prefix}layer_types` is {short_repr(value)}, not a list of "
                              f"num_hidden_layers ({layers}) layer type names", file=self.file)
        return value


# What a model type's config class fills in where its config.json leaves a field out, for the fields read here:
# transformers' Gemma3TextConfig and Llama4TextConfig defaults (google/gemma-3-27b-it's text_config states no
# vocab_size and no sliding_window_pattern; transformers derives its layer_types from the class's pattern of 6).
# n_shared_experts is Llama-4's architecture, not a config field: each MoE layer has one shared expert of
# intermediate_size beside its routed ones (transformers' Llama4TextMoe.shared_expert). A test checks these against
# transformers' classes.
MODEL_TYPE_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3_text": {"vocab_size": 262208, "hidden_size": 2304, "intermediate_size": 9216, "num_hidden_layers": 26,
                    "num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256, "sliding_window": 4096,
                    "sliding_window_pattern": 6, "tie_word_embeddings": True},
    "llama4_text": {"vocab_size": 202048, "hidden_size": 5120, "intermediate_size": 8192,
                    "intermediate_size_mlp": 16384, "num_hidden_layers": 48, "num_attention_heads": 40,
                    "num_key_value_heads": 8, "head_dim": 128, "num_local_experts": 16, "num_experts_per_tok": 1,
                    "interleave_moe_layer_step": 1, "tie_word_embeddings": False, "attention_chunk_size": 8192,
                    "no_rope_layer_interval": 4, "n_shared_experts": 1},
}
# a multimodal wrapper's model type -> its decoder's, where the text_config does not name its own
TEXT_MODEL_TYPES = {"gemma3": "gemma3_text", "llama4": "llama4_text"}


def with_defaults(raw: dict[str, Any], text: dict[str, Any]) -> dict[str, Any]:
    """The decoder's config with its model type's defaults (MODEL_TYPE_DEFAULTS) where it leaves a field out."""
    model_type = text.get("model_type") if text is not raw else None
    model_type = model_type or TEXT_MODEL_TYPES.get(str(raw.get("model_type")), raw.get("model_type"))
    defaults = MODEL_TYPE_DEFAULTS.get(model_type) if isinstance(model_type, str) else None
    if not defaults:
        return text
    # a wrapper's own tie_word_embeddings stands (_tied reads it) where its decoder's config leaves it out
    return {**{k: v for k, v in defaults.items() if not (k == "tie_word_embeddings" and text is not raw
                                                         and raw.get(k) is not None)}, **text}


def decoder(raw: dict[str, Any], file: str, **wording: str) -> Reader:
    """The reader of a config's decoder: a multimodal config's text_config, else the config itself, with its model
    type's defaults (MODEL_TYPE_DEFAULTS) where it leaves a field out. `wording`: the Reader's lead and need."""
    nested = isinstance(raw.get("text_config"), dict)
    text = with_defaults(raw, raw["text_config"] if nested else raw)
    return Reader(text, file, "text_config." if nested else "", **wording)
