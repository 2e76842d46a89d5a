"""The one tensor catalogue of a DFlash draft, as data.

Each entry says, for one tensor: its name (the same in the speculators and the HF / z-lab format;
`{i}` is a draft layer index), its role, its shape as a function of the DraftSpec, whether a draft
must have it, which variants have it, what conversion to each format does with it, and which static
check judges its shape. Conversion, the tensor-set validator, the leftovers check, the runtime
loader (through `key`) and the benchmarks all read this table; nothing else spells a tensor name.
Exports that wrap the body in `model.` are normalised by RENAMES before the table applies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dflash_convert.format import kinds
from dflash_convert.format.configs import DraftSpec
from dflash_convert.format.kinds.base import (  # noqa: F401  (the entry type and its actions, used by callers)
    DERIVE_IF_PRUNED, DROP, KEEP, KEEP_IF_PRUNED, Shape, Tensor, never,
)


def _pruned(spec: DraftSpec) -> bool:
    return spec.is_pruned_vocab


def _bias(spec: DraftSpec) -> bool:
    return spec.attention_bias


def _fc_hint(s: DraftSpec) -> str:
    return (f"fc input width must be len(target_layer_ids)={len(s.target_layer_ids or [])} x "
            f"target hidden {s.target_hidden}")


# The backbone every kind has (variants ()), then what a pruned vocabulary and training add; each kind's own
# entries live with the kind (format/kinds/) and sit between the two in `entries()`.
BACKBONE: tuple[Tensor, ...] = (
    Tensor("fc", "fc.weight", "context fusion fc [H, A*Ht]",
           lambda s: None if s.context_width is None else (s.hidden_size, s.context_width),
           check="fc_width", hint=_fc_hint),
    Tensor("hidden_norm", "hidden_norm.weight", "context RMSNorm", lambda s: (s.hidden_size,)),
    Tensor("norm", "norm.weight", "final RMSNorm", lambda s: (s.hidden_size,)),
    Tensor("input_layernorm", "layers.{i}.input_layernorm.weight", "layer RMSNorm", lambda s: (s.hidden_size,)),
    Tensor("post_attention_layernorm", "layers.{i}.post_attention_layernorm.weight", "layer RMSNorm",
           lambda s: (s.hidden_size,)),
    Tensor("q_proj", "layers.{i}.self_attn.q_proj.weight", "attention projection",
           lambda s: (s.num_heads * s.head_dim, s.hidden_size), check="attention_shapes"),
    Tensor("k_proj", "layers.{i}.self_attn.k_proj.weight", "attention projection",
           lambda s: (s.num_kv_heads * s.head_dim, s.hidden_size), check="attention_shapes"),
    Tensor("v_proj", "layers.{i}.self_attn.v_proj.weight", "attention projection",
           lambda s: (s.num_kv_heads * s.head_dim, s.hidden_size), check="attention_shapes"),
    Tensor("o_proj", "layers.{i}.self_attn.o_proj.weight", "attention projection",
           lambda s: (s.hidden_size, s.num_heads * s.head_dim), check="attention_shapes"),
    Tensor("q_norm", "layers.{i}.self_attn.q_norm.weight", "per-head q/k RMSNorm", lambda s: (s.head_dim,)),
    Tensor("k_norm", "layers.{i}.self_attn.k_norm.weight", "per-head q/k RMSNorm", lambda s: (s.head_dim,)),
    Tensor("gate_proj", "layers.{i}.mlp.gate_proj.weight", "MLP projection",
           lambda s: (s.intermediate_size, s.hidden_size)),
    Tensor("up_proj", "layers.{i}.mlp.up_proj.weight", "MLP projection", lambda s: (s.intermediate_size, s.hidden_size)),
    Tensor("down_proj", "layers.{i}.mlp.down_proj.weight", "MLP projection",
           lambda s: (s.hidden_size, s.intermediate_size)),
    Tensor("q_bias", "layers.{i}.self_attn.q_proj.bias", "attention projection bias",
           lambda s: (s.num_heads * s.head_dim,), needed=_bias, check="attention_shapes"),
    Tensor("k_bias", "layers.{i}.self_attn.k_proj.bias", "attention projection bias",
           lambda s: (s.num_kv_heads * s.head_dim,), needed=_bias, check="attention_shapes"),
    Tensor("v_bias", "layers.{i}.self_attn.v_proj.bias", "attention projection bias",
           lambda s: (s.num_kv_heads * s.head_dim,), needed=_bias, check="attention_shapes"),
    Tensor("o_bias", "layers.{i}.self_attn.o_proj.bias", "attention projection bias",
           lambda s: (s.hidden_size,), needed=_bias, check="attention_shapes"),
)
VOCAB_AND_COPIES: tuple[Tensor, ...] = (
    Tensor("lm_head", "lm_head.weight", "draft lm_head [draft_vocab, H]",
           lambda s: (s.draft_vocab, s.hidden_size), needed=_pruned, to_hf=KEEP_IF_PRUNED,
           to_speculators=KEEP_IF_PRUNED, drop_reason="full-vocab copy of the verifier lm_head; engines use the target's",
           check="vocab_map"),
    Tensor("d2t", "d2t", "draft->target id offsets (int64 [draft_vocab])", lambda s: (s.draft_vocab,),
           needed=_pruned, to_hf=KEEP_IF_PRUNED, to_speculators=KEEP_IF_PRUNED,
           drop_reason="identity vocab map of a full-vocab draft", check="vocab_map",
           hint=lambda s: f"the pruned lm_head [{s.draft_vocab}, {s.hidden_size}] names target ids only through "
                          "d2t (without it acceptance collapses)",
           kinds=("int",)),
    Tensor("t2d", "t2d", "target->draft membership (bool [vocab])", lambda s: (s.vocab_size,), needed=never,
           to_hf=DROP, to_speculators=DERIVE_IF_PRUNED,
           drop_reason="derivable from d2t; HF-format consumers (vLLM) skip it", check="t2d_consistency",
           dtype="BOOL", kinds=("bool", "int")),
    Tensor("embed_tokens", "embed_tokens.weight", "copy of the verifier embedding (speculators <= 0.8 saves)",
           lambda s: (s.vocab_size, s.hidden_size), needed=never, to_hf=DROP, to_speculators=DROP,
           drop_reason="copy of the verifier embedding; engines use the target's"),
    Tensor("verifier_lm_head", "verifier_lm_head.weight", "training-only verifier copy",
           lambda s: (s.draft_vocab, s.hidden_size), needed=never, to_hf=DROP, to_speculators=DROP,
           drop_reason="training-only verifier copy, never shipped"),
    Tensor("verifier_norm", "verifier_norm.weight", "training-only verifier copy", lambda s: (s.hidden_size,),
           needed=never, to_hf=DROP, to_speculators=DROP, drop_reason="training-only verifier copy, never shipped"),
)
BY_KEY = {t.key: t for t in (*BACKBONE, *VOCAB_AND_COPIES)}  # the backbone's entries, every kind's


def _check_kind(kind) -> None:
    """A kind's own entry may not reuse a key or a name of the backbone's (`entry` and `match` would find the
    backbone's first, and the kind's tensor would be judged as another)."""
    for mine in kind.tensors:
        theirs = next((t for t in BY_KEY.values() if mine.key == t.key or mine.name == t.name), None)
        if theirs is not None:
            raise ValueError(f"kind {kind.name}: tensor {mine.key!r} ({mine.name}) collides with the backbone's "
                             f"{theirs.key!r} ({theirs.name}): rename it")


for _kind in kinds.all_kinds():
    _check_kind(_kind)
kinds.CHECKS.append(_check_kind)


def entries(variant: str | None = None) -> tuple[Tensor, ...]:
    """The catalogue: every registered kind's entries (None), or those a draft of kind `variant` may have."""
    if variant is not None:
        kind = kinds.get(variant)
        return (*BACKBONE, *(kind.tensors if kind else ()), *VOCAB_AND_COPIES)
    own = dict.fromkeys(t for k in kinds.all_kinds() for t in k.tensors)
    return (*BACKBONE, *own, *VOCAB_AND_COPIES)


def entry(key: str) -> Tensor:
    """The catalogue entry of `key` (the backbone's or a registered kind's)."""
    return BY_KEY.get(key) or next(t for t in entries() if t.key == key)


# Files beside the weights that engines read, carried by conversion byte for byte (never opened here:
# mask_embedding.pt is a pickle). name -> what it is.
MASK_EMBEDDING_FILE = "mask_embedding.pt"
COMPANION_FILES: dict[str, str] = {
    MASK_EMBEDDING_FILE: "a trained embedding for the block's mask slots; vLLM and SGLang load it (weights_only) "
                         "in place of the target's embedding of mask_token_id, z-lab ignores it",
}
MAX_COMPANION_BYTES = 16 << 20  # a mask embedding is hidden x 4 bytes (x block size when per position): KB to a few MB
LAYER_KEYS = tuple(t.key for t in BACKBONE if t.per_layer)
# Exports that wrap the body in a module prefix; names are normalised before the catalogue applies.
RENAMES: tuple[tuple[str, str], ...] = ((r"model\.(.+)", r"\1"),)


def name(key: str, layer: int | None = None) -> str:
    """The tensor name of catalogue entry `key` (of draft layer `layer` for per-layer entries)."""
    t = entry(key)
    return t.name.format(i=layer) if t.per_layer else t.name


def match(tensor: str, variant: str | None) -> tuple[Tensor | None, int | None]:
    """(catalogue entry, draft layer index or None) of a tensor name."""
    for t in entries(variant):
        m = t.pattern.fullmatch(tensor)
        if m:
            return t, (int(m.group(1)) if t.per_layer else None)
    return None, None


def rule_for(tensor: str, variant: str | None = None) -> Tensor | None:
    return match(tensor, variant)[0]


# transformers' own layout (MuseGlimmerAssistantModel): the context projection sits under `encoder`; every other
# tensor keeps its catalogue name, and conversion keeps and drops tensors as for the HF format (a pruned vocabulary,
# the one case where that differs, is refused before any tensor is planned).
TRANSFORMERS_NAMES = {"fc": "encoder.fc.weight", "hidden_norm": "encoder.output_norm_enc.weight"}
_FROM_TRANSFORMERS = {TRANSFORMERS_NAMES[key]: name(key) for key in TRANSFORMERS_NAMES}


def layout_name(canonical: str, fmt: str) -> str:
    """The name a tensor has in format `fmt`'s files, from its catalogue name."""
    if fmt == "transformers":
        key = next((k for k in TRANSFORMERS_NAMES if name(k) == canonical), None)
        return TRANSFORMERS_NAMES[key] if key else canonical
    return canonical


def canonical_name(tensor: str, fmt: str | None = None) -> str:
    """The catalogue name of a tensor as found in a file of format `fmt` (None: any, by the RENAMES)."""
    if fmt == "transformers" and tensor in _FROM_TRANSFORMERS:
        return _FROM_TRANSFORMERS[tensor]
    for pattern, repl in RENAMES:
        m = re.fullmatch(pattern, tensor)
        if m and rule_for(m.expand(repl)) is not None:
            return m.expand(repl)
    return tensor


def loaded_by_engines(rule: Tensor, spec: DraftSpec) -> bool:
    """Whether engines load this tensor: what a conversion to the HF format keeps (the rest are training-only
    or copies of the target's)."""
    return tensor_action(rule, "hf", spec.is_pruned_vocab) == KEEP


def tensor_action(rule: Tensor, dest_format: str, pruned: bool) -> str:
    """keep / drop / derive for one tensor going to `dest_format`."""
    action = rule.to_hf if dest_format in ("hf", "transformers") else rule.to_speculators
    if action == KEEP_IF_PRUNED:
        return KEEP if pruned else DROP
    if action == DERIVE_IF_PRUNED:
        return "derive" if pruned else DROP
    return action


def expected_shapes(spec: DraftSpec) -> dict[str, Shape]:
    """Name -> shape of every tensor a draft of this spec must have (unsized ones left out)."""
    shapes: dict[str, Shape] = {}
    for t in entries(spec.variant):
        if t.needed(spec):
            shape = t.shape(spec)
            if shape is not None:
                shapes.update((n, shape) for n in t.names(spec))
    return shapes


def is_leftover(tensor: str, spec: DraftSpec) -> bool:
    """A tensor this checkpoint carries that conversion to its own format would drop (should not ship)."""
    rule = rule_for(tensor, spec.variant)
    return rule is not None and tensor_action(rule, spec.source_format, spec.is_pruned_vocab) == DROP


@dataclass(frozen=True)
class TensorProblem:
    kind: str  # "unexpected", "missing" or "shape"
    tensor: str
    check: str  # the static check that reports it
    message: str  # one line naming the tensor
    have: Shape | None = None
    want: Shape | None = None


def _hint(rule: Tensor, spec: DraftSpec) -> str:
    return f"; {rule.hint(spec)}" if rule.hint else ""


def tensor_problems(spec: DraftSpec, have: dict[str, Shape]) -> list[TensorProblem]:
    """The one tensor-set validator: unknown tensors, then missing ones, then wrong shapes (present
    tensors of any known entry are sized), each with the check that reports it."""
    problems = []
    for tensor in have:
        rule, layer = match(tensor, spec.variant)
        shown = tensor if len(tensor) <= 100 else tensor[:97] + "..."  # a hostile name can be megabytes long
        if rule is None:
            problems.append(TensorProblem("unexpected", tensor, "unexpected_tensors",
                                          f"unexpected tensor `{shown}` (not part of a {spec.variant} draft)"))
        elif layer is not None and layer >= spec.num_layers:
            problems.append(TensorProblem("unexpected", tensor, "unexpected_tensors", f"unexpected tensor `{shown}` "
                                          f"(the config has num_hidden_layers={spec.num_layers})"))
        elif rule.only_if_needed and not rule.needed(spec):
            problems.append(TensorProblem("unexpected", tensor, "family_shapes", f"tensor `{shown}` is present but "
                                          f"the config's keys build no such module{_hint(rule, spec)}"))
    for tensor, shape in expected_shapes(spec).items():
        if tensor not in have:
            rule = rule_for(tensor)
            check = rule.check if rule.check in ("fc_width", "vocab_map") else "missing_tensors"
            problems.append(TensorProblem("missing", tensor, check, f"tensor `{tensor}` is missing (expected shape "
                                          f"{list(shape)}){_hint(rule, spec)}", want=shape))
    for tensor, got in have.items():
        rule = rule_for(tensor, spec.variant)
        want = rule.shape(spec) if rule else None
        if want is not None and tuple(got) != want:
            problems.append(TensorProblem("shape", tensor, rule.check, f"tensor `{tensor}` has shape {list(got)}, "
                                          f"expected {list(want)}{_hint(rule, spec)}", have=tuple(got), want=want))
    return problems


def d2t_target_ids(d2t):
    """Target id of every draft id of a pruned draft: `target_id = draft_id + d2t[draft_id]` (numpy int64)."""
    import numpy as np

    d2t = np.asarray(d2t).astype(np.int64).reshape(-1)
    return np.arange(len(d2t), dtype=np.int64) + d2t


def target_id_span(target_ids) -> tuple[int, int, int]:
    """(lowest, highest, how many repeated) of the target ids d2t maps to; (0, 0, 0) for none."""
    import numpy as np

    if not len(target_ids):
        return 0, 0, 0
    return int(target_ids.min()), int(target_ids.max()), len(target_ids) - len(np.unique(target_ids))
