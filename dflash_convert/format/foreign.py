"""DSpark drafts of other decoders, as data: how vLLM 0.33 and SGLang 0.5.23 find and serve each, and why
dflash-convert has nothing to convert. `mapping.detect_format` refuses them with this one line.

Two shapes exist (docs/formats.md section 16 names the engine function behind each row):
- bundled: DeepSeek V4 / V4.1 ship the draft as `mtp.*` tensors of the target checkpoint, described by the
  target's own config.json (`dspark_*` keys). Both engines load it from the target in place, under the
  target's config and quantization; a copy of those tensors serves only beside a target of that same config.
- standalone: Gemma 4, Kimi K3 and Muse Spark DSpark drafts are directories of their own that vLLM loads
  as they are; their decoders (and their config keys) are not Qwen3's, which is the only decoder the two
  formats here and the bundled runtime hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ForeignLayout:
    what: str  # what the checkpoint is
    serve: str  # what the engines do with it instead
    why: str  # why there is nothing to convert

    def line(self, found: str, config: dict[str, Any]) -> str:
        return f"{found}: {self.what}; {self.serve.format(**config)}; nothing to convert: {self.why}"


_DEEPSEEK_SERVE = ("vLLM serves it from the target with --speculative-config '{{\"method\": \"dspark\", "
                   "\"num_speculative_tokens\": {dspark_block_size}}}' (no model), SGLang with "
                   "--speculative-algorithm DSPARK (no draft path), neither on CPU")
_DEEPSEEK_WHY = ("both read mtp.* in place under the target's config and quantization, so a copy serves only "
                 "beside a target of that same config and quantization, which DeepSeek ships with those tensors "
                 "inside, and neither format here nor the runtime holds a DeepSeek decoder")
DEEPSEEK_DSPARK = ForeignLayout(
    "a DeepSeek V4 target whose DSpark draft is its own mtp.* tensors (MLA and MoE layers, MXFP4 or FP8 experts)",
    _DEEPSEEK_SERVE, _DEEPSEEK_WHY)
DEEPSEEK_DSPARK_NAME = ForeignLayout(
    "vLLM's name for a DeepSeek V4 DSpark draft, which it reads from the target's mtp.* tensors",
    _DEEPSEEK_SERVE, _DEEPSEEK_WHY)
DEEPSEEK_MTP = ForeignLayout(
    "a DeepSeek V4 target with multi-token-prediction layers (mtp.*), an autoregressive drafter",
    "vLLM serves them from the target with --speculative-config '{{\"method\": \"mtp\", "
    "\"num_speculative_tokens\": {num_nextn_predict_layers}}}' (no model), SGLang with "
    "--speculative-algorithm EAGLE (no draft path)", "they are the target's own layers, read in place")

_STANDALONE_SERVE = ("a standalone draft already: vLLM serves this directory as it is with --speculative-config "
                     "'{{\"method\": \"dspark\", \"model\": \"<this directory>\"}}'; SGLang 0.5.23 has no loader "
                     "for it")
_NOT_QWEN3 = "neither format here nor the runtime holds a decoder other than Qwen3's"
STANDALONE = {
    "Gemma4DSparkModel": ForeignLayout(
        "a Gemma 4 DSpark draft (Gemma 4 attention: K reused as V where attention_k_eq_v, an unweighted v_norm, "
        "per-layer head sizes; embeddings scaled by sqrt(hidden_size); its own embed_tokens and lm_head)",
        _STANDALONE_SERVE, _NOT_QWEN3),
    "K3DSparkModel": ForeignLayout(
        "a Kimi K3 DSpark draft (MLA draft layers: q_a_proj, kv_a_proj_with_mqa; context_proj and "
        "context_norm for the target features)", _STANDALONE_SERVE, _NOT_QWEN3),
    "MuseSparkDSparkModel": ForeignLayout(
        "a Muse Spark DSpark draft (model_type muse_spark_dspark: a gated attention output, an output "
        "multiplier and soft cap, its own lm_head and d2t)", _STANDALONE_SERVE, _NOT_QWEN3),
    "DSparkDraftModel": DEEPSEEK_DSPARK_NAME,
    "DSparkV41DraftModel": DEEPSEEK_DSPARK_NAME,
}
STANDALONE_MODEL_TYPES = {"muse_spark_dspark": "MuseSparkDSparkModel"}

DEEPSEEK_TARGET_ARCHITECTURES = ("DeepseekV4ForCausalLM", "DeepseekV41ForCausalLM")
DEEPSEEK_TARGET_MODEL_TYPES = ("deepseek_v4", "deepseek_v41")
# SGLang's mark of a target that bundles a DSpark draft (checkpoint_bundles_dspark_draft): any of these keys
DSPARK_BUNDLE_KEYS = ("dspark_block_size", "dspark_markov_rank", "dspark_noise_token_id", "dspark_target_layer_ids")
MTP_LAYERS_KEY = "num_nextn_predict_layers"


def identify(raw: dict[str, Any]) -> tuple[str, ForeignLayout, dict[str, Any]] | None:
    """(the config fact that names it, the layout, the keys its line quotes) for a foreign DSpark layout."""
    archs = [a for a in raw.get("architectures") or [] if isinstance(a, str)]
    model_type = raw.get("model_type") if isinstance(raw.get("model_type"), str) else None
    arch = next((a for a in archs if a in STANDALONE), STANDALONE_MODEL_TYPES.get(model_type))
    if arch is None:
        deepseek = model_type in DEEPSEEK_TARGET_MODEL_TYPES or any(a in DEEPSEEK_TARGET_ARCHITECTURES for a in archs)
        return _deepseek_target(raw, archs, model_type) if deepseek else None
    found = f"architectures naming {arch}" if arch in archs else f"model_type {model_type!r}"
    return found, STANDALONE[arch], _quoted(raw)


def _deepseek_target(raw: dict[str, Any], archs: list[str], model_type: str | None
                     ) -> tuple[str, ForeignLayout, dict] | None:
    """V4.1 may nest its text keys under text_config; SGLang merges them to the top level first, and so do we."""
    text = raw.get("text_config")
    merged = {**text, **raw} if isinstance(text, dict) else raw
    what = next((a for a in archs if a in DEEPSEEK_TARGET_ARCHITECTURES), model_type)
    key = next((k for k in DSPARK_BUNDLE_KEYS if merged.get(k) is not None), None)
    if key is not None:
        return f"field `{key}` of a {what} config", DEEPSEEK_DSPARK, _quoted(merged)
    if type(merged.get(MTP_LAYERS_KEY)) is int and merged[MTP_LAYERS_KEY] > 0:
        return f"field `{MTP_LAYERS_KEY}` of a {what} config", DEEPSEEK_MTP, _quoted(merged)
    return None


def _quoted(config: dict[str, Any]) -> dict[str, str]:
    """The counts a line quotes; anything but a plausible one (a hostile value is not echoed) as <key>."""
    def value(key: str) -> str:
        v = config.get(key)
        return str(v) if type(v) is int and 0 < v < 2**31 else f"<{key}>"
    return {k: value(k) for k in ("dspark_block_size", MTP_LAYERS_KEY)}


# SGLang's other place for a draft inside a target checkpoint (speculative_hook._target_checkpoint_dspark_subfolder):
# a dspark/ folder with its own config.json and weights, taken as the draft path when none is given
DRAFT_SUBFOLDER = "dspark"


def subfolder_hint(folder: str) -> str:
    return (f"SGLang serves the DSpark draft in its {DRAFT_SUBFOLDER}/ subfolder (--speculative-algorithm DSPARK "
            f"with no draft path); to read that draft here, name the subfolder: {folder}")
