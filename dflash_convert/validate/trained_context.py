"""What context the draft was trained for, read statically (`inspect` and `validate`'s static level): its RoPE
range (max_position_embeddings and any RoPE scaling) against the target's and the deployment's context (a
--max-model-len, else the target's own range, which vLLM's max_model_len defaults to), its sliding window and
whether each engine serves that window (the engine views: the engine table's window rules applied), and its
layer_types. A deployment whose context passes the draft's positions is a warning naming both; where the run
measured --context-lengths, the report adds what the curve shows past them (breakdown.past_sentence)."""

from __future__ import annotations

from typing import Any

from dflash_convert.format import engine_views
from dflash_convert.format.compat import make_check
from dflash_convert.format.engines import TRAINED_WINDOW
from dflash_convert.validate.static import Check


def draft_positions(spec) -> int | None:
    """The positions the draft's RoPE was trained for: its max_position_embeddings (with a scaling that extends
    the range, transformers' configs state the extended one there)."""
    value = spec.decoder.get("max_position_embeddings")
    return int(value) if isinstance(value, int) else None


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
