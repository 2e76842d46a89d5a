"""The target side: any transformers causal LM, with the three things a DFlash draft needs from it.

1. Context features: the outputs of decoder layers `target_layer_ids` (z-lab ids), captured by
   forward hooks on the layers themselves. transformers' `output_hidden_states[-1]` is the
   final-NORMED state, so a hook is the only correct way to get the last layer's output.
2. A KV cache that can be cropped back to the committed length after a verify step.
3. The embedding table and lm_head the draft borrows.
Its attention implementation is its own setting, independent of the draft's backend.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from dflash_convert.configs import DraftSpec
from dflash_convert.errors import DFlashError


def decoder_layers(model) -> torch.nn.ModuleList:
    """The decoder layer stack of a transformers causal LM (model.model.layers for Llama/Qwen)."""
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    layers = getattr(decoder, "layers", None)
    if layers is None:
        raise DFlashError(f"{type(model).__name__}: cannot find its decoder layers (expected .model.layers)")
    return layers


class Target:
    """A causal LM run one sequence at a time (batch 1) with a croppable KV cache."""

    def __init__(self, model):
        self.model = model.eval().requires_grad_(False)
        self.config = model.config
        self.layers = decoder_layers(model)
        self.num_layers = len(self.layers)
        self.embed_tokens = model.get_input_embeddings()  # [V, Ht]
        self.lm_head = model.get_output_embeddings()  # Ht -> V
        if self.lm_head is None:
            raise DFlashError(f"{type(model).__name__}: has no output embeddings (lm_head)")
        self.vocab_size, self.hidden_size = self.embed_tokens.weight.shape
        self.device = self.embed_tokens.weight.device
        self.dtype = self.embed_tokens.weight.dtype
        self.capture_ids: list[int] = []
        self._captured: dict[int, torch.Tensor] = {}
        self._hooks = []
        self.cache = None

    # ------------------------------------------------------------------ feature capture

    def set_capture(self, layer_ids: list[int]) -> None:
        """Capture the outputs of these decoder layers (z-lab ids) on every forward."""
        bad = [i for i in layer_ids if not 0 <= i < self.num_layers]
        if bad:
            raise DFlashError(f"target layer ids {bad} do not exist: the target has {self.num_layers} layers "
                              f"(0..{self.num_layers - 1})")
        for h in self._hooks:
            h.remove()
        self._hooks = [self.layers[i].register_forward_hook(self._hook(i)) for i in dict.fromkeys(layer_ids)]
        self.capture_ids = list(layer_ids)

    def _hook(self, layer_id: int):
        def store(module, args, output):  # noqa: ARG001
            out = output[0] if isinstance(output, tuple) else output  # [1, n, Ht]
            self._captured[layer_id] = out[0]
        return store

    # ------------------------------------------------------------------ cache

    def reset(self) -> None:
        from transformers import DynamicCache

        self.cache = DynamicCache(config=self.config)
        if hasattr(self.cache, "activate_past_recording"):  # sliding-window layers can then be rolled back
            self.cache.activate_past_recording()

    @property
    def cache_len(self) -> int:
        return 0 if self.cache is None else self.cache.get_seq_length()

    def crop(self, length: int) -> None:
        """Keep the first `length` positions of the KV cache (drop rejected drafts)."""
        remove = self.cache_len - length
        if remove > 0:
            self.cache.crop(-remove)

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
        positions = torch.arange(start, start + n, device=self.device)[None]
        out = self.model(input_ids=ids[None].to(self.device), position_ids=positions, past_key_values=self.cache,
                         use_cache=True, logits_to_keep=1 if last_logits_only else 0)
        self.cache = out.past_key_values
        features = None
        if self.capture_ids:
            features = torch.cat([self._captured[i] for i in self.capture_ids], dim=-1)
        return out.logits[0].float(), features

    def embed(self, ids: torch.Tensor) -> torch.Tensor:
        """Raw embedding rows [n, Ht] (the draft embeds its block with the target's table)."""
        return F.embedding(ids.to(self.device), self.embed_tokens.weight)


def load_target(source, *, device="cpu", dtype: torch.dtype = torch.float32, attn_implementation: str = "sdpa",
                trust_remote_code: bool = False) -> Target:
    """A Target from a local model directory (safetensors only) or a transformers PreTrainedModel."""
    from transformers import AutoModelForCausalLM, PreTrainedModel

    if isinstance(source, PreTrainedModel):
        model = source
        if getattr(model.config, "_attn_implementation", None) != attn_implementation:
            model.set_attn_implementation(attn_implementation)
        model = model.to(device=device, dtype=dtype)
        return Target(model)
    path = Path(source)
    if not (path / "config.json").exists():
        raise DFlashError("not a model directory (no config.json)", file=path)
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype, attn_implementation=attn_implementation,
                                                     trust_remote_code=trust_remote_code, use_safetensors=True)
    except (OSError, ValueError, KeyError) as exc:
        raise DFlashError(f"cannot load the target model: {str(exc).splitlines()[0]}", file=path) from None
    return Target(model.to(device))


def check_pair(draft, target: Target) -> None:
    """Refuse a draft/target pair that cannot run together. `draft` is a DFlashDraft or a DraftSpec."""
    spec: DraftSpec = draft if isinstance(draft, DraftSpec) else draft.spec
    ids = spec.target_layer_ids or []
    bad = [i for i in ids if not 0 <= i < target.num_layers]
    if bad:
        raise DFlashError(f"draft target_layer_ids {ids} name layer(s) {bad}, but the target has only "
                          f"{target.num_layers} decoder layers (0..{target.num_layers - 1})")
    fc = getattr(draft, "fc", None)
    width = fc.shape[1] if fc is not None else spec.context_width
    if width != len(ids) * target.hidden_size:
        raise DFlashError(f"draft `fc.weight` takes {width} inputs, but the target gives {len(ids)} layer ids x "
                          f"hidden size {target.hidden_size} = {len(ids) * target.hidden_size}")
    if spec.hidden_size != target.hidden_size:
        raise DFlashError(f"draft hidden size {spec.hidden_size} differs from the target's {target.hidden_size}: "
                          "the draft embeds its block with the target's embedding and reads the target's lm_head")
    if spec.vocab_size != target.vocab_size:
        raise DFlashError(f"draft vocab_size {spec.vocab_size} differs from the target's vocabulary "
                          f"({target.vocab_size} embedding rows)")
    if spec.mask_token_id is None or not 0 <= spec.mask_token_id < target.vocab_size:
        raise DFlashError(f"draft mask_token_id {spec.mask_token_id} is outside the target vocabulary "
                          f"(0..{target.vocab_size - 1})")
