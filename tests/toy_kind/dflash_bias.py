"""The format side of the toy kind `dflash_bias`: the DFlash backbone plus `logit_bias.weight` [draft_vocab], a bias
over the draft vocabulary added to every proposing slot's logits, scaled by the required float key
`logit_bias_scale`. No serving engine has a model of it: it is runtime only."""

from __future__ import annotations

from dflash_convert.format.kinds.base import RUNTIME_ONLY, ConfigKey, Tensor
from dflash_convert.format.kinds.dflash import DFlash

NAME = "dflash_bias"
BIAS = "logit_bias.weight"


class DFlashBias(DFlash):
    name = NAME
    title = "DFlash-bias"
    hf_architecture = "DFlashBiasDraftModel"
    speculators_architecture = "DFlashBiasDraftModel"
    keys = (*DFlash.keys, ConfigKey("logit_bias_scale", "the dflash_bias head (tests)", "scales logit_bias.weight",
                                    speculators="logit_bias_scale", required=True, typed="float"))
    tensors = (Tensor("logit_bias", BIAS, "dflash_bias logit bias [draft_vocab]", lambda s: (s.draft_vocab,),
                      check="family_shapes"),)
    modules = "logit bias"
    legacy_block_writer = False
    engine_support = RUNTIME_ONLY


KIND = DFlashBias()
