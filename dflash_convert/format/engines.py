"""How each serving engine reads a DFlash config, as data, and what it will apply to a given draft.

`ENGINES` is the one table: one row per engine and version (vLLM reads the two formats through two
different code paths, so it has two rows). Each field holds a rule kind, a member of that field's
enum (a name that is no kind fails when the row is built); `read_config` reads a config with one
reader per kind, the way that engine's own config-reading code does, and `engine_view` compares the
result with the draft's trained semantics (`trained_view`, read from the DraftSpec). Every
difference is a `Divergence` with a one-line consequence and the fix.

The rules were read from the engines' sources (vLLM 0.33.0, SGLang 0.5.23, z-lab/dflash at HEAD);
docs/engines.md says where in those sources each one lives. "Trained" means speculators'
training semantics, which the bundled runtime implements: sliding layers see the context
positions `>= anchor - sliding_window` (the same for every slot of the block).

Bottom layer: imports only format/ modules and errors.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum, auto
from typing import Any, Callable, Iterable, Literal, get_args, get_origin, get_type_hints

from pydantic import BaseModel, Field, computed_field

from dflash_convert.format import catalogue, keys, mapping
from dflash_convert.format.configs import DraftSpec, Format
from dflash_convert.errors import DFlashError, UsageError
from dflash_convert.format.configs import is_hub_id

ENGINE_NAMES: tuple[str, ...] = ("vllm", "sglang", "zlab")
Severity = Literal["error", "warning"]


# ----------------------------------------------------------------------------- rule kinds, one enum per field
# RULE_TEXT says what each kind means.

class RuleKind(str, Enum):
    """A kind of rule: equal to, hashed and printed as its value, the member's name in lower case
    (enum.StrEnum, which does this, needs Python 3.11)."""

    @staticmethod
    def _generate_next_value_(name: str, start: int, count: int, last_values: list) -> str:
        return name.lower()

    def __str__(self) -> str:
        return self.value


class LayerIds(RuleKind):
    AUX_MINUS_ONE = auto()
    DFLASH_CONFIG_OR_TOP = auto()
    EAGLE_AUX_THEN_DFLASH_CONFIG_OR_TOP = auto()


class IdsMissing(RuleKind):
    REFUSE = auto()
    MODEL_DEFAULT = auto()
    DERIVE = auto()


class IdsOrder(RuleKind):
    SORTED_UNIQUE = auto()
    AS_LISTED = auto()


class LastLayer(RuleKind):
    PRE_NORM = auto()
    NOT_CAPTURED = auto()
    POST_NORM = auto()


class Causality(RuleKind):
    SPECULATORS_GLOBAL = auto()
    IS_CAUSAL_THEN_DFLASH_CAUSAL_THEN_SLIDING = auto()
    IS_CAUSAL_THEN_SLIDING = auto()


class LayerTypes(RuleKind):
    EXPLICIT = auto()
    QWEN3 = auto()


class Window(RuleKind):
    RAW = auto()
    SWA_WINDOW_SIZE_OR_QWEN3 = auto()
    QWEN3 = auto()


class WindowSemantics(RuleKind):
    PER_QUERY = auto()
    ANCHOR = auto()


class WindowMissing(RuleKind):
    REFUSE = auto()
    FULL_CONTEXT = auto()


class BlockSize(RuleKind):
    SPECULATIVE_TOKENS = auto()
    SERVING_FLAG = auto()
    DFLASH_CONFIG_OR_TOP_DEFAULT_16 = auto()


class Vocab(RuleKind):
    OWN_LM_HEAD_D2T = auto()
    TARGET_LM_HEAD = auto()


class FcWidth(RuleKind):
    TARGET_HIDDEN_SIZE = auto()
    HIDDEN_SIZE = auto()


class Mixed(RuleKind):
    INEXPRESSIBLE = auto()
    V2_RUNNER = auto()
    SUPPORTED = auto()


class Mask(RuleKind):
    REQUIRED = auto()
    TOKEN_FALLBACK = auto()


class MaskEmbedding(RuleKind):
    USED = auto()
    IGNORED = auto()


class DSpark(RuleKind):
    V2_RUNNER_VANILLA = auto()
    ALL_HEADS_TARGET_LM_HEAD = auto()
    NOT_SERVED = auto()


class Verifier(RuleKind):
    HUB_REPO_ID = auto()
    SERVING_FLAG = auto()
    CALLER = auto()


@dataclass(frozen=True)
class EngineRules:
    """How one engine (at one version, through one code path) reads each field of a draft config.

    Each rule field holds a kind of its field's enum; a kind given by name is converted, and a name
    that is not a kind of that field raises when the row is built (at import for the table)."""

    key: str
    engine: str  # what --engine names
    title: str
    version: str
    reads: Format  # the checkpoint format this path reads
    layer_ids: LayerIds  # where the target layer ids come from
    ids_missing: IdsMissing  # what happens when the config has none
    ids_order: IdsOrder  # order the target features are concatenated in
    last_layer: LastLayer  # what an id naming the target's last layer gets
    causality: Causality  # how per-layer block causality is resolved
    layer_types: LayerTypes  # where the per-layer attention type comes from
    window: Window  # where the sliding window size comes from
    window_semantics: WindowSemantics  # which context positions a sliding layer's query sees
    window_missing: WindowMissing  # what sliding layers get when the config yields no window size
    block_size: BlockSize  # where the block size comes from
    vocab: Vocab  # what a pruned draft vocabulary (own lm_head + d2t) gets
    fc_width: FcWidth  # fc input width the engine builds
    mixed: Mixed  # drafts mixing sliding and full attention layers
    mask: Mask  # mask_token_id
    mask_embedding: MaskEmbedding  # a trained mask embedding shipped as mask_embedding.pt
    verifier: Verifier  # how the target model is found
    dspark: DSpark  # what it serves of a DSpark draft

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_NAMES:
            raise ValueError(f"engine row {self.key!r}: engine {self.engine!r} is not one of {', '.join(ENGINE_NAMES)}")
        for name, kind in RULE_KINDS.items():
            value = getattr(self, name)
            allowed = get_args(kind) if get_origin(kind) is Literal else tuple(kind)
            if value not in allowed:  # a RuleKind equals its name
                raise ValueError(f"engine row {self.key!r}: {name} {value!r} is not a rule kind "
                                 f"({', '.join(allowed)})")
            if get_origin(kind) is not Literal:
                object.__setattr__(self, name, kind(value))


# rule field -> the type of its kinds: its enum, or the Format literal for `reads`
RULE_KINDS: dict[str, Any] = {
    name: kind for name, kind in get_type_hints(EngineRules).items()
    if get_origin(kind) is Literal or (isinstance(kind, type) and issubclass(kind, RuleKind))}

ENGINES: tuple[EngineRules, ...] = (
    EngineRules(
        key="vllm-speculators", engine="vllm", title="vLLM (speculators format)", version="0.33.0",
        reads="speculators", layer_ids=LayerIds.AUX_MINUS_ONE, ids_missing=IdsMissing.REFUSE,
        ids_order=IdsOrder.SORTED_UNIQUE, last_layer=LastLayer.PRE_NORM, causality=Causality.SPECULATORS_GLOBAL,
        layer_types=LayerTypes.EXPLICIT, window=Window.RAW, window_semantics=WindowSemantics.PER_QUERY,
        window_missing=WindowMissing.REFUSE, block_size=BlockSize.SPECULATIVE_TOKENS, vocab=Vocab.OWN_LM_HEAD_D2T,
        fc_width=FcWidth.TARGET_HIDDEN_SIZE, mixed=Mixed.INEXPRESSIBLE, mask=Mask.REQUIRED,
        mask_embedding=MaskEmbedding.USED, verifier=Verifier.HUB_REPO_ID, dspark=DSpark.V2_RUNNER_VANILLA),
    EngineRules(
        key="vllm-hf", engine="vllm", title="vLLM (HF format)", version="0.33.0",
        reads="hf", layer_ids=LayerIds.EAGLE_AUX_THEN_DFLASH_CONFIG_OR_TOP, ids_missing=IdsMissing.MODEL_DEFAULT,
        ids_order=IdsOrder.SORTED_UNIQUE, last_layer=LastLayer.PRE_NORM,
        causality=Causality.IS_CAUSAL_THEN_DFLASH_CAUSAL_THEN_SLIDING, layer_types=LayerTypes.QWEN3,
        window=Window.SWA_WINDOW_SIZE_OR_QWEN3, window_semantics=WindowSemantics.PER_QUERY,
        window_missing=WindowMissing.REFUSE, block_size=BlockSize.SERVING_FLAG, vocab=Vocab.OWN_LM_HEAD_D2T,
        fc_width=FcWidth.TARGET_HIDDEN_SIZE, mixed=Mixed.V2_RUNNER, mask=Mask.REQUIRED,
        mask_embedding=MaskEmbedding.USED, verifier=Verifier.SERVING_FLAG, dspark=DSpark.V2_RUNNER_VANILLA),
    EngineRules(
        key="sglang", engine="sglang", title="SGLang", version="0.5.23",
        reads="hf", layer_ids=LayerIds.DFLASH_CONFIG_OR_TOP, ids_missing=IdsMissing.DERIVE,
        ids_order=IdsOrder.SORTED_UNIQUE, last_layer=LastLayer.NOT_CAPTURED, causality=Causality.IS_CAUSAL_THEN_SLIDING,
        layer_types=LayerTypes.QWEN3, window=Window.QWEN3, window_semantics=WindowSemantics.PER_QUERY,
        window_missing=WindowMissing.REFUSE, block_size=BlockSize.DFLASH_CONFIG_OR_TOP_DEFAULT_16,
        vocab=Vocab.TARGET_LM_HEAD, fc_width=FcWidth.HIDDEN_SIZE, mixed=Mixed.SUPPORTED, mask=Mask.TOKEN_FALLBACK,
        mask_embedding=MaskEmbedding.USED, verifier=Verifier.SERVING_FLAG, dspark=DSpark.ALL_HEADS_TARGET_LM_HEAD),
    EngineRules(
        key="zlab", engine="zlab", title="z-lab dflash (transformers)", version="HEAD",
        reads="hf", layer_ids=LayerIds.DFLASH_CONFIG_OR_TOP, ids_missing=IdsMissing.REFUSE,
        ids_order=IdsOrder.AS_LISTED, last_layer=LastLayer.POST_NORM, causality=Causality.IS_CAUSAL_THEN_SLIDING,
        layer_types=LayerTypes.QWEN3, window=Window.QWEN3, window_semantics=WindowSemantics.PER_QUERY,
        window_missing=WindowMissing.FULL_CONTEXT, block_size=BlockSize.DFLASH_CONFIG_OR_TOP_DEFAULT_16,
        vocab=Vocab.TARGET_LM_HEAD, fc_width=FcWidth.HIDDEN_SIZE, mixed=Mixed.SUPPORTED, mask=Mask.REQUIRED,
        mask_embedding=MaskEmbedding.IGNORED, verifier=Verifier.CALLER, dspark=DSpark.NOT_SERVED),
)
ENGINES_BY_KEY = {e.key: e for e in ENGINES}

# What each rule kind means, in one short cell (README table) -- the interpreter below acts on the kinds.
RULE_TEXT: dict[str, dict[str, str]] = {  # keys: each field's kinds
    "reads": {"speculators": "speculators", "hf": "HF / z-lab"},
    "layer_ids": {
        LayerIds.AUX_MINUS_ONE: "`aux_hidden_state_layer_ids` - 1",
        LayerIds.DFLASH_CONFIG_OR_TOP: "`dflash_config.target_layer_ids`, else top-level `target_layer_ids`",
        LayerIds.EAGLE_AUX_THEN_DFLASH_CONFIG_OR_TOP: "`eagle_aux_hidden_state_layer_ids` - 1 if present, else "
                                                      "`dflash_config.target_layer_ids`, else top-level "
                                                      "`target_layer_ids`",
    },
    "ids_missing": {
        IdsMissing.REFUSE: "refuses to load",
        IdsMissing.MODEL_DEFAULT: "the target model's default EAGLE-3 layers (not the trained ones)",
        IdsMissing.DERIVE: "derived from the layer counts (`build_target_layer_ids`), a guess",
    },
    "ids_order": {
        IdsOrder.SORTED_UNIQUE: "target layer order (sorted, duplicates dropped)",
        IdsOrder.AS_LISTED: "as listed",
    },
    "last_layer": {
        LastLayer.PRE_NORM: "its raw output (before the final norm), as trained",
        LastLayer.NOT_CAPTURED: "never captured: the feature width no longer matches `fc` (fails at the first step)",
        LastLayer.POST_NORM: "`output_hidden_states[-1]`, which is AFTER the final norm",
    },
    "causality": {
        Causality.SPECULATORS_GLOBAL: "every layer causal unless `sliding_window_non_causal` (one flag for ALL layers, "
                                      "full ones included)",
        Causality.IS_CAUSAL_THEN_DFLASH_CAUSAL_THEN_SLIDING: "`is_causal`, else `dflash_config.causal`, else sliding "
                                                             "layers causal and full ones not",
        Causality.IS_CAUSAL_THEN_SLIDING: "top-level `is_causal` only (never `dflash_config.causal`), else sliding "
                                          "layers causal and full ones not",
    },
    "layer_types": {
        LayerTypes.EXPLICIT: "`transformer_layer_config.layer_types` as written (absent: every layer full)",
        LayerTypes.QWEN3: "`layer_types`, else transformers' Qwen3 rule (`use_sliding_window`, `max_window_layers`)",
    },
    "window": {
        Window.RAW: "`transformer_layer_config.sliding_window`",
        Window.SWA_WINDOW_SIZE_OR_QWEN3: "`dflash_config.swa_window_size`, else `sliding_window` (null unless "
                                         "`use_sliding_window` is true: the load fails)",
        Window.QWEN3: "`sliding_window`, null unless `use_sliding_window` is true",
    },
    "window_semantics": {
        WindowSemantics.PER_QUERY: "W keys ending at each query (slot j sees j+1 fewer context positions than trained)",
        WindowSemantics.ANCHOR: "context positions >= anchor - W, for every slot of the block",
    },
    "window_missing": {
        WindowMissing.REFUSE: "the load fails",
        WindowMissing.FULL_CONTEXT: "they attend the whole context",
    },
    "block_size": {
        BlockSize.SPECULATIVE_TOKENS: "`proposal_methods[0].speculative_tokens` + 1 (`vllm serve DRAFT`), or "
                                      "`num_speculative_tokens` + 1 from `--speculative-config`",
        BlockSize.SERVING_FLAG: "`num_speculative_tokens` + 1 from `--speculative-config` (the config's "
                                "`block_size` is not read)",
        BlockSize.DFLASH_CONFIG_OR_TOP_DEFAULT_16: "`dflash_config.block_size`, else `block_size`, else 16",
    },
    "vocab": {
        Vocab.OWN_LM_HEAD_D2T: "own `lm_head` + `d2t` used (without `d2t` the map stays all zeros)",
        Vocab.TARGET_LM_HEAD: "ignored: logits always come from the target's lm_head",
    },
    "fc_width": {
        FcWidth.TARGET_HIDDEN_SIZE: "(`target_hidden_size` or `hidden_size`) x number of ids",
        FcWidth.HIDDEN_SIZE: "`hidden_size` x number of ids (`target_hidden_size` ignored)",
    },
    "mixed": {
        Mixed.INEXPRESSIBLE: "served, but every layer gets the one causality flag",
        Mixed.V2_RUNNER: "only with the V2 model runner (V1 refuses)",
        Mixed.SUPPORTED: "served per layer",
    },
    "mask": {
        Mask.REQUIRED: "`mask_token_id` (required)",
        Mask.TOKEN_FALLBACK: "`mask_token_id`, else the tokenizer's `<\\|MASK\\|>` token",
    },
    "mask_embedding": {
        MaskEmbedding.USED: "a `mask_embedding.pt` beside the weights replaces the mask token's embedding",
        MaskEmbedding.IGNORED: "`mask_embedding.pt` ignored: the mask slots get the target's embedding of "
                               "`mask_token_id`",
    },
    "dspark": {
        DSpark.V2_RUNNER_VANILLA: "V2 model runner only (V1: 'Model Runner V1 does not support: dspark speculative "
                                  "decoding'); vanilla Markov head only; DSpark keys read at the top level",
        DSpark.ALL_HEADS_TARGET_LM_HEAD: "vanilla, gated and rnn Markov heads; the target's lm_head; the confidence "
                                         "head built whatever `enable_confidence_head` says",
        DSpark.NOT_SERVED: "not served",
    },
    "verifier": {
        Verifier.HUB_REPO_ID: "`speculators_config.verifier.name_or_path`; `vllm serve DRAFT` refuses a local path",
        Verifier.SERVING_FLAG: "the serving command's target model",
        Verifier.CALLER: "whatever target the caller passes",
    },
}
FIELD_TITLES = {
    "reads": "format read", "layer_ids": "target layer ids", "ids_missing": "no ids in the config",
    "ids_order": "feature order", "last_layer": "id of the target's last layer", "causality": "block causality",
    "layer_types": "layer types", "window": "sliding window size", "window_semantics": "sliding window semantics",
    "window_missing": "sliding layers without a window size",
    "block_size": "block size", "vocab": "pruned vocab", "fc_width": "fc input width",
    "mixed": "mixed sliding + full layers", "mask": "mask token", "mask_embedding": "trained mask embedding",
    "verifier": "target model", "dspark": "DSpark drafts",
}
MASK_EMBEDDING_FILE = catalogue.MASK_EMBEDDING_FILE  # vLLM and SGLang read it from the draft's directory
TRAINED_WINDOW = WindowSemantics.ANCHOR  # what speculators trains and the runtime implements

# Config keys at least one engine reads (paths in either layout). Anything else in a config changes
# nothing an engine does: `diff` reports such keys as informational only.
TOP_LEVEL_READ = frozenset({
    "architectures", "block_size", "is_causal", "target_hidden_size", "draft_vocab_size", "num_target_layers",
    "target_layer_ids", "mask_token_id", "mask_token", "aux_hidden_state_layer_ids", "sliding_window_non_causal",
    "sample_from_anchor", "speculators_model_type", "dtype", "torch_dtype", "eagle_aux_hidden_state_layer_ids",
    *mapping.DFLASH2_FIELDS, *(k.name for k in keys.CONFIG_KEYS if k.hf_top), "dspark_bonus_anchor",
})
DECODER_READ = frozenset({
    "model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "vocab_size", "rms_norm_eps", "hidden_act", "attention_bias",
    "max_position_embeddings", "rope_parameters", "rope_theta", "rope_scaling", "partial_rotary_factor",
    "layer_types", "sliding_window", "use_sliding_window", "max_window_layers", "logit_scale", "is_neox_style",
    *mapping.NEUTRAL_DECODER_KEYS,
})
DFLASH_CONFIG_READ = frozenset({
    "target_layer_ids", "mask_token_id", "mask_token", "block_size", "causal", "use_swa", "swa_window_size",
    "num_target_layers", "sample_from_anchor", "attention_value_scale", "attention_sink_bias",
    *keys.BY_NAME, *mapping.NEUTRAL_DECODER_KEYS,
})
SPECULATORS_CONFIG_READ = ("speculators_config.proposal_methods", "speculators_config.verifier.name_or_path")


def engine_reads(path: str) -> bool:
    """Whether any engine in the table reads the config key at this dotted path (either layout)."""
    head, _, rest = path.partition(".")
    if head == "transformer_layer_config":
        return rest.partition(".")[0] in DECODER_READ
    if head == "dflash_config":
        return rest.partition(".")[0] in DFLASH_CONFIG_READ
    if head == "speculators_config":
        return path.startswith(SPECULATORS_CONFIG_READ)
    return head in TOP_LEVEL_READ or head in DECODER_READ


# ----------------------------------------------------------------------------- report models

class Divergence(BaseModel):
    """One way an engine would run the draft differently from how it was trained."""

    field: str
    severity: Severity = Field(description="error: served differently at every step or not at all; "
                                           "warning: differs only in some deployments or past some context length")
    trained: Any = None
    applied: Any = None
    consequence: str
    fix: str


class EngineView(BaseModel):
    """What one engine applies to a draft, read from a config the way that engine reads it."""

    engine: str = Field(description="row of the engine table, e.g. vllm-hf")
    title: str
    version: str
    reads: Format
    via_conversion: bool = Field(False, description="the checkpoint is in the other format: this is what the "
                                                    "engine reads from the config `convert` writes")
    loads: bool = Field(True, description="false when the engine refuses this config or checkpoint")
    target_layer_ids: list[int] | None = Field(None, description="target layers, in the order their features "
                                                                 "are concatenated")
    target_layer_ids_source: str = ""
    layer_types: list[str] | None = None
    layer_causal: list[bool] | None = None
    causal_source: str = ""
    sliding_window: int | None = None
    window_semantics: str | None = None
    block_size: int | None = None
    block_size_source: str = ""
    vocab: str = ""
    fc_input_width: int | None = None
    divergences: list[Divergence] = Field(default_factory=list)

    @computed_field(description="loads, and no error divergence: served as trained")
    @property
    def as_trained(self) -> bool:
        return self.loads and not any(d.severity == "error" for d in self.divergences)


# ----------------------------------------------------------------------------- trained semantics

def trained_view(spec: DraftSpec) -> dict[str, Any]:
    """The config values an engine acts on, normalised across formats (what `diff` compares)."""
    any_sliding = "sliding_attention" in spec.layer_types
    return {
        "variant": spec.variant,
        "block_size": spec.block_size,
        "mask_token_id": spec.mask_token_id,
        "target_layer_ids": spec.target_layer_ids,
        "layer_types": spec.layer_types,
        "layer_causal": spec.layer_causal,
        "sliding_window": spec.sliding_window if any_sliding else None,
        "draft_vocab_size": spec.draft_vocab,
        "vocab_size": spec.vocab_size,
        "target_hidden_size": spec.target_hidden,
        "hidden_size": spec.hidden_size,
        "intermediate_size": spec.intermediate_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "rms_norm_eps": spec.rms_norm_eps,
        "rope_theta": spec.rope_theta,
        "rope_scaling": spec.rope_scaling,
        "attention_bias": spec.attention_bias,
        "hidden_act": spec.hidden_act,
        "num_target_layers": spec.num_target_layers,
        "verifier": spec.verifier.name_or_path if spec.verifier else None,
        **keys.effective(spec.variant, spec.variant_fields),
    }


# ----------------------------------------------------------------------------- reading a config as an engine does
# One reader per rule kind; `read_config` picks each field's reader by the row's kind. The readers see the
# config as the engine's path does: `raw` the whole config, `flat` its decoder fields, `dc` its
# dflash_config (empty for the speculators reader, which never looks there), `n` its number of layers.

@dataclass(frozen=True)
class ConfigReading:
    """The values one engine takes from a config in its own format (no comparison yet)."""

    ids: list[int] | None  # target layer ids as the config lists them (None: none found)
    ids_source: str
    layer_types: list[str]
    window: int | None
    causal: list[bool]
    causal_source: str
    block: int | None  # None: the serving command sets it, or the config lacks it
    block_source: str
    pruned: bool  # a draft vocabulary smaller than the target's
    fc_width: int | None
    mask: int | None
    verifier: str | None  # the target repo id, for the engines that take it from the config


def _ids_aux_minus_one(raw: dict, dc: dict) -> tuple[list[int] | None, str]:
    aux = raw.get("aux_hidden_state_layer_ids")
    return (None if aux is None else mapping.target_ids_from_aux(aux)), "aux_hidden_state_layer_ids - 1"


def _ids_dflash_config_or_top(raw: dict, dc: dict) -> tuple[list[int] | None, str]:
    source = "dflash_config.target_layer_ids" if "target_layer_ids" in dc else "target_layer_ids"
    return dc.get("target_layer_ids", raw.get("target_layer_ids")), source


def _ids_eagle_aux_then_dflash_config_or_top(raw: dict, dc: dict) -> tuple[list[int] | None, str]:
    eagle_aux = raw.get("eagle_aux_hidden_state_layer_ids")
    if eagle_aux:
        return mapping.target_ids_from_aux(eagle_aux), "eagle_aux_hidden_state_layer_ids - 1"
    return _ids_dflash_config_or_top(raw, dc)


def _window_swa_window_size_or_qwen3(flat: dict, dc: dict, types: list[str], n: int) -> tuple[list[str], int | None]:
    """vLLM's HF reader: `dflash_config.use_swa` makes every layer sliding when none is."""
    if dc.get("use_swa") and "sliding_attention" not in types:
        types = ["sliding_attention"] * n
    return types, dc.get("swa_window_size", mapping.qwen3_window(flat))


def _causal_speculators_global(raw: dict, dc: dict, types: list[str], n: int) -> tuple[list[bool], str]:
    flag = raw.get("sliding_window_non_causal", True)
    return [not flag] * n, f"sliding_window_non_causal={raw.get('sliding_window_non_causal')!r}, all layers"


def _causal_hf(raw: dict, types: list[str], dc_causal: bool | None) -> tuple[list[bool], str]:
    is_causal = raw.get("is_causal")
    source = ("is_causal" if is_causal is not None else "dflash_config.causal" if dc_causal is not None
              else "layer_types (sliding layers causal)")
    return mapping.hf_layer_causal(types, is_causal, dc_causal), source


def _block_speculative_tokens(raw: dict, dc: dict) -> tuple[int | None, str]:
    try:
        tokens = raw["speculators_config"]["proposal_methods"][0]["speculative_tokens"]
        if raw.get("speculators_model_type") == "dspark" and raw.get("sample_from_anchor") is True:
            return int(tokens), "speculative_tokens (the anchor slot drafts too)"
        return int(tokens) + 1, "speculative_tokens + 1"
    except (KeyError, IndexError, TypeError, ValueError):
        return None, "missing speculators_config.proposal_methods[0]"


def _block_dflash_config_or_top(raw: dict, dc: dict) -> tuple[int | None, str]:
    b = dc.get("block_size", raw.get("block_size"))
    source = ("dflash_config.block_size" if "block_size" in dc else
              "block_size" if raw.get("block_size") is not None else "default 16")
    return 16 if b is None else int(b), source


READ_IDS: dict[LayerIds, Callable[[dict, dict], tuple[list[int] | None, str]]] = {
    LayerIds.AUX_MINUS_ONE: _ids_aux_minus_one,
    LayerIds.DFLASH_CONFIG_OR_TOP: _ids_dflash_config_or_top,
    LayerIds.EAGLE_AUX_THEN_DFLASH_CONFIG_OR_TOP: _ids_eagle_aux_then_dflash_config_or_top,
}
ORDER_IDS: dict[IdsOrder, Callable[[list[int]], list[int]]] = {
    IdsOrder.SORTED_UNIQUE: lambda ids: sorted(set(ids)),
    IdsOrder.AS_LISTED: list,
}
READ_LAYER_TYPES: dict[LayerTypes, Callable[[dict, int], list[str]]] = {
    LayerTypes.EXPLICIT: lambda flat, n: list(flat.get("layer_types") or ["full_attention"] * n),
    LayerTypes.QWEN3: lambda flat, n: mapping.resolve_layer_types(flat),  # transformers' Qwen3Config default
}
READ_WINDOW: dict[Window, Callable[[dict, dict, list[str], int], tuple[list[str], int | None]]] = {
    Window.RAW: lambda flat, dc, types, n: (types, flat.get("sliding_window")),
    Window.QWEN3: lambda flat, dc, types, n: (types, mapping.qwen3_window(flat)),
    Window.SWA_WINDOW_SIZE_OR_QWEN3: _window_swa_window_size_or_qwen3,
}
READ_CAUSALITY: dict[Causality, Callable[[dict, dict, list[str], int], tuple[list[bool], str]]] = {
    Causality.SPECULATORS_GLOBAL: _causal_speculators_global,
    Causality.IS_CAUSAL_THEN_DFLASH_CAUSAL_THEN_SLIDING: lambda raw, dc, types, n: _causal_hf(raw, types,
                                                                                               dc.get("causal")),
    Causality.IS_CAUSAL_THEN_SLIDING: lambda raw, dc, types, n: _causal_hf(raw, types, None),
}
READ_BLOCK_SIZE: dict[BlockSize, Callable[[dict, dict], tuple[int | None, str]]] = {
    BlockSize.SPECULATIVE_TOKENS: _block_speculative_tokens,
    BlockSize.SERVING_FLAG: lambda raw, dc: (None, "--speculative-config num_speculative_tokens + 1"),
    BlockSize.DFLASH_CONFIG_OR_TOP_DEFAULT_16: _block_dflash_config_or_top,
}
FC_FEATURE_WIDTH: dict[FcWidth, Callable[[dict, dict], Any]] = {  # the width of one target layer's features
    FcWidth.TARGET_HIDDEN_SIZE: lambda raw, flat: raw.get("target_hidden_size") or flat.get("hidden_size"),
    FcWidth.HIDDEN_SIZE: lambda raw, flat: flat.get("hidden_size"),
}
READ_VERIFIER: dict[Verifier, Callable[[dict], str | None]] = {
    Verifier.HUB_REPO_ID: lambda raw: ((raw.get("speculators_config") or {}).get("verifier") or {}).get("name_or_path"),
    Verifier.SERVING_FLAG: lambda raw: None,
    Verifier.CALLER: lambda raw: None,
}
READERS: dict[str, dict] = {"layer_ids": READ_IDS, "ids_order": ORDER_IDS, "layer_types": READ_LAYER_TYPES,
                            "window": READ_WINDOW, "causality": READ_CAUSALITY, "block_size": READ_BLOCK_SIZE,
                            "fc_width": FC_FEATURE_WIDTH, "verifier": READ_VERIFIER}


def _check_tables(rule_text: dict[str, dict[str, str]] = RULE_TEXT) -> None:
    """Each rule field has its title, each of its kinds a README text and, for the fields read from a
    config, a reader: a kind added to an enum without them fails at import, not in a user's run."""
    if set(FIELD_TITLES) != set(RULE_KINDS):
        raise ValueError(f"FIELD_TITLES and the rule fields differ: {sorted(set(FIELD_TITLES) ^ set(RULE_KINDS))}")
    for name, kind in RULE_KINDS.items():
        kinds = set(get_args(kind)) if get_origin(kind) is Literal else set(kind)
        for table, what in ((rule_text, "RULE_TEXT"), (READERS, "the readers")):
            if name in table and set(table[name]) != kinds or table is rule_text and name not in table:
                raise ValueError(f"{what}[{name!r}] and the kinds of {name} differ: "
                                 f"{sorted(str(k) for k in set(table.get(name, ())) ^ kinds)}")


_check_tables()


def read_config(rules: EngineRules, raw: dict[str, Any]) -> ConfigReading:
    """The values `rules`' engine takes from a config in its own format."""
    if rules.reads == "speculators":
        flat, dc = dict(raw.get("transformer_layer_config") or {}), {}
    else:
        flat, dc = raw, raw.get("dflash_config") or {}
    n = int(flat.get("num_hidden_layers") or 0)
    ids, ids_source = READ_IDS[rules.layer_ids](raw, dc)
    ids = None if ids is None else [int(i) for i in ids]
    types, window = READ_WINDOW[rules.window](flat, dc, READ_LAYER_TYPES[rules.layer_types](flat, n), n)
    causal, causal_source = READ_CAUSALITY[rules.causality](raw, dc, types, n)
    block, block_source = READ_BLOCK_SIZE[rules.block_size](raw, dc)
    vocab, draft_vocab = flat.get("vocab_size"), raw.get("draft_vocab_size")
    width = FC_FEATURE_WIDTH[rules.fc_width](raw, flat)
    return ConfigReading(
        ids=ids, ids_source=ids_source, layer_types=types, window=window, causal=causal, causal_source=causal_source,
        block=block, block_source=block_source,
        pruned=draft_vocab is not None and vocab is not None and draft_vocab != vocab,
        fc_width=None if ids is None or width is None else len(ORDER_IDS[rules.ids_order](ids)) * width,
        mask=dc.get("mask_token_id", raw.get("mask_token_id")), verifier=READ_VERIFIER[rules.verifier](raw))


def _fix_format(rules: EngineRules) -> str:
    return "convert --to hf" if rules.reads == "hf" else "convert --to speculators"


def engine_view(rules: EngineRules, spec: DraftSpec, raw: dict[str, Any] | None = None, *,
                tensors: Iterable[str] = (), fc_shape: tuple[int, ...] | None = None,
                num_target_layers: int | None = None, files: Iterable[str] = ()) -> EngineView:
    """What `rules`' engine applies to this draft, and every divergence from its trained semantics.

    `raw` is the checkpoint's config.json; when it is absent or in the other format, the view is of
    the config our converter writes for that engine's format (`via_conversion`). `num_target_layers`
    (from the target's config) overrides the draft's record of it.
    """
    view = EngineView(engine=rules.key, title=rules.title, version=rules.version, reads=rules.reads)
    div = view.divergences
    if raw is None or spec.source_format != rules.reads:
        view.via_conversion = True
        try:
            raw, _ = mapping.spec_to_config(spec, rules.reads)
        except DFlashError as exc:
            view.loads = False
            div.append(Divergence(field="format", severity="error", trained=spec.source_format, applied=rules.reads,
                                  consequence=f"{rules.title} reads only the {rules.reads} format, and this draft "
                                              f"cannot be written in it: {exc}",
                                  fix="serve it with an engine that reads the other format"))
            return view
    r = read_config(rules, raw)
    _view_target_layer_ids(view, rules, spec, r, num_target_layers)
    _view_fc_width(view, rules, spec, r, fc_shape)
    _view_attention(view, rules, spec, r)
    _view_block_size(view, rules, spec, r)
    _view_vocab(view, rules, spec, r, set(tensors))
    _view_mask_token(view, rules, spec, r)
    _view_mask_embedding(view, rules, spec, r, set(files))
    _view_verifier(view, rules, spec, r)
    if spec.variant == "dspark":
        _view_dspark(view, rules, spec, raw)
    if view.via_conversion:
        div.insert(0, Divergence(field="format", severity="warning", trained=spec.source_format, applied=rules.reads,
                                 consequence=f"{rules.title} reads only the {rules.reads} format; shown: what it "
                                             f"reads from the output of `{_fix_format(rules)}`",
                                 fix=_fix_format(rules)))
    return view


def _view_target_layer_ids(view: EngineView, rules: EngineRules, spec: DraftSpec, r: ConfigReading,
                           num_target_layers: int | None) -> None:
    """The target layer ids and their feature order; an id naming the target's last layer."""
    div = view.divergences
    ids = r.ids
    view.target_layer_ids_source = r.ids_source
    if ids is None:
        how = RULE_TEXT["ids_missing"][rules.ids_missing]
        view.loads = rules.ids_missing != IdsMissing.REFUSE
        div.append(Divergence(field="target_layer_ids", severity="error", trained=spec.target_layer_ids, applied=None,
                              consequence=f"no target layer ids in the config: {how}",
                              fix="write them: convert --target-layer-ids (or --derive-target-layer-ids)"))
    else:
        applied = ORDER_IDS[rules.ids_order](ids)
        view.target_layer_ids = applied
        if spec.target_layer_ids is not None and applied != list(spec.target_layer_ids):
            div.append(Divergence(field="target_layer_ids", severity="error", trained=spec.target_layer_ids,
                                  applied=applied,
                                  consequence="target features reach fc in another order (or fewer of them) than "
                                              "in training: the draft's context is scrambled",
                                  fix="re-train with sorted unique ids, or permute fc.weight's input blocks to "
                                      "sorted order"))
        last = num_target_layers or spec.num_target_layers
        if last is not None and (last - 1) in ids and rules.last_layer != LastLayer.PRE_NORM:
            view.loads = view.loads and rules.last_layer != LastLayer.NOT_CAPTURED
            div.append(Divergence(field="target_layer_ids", severity="error", trained=f"output of layer {last - 1}",
                                  applied=rules.last_layer.value,
                                  consequence=f"id {last - 1} is the target's last layer: "
                                              + RULE_TEXT["last_layer"][rules.last_layer],
                                  fix="serve it with vLLM, which captures the last layer's raw output"))


def _view_fc_width(view: EngineView, rules: EngineRules, spec: DraftSpec, r: ConfigReading,
                   fc_shape: tuple[int, ...] | None) -> None:
    """The fc input width the engine builds against the checkpoint's fc.weight."""
    div = view.divergences
    if fc_shape is not None and r.fc_width is not None and len(fc_shape) == 2 and fc_shape[1] != r.fc_width:
        view.loads = False
        div.append(Divergence(field="fc_width", severity="error", trained=fc_shape[1], applied=r.fc_width,
                              consequence=f"{rules.title} builds fc with input width "
                                          f"{RULE_TEXT['fc_width'][rules.fc_width]} = {r.fc_width}, the checkpoint's "
                                          f"fc.weight has {fc_shape[1]}: the load fails",
                              fix="serve it with vLLM (reads target_hidden_size)"
                              if rules.fc_width == FcWidth.HIDDEN_SIZE else "fix target_hidden_size / the layer ids"))
    view.fc_input_width = r.fc_width


def _view_attention(view: EngineView, rules: EngineRules, spec: DraftSpec, r: ConfigReading) -> None:
    """Per-layer attention type, sliding window (size and semantics) and block causality."""
    div = view.divergences
    n = spec.num_layers
    types, window, causal = r.layer_types, r.window, r.causal
    view.layer_types, view.layer_causal, view.causal_source = types, causal, r.causal_source
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if sliding:
        view.sliding_window = window
        view.window_semantics = rules.window_semantics.value
    if types != list(spec.layer_types):
        div.append(Divergence(field="layer_types", severity="error", trained=spec.layer_types, applied=types,
                              consequence="layers attend with another attention type (sliding vs full) than trained",
                              fix="write layer_types explicitly (convert writes them)"))
    if sliding and window is None:
        view.loads = view.loads and rules.window_missing != WindowMissing.REFUSE
        div.append(Divergence(field="sliding_window", severity="error", trained=spec.sliding_window, applied=None,
                              consequence="sliding layers have no window size: "
                                          + RULE_TEXT["window_missing"][rules.window_missing],
                              fix="set use_sliding_window: true with sliding_window (convert writes both)"))
    elif sliding and spec.sliding_window is not None and window != spec.sliding_window:
        div.append(Divergence(field="sliding_window", severity="error", trained=spec.sliding_window, applied=window,
                              consequence="sliding layers use another window size than trained",
                              fix="write the trained sliding_window"))
    elif sliding and rules.window_semantics != TRAINED_WINDOW:
        div.append(Divergence(field="sliding_window", severity="warning", trained="anchor-relative",
                              applied="per-query",
                              consequence=f"once the context exceeds {window} - block size tokens, block slot j sees "
                                          "j+1 fewer context positions than in training (acceptance may drop on "
                                          "long contexts)",
                              fix="none in the config: measure it with validate --engine on long prompts"))
    if len(causal) == n and causal != list(spec.layer_causal):
        wrong = [i for i in range(n) if causal[i] != spec.layer_causal[i]]
        mode = lambda c: "causal" if c else "non-causal"  # noqa: E731
        if rules.causality == Causality.SPECULATORS_GLOBAL and len(set(spec.layer_causal)) > 1:
            fix = "vLLM's speculators reader has one flag for all layers: serve the HF format (convert --to hf)"
        elif rules.causality == Causality.SPECULATORS_GLOBAL:
            fix = (f"set sliding_window_non_causal: {str(not spec.layer_causal[0]).lower()} (convert writes it)")
        elif len(set(spec.layer_causal)) == 1:
            fix = f"set top-level is_causal: {str(spec.layer_causal[0]).lower()} (convert writes it)"
        else:
            fix = "drop is_causal / dflash_config.causal so the per-layer default applies (convert does)"
        div.append(Divergence(field="layer_causal", severity="error", trained=spec.layer_causal, applied=causal,
                              consequence="layers " + ", ".join(f"{i} ({mode(spec.layer_causal[i])} -> "
                                                                 f"{mode(causal[i])})" for i in wrong)
                              + " attend the block unlike in training: acceptance collapses",
                              fix=fix))
    if sliding and len(sliding) < len(types) and rules.mixed == Mixed.V2_RUNNER:
        div.append(Divergence(field="layer_types", severity="warning", trained="mixed sliding + full",
                              applied="V2 model runner only",
                              consequence="vLLM's V1 model runner refuses drafts mixing sliding and full layers",
                              fix="run vLLM with VLLM_USE_V2_MODEL_RUNNER=1 (the default where Triton is present)"))
    if spec.variant == "dflash2" and rules.engine == "vllm":
        div.append(Divergence(field="architectures", severity="warning", trained="DFlash2 candidate head",
                              applied="V2 model runner only",
                              consequence="vLLM's V1 model runner (the only one without Triton, so the CPU build's) "
                                          "refuses it: 'Model Runner V1 does not support: DFlash candidate-head "
                                          "drafts'",
                              fix="serve it where the V2 model runner runs (a GPU build: VLLM_USE_V2_MODEL_RUNNER=1)"))


def _view_block_size(view: EngineView, rules: EngineRules, spec: DraftSpec, r: ConfigReading) -> None:
    """The block size and where it comes from."""
    div = view.divergences
    view.block_size, view.block_size_source = r.block, r.block_source
    if r.block is None and rules.block_size == BlockSize.SERVING_FLAG and spec.variant == "dspark":
        # vLLM's DSpark takes num_speculative_tokens from the top-level block_size when the flag is absent
        view.block_size, view.block_size_source = spec.block_size, "block_size (num_speculative_tokens default)"
    elif r.block is None and rules.block_size == BlockSize.SERVING_FLAG:
        div.append(Divergence(field="block_size", severity="warning", trained=spec.block_size, applied=None,
                              consequence="the block size is whatever the serving command asks for",
                              fix=f"serve with num_speculative_tokens={spec.block_size - 1 if spec.block_size else '?'}"
                                  " in --speculative-config"))
    elif r.block != spec.block_size:
        div.append(Divergence(field="block_size", severity="error", trained=spec.block_size, applied=r.block,
                              consequence=f"drafts blocks of {r.block} ({r.block_source}) instead of "
                                          f"{spec.block_size}",
                              fix="write block_size (convert writes it in every place engines read)"))


def _view_vocab(view: EngineView, rules: EngineRules, spec: DraftSpec, r: ConfigReading, names: set[str]) -> None:
    """What a pruned vocabulary (own lm_head + d2t) gets."""
    div = view.divergences
    if r.pruned:
        if rules.vocab == Vocab.TARGET_LM_HEAD:
            view.vocab = "target lm_head (the draft's own lm_head and d2t are ignored)"
            div.append(Divergence(field="vocab", severity="error", trained=f"own lm_head [{spec.draft_vocab_size}] "
                                  "+ d2t", applied="target lm_head",
                                  consequence="the pruned draft's own lm_head and d2t are ignored; its hidden states "
                                              "go through the target's lm_head, which it was not trained for",
                                  fix="serve it with vLLM (either format)"))
        elif names and catalogue.name("d2t") not in names:
            view.vocab = "own lm_head, vocab map all zeros (no d2t)"
            div.append(Divergence(field="vocab", severity="error", trained="own lm_head + d2t",
                                  applied="own lm_head + zero map",
                                  consequence="without d2t every draft id maps to target id = draft id: "
                                              "proposals are wrong tokens",
                                  fix="ship d2t with the pruned lm_head"))
        else:
            view.vocab = "own lm_head + d2t"
    else:
        view.vocab = "target lm_head"


def _view_mask_token(view: EngineView, rules: EngineRules, spec: DraftSpec, r: ConfigReading) -> None:
    """The mask token id."""
    div = view.divergences
    if r.mask is None:
        fallback = rules.mask == Mask.TOKEN_FALLBACK
        view.loads = view.loads and fallback
        div.append(Divergence(field="mask_token_id", severity="error", trained=spec.mask_token_id, applied=None,
                              consequence="no mask_token_id: " + ("falls back to the tokenizer's <|MASK|> token"
                                                                  if fallback else "the engine cannot fill the block"),
                              fix="convert --mask-token-id ID"))


def _view_mask_embedding(view: EngineView, rules: EngineRules, spec: DraftSpec, r: ConfigReading,
                         files: set[str]) -> None:
    """A mask_embedding.pt beside the weights."""
    div = view.divergences
    if MASK_EMBEDDING_FILE in files:  # convert carries the file, so a converted view has it too
        if rules.mask_embedding == MaskEmbedding.IGNORED:
            div.append(Divergence(field="mask_embedding", severity="error", trained=MASK_EMBEDDING_FILE,
                                  applied="target embedding",
                                  consequence=RULE_TEXT["mask_embedding"][MaskEmbedding.IGNORED],
                                  fix="serve it with vLLM or SGLang"))


def _view_verifier(view: EngineView, rules: EngineRules, spec: DraftSpec, r: ConfigReading) -> None:
    """How the engine finds the target model."""
    div = view.divergences
    if rules.verifier == Verifier.HUB_REPO_ID:
        name = r.verifier
        if not name:
            div.append(Divergence(field="verifier", severity="error", trained=None, applied=None,
                                  consequence="no speculators_config.verifier.name_or_path: `vllm serve DRAFT` "
                                              "rejects the config",
                                  fix="convert --verifier ORG/NAME"))
        elif not is_hub_id(name):
            div.append(Divergence(field="verifier", severity="warning", trained=name, applied=None,
                                  consequence=f"verifier {name!r} is a local path: `vllm serve DRAFT` refuses it "
                                              "(vLLM wants a Hub repo id)",
                                  fix="convert --verifier ORG/NAME (or serve with --model TARGET "
                                      "--speculative-config)"))


VLLM_V1_DSPARK = "Model Runner V1 does not support: dspark speculative decoding"
VLLM_V1_CANDIDATE = "Model Runner V1 does not support: DFlash candidate-head drafts"


def _view_dspark(view: EngineView, rules: EngineRules, spec: DraftSpec, raw: dict[str, Any]) -> None:
    """What the engine serves of a DSpark draft: its runner, Markov head, confidence head and anchor slot."""
    div, f = view.divergences, spec.variant_fields
    head, anchor = f.get("markov_head_type"), f.get("sample_from_anchor")
    if rules.dspark == DSpark.NOT_SERVED:
        view.loads = False
        div.append(Divergence(field="architectures", severity="error", trained="dspark", applied=None,
                              consequence=f"{rules.title} has no DSpark model", fix="serve it with vLLM or SGLang"))
        return
    top = lambda key, default: raw.get(key, default)  # noqa: E731  both engines read DSpark keys at the top level
    if rules.reads == "speculators":  # vLLM's speculators reader copies them to the top level; anchor default false
        applied_anchor = top("sample_from_anchor", False)
    else:
        applied_anchor = top("sample_from_anchor", True)
    if applied_anchor != anchor:
        div.append(Divergence(field="sample_from_anchor", severity="error", trained=anchor, applied=applied_anchor,
                              consequence="the engine lays the block out the other way (anchor drafting vs bonus "
                                          "anchor): every slot predicts another position than trained",
                              fix="write sample_from_anchor explicitly (convert does)"))
    if rules.dspark == DSpark.V2_RUNNER_VANILLA:
        div.append(Divergence(field="architectures", severity="warning", trained="DSpark",
                              applied="V2 model runner only",
                              consequence="vLLM's V1 model runner (the only one without Triton, so the CPU build's) "
                                          f"refuses it: '{VLLM_V1_DSPARK}'",
                              fix="serve it where the V2 model runner runs (a GPU build: VLLM_USE_V2_MODEL_RUNNER=1)"))
        if rules.reads == "hf" and raw.get("markov_rank") is None:
            view.loads = False
            div.append(Divergence(field="markov_rank", severity="error", trained=f.get("markov_rank"), applied=None,
                                  consequence="vLLM reads markov_rank only at the top level of config.json (this one "
                                              "has it in dflash_config): Qwen3DSparkModel fails to build",
                                  fix="convert --to hf (writes the DSpark keys at the top level)"))
        if head != "vanilla":
            view.loads = False
            div.append(Divergence(field="markov_head_type", severity="error", trained=head, applied="vanilla",
                                  consequence=f"vLLM 0.33's Qwen3DSparkModel builds the vanilla Markov head only: the "
                                              f"{head} head's tensors have no parameter there and the load fails",
                                  fix="serve it with SGLang"))
        if rules.reads == "hf" and anchor is False:
            div.append(Divergence(field="block_size", severity="warning", trained=spec.block_size,
                                  applied=(spec.block_size or 0) + 1,
                                  consequence="vLLM's DSpark drafts num_speculative_tokens (default: block_size) "
                                              "slots after the bonus anchor, a block one longer than trained",
                                  fix=f"serve with num_speculative_tokens={(spec.block_size or 1) - 1}"))
    elif rules.dspark == DSpark.ALL_HEADS_TARGET_LM_HEAD and f.get("enable_confidence_head") is False:
        view.loads = False
        div.append(Divergence(field="enable_confidence_head", severity="error", trained=False, applied=True,
                              consequence="SGLang 0.5.23 builds the confidence head whatever enable_confidence_head "
                                          "says and refuses a checkpoint without confidence_head.proj (unless its "
                                          "ragged verify mode is static)",
                              fix="serve it with vLLM, or SGLang with the static ragged verify mode"))


def vllm_cannot_serve_here(spec: DraftSpec) -> str | None:
    """One line saying why the vLLM CPU build (V1 model runner only: no Triton) cannot serve this draft, or None."""
    if spec.variant == "dspark":
        return f"vLLM's CPU build runs the V1 model runner only, which refuses DSpark drafts: '{VLLM_V1_DSPARK}'"
    if spec.variant == "dflash2":
        return f"vLLM's CPU build runs the V1 model runner only, which refuses DFlash2 drafts: '{VLLM_V1_CANDIDATE}'"
    return None


def rules_for(engine: str | None, source_format: str | None = None) -> list[EngineRules]:
    """Rows of the table an `--engine` choice names (all when None); for vLLM, the path that reads
    `source_format` first."""
    if engine is not None and engine not in ENGINE_NAMES:
        raise UsageError(f"unknown engine {engine!r}; choose from {', '.join(ENGINE_NAMES)}")
    rows = [e for e in ENGINES if engine is None or e.engine == engine]
    return sorted(rows, key=lambda e: e.reads != source_format) if engine else rows


def checkpoint_views(ckpt, engine: str | None = None, *, num_target_layers: int | None = None) -> list[EngineView]:
    """Every engine's view of an opened Checkpoint (or those `engine` names)."""
    return [_checkpoint_view(ckpt, rules, num_target_layers) for rules in rules_for(engine, ckpt.format)]


def _checkpoint_view(ckpt, rules: EngineRules, num_target_layers: int | None) -> EngineView:
    fc = ckpt.tensors.get(catalogue.name("fc"))
    return engine_view(rules, ckpt.spec, ckpt.raw_config, tensors=ckpt.tensors,
                       files=[f.name for f in ckpt.companion_files],
                       fc_shape=tuple(fc.shape) if fc is not None else None, num_target_layers=num_target_layers)


def serving_view(ckpt, engine: str, *, num_target_layers: int | None = None) -> EngineView:
    """The view of the one path `engine` would serve this checkpoint through (vLLM: the path for its format)."""
    return _checkpoint_view(ckpt, rules_for(engine, ckpt.format)[0], num_target_layers)


def applied_spec(spec: DraftSpec, view: EngineView) -> DraftSpec:
    """The draft as `view`'s engine runs it: its ids (in its order), per-layer causality, layer types,
    window and block size, and the target's lm_head where it ignores a pruned one."""
    upd: dict[str, Any] = {}
    if view.target_layer_ids is not None:
        upd["target_layer_ids"] = list(view.target_layer_ids)
    if view.layer_causal is not None and len(view.layer_causal) == spec.num_layers:
        upd["layer_causal"] = list(view.layer_causal)
        upd["causal_flag"] = None
    if view.layer_types is not None and len(view.layer_types) == spec.num_layers:
        upd["layer_types"] = list(view.layer_types)
        upd["decoder"] = {**spec.decoder, "layer_types": list(view.layer_types), "sliding_window": view.sliding_window}
    if view.block_size is not None:
        upd["block_size"] = view.block_size
    if spec.is_pruned_vocab and ENGINES_BY_KEY[view.engine].vocab == Vocab.TARGET_LM_HEAD:
        upd["draft_vocab_size"] = None
    return spec.model_copy(update=upd)


PRUNED_VOCAB_TENSORS = tuple(catalogue.name(k) for k in ("lm_head", "d2t", "t2d"))


def applied_checkpoint(ckpt, view: EngineView):
    """A view of an opened Checkpoint with the engine's semantics (same files; tensors the engine
    ignores left out), for the runtime to run the draft as that engine would."""
    from dataclasses import replace

    spec = applied_spec(ckpt.spec, view)
    tensors = ckpt.tensors
    if ckpt.spec.is_pruned_vocab and not spec.is_pruned_vocab:
        tensors = {k: v for k, v in tensors.items() if k not in PRUNED_VOCAB_TENSORS}
    return replace(ckpt, spec=spec, tensors=tensors)


# ----------------------------------------------------------------------------- rendering

def render_markdown() -> str:
    """The README section's table: one row per field, one column per engine (generated: do not hand-edit)."""
    head = "| | " + " | ".join(f"{e.title} {e.version}" for e in ENGINES) + " |"
    lines = [head, "|---" * (len(ENGINES) + 1) + "|"]
    for f in fields(EngineRules):
        if f.name not in FIELD_TITLES:
            continue
        cells = [RULE_TEXT[f.name][getattr(e, f.name)] for e in ENGINES]
        lines.append(f"| {FIELD_TITLES[f.name]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def view_state(view: EngineView) -> str:
    """as trained / DIFFERS from training / does not load, and the model runner it needs, if only one serves it."""
    state = "as trained" if view.as_trained else ("does not load" if not view.loads else "DIFFERS from training")
    runners = sorted({d.applied for d in view.divergences if isinstance(d.applied, str)
                      and d.applied.endswith("model runner only")})
    return state + (f" ({runners[0]})" if runners and view.loads else "")


def render_view(view: EngineView) -> list[str]:
    """A few plain lines for the human `inspect` output."""
    via = " (via conversion)" if view.via_conversion else ""
    state = view_state(view)
    causal = ("-" if view.layer_causal is None else
              " ".join("C" if c else "N" for c in view.layer_causal))
    lines = [f"{view.title} {view.version}{via}: {state}",
             f"  ids {view.target_layer_ids} ({view.target_layer_ids_source}); causal per layer {causal} "
             f"({view.causal_source}); block {view.block_size or 'unset'} ({view.block_size_source}); vocab: {view.vocab}"
             + (f"; window {view.sliding_window} {view.window_semantics}" if view.window_semantics else "")]
    for d in view.divergences:
        lines.append(f"  {d.severity.upper()} {d.field}: {d.consequence}. Fix: {d.fix}")
    return lines


README_START, README_END = "<!-- engines-table:start -->\n", "<!-- engines-table:end -->"


def write_readme(path: str = "README.md") -> None:
    """Replace the generated table between the README's markers with `render_markdown()`."""
    from pathlib import Path

    text = Path(path).read_text()
    head, _, rest = text.partition(README_START)
    _, _, tail = rest.partition(README_END)
    if not rest:
        raise SystemExit(f"{path} has no {README_START.strip()} marker")
    Path(path).write_text(head + README_START + render_markdown() + README_END + tail)


if __name__ == "__main__":
    import sys

    if sys.argv[1:] == ["--write-readme"]:
        write_readme()
    else:
        sys.stdout.write(render_markdown())
