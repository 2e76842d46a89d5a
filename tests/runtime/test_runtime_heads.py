"""A draft kind plugs into the runtime through the head registry (dflash_runtime.heads.KINDS) alone.

The kind here is defined only in this file: the plain DFlash head with a fixed logit bias. Registered (in place
of the dflash entry: naming a new variant in the config is the format side's), load_draft builds it and the
decode loop runs it, with no other runtime module knowing of it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dflash_runtime import heads, load_draft, load_target, speculative_generate, target_generate
from runtime_helpers import BiasedHead, assert_decode_alike, first_proposals

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"
FAVOURITE = 7  # the token the biased head pushes


def biased_kind(strength: float) -> heads.Kind:
    def load(draft) -> BiasedHead:
        bias = torch.zeros(draft.spec.vocab_size, device=draft.device)
        bias[FAVOURITE] = strength
        return BiasedHead(bias)
    return heads.Kind(load)


@pytest.fixture(scope="module")
def pair_target():
    return load_target(PAIR / "target")


def test_a_zero_bias_kind_decodes_as_the_plain_draft(pair_target, monkeypatch):
    """Through the registry, the test kind runs the whole backbone: with no bias it is the plain draft, token for
    token and acceptance for acceptance (tau > 2: real acceptances)."""
    plain = load_draft(PAIR / "draft")
    monkeypatch.setitem(heads.KINDS, "dflash", biased_kind(0.0))
    zero = load_draft(PAIR / "draft")
    assert isinstance(zero.head, BiasedHead) and not isinstance(plain.head, BiasedHead)
    assert_decode_alike(plain, zero, pair_target)


def test_the_registered_kind_decides_the_proposals(pair_target, monkeypatch):
    """A large bias: the test kind's head picks every proposal (all FAVOURITE), its logits are the ones the draft
    returns, and greedy output is still the target's own."""
    monkeypatch.setitem(heads.KINDS, "dflash", biased_kind(1e4))
    draft = load_draft(PAIR / "draft")
    prompt = [5, 6, 7, 8]
    ids, logits = first_proposals(draft, pair_target, prompt)
    assert ids.tolist() == [FAVOURITE] * draft.proposals() and (logits.argmax(-1) == FAVOURITE).all()
    out = speculative_generate(draft, pair_target, prompt, max_new_tokens=24)
    assert out.tokens == target_generate(pair_target, prompt, max_new_tokens=24).tokens
