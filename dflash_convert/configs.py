"""Config models: what each checkpoint format's config.json holds, and the format-neutral DraftSpec.

The two pydantic models below describe the files (they type-check what we read and generate
the JSON Schemas in `schemas/`); `DraftSpec` is what every other module works with. Turning one
into the other is `mapping.py`'s job: this module knows field names and types, not semantics.
Unknown keys are allowed everywhere (real configs carry many) and are carried through.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

LayerType = Literal["full_attention", "sliding_attention"]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True)


class DecoderConfig(_Open):
    """Qwen3-style decoder dimensions of the DRAFT (flat in HF configs, nested in speculators')."""

    model_type: str | None = None
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int = Field(description="number of DRAFT decoder layers")
    num_attention_heads: int
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    vocab_size: int = Field(description="the TARGET vocabulary size")
    rms_norm_eps: float = 1e-6
    hidden_act: str = "silu"
    attention_bias: bool = False
    max_position_embeddings: int | None = None
    rope_parameters: dict[str, Any] | None = None
    rope_theta: float | None = Field(None, description="legacy (transformers 4.x) key")
    rope_scaling: dict[str, Any] | None = Field(None, description="legacy (transformers 4.x) key")
    layer_types: list[LayerType] | None = None
    sliding_window: int | None = None
    use_sliding_window: bool | None = None
    max_window_layers: int | None = None


class GreedyProposal(_Open):
    proposal_type: str = "greedy"
    speculative_tokens: int
    verifier_accept_k: int = 1
    accept_tolerance: float = 0.0


class VerifierRef(_Open):
    name_or_path: str | None = None
    architectures: list[str] = Field(default_factory=list)


class SpeculatorsBlock(_Open):
    algorithm: str = "dflash"
    proposal_methods: list[GreedyProposal] = Field(default_factory=list)
    default_proposal_method: str = "greedy"
    verifier: VerifierRef = Field(default_factory=VerifierRef)


class SpeculatorsDFlashConfig(_Open):
    """config.json of a speculators checkpoint (`speculators_model_type: dflash` or `dflash2`)."""

    speculators_model_type: str
    architectures: list[str] | None = None
    transformer_layer_config: DecoderConfig
    aux_hidden_state_layer_ids: list[int] | None = Field(
        None, description="vLLM capture ids: residual stream entering layer k = z-lab target id + 1"
    )
    mask_token_id: int | None = None
    block_size: int = 8
    draft_vocab_size: int | None = None
    target_hidden_size: int | None = None
    sliding_window_non_causal: bool | None = None
    sample_from_anchor: bool = False
    speculators_config: SpeculatorsBlock | None = None
    speculators_version: str | None = None
    # dflash2 only
    conv_kernel_size: int | None = None
    conv_group_size: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None


class DFlashBlock(_Open):
    mask_token_id: int | None = None
    target_layer_ids: list[int] | None = Field(
        None, description="0-based target layers whose OUTPUT is used (output_hidden_states[id+1])"
    )
    block_size: int | None = None
    causal: bool | None = Field(None, description="vLLM: overrides the causality of every layer")
    verifier: VerifierRef | None = Field(None, description="dflash-convert: the target model, kept for round trips")
    # dflash2 only
    conv_kernel_size: int | None = None
    conv_group_size: int | None = None
    selector_rank: int | None = None
    selector_top_k: int | None = None


class HFDFlashConfig(DecoderConfig):
    """config.json of a Hugging Face / z-lab checkpoint: a flat Qwen3 config of the draft plus DFlash keys."""

    architectures: list[str]
    block_size: int | None = None
    num_target_layers: int | None = None
    target_hidden_size: int | None = None
    draft_vocab_size: int | None = None
    is_causal: bool | None = None
    auto_map: dict[str, str] | None = None
    dflash_config: DFlashBlock = Field(default_factory=DFlashBlock)


class ConversionRecord(_Open):
    """conversion.json: provenance of a converted checkpoint."""

    tool: str = "dflash-convert"
    tool_version: str
    source: str
    source_format: Literal["speculators", "hf"]
    source_revision: str | None = None
    destination_format: Literal["speculators", "hf"]
    input_files: dict[str, str] = Field(description="file name -> sha256")
    options: dict[str, Any]
    tensors_kept: list[str]
    tensors_dropped: dict[str, str] = Field(description="tensor name -> reason")
    tensors_renamed: dict[str, str] = Field(default_factory=dict, description="source name -> destination name")
    tensors_added: dict[str, str] = Field(default_factory=dict, description="tensor name -> how it was derived")
    warnings: list[str] = Field(default_factory=list)


Variant = Literal["dflash", "dflash2"]
Format = Literal["speculators", "hf"]


class DraftSpec(BaseModel):
    """A DFlash draft as engines understand it, independent of the file format it came from.

    Conventions: `target_layer_ids` are z-lab ids (0-based layer whose output is used);
    `layer_causal[i]` is the resolved block causality of draft layer i (FORMATS.md 6.4).
    """

    model_config = ConfigDict(extra="forbid")

    source_format: Format
    variant: Variant = "dflash"
    decoder: dict[str, Any] = Field(description="Qwen3 decoder config of the draft, every key kept")
    block_size: int | None
    mask_token_id: int | None
    target_layer_ids: list[int] | None
    layer_types: list[LayerType]
    layer_causal: list[bool]
    causal_flag: bool | None = Field(None, description="an explicit all-layer causality flag found in the source")
    draft_vocab_size: int | None = Field(None, description="rows of the draft's own lm_head; None = full target vocab")
    num_target_layers: int | None = None
    target_hidden_size: int | None = None
    verifier: VerifierRef | None = None
    variant_fields: dict[str, Any] = Field(default_factory=dict)
    extra: dict[str, Any] = Field(default_factory=dict, description="source keys with no meaning to DFlash, carried through")
    dtype: str | None = None

    # Typed views of the decoder dims (read through DecoderConfig's defaults).
    def _d(self, key: str):
        return self.decoder.get(key, DecoderConfig.model_fields[key].default)

    @property
    def hidden_size(self) -> int:
        return self.decoder["hidden_size"]

    @property
    def num_layers(self) -> int:
        return self.decoder["num_hidden_layers"]

    @property
    def num_heads(self) -> int:
        return self.decoder["num_attention_heads"]

    @property
    def num_kv_heads(self) -> int:
        return self._d("num_key_value_heads") or self.num_heads

    @property
    def head_dim(self) -> int:
        return self._d("head_dim") or self.hidden_size // self.num_heads

    @property
    def intermediate_size(self) -> int:
        return self.decoder["intermediate_size"]

    @property
    def vocab_size(self) -> int:
        return self.decoder["vocab_size"]

    @property
    def rms_norm_eps(self) -> float:
        return self._d("rms_norm_eps")

    @property
    def attention_bias(self) -> bool:
        return bool(self._d("attention_bias"))

    @property
    def hidden_act(self) -> str:
        return self._d("hidden_act")

    @property
    def sliding_window(self) -> int | None:
        return self._d("sliding_window")

    @property
    def rope_theta(self) -> float:
        params = self._d("rope_parameters") or {}
        return float(params.get("rope_theta") or self._d("rope_theta") or 10000.0)

    @property
    def rope_scaling(self) -> dict[str, Any] | None:
        """Non-default RoPE scaling (yarn, llama3, ...) or None."""
        params = dict(self._d("rope_parameters") or self._d("rope_scaling") or {})
        kind = params.get("rope_type") or params.get("type") or "default"
        return None if kind == "default" else params

    @property
    def is_pruned_vocab(self) -> bool:
        return self.draft_vocab_size is not None and self.draft_vocab_size != self.vocab_size

    @property
    def context_width(self) -> int | None:
        """Input width of `fc`: one target hidden state per target layer id."""
        if self.target_layer_ids is None:
            return None
        return len(self.target_layer_ids) * (self.target_hidden_size or self.hidden_size)
