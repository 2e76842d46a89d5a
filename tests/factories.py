"""Tiny real checkpoints for tests: random Qwen3 targets and drafts saved by speculators 0.9.0 itself.

Everything is built on the fly in a temporary directory; nothing is downloaded.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import torch

VOCAB = 512
HIDDEN = 64


def make_target(path: Path, *, layers: int = 8, hidden: int = HIDDEN, vocab: int = VOCAB, seed: int = 0,
                attn: str = "sdpa") -> Path:
    """A random-weight Qwen3ForCausalLM saved with save_pretrained (config.json + model.safetensors)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=hidden // 4, max_position_embeddings=256,
                      rms_norm_eps=1e-6, tie_word_embeddings=False, eos_token_id=vocab - 2, pad_token_id=vocab - 3,
                      bos_token_id=None, attn_implementation=attn)
    model = Qwen3ForCausalLM(cfg).eval()
    model.save_pretrained(path)
    return Path(path)


def make_speculators_draft(path: Path, target: Path, *, layers: int = 2, aux_ids=(1, 4, 6), block_size: int = 8,
                           mask_token_id: int = VOCAB - 1, draft_vocab: int | None = None,
                           full_attention_indices=(), sliding_window: int = 2048,
                           sliding_window_non_causal: bool | None = None, algorithm: str = "dflash",
                           legacy_save: bool = False, attention_bias: bool = False, seed: int = 1,
                           dtype=torch.float32, **family) -> Path:
    """A DFlash-family draft built and saved by speculators' own classes (trainer-default shaping).

    `algorithm` is dflash, dflash2 or dspark; `family` holds that class's own training arguments
    (dflash2: conv_kernel_size, conv_group_size, selector_rank, selector_top_k; dspark: markov_rank,
    markov_head_type, enable_confidence_head, confidence_head_with_markov, sample_from_anchor).
    `draft_vocab` < target vocab makes a pruned draft with its own lm_head and d2t/t2d.
    `legacy_save` mimics speculators <= 0.8, which also saved embed_tokens and a full lm_head.
    Every trained weight is random and not an identity (convolutions, selector, Markov and
    confidence heads included), so a round trip or a runtime that skips a module is caught.
    """
    from speculators.train.cli import create_transformer_layer_config

    if algorithm == "dflash2":
        from speculators.models.dflash2.core import DFlash2DraftModel as Model
    elif algorithm == "dspark":
        from speculators.models.dspark.core import DSparkDraftModel as Model
    else:
        from speculators.models.dflash import DFlashDraftModel as Model

    torch.manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        layer_cfg = create_transformer_layer_config(str(target), layers, "qwen3", None, sliding_window,
                                                    list(full_attention_indices))
        layer_cfg.attention_bias = attention_bias
        vocab = layer_cfg.vocab_size
        t2d = d2t = None
        if draft_vocab is not None and draft_vocab != vocab:
            g = torch.Generator().manual_seed(seed)
            kept = torch.sort(torch.randperm(vocab, generator=g)[:draft_vocab]).values
            kept[-1] = mask_token_id if mask_token_id not in kept else kept[-1]
            kept = torch.sort(torch.unique(kept)).values
            assert len(kept) == draft_vocab
            t2d = torch.zeros(vocab, dtype=torch.bool)
            t2d[kept] = True
            d2t = kept - torch.arange(draft_vocab)
        kwargs = dict(draft_vocab_size=draft_vocab or vocab, block_size=block_size, verifier_name_or_path=str(target),
                      target_layer_ids=list(aux_ids), mask_token_id=mask_token_id, draft_attn_impl="sdpa",
                      **family)
        if sliding_window_non_causal is not None:
            kwargs["sliding_window_non_causal"] = sliding_window_non_causal
        model = Model.from_training_args(layer_cfg, t2d=t2d, d2t=d2t, **kwargs)
        # random, finite weights for everything trained
        with torch.no_grad():
            for name, p in model.named_parameters():
                if not name.startswith(("embed_tokens", "verifier_", "lm_head")) and p.is_floating_point():
                    p.copy_(torch.randn_like(p) * (0.02 if p.dim() > 1 else 1.0) + (1.0 if p.dim() == 1 else 0.0))
            if t2d is not None:
                model.lm_head.weight.copy_(torch.randn_like(model.lm_head.weight) * 0.02)
        model.to(dtype)
        if legacy_save:
            model.__dict__["_keys_to_ignore_on_save"] = ["verifier_lm_head.weight", "verifier_norm.weight"]
        model.save_pretrained(str(path))
    return Path(path)


def read_config(path: Path) -> dict:
    return json.loads((Path(path) / "config.json").read_text())
