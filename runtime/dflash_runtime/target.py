"""The target side: any transformers causal LM, with the three things a DFlash draft needs from it.

1. Context features: the outputs of decoder layers `target_layer_ids` (z-lab ids), captured by
   forward hooks on the layers themselves. transformers' `output_hidden_states[-1]` is the
   final-NORMED state, so a hook is the only correct way to get the last layer's output.
2. A cache that can be rolled back to the committed length after a verify step: attention K/V is
   cropped; the recurrent and conv state of linear-attention layers (Gated DeltaNet in Qwen3-Next /
   Qwen3.5, Mamba-style layers: transformers' LinearAttention cache layers, `is_croppable == False`)
   cannot be cropped, so a verify step that may be rejected first copies that state, and a partial
   acceptance restores the copy and replays the committed tokens from it: through each linear-attention
   mixer alone (its inputs from the verify pass are kept by a hook: no MLP, no attention layer, no
   lm_head), or, for a model whose mixers are not found, through the whole decoder. The state after
   the accepted prefix is then exactly what target-only decoding reaches.
   A cache layer the runtime cannot roll back either way refuses speculative decoding up front.
3. The embedding table and lm_head the draft borrows.
Its attention implementation is its own setting, independent of the draft's backend.

Loading refuses incomplete weights before any tensor is read (transformers would fill missing
parameters with random values), and a target larger than one device can be placed by transformers
+ accelerate (`device_map`, `max_memory`: GPUs, then CPU memory, then disk offload); the draft
then runs on the device of the target's last layers (`Target.draft_device`).

With compile=True the cache is transformers' StaticCache (preallocated, written by index; cropping
sets its length, nothing is copied) and verify steps of the run's block size go through a
torch.compile'd forward (CUDA graphs on CUDA); the prefill and other sizes run eagerly on the same
cache. Targets with sliding-window layers (a rolling static cache cannot be cropped back), offloaded
parts or an attention implementation other than sdpa/eager keep the dynamic cache and run eagerly.
"""

from __future__ import annotations

import logging
import re
import tempfile
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from dflash_convert.format import compat, mapping
from dflash_convert.io.checkpoint import weight_headers
from dflash_convert.format.configs import DraftSpec
from dflash_convert.errors import DFlashError
from dflash_convert.format.mapping import TargetInfo

from .model import CACHE_ROUND


def decoder_part(model, name: str) -> torch.nn.Module:
    """A part of a transformers causal LM's decoder: `layers` (model.model.layers for Llama/Qwen) or `norm`
    (the norm after the last layer)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    part = getattr(decoder, name, None)
    if part is None:
        raise DFlashError(f"{type(model).__name__}: cannot find its decoder {name} (expected .model.{name})")
    return part




def target_verify(target: "Target", ids: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """ids [1, n] at positions [1, n] through the model into its cache -> (float32 logits [n, V],
    features [n, A*Ht] or None). A plain function so that torch.compile captures hooks and all."""
    # Our own 4D mask over the whole static cache (query at p sees rows <= p): transformers' mask
    # builder branches on the cache length, a tensor here, which would break the graph.
    visible = torch.arange(target.cache_rows, device=ids.device)[None, :] <= positions[0][:, None]  # [n, L]
    if target.model.config._attn_implementation == "sdpa":
        mask = visible[None, None]  # bool, True = attend
    else:  # eager: additive
        mask = torch.zeros(visible.shape, dtype=target.dtype, device=ids.device).masked_fill(
            ~visible, torch.finfo(target.dtype).min)[None, None]
    out = target.model(input_ids=ids, position_ids=positions, attention_mask=mask, use_cache=True,
                       **{target.cache_keyword: target.cache})
    features = None
    if target.capture_ids:
        features = torch.cat([target._captured[i].to(target.draft_device) for i in target.capture_ids], dim=-1)
    return out.logits[0].float(), features


class Target:
    """A causal LM run one sequence at a time (batch 1) with a croppable KV cache."""

    def __init__(self, model, *, compile: bool = False):
        self.model = model.eval().requires_grad_(False)
        self.config = model.config
        self.layers = decoder_part(model, "layers")
        self.num_layers = len(self.layers)
        self.embed_tokens = model.get_input_embeddings()  # [V, Ht]
        self.lm_head = model.get_output_embeddings()  # Ht -> V
        if self.lm_head is None:
            raise DFlashError(f"{type(model).__name__}: has no output embeddings (lm_head)")
        self.vocab_size, self.hidden_size = self.embed_tokens.weight.shape
        self.dtype = self.embed_tokens.weight.dtype  # meta tensors of offloaded modules keep their dtype
        # where each end runs: inputs go to the embedding's device, the draft beside the last layers
        self.device = _execution_device(model, self.embed_tokens)
        self.draft_device = _execution_device(model, self.layers[-1])
        self.offloaded = _offloaded(model)
        self.capture_ids: list[int] = []
        self.post_norm_ids: frozenset[int] = frozenset()  # see feed_after_final_norm
        self.final_norm = None
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks = []
        self.cache = None
        self._offload_folder = None  # a device map's disk offload, removed with the Target
        self._length = 0  # positions held by a static cache
        self.cache_rows = 0  # its allocated size
        layer_types = getattr(self.config, "layer_types", None) or []
        self.attention = getattr(self.config, "_attn_implementation", None)  # transformers' attn_implementation
        self.eager_reason = None  # why compile=True still runs the target eagerly
        if compile and "sliding_attention" in layer_types:
            self.eager_reason = ("its sliding-window layers need the dynamic cache (a rolling static one cannot be "
                                 "cropped)")
        elif compile and self.attention not in ("sdpa", "eager"):
            self.eager_reason = f"its attention implementation {self.attention!r} is not compiled (sdpa or eager are)"
        elif compile and self.offloaded:
            self.eager_reason = "parts of it are offloaded by its device map"
        self.static = compile and self.eager_reason is None
        self.compile = self.static
        self.step_tokens = 1  # the verify size the compiled forward serves
        self._compiled_verify = None
        self.unrollable = rollback_refusal(self.config)  # why rejected proposals could not be undone, or None
        # linear-attention rollback (see the module docstring): the cache layers holding state, a copy of
        # their state taken before the last verify block, and that block (ids, start)
        self._state_layers: list = []
        self._saved: list[list[torch.Tensor]] = []
        self._pending: tuple[torch.Tensor, int] | None = None
        # transformers names the cache argument `cache` from 5.2x on (`past_key_values`, `cache_params` before,
        # deprecated since): each forward is called with the name it declares, so no release warns
        self.cache_keyword = _cache_keyword(self.model.forward, "past_key_values")
        self._mixers = _state_mixers(self.layers, self.config, self.unrollable)  # layer id -> its mixer module
        self._mixer_keyword = {i: _cache_keyword(m.forward, "cache_params") for i, m in self._mixers.items()}
        self._mixer_inputs: dict[int, torch.Tensor] = {}  # layer id -> its input [1, n, Ht] in the last pass
        for i, mixer in self._mixers.items():
            mixer.register_forward_pre_hook(self._keep_mixer_input(i), with_kwargs=True)

    # ------------------------------------------------------------------ feature capture

    def set_capture(self, layer_ids: list[int]) -> None:
        """Capture the outputs of these decoder layers (z-lab ids) on every forward."""
        compat.raise_first_failure([compat.layer_ids_check(layer_ids, self.num_layers, "the target")])
        for h in self._hooks:
            h.remove()
        self._hooks = [self.layers[i].register_forward_hook(self._hook(i)) for i in dict.fromkeys(layer_ids)]
        self.capture_ids = list(layer_ids)

    def feed_after_final_norm(self, layer_ids) -> None:
        """Capture these layers' outputs after the final norm: z-lab takes the last layer's feature from
        output_hidden_states[-1], which is after the norm (validate --engine zlab)."""
        self.final_norm = decoder_part(self.model, "norm")
        self.post_norm_ids = frozenset(layer_ids)

    def _hook(self, layer_id: int):
        def store(module, args, output):  # noqa: ARG001
            out = output[0] if isinstance(output, tuple) else output  # [1, n, Ht]
            if layer_id in self.post_norm_ids:
                out = self.final_norm(out)
            self._captured[layer_id] = out[0]
        return store

    # ------------------------------------------------------------------ cache

    @torch.inference_mode()  # the static cache's tensors are inference tensors
    def reset(self, max_len: int | None = None, block_size: int | None = None) -> None:
        """A new sequence. `max_len`: positions the run will reach (a static cache is allocated for
        them once, and reused while big enough); `block_size`: the verify size to compile."""
        if block_size is not None:
            self.step_tokens = block_size
        if not self.static:
            from transformers import DynamicCache

            self.cache = DynamicCache(config=self.config)
            for layer in self.cache.layers:  # sliding-window layers can then be rolled back
                if hasattr(layer, "activate_past_recording") and not _holds_state(layer):
                    layer.activate_past_recording()
        else:
            from transformers import StaticCache

            needed = max(max_len or 0, 1)
            if self.cache is None or self.cache_rows < needed:
                self.cache_rows = -(-needed // CACHE_ROUND) * CACHE_ROUND
                self.cache = StaticCache(config=self.config, max_cache_len=self.cache_rows)
            self._set_length(0)
        # every layer's state starts from zero: a reused static cache keeps the last prompt's otherwise
        self._state_layers = [layer for layer in self.cache.layers if _holds_state(layer)]
        for layer in self._state_layers:
            _reset_state(layer)
        self._saved = []
        self._pending = None

    @torch.inference_mode()
    def _set_length(self, length: int) -> None:
        """A static cache's length is where its next write goes; rows after it are masked (causal)."""
        for layer in self.cache.layers:
            if getattr(layer, "is_initialized", False):
                layer.cumulative_length.fill_(length)
        self._length = length

    @property
    def cache_len(self) -> int:
        if self.cache is None:
            return 0
        return self._length if self.static else self.cache.get_seq_length()

    def crop(self, length: int) -> None:
        """Keep the first `length` positions (drop rejected drafts). Linear-attention state goes back to
        its copy from before the last verify block, which is re-run up to `length` from it."""
        remove = self.cache_len - length
        if remove <= 0:
            return
        if not self._state_layers:
            self._crop_attention(length)
            return
        ids, start = self._pending or (None, -1)
        if not (self._saved and start <= length and start + ids.shape[0] == self.cache_len):
            raise DFlashError(f"cannot roll the target's linear-attention state back to {length} positions: only "
                              "the last verify block can be undone")
        self._restore_state()
        self._pending = None
        stateful = {i for i, layer in enumerate(self.cache.layers) if _holds_state(layer)}
        if self._mixers and set(self._mixers) == stateful:
            self._crop_attention(length)  # attention K/V of the accepted positions stays
            self._replay_mixers(length - start)
            return
        self._crop_attention(start)
        if length > start:
            self._rerun(ids[:length - start], start)

    def _crop_attention(self, length: int) -> None:
        """Attention K/V back to `length` positions; linear-attention state is left as it is."""
        if self.static:
            self._set_length(length)
            return
        remove = self.cache.get_seq_length() - length
        if remove <= 0:
            return
        for layer in self.cache.layers:
            if not _holds_state(layer):
                layer.crop(-remove)
            elif not _state_only(layer):  # state + K/V in one layer: crop its attention part
                _attention_class(layer).crop(layer, -remove)

    @torch.inference_mode()
    def _save_state(self) -> None:
        """Copy every linear-attention layer's conv and recurrent state (buffers allocated once per sequence)."""
        live = [t for layer in self._state_layers for t in _state_tensors(layer)]
        if len(self._saved) != len(live) or any(a.shape != b.shape for a, b in zip(self._saved, live)):
            self._saved = [t.clone() for t in live]
        else:
            for saved, t in zip(self._saved, live):
                saved.copy_(t)

    @torch.inference_mode()
    def _restore_state(self) -> None:
        live = [t for layer in self._state_layers for t in _state_tensors(layer)]
        for saved, t in zip(self._saved, live):
            t.copy_(saved)  # in place: a compiled step reads these tensors at fixed addresses

    def _keep_mixer_input(self, layer_id: int):
        def keep(module, args, kwargs):  # noqa: ARG001
            self._mixer_inputs[layer_id] = args[0] if args else kwargs["hidden_states"]
        return keep

    @torch.inference_mode()
    def _replay_mixers(self, k: int) -> None:
        """The first k inputs of the last pass through each linear-attention mixer, from its restored state."""
        if k <= 0:
            return
        for i, mixer in self._mixers.items():
            mixer(self._mixer_inputs[i][:, :k], **{self._mixer_keyword[i]: self.cache})

    @torch.inference_mode()
    def _rerun(self, ids: torch.Tensor, start: int) -> None:
        """The committed tokens ids [k] at start.. through the decoder into the cache (state and K/V);
        no lm_head, the logits are known already."""
        positions = torch.arange(start, start + ids.shape[0], device=self.device)[None]
        decoder = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model
        decoder(input_ids=ids[None], position_ids=positions, use_cache=True,
                **{_cache_keyword(decoder.forward, "past_key_values"): self.cache})
        if self.static:
            self._length = start + ids.shape[0]

    # ------------------------------------------------------------------ forward

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, start: int, *, last_logits_only: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """ids [n] at positions start..start+n-1, appended to the cache ->
        (float32 logits [n or 1, V], features [n, A*Ht] in capture-id order, or None)."""
        if self.cache is None:
            self.reset()
        if self.cache_len != start:
            raise DFlashError(f"target cache holds {self.cache_len} positions, forward asked to start at {start}")
        self._captured.clear()
        n = ids.shape[0]
        if self.static and start + n > self.cache_rows and start == 0:
            self.reset(n)  # nothing cached yet: a larger cache costs nothing
        if self.static and start + n > self.cache_rows:
            raise DFlashError(f"target static cache holds {self.cache_rows} positions, forward asked for "
                              f"{start + n} (reset(max_len) sizes it)")
        positions = torch.arange(start, start + n, device=self.device)[None]
        ids = ids[None].to(self.device)
        self._pending = None
        if self._state_layers and n > 1 and start > 0:  # a verify block: its state may have to be undone
            self._save_state()
            self._pending = (ids[0], start)
        if self.compile and n == self.step_tokens:
            if self._compiled_verify is None:
                mode = "reduce-overhead" if self.device.type == "cuda" else None
                self._compiled_verify = torch.compile(target_verify, dynamic=False, fullgraph=True, mode=mode)
            logits, features = self._compiled_verify(self, ids, positions)
            self._length = start + n
            if self.device.type == "cuda":  # CUDA graph outputs are overwritten by the next replay
                return logits.clone(), None if features is None else features.clone()
            return logits, features
        out = self.model(input_ids=ids, position_ids=positions, use_cache=True,
                         logits_to_keep=1 if last_logits_only else 0, **{self.cache_keyword: self.cache})
        if self.static:
            self._length = start + n
        features = None
        if self.capture_ids:
            features = torch.cat([self._captured[i].to(self.draft_device) for i in self.capture_ids], dim=-1)
        return out.logits[0].float(), features

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Raw embedding rows [n, Ht] (the draft embeds its block with the target's table)."""
        if self.embed_tokens.weight.device.type == "meta":  # offloaded: its hook brings the weight in
            with torch.inference_mode():
                return self.embed_tokens(ids.to(self.device))
        return F.embedding(ids.to(self.device), self.embed_tokens.weight)


def _holds_state(layer) -> bool:
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


def _cache_keyword(forward, old: str) -> str:
    """The keyword a transformers forward takes the cache by: `cache` where it declares it, else `old`."""
    import inspect

    return "cache" if "cache" in inspect.signature(forward).parameters else old


def _state_mixers(layers, config, refused) -> dict[int, torch.nn.Module]:
    """Decoder layer id -> the module of that layer that reads and writes linear-attention state, for each
    layer whose cache holds state: its one submodule whose forward takes the cache (transformers' Gated
    DeltaNet and Mamba mixers). Empty when the runtime refuses the target; a layer with no such module, or
    several, is left out (the whole decoder is re-run then)."""
    import inspect

    if refused:
        return {}
    from transformers import DynamicCache

    stateful = [i for i, layer in enumerate(DynamicCache(config=config).layers) if _holds_state(layer)]
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
        if _holds_state(layer):
            if not _state_only(layer) and getattr(layer, "is_sliding", False):
                return (f"its layer {i} ({what}cache {type(layer).__name__}) keeps linear-attention state and a "
                        "sliding window in one layer, which the runtime cannot roll back after rejected proposals")
            continue
        if not callable(getattr(layer, "crop", None)) or not getattr(type(layer), "is_croppable", True):
            return (f"its layer {i} ({what}cache {type(layer).__name__}) cannot be rolled back after rejected "
                    "proposals")
    return None


def _execution_device(model, module: torch.nn.Module) -> torch.device:
    """The device `module` computes on. A dispatched model (device map) says it in hf_device_map;
    modules placed on "cpu" or "disk" there compute on the main device (the first GPU of the map,
    else the CPU), as accelerate's dispatch runs them."""
    device_map = getattr(model, "hf_device_map", None)
    if not device_map:
        return next(module.parameters()).device
    names = {m: n for n, m in model.named_modules()}
    name = names.get(module, "")
    while name not in device_map and name:
        name = name.rpartition(".")[0]
    where = device_map.get(name, "cpu")
    gpus = [d for d in device_map.values() if d not in ("cpu", "disk")]
    if where in ("cpu", "disk"):
        where = gpus[0] if gpus else "cpu"
    return torch.device(f"cuda:{where}" if isinstance(where, int) else where)


def _offloaded(model) -> dict[str, int]:
    """Device -> modules of a device-mapped model (empty for a model on one device)."""
    counts: dict[str, int] = {}
    for where in (getattr(model, "hf_device_map", None) or {}).values():
        key = f"cuda:{where}" if isinstance(where, int) else str(where)
        counts[key] = counts.get(key, 0) + 1
    return counts


def _model_names(model, stored: list[str]) -> dict[str, str] | None:
    """Stored name -> the model's parameter name, renamed as transformers renames on load; None when
    a weight converter (fused or split tensors) applies, so names cannot be compared one to one."""
    meta = model.state_dict()
    prefix = getattr(model, "base_model_prefix", "") or None
    try:
        from transformers.conversion_mapping import get_model_conversion_mapping
        from transformers.core_model_loading import WeightConverter, WeightRenaming, rename_source_key

        transforms = get_model_conversion_mapping(model, None, None)
        renamings = [t for t in transforms if isinstance(t, WeightRenaming)]
        converters = [t for t in transforms if isinstance(t, WeightConverter)]
    except (ImportError, TypeError, AttributeError):  # another transformers: its base-prefix rule only
        renamings = converters = None
    out = {}
    for key in stored:
        if renamings is not None:
            new, converted = rename_source_key(key, renamings, converters, prefix, meta)
            if converted is not None:
                return None
        else:
            new = key
            if prefix and new not in meta and f"{prefix}.{new}" in meta:
                new = f"{prefix}.{new}"
            elif prefix and new.startswith(prefix + ".") and new[len(prefix) + 1:] in meta:
                new = new[len(prefix) + 1:]
        out[key] = new
    return out


def check_target_weights(model, path: Path) -> None:
    """Refuse weight files that do not hold exactly the model's parameters and persistent buffers
    (`model` built on the meta device from the config; nothing is loaded). Tied parameters count as
    present when any of their group is stored; the model's own ignore patterns are respected."""
    stored = {name: info.shape for name, info in weight_headers(path).items()}
    names = _model_names(model, list(stored))
    if names is None:
        return  # fused/split conversions: transformers' loading report is checked after loading instead
    expected = model.state_dict()  # persistent only: rotary inv_freq and other non-persistent buffers are not in it
    present = set(names.values())
    tied = dict(getattr(model, "all_tied_weights_keys", None) or {})
    for target_name, source_name in list(tied.items()):
        if target_name in present or source_name in present:
            present |= {target_name, source_name}
    ignore_missing = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_missing", None) or []]
    ignore_unexpected = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or []]
    missing = [k for k in expected if k not in present and not any(p.search(k) for p in ignore_missing)]
    if missing:
        more = f" and {len(missing) - 1} more of its {len(expected)} parameters are" if len(missing) > 1 else " is"
        raise DFlashError(f"target weights are incomplete: `{missing[0]}`{more} missing from its safetensors files "
                          "(transformers would fill them with random values)", file=path)
    ignored = {k for k, new in names.items() if new not in expected and any(p.search(k) for p in ignore_unexpected)}
    unexpected = [k for k, new in names.items() if new not in expected and k not in ignored]
    if unexpected:
        more = f" and {len(unexpected) - 1} more stored tensors are" if len(unexpected) > 1 else " is"
        raise DFlashError(f"target weights do not match its config: `{unexpected[0]}`{more} not parameters of "
                          f"{type(model).__name__}", file=path)
    for key, new in names.items():
        if key in ignored:  # a part transformers does not load (a vision tower, MTP heads)
            continue
        want = tuple(expected[new].shape)
        if tuple(stored[key]) != want:
            raise DFlashError(f"target tensor `{key}` has shape {list(stored[key])}, its config implies {list(want)}",
                              file=path)


def auto_class(config, path=None):
    """transformers' Auto class that builds this target: its causal LM, else (a multimodal wrapper with
    no causal-LM class, like Kimi-K2.5) its image-text-to-text model, which generates text the same way."""
    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    for auto in (AutoModelForCausalLM, AutoModelForImageTextToText):
        if type(config) in auto._model_mapping:
            return auto
    if getattr(config, "auto_map", None):  # remote code: transformers itself decides (trust_remote_code)
        return AutoModelForCausalLM
    raise DFlashError(f"transformers {transformers.__version__} has no causal-LM (or image-text-to-text) class for "
                      f"model_type {getattr(config, 'model_type', '?')!r}", file=path)


def meta_model(path: Path, trust_remote_code: bool = False):
    """The target's model class built from its config on the meta device (no memory, no weights)."""
    from transformers import AutoConfig

    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=trust_remote_code)
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return auto_class(config, path).from_config(config, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as exc:
        raise DFlashError(f"cannot build the target model from its config: {str(exc).splitlines()[0]}",
                          file=path) from None


def default_attention(model) -> str:
    """The attention implementation a target runs with unless told: sdpa where its class supports it,
    else eager (gpt-oss: its attention sinks have no sdpa path in transformers)."""
    return "sdpa" if getattr(model, "_supports_sdpa", False) else "eager"


def load_target(source, *, device="cpu", dtype: torch.dtype = torch.float32, attn_implementation: str | None = None,
                trust_remote_code: bool = False, device_map: str | dict | None = None,
                max_memory: dict | None = None, compile: bool = False) -> Target:
    """A Target from a local model directory (safetensors only) or a transformers PreTrainedModel.

    `device_map` ("auto", "balanced", "sequential" or an explicit map) and `max_memory` ({0: bytes,
    "cpu": bytes}) hand placement to transformers + accelerate; what fits nowhere is offloaded to a
    temporary folder kept as long as the Target lives. Without them the whole target goes to `device`.
    `compile`: static cache and compiled verify step (see the module docstring); `attn_implementation`:
    transformers' name, None for default_attention.
    """
    from transformers import PreTrainedModel

    if isinstance(source, PreTrainedModel):
        model = source
        attn_implementation = attn_implementation or default_attention(model)
        if getattr(model.config, "_attn_implementation", None) != attn_implementation:
            model.set_attn_implementation(attn_implementation)
        model = model.to(device=device, dtype=dtype)
        return Target(model, compile=compile)
    path = Path(source)
    if not (path / "config.json").exists():
        raise DFlashError("not a model directory (no config.json)", file=path)
    meta = meta_model(path, trust_remote_code)
    check_target_weights(meta, path)
    attn_implementation = attn_implementation or default_attention(meta)
    auto = auto_class(meta.config, path)
    del meta
    offload = None
    kwargs = {}
    if max_memory is not None and device_map is None:
        device_map = "auto"
    if device_map is not None:
        offload = tempfile.TemporaryDirectory(prefix="dflash-offload-")
        kwargs = dict(device_map=device_map, offload_folder=offload.name,
                      max_memory={int(k) if str(k).isdigit() else k: v for k, v in max_memory.items()}
                      if max_memory else None)
    elif torch.device(device).type == "cuda":
        kwargs = dict(device_map=str(torch.device(device)))  # straight to the GPU, no CPU copy
    placement_log = logging.getLogger("accelerate.big_modeling")  # "some parameters are on the meta device"
    level = placement_log.level
    placement_log.setLevel(logging.ERROR)  # the placement is reported by the caller (Target.offloaded)
    try:
        model, info = auto.from_pretrained(
            str(path), dtype=dtype, attn_implementation=attn_implementation, trust_remote_code=trust_remote_code,
            use_safetensors=True, output_loading_info=True, **kwargs)
    except (OSError, ValueError, KeyError, RuntimeError) as exc:
        raise DFlashError(f"cannot load the target model: {str(exc).splitlines()[0]}", file=path) from None
    finally:
        placement_log.setLevel(level)
    missing = sorted(info.get("missing_keys") or ())
    if missing:  # transformers' own report, for checkpoints whose names a converter rewrites
        raise DFlashError(f"target weights are incomplete: `{missing[0]}` and {len(missing) - 1} more were not in "
                          "its files (transformers filled them with random values)", file=path)
    target = Target(model if device_map is not None or torch.device(device).type == "cuda" else model.to(device),
                    compile=compile)
    target._offload_folder = offload  # removed with the Target
    return target


def target_info(target: Target) -> TargetInfo:
    """What the compatibility rules need to know about a loaded target: its real layer count, hidden
    size and embedding rows, and the pad / eos ids of its config."""
    cfg = target.config
    pad, eos = mapping.special_ids(getattr(cfg, "pad_token_id", None), getattr(cfg, "eos_token_id", None))
    return TargetInfo(name_or_path=getattr(cfg, "_name_or_path", "") or type(target.model).__name__,
                      architectures=list(getattr(cfg, "architectures", None) or []), num_layers=target.num_layers,
                      hidden_size=target.hidden_size, vocab_size=target.vocab_size, pad_token_id=pad,
                      eos_token_ids=eos)


def check_pair(draft, target: Target) -> None:
    """Refuse a draft/target pair that cannot run together (compat.RUN_BLOCKING). `draft` is a DFlashDraft
    or a DraftSpec."""
    spec: DraftSpec = draft if isinstance(draft, DraftSpec) else draft.spec
    checks = compat.compatibility_checks(spec, target_info(target))
    compat.raise_first_failure(checks, names=compat.RUN_BLOCKING)
    check_target(target)


def check_target(target: Target) -> None:
    """Refuse a target whose cache the runtime cannot roll back after rejected proposals (one line)."""
    if getattr(target, "unrollable", None):
        raise DFlashError(f"the runtime cannot run this target ({type(target.model).__name__}): {target.unrollable}")
