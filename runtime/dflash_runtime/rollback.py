"""Rolling a target's cache back after a verify step, to the committed length (target.py runs the forward).

Attention K/V is cropped. The recurrent and conv state of linear-attention layers (Gated DeltaNet in Qwen3-Next /
Qwen3.5, Mamba-style layers: transformers' LinearAttention cache layers, `is_croppable == False`) cannot be
cropped, so a verify step that may be rejected first copies that state (StateRollback.before), and a partial
acceptance restores the copy (undo) and replays the committed tokens from it: through each linear-attention
mixer alone (its inputs from the verify pass are kept by a hook: no MLP, no attention layer, no lm_head), or,
for a model whose mixers are not found, through the whole decoder (Target.crop). The state after the accepted
prefix is then exactly what target-only decoding reaches. A cache layer the runtime cannot roll back either way
refuses speculative decoding up front (rollback_refusal).
    state per layer: its conv and recurrent tensors, copied whole (Gated DeltaNet: conv [1, C, K], recurrent
    [1, heads, dk, dv])
    mixer inputs: [1, n, Ht] of the last pass, replayed [:, :k] for k accepted positions
"""

from __future__ import annotations

import inspect

import torch

from dflash_convert.errors import DFlashError


class StateRollback:
    """A target's linear-attention rollback: the cache layers holding state, a copy of their state taken before
    the last verify block, that block (ids, start), and each mixer's input in its last pass."""

    def __init__(self, layers, config, refused: str | None):
        self.mixers = _state_mixers(layers, config, refused)  # decoder layer id -> its mixer module
        self.mixer_keyword = {i: cache_keyword(m.forward, "cache_params") for i, m in self.mixers.items()}
        self.mixer_inputs: dict[int, torch.Tensor] = {}  # layer id -> its input [1, n, Ht] in the last pass
        for i, mixer in self.mixers.items():
            mixer.register_forward_pre_hook(self._keep_input(i), with_kwargs=True)
        self.layers: list = []  # the cache layers holding state
        self.saved: list[torch.Tensor] = []
        self.pending: tuple[torch.Tensor, int] | None = None

    def _keep_input(self, layer_id: int):
        def keep(module, args, kwargs):  # noqa: ARG001
            self.mixer_inputs[layer_id] = args[0] if args else kwargs["hidden_states"]
        return keep

    def start(self, cache) -> None:
        """A new sequence on `cache`: every layer's state starts from zero (a reused static cache keeps the last
        prompt's otherwise)."""
        self.layers = [layer for layer in cache.layers if holds_state(layer)]
        for layer in self.layers:
            _reset_state(layer)
        self.saved = []
        self.pending = None

    def before(self, ids: torch.Tensor, start: int) -> None:
        """A forward of ids [n] at start..: a verify block's state is copied first (it may have to be undone); no
        other forward can be undone."""
        self.pending = None
        if self.layers and ids.shape[0] > 1 and start > 0:
            self._save()
            self.pending = (ids, start)

    @torch.inference_mode()
    def _save(self) -> None:
        """Copy every linear-attention layer's conv and recurrent state (buffers allocated once per sequence)."""
        live = [t for layer in self.layers for t in _state_tensors(layer)]
        if len(self.saved) != len(live) or any(a.shape != b.shape for a, b in zip(self.saved, live)):
            self.saved = [t.clone() for t in live]
        else:
            for saved, t in zip(self.saved, live):
                saved.copy_(t)

    def undo(self, cache_len: int, length: int) -> tuple[torch.Tensor, int]:
        """The state as it was before the last verify block, which must reach from at most `length` to the cache's
        end `cache_len`; returns that block (ids [n], start)."""
        ids, start = self.pending or (None, -1)
        if not (self.saved and start <= length and start + ids.shape[0] == cache_len):
            raise DFlashError(f"cannot roll the target's linear-attention state back to {length} positions: only "
                              "the last verify block can be undone")
        self._restore()
        self.pending = None
        return ids, start

    @torch.inference_mode()
    def _restore(self) -> None:
        live = [t for layer in self.layers for t in _state_tensors(layer)]
        for saved, t in zip(self.saved, live):
            t.copy_(saved)  # in place: a compiled step reads these tensors at fixed addresses

    def replays(self, cache) -> bool:
        """Whether the mixers alone can replay the state: one for every cache layer holding state."""
        stateful = {i for i, layer in enumerate(cache.layers) if holds_state(layer)}
        return bool(self.mixers) and set(self.mixers) == stateful

    @torch.inference_mode()
    def replay(self, cache, k: int) -> None:
        """The first k inputs of the last pass through each linear-attention mixer, from its restored state."""
        if k <= 0:
            return
        for i, mixer in self.mixers.items():
            mixer(self.mixer_inputs[i][:, :k], **{self.mixer_keyword[i]: cache})


def crop_attention(cache, remove: int) -> None:
    """A dynamic cache's attention K/V shortened by `remove` positions; linear-attention state is left as it is."""
    for layer in cache.layers:
        if not holds_state(layer):
            layer.crop(-remove)
        elif not _state_only(layer):  # state + K/V in one layer: crop its attention part
            _attention_class(layer).crop(layer, -remove)


def holds_state(layer) -> bool:
    """A transformers cache layer holding linear-attention (recurrent / conv) state."""
    try:
        from transformers.cache_utils import LinearAttentionCacheLayerMixin
    except ImportError:
        return False
    return isinstance(layer, LinearAttentionCacheLayerMixin)


def _state_only(layer) -> bool:
    from transformers.cache_utils import CacheLayerMixin

    return not isinstance(layer, CacheLayerMixin)


def _attention_class(layer):
    """The attention cache class of a layer holding state and K/V (transformers' "hybrid" layers)."""
    from transformers.cache_utils import CacheLayerMixin

    return next(c for c in type(layer).__mro__ if issubclass(c, CacheLayerMixin) and not _holds_state_class(c)
                and "crop" in vars(c))


def _holds_state_class(cls) -> bool:
    from transformers.cache_utils import LinearAttentionCacheLayerMixin

    return issubclass(cls, LinearAttentionCacheLayerMixin)


def _state_tensors(layer) -> list[torch.Tensor]:
    """A linear-attention layer's live state tensors, conv then recurrent, per state index."""
    out = []
    for i in range(layer.number_of_states):
        for held in (layer.conv_states, layer.recurrent_states):
            if held.get(i) is not None:
                out.append(held[i])
    return out


def _reset_state(layer) -> None:
    for t in _state_tensors(layer):
        t.zero_()
    for i in layer.has_previous_state:
        layer.has_previous_state[i] = False


def cache_keyword(forward, old: str) -> str:
    """The keyword a transformers forward takes the cache by: `cache` where it declares it, else `old`."""
    return "cache" if "cache" in inspect.signature(forward).parameters else old


def _state_mixers(layers, config, refused) -> dict[int, torch.nn.Module]:
    """Decoder layer id -> the module of that layer that reads and writes linear-attention state, for each
    layer whose cache holds state: its one submodule whose forward takes the cache (transformers' Gated
    DeltaNet and Mamba mixers). Empty when the runtime refuses the target; a layer with no such module, or
    several, is left out (the whole decoder is re-run then)."""
    if refused:
        return {}
    from transformers import DynamicCache

    stateful = [i for i, layer in enumerate(DynamicCache(config=config).layers) if holds_state(layer)]
    found = {}
    for i in stateful:
        if i >= len(layers):
            continue
        takes_cache = [m for m in layers[i].modules() if m is not layers[i]
                       and {"cache", "cache_params"} & set(inspect.signature(m.forward).parameters)]
        if len(takes_cache) == 1:
            found[i] = takes_cache[0]
    return found


def rollback_refusal(config) -> str | None:
    """Why the runtime cannot undo rejected proposals in this target's cache, or None when it can: every
    cache layer transformers builds for the config either crops (attention K/V) or holds linear-attention
    state (copied and re-run, see Target.crop)."""
    from transformers import DynamicCache

    try:
        from transformers.cache_utils import LinearAttentionCacheLayerMixin  # noqa: F401
    except ImportError:  # an older transformers: linear-attention state is kept outside the cache API
        types = set(getattr(config.get_text_config(decoder=True), "layer_types", None) or ())
        stateful = types & {"linear_attention", "mamba", "conv"}
        if stateful:
            return (f"its {sorted(stateful)[0]} layers keep recurrent state this transformers version does not expose "
                    "through its cache API (upgrade transformers)")
        return None
    try:
        layers = DynamicCache(config=config).layers
    except (KeyError, ValueError, TypeError, AttributeError):
        return None  # transformers builds this cache lazily; the target path self-check covers it
    types = list(getattr(config.get_text_config(decoder=True), "layer_types", None) or ())
    for i, layer in enumerate(layers):
        what = f"{types[i]} " if i < len(types) else ""
        if holds_state(layer):
            if not _state_only(layer) and getattr(layer, "is_sliding", False):
                return (f"its layer {i} ({what}cache {type(layer).__name__}) keeps linear-attention state and a "
                        "sliding window in one layer, which the runtime cannot roll back after rejected proposals")
            continue
        if not callable(getattr(layer, "crop", None)) or not getattr(type(layer), "is_croppable", True):
            return (f"its layer {i} ({what}cache {type(layer).__name__}) cannot be rolled back after rejected "
                    "proposals")
    return None
