"""What an engine applies to a draft, and where that differs from training: views built from the engine table.

`engine_view` reads a config the way one row of the table (format/engines.py) says its engine does
(`engine_reading.read_config`) and compares the result with the draft's trained semantics (`trained_view`,
read from the DraftSpec). Every difference is a `Divergence` with a one-line consequence and the fix.
`checkpoint_views` / `serving_view` build views of an opened checkpoint, `applied_checkpoint` gives the
runtime the draft as an engine runs it, and `view_state` / `render_view` say a view in plain words.

"Trained" means speculators' training semantics, which the bundled runtime implements: sliding layers
see the context positions `>= anchor - sliding_window` (the same for every slot of the block).

Bottom layer: imports only format/ modules and errors.
"""

from __future__ import annotations

from typing import Any, Iterable, Literal

from pydantic import BaseModel, Field, computed_field

from dflash_convert.errors import DFlashError
from dflash_convert.format import catalogue, keys, kinds, mapping
from dflash_convert.format.configs import DraftSpec, Format, is_hub_id
from dflash_convert.format.engine_reading import ORDER_IDS, ConfigReading, read_config
from dflash_convert.format.kinds.base import BACKBONE_RULES, RUNTIME_ONLY
from dflash_convert.format.engines import (
    ENGINES_BY_KEY, MASK_EMBEDDING_FILE, RULE_TEXT, TRAINED_WINDOW, BlockSize, Causality, EngineRules,
    FcWidth, IdsMissing, LastLayer, NumTargetLayers, Mask, MaskEmbedding, Mixed, Verifier, Vocab, WindowMissing, WindowSemantics,
    rules_for,
)

Severity = Literal["error", "warning"]


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
    anchor_predicts: bool | None = Field(None, description="dspark: sample_from_anchor as the engine reads it "
                                                           "(true: the anchor's slot drafts too)")
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


# ----------------------------------------------------------------------------- one engine's view of a draft

def _v2_runner_only(trained: str, refusal: str) -> Divergence:
    """vLLM serves this kind of draft with its V2 model runner only."""
    return Divergence(field="architectures", severity="warning", trained=trained, applied="V2 model runner only",
                      consequence="vLLM's V1 model runner (the only one without Triton, so the CPU build's) "
                                  f"refuses it: '{refusal}'",
                      fix="serve it where the V2 model runner runs (a GPU build: VLLM_USE_V2_MODEL_RUNNER=1)")


def _fix_format(rules: EngineRules) -> str:
    return f"convert --to {rules.reads}"


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
    kind = kinds.of(spec.variant)
    if kind.engine_support == RUNTIME_ONLY:  # nothing of the engine's to read: it has no model of this kind
        view.loads = False
        div.append(Divergence(field="engine_support", severity="error", trained=kind.name, applied=None,
                              consequence=f"runtime only: no engine serves {kind.title} drafts (none has a model "
                                          "of this kind); the bundled runtime runs it",
                              fix="validate it with the bundled runtime (validate without --engine)"))
        return view
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
    _view_num_target_layers(view, rules, raw, num_target_layers)
    _view_fc_width(view, rules, spec, r, fc_shape)
    _view_attention(view, rules, spec, r)
    _view_causality(view, rules, spec, r)
    _view_v2_runner(view, rules, spec, r)
    _view_block_size(view, rules, spec, r)
    _view_vocab(view, rules, spec, r, set(tensors))
    _view_mask_token(view, rules, spec, r)
    _view_mask_embedding(view, rules, spec, r, set(files))
    _view_verifier(view, rules, spec, r)
    kinds.of(spec.variant).engine_view(view, rules, spec, raw, divergence=Divergence, v2_runner_only=_v2_runner_only)
    if view.via_conversion:
        div.insert(0, Divergence(field="format", severity="warning", trained=spec.source_format, applied=rules.reads,
                                 consequence=f"{rules.title} reads only the {rules.reads} format; shown: what it "
                                             f"reads from the output of `{_fix_format(rules)}`",
                                 fix=_fix_format(rules)))
    return view


def _view_num_target_layers(view: EngineView, rules: EngineRules, raw: dict[str, Any],
                            num_target_layers: int | None) -> None:
    """An engine that needs `num_target_layers` whatever the ids (z-lab's loader) and a config without it (a
    conversion for it made knowing the target, `num_target_layers` given, records it)."""
    known = view.via_conversion and num_target_layers is not None
    if rules.num_target_layers == NumTargetLayers.REQUIRED and raw.get("num_target_layers") is None and not known:
        view.loads = False
        view.divergences.append(Divergence(
            field="num_target_layers", severity="error", trained=None, applied=None,
            consequence=f"{rules.title} needs `num_target_layers`: "
                        f"{RULE_TEXT['num_target_layers'][rules.num_target_layers]}",
            fix="convert with --verifier TARGET (it records the target's layer count)"))


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
    """Per-layer attention type and sliding window (size and semantics)."""
    div = view.divergences
    types, window = r.layer_types, r.window
    view.layer_types = types
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
    elif sliding and rules.window_semantics == WindowSemantics.SYMMETRIC:
        div.append(Divergence(field="sliding_window", severity="warning", trained="anchor-relative",
                              applied=rules.window_semantics.value,
                              consequence=f"once the context exceeds {window} - block size tokens, block slots see "
                                          "other context positions than in training: "
                                          + RULE_TEXT["window_semantics"][rules.window_semantics],
                              fix="none in the config: keep contexts under the window, or serve the HF format"))
    elif sliding and rules.window_semantics != TRAINED_WINDOW:
        div.append(Divergence(field="sliding_window", severity="warning", trained="anchor-relative",
                              applied="per-query",
                              consequence=f"once the context exceeds {window} - block size tokens, block slot j sees "
                                          "j+1 fewer context positions than in training (acceptance may drop on "
                                          "long contexts)",
                              fix="none in the config: acceptance on prompts longer than the window shows what it costs"))


def _view_causality(view: EngineView, rules: EngineRules, spec: DraftSpec, r: ConfigReading) -> None:
    """Per-layer block causality."""
    n, causal = spec.num_layers, r.causal
    view.layer_causal, view.causal_source = causal, r.causal_source
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
        view.divergences.append(Divergence(
            field="layer_causal", severity="error", trained=spec.layer_causal, applied=causal,
            consequence="layers " + ", ".join(f"{i} ({mode(spec.layer_causal[i])} -> {mode(causal[i])})" for i in wrong)
            + " attend the block unlike in training: acceptance collapses",
            fix=fix))


def _view_v2_runner(view: EngineView, rules: EngineRules, spec: DraftSpec, r: ConfigReading) -> None:
    """Drafts vLLM serves with its V2 model runner only: mixed sliding + full layers, dflash2."""
    div, types = view.divergences, r.layer_types
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
    if sliding and len(sliding) < len(types) and rules.mixed == Mixed.V2_RUNNER:
        div.append(Divergence(field="layer_types", severity="warning", trained="mixed sliding + full",
                              applied="V2 model runner only",
                              consequence="vLLM's V1 model runner refuses drafts mixing sliding and full layers",
                              fix="run vLLM with VLLM_USE_V2_MODEL_RUNNER=1 (the default where Triton is present)"))
    kind = kinds.of(spec.variant)
    if kind.vllm_v1_refusal and kind.engine_support == BACKBONE_RULES and rules.engine == "vllm":  # (a sub-table says it)
        div.append(_v2_runner_only(kind.vllm_v1_label, kind.vllm_v1_refusal))


def _view_block_size(view: EngineView, rules: EngineRules, spec: DraftSpec, r: ConfigReading) -> None:
    """The block size and where it comes from."""
    div = view.divergences
    view.block_size, view.block_size_source = r.block, r.block_source
    if r.block is None and rules.block_size == BlockSize.SERVING_FLAG and kinds.of(spec.variant).anchor_may_propose:
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
                              fix=_block_size_fix(spec, rules)))


def _block_size_fix(spec: DraftSpec, rules: EngineRules) -> str:
    if spec.legacy_speculative_tokens is not None and rules.block_size == BlockSize.SPECULATIVE_TOKENS:
        return (f"pass num_speculative_tokens={(spec.block_size or 1) - 1} explicitly in --speculative-config: the "
                "config follows speculators' old convention, speculative_tokens = block_size (or convert it)")
    return "write block_size (convert writes it in every place engines read)"


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


# ----------------------------------------------------------------------------- checkpoint views; applied drafts

def vllm_cannot_serve_here(spec: DraftSpec) -> str | None:
    """One line saying why the vLLM CPU build (V1 model runner only: no Triton) cannot serve this draft, or None."""
    kind = kinds.of(spec.variant)
    if kind.vllm_v1_refusal:
        return (f"vLLM's CPU build runs the V1 model runner only, which refuses {kind.title} drafts: "
                f"'{kind.vllm_v1_refusal}'")
    return None


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
    if view.anchor_predicts is not None:  # dspark: the engine's block layout, not the trained one
        upd["variant_fields"] = {**spec.variant_fields, "sample_from_anchor": view.anchor_predicts}
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


# ----------------------------------------------------------------------------- in words

def rules_label(view: EngineView) -> str:
    """The engine and the version whose reading rules the view applies (not a version found installed)."""
    return f"{view.title}, by {view.version}'s rules"


def problem_only_when_asked(view: EngineView) -> bool:
    """A view that does not load for a reason of the engine's, not of this draft's (its format cannot hold the draft,
    no engine serves the kind, or the engine needs the target's layer count the draft cannot know): noted, and a
    problem only where that engine was asked for."""
    return format_cannot_hold(view) or runtime_only(view) or lacks_target_layer_count(view)


def format_cannot_hold(view: EngineView) -> bool:
    """The engine reads only a format that cannot hold this draft at all (transformers' own layout and a causal or
    pruned-vocab draft): it serves another kind of draft, rather than this one wrongly."""
    return not view.loads and any(d.field == "format" and d.severity == "error" for d in view.divergences)


def lacks_target_layer_count(view: EngineView) -> bool:
    """The engine needs `num_target_layers` beside the ids and the config has none (a conversion without
    --verifier): the one thing it lacks is the target's layer count, which the draft cannot know."""
    errors = [d.field for d in view.divergences if d.severity == "error"]
    return not view.loads and errors == ["num_target_layers"]


def runtime_only(view: EngineView) -> bool:
    """The draft's kind is served by no engine (Kind.engine_support RUNTIME_ONLY): a fact of the kind, noted, not a
    problem of this draft."""
    return not view.loads and any(d.field == "engine_support" for d in view.divergences)


def view_state(view: EngineView) -> str:
    """as trained / DIFFERS from training / does not load, and the model runner it needs, if only one serves it."""
    if format_cannot_hold(view):
        return "not served (its format cannot hold this draft)"
    if runtime_only(view):
        return "not served (runtime only: no engine serves this kind)"
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
    lines = [f"{rules_label(view)}{via}: {state}",
             f"  ids {view.target_layer_ids} ({view.target_layer_ids_source}); causal per layer {causal} "
             f"({view.causal_source}); block {view.block_size or 'unset'} ({view.block_size_source}); "
             f"vocab: {view.vocab}"
             + (f"; window {view.sliding_window} {view.window_semantics}" if view.window_semantics else "")]
    for d in view.divergences:
        lines.append(f"  {d.severity.upper()} {d.field}: {d.consequence}. Fix: {d.fix}")
    return lines


README_START, README_END = "<!-- engines-table:start -->\n", "<!-- engines-table:end -->"

