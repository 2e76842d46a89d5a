"""What context the draft was trained for, read statically (`inspect` and `validate`'s static level): its RoPE
range (max_position_embeddings and any RoPE scaling) against the target's and the deployment's context (a
--max-model-len, else the target's own range, which vLLM's max_model_len defaults to), its sliding window and
whether each engine serves that window (the engine views: the engine table's window rules applied), and its
layer_types. A deployment whose context passes the draft's positions is a warning naming both; where the run
measured --context-lengths, the report adds what the curve shows past them (breakdown.past_sentence).

Where --context-lengths cannot be measured honestly, the run stops before any work (`check_context_lengths`,
exit 2; the runtime and the endpoint paths both call it): a length + --max-new-tokens past --max-model-len
measures positions the deployment never decodes (vLLM refuses a prompt longer than max_model_len and stops a
generation at it), and past the target's own positions (`target_positions`, the max_model_len vLLM derives from
the target's config when none is given) the target itself is out of its range, so the tau there means nothing;
an explicit --max-model-len measures there anyway, as vLLM serves past them only when told to
(VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)."""

from __future__ import annotations

from typing import Any

from dflash_convert.errors import UsageError
from dflash_convert.format import engine_views
from dflash_convert.format.compat import make_check
from dflash_convert.format.engines import TRAINED_WINDOW
from dflash_convert.validate.static import Check


def draft_positions(spec) -> int | None:
    """The positions the draft's RoPE was trained for: its max_position_embeddings (with a scaling that extends
    the range, transformers' configs state the extended one there)."""
    value = spec.decoder.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


# the config keys vLLM 0.32 reads a model's length from (the smallest one stated; model_max_length wins), and the
# RoPE types whose `factor` it does not multiply in (their max_position_embeddings is stated extended already)
LENGTH_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length",
               "max_seq_length", "seq_len")
EXTENDED_ROPE_TYPES = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")


def target_positions(raw: dict) -> tuple[int | None, str]:
    """(the positions the target serves, how its config states them): the max_model_len vLLM derives from a
    config.json when none is given (vLLM's _get_and_verify_max_len): the smallest of LENGTH_KEYS (a
    model_max_length instead), times the RoPE scaling `factor` of a type that does not state the extended range
    itself (linear, dynamic); (None, "") where the config states no length."""
    raw = raw.get("text_config", raw) if isinstance(raw.get("text_config"), dict) else raw
    stated = {k: raw[k] for k in LENGTH_KEYS if isinstance(raw.get(k), int) and not isinstance(raw.get(k), bool)}
    if isinstance(raw.get("model_max_length"), int):
        stated = {"model_max_length": raw["model_max_length"]}
    if not stated:
        return None, ""
    key = min(stated, key=stated.get)
    rope = raw.get("rope_scaling") or raw.get("rope_parameters") or {}
    per_layer = [r for r in rope.values() if isinstance(r, dict)] if isinstance(rope, dict) else []
    factor, kind = 1.0, None
    for r in per_layer or ([rope] if isinstance(rope, dict) else []):
        kind = r.get("rope_type") or r.get("type")
        if kind not in (None, "default", *EXTENDED_ROPE_TYPES) and isinstance(r.get("factor"), (int, float)):
            factor = float(r["factor"])
    if factor == 1.0 or "gemma3" in str(raw.get("model_type", "")):  # vLLM: Gemma3 states it scaled
        return stated[key], f"{key} {stated[key]}"
    return int(stated[key] * factor), f"{key} {stated[key]} x RoPE {kind} factor {factor:g}"


def check_context_lengths(lengths: list[int], max_new_tokens: int, *, max_model_len: int | None = None,
                          positions: int | None = None, stated: str = "", served: str = "--max-model-len") -> None:
    """UsageError (exit 2) where the longest --context-lengths value and the tokens generated after it pass
    `max_model_len` (`served` names it: --max-model-len, or the max_model_len an endpoint reports), or, none
    given, the target's own `positions` (`stated`: how its config states them, target_positions)."""
    if not lengths:
        return
    longest = max(lengths)
    need = longest + max_new_tokens
    what = f"--context-lengths {longest} + --max-new-tokens {max_new_tokens} = {need} tokens"
    if max_model_len is not None:
        if need > max_model_len:
            fits = max_model_len - max_new_tokens
            raise UsageError(f"{what} pass {served} {max_model_len}: vLLM refuses a prompt longer than "
                             "max_model_len and stops a generation at it, so those positions are never decoded; "
                             + (f"measure lengths up to {fits}" if fits >= 2 else "lower --max-new-tokens"))
        return
    if positions is not None and need > positions:
        raise UsageError(f"{what} pass the target's own {positions} positions (config.json: {stated}): the target is "
                         f"out of its range there, so the tau means nothing; give --max-model-len {need} to measure "
                         "past them anyway (vLLM serves past them only with VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)")


def rope_text(spec) -> str:
    scaling = spec.rope_scaling
    if not scaling:
        return f"RoPE default, theta {spec.rope_theta:g}"
    kind = scaling.get("rope_type") or scaling.get("type")
    extra = ", ".join(f"{k} {v}" for k, v in sorted(scaling.items()) if k in ("factor", "original_max_position_embeddings"))
    return f"RoPE {kind}, theta {spec.rope_theta:g}" + (f" ({extra})" if extra else "")


def window_by_engine(spec, views) -> dict[str, str]:
    """engine view -> how it serves the draft's sliding layers: `honoured` (same layer types and window, the
    window applied as trained), else what differs. Empty when the draft has no sliding layer."""
    if "sliding_attention" not in spec.layer_types:
        return {}
    out = {}
    for view in views:
        if engine_views.format_cannot_hold(view):  # it serves another kind of draft (inspect's views say so)
            continue
        if not view.loads:
            out[view.engine] = "does not load the draft"
        elif view.layer_types is not None and list(view.layer_types) != list(spec.layer_types):
            out[view.engine] = f"layer types {view.layer_types}, not the trained ones"
        elif view.sliding_window != spec.sliding_window:
            out[view.engine] = f"window {view.sliding_window}, not {spec.sliding_window}"
        elif view.window_semantics not in (None, TRAINED_WINDOW.value, TRAINED_WINDOW):
            out[view.engine] = f"window {view.sliding_window} applied {view.window_semantics} (trained: anchor)"
        else:
            out[view.engine] = "honoured"
    return out


def trained_context_check(spec, views, *, target_positions: int | None = None, max_model_len: int | None = None,
                          context_lengths: list[int] | None = None) -> Check:
    """`trained_context`: warn where the deployment's context (max_model_len, else the target's positions) or a
    measured context length passes the draft's trained positions; the window and layer types said either way."""
    trained = draft_positions(spec)
    served, named = (max_model_len, "--max-model-len") if max_model_len else (target_positions, "the target's "
                                                                              "max_position_embeddings")
    sliding = [i for i, t in enumerate(spec.layer_types) if t == "sliding_attention"]
    windows = window_by_engine(spec, views)
    window = (f"sliding window {spec.sliding_window} on layers {sliding}; engines: "
              + ", ".join(f"{e} {how}" for e, how in windows.items()) if sliding else "no sliding-window layers")
    facts = (f"{rope_text(spec)}; layer_types {spec.layer_types}; {window}")
    value: dict[str, Any] = {"draft": trained, "target": target_positions, "served": served,
                             "sliding_window": spec.sliding_window if sliding else None, "engines": windows or None}
    if trained is None:
        return make_check("trained_context", True, f"the draft's config states no max_position_embeddings; {facts}",
                          value=value)
    past = []
    if served is not None and served > trained:
        past.append(f"the deployment's context ({named}: {served} tokens) passes the {trained} positions the draft "
                    "was trained for (its max_position_embeddings): acceptance past them is untested")
    longest = max(context_lengths or [0])
    if longest > trained:
        past.append(f"--context-lengths up to {longest} measure past them")
    where = f"draft positions {trained}" + (f", target {target_positions}" if target_positions else "") + (
        f", served {served}" if served else "")
    if past:
        return make_check("trained_context", False, f"{'; '.join(past)} ({where}); {facts}", value=value,
                          threshold=trained, bad="warn")
    return make_check("trained_context", True, f"the served context fits the draft's trained positions ({where}); "
                      f"{facts}", value=value, threshold=trained)
