"""How each engine reads a draft config: one reader per rule kind of the engine table (format/engines.py).

`read_config` picks each field's reader by the row's kind and returns what that engine takes from the
config (a `ConfigReading`), the way its own config-reading code does; format/engine_views.py compares
that with the draft's trained semantics. A kind added to a field's enum without its reader fails here
at import, not in a user's run.

Bottom layer: imports only format/ modules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from dflash_convert.format import kinds, mapping
from dflash_convert.format.engines import (
    BlockSize, Causality, EngineRules, FcWidth, IdsOrder, LayerIds, LayerTypes, Verifier, Window, kinds_of,
)

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


def _ids_top_level(raw: dict, dc: dict) -> tuple[list[int] | None, str]:
    return raw.get("target_layer_ids"), "target_layer_ids"


def _block_top_default_16(raw: dict, dc: dict) -> tuple[int | None, str]:
    b = raw.get("block_size")
    return (16, "default 16") if b is None else (int(b), "block_size")


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
        kind = kinds.get(raw.get("speculators_model_type"))
        if kind is not None and kind.anchor_may_propose and raw.get("sample_from_anchor") is True:
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
    LayerIds.TOP_LEVEL: _ids_top_level,
}
ORDER_IDS: dict[IdsOrder, Callable[[list[int]], list[int]]] = {
    IdsOrder.SORTED_UNIQUE: lambda ids: sorted(set(ids)),
    IdsOrder.AS_LISTED: list,
}
READ_LAYER_TYPES: dict[LayerTypes, Callable[[dict, int], list[str]]] = {
    LayerTypes.EXPLICIT: lambda flat, n: list(flat.get("layer_types") or ["full_attention"] * n),
    LayerTypes.QWEN3: lambda flat, n: mapping.resolve_layer_types(flat),  # transformers' Qwen3Config default
    LayerTypes.ALL_SLIDING_DEFAULT: lambda flat, n: list(flat.get("layer_types") or ["sliding_attention"] * n),
}
READ_WINDOW: dict[Window, Callable[[dict, dict, list[str], int], tuple[list[str], int | None]]] = {
    Window.RAW: lambda flat, dc, types, n: (types, flat.get("sliding_window")),
    Window.QWEN3: lambda flat, dc, types, n: (types, mapping.qwen3_window(flat)),
    Window.SWA_WINDOW_SIZE_OR_QWEN3: _window_swa_window_size_or_qwen3,
    Window.DEFAULT_2048: lambda flat, dc, types, n: (types, flat.get("sliding_window") or 2048),
}
READ_CAUSALITY: dict[Causality, Callable[[dict, dict, list[str], int], tuple[list[bool], str]]] = {
    Causality.SPECULATORS_GLOBAL: _causal_speculators_global,
    Causality.IS_CAUSAL_THEN_DFLASH_CAUSAL_THEN_SLIDING: lambda raw, dc, types, n: _causal_hf(raw, types,
                                                                                               dc.get("causal")),
    Causality.IS_CAUSAL_THEN_SLIDING: lambda raw, dc, types, n: _causal_hf(raw, types, None),
    Causality.BIDIRECTIONAL: lambda raw, dc, types, n: ([False] * n, "bidirectional (no causal mode)"),
}
READ_BLOCK_SIZE: dict[BlockSize, Callable[[dict, dict], tuple[int | None, str]]] = {
    BlockSize.SPECULATIVE_TOKENS: _block_speculative_tokens,
    BlockSize.SERVING_FLAG: lambda raw, dc: (None, "--speculative-config num_speculative_tokens + 1"),
    BlockSize.DFLASH_CONFIG_OR_TOP_DEFAULT_16: _block_dflash_config_or_top,
    BlockSize.TOP_DEFAULT_16: _block_top_default_16,
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



def _check_readers(readers: dict[str, dict] = READERS) -> None:
    """Each kind of a field read from a config has its reader."""
    for name, table in readers.items():
        kinds = set(kinds_of(name))
        if set(table) != kinds:
            raise ValueError(f"the readers[{name!r}] and the kinds of {name} differ: "
                             f"{sorted(str(k) for k in set(table) ^ kinds)}")


_check_readers()


def read_config(rules: EngineRules, raw: dict[str, Any]) -> ConfigReading:
    """The values `rules`' engine takes from a config in its own format."""
    if rules.reads == "speculators":
        flat, dc = dict(raw.get("transformer_layer_config") or {}), {}
    elif rules.reads == "transformers":  # flat, every DFlash key at the top level; dflash_config is not read
        flat, dc = raw, {}
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

