"""The bundled DFlash runtime: draft model, attention backends, transformers target, decode loop.

A layer of dflash-convert, not a library of its own: it ships in the same distribution under its own import
name, reads checkpoints and their rules through dflash_convert.format, dflash_convert.io and
dflash_convert.errors only, and is imported by validate (and nothing below it). tests/test_structure.py
holds it to that. One concept per module:
    draft: DFlashDraft (weights, context cache, compiled step)    draft_load: load_draft (refusals, tensors)
    step: the step's math as plain functions (compiled whole)     rope, context_cache, attention (backends)
    heads: a kind's head and the registry (dflash, dflash2, dspark: one module each)
    target: Target (forward, feature capture, crop)               rollback: linear-attention state rollback
    target_load: load_target (weights check, placement)           decode: the loop; sampling, ties, metrics

    from dflash_runtime import Penalties, Sampling, load_draft, load_target, speculative_generate, target_generate
    draft = load_draft("path/to/draft", backend="auto")
    target = load_target("path/to/target")
    out = speculative_generate(draft, target, prompt_ids, max_new_tokens=64)   # greedy
    out.tokens, out.stats.tau
    sampled = Sampling(temperature=0.7, top_p=0.9, penalties=Penalties(repetition=1.1), stop_token_ids=[2], seed=0)
    out = speculative_generate(draft, target, prompt_ids, max_new_tokens=64, sampling=sampled)

Names are imported lazily so that `import dflash_runtime` alone does not import torch.
"""

from __future__ import annotations

_EXPORTS = {
    "load_draft": "draft_load", "DFlashDraft": "draft",
    "BACKENDS": "attention", "select_backend": "attention",
    "load_target": "target_load", "Target": "target", "check_pair": "target", "check_target": "target",
    "speculative_generate": "decode", "target_generate": "decode", "Generation": "decode",
    "DecodeStats": "metrics", "Penalties": "sampling", "Sampling": "sampling",
    "resolve_device": "device", "resolve_dtype": "device",
}
__all__ = list(_EXPORTS) + ["BACKEND_NAMES", "DRAFT_SAMPLING", "DEVICE_MAPS"]

# The draft attention backends (attention.BACKENDS), fastest first: named here so callers such as
# the CLI can list them without importing torch.
BACKEND_NAMES = ("flash_attn", "sdpa", "flex", "eager")
# How the decode loop draws the draft's proposals (decode.speculative_generate), vLLM's names.
DRAFT_SAMPLING = ("greedy", "probabilistic")
# transformers + accelerate placement strategies load_target(device_map=...) accepts by name.
DEVICE_MAPS = ("auto", "balanced", "balanced_low_0", "sequential")


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dflash_runtime' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f".{_EXPORTS[name]}", __name__), name)
