"""The runtime side of the toy kind `dflash_bias`: its head adds logit_bias_scale x logit_bias.weight to every
proposing slot's logits (runtime_helpers.BiasedHead, the test-only head the runtime's own tests use)."""

from __future__ import annotations

from dflash_convert.format import catalogue
from dflash_runtime import heads
from runtime_helpers import BiasedHead


def load(draft) -> BiasedHead:
    scale = float(draft.spec.variant_fields["logit_bias_scale"])
    return BiasedHead(scale * draft.tensors[catalogue.name("logit_bias")].float())


KIND = heads.Kind(load)
