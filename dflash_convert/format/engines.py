"""How each serving engine reads a DFlash config, as data: the engine table.

`ENGINES` is the one table: one row per engine and version (vLLM reads the two formats through two
different code paths, so it has two rows; what both paths share is stated once). Each field holds a
rule kind, a member of that field's enum (a name that is no kind fails when the row is built);
`RULE_TEXT` says what each kind means and the engine table of docs/engines.md is generated from both
(`python -m dflash_convert.regenerate`, which regenerates every generated file).

The code that applies the table lives beside it: format/engine_reading.py reads a config with one
reader per kind, the way that engine's own config-reading code does; format/engine_views.py compares
the result with the draft's trained semantics and says every difference with its consequence and fix.

The rules were read from the engines' sources (vLLM 0.33.0, SGLang 0.5.23, z-lab/dflash at HEAD);
docs/engines.md says where in those sources each one lives.

Bottom layer: imports only format/ modules and errors.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from enum import Enum, auto
from typing import Any, Literal, get_args, get_origin, get_type_hints

from dflash_convert.errors import UsageError
from dflash_convert.format import catalogue, keys, kinds, mapping
from dflash_convert.format.configs import Format
from dflash_convert.format.kinds.base import OWN_TABLE, RUNTIME_ONLY

ENGINE_NAMES: tuple[str, ...] = ("vllm", "sglang", "zlab", "transformers")


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
    TOP_LEVEL = auto()


class IdsMissing(RuleKind):
    REFUSE = auto()
    MODEL_DEFAULT = auto()
    DERIVE = auto()
    CLASS_DEFAULT = auto()


class NumTargetLayers(RuleKind):
    """Whether a config that gives its target layer ids must also give `num_target_layers`."""

    NOT_NEEDED_WITH_IDS = auto()
    REQUIRED = auto()


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
    BIDIRECTIONAL = auto()


class LayerTypes(RuleKind):
    EXPLICIT = auto()
    QWEN3 = auto()
    ALL_SLIDING_DEFAULT = auto()


class Window(RuleKind):
    RAW = auto()
    SWA_WINDOW_SIZE_OR_QWEN3 = auto()
    QWEN3 = auto()
    DEFAULT_2048 = auto()


class WindowSemantics(RuleKind):
    PER_QUERY = auto()
    ANCHOR = auto()
    SYMMETRIC = auto()


class WindowMissing(RuleKind):
    REFUSE = auto()
    FULL_CONTEXT = auto()
    CLASS_DEFAULT = auto()


class BlockSize(RuleKind):
    SPECULATIVE_TOKENS = auto()
    SERVING_FLAG = auto()
    DFLASH_CONFIG_OR_TOP_DEFAULT_16 = auto()
    TOP_DEFAULT_16 = auto()


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
    CLASS_DEFAULT = auto()


class MaskEmbedding(RuleKind):
    USED = auto()
    IGNORED = auto()


class NativeLayout(RuleKind):
    """What an engine makes of a checkpoint in transformers' own layout (MuseGlimmerAssistantConfig)."""

    READ = auto()
    ALIAS = auto()
    NOT_READ = auto()
    OWN = auto()


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
    num_target_layers: NumTargetLayers  # whether the config must give num_target_layers beside its ids
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
    native_layout: NativeLayout  # a checkpoint in transformers' own layout

    def __post_init__(self) -> None:
        if self.engine not in ENGINE_NAMES:
            raise ValueError(f"engine row {self.key!r}: engine {self.engine!r} is not one of {', '.join(ENGINE_NAMES)}")
        for name, kind in RULE_KINDS.items():
            value = getattr(self, name)
            allowed = kinds_of(name)
            if value not in allowed:  # a RuleKind equals its name
                raise ValueError(f"engine row {self.key!r}: {name} {value!r} is not a rule kind "
                                 f"({', '.join(allowed)})")
            if get_origin(kind) is not Literal:
                object.__setattr__(self, name, kind(value))


# rule field -> the type of its kinds: its enum, or the Format literal for `reads`
RULE_KINDS: dict[str, Any] = {
    name: kind for name, kind in get_type_hints(EngineRules).items()
    if get_origin(kind) is Literal or (isinstance(kind, type) and issubclass(kind, RuleKind))}


def kinds_of(name: str) -> tuple:
    """The kinds a rule field may hold: its enum's members, or the Format literal's values for `reads`."""
    kind = RULE_KINDS[name]
    return get_args(kind) if get_origin(kind) is Literal else tuple(kind)


# What vLLM 0.33 does whichever format it reads: its two reading paths differ only in how they read a config.
_VLLM: dict[str, Any] = dict(
    engine="vllm", version="0.33.0", num_target_layers=NumTargetLayers.NOT_NEEDED_WITH_IDS, ids_order=IdsOrder.SORTED_UNIQUE, last_layer=LastLayer.PRE_NORM,
    window_semantics=WindowSemantics.PER_QUERY, window_missing=WindowMissing.REFUSE, vocab=Vocab.OWN_LM_HEAD_D2T,
    fc_width=FcWidth.TARGET_HIDDEN_SIZE, mask=Mask.REQUIRED, mask_embedding=MaskEmbedding.USED,
    native_layout=NativeLayout.READ)

ENGINES: tuple[EngineRules, ...] = (
    EngineRules(
        key="vllm-speculators", title="vLLM (speculators format)", **_VLLM,
        reads="speculators", layer_ids=LayerIds.AUX_MINUS_ONE, ids_missing=IdsMissing.REFUSE,
        causality=Causality.SPECULATORS_GLOBAL, layer_types=LayerTypes.EXPLICIT, window=Window.RAW,
        block_size=BlockSize.SPECULATIVE_TOKENS, mixed=Mixed.INEXPRESSIBLE, verifier=Verifier.HUB_REPO_ID),
    EngineRules(
        key="vllm-hf", title="vLLM (HF format)", **_VLLM,
        reads="hf", layer_ids=LayerIds.EAGLE_AUX_THEN_DFLASH_CONFIG_OR_TOP, ids_missing=IdsMissing.MODEL_DEFAULT,
        causality=Causality.IS_CAUSAL_THEN_DFLASH_CAUSAL_THEN_SLIDING, layer_types=LayerTypes.QWEN3,
        window=Window.SWA_WINDOW_SIZE_OR_QWEN3, block_size=BlockSize.SERVING_FLAG, mixed=Mixed.V2_RUNNER,
        verifier=Verifier.SERVING_FLAG),
    EngineRules(
        key="sglang", engine="sglang", title="SGLang", version="0.5.23",
        reads="hf", layer_ids=LayerIds.DFLASH_CONFIG_OR_TOP, ids_missing=IdsMissing.DERIVE,
        num_target_layers=NumTargetLayers.NOT_NEEDED_WITH_IDS,
        ids_order=IdsOrder.SORTED_UNIQUE, last_layer=LastLayer.NOT_CAPTURED, causality=Causality.IS_CAUSAL_THEN_SLIDING,
        layer_types=LayerTypes.QWEN3, window=Window.QWEN3, window_semantics=WindowSemantics.PER_QUERY,
        window_missing=WindowMissing.REFUSE, block_size=BlockSize.DFLASH_CONFIG_OR_TOP_DEFAULT_16,
        vocab=Vocab.TARGET_LM_HEAD, fc_width=FcWidth.HIDDEN_SIZE, mixed=Mixed.SUPPORTED, mask=Mask.TOKEN_FALLBACK,
        mask_embedding=MaskEmbedding.USED, verifier=Verifier.SERVING_FLAG, native_layout=NativeLayout.ALIAS),
    EngineRules(
        key="zlab", engine="zlab", title="z-lab dflash (transformers)", version="HEAD",
        reads="hf", layer_ids=LayerIds.DFLASH_CONFIG_OR_TOP, ids_missing=IdsMissing.REFUSE,
        # DFlashDraftModel.__init__ passes build_target_layer_ids(config.num_target_layers, ...) as the default of
        # dflash_config.get("target_layer_ids", ...): evaluated, and failing on None, whatever the ids are
        num_target_layers=NumTargetLayers.REQUIRED,
        ids_order=IdsOrder.AS_LISTED, last_layer=LastLayer.POST_NORM, causality=Causality.IS_CAUSAL_THEN_SLIDING,
        layer_types=LayerTypes.QWEN3, window=Window.QWEN3, window_semantics=WindowSemantics.PER_QUERY,
        window_missing=WindowMissing.FULL_CONTEXT, block_size=BlockSize.DFLASH_CONFIG_OR_TOP_DEFAULT_16,
        vocab=Vocab.TARGET_LM_HEAD, fc_width=FcWidth.HIDDEN_SIZE, mixed=Mixed.SUPPORTED, mask=Mask.REQUIRED,
        mask_embedding=MaskEmbedding.IGNORED, verifier=Verifier.CALLER, native_layout=NativeLayout.NOT_READ),
    # transformers' own DFlash (models/muse_glimmer_assistant, generation/candidate_generator.py's
    # DFlashTokenCandidateGenerator, cache_utils.py's DFlashCache; the same rules in 5.19.0 and 5.24.0)
    EngineRules(
        key="transformers", engine="transformers", title="transformers generate (speculation_type=dflash)",
        version="5.19.0", reads="transformers", layer_ids=LayerIds.TOP_LEVEL, ids_missing=IdsMissing.CLASS_DEFAULT,
        num_target_layers=NumTargetLayers.NOT_NEEDED_WITH_IDS,
        ids_order=IdsOrder.AS_LISTED, last_layer=LastLayer.POST_NORM, causality=Causality.BIDIRECTIONAL,
        layer_types=LayerTypes.ALL_SLIDING_DEFAULT, window=Window.DEFAULT_2048,
        window_semantics=WindowSemantics.SYMMETRIC, window_missing=WindowMissing.CLASS_DEFAULT,
        block_size=BlockSize.TOP_DEFAULT_16, vocab=Vocab.TARGET_LM_HEAD, fc_width=FcWidth.HIDDEN_SIZE,
        mixed=Mixed.SUPPORTED, mask=Mask.CLASS_DEFAULT, mask_embedding=MaskEmbedding.IGNORED,
        verifier=Verifier.CALLER, native_layout=NativeLayout.OWN),
)
ENGINES_BY_KEY = {e.key: e for e in ENGINES}

# What each rule kind means, in one short cell (README table); engine_reading.py and engine_views.py act on the kinds.
RULE_TEXT: dict[str, dict[str, str]] = {  # keys: each field's kinds
    "reads": {"speculators": "speculators", "hf": "HF / z-lab",
              "transformers": "transformers' own (`MuseGlimmerAssistantConfig`)"},
    "layer_ids": {
        LayerIds.AUX_MINUS_ONE: "`aux_hidden_state_layer_ids` - 1",
        LayerIds.DFLASH_CONFIG_OR_TOP: "`dflash_config.target_layer_ids`, else top-level `target_layer_ids`",
        LayerIds.EAGLE_AUX_THEN_DFLASH_CONFIG_OR_TOP: "`eagle_aux_hidden_state_layer_ids` - 1 if present, else "
                                                      "`dflash_config.target_layer_ids`, else top-level "
                                                      "`target_layer_ids`",
        LayerIds.TOP_LEVEL: "top-level `target_layer_ids` (0-based layer outputs, as z-lab's)",
    },
    "ids_missing": {
        IdsMissing.REFUSE: "refuses to load",
        IdsMissing.MODEL_DEFAULT: "the target model's default EAGLE-3 layers (not the trained ones)",
        IdsMissing.DERIVE: "derived from the layer counts (`build_target_layer_ids`), a guess",
        IdsMissing.CLASS_DEFAULT: "the config class's default [1, 13, 25, 37, 49] (Muse Glimmer's, not the trained "
                                  "ones)",
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
        Causality.BIDIRECTIONAL: "every layer bidirectional: there is no causal mode",
    },
    "layer_types": {
        LayerTypes.EXPLICIT: "`transformer_layer_config.layer_types` as written (absent: every layer full)",
        LayerTypes.QWEN3: "`layer_types`, else transformers' Qwen3 rule (`use_sliding_window`, `max_window_layers`)",
        LayerTypes.ALL_SLIDING_DEFAULT: "`layer_types`, else every layer sliding (the config class's default)",
    },
    "window": {
        Window.RAW: "`transformer_layer_config.sliding_window`",
        Window.SWA_WINDOW_SIZE_OR_QWEN3: "`dflash_config.swa_window_size`, else `sliding_window` (null unless "
                                         "`use_sliding_window` is true: the load fails)",
        Window.QWEN3: "`sliding_window`, null unless `use_sliding_window` is true",
        Window.DEFAULT_2048: "`sliding_window`, else 2048 (the config class's default)",
    },
    "window_semantics": {
        WindowSemantics.PER_QUERY: "W keys ending at each query (slot j sees j+1 fewer context positions than trained)",
        WindowSemantics.ANCHOR: "context positions >= anchor - W, for every slot of the block",
        WindowSemantics.SYMMETRIC: "keys at most W positions before or after each query (transformers' "
                                   "bidirectional sliding mask), over a sliding cache that keeps W - 1 context "
                                   "positions",
    },
    "window_missing": {
        WindowMissing.REFUSE: "the load fails",
        WindowMissing.FULL_CONTEXT: "they attend the whole context",
        WindowMissing.CLASS_DEFAULT: "a window of 2048 (the config class's default)",
    },
    "block_size": {
        BlockSize.SPECULATIVE_TOKENS: "`proposal_methods[0].speculative_tokens` + 1 (`vllm serve DRAFT`), or "
                                      "`num_speculative_tokens` + 1 from `--speculative-config`",
        BlockSize.SERVING_FLAG: "`num_speculative_tokens` + 1 from `--speculative-config` (the config's "
                                "`block_size` is not read)",
        BlockSize.DFLASH_CONFIG_OR_TOP_DEFAULT_16: "`dflash_config.block_size`, else `block_size`, else 16",
        BlockSize.TOP_DEFAULT_16: "top-level `block_size`, else 16 (the config class's default)",
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
        Mask.CLASS_DEFAULT: "`mask_token_id`, else 201818 (the config class's default, Muse Glimmer's)",
    },
    "mask_embedding": {
        MaskEmbedding.USED: "a `mask_embedding.pt` beside the weights replaces the mask token's embedding",
        MaskEmbedding.IGNORED: "`mask_embedding.pt` ignored: the mask slots get the target's embedding of "
                               "`mask_token_id`",
    },
    "num_target_layers": {
        NumTargetLayers.NOT_NEEDED_WITH_IDS: "not needed where the ids are given",
        NumTargetLayers.REQUIRED: "required even where the ids are given (the ids' default, "
                                  "`build_target_layer_ids(num_target_layers, ...)`, is evaluated first): a config "
                                  "without it does not load",
    },
    "native_layout": {
        NativeLayout.READ: "read: `MuseGlimmerAssistantModel` is served by its DFlash model, `encoder.fc` / "
                           "`encoder.output_norm_enc` renamed on load; the V1 model runner takes the ids from "
                           "`dflash_config.target_layer_ids` only, 0.32 the causality from `is_causal` / "
                           "`dflash_config.causal` (0.33 forces non-causal): convert writes all three",
        NativeLayout.ALIAS: "read: `MuseGlimmerAssistantModel` is an alias of its DFlash draft model, `encoder.*` "
                            "renamed on load, the DFlash keys at the top level, non-causal (its config class)",
        NativeLayout.NOT_READ: "not read: loaded as a Qwen3Config, `encoder.fc` / `encoder.output_norm_enc` match "
                               "none of its weights (left at random init)",
        NativeLayout.OWN: "its own layout (`AutoModel`, no remote code)",
    },
    "verifier": {
        Verifier.HUB_REPO_ID: "`speculators_config.verifier.name_or_path`; `vllm serve DRAFT` refuses a local path",
        Verifier.SERVING_FLAG: "the serving command's target model",
        Verifier.CALLER: "whatever target the caller passes",
    },
}
FIELD_TITLES = {
    "reads": "format read", "layer_ids": "target layer ids", "ids_missing": "no ids in the config",
    "num_target_layers": "`num_target_layers` beside the ids",
    "ids_order": "feature order", "last_layer": "id of the target's last layer", "causality": "block causality",
    "layer_types": "layer types", "window": "sliding window size", "window_semantics": "sliding window semantics",
    "window_missing": "sliding layers without a window size",
    "block_size": "block size", "vocab": "pruned vocab", "fc_width": "fc input width",
    "mixed": "mixed sliding + full layers", "mask": "mask token", "mask_embedding": "trained mask embedding",
    "verifier": "target model", "native_layout": "transformers' own layout",
}
MASK_EMBEDDING_FILE = catalogue.MASK_EMBEDDING_FILE  # vLLM and SGLang read it from the draft's directory
TRAINED_WINDOW = WindowSemantics.ANCHOR  # what speculators trains and the runtime implements

# Config keys at least one engine reads (paths in either layout). Anything else in a config changes
# nothing an engine does: `diff` reports such keys as informational only.
# (with the kinds' keys: the top-level ones of either layout, the HF dflash_config's, and each kind's own keys)
TOP_LEVEL_READ = frozenset({
    "architectures", "block_size", "is_causal", "target_hidden_size", "draft_vocab_size", "num_target_layers",
    "target_layer_ids", "mask_token_id", "mask_token", "aux_hidden_state_layer_ids", "sliding_window_non_causal",
    "sample_from_anchor", "speculators_model_type", "dtype", "torch_dtype", "eagle_aux_hidden_state_layer_ids",
    "quantization_config",  # vLLM and SGLang (format/quantization.py)
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
    *mapping.NEUTRAL_DECODER_KEYS,
})
SPECULATORS_CONFIG_READ = ("speculators_config.proposal_methods", "speculators_config.verifier.name_or_path")


def engine_reads(path: str) -> bool:
    """Whether any engine in the table reads the config key at this dotted path (either layout)."""
    head, _, rest = path.partition(".")
    if head == "transformer_layer_config":
        return rest.partition(".")[0] in DECODER_READ
    if head == "dflash_config":
        return rest.partition(".")[0] in DFLASH_CONFIG_READ or rest.partition(".")[0] in keys.by_name()
    if head == "speculators_config":
        return path.startswith(SPECULATORS_CONFIG_READ)
    top = {*mapping.speculators_family_keys(), *(k.name for k in keys.config_keys() if k.hf_top),
           *(own for k in kinds.all_kinds() for own in k.hf_own_keys())}
    return head in TOP_LEVEL_READ or head in DECODER_READ or head in top



def rules_for(engine: str | None, source_format: str | None = None) -> list[EngineRules]:
    """Rows of the table an `--engine` choice names (all when None); for vLLM, the path that reads
    `source_format` first."""
    if engine is not None and engine not in ENGINE_NAMES:
        raise UsageError(f"unknown engine {engine!r}; choose from {', '.join(ENGINE_NAMES)}")
    rows = [e for e in ENGINES if engine is None or e.engine == engine]
    return sorted(rows, key=lambda e: e.reads != source_format) if engine else rows


def _check_tables(rule_text: dict[str, dict[str, str]] = RULE_TEXT) -> None:
    """Each rule field has its title and each of its kinds a README text: a kind added to an enum
    without them fails at import, not in a user's run (format/engine_reading.py checks the readers)."""
    if set(FIELD_TITLES) != set(RULE_KINDS):
        raise ValueError(f"FIELD_TITLES and the rule fields differ: {sorted(set(FIELD_TITLES) ^ set(RULE_KINDS))}")
    for name in RULE_KINDS:
        kinds = set(kinds_of(name))
        if name not in rule_text or set(rule_text[name]) != kinds:
            raise ValueError(f"RULE_TEXT[{name!r}] and the kinds of {name} differ: "
                             f"{sorted(str(k) for k in set(rule_text.get(name, ())) ^ kinds)}")


def _check_kinds() -> None:
    """Each kind's engine sub-table has a row per engine and a text per kind of support: a kind registered without
    them fails when checked (at import for the built-in kinds), not in a user's run."""
    for kind in kinds.all_kinds():
        _check_kind(kind)


def _check_kind(kind) -> None:
    if kind.support and (set(kind.support) != set(ENGINES_BY_KEY) or not set(kind.support.values())
                         <= set(kind.support_text) or not kind.support_title):
        raise ValueError(f"kind {kind.name}: its engine support must name each of {', '.join(ENGINES_BY_KEY)} "
                         "with a kind of support its support_text says, under a support_title")


_check_tables()
_check_kinds()
kinds.CHECKS.append(_check_kind)  # a kind registered later (a plug-in, a test) is held to the same


# ----------------------------------------------------------------------------- docs: the table of docs/engines.md

def render_markdown() -> str:
    """docs/engines.md's table: one row per field, one column per engine (generated: do not hand-edit)."""
    head = "| | " + " | ".join(f"{e.title} {e.version}" for e in ENGINES) + " |"
    lines = [head, "|---" * (len(ENGINES) + 1) + "|"]
    for f in fields(EngineRules):
        if f.name not in FIELD_TITLES:
            continue
        cells = [RULE_TEXT[f.name][getattr(e, f.name)] for e in ENGINES]
        lines.append(f"| {FIELD_TITLES[f.name]} | " + " | ".join(cells) + " |")
        if f.name == KIND_ROWS_AFTER:
            lines += [f"| {k.support_title} | " + " | ".join(k.support_text[k.support[e.key]] for e in ENGINES) + " |"
                      for k in kinds.all_kinds() if k.engine_support == OWN_TABLE]
            lines += [f"| {k.title} drafts | " + " | ".join(RUNTIME_ONLY_TEXT for _ in ENGINES) + " |"
                      for k in kinds.all_kinds() if k.engine_support == RUNTIME_ONLY]
    return "\n".join(lines) + "\n"


KIND_ROWS_AFTER = "verifier"  # the table's rows of the kinds' own engine support follow this field's
RUNTIME_ONLY_TEXT = "not served (runtime only: the bundled runtime runs it)"


README_START, README_END = "<!-- engines-table:start -->\n", "<!-- engines-table:end -->"  # regenerate.py


# ----------------------------------------------------------------------------- quantized drafts
# What each engine does with a draft whose config.json carries `quantization_config` (format/quantization.py),
# read from the engines' loaders: vLLM 0.32.0 (the CPU build) and 0.33.0 `model_executor/models/qwen3_dflash.py`
# and `transformers_utils/config.py` (the key is copied from config.json onto the draft's config in either
# format); SGLang 0.5.23 `srt/models/dflash.py` and `srt/speculative/dflash_utils.py`; transformers 5.19
# `quantizers/auto.py` (z-lab's remote code loads through it).

@dataclass(frozen=True)
class QuantizedServing:
    key: str  # the ENGINES row (or engine) it describes
    title: str
    version: str
    methods: tuple[str, ...]  # quant_method values its loader applies; others are skipped (weights load unscaled)
    fc_quantized: bool  # whether `fc` runs through the quantization method (False: a plain nn.Linear)
    layer_names: bool  # whether its decoder layers' modules carry their `layers.N.` names when the quant config
    #                    matches them (False: the bare projection name, e.g. `q_proj`)
    context_kv: str  # what its context K/V projection does with a quantized qkv_proj
    cpu_kernels: str = ""  # what its CPU build serves, measured and from its kernels ("" where none was run here)


QUANTIZED_SERVING: tuple[QuantizedServing, ...] = (
    QuantizedServing(
        "vllm", "vLLM", "0.32.0 / 0.33.0", ("compressed-tensors", "modelopt"), True, True,
        "the fused context-KV GEMM (one F.linear over qkv_proj.weight slices) is built only when every qkv_proj "
        "is unquantized (UnquantizedLinearMethod); a quantized one runs per layer through its quant method",
        "0.32.0 served FP8 W8A8 dynamic, INT8 W8A8 and INT4 W4A16 copies of the bundled draft; its WNA16 kernel "
        "(CPUWNA16) takes 4-bit weights only, so INT8 W8A16 is refused, and ModelOpt FP8's static input scales "
        "need static_scaled_fp8_quant, which the CPU build lacks"),
    QuantizedServing(
        "sglang", "SGLang", "0.5.23", ("compressed-tensors", "modelopt"), False, False,
        "kv_proj_only slices qkv_proj.weight only when it is unquantized (can_dflash_slice_qkv_weight), else runs "
        "the full qkv_proj through its quant method"),
    QuantizedServing(
        "zlab", "z-lab dflash (transformers)", "5.19.0", ("compressed-tensors",), True, True,
        "transformers' compressed-tensors quantizer dequantizes on load (the compressed-tensors package must be "
        "installed)"),
)
