"""Config models: what each checkpoint format's config.json holds, and the format-neutral DraftSpec.

The two pydantic models below describe the files (they type-check what we read and generate
the JSON Schemas in `schemas/`); `DraftSpec` is what every other module works with. Turning one
into the other is `mapping.py`'s job: this module knows field names and types, not semantics.
Unknown keys are allowed everywhere (real configs carry many) and are carried through.

Validation is strict and bounded, the same for every command that reads a config: a JSON `true` is
not an integer, `"8"` is not a block size, NaN is not an epsilon, and every size, count and id lies
in a range some engine can serve (the limits below). The limits are far above any real draft;
they exist so that a hostile config fails here, with the field named, instead of allocating
gigabytes or dividing by zero later.
"""

from __future__ import annotations

import functools
import math
import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, WithJsonSchema, create_model, model_validator

from dflash_convert.format import kinds

LayerType = Literal["full_attention", "sliding_attention"]

# Bounds on config values (inclusive). Engines accept any positive block size (vLLM: speculative
# tokens > 0, SGLang: block_size >= 1, and a block of 1 drafts nothing); real drafts use 8-16.
MIN_BLOCK_SIZE = 2  # the anchor plus at least one mask slot
MAX_BLOCK_SIZE = 1024
MAX_LAYERS = 1024  # draft layers, target layers and layer ids
MAX_HIDDEN = 1 << 17
MAX_INTERMEDIATE = 1 << 20
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_VOCAB = 1 << 24
MAX_POSITIONS = 1 << 30  # max_position_embeddings, sliding_window
MAX_CONV = 1 << 16  # dflash2 convolution / selector sizes


class FieldError(ValueError):
    """A value that is wrong only in relation to another field; `_parse` reports it under `field`."""

    def __init__(self, field: str, message: str):
        self.field = field
        super().__init__(message)


def _printable(value: str) -> str:
    """Config strings reach terminals (inspect, diff, model cards): no escape sequences in them."""
    bad = next((c for c in value if ord(c) < 32 or 127 <= ord(c) < 160), None)
    if bad is not None:
        raise ValueError(f"contains the control character U+{ord(bad):04X} (terminal escapes are refused)")
    return value


Text = Annotated[str, AfterValidator(_printable), Field(max_length=4096)]  # a name, path or type string


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", populate_by_name=True, strict=True)


def _size(lo: int, hi: int, description: str | None = None, default: Any = ...) -> Any:
    return Field(default, ge=lo, le=hi, description=description)


def _check_ids(field: str, ids: list[int] | None, lo: int, num_layers: int | None) -> None:
    """Layer ids: non-empty, unique, >= lo, below the target's layer count when it is known."""
    if ids is None:
        return
    if not ids:
        raise FieldError(field, "is empty: the draft needs at least one target layer")
    dup = sorted({i for i in ids if ids.count(i) > 1})
    if dup:
        raise FieldError(field, f"repeats ids {dup}: each target layer is captured once")
    high = (MAX_LAYERS if num_layers is None else num_layers) - 1 + lo
    bad = [i for i in ids if not lo <= i <= high]
    if bad:
        where = (f"the target's {num_layers} layers (num_target_layers)" if num_layers is not None
                 else f"the supported range [{lo}, {high}]")
        raise FieldError(field, f"has ids {bad} outside {where}")


def _check_token(field: str, token: int | None, vocab: int) -> None:
    if token is not None and not 0 <= token < vocab:
        raise FieldError(field, f"is {token}, outside the vocabulary [0, {vocab})")


class DecoderConfig(_Open):
    """Qwen3-style decoder dimensions of the DRAFT (flat in HF configs, nested in speculators')."""

    model_type: Text | None = None
    hidden_size: int = _size(1, MAX_HIDDEN)
    intermediate_size: int = _size(1, MAX_INTERMEDIATE)
    num_hidden_layers: int = _size(1, MAX_LAYERS, "number of DRAFT decoder layers")
    num_attention_heads: int = _size(1, MAX_HEADS)
    num_key_value_heads: int | None = _size(1, MAX_HEADS, default=None)
    head_dim: int | None = _size(1, MAX_HEAD_DIM, default=None)
    vocab_size: int = _size(1, MAX_VOCAB, "the TARGET vocabulary size")
    rms_norm_eps: float = Field(1e-6, gt=0, lt=1, allow_inf_nan=False)
    hidden_act: Text = "silu"
    attention_bias: bool = False
    max_position_embeddings: int | None = _size(1, MAX_POSITIONS, default=None)
    rope_parameters: dict[str, Any] | None = None
    rope_theta: float | None = Field(None, gt=0, allow_inf_nan=False, description="legacy (transformers 4.x) key")
    rope_scaling: dict[str, Any] | None = Field(None, description="legacy (transformers 4.x) key")
    layer_types: list[LayerType] | None = None
    sliding_window: int | None = _size(1, MAX_POSITIONS, default=None)
    use_sliding_window: bool | None = None
    max_window_layers: int | None = _size(0, MAX_POSITIONS, default=None)
    pad_token_id: int | None = None
    eos_token_id: int | list[int] | None = None

    @model_validator(mode="after")
    def _consistent(self):
        heads, kv = self.num_attention_heads, self.num_key_value_heads
        if self.head_dim is None and self.hidden_size % heads:
            raise FieldError("num_attention_heads", f"{heads} does not divide hidden_size {self.hidden_size} "
                             "and there is no head_dim")
        if kv is not None and heads % kv:
            raise FieldError("num_key_value_heads", f"{kv} does not divide num_attention_heads {heads}")
        if self.layer_types is not None and len(self.layer_types) != self.num_hidden_layers:
            raise FieldError("layer_types", f"has {len(self.layer_types)} entries for num_hidden_layers="
                             f"{self.num_hidden_layers}")
        if self.layer_types and "sliding_attention" in self.layer_types and self.sliding_window is None:
            raise FieldError("sliding_window", "is unset but layer_types has sliding_attention layers: engines would "
                             "run them with no window (full attention)")
        for key, params in (("rope_parameters", self.rope_parameters), ("rope_scaling", self.rope_scaling)):
            theta = (params or {}).get("rope_theta")
            if theta is not None and not (type(theta) in (int, float) and math.isfinite(theta) and theta > 0):
                raise FieldError(f"{key}.rope_theta", f"is {theta!r}, not a finite number > 0")
            kind = (params or {}).get("rope_type", (params or {}).get("type"))
            if kind is not None and not (isinstance(kind, str) and kind.isprintable() and len(kind) < 64):
                raise FieldError(f"{key}.rope_type", f"is {kind!r}, not the name of a RoPE type")
        return self


class GreedyProposal(_Open):
    proposal_type: Text = "greedy"
    speculative_tokens: int = _size(MIN_BLOCK_SIZE - 1, MAX_BLOCK_SIZE - 1)
    verifier_accept_k: int = _size(1, MAX_BLOCK_SIZE, default=1)
    accept_tolerance: float = Field(0.0, ge=0, allow_inf_nan=False)


HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")


def is_hub_id(source: str) -> bool:
    """`org/name` as the Hub spells repo ids (no local-path look: no leading ./, /, ~, no '..').
    Configs name verifiers this way, engines check it, the Hub client resolves it."""
    return bool(HUB_ID.match(source)) and ".." not in source and "--" not in source and not source.endswith(".git")


class VerifierRef(_Open):
    name_or_path: Text | None = None
    architectures: list[Text] = Field(default_factory=list)


class SpeculatorsBlock(_Open):
    algorithm: Text = "dflash"
    proposal_methods: list[GreedyProposal] = Field(default_factory=list)
    default_proposal_method: Text = "greedy"
    verifier: VerifierRef = Field(default_factory=VerifierRef)


def key_types() -> dict[str, tuple]:
    """ConfigKey.typed -> the (annotation, field) a config model checks a key of that type with."""
    return {"size": (int | None, _size(0, MAX_CONV, default=None)), "text": (Text | None, None),
            "bool": (bool | None, None), "float": (float | None, Field(None, allow_inf_nan=False))}


@functools.lru_cache(maxsize=None)
def kind_keys_model(kind) -> type[BaseModel]:
    """A model of one kind's typed keys (by name): how a kind registered after the config models were built (a
    plug-in's, a test's) has its keys checked as the built-in kinds' are."""
    types = key_types()
    return create_model(f"{type(kind).__name__}Keys", __base__=_Open,
                        **{k.name: types[k.typed] for k in kind.keys if k.typed})


def _kind_fields(where: str, declared: type[BaseModel]) -> dict[str, Any]:
    """The kinds' typed config keys as fields of a config model (`where` they sit: "speculators" at the top level,
    "hf_top" at the top level of an HF config, "dflash_config" inside it), those `declared` has left out. The
    models are built at import: a kind registered later (a plug-in, a test) has its keys carried unchecked by them
    and judged by its own rules."""
    types = key_types()
    chosen = {"speculators": lambda k: k.speculators is not None, "hf_top": lambda k: k.hf_top,
              "dflash_config": lambda k: not k.hf_top or k.hf_nested}[where]
    return {k.name: types[k.typed] for kind in kinds.KINDS.values() for k in kind.keys
            if k.typed and chosen(k) and k.name not in declared.model_fields}


class _SpeculatorsConfig(_Open):
    """SpeculatorsDFlashConfig without its kinds' keys (added below from the registry)."""

    speculators_model_type: Text
    architectures: list[Text] | None = None
    transformer_layer_config: DecoderConfig
    aux_hidden_state_layer_ids: list[int] | None = Field(
        None, description="vLLM capture ids: residual stream entering layer k = z-lab target id + 1"
    )
    mask_token_id: int | None = None
    block_size: int = _size(MIN_BLOCK_SIZE, MAX_BLOCK_SIZE, default=8)
    draft_vocab_size: int | None = _size(1, MAX_VOCAB, default=None)
    target_hidden_size: int | None = _size(1, MAX_HIDDEN, default=None)
    num_target_layers: int | None = _size(1, MAX_LAYERS, default=None)
    sliding_window_non_causal: bool | None = None
    sample_from_anchor: bool | None = Field(None, description="absent: false for dflash/dflash2, true for dspark "
                                            "(speculators' defaults)")
    speculators_config: SpeculatorsBlock | None = None
    speculators_version: Text | None = None
    dtype: Text | None = None
    torch_dtype: Text | None = None

    @property
    def anchor_predicts(self) -> bool:
        """sample_from_anchor as speculators reads it (absent: its class default, true only for dspark)."""
        if self.sample_from_anchor is not None:
            return self.sample_from_anchor
        kind = kinds.get(self.speculators_model_type)
        return kind is not None and kind.anchor_predicts({})

    @property
    def legacy_speculative_tokens(self) -> bool:
        """speculative_tokens = block_size on a dflash draft: what speculators wrote from DFlash's arrival (its
        PR #354, 2026-04-15) until its PR #456 (2026-04-21). Its own model read only block_size then (the
        field was metadata, off by one: the first slot re-predicts the anchor), so block_size is the trained
        block. Only that writer's shape counts: dflash, block_size written, no sample_from_anchor key (that
        key came later, PR #760, with writers that store block_size - 1)."""
        methods = self.speculators_config.proposal_methods if self.speculators_config else []
        kind = kinds.get(self.speculators_model_type)
        return (kind is not None and kind.legacy_block_writer and "sample_from_anchor" not in self.model_fields_set
                and "block_size" in self.model_fields_set and bool(methods)
                and methods[0].speculative_tokens == self.block_size)

    @model_validator(mode="after")
    def _consistent(self):
        vocab = self.transformer_layer_config.vocab_size
        _check_token("mask_token_id", self.mask_token_id, vocab)
        ids = self.aux_hidden_state_layer_ids
        if ids is not None and any(i == 0 for i in ids):
            raise FieldError("aux_hidden_state_layer_ids", f"has {ids}: id 0 is the embedding output, "
                             "not a decoder layer output")
        _check_ids("aux_hidden_state_layer_ids", ids, 1, self.num_target_layers)
        if self.draft_vocab_size is not None and self.draft_vocab_size > vocab:
            raise FieldError("draft_vocab_size", f"{self.draft_vocab_size} exceeds the target vocab_size {vocab}")
        methods = self.speculators_config.proposal_methods if self.speculators_config else []
        absent = "block_size" not in self.model_fields_set
        said = " (absent: speculators' default)" if absent else ""
        if self.anchor_predicts:  # speculators: every slot of the block drafts, the anchor's included
            if methods and methods[0].speculative_tokens != self.block_size:
                raise FieldError("block_size", f"is {self.block_size}{said} but speculators_config.proposal_methods"
                                 f"[0].speculative_tokens is {methods[0].speculative_tokens}; with sample_from_anchor "
                                 "every slot drafts, so they must be equal"
                                 + _supply_block(absent, methods[0].speculative_tokens))
        elif methods and methods[0].speculative_tokens != self.block_size - 1 and not self.legacy_speculative_tokens:
            raise FieldError("block_size", f"is {self.block_size}{said} but speculators_config.proposal_methods[0]"
                             f".speculative_tokens is {methods[0].speculative_tokens}; a block is the anchor plus "
                             "the speculative tokens, so they must satisfy block_size = speculative_tokens + 1"
                             + (" (sample_from_anchor is false: the anchor is the bonus token)"
                                if getattr(kinds.get(self.speculators_model_type), "anchor_may_propose", False)
                                else "") + _supply_block(absent, methods[0].speculative_tokens + 1))
        return self


def _supply_block(absent: bool, block: int) -> str:
    """The fix for a config without block_size whose speculative_tokens says the block: the flag that supplies it."""
    if not absent or not MIN_BLOCK_SIZE <= block <= MAX_BLOCK_SIZE:
        return ""
    return (f": if the draft was trained with blocks of {block}, pass --block-size {block} (or write "
            f"\"block_size\": {block} in config.json)")


SpeculatorsDFlashConfig = create_model(
    "SpeculatorsDFlashConfig", __base__=_SpeculatorsConfig, __module__=__name__,
    __doc__="config.json of a speculators checkpoint (`speculators_model_type: dflash` or `dflash2`).",
    **_kind_fields("speculators", _SpeculatorsConfig))


class _DFlashBlock(_Open):
    mask_token_id: int | None = None
    target_layer_ids: list[int] | None = Field(
        None, description="0-based target layers whose OUTPUT is used (output_hidden_states[id+1])"
    )
    block_size: int | None = _size(MIN_BLOCK_SIZE, MAX_BLOCK_SIZE, default=None)
    causal: bool | None = Field(None, description="vLLM: overrides the causality of every layer")
    verifier: VerifierRef | None = Field(None, description="dflash-convert: the target model, kept for round trips")


# the kinds' keys HF configs keep here (published DSpark drafts may nest theirs: SGLang reads here first, vLLM only
# the top level)
DFlashBlock = create_model("DFlashBlock", __base__=_DFlashBlock, __module__=__name__,
                           **_kind_fields("dflash_config", _DFlashBlock))


class _HFConfig(DecoderConfig):
    """config.json of a Hugging Face / z-lab checkpoint: a flat Qwen3 config of the draft plus DFlash keys."""

    architectures: list[Text]
    block_size: int | None = _size(MIN_BLOCK_SIZE, MAX_BLOCK_SIZE, default=None)
    num_target_layers: int | None = _size(1, MAX_LAYERS, default=None)
    target_hidden_size: int | None = _size(1, MAX_HIDDEN, default=None)
    draft_vocab_size: int | None = _size(1, MAX_VOCAB, default=None)
    is_causal: bool | None = None
    auto_map: dict[str, Text | list[Text]] | None = None  # remote-code class names
    dtype: Text | None = None
    torch_dtype: Text | None = None
    dflash_config: DFlashBlock = Field(default_factory=DFlashBlock)
    dspark_bonus_anchor: bool | None = Field(None, description="vLLM's speculators reader writes it: not "
                                             "sample_from_anchor")

    @model_validator(mode="after")
    def _dflash_consistent(self):
        dc = self.dflash_config
        _check_token("dflash_config.mask_token_id", dc.mask_token_id, self.vocab_size)
        _check_ids("dflash_config.target_layer_ids", dc.target_layer_ids, 0, self.num_target_layers)
        if self.block_size is not None and dc.block_size is not None and self.block_size != dc.block_size:
            raise FieldError("block_size", f"is {self.block_size} but dflash_config.block_size is {dc.block_size}; "
                             "engines read one or the other, so they must agree")
        if self.draft_vocab_size is not None and self.draft_vocab_size > self.vocab_size:
            raise FieldError("draft_vocab_size", f"{self.draft_vocab_size} exceeds the target vocab_size "
                             f"{self.vocab_size}")
        return self


# the kinds' keys an HF config keeps at the top level (DSpark's, where vLLM reads them)
HFDFlashConfig = create_model(
    "HFDFlashConfig", __base__=_HFConfig, __module__=__name__,
    __doc__="config.json of a Hugging Face / z-lab checkpoint: a flat Qwen3 config of the draft plus DFlash keys.",
    **_kind_fields("hf_top", _HFConfig))


class TransformersDFlashConfig(DecoderConfig):
    """config.json of transformers' own DFlash draft (`model_type: muse_glimmer_assistant`,
    MuseGlimmerAssistantConfig): a flat decoder config with the DFlash keys at the top level. The reader fills
    absent keys with that class's defaults before this model checks them (mapping.TRANSFORMERS_DEFAULTS)."""

    model_type: Text
    architectures: list[Text] | None = None
    block_size: int = _size(MIN_BLOCK_SIZE, MAX_BLOCK_SIZE)
    mask_token_id: int
    target_layer_ids: list[int] = Field(description="0-based target layers whose OUTPUT is used (transformers "
                                        "captures output_hidden_states[id + 1])")
    num_target_layers: int | None = _size(1, MAX_LAYERS, default=None)
    verifier: VerifierRef | None = Field(None, description="dflash-convert: the target model, kept for round trips")
    dtype: Text | None = None
    torch_dtype: Text | None = None

    @model_validator(mode="after")
    def _dflash_consistent(self):
        _check_token("mask_token_id", self.mask_token_id, self.vocab_size)
        _check_ids("target_layer_ids", self.target_layer_ids, 0, self.num_target_layers)
        return self


class ConfigChange(_Open):
    """One config key a conversion added, dropped or rewrote (moving between layouts is not a change)."""

    key: str = Field(description="dotted path (the destination's, or the source's for a dropped key)")
    change: Literal["added", "dropped", "rewritten"]
    before: Any = None
    after: Any = None
    why: str = ""


class ConversionRecord(_Open):
    """conversion.json: provenance of a converted checkpoint."""

    tool: str = "dflash-convert"
    tool_version: str
    source: str
    source_format: Literal["speculators", "hf", "transformers"]
    source_revision: str | None = None
    destination_format: Literal["speculators", "hf", "transformers"]
    input_files: dict[str, str] = Field(description="file name -> sha256")
    options: dict[str, Any]
    tensors_kept: list[str]
    tensors_dropped: dict[str, str] = Field(description="tensor name -> reason")
    tensors_renamed: dict[str, str] = Field(default_factory=dict, description="source name -> destination name")
    tensors_added: dict[str, str] = Field(default_factory=dict, description="tensor name -> how it was derived")
    files_carried: list[str] = Field(default_factory=list, description="files beside the weights that engines read "
                                     "(mask_embedding.pt), copied byte for byte without being opened")
    config_changes: list[ConfigChange] = Field(default_factory=list, description="config keys added, dropped "
                                               "or rewritten (keys that only moved between layouts are not listed)")
    warnings: list[str] = Field(default_factory=list)


def _registered(variant: str) -> str:
    if variant not in kinds.KINDS:
        raise ValueError(f"{variant!r} is not a draft kind ({kinds.said()})")
    return variant


# a kind's name: one the registry holds (kinds/); the schemas list the built-in kinds
Variant = Annotated[str, AfterValidator(_registered),
                    WithJsonSchema({"enum": list(kinds.BUILT_IN), "type": "string"})]
Format = Literal["speculators", "hf", "transformers"]


class DraftSpec(BaseModel):
    """A DFlash draft as engines understand it, independent of the file format it came from.

    Conventions: `target_layer_ids` are z-lab ids (0-based layer whose output is used);
    `layer_causal[i]` is the resolved block causality of draft layer i (docs/formats.md section 5).
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
    legacy_speculative_tokens: int | None = Field(None, description="speculative_tokens as a pre-2026-04-21 "
                                                  "speculators config stored it (= block_size, off by one); "
                                                  "None for every other source")

    # Views of the decoder dims: required keys read as stored, the rest through DecoderConfig's defaults.
    def _d(self, key: str):
        return self.decoder.get(key, DecoderConfig.model_fields[key].default)

    hidden_size = property(lambda self: self.decoder["hidden_size"])  # int
    num_layers = property(lambda self: self.decoder["num_hidden_layers"])  # int
    num_heads = property(lambda self: self.decoder["num_attention_heads"])  # int
    intermediate_size = property(lambda self: self.decoder["intermediate_size"])  # int
    vocab_size = property(lambda self: self.decoder["vocab_size"])  # int
    num_kv_heads = property(lambda self: self._d("num_key_value_heads") or self.num_heads)  # int
    head_dim = property(lambda self: self._d("head_dim") or self.hidden_size // self.num_heads)  # int
    rms_norm_eps = property(lambda self: self._d("rms_norm_eps"))  # float
    attention_bias = property(lambda self: bool(self._d("attention_bias")))  # bool
    hidden_act = property(lambda self: self._d("hidden_act"))  # str
    sliding_window = property(lambda self: self._d("sliding_window"))  # int | None

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
    def draft_vocab(self) -> int:
        """Rows of the draft's vocabulary: its own pruned lm_head's, else the target's."""
        return self.draft_vocab_size or self.vocab_size

    @property
    def target_hidden(self) -> int:
        """Width of one target hidden state (the draft's own hidden size unless stated)."""
        return self.target_hidden_size or self.hidden_size

    @property
    def context_width(self) -> int | None:
        """Input width of `fc`: one target hidden state per target layer id."""
        if self.target_layer_ids is None:
            return None
        return len(self.target_layer_ids) * self.target_hidden
