"""What the cost of a decode step depends on, read from a target's and a draft's config.json.

A target's facts are its decoder's dimensions (attention, dense MLP, experts, linear-attention layers,
sliding windows), the bytes per weight its `quantization_config` stores, and whether its matmuls run in
fp8. A draft's are its decoder's dimensions, the target layers it reads and its lm_head (its own rows or
the target's). Nothing else of a checkpoint is read: a prediction needs no weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dflash_convert.errors import DFlashError

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1, "fp8": 1}
LINEAR_STATE_BYTES = 4  # linear-attention (Gated DeltaNet) recurrent state, kept in float32 by the engines


@dataclass(frozen=True)
class ModelFacts:
    """A decoder's dimensions and storage. `experts` 0: a dense model. Counts are per layer unless named."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int  # a dense MLP's width (the MoE layers' dense part: shared_intermediate)
    vocab: int
    experts: int = 0
    top_k: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    dense_layers: int = 0  # MoE models: layers whose MLP is dense (first_k_dense_replace)
    linear_layers: int = 0  # linear-attention layers (their state is read and written, not a growing cache)
    linear_key_heads: int = 0
    linear_value_heads: int = 0
    linear_key_dim: int = 0
    linear_value_dim: int = 0
    sliding_layers: int = 0
    sliding_window: int = 0
    attention_gate: bool = False  # a gated attention output (q projection twice as wide)
    mla_kv_per_token: int = 0  # multi-head latent attention: cached width per token (kv_lora_rank + rope dim)
    mla_attention_params: int = 0
    weight_bytes: float = 2.0  # bytes per stored weight of the decoder's linear layers
    expert_weight_bytes: float = 2.0
    compute: str = "bf16"  # the matmuls' tensor-core type: "fp8" for w8a8 checkpoints
    kv_cache_bytes: float = 2.0
    lm_head_rows: int = 0  # a draft's own lm_head rows (draft_vocab_size); 0: it logits through the target's
    context_features: int = 0  # a draft: the width of the target features it projects (layers x target hidden)
    source: str = "config.json"

    # --- derived, per layer
    @property
    def full_layers(self) -> int:
        return self.layers - self.linear_layers

    @property
    def attention_params(self) -> int:
        if self.mla_attention_params:
            return self.mla_attention_params
        q = self.heads * self.head_dim * (2 if self.attention_gate else 1)
        return self.hidden * q + 2 * self.hidden * self.kv_heads * self.head_dim + self.heads * self.head_dim * self.hidden

    @property
    def linear_attention_params(self) -> int:
        k, v = self.linear_key_heads * self.linear_key_dim, self.linear_value_heads * self.linear_value_dim
        return self.hidden * (2 * k + 2 * v) + 2 * self.hidden * self.linear_value_heads + v * self.hidden

    @property
    def linear_state_bytes(self) -> int:
        """One sequence's recurrent state in one linear-attention layer."""
        return self.linear_value_heads * self.linear_key_dim * self.linear_value_dim * LINEAR_STATE_BYTES

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    @property
    def expert_params(self) -> int:
        return 3 * self.hidden * self.expert_intermediate

    @property
    def dense_params(self) -> int:
        """Every weight each token passes through except the routed experts and the lm_head."""
        mixers = (self.full_layers * self.attention_params + self.linear_layers * self.linear_attention_params)
        if self.experts:
            mlp = (self.dense_layers * 3 * self.hidden * self.intermediate
                   + self.moe_layers * (3 * self.hidden * self.shared_intermediate + self.hidden * self.experts))
        else:
            mlp = self.layers * 3 * self.hidden * self.intermediate
        return mixers + mlp + self.context_features * self.hidden

    @property
    def kv_bytes_per_token(self) -> float:
        """Cache bytes one position adds in one full-attention layer."""
        width = self.mla_kv_per_token or 2 * self.kv_heads * self.head_dim
        return width * self.kv_cache_bytes

    def distinct_experts(self, tokens: int) -> float:
        """Expected experts a layer's `tokens` route to under uniform top-k routing: E (1 - (1 - k/E)^tokens)."""
        if not self.experts or tokens <= 0:
            return 0.0
        return self.experts * (1.0 - (1.0 - self.top_k / self.experts) ** tokens)


# ----------------------------------------------------------------------------- reading a config.json

def _int(cfg: dict[str, Any], *keys: str, default: int | None = None, file: str = "config.json") -> int:
    for key in keys:
        value = cfg.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
    if default is not None:
        return default
    raise DFlashError(f"field `{keys[0]}` missing or not a non-negative integer: a prediction needs it", file=file)


def _storage(raw: dict[str, Any], text: dict[str, Any]) -> tuple[float, float, str]:
    """(bytes per weight, bytes per expert weight, compute type) from quantization_config, else the dtype."""
    q = raw.get("quantization_config") or text.get("quantization_config")
    dtype = str(text.get("torch_dtype") or text.get("dtype") or raw.get("torch_dtype") or raw.get("dtype")
                or "bfloat16").replace("torch.", "")
    plain = float(DTYPE_BYTES.get(dtype, 2))
    if not isinstance(q, dict):
        return plain, plain, "bf16"
    method = str(q.get("quant_method", "")).lower()
    if method in ("fp8", "modelopt", "fbgemm_fp8") or "fp8" in str(q.get("quant_algo", "")).lower():
        return 1.0, 1.0, "fp8"
    if method == "mxfp4":  # gpt-oss: the experts in 4-bit blocks (a shared 8-bit scale per 32), the rest as stored
        return plain, 4.25 / 8, "bf16"
    bits = q.get("bits") or q.get("w_bit")
    if bits is None and isinstance(q.get("config_groups"), dict):  # compressed-tensors
        for group in q["config_groups"].values():
            weights = (group or {}).get("weights") or {}
            bits = weights.get("num_bits", bits)
            if str(weights.get("type", "")).lower() == "float" and bits == 8:
                return 1.0, 1.0, "fp8" if ((group or {}).get("input_activations") or {}).get("num_bits") == 8 \
                    else "bf16"
    if isinstance(bits, int) and 0 < bits < 16:
        group = q.get("group_size") or 128
        per = bits / 8 + (2 / group if isinstance(group, int) and group > 0 else 0)  # a bf16 scale per group
        compute = "fp8" if bits == 8 and method == "compressed-tensors" else "bf16"
        return per, per, compute
    return plain, plain, "bf16"


def target_facts(raw: dict[str, Any], file: str = "config.json") -> ModelFacts:
    """A target's facts from its config.json (a multimodal config's text_config is its decoder)."""
    text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else raw
    hidden = _int(text, "hidden_size", "n_embd", file=file)
    layers = _int(text, "num_hidden_layers", "n_layer", file=file)
    heads = _int(text, "num_attention_heads", "n_head", file=file)
    if hidden == 0 or layers == 0 or heads == 0:
        raise DFlashError("hidden_size, num_hidden_layers and num_attention_heads must be positive", file=file)
    kv = _int(text, "num_key_value_heads", default=heads, file=file)
    head_dim = _int(text, "head_dim", default=hidden // heads, file=file)
    experts = _int(text, "num_experts", "num_local_experts", "n_routed_experts", default=0, file=file)
    top_k = _int(text, "num_experts_per_tok", "num_experts_per_token", "moe_topk", default=0, file=file)
    if experts and not top_k:
        raise DFlashError("field `num_experts_per_tok` missing: a MoE target's cost depends on it", file=file)
    inter = _int(text, "intermediate_size", "ffn_hidden_size", default=0, file=file)
    expert_inter = _int(text, "moe_intermediate_size", default=inter, file=file) if experts else 0
    shared = _int(text, "shared_expert_intermediate_size", default=0, file=file)
    if experts and not shared and text.get("n_shared_experts"):
        shared = int(text["n_shared_experts"]) * expert_inter
    if not experts and not inter:
        raise DFlashError("field `intermediate_size` missing: a prediction needs the MLP width", file=file)
    layer_types = text.get("layer_types") if isinstance(text.get("layer_types"), list) else None
    if layer_types is None and isinstance(text.get("full_attention_interval"), int) and text.get(
            "linear_num_value_heads"):
        every = text["full_attention_interval"]
        layer_types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)]
    linear = sum(1 for t in (layer_types or []) if t == "linear_attention")
    sliding = sum(1 for t in (layer_types or []) if t == "sliding_attention")
    window = _int(text, "sliding_window", default=0, file=file) if sliding else 0
    mla_kv, mla_params = 0, 0
    if isinstance(text.get("kv_lora_rank"), int):
        rope, nope = _int(text, "qk_rope_head_dim", default=0), _int(text, "qk_nope_head_dim", default=head_dim)
        v_dim, q_rank = _int(text, "v_head_dim", default=head_dim), text.get("q_lora_rank")
        kv_rank = text["kv_lora_rank"]
        q = (hidden * q_rank + q_rank * heads * (nope + rope)) if isinstance(q_rank, int) else hidden * heads * (nope + rope)
        mla_params = q + hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim) + heads * v_dim * hidden
        mla_kv = kv_rank + rope
    wb, ewb, compute = _storage(raw, text)
    return ModelFacts(
        hidden=hidden, layers=layers, heads=heads, kv_heads=kv or heads, head_dim=head_dim, intermediate=inter,
        vocab=_int(text, "vocab_size", file=file), experts=experts, top_k=top_k, expert_intermediate=expert_inter,
        shared_intermediate=shared, dense_layers=_int(text, "first_k_dense_replace", default=0) if experts else 0,
        linear_layers=linear, linear_key_heads=_int(text, "linear_num_key_heads", default=0),
        linear_value_heads=_int(text, "linear_num_value_heads", default=0),
        linear_key_dim=_int(text, "linear_key_head_dim", default=0),
        linear_value_dim=_int(text, "linear_value_head_dim", default=0), sliding_layers=sliding,
        sliding_window=window, attention_gate=bool(text.get("attn_output_gate")), mla_kv_per_token=mla_kv,
        mla_attention_params=mla_params, weight_bytes=wb, expert_weight_bytes=ewb, compute=compute, source=file)


def draft_facts(raw: dict[str, Any], target: ModelFacts, file: str = "config.json") -> ModelFacts:
    """A DFlash draft's facts from its config.json (either format), through the project's one config reader."""
    from dflash_convert.format.mapping import spec_from_config

    spec = spec_from_config(raw, file)
    n_features = len(spec.target_layer_ids or []) or 1
    wb, _, compute = _storage(raw, spec.decoder)
    return ModelFacts(
        hidden=spec.hidden_size, layers=spec.num_layers, heads=spec.num_heads, kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim, intermediate=spec.intermediate_size, vocab=spec.vocab_size, weight_bytes=wb,
        expert_weight_bytes=wb, compute=compute, lm_head_rows=spec.draft_vocab_size or 0,
        context_features=n_features * (spec.target_hidden_size or target.hidden), source=file)
