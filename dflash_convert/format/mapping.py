"""The one mapping table between the two DFlash formats, as data plus small pure functions.

- config: speculators config <-> DraftSpec <-> HF/z-lab config (layer ids, causality, vocab, block)
- verifier: what a draft needs to know of its target's config.json
(the tensors are in catalogue.py)

Facts (docs/formats.md sections 4-5): speculators `aux_hidden_state_layer_ids` = z-lab `target_layer_ids` + 1;
HF `is_causal` > `dflash_config.causal` > "sliding layers are causal" (vLLM's resolution);
speculators: full layers never causal, sliding layers causal unless `sliding_window_non_causal`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from dflash_convert.format.configs import (
    DraftSpec,
    FieldError,
    HFDFlashConfig,
    SpeculatorsDFlashConfig,
    TransformersDFlashConfig,
    VerifierRef,
    kind_keys_model,
)
from dflash_convert.errors import DFlashError
from dflash_convert.format import foreign, keys, kinds, sizes
from dflash_convert.format.sizes import short_repr as _short

AUX_ID_OFFSET = 1  # speculators aux id = z-lab target id + AUX_ID_OFFSET
QWEN3_MAX_WINDOW_LAYERS = 28  # transformers' Qwen3Config default: layers below it are full attention
SPECULATORS_VERSION = "0.9.0"  # the speculators config layout we write

# Each kind's architecture names (HF / z-lab and speculators) are the kind's (format/kinds/).


def speculators_family_keys() -> tuple[str, ...]:
    """The family keys the speculators format keeps at its top level (vLLM's speculators reader copies them)."""
    return tuple(dict.fromkeys(k.speculators for k in keys.config_keys() if k.speculators))


# dflash_config keys that are not family keys of the table (DraftSpec fields of their own)
HF_DFLASH_CONFIG_OWN = ("mask_token_id", "target_layer_ids", "block_size", "causal", "verifier")
REFUSED_ALGORITHMS = {
    "xpress": "Xpress (extra refiner heads)",
    "eagle3": "EAGLE-3 (autoregressive drafter, not a block drafter)",
    "eagle": "EAGLE (autoregressive drafter, not a block drafter)",
    "mtp": "MTP (multi-token-prediction heads)",
    "peagle": "P-EAGLE (autoregressive drafter, not a block drafter)",
}

# Keys of an HF config that are DFlash's, not the draft decoder's (everything else is decoder).
HF_DFLASH_KEYS = ("architectures", "auto_map", "block_size", "dflash_config", "num_target_layers",
                  "target_hidden_size", "draft_vocab_size", "is_causal", "dtype", "torch_dtype")
# Keys of a speculators config we read into DraftSpec fields or regenerate on write (with the kinds' keys:
# `speculators_known_keys`).
SPECULATORS_OWN_KEYS = ("speculators_model_type", "architectures", "transformer_layer_config",
                        "aux_hidden_state_layer_ids", "mask_token_id", "block_size", "draft_vocab_size",
                        "target_hidden_size", "sliding_window_non_causal", "sample_from_anchor",
                        "speculators_config", "speculators_version", "transformers_version", "auto_map",
                        "dtype", "torch_dtype", "tie_word_embeddings", "num_target_layers")


def speculators_known_keys() -> tuple[str, ...]:
    return (*SPECULATORS_OWN_KEYS, *speculators_family_keys())


# ----------------------------------------------------------------------------- detection
# HF architectures of DFlash-family drafts that are not the Qwen3-layout body this tool converts and runs
# (vLLM 0.33's model registry; a dflash draft's architecture X is served as DFlashX): refused by name.
_LAGUNA = ("a Laguna DFlash draft (vLLM laguna_dflash.py: fused qkv_proj, a softplus g_proj attention gate, "
           "one aux_hidden_norms RMSNorm per target layer): the speculators format has no Laguna kind and the "
           "runtime runs Qwen3-layout layers only, so it can be neither converted nor validated losslessly")
REFUSED_ARCHITECTURES = {
    "DFlashLagunaForCausalLM": _LAGUNA,
    "LagunaForCausalLM": _LAGUNA,
    "DFlash2BeamDraftModel": "a DFlash2 beam draft (vLLM's beam candidate head), which neither format here describes",
    "DFlashQwen3XPressModel": "an XPress draft (extra refiner heads)",
    "Qwen3XPressModel": "an XPress draft (extra refiner heads)",
    "LiLiCorrDraftModel": "a LiLiCorr draft (a correlator over candidate-head features)",
    "Qwen3OmniDSparkModel": "a Qwen3-Omni DSpark draft (vLLM's standalone Omni thinker contract)",
}  # DSpark drafts of other decoders (DeepSeek, Gemma 4, Kimi K3, Muse Spark): foreign.py


def detect_format(raw: dict[str, Any], file: str = "config.json") -> tuple[str, str]:
    """(format, variant) of a parsed config.json; refuses anything that is not DFlash."""
    algo = raw.get("speculators_model_type")
    if algo is not None:
        if not isinstance(algo, str):
            raise DFlashError(f"field `speculators_model_type`: expected a string, got {_short(algo)}", file=file)
        if kinds.get(algo) is not None:
            return "speculators", algo
        what = REFUSED_ALGORITHMS.get(algo, "an algorithm dflash-convert does not know")
        raise DFlashError(f"speculators_model_type is {algo!r}: {what}; only {kinds.said()} drafts are supported",
                          file=file)
    archs = raw.get("architectures") or []
    if not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise DFlashError(f"field `architectures`: expected a list of strings, got {_short(archs)}", file=file)
    if raw.get("model_type") == TRANSFORMERS_MODEL_TYPE or TRANSFORMERS_ARCHITECTURE in archs:
        return "transformers", TRANSFORMERS_KIND
    for kind in kinds.all_kinds():
        if kind.hf_architecture in archs:
            return "hf", kind.name
    for kind in kinds.all_kinds():
        if any(arch in archs and raw.get("model_type") == model_type for arch, model_type in kind.hf_aliases):
            return "hf", kind.name
    if (other := foreign.identify(raw)) is not None:
        raise DFlashError(other[1].line(other[0], other[2]), file=file)
    refused = next((a for a in archs if a in REFUSED_ARCHITECTURES), None)
    if refused is not None:
        handled = kinds.in_words([k.hf_architecture for k in kinds.all_kinds()])
        raise DFlashError(f"architectures {_short(archs)}: {refused} is {REFUSED_ARCHITECTURES[refused]}; "
                          f"dflash-convert handles {handled} drafts", file=file)
    if "dflash_config" in raw:
        return "hf", DEFAULT_KIND
    found = f"architectures {archs}" if archs else "no architectures and no speculators_model_type"
    raise DFlashError(f"not a DFlash checkpoint config ({found}; expected "
                      f"speculators_model_type 'dflash' or architectures ['DFlashDraftModel'])", file=file)


_TYPE_TAGS = re.compile(r"int|str|float|bool|.*\[.*")  # union branches pydantic adds to an error's location


def _parse(model, raw: dict, file: str):
    """The config model validated from `raw`; the first problem as one error naming the file and the field."""
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = [str(p) for p in err["loc"] if not _TYPE_TAGS.fullmatch(str(p))]
        cause = (err.get("ctx") or {}).get("error")
        if isinstance(cause, FieldError):  # a model validator: relation between fields
            loc.append(cause.field)
            raise DFlashError(f"field `{'.'.join(loc)}` {cause}"[:400], file=file) from None
        where = ".".join(loc) or "(top level)"
        raise DFlashError(f"field `{where}`: {err['msg']} (got {_short(err.get('input'))})"[:400], file=file) from None


# ----------------------------------------------------------------------------- layers & causality

def resolve_layer_types(decoder: dict[str, Any]) -> list[str]:
    """Per-layer attention type; Qwen3's rule when `layer_types` is absent."""
    n = decoder["num_hidden_layers"]
    types = decoder.get("layer_types")
    if types:
        if len(types) != n:
            raise DFlashError(f"layer_types has {len(types)} entries for num_hidden_layers={n}")
        return list(types)
    window = qwen3_window(decoder)
    start = decoder.get("max_window_layers")
    start = QWEN3_MAX_WINDOW_LAYERS if start is None else start
    return ["sliding_attention" if window is not None and i >= start else "full_attention" for i in range(n)]


def qwen3_window(decoder: dict[str, Any]) -> int | None:
    """transformers' Qwen3Config: `sliding_window` is null unless `use_sliding_window`."""
    return decoder.get("sliding_window") if decoder.get("use_sliding_window") else None


def hf_layer_causal(layer_types: list[str], is_causal: bool | None, causal: bool | None) -> list[bool]:
    """vLLM's resolution for HF configs: `is_causal`, then `dflash_config.causal`, then sliding = causal."""
    flag = is_causal if is_causal is not None else causal
    if flag is not None:
        return [bool(flag)] * len(layer_types)
    return [t == "sliding_attention" for t in layer_types]


def speculators_layer_causal(layer_types: list[str], sliding_window_non_causal: bool) -> list[bool]:
    """speculators: full layers are never causal; sliding ones unless `sliding_window_non_causal`."""
    return [t == "sliding_attention" and not sliding_window_non_causal for t in layer_types]


def build_target_layer_ids(num_target_layers: int, num_draft_layers: int) -> list[int]:
    """The published rule z-lab and SGLang use when a config has no target_layer_ids."""
    if num_draft_layers == 1:
        return [num_target_layers // 2]
    span = num_target_layers - 4
    return [round(1 + i * span / (num_draft_layers - 1)) for i in range(num_draft_layers)]


def aux_ids_from_target(target_layer_ids: list[int]) -> list[int]:
    return [i + AUX_ID_OFFSET for i in target_layer_ids]


def target_ids_from_aux(aux_ids: list[int]) -> list[int]:
    """z-lab ids from speculators aux ids (configs refuse aux id 0, the embedding output, when parsing)."""
    return [a - AUX_ID_OFFSET for a in aux_ids]


# ----------------------------------------------------------------------------- config -> spec

def spec_from_config(raw: dict[str, Any], file: str = "config.json") -> DraftSpec:
    fmt, variant = detect_format(raw, file)
    if fmt == "transformers":
        return _spec_from_transformers(raw, file)
    return _spec_from_speculators(raw, variant, file) if fmt == "speculators" else _spec_from_hf(raw, variant, file)


def _spec_from_speculators(raw: dict, variant: str, file: str) -> DraftSpec:
    cfg = _parse(SpeculatorsDFlashConfig, raw, file)
    if cfg.anchor_predicts and not kinds.of(variant).anchor_may_propose:
        raise DFlashError("field `sample_from_anchor` is true: the anchor slot predicts a token (DSpark style), "
                          "which DFlash engines do not run", file=file)
    decoder = dict(raw["transformer_layer_config"])
    layer_types = resolve_layer_types(decoder)
    non_causal = cfg.sliding_window_non_causal
    if non_causal is None:
        non_causal = kinds.of(variant).speculators_non_causal_default
    verifier = cfg.speculators_config.verifier if cfg.speculators_config else None
    vocab = cfg.transformer_layer_config.vocab_size
    target_layer_ids = None if cfg.aux_hidden_state_layer_ids is None else target_ids_from_aux(
        cfg.aux_hidden_state_layer_ids)
    hf_ids = (raw.get("dflash_config") or {}).get("target_layer_ids") if isinstance(raw.get("dflash_config"), dict) \
        else None
    if hf_ids is not None and hf_ids != target_layer_ids:
        # Read as speculators (vLLM does), but an HF reader (SGLang, z-lab) of the same file takes the other list.
        raise DFlashError(f"field `dflash_config.target_layer_ids` {_short(hf_ids)} contradicts "
                          f"`aux_hidden_state_layer_ids` {_short(cfg.aux_hidden_state_layer_ids)} (= target_layer_ids "
                          f"{target_layer_ids}): engines reading the HF keys would feed the draft other target "
                          "layers; keep one of the two", file=file)
    return DraftSpec(
        source_format="speculators",
        variant=variant,
        decoder=decoder,
        block_size=cfg.block_size,
        mask_token_id=cfg.mask_token_id,
        target_layer_ids=target_layer_ids,
        layer_types=layer_types,
        layer_causal=speculators_layer_causal(layer_types, non_causal),
        causal_flag=None,
        draft_vocab_size=cfg.draft_vocab_size if cfg.draft_vocab_size not in (None, vocab) else None,
        num_target_layers=cfg.num_target_layers,
        target_hidden_size=cfg.target_hidden_size,
        verifier=VerifierRef.model_validate(verifier.model_dump()) if verifier and verifier.name_or_path else None,
        variant_fields=_speculators_fields(raw, variant, file),
        extra={k: v for k, v in raw.items() if k not in speculators_known_keys()},
        dtype=raw.get("dtype") or raw.get("torch_dtype"),
        legacy_speculative_tokens=cfg.block_size if cfg.legacy_speculative_tokens else None,
    )


def legacy_speculative_tokens_warning(spec: DraftSpec) -> str | None:
    """What a user must know about a config in speculators' pre-2026-04-21 convention (None for others)."""
    if spec.legacy_speculative_tokens is None or spec.block_size is None:
        return None
    b = spec.block_size
    return (f"speculators_config.proposal_methods[0].speculative_tokens is {spec.legacy_speculative_tokens}, equal to "
            f"block_size {b}: speculators' old DFlash convention (before its PR #456, 2026-04-21; the first slot "
            f"re-predicts the anchor, so a block of {b} drafts {b - 1} tokens). vLLM takes num_speculative_tokens from "
            f"this field and would serve {b} speculative tokens, {b + 1} slots per step, one past the trained block: "
            f"pass num_speculative_tokens={b - 1} explicitly in --speculative-config, or convert (writes "
            f"speculative_tokens = {b - 1})")


def _speculators_fields(raw: dict, variant: str, file: str) -> dict[str, Any]:
    """The family keys of a speculators config under speculators' names, absent ones as its class fills them."""
    out = {}
    for k in keys.keys_for(variant):
        if k.speculators and raw.get(k.speculators) is not None:
            out[k.name] = raw[k.speculators]
        elif k.filled:
            out[k.name] = k.filled[0]
    return _typed(variant, out, lambda k: k.speculators, file)


def _typed(variant: str, fields: dict[str, Any], path, file: str) -> dict[str, Any]:
    """`fields`, once the kind's typed keys hold values of their type (ConfigKey.typed); `path(key)` names a key in
    the file. The config models check the built-in kinds' keys already; a kind registered later is checked here."""
    try:
        kind_keys_model(kinds.of(variant)).model_validate(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        key = kinds.of(variant).key(str(err["loc"][0]))
        raise DFlashError(f"field `{path(key)}`: {err['msg']} (got {_short(err.get('input'))})"[:400],
                          file=file) from None
    return fields


def _hf_fields(raw: dict, raw_dc: dict, variant: str, file: str) -> dict[str, Any]:
    """The family keys of an HF config: DSpark's at the top level (or, failing that, in dflash_config, where
    published drafts nest them and SGLang looks first), the rest in dflash_config."""
    out = {}
    for k in keys.keys_for(variant):
        top, nested = raw.get(k.name) if k.hf_top else None, raw_dc.get(k.name)
        if k.hf_top and top is not None and nested is not None and top != nested:
            raise DFlashError(f"field `{k.name}` is {_short(top)} but `dflash_config.{k.name}` is {_short(nested)}: "
                              "vLLM reads the top-level one, SGLang the dflash_config one; keep one", file=file)
        value = top if top is not None else nested
        if value is None and k.hf_filled:
            value = k.hf_filled[0]
        if value is not None:
            out[k.name] = value
    if contradiction := kinds.of(variant).check_hf_fields(raw, out):
        raise DFlashError(contradiction, file=file)
    return _typed(variant, out, lambda k: k.hf_path, file)


def _spec_from_hf(raw: dict, variant: str, file: str) -> DraftSpec:
    cfg = _parse(HFDFlashConfig, raw, file)
    dc = cfg.dflash_config
    top, nested = cfg.block_size, dc.block_size  # equal when both are set (HFDFlashConfig checks)
    own = HF_DFLASH_KEYS + kinds.of(variant).hf_own_keys()
    decoder = {k: v for k, v in raw.items() if k not in own}
    layer_types = resolve_layer_types(decoder)
    raw_dc = raw.get("dflash_config") or {}
    return DraftSpec(
        source_format="hf",
        variant=variant,
        decoder=decoder,
        block_size=nested if nested is not None else top,
        mask_token_id=dc.mask_token_id,
        target_layer_ids=dc.target_layer_ids,
        layer_types=layer_types,
        layer_causal=hf_layer_causal(layer_types, cfg.is_causal, dc.causal),
        causal_flag=cfg.is_causal if cfg.is_causal is not None else dc.causal,
        draft_vocab_size=cfg.draft_vocab_size if cfg.draft_vocab_size not in (None, cfg.vocab_size) else None,
        num_target_layers=cfg.num_target_layers,
        target_hidden_size=cfg.target_hidden_size,
        verifier=dc.verifier if dc.verifier and dc.verifier.name_or_path else None,
        variant_fields=_hf_fields(raw, raw_dc, variant, file),
        # dflash_config keys no engine in the key table reads: carried to HF, said when written elsewhere
        extra={"dflash_config": unknown} if (unknown := {k: v for k, v in raw_dc.items() if k not in
                                                         HF_DFLASH_CONFIG_OWN and k not in keys.by_name()}) else {},
        dtype=raw.get("dtype") or raw.get("torch_dtype"),
    )


# ----------------------------------------------------------------------------- spec -> config

# Decoder keys some DFlash drafts carry that change the math away from plain Qwen3 (z-lab's
# modeling code applies them); the value at which each is a no-op.
NEUTRAL_DECODER_KEYS = {"input_embedding_scale": 1.0, "output_multiplier": 1.0, "final_logit_softcapping": None,
                        "attn_logit_softcapping": None}


def non_qwen3_features(spec: DraftSpec) -> list[str]:
    """`key=value` for every decoder key whose value makes the draft differ from the Qwen3 math."""
    return [f"{k}={spec.decoder[k]!r}" for k, neutral in NEUTRAL_DECODER_KEYS.items()
            if k in spec.decoder and spec.decoder[k] != neutral] + [
        f"{keys.key_for(spec.variant, k).hf_path}={v!r}" for k, v in spec.variant_fields.items()
        if not keys.key_for(spec.variant, k).required and not keys.key_for(spec.variant, k).is_neutral(v)]


def with_block_size(raw: dict[str, Any], block_size: int) -> dict[str, Any]:
    """`raw` with a block size the user supplies (--block-size) where the config states none (top level, or an HF
    config's dflash_config): read as if the config held it. A config that states one is returned as it is."""
    nested = raw.get("dflash_config")
    if "block_size" in raw or (isinstance(nested, dict) and "block_size" in nested):
        return raw
    return {**raw, "block_size": block_size}


def check_complete(spec: DraftSpec, file: str | None = None, raw: dict[str, Any] | None = None) -> None:
    """What every engine needs before a config can be written (`file`: the config it came from, `raw`: its keys,
    for a misspelled one)."""
    missing = [name for name, value in (("block_size", spec.block_size), ("mask_token_id", spec.mask_token_id),
                                        ("target_layer_ids", spec.target_layer_ids)) if value is None]
    if missing:
        hint = {"block_size": "--block-size", "mask_token_id": "--mask-token-id",
                "target_layer_ids": "--target-layer-ids (or --derive-target-layer-ids with --verifier)"}
        raise DFlashError("config has no " + ", ".join(f"`{m}` (pass {hint[m]}{typo_hint(raw, m)})" for m in missing),
                          file=file)


def spec_to_hf(spec: DraftSpec) -> tuple[dict[str, Any], list[str]]:
    """HF / z-lab config.json for a spec, and the warnings a user must see."""
    check_complete(spec)
    warnings: list[str] = []
    decoder = {k: v for k, v in spec.decoder.items() if k not in HF_DFLASH_KEYS}
    out: dict[str, Any] = {"architectures": [kinds.of(spec.variant).hf_architecture]}
    out.update(decoder)
    out.setdefault("model_type", "qwen3")
    out["layer_types"] = list(spec.layer_types)
    out["block_size"] = spec.block_size
    if spec.num_target_layers is not None:
        out["num_target_layers"] = spec.num_target_layers
    if spec.target_hidden_size is not None:
        out["target_hidden_size"] = spec.target_hidden_size
    if spec.is_pruned_vocab:
        out["draft_vocab_size"] = spec.draft_vocab_size
    if spec.dtype:
        out["dtype"] = spec.dtype
    if "sliding_attention" in spec.layer_types and spec.sliding_window is not None:
        # transformers' Qwen3Config (which vLLM, SGLang and z-lab load HF configs through) nulls
        # sliding_window unless use_sliding_window is true: without it the sliding layers lose their window.
        out["use_sliding_window"] = True
    dc: dict[str, Any] = {"mask_token_id": spec.mask_token_id, "target_layer_ids": list(spec.target_layer_ids),
                          "block_size": spec.block_size}
    if len(set(spec.layer_causal)) == 1:
        # SGLang and z-lab read only the top-level flag, vLLM reads it first: write both.
        out["is_causal"] = spec.layer_causal[0]
        dc["causal"] = spec.layer_causal[0]
    else:
        default = hf_layer_causal(spec.layer_types, None, None)
        if default != spec.layer_causal:
            raise DFlashError(f"per-layer causality {spec.layer_causal} cannot be written in an HF config "
                              "(only one all-layer flag, or 'sliding layers causal', exists)")
        warnings.append("mixed draft: full_attention layers are non-causal and sliding_attention layers causal; "
                        "is_causal and dflash_config.causal are left unset and layer_types kept, the per-layer "
                        "default of vLLM, SGLang and z-lab (vLLM's V1 model runner refuses mixed drafts: "
                        "VLLM_USE_V2_MODEL_RUNNER=1)")
    if spec.verifier:
        dc["verifier"] = spec.verifier.model_dump(exclude_none=True)
    for name, value in spec.extra.items():
        if keys.changes_computation(name, value, spec.variant):
            raise DFlashError(f"field `{name}` = {_short(value)} sits at the top level of a speculators config, "
                              f"where neither speculators nor vLLM's speculators reader applies it (the draft was "
                              f"trained without it), but HF readers apply `dflash_config.{name}` "
                              f"({keys.by_name()[name].readers}: {keys.by_name()[name].effect}); remove it first")
    dc.update(spec.extra.get("dflash_config") or {})
    for name, value in spec.variant_fields.items():
        key = keys.key_for(spec.variant, name)
        if key.hf_top:
            out[name] = value  # DSpark: vLLM reads these only at the top level
        elif not key.is_neutral(value):
            dc[name] = value
    out["dflash_config"] = dc
    return out, warnings


def spec_to_speculators(spec: DraftSpec) -> tuple[dict[str, Any], list[str]]:
    """speculators 0.9.0 config.json for a spec, and the warnings a user must see."""
    check_complete(spec)
    non_causal, warnings = _sliding_window_non_causal(spec)
    decoder = dict(spec.decoder)
    decoder["layer_types"] = list(spec.layer_types)
    if spec.target_hidden_size not in (None, spec.hidden_size):
        warnings.append(f"target_hidden_size {spec.target_hidden_size} differs from the draft hidden size "
                        f"{spec.hidden_size}: vLLM reads it, but speculators' own model sizes fc from the draft "
                        "hidden size and will not load this checkpoint")
    verifier = spec.verifier or VerifierRef()
    if not verifier.name_or_path:
        warnings.append("speculators_config.verifier.name_or_path is unknown (vLLM requires it): pass --verifier")
    draft_vocab = spec.draft_vocab
    kind = kinds.of(spec.variant)
    if refusal := kind.speculators_refusal(spec.variant_fields):
        raise DFlashError(refusal)
    anchor = kind.anchor_predicts(spec.variant_fields)
    out: dict[str, Any] = {
        "architectures": [kind.speculators_architecture],
        "speculators_model_type": spec.variant,
        "transformer_layer_config": decoder,
        "aux_hidden_state_layer_ids": aux_ids_from_target(spec.target_layer_ids),
        "mask_token_id": spec.mask_token_id,
        "block_size": spec.block_size,
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": spec.target_hidden_size,
        "sliding_window_non_causal": non_causal,
        "sample_from_anchor": anchor,
        "speculators_config": {
            "algorithm": spec.variant,
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": kind.proposals(spec.block_size,
                                                                                                spec.variant_fields),
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "default_proposal_method": "greedy",
            "verifier": {"name_or_path": verifier.name_or_path, "architectures": list(verifier.architectures)},
        },
        "speculators_version": SPECULATORS_VERSION,
        "tie_word_embeddings": False,
    }
    if spec.num_target_layers is not None:
        out["num_target_layers"] = spec.num_target_layers
    if spec.dtype:
        out["dtype"] = spec.dtype
    for name, value in spec.variant_fields.items():
        key = keys.key_for(spec.variant, name)
        if key.speculators:
            out[key.speculators] = value
        elif not key.is_neutral(value):
            raise DFlashError(f"field `{key.hf_path}` = {_short(value)} ({key.readers}: {key.effect}) has no "
                              "field in the speculators format that an engine reads (vLLM's speculators reader "
                              "rebuilds dflash_config without it), so the converted draft would be served "
                              "differently; keep this draft in the HF format")
    extra = dict(spec.extra)
    if dropped := extra.pop("dflash_config", None):
        warnings.append(f"dflash_config keys no engine is known to read are not written to the speculators "
                        f"format: {', '.join(sorted(dropped))}")
    out.update(extra)
    return out, warnings


def _sliding_window_non_causal(spec: DraftSpec) -> tuple[bool, list[str]]:
    """speculators' one causality flag (`sliding_window_non_causal`) for the spec's layers, and the warning a
    mixed draft gets; raises where the one flag cannot state them."""
    warnings: list[str] = []
    sliding = [i for i, t in enumerate(spec.layer_types) if t == "sliding_attention"]
    causal_full = [i for i, t in enumerate(spec.layer_types) if t == "full_attention" and spec.layer_causal[i]]
    if causal_full:
        raise DFlashError(f"draft layers {causal_full} are full_attention and causal; speculators can only make "
                          "sliding_attention layers causal (full layers are always bidirectional), "
                          "so this draft cannot be written in the speculators format")
    sliding_causal = {spec.layer_causal[i] for i in sliding}
    if len(sliding_causal) > 1:
        raise DFlashError("sliding_attention layers differ in causality; speculators has one flag "
                          "(sliding_window_non_causal) for all of them")
    # With no sliding layers the flag means nothing to speculators (full layers are never causal), but
    # vLLM applies `causal = not sliding_window_non_causal` to EVERY layer: true keeps them non-causal there.
    non_causal = (not sliding_causal.pop()) if sliding_causal else True
    if sliding and len(sliding) < spec.num_layers and not non_causal:
        warnings.append("mixed draft (sliding causal + full non-causal): vLLM's speculators reader applies one "
                        "causality flag to every layer and would serve the full layers causally; serve vLLM the "
                        "HF format (convert --to hf), which it reads per layer")
    return non_causal, warnings


def spec_to_config(spec: DraftSpec, fmt: str) -> tuple[dict[str, Any], list[str]]:
    writers = {"hf": spec_to_hf, "speculators": spec_to_speculators, "transformers": spec_to_transformers}
    config, warnings = writers[fmt](spec)
    # What we write passes the checks every read applies (overrides and derived values included).
    spec_from_config(config, file=f"the {fmt} config.json to be written")
    return config, warnings


# ----------------------------------------------------------------------------- transformers' own layout

# transformers (5.19 and 5.24) ships DFlash itself: MuseGlimmerAssistantConfig / MuseGlimmerAssistantModel, run by
# generate(speculation_type="dflash"). Its config is flat with the DFlash keys at the top level; its layers are
# Qwen3's (QK-norm, SwiGLU, no biases), bidirectional only, sliding per layer_types; it has no lm_head (candidates
# come from the target's output embeddings) and no module beyond fc + norm + layers.
TRANSFORMERS_MODEL_TYPE = "muse_glimmer_assistant"
TRANSFORMERS_KIND = "dflash"  # the one kind its layout holds
DEFAULT_KIND = "dflash"  # an HF config with a dflash_config and no architecture of a kind
TRANSFORMERS_ARCHITECTURE = "MuseGlimmerAssistantModel"
# MuseGlimmerAssistantConfig's class defaults: what transformers acts on for an absent key (layer_types: all
# sliding). vocab_size is no field of that class: vLLM 0.33's reader fills 202048 (Muse Glimmer's vocabulary).
TRANSFORMERS_DEFAULTS: dict[str, Any] = {
    "hidden_size": 6656, "intermediate_size": 19968, "num_hidden_layers": 5, "num_attention_heads": 32,
    "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-5, "max_position_embeddings": 131072,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "sliding_window": 2048,
    "hidden_act": "silu", "block_size": 16, "mask_token_id": 201818, "target_layer_ids": [1, 13, 25, 37, 49],
    "vocab_size": 202048, "bos_token_id": 200000, "eos_token_id": 200001, "pad_token_id": 200018}
# dflash_config keys the writer copies for vLLM, whose V1 model runner takes the target layer ids only from
# dflash_config (0.32 and 0.33) and 0.32 its causality too (0.33 adds causal: false for this model type itself);
# None: the top-level value. The reader accepts them where they say what transformers does.
TRANSFORMERS_VLLM_COPIES: dict[str, Any] = {"causal": False, "target_layer_ids": None}
# Keys of the native config that are DFlash's or the file's, not the draft decoder's.
TRANSFORMERS_OWN_KEYS = ("architectures", "model_type", "is_causal", "dflash_config", "block_size",
                         "mask_token_id", "target_layer_ids", "num_target_layers", "verifier", "dtype", "torch_dtype",
                         "transformers_version")
# Qwen3 decoder keys the native config states otherwise (layer_types, rope_parameters) or has no use for.
QWEN3_LAYOUT_KEYS = ("model_type", "use_sliding_window", "max_window_layers", "rope_theta", "rope_scaling",
                     "attention_bias", "tie_word_embeddings")
NON_CAUSAL_HINT = ("a draft trained causal may still be served non-causal (convert --non-causal; "
                   "validate says what it then accepts)")


def _check_transformers_copies(raw: dict, filled: dict, file: str) -> None:
    """`is_causal` and `dflash_config` are for vLLM (transformers ignores them): they must say what transformers
    does (non-causal, the top-level values), or the engines would run different drafts."""
    if raw.get("is_causal"):
        raise DFlashError(f"field `is_causal` is {_short(raw['is_causal'])}: transformers' MuseGlimmerAssistantModel "
                          "attends bidirectionally and ignores it, but vLLM reads it; remove it", file=file)
    dc = raw.get("dflash_config") or {}
    if not isinstance(dc, dict):
        raise DFlashError(f"field `dflash_config` is {_short(dc)}, not an object", file=file)
    wanted = {**TRANSFORMERS_VLLM_COPIES, **{k: filled[k] for k in TRANSFORMERS_VLLM_COPIES if k in filled}}
    for key, value in dc.items():
        if key not in wanted or value != wanted[key]:
            said = f"is {_short(value)} but transformers acts on {_short(wanted[key])}" if key in wanted else \
                "is a key transformers ignores"
            raise DFlashError(f"field `dflash_config.{key}` {said}, while vLLM reads it; remove it", file=file)


def _spec_from_transformers(raw: dict, file: str) -> DraftSpec:
    filled = {**TRANSFORMERS_DEFAULTS, **raw}
    _check_transformers_copies(raw, filled, file)
    if "rope_parameters" not in raw and ("rope_theta" in raw or "rope_scaling" in raw):
        del filled["rope_parameters"]  # legacy keys: transformers folds them into rope_parameters
    if filled.get("layer_types") is None:  # omitted or null: the class's default, as transformers fills it
        filled["layer_types"] = ["sliding_attention"] * filled["num_hidden_layers"]
    cfg = _parse(TransformersDFlashConfig, filled, file)
    if cfg.attention_bias:
        raise DFlashError("field `attention_bias` is true: transformers' MuseGlimmerAssistantModel has no "
                          "attention biases", file=file)
    for k in keys.keys_for(TRANSFORMERS_KIND):
        if not k.is_neutral(raw.get(k.name)):
            raise DFlashError(f"field `{k.name}` = {_short(raw[k.name])} ({k.readers}: {k.effect}) has no place in "
                              "transformers' MuseGlimmerAssistantModel, which would ignore it", file=file)
    decoder = {k: v for k, v in filled.items() if k not in TRANSFORMERS_OWN_KEYS}
    layer_types = resolve_layer_types(decoder)
    decoder.update(model_type="qwen3", use_sliding_window="sliding_attention" in layer_types)
    verifier = cfg.verifier if cfg.verifier and cfg.verifier.name_or_path else None
    return DraftSpec(source_format="transformers", variant=TRANSFORMERS_KIND, decoder=decoder, block_size=cfg.block_size,
                     mask_token_id=cfg.mask_token_id, target_layer_ids=list(cfg.target_layer_ids),
                     layer_types=layer_types, layer_causal=[False] * len(layer_types),
                     num_target_layers=cfg.num_target_layers, verifier=verifier,
                     dtype=raw.get("dtype") or raw.get("torch_dtype"))


def transformers_refusals(spec: DraftSpec) -> list[str]:
    """Why transformers' own layout cannot state this draft (empty: it can)."""
    out = []
    if spec.variant != TRANSFORMERS_KIND:
        modules = kinds.of(spec.variant).modules or "modules"
        out.append(f"a {spec.variant} draft: transformers' MuseGlimmerAssistantModel has no {modules} "
                   f"(it holds {TRANSFORMERS_KIND} drafts only)")
    if spec.is_pruned_vocab:
        out.append(f"a pruned vocabulary (lm_head [{spec.draft_vocab_size}, {spec.hidden_size}] + d2t): transformers "
                   "drafts over the target's output embeddings and has no place for the draft's own lm_head")
    if causal := [i for i, c in enumerate(spec.layer_causal) if c]:
        out.append(f"draft layers {causal} are causal and transformers' MuseGlimmerAssistantModel attends "
                   f"bidirectionally only; {NON_CAUSAL_HINT}")
    if spec.target_hidden_size not in (None, spec.hidden_size):
        out.append(f"target_hidden_size {spec.target_hidden_size} differs from hidden_size {spec.hidden_size}: "
                   "transformers sizes encoder.fc as len(target_layer_ids) x hidden_size")
    if spec.attention_bias:
        out.append("attention_bias is true: transformers' MuseGlimmerAssistantModel has no attention biases")
    if features := non_qwen3_features(spec):
        out.append(f"{', '.join(features)}: engine-read keys transformers' MuseGlimmerAssistantModel has no "
                   "place for")
    return out


def _rope_parameters(spec: DraftSpec) -> dict[str, Any]:
    params = dict(spec.decoder.get("rope_parameters") or spec.decoder.get("rope_scaling") or {})
    if "type" in params and "rope_type" not in params:
        params["rope_type"] = params.pop("type")
    params.setdefault("rope_type", "default")
    params["rope_theta"] = spec.rope_theta
    return params


def spec_to_transformers(spec: DraftSpec) -> tuple[dict[str, Any], list[str]]:
    """config.json of transformers' own layout (MuseGlimmerAssistantConfig) for a spec, and the warnings."""
    check_complete(spec)
    if refusals := transformers_refusals(spec):
        raise DFlashError(f"transformers' own layout cannot hold this draft: {refusals[0]}"
                          + (f" (and {len(refusals) - 1} more)" if len(refusals) > 1 else ""))
    # is_causal false: transformers ignores it, vLLM 0.32 (which lacks 0.33's non-causal override for this model
    # type) resolves causality from it before layer_types
    out: dict[str, Any] = {"architectures": [TRANSFORMERS_ARCHITECTURE], "model_type": TRANSFORMERS_MODEL_TYPE,
                           "is_causal": False}
    out.update({k: v for k, v in spec.decoder.items() if k not in QWEN3_LAYOUT_KEYS and k not in HF_DFLASH_KEYS
                and not (v is None and k in TRANSFORMERS_DEFAULTS)})
    # every key whose class default is another model's, stated (the special ids do not change what is drafted)
    out.update(num_key_value_heads=spec.num_kv_heads, head_dim=spec.head_dim, rms_norm_eps=spec.rms_norm_eps,
               hidden_act=spec.hidden_act, rope_parameters=_rope_parameters(spec), layer_types=list(spec.layer_types),
               block_size=spec.block_size, mask_token_id=spec.mask_token_id,
               target_layer_ids=list(spec.target_layer_ids))
    for special in ("bos_token_id", "eos_token_id", "pad_token_id"):  # the class takes one id or null
        value = spec.decoder.get(special)
        out[special] = value if type(value) is int else None
    out["dflash_config"] = {**TRANSFORMERS_VLLM_COPIES, "target_layer_ids": list(spec.target_layer_ids)}
    if spec.num_target_layers is not None:
        out["num_target_layers"] = spec.num_target_layers
    if spec.verifier:
        out["verifier"] = spec.verifier.model_dump(exclude_none=True)
    if spec.dtype:
        out["dtype"] = spec.dtype
    warnings = []
    if spec.extra:
        warnings.append("keys no engine is known to read are not written to transformers' layout: "
                        f"{', '.join(sorted(spec.extra))}")
    return out, warnings


# ----------------------------------------------------------------------------- what a conversion did to the config

# The same fact at a different place in each layout: canonical name -> (speculators path, HF path); with the
# kinds' keys: `config_aliases`.
CONFIG_ALIASES = {
    "target_layer_ids": ("aux_hidden_state_layer_ids", "dflash_config.target_layer_ids"),
    "mask_token_id": ("mask_token_id", "dflash_config.mask_token_id"),
    "verifier": ("speculators_config.verifier", "dflash_config.verifier"),
}


def config_aliases() -> dict[str, tuple[str, str]]:
    return {**CONFIG_ALIASES, **{k.name: (k.speculators or k.name, k.hf_path) for k in keys.by_name().values()}}
# Why a key appears or disappears by design (canonical name or prefix -> reason).
CONFIG_CHANGE_REASONS = {
    "is_causal": "SGLang and z-lab read only this top-level flag (vLLM reads it first)",
    "dflash_config.causal": "vLLM's HF reader: causality of every layer",
    "dflash_config.block_size": "newer readers look here first; written beside the top-level block_size",
    "sliding_window_non_causal": "speculators' causality flag; the HF format says it with is_causal / layer_types",
    "use_sliding_window": "transformers' Qwen3Config drops sliding_window unless this is true",
    "speculators_config": "speculators' proposal block: speculative_tokens = block_size - 1, the verifier",
    "speculators_model_type": "the speculators format's marker (HF: architectures)",
    "speculators_version": "speculators' own version stamp",
    "transformers_version": "version stamp of the writer",
    "auto_map": "points at modeling / config code that a converted checkpoint does not ship",
    "sample_from_anchor": "speculators-only flag (always false for DFlash)",
    "dspark_bonus_anchor": "what vLLM's speculators reader derives (not sample_from_anchor); no reader of this layout "
                           "needs it",
    "tie_word_embeddings": "speculators' field (DFlash drafts never tie)",
    "model_type": "the flat config's model type (HF format: qwen3; transformers' own: muse_glimmer_assistant)",
    "max_window_layers": "transformers' own layout states layer_types instead of Qwen3's rule",
    "attention_bias": "false here: transformers' own layout has no attention biases",
    "layer_types": "written explicitly so no reader falls back to a default",
    "draft_vocab_size": "written only for a pruned vocabulary in the HF format (speculators always writes it)",
    "num_target_layers": "the verifier's layer count (--verifier)",
    "target_hidden_size": "the HF format writes it only when known; the speculators format always has the key "
                          "(null: unknown, the draft's hidden size is used)",
    "dtype": "the weights' dtype (--dtype or the source's)",
    "torch_dtype": "legacy name of dtype",
    "rope_parameters": "written whole: MuseGlimmerAssistantConfig's default rope_theta (500000) is not Qwen3's",
    "head_dim": "written explicitly: MuseGlimmerAssistantConfig's default (128) is not the draft's",
    "num_key_value_heads": "written explicitly: MuseGlimmerAssistantConfig's default (8) is not the draft's",
    "rms_norm_eps": "written explicitly: MuseGlimmerAssistantConfig's default (1e-5) is not Qwen3's",
    "bos_token_id": "written as null: MuseGlimmerAssistantConfig's defaults are Muse Glimmer's token ids",
    "pad_token_id": "written as null: MuseGlimmerAssistantConfig's defaults are Muse Glimmer's token ids",
    "eos_token_id": "written as null: MuseGlimmerAssistantConfig's defaults are Muse Glimmer's token ids",
}


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value and all(isinstance(k, str) and k for k in value):
        out: dict[str, Any] = {}
        for k, v in value.items():
            out.update(_flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: value}


def _canonical_config(raw: dict[str, Any], fmt: str) -> dict[str, tuple[str, Any]]:
    """canonical key -> (path in this layout, value); the decoder's keys are flat in both layouts."""
    side = 0 if fmt == "speculators" else 1
    # transformers' own layout keeps every DFlash key at the top level under its canonical name
    by_path = {} if fmt == "transformers" else {paths[side]: name for name, paths in config_aliases().items()}
    out: dict[str, tuple[str, Any]] = {}
    if fmt == "speculators":
        for path, value in _flatten(raw.get("transformer_layer_config") or {}).items():
            out[path] = (f"transformer_layer_config.{path}", value)
    decoder = set(out)
    for path, value in _flatten({k: v for k, v in raw.items()
                                 if not (fmt == "speculators" and k == "transformer_layer_config")}).items():
        name = next((by_path[p] + path[len(p):] for p in by_path if path == p or path.startswith(p + ".")), path)
        if name in decoder:  # a speculators top-level key the decoder also has (a version stamp): another key
            name = f"speculators:{name}"
        if name == "target_layer_ids" and fmt == "speculators" and isinstance(value, list):
            value = [v - AUX_ID_OFFSET if isinstance(v, int) else v for v in value]  # compare as z-lab ids
        out[name] = (path, value)
    return out


def config_changes(src: dict[str, Any], src_fmt: str, dst: dict[str, Any], dst_fmt: str) -> list[dict[str, Any]]:
    """Every config key a conversion added, dropped or rewrote (keys that only moved between layouts with
    the same meaning are not changes): [{key, change, before, after, why}]."""
    a, b = _canonical_config(src, src_fmt), _canonical_config(dst, dst_fmt)
    out = []
    for name in sorted(a.keys() | b.keys()):
        if name in a and name in b and a[name][1] == b[name][1]:
            continue
        change = "dropped" if name not in b else "added" if name not in a else "rewritten"
        path = a[name][0] if change == "dropped" else b[name][0]
        why = next((r for k, r in CONFIG_CHANGE_REASONS.items() if name == k or name.startswith(k + ".")
                    or path == k or path.startswith(k + ".")), "")
        out.append({"key": path, "change": change, "before": a[name][1] if name in a else None,
                    "after": b[name][1] if name in b else None, "why": why})
    return out


# ----------------------------------------------------------------------------- verifier (target) config

@dataclass(frozen=True)
class TargetInfo:
    """What a draft needs to know about its target model's config.json."""

    name_or_path: str
    architectures: list[str]
    num_layers: int
    hidden_size: int
    vocab_size: int
    pad_token_id: int | None
    eos_token_ids: tuple[int, ...]
    # attention and MLP sizes (what a memory plan needs): absent keys take the usual defaults
    num_attention_heads: int = 1
    num_key_value_heads: int = 1
    head_dim: int = 1
    intermediate_size: int = 1


def special_ids(pad, eos) -> tuple[int | None, tuple[int, ...]]:
    """(pad id, eos ids) of a config's `pad_token_id` and `eos_token_id` (an int, a list or None)."""
    eos_ids = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
    return pad, tuple(int(e) for e in eos_ids)


def target_info(raw: dict[str, Any], name_or_path: str, file: str = "config.json") -> TargetInfo:
    read = sizes.decoder(raw, file, lead="target config field")  # the one reader predict's facts use too
    cfg = read.cfg

    def token(key: str, value: Any) -> int:
        if type(value) is not int:
            raise DFlashError(f"target config field `{key}` holds {_short(value)}, not a token id", file=file)
        return value

    num_layers, hidden, vocab = read("layers"), read("hidden"), read("vocab")
    eos = cfg.get("eos_token_id", raw.get("eos_token_id"))
    eos_ids = tuple(token("eos_token_id", e) for e in (eos if isinstance(eos, list) else [] if eos is None else [eos]))
    pad = cfg.get("pad_token_id")
    archs = raw.get("architectures") or []
    if not (isinstance(archs, list) and all(isinstance(a, str) and a.isprintable() and len(a) < 256 for a in archs)):
        raise DFlashError(f"target config field `architectures` is {_short(archs)}, not a list of names", file=file)
    heads = read("heads")
    return TargetInfo(name_or_path=name_or_path, architectures=list(archs), num_layers=num_layers,
                      hidden_size=hidden, vocab_size=vocab,
                      pad_token_id=None if pad is None else token("pad_token_id", pad), eos_token_ids=eos_ids,
                      num_attention_heads=heads, num_key_value_heads=read("kv_heads"), head_dim=read("head_dim"),
                      # the memory plan's MLP buffer where the config states no dense MLP width (a MoE): GPT-2's 4x
                      intermediate_size=read("intermediate", 4 * hidden))


# ----------------------------------------------------------------------------- misspelled keys

TYPO_CUTOFF = 0.85  # difflib's ratio: one or two letters off a key of ten or more (mask_token_idd, is_casual)
# Decoder keys of transformers' configs that the models here do not declare, yet are a letter or two from one that
# they do (bos_token_id / eos_token_id): never a misspelling.
OTHER_DECODER_KEYS = ("bos_token_id", "moe_intermediate_size", "use_cache", "initializer_range", "attention_dropout",
                      "rope_scaling", "rope_theta", "transformers_version", "mlp_bias", "quantization_config")


def _names(model) -> set[str]:
    """A config model's field names and their aliases."""
    return {n for name, f in model.model_fields.items() for n in (name, f.alias) if n}


def _known_names() -> dict[str, set[str]]:
    """Where a DFlash config keeps keys (a format's top level, its nested sections) -> the names read there: the
    config models' own fields and the family key table's (format/keys.py)."""
    from dflash_convert.format.configs import DecoderConfig, DFlashBlock

    table = keys.config_keys()
    return {
        "speculators": _names(SpeculatorsDFlashConfig) | set(speculators_known_keys())
        | {k.speculators for k in table if k.speculators},
        "speculators.transformer_layer_config": _names(DecoderConfig) | set(OTHER_DECODER_KEYS),
        "hf": _names(HFDFlashConfig) | set(HF_DFLASH_KEYS) | set(OTHER_DECODER_KEYS) | {k.name for k in table
                                                                                         if k.hf_top},
        "hf.dflash_config": _names(DFlashBlock) | set(HF_DFLASH_CONFIG_OWN) | {k.name for k in table},
        "transformers": _names(TransformersDFlashConfig) | set(OTHER_DECODER_KEYS),
    }


def misspelled_keys(raw: dict[str, Any]) -> dict[str, str]:
    """`path of a key no reader knows` -> `path of the key it is close to`, for each key of `raw` (at the top level
    and in the nested sections of its format) that is not read where it sits but is a letter or two from a name
    that is, and absent there: `dflash_config.mask_token_idd` -> `dflash_config.mask_token_id`. Keys close to
    nothing (a decoder's own extra keys) are not listed; neither is anything of a config that is not DFlash."""
    import difflib

    try:
        fmt, _ = detect_format(raw)
    except DFlashError:
        return {}
    known = _known_names()
    sections = [(fmt, "", raw)] + [(f"{fmt}.{name}", f"{name}.", raw.get(name)) for name in
                                   ("transformer_layer_config", "dflash_config")]
    found: dict[str, str] = {}
    for where, prefix, section in sections:
        if where not in known or not isinstance(section, dict):
            continue
        names = known[where]
        for key in section:
            if key in names or not isinstance(key, str):
                continue
            close = difflib.get_close_matches(key, sorted(n for n in names if n not in section), n=1,
                                              cutoff=TYPO_CUTOFF)
            if close:
                found[prefix + key] = prefix + close[0]
    return found


def typo_hint(raw: dict[str, Any] | None, name: str) -> str:
    """`; config.json has `X`: did you mean `name`?` when a misspelled key of `raw` is the one `name` (a field
    missing from the config) is; else nothing."""
    for found, meant in misspelled_keys(raw or {}).items():
        if meant.rsplit(".", 1)[-1] == name:
            return f"; the config has `{found}`: did you mean `{meant}`?"
    return ""
