"""How near each greedy verify decision sat to another outcome (dflash_runtime.ties): the gaps the engine
comparison stops at, on hand-made logits, and as the decode loop records them."""

from __future__ import annotations

import math

import torch

from dflash_runtime import Sampling, load_draft, speculative_generate
from dflash_runtime.ties import decision, relative_gaps
from runtime_helpers import one_torch_thread  # noqa: F401 (autouse fixture)

V = 12


def _rows(*tops: dict[int, float]) -> torch.Tensor:
    """[len(tops), V] logits: -10 everywhere but the given {token: logit}."""
    out = torch.full((len(tops), V), -10.0)
    for r, top in enumerate(tops):
        for token, logit in top.items():
            out[r, token] = logit
    return out


def test_gaps_are_relative_to_the_binade_of_the_top_logit():
    """24.25 - 24.125 is one bf16 ulp at 24 (binade 16): 0.125 / 16 = 2^-7; the same in the binade [1, 2)."""
    gaps = relative_gaps(torch.tensor([[24.25, 24.125, 0.0], [1.5, 1.5 - 2 ** -7, -1.0]]))
    assert gaps[0, 1] == gaps[1, 1] == 2.0 ** -7 and gaps[0, 0] == gaps[1, 0] == 0


def test_a_kept_slot_near_another_token_in_the_draft_or_the_target():
    """Both proposals kept (3 then 4); the draft had 5 one bf16 ulp from 4 at slot 2, so the count sat one ulp
    from another outcome; the token committed after them (row 3) was clear."""
    draft = _rows({3: 24.25}, {4: 24.25, 5: 24.125})
    target = _rows({3: 20.0}, {4: 20.0}, {7: 18.0})
    d = decision(torch.tensor([3, 4]), draft, target, 2)
    assert d.accepted == 2 and d.margin == d.next_margin == 2.0 ** -7
    target = _rows({3: 20.0, 9: 19.875}, {4: 20.0}, {7: 18.0})  # the target's 9 one ulp below 3 at slot 1
    assert decision(torch.tensor([3, 4]), _rows({3: 24.25}, {4: 24.25}), target, 2).margin == 2.0 ** -7


def test_a_rejecting_slot_is_near_a_tie_only_where_both_rows_meet():
    """Proposal 8 rejected for the target's 6: another outcome needs a token near the top of both rows. The
    draft's 6 sits 2 ulps below its 8, and is the target's top: both could meet on 6 at 2 ulps (on 8 at 3, the
    target's 8 being 3 ulps below its 6). Tokens near only one row's top do not make a tie."""
    draft = _rows({8: 24.0, 6: 23.75})
    target = _rows({6: 24.0, 8: 23.625}, {1: 5.0})
    d = decision(torch.tensor([8]), draft, target, 0)
    assert d.accepted == 0 and d.margin == 2 * 2.0 ** -7
    # the draft's 2 one ulp from its top, the target's 3 one ulp from its top: no token near both
    far = decision(torch.tensor([8]), _rows({8: 24.0, 6: 10.0, 2: 23.875}), _rows({6: 24.0, 3: 23.875}, {1: 5.0}), 0)
    assert far.margin > 0.5


def test_the_committed_token_ties_only_the_next_margin():
    """All proposals kept and the bonus row's top two one ulp apart: the count was clear, the output was not."""
    d = decision(torch.tensor([3]), _rows({3: 24.0}), _rows({3: 20.0}, {5: 24.0, 6: 23.875}), 1)
    assert d.margin > 0.5 and d.next_margin == 2.0 ** -7
    lone = decision(torch.tensor([3]), _rows({3: 24.0}), _rows({3: 20.0}, {5: 24.0}), 1)
    assert lone.margin > 0.5 and lone.next_margin > 0.5 and not math.isinf(lone.next_margin)


def test_the_loop_records_one_decision_per_verify_step(speculators_drafts, runtime_target):
    """Greedy with record_decisions: one Decision per step, its count the step's, margins >= 0 and the next
    margin never above the count's; sampled, or not asked: none recorded."""
    draft = load_draft(speculators_drafts["full"])
    prompt = list(range(40, 61))
    gen = speculative_generate(draft, runtime_target, prompt, max_new_tokens=16, record_decisions=True,
                               full_last_block=True)
    assert len(gen.decisions) == gen.stats.num_drafts > 0
    assert sum(d.accepted for d in gen.decisions) == gen.stats.accepted
    assert all(0 <= d.next_margin <= d.margin for d in gen.decisions)
    assert speculative_generate(draft, runtime_target, prompt, max_new_tokens=16).decisions is None
    sampled = speculative_generate(draft, runtime_target, prompt, max_new_tokens=16, record_decisions=True,
                                   sampling=Sampling(temperature=1.0, seed=0))
    assert sampled.decisions is None
