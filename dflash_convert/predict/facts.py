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
from dflash_convert.format.sizes import Reader, decoder, short_repr

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4, "float8_e4m3fn": 1, "fp8": 1}
SERVED_FLOAT_BYTES = 2.0  # the widest an engine serves weights at (see _storage)
LINEAR_STATE_BYTES = 4  # linear-attention (Gated DeltaNet) recurrent state, kept in float32 by the engines
NEED = "a prediction needs it"  # why a missing field is an error here


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
    mla_kv_rank: int = 0  # MLA's kv_lora_rank: the width absorbed decode's values are weighted over, per head
    mla_attention_params: int = 0
    weight_bytes: float = 2.0  # bytes per stored weight of the decoder's linear layers
    expert_weight_bytes: float = 2.0
    compute: str = "bf16"  # the matmuls' tensor-core type: "fp8" for w8a8 checkpoints
    kv_cache_bytes: float = 2.0
    lm_head_rows: int = 0  # a draft's own lm_head rows (draft_vocab_size); 0: it logits through the target's
    context_features: int = 0  # a draft: the width of the target features it projects (layers x target hidden)
    tied_embeddings: bool = True  # a target: its lm_head is its embedding's rows (stored once)
    max_proposals: int = 0  # a draft: the most tokens its trained block proposes per step (0: not stated)
    block_size: int = 0  # a draft: its trained block, as its config states it
    kind: str = ""  # a draft: its kind (DraftSpec.variant: dflash, dflash2, dspark), which names its serving method
    storage_warning: str = ""  # a quantization scheme not read (the weights counted at the dtype's width)
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

    @property
    def attention_flops_per_position(self) -> int:
        """FLOPs one token spends on one cached position in one full-attention layer: 2 per multiply-add of its
        scores (query . key) and of its value sum, over every head. MLA decodes absorbed: each head's query is
        projected into the latent, so its scores span kv_lora_rank + qk_rope_head_dim (576 for DeepSeek-V3) and its
        values kv_lora_rank (512), not the model's head_dim."""
        if self.mla_kv_per_token:
            return 2 * self.heads * (self.mla_kv_per_token + self.mla_kv_rank)
        return 4 * self.heads * self.head_dim

    def kv_shards(self, tp: int) -> int:
        """Over how many of `tp` GPUs the KV cache is split: MLA's one latent per token is not split over heads (vLLM
        keeps it whole on every rank: its MLA cache spec has one KV head and at most one TP shard); KV heads fewer
        than the TP size are replicated, so the cache splits over at most that many."""
        return 1 if self.mla_kv_per_token else max(1, min(tp, self.kv_heads))

    def state_shards(self, tp: int) -> int:
        """Over how many of `tp` GPUs the linear-attention state splits (by value heads)."""
        return max(1, min(tp, self.linear_value_heads or 1))

    def distinct_experts(self, tokens: int) -> float:
        """Expected experts a layer's `tokens` route to under uniform top-k routing: E (1 - (1 - k/E)^tokens)."""
        if not self.experts or tokens <= 0:
            return 0.0
        return self.experts * (1.0 - (1.0 - self.top_k / self.experts) ** tokens)


def _storage(raw: dict[str, Any], text: dict[str, Any],
             file: str = "config.json") -> tuple[float, float, str, str]:
    """(bytes per weight, bytes per expert weight, compute type, a warning or "") from quantization_config, else the
    dtype. A scheme it cannot read is counted at the dtype's width, and the warning names it and says so."""
    q = raw.get("quantization_config") or text.get("quantization_config")
    # `dtype` before the older `torch_dtype`, as transformers reads a config stating both (and validate's memory plan)
    dtype = str(text.get("dtype") or text.get("torch_dtype") or raw.get("dtype") or raw.get("torch_dtype")
                or "bfloat16").replace("torch.", "")
    # a float32 checkpoint is served in 16 bits: the engines' dtype "auto" downcasts float32 models (vLLM 0.33
    # config/model.py _resolve_auto_dtype: to the platform's first supported dtype, bfloat16 on a GPU; SGLang's auto
    # likewise), so its weights are read at 2 bytes, not the 4 its config states
    plain = min(float(DTYPE_BYTES.get(dtype, 2)), SERVED_FLOAT_BYTES)
    if not isinstance(q, dict):
        return plain, plain, "bf16", ""
    read = Reader(q, file, "quantization_config.", need=NEED)
    method = str(q.get("quant_method", "")).lower()
    nested = q.get("quantization") if isinstance(q.get("quantization"), dict) else {}
    algo = str(q.get("quant_algo") or nested.get("quant_algo") or "").upper()
    if method == "modelopt" and "FP4" in algo:  # NVFP4: 4-bit values, an fp8 scale per 16 (no fp4 peak in gpus.py)
        per = 0.5 + 1 / read("group_size", 16)
        return per, per, "bf16", ""
    if method in ("fp8", "fbgemm_fp8") or (method == "modelopt" and algo == "FP8") or "FP8" in algo:
        return 1.0, 1.0, "fp8", ""
    if method == "mxfp4":  # gpt-oss: the experts in 4-bit blocks (a shared 8-bit scale per 32), the rest as stored
        return plain, 4.25 / 8, "bf16", ""
    if method == "bitsandbytes":
        if read.flag("load_in_4bit"):  # 4-bit blocks of 64 with an fp32 absmax; double quant: an 8-bit absmax and
            double = read.flag("bnb_4bit_use_double_quant")  # an fp32 scale per 256 blocks
            per = 0.5 + (1 / 64 + 4 / (64 * 256) if double else 4 / 64)
            return per, per, "bf16", ""
        if read.flag("load_in_8bit"):  # LLM.int8: a byte per weight (a scale per row)
            return 1.0, 1.0, "bf16", ""
    if method == "quark":  # AMD Quark: its global config's weight and input dtypes
        glob = q.get("global_quant_config") if isinstance(q.get("global_quant_config"), dict) else {}
        weight = str((glob.get("weight") or {}).get("dtype", "") if isinstance(glob.get("weight"), dict) else "")
        inputs = glob.get("input_tensors") if isinstance(glob.get("input_tensors"), dict) else {}
        if weight.lower().startswith(("fp8", "int8")):
            return 1.0, 1.0, "fp8" if str(inputs.get("dtype", "")).lower().startswith("fp8") and \
                weight.lower().startswith("fp8") else "bf16", ""
    bits = read("bits", 0) if read.present("bits") else None
    if bits is None and isinstance(q.get("config_groups"), dict):  # compressed-tensors
        for name, group in q["config_groups"].items():
            if group is not None and not isinstance(group, dict):
                raise DFlashError(f"field `quantization_config.config_groups.{name}` is {short_repr(group)}, not an "
                                  "object", file=file)
            weights = (group or {}).get("weights") or {}
            bits = weights.get("num_bits", bits) if isinstance(weights, dict) else bits
            if isinstance(weights, dict) and str(weights.get("type", "")).lower() == "float" and bits == 8:
                return 1.0, 1.0, "fp8" if ((group or {}).get("input_activations") or {}).get("num_bits") == 8 \
                    else "bf16", ""
    if type(bits) is int and 0 < bits < 16:
        group = read("group_size", 128)
        per = bits / 8 + (2 / group if group > 0 else 0)  # a bf16 scale per group
        compute = "fp8" if bits == 8 and method == "compressed-tensors" else "bf16"
        return per, per, compute, ""
    scheme = " ".join(x for x in (method or "(no quant_method)", algo.lower()) if x)
    return plain, plain, "bf16", (f"quantization_config {scheme!r} is not a scheme the model reads: its weights are "
                                  f"counted at the dtype's {plain:g} bytes ({dtype}), which overstates a narrower "
                                  "scheme's memory and bytes per step")


def target_facts(raw: dict[str, Any], file: str = "config.json") -> ModelFacts:
    """A target's facts from its config.json (a multimodal config's text_config is its decoder)."""
    read = decoder(raw, file, need=NEED)
    text = read.cfg
    hidden, layers, heads = read("hidden"), read("layers"), read("heads")
    kv, head_dim = read("kv_heads"), read("head_dim")
    experts = read("experts", 0)
    top_k = read("top_k") if experts else 0  # a MoE target's cost depends on it: required
    inter = read("intermediate", 0)
    expert_inter = read("expert_intermediate", inter or None) if experts else 0
    shared = read("shared_intermediate", 0)
    shared_experts = read("shared_experts", 0)
    if experts and not shared:
        shared = shared_experts * expert_inter
    if not experts and not inter:
        raise DFlashError(f"field `{read.prefix}intermediate_size` is missing or 0: a prediction needs the MLP "
                          "width", file=file)
    dense_layers = read("dense_layers", 0) if experts else 0
    if experts and read.present("moe_layer_step"):  # after the first dense ones, every Nth layer MoE
        sparse = layers - dense_layers
        dense_layers += sparse - sparse // read("moe_layer_step")
    if experts and text.get("mlp_only_layers"):
        dense_layers = _dense_layers(text, read, layers)
    dense_inter = read("dense_intermediate", inter) if experts and dense_layers else inter
    linear_value_heads = read("linear_value_heads", 0)
    layer_types = read.layer_types(layers)
    if layer_types is None and read.present("full_attention_interval") and linear_value_heads:
        every = read("full_attention_interval")
        layer_types = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(layers)]
    if layer_types is None and read.present("sliding_window_pattern") and read.present("sliding_window"):
        every = read("sliding_window_pattern")  # as transformers derives Gemma-3's layer_types
        layer_types = ["full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(layers)]
    if layer_types is None and read.present("attention_chunk_size") and read.present("chunk_layer_interval"):
        every = read("chunk_layer_interval")  # as transformers derives Llama-4's layer_types
        layer_types = ["full_attention" if (i + 1) % every == 0 else "chunked_attention" for i in range(layers)]
    linear = sum(1 for t in (layer_types or []) if t == "linear_attention")
    # chunked local attention (vLLM's ChunkedLocalAttention for Llama-4's RoPE layers) caches and reads at most the
    # current chunk: counted as a sliding window of the chunk's size, an upper bound
    sliding = sum(1 for t in (layer_types or []) if t in ("sliding_attention", "chunked_attention"))
    if "sliding_attention" in (layer_types or []):
        window = read("sliding_window", 0)
    else:
        window = read("attention_chunk_size", 0) if sliding else 0
    mla_kv, mla_rank, mla_params = 0, 0, 0
    if read.present("kv_lora_rank"):
        kv_rank = read("kv_lora_rank")
        rope, nope = read("qk_rope_head_dim", 0), read("qk_nope_head_dim", head_dim)
        v_dim = read("v_head_dim", head_dim)
        q_rank = read("q_lora_rank") if read.present("q_lora_rank") else None  # null: q projected directly
        q = hidden * q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
        mla_params = q + hidden * (kv_rank + rope) + kv_rank * heads * (nope + v_dim) + heads * v_dim * hidden
        mla_kv, mla_rank = kv_rank + rope, kv_rank
    wb, ewb, compute, storage_warning = _storage(raw, text, file)
    return ModelFacts(
        hidden=hidden, layers=layers, heads=heads, kv_heads=kv, head_dim=head_dim, intermediate=dense_inter,
        vocab=read("vocab"), experts=experts, top_k=top_k, expert_intermediate=expert_inter,
        shared_intermediate=shared, dense_layers=dense_layers,
        linear_layers=linear, linear_key_heads=read("linear_key_heads", 0), linear_value_heads=linear_value_heads,
        linear_key_dim=read("linear_key_dim", 0), linear_value_dim=read("linear_value_dim", 0),
        sliding_layers=sliding, sliding_window=window, attention_gate=_gated(raw, text, read),
        mla_kv_per_token=mla_kv, mla_kv_rank=mla_rank, mla_attention_params=mla_params, weight_bytes=wb, expert_weight_bytes=ewb,
        compute=compute, tied_embeddings=_tied(raw, text, read), storage_warning=storage_warning,
        source=file)


# Model types whose full-attention layers always gate their output (a q_proj twice as wide: query and gate), whether or
# not the config says attn_output_gate: transformers' Qwen3NextAttention, Qwen3_5Attention and Qwen3_5MoeAttention
# build q_proj of num_attention_heads x head_dim x 2 outputs and read no such field; Qwen/Qwen3-Next-80B-A3B's
# config.json states none (Qwen3.5's state attn_output_gate: true).
GATED_ATTENTION_MODEL_TYPES = ("qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text")


def _gated(raw: dict[str, Any], text: dict[str, Any], read: Reader) -> bool:
    """attn_output_gate where the config states it, else whether the model type always gates (above)."""
    if text.get("attn_output_gate") is not None:
        return read.flag("attn_output_gate")
    return (text.get("model_type") or raw.get("model_type")) in GATED_ATTENTION_MODEL_TYPES


def _dense_layers(text: dict[str, Any], read: Reader, layers: int) -> int:
    """Qwen2-MoE, Qwen3-MoE and Qwen3-Next: the layers of mlp_only_layers have a dense MLP, as do those
    decoder_sparse_step skips (transformers' Qwen3MoeDecoderLayer: experts where the index is not listed and
    (index + 1) % decoder_sparse_step == 0), and the first first_k_dense_replace where a config states both."""
    only = text["mlp_only_layers"]
    if not (isinstance(only, list) and all(type(i) is int and 0 <= i < layers for i in only)):
        raise DFlashError(f"field `{read.prefix}mlp_only_layers` is {short_repr(only)}, not a list of layer indices in "
                          f"[0, {layers - 1}]", file=read.file)
    step = read("moe_layer_step") if read.present("moe_layer_step") else 1
    first = read("dense_layers", 0)
    return sum(1 for i in range(layers) if i < first or i in set(only) or (i + 1) % step)


def _tied(raw: dict[str, Any], text: dict[str, Any], read: Reader) -> bool:
    """tie_word_embeddings, the decoder's or (a multimodal wrapper's) the top level's; absent: transformers'
    default, tied."""
    if text.get("tie_word_embeddings") is not None:
        return read.flag("tie_word_embeddings")
    if raw.get("tie_word_embeddings") is not None:
        return Reader(raw, read.file, need=NEED).flag("tie_word_embeddings")
    return True


def draft_facts(raw: dict[str, Any], target: ModelFacts, file: str = "config.json") -> ModelFacts:
    """A DFlash draft's facts from its config.json (either format), through the project's one config reader."""
    from dflash_convert.format.mapping import spec_from_config

    from dflash_convert.format.serving import anchor_proposes

    spec = spec_from_config(raw, file)
    n_features = len(spec.target_layer_ids or []) or 1
    wb, _, compute, storage_warning = _storage(raw, spec.decoder, file)
    block = spec.block_size or 0
    proposals = (block if anchor_proposes(spec) else block - 1) if block else 0
    return ModelFacts(
        hidden=spec.hidden_size, layers=spec.num_layers, heads=spec.num_heads, kv_heads=spec.num_kv_heads,
        head_dim=spec.head_dim, intermediate=spec.intermediate_size, vocab=spec.vocab_size, weight_bytes=wb,
        expert_weight_bytes=wb, compute=compute, lm_head_rows=spec.draft_vocab_size or 0,
        context_features=n_features * (spec.target_hidden_size or target.hidden), max_proposals=proposals,
        block_size=block, kind=spec.variant, storage_warning=storage_warning, source=file)
