"""DFlash2: the DFlash backbone with grouped dynamic causal convolutions in each layer and a bilinear candidate
selector over the target vocabulary (speculators 0.9.0's GroupedDynamicCausalConv and CandidateSelector; vLLM
qwen3_dflash2.py). It takes every DFlash key; its own four sizes are required."""

from __future__ import annotations

from dflash_convert.format.kinds.dflash import DFlash
from dflash_convert.format.kinds.base import BACKBONE_RULES, ConfigKey, Tensor, sized

NAME = "dflash2"
# convolutions and candidate selector (speculators trains them; vLLM copies them from the top level)
OWN_KEYS = (
    ConfigKey("conv_kernel_size", "vLLM, SGLang, speculators",
              "taps of each grouped dynamic causal convolution inside a block", speculators="conv_kernel_size",
              required=True, typed="size"),
    ConfigKey("conv_group_size", "vLLM, SGLang, speculators",
              "hidden channels sharing one dynamic kernel (must divide hidden_size)",
              speculators="conv_group_size", required=True, typed="size"),
    ConfigKey("selector_rank", "vLLM, SGLang, speculators",
              "rank of the bilinear candidate selector", speculators="selector_rank", required=True, typed="size"),
    ConfigKey("selector_top_k", "vLLM, SGLang, speculators",
              "unary candidates the selector re-ranks (only they get finite draft logits)",
              speculators="selector_top_k", required=True, typed="size"),
)
SIZES = tuple(k.name for k in OWN_KEYS)


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _groups(spec) -> int | None:
    """2 x K x (hidden / G): the dynamic taps' projection width; None while the sizes do not fit."""
    f = spec.variant_fields
    k, g = f.get("conv_kernel_size"), f.get("conv_group_size")
    ok = isinstance(k, int) and isinstance(g, int) and g > 0 and spec.hidden_size % g == 0
    return 2 * k * (spec.hidden_size // g) if ok else None


def _conv_hint(spec) -> str:
    f = spec.variant_fields
    return (f"conv_kernel_size={f.get('conv_kernel_size')}, conv_group_size={f.get('conv_group_size')}, "
            f"hidden_size={spec.hidden_size}")


def _selector_hint(spec) -> str:
    return f"selector_rank={spec.variant_fields.get('selector_rank')}, vocab_size={spec.vocab_size}"


def _projection_shape(spec):
    width = _groups(spec)
    return None if width is None else sized(spec, width, "hidden")


# K taps, groups of G channels, a rank-R selector over the target vocab; unsized while a size is missing or does
# not divide
TENSORS = (
    *(Tensor(f"{part}_conv_base_kernel", f"layers.{{i}}.{part}_conv.base_kernel", "dflash2 static conv taps",
             lambda s: sized(s, 2, "conv_kernel_size", "hidden"), check="family_shapes",
             hint=_conv_hint)
      for part in ("attention", "mlp")),
    *(Tensor(f"{part}_conv_kernel_projection", f"layers.{{i}}.{part}_conv.kernel_projection.weight",
             "dflash2 dynamic conv taps", _projection_shape, check="family_shapes",
             hint=_conv_hint)
      for part in ("attention", "mlp")),
    *(Tensor(f"selector_{leaf}", f"candidate_selector.{leaf}", "dflash2 selector codebook",
             lambda s: sized(s, "vocab", "selector_rank"), check="family_shapes",
             hint=_selector_hint)
      for leaf in ("predecessor_codebook", "successor_codebook")),
    Tensor("selector_hidden_projection", "candidate_selector.hidden_projection.weight",
           "dflash2 selector projection", lambda s: sized(s, "selector_rank", "hidden"),
           check="family_shapes", hint=_selector_hint),
)

# What its keys must satisfy for speculators' own model and the engines to build it (speculators 0.9.0 dflash2
# GroupedDynamicCausalConv / CandidateSelector / DFlash2DraftModel; vLLM qwen3_dflash2.py)
RULES = (
    ("conv_kernel_size, conv_group_size, selector_rank and selector_top_k are positive integers "
     "(vLLM reads each with int(dflash_config[...]))",
     lambda f, h, v, b, p: all(_int(f.get(k)) for k in SIZES)),
    ("conv_group_size divides hidden_size (vLLM and speculators refuse otherwise)",
     lambda f, h, v, b, p: not _int(f.get("conv_group_size")) or h % f["conv_group_size"] == 0),
    ("conv_kernel_size is at most block_size (taps stay inside a block)",
     lambda f, h, v, b, p: not _int(f.get("conv_kernel_size")) or b is None or f["conv_kernel_size"] <= b),
    ("selector_top_k is at most the vocabulary",
     lambda f, h, v, b, p: not _int(f.get("selector_top_k")) or f["selector_top_k"] <= v),
    ("the vocabulary is the target's (speculators builds dflash2 only without a pruned vocab)",
     lambda f, h, v, b, p: not p),
)


class DFlash2(DFlash):
    name = NAME
    title = "DFlash2"
    hf_architecture = "DFlash2DraftModel"
    speculators_architecture = "DFlash2DraftModel"
    keys = (*OWN_KEYS, *DFlash.keys)
    tensors = TENSORS
    rules = RULES
    modules = "convolution and selector"
    engine_support = BACKBONE_RULES  # vLLM's and SGLang's DFlash2 models (V2 model runner only in vLLM)
    speculators_non_causal_default = True
    legacy_block_writer = False
    vllm_v1_refusal = "Model Runner V1 does not support: DFlash candidate-head drafts"
    vllm_v1_label = "DFlash2 candidate head"

    def card_note(self) -> list[str]:
        return [f"This is a `{self.name}` draft: the commands below are those for DFlash drafts; check that "
                f"your engine version supports `{self.name}`.", ""]


KIND = DFlash2()
