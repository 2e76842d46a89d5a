"""The target side: any transformers causal LM, with the three things a DFlash draft needs from it.

1. Context features: the outputs of decoder layers `target_layer_ids` (z-lab ids), captured by
   forward hooks on the layers themselves. transformers' `output_hidden_states[-1]` is the
   final-NORMED state, so a hook is the only correct way to get the last layer's output.
2. A cache that can be rolled back to the committed length after a verify step (`crop`): attention K/V is
   cropped; linear-attention state is copied before a verify block and restored and replayed after a partial
   acceptance (rollback.py). A cache layer the runtime cannot roll back refuses speculative decoding up front.
3. The embedding table and lm_head the draft borrows.
Its attention implementation is its own setting, independent of the draft's backend. Loading and placement
(device maps, offload) are target_load.py's.

With compile=True the cache is transformers' StaticCache (preallocated, written by index; cropping
sets its length, nothing is copied) and verify steps of the run's block size go through a
torch.compile'd forward (CUDA graphs on CUDA); the prefill and other sizes run eagerly on the same
cache. Targets with sliding-window layers (a rolling static cache cannot be cropped back), offloaded
parts or an attention implementation other than sdpa/eager keep the dynamic cache and run eagerly.
    forward: ids [n] at start.. -> float32 logits [n, V], features [n, A*Ht] (capture ids' outputs, concatenated)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dflash_convert.errors import DFlashError
from dflash_convert.format import compat, mapping
from dflash_convert.format.configs import DraftSpec
from dflash_convert.format.mapping import TargetInfo

from .context_cache import CACHE_ROUND
from .rollback import StateRollback, cache_keyword, crop_attention, holds_state, rollback_refusal


def decoder_part(model, name: str) -> torch.nn.Module:
    """A part of a transformers causal LM's decoder: `layers` (model.model.layers for Llama/Qwen) or `norm`
    (the norm after the last layer)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    part = getattr(decoder, name, None)
    if part is None:
        raise DFlashError(f"{type(model).__name__}: cannot find its decoder {name} (expected .model.{name})")
    return part


def target_verify(target: "Target", ids: torch.Tensor, positions: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor | None]:
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
        # transformers names the cache argument `cache` from 5.2x on (`past_key_values`, `cache_params` before,
        # deprecated since): each forward is called with the name it declares, so no release warns
        self.cache_keyword = cache_keyword(self.model.forward, "past_key_values")
        self.rollback = StateRollback(self.layers, self.config, self.unrollable)  # linear-attention state

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
                if hasattr(layer, "activate_past_recording") and not holds_state(layer):
                    layer.activate_past_recording()
        else:
            from transformers import StaticCache

            needed = max(max_len or 0, 1)
            if self.cache is None or self.cache_rows < needed:
                self.cache_rows = -(-needed // CACHE_ROUND) * CACHE_ROUND
                self.cache = StaticCache(config=self.config, max_cache_len=self.cache_rows)
            self._set_length(0)
        self.rollback.start(self.cache)

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
        if not self.rollback.layers:
            self._crop_attention(length)
            return
        ids, start = self.rollback.undo(self.cache_len, length)
        if self.rollback.replays(self.cache):
            self._crop_attention(length)  # attention K/V of the accepted positions stays
            self.rollback.replay(self.cache, length - start)
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
        if remove > 0:
            crop_attention(self.cache, remove)

    @torch.inference_mode()
    def _rerun(self, ids: torch.Tensor, start: int) -> None:
        """The committed tokens ids [k] at start.. through the decoder into the cache (state and K/V);
        no lm_head, the logits are known already."""
        positions = torch.arange(start, start + ids.shape[0], device=self.device)[None]
        decoder = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model
        decoder(input_ids=ids[None], position_ids=positions, use_cache=True,
                **{cache_keyword(decoder.forward, "past_key_values"): self.cache})
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
        self.rollback.before(ids[0], start)  # a verify block: its state may have to be undone
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
