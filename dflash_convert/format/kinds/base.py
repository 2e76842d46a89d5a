"""What a draft kind is on the format side: its config keys, its tensors, and the hooks its formats need.

A kind (dflash, dflash2, dspark, ...) is the DFlash backbone plus what the kind adds. Each kind is one module
of this package holding a `Kind` (a subclass when it has hooks of its own) and one line in the registry
(`kinds/__init__.py`); the runtime's head for it is one module of dflash_runtime (heads.py). Everything else
(the config models, the key and tensor tables, the mapping, the engine table, the model card) reads the kind
from the registry. This module holds the shapes of that data (`ConfigKey`, `Tensor`, `Kind`) and the backbone's
own config keys, which every kind takes.

Bottom layer: imports nothing from dflash_convert (configs reads the kinds, so a DraftSpec is only named here).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Callable

DraftSpec = Any  # configs.DraftSpec, which configs builds from the kinds (so not imported here)
# The registered kinds by name: kinds/__init__.py fills it (the registry); here so that a key or tensor can say
# whose it is without importing the registry.
REGISTRY: dict[str, "Kind"] = {}

# ----------------------------------------------------------------------------- config keys


TYPES = ("size", "text", "bool", "float")  # ConfigKey.typed: a positive int, a string, true/false, a finite number


@dataclass(frozen=True)
class ConfigKey:
    """One DFlash-family config key an engine reads beyond the decoder config (keys.py says the table's rules)."""

    name: str
    readers: str  # who reads it (engines, training library)
    effect: str  # what it changes
    neutral: tuple = ()  # values (besides absent / null) at which it changes nothing
    speculators: str | None = None  # where the speculators format keeps it (top-level name) or None: no field
    required: bool = False  # a draft of its kinds must have it
    hf_top: bool = False  # the HF layout keeps it at the top level (DSpark's keys), not inside dflash_config
    filled: tuple = ()  # (value,): what speculators' config class fills in when its config.json lacks the key
    hf_filled: tuple = ()  # (value,): what every HF reader (vLLM, SGLang) acts on when the key is absent
    # the type the config models check it as (one of TYPES; None: not declared, carried unchecked)
    typed: str | None = None
    hf_nested: bool = False  # an hf_top key published drafts may nest in dflash_config too (checked there as well)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The registered kinds that have this key."""
        return tuple(k.name for k in REGISTRY.values() if self in k.keys)

    @property
    def hf_path(self) -> str:
        return self.name if self.hf_top else f"dflash_config.{self.name}"

    def is_neutral(self, value: Any) -> bool:
        """Whether this value leaves the computation as without the key (bools are not numbers here)."""
        if self.required:
            return False
        return value is None or any(type(value) is type(n) and value == n for n in self.neutral)

    @property
    def default(self) -> Any:
        """The value an engine acts on when the key is absent."""
        return self.neutral[0] if self.neutral else None


# The backbone's keys, every kind's: logit maps z-lab's DFlash2 drafts carry (applied to the unary logits before
# the selector), and attention variants of published HF drafts.
LOGIT_MAPS = (
    ConfigKey("input_embedding_scale", "vLLM (dflash2)", "multiplies the block's token embeddings",
              neutral=(1.0, 1), typed="float"),
    ConfigKey("output_multiplier", "vLLM (dflash2), SGLang", "multiplies the draft's logits (before the cap)",
              neutral=(1.0, 1), typed="float"),
    ConfigKey("final_logit_softcapping", "vLLM (dflash2), SGLang",
              "caps the multiplied logits: c * tanh(m * logits / c)", neutral=(0.0, 0), typed="float"),
)
ATTENTION_VARIANTS = (
    ConfigKey("use_swa", "vLLM", "makes every layer sliding-window, whatever layer_types says", neutral=(False,)),
    ConfigKey("swa_window_size", "vLLM, SGLang", "the sliding window, before `sliding_window`"),
    ConfigKey("attention_sink_bias", "vLLM, SGLang", "adds a learned attention sink per head", neutral=(False,)),
    ConfigKey("attention_value_scale", "vLLM, SGLang", "scales the attention values"),
)

# ----------------------------------------------------------------------------- tensors

KEEP, DROP, KEEP_IF_PRUNED, DERIVE_IF_PRUNED = "keep", "drop", "keep-if-pruned", "derive-if-pruned"
Shape = tuple[int, ...]


def always(spec: DraftSpec) -> bool:  # noqa: ARG001
    return True


def never(spec: DraftSpec) -> bool:  # noqa: ARG001
    return False


@dataclass(frozen=True)
class Tensor:
    """One entry of the tensor catalogue (catalogue.py): a tensor name and what each format does with it."""

    key: str  # short identifier (the runtime's field name)
    name: str  # name template in both formats; "{i}" = draft layer index
    role: str
    shape: Callable[[DraftSpec], Shape | None]  # None: not sized (unknown without target ids, or unspecified)
    needed: Callable[[DraftSpec], bool] = always  # a draft of this spec must have it
    to_hf: str = KEEP
    to_speculators: str = KEEP
    drop_reason: str = ""
    check: str = "tensor_shapes"  # the static check that reports a wrong shape
    hint: Callable[[DraftSpec], str] | None = None  # why the shape is what it is, added to errors
    dtype: str | None = None  # the dtype code conversion writes when it derives the tensor
    kinds: tuple[str, ...] = ("float",)  # dtype kinds (dtypes.DType.kind) it may be stored in
    only_if_needed: bool = False  # present while `needed` is false: the keys say the draft has no such module

    @property
    def never_shipped(self) -> bool:
        """Dropped by conversion to either format: training-only or a copy of the target's weights."""
        return self.to_hf == DROP and self.to_speculators == DROP

    @property
    def per_layer(self) -> bool:
        return "{i}" in self.name

    @property
    def variants(self) -> tuple[str, ...]:
        """The registered kinds whose own entry it is; () for the backbone's, which every kind has."""
        return tuple(k.name for k in REGISTRY.values() if self in k.tensors)

    @cached_property
    def pattern(self) -> re.Pattern:
        # a layer index of at most 6 digits (MAX_LAYERS is 1024): a longer one is an unknown tensor, never an int()
        # of thousands of digits
        return re.compile(re.escape(self.name).replace(r"\{i\}", r"(\d{1,6})"))

    def names(self, spec: DraftSpec) -> list[str]:
        return [self.name.format(i=i) for i in range(spec.num_layers)] if self.per_layer else [self.name]


def size(spec: DraftSpec, what) -> int | None:
    """One dimension of a family tensor: a number, a config key, or a derived size (None: unknown)."""
    if isinstance(what, int):
        return what
    if what == "hidden":
        return spec.hidden_size
    if what == "vocab":
        return spec.vocab_size
    if what == "draft_vocab":
        return spec.draft_vocab
    if isinstance(what, tuple):  # a sum of sizes
        parts = [size(spec, w) for w in what]
        return None if None in parts else sum(parts)
    if isinstance(what, str) and what.startswith("3*"):
        inner = size(spec, what[2:])
        return None if inner is None else 3 * inner
    value = spec.variant_fields.get(what)
    return value if isinstance(value, int) and value > 0 else None


def sized(spec: DraftSpec, *dims) -> Shape | None:
    """The shape of these dimensions (see `size`), or None while one is unknown."""
    sizes = tuple(size(spec, d) for d in dims)
    return None if None in sizes else sizes


# ----------------------------------------------------------------------------- the kind

# Kind.engine_support: how the serving engines take a kind
BACKBONE_RULES = "backbone rules"  # their model of the kind reads the config as engines.py's table says, plus the
#                                    kind's engine_view hook (dflash, dflash2)
OWN_TABLE = "own table"  # its own sub-table says what each engine serves (dspark)
RUNTIME_ONLY = "runtime only"  # no engine serves it: the bundled runtime runs it, and inspect notes that
ENGINE_SUPPORT = (BACKBONE_RULES, OWN_TABLE, RUNTIME_ONLY)


@dataclass(frozen=True)
class CardServing:
    """How the model card says to serve a draft of a kind (vLLM's method, SGLang's algorithm and block)."""

    vllm_method: str
    sglang_algorithm: str
    sglang_note: str  # what --speculative-num-draft-tokens and num_speculative_tokens are for this kind
    sglang_block_of_k: bool = True  # SGLang's --speculative-num-draft-tokens at vLLM's K is K + 1 (the block)


class Kind:
    """A draft kind on the format side. Subclasses set the data; the methods are hooks a kind may override."""

    name: str  # DraftSpec.variant and speculators_model_type
    title: str  # in sentences ("DFlash2 drafts")
    hf_architecture: str  # the HF / z-lab `architectures` entry engines load it by
    speculators_architecture: str  # the `architectures` entry of its speculators config
    hf_aliases: tuple[tuple[str, str], ...] = ()  # (architecture, model_type) an HF config also names it by
    keys: tuple[ConfigKey, ...] = ()  # its config keys, the backbone's it takes included, in their config order
    tensors: tuple[Tensor, ...] = ()  # its tensors beyond the backbone's (catalogue.py)
    # what its keys must satisfy for speculators' own model and the engines to build it:
    # (rule, holds(fields, hidden, vocab, block, pruned))
    rules: tuple[tuple[str, Callable[..., bool]], ...] = ()
    modules: str = ""  # what the kind adds, in words, for the static checks ("" for the plain backbone)
    speculators_non_causal_default: bool = False  # speculators' default for `sliding_window_non_causal`
    anchor_may_propose: bool = False  # sample_from_anchor true is this kind's (DSpark's); refused otherwise
    legacy_block_writer: bool = False  # speculators once wrote speculative_tokens = block_size for this kind
    # the message vLLM's V1 model runner refuses this kind with (None: V1 serves it), and the kind in its words
    vllm_v1_refusal: str | None = None
    vllm_v1_label: str = ""
    # how the serving engines take this kind: one of ENGINE_SUPPORT, chosen in the kind's own class (never
    # inherited: a kind built on another's module does not inherit its engines; the registry refuses it unset)
    engine_support: str
    # with engine_support OWN_TABLE, the sub-table: engine row key (engines.ENGINES) -> a kind of support,
    # `support_text` what each means (docs/engines.md gets a row titled `support_title`)
    support: dict[str, str] = {}
    support_text: dict[str, str] = {}
    support_title: str = ""
    drops_mask_embedding: bool = False  # the engines' loaders of this kind ignore a mask_embedding.pt

    def __repr__(self) -> str:
        return f"<kind {self.name}>"

    # -- keys

    def key(self, name: str) -> ConfigKey:
        """Its row of config key `name`."""
        return next(k for k in self.keys if k.name == name)

    def trained_value(self, fields: dict[str, Any], name: str) -> Any:
        """The value a draft was trained with: its config's, else what speculators fills in for an absent key,
        else the neutral one (what the runtime runs)."""
        value = fields.get(name)
        if value is not None:
            return value
        key = self.key(name)
        return key.filled[0] if key.filled else key.default

    # -- proposals

    def anchor_predicts(self, fields: dict[str, Any]) -> bool:
        """Whether the anchor's slot proposes too (sample_from_anchor), so a block of B proposes B tokens."""
        return self.anchor_may_propose and bool(self.trained_value(fields, "sample_from_anchor"))

    def proposals(self, block_size: int, fields: dict[str, Any]) -> int:
        """Tokens one block of `block_size` proposes: B - 1 after the bonus anchor, B when the anchor proposes."""
        return block_size - 1 + self.anchor_predicts(fields)

    # -- mapping hooks

    def hf_own_keys(self) -> tuple[str, ...]:
        """Top-level keys of an HF config that are this kind's, not the decoder's."""
        return ()

    def check_hf_fields(self, raw: dict[str, Any], fields: dict[str, Any]) -> str | None:
        """What contradicts itself in an HF config's keys of this kind (None: nothing)."""
        return None

    def speculators_refusal(self, fields: dict[str, Any]) -> str | None:
        """Why a speculators config cannot be written for a draft with these keys (None: it can)."""
        return None

    # -- engines and the model card

    def engine_view(self, view, rules, spec: DraftSpec, raw: dict[str, Any], *, divergence, v2_runner_only) -> None:
        """Add to `view` (an engine_views.EngineView) what `rules`' engine serves of this kind's own modules:
        `divergence` builds an engine_views.Divergence, `v2_runner_only(label, refusal)` the one for a draft vLLM
        serves with its V2 model runner only. The backbone's kinds add nothing."""

    def card_serving(self, block: int | None, num_spec: str, anchor: bool) -> CardServing:
        """The model card's serving commands for this kind (block: the trained block size)."""
        draft_tokens = f"{block}" if block else "<BLOCK_SIZE>"
        return CardServing("dflash", "DFLASH", f"`--speculative-num-draft-tokens` is the block size ({draft_tokens}) "
                           f"for DFlash in SGLang; vLLM's `num_speculative_tokens` is the block size minus one "
                           f"({num_spec}).")

    def sglang_draft_tokens(self, block: int | None) -> str:
        """SGLang's --speculative-num-draft-tokens for the trained block."""
        return f"{block}" if block else "<BLOCK_SIZE>"

    def card_note(self) -> list[str]:
        """Lines the model card adds before the serving commands."""
        return []
