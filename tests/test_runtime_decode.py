"""The decode loop: greedy speculative output is the target's own greedy output, token for token;
acceptance is counted as docs/formats.md section 7 says; stop tokens, max_new_tokens, sampling seeds,
draft windows and run-time block sizes behave as documented."""

from __future__ import annotations

import importlib
import warnings

import pytest
import torch

from dflash_convert.errors import UsageError
from dflash_runtime import Penalties, Sampling, load_draft, load_target, speculative_generate, target_generate
from dflash_runtime.draft import DFlashDraft
from runtime_helpers import DEVICES, one_torch_thread, record_calls  # noqa: F401 (autouse fixture)

PROMPTS = ([3, 17, 250, 9], [100] * 7, list(range(40, 61)))
N = 12


@pytest.fixture(scope="session")
def reference(runtime_target):
    """transformers' own greedy generate for each prompt (the ground truth)."""
    out = {}
    for p in PROMPTS:
        with torch.no_grad():
            ids = runtime_target.model.generate(torch.tensor([p]), max_new_tokens=N, do_sample=False,
                                               pad_token_id=509)
        out[tuple(p)] = ids[0, len(p):].tolist()
    return out


def test_target_only_equals_transformers_generate(runtime_target, reference):
    for p in PROMPTS:
        ref = reference[tuple(p)]
        gen = target_generate(runtime_target, p, max_new_tokens=N)
        assert gen.tokens[:len(ref)] == ref
        assert gen.stats.num_drafts == 0 and gen.stats.tau == 1.0 and gen.stats.new_tokens == N


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name,block_size", [("full", None), ("non_causal", 4), ("pruned", 12), ("mixed", None)])
def test_greedy_speculative_equals_target_greedy(name, block_size, device, speculators_drafts, runtime_target,
                                                 tiny_target, reference):
    """On each device present (fp32: the argmax of a random tiny model has no near-ties to flip)."""
    if device != "cpu":
        runtime_target = load_target(tiny_target, device=device)
    draft = load_draft(speculators_drafts[name], device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for p in PROMPTS:
            gen = speculative_generate(draft, runtime_target, p, max_new_tokens=N, block_size=block_size)
            ref = reference[tuple(p)]
            assert gen.tokens[:len(ref)] == ref, p
            s = gen.stats
            assert s.new_tokens == len(gen.tokens) == N
            assert s.tau == pytest.approx(1 + s.accepted / s.num_drafts)
            assert draft.cache.end == len(p) + N - 1  # every committed token but the last anchor is context


class OracleDraft(DFlashDraft):
    """A real draft whose proposals are replaced by the target's true continuation, with the
    proposal at slot `wrong` (0-based) corrupted: every step must accept exactly `wrong` drafts."""

    def setup(self, truth: list[int], wrong: int | None):
        self.truth, self.wrong = truth, wrong
        return self

    def propose(self, anchor_id, start, *, embed, lm_head, block_size=None, draft_window=None):
        super().propose(anchor_id, start, embed=embed, lm_head=lm_head, block_size=block_size,
                        draft_window=draft_window)  # run the real forward (its context must be right)
        n = (block_size or self.block_size) - 1
        ids = torch.tensor(self.truth[start + 1:start + 1 + n])
        if self.wrong is not None and self.wrong < n:
            ids[self.wrong] = (ids[self.wrong] + 1) % 500
        return ids, None


def oracle(path, truth, wrong):
    draft = load_draft(path)
    draft.__class__ = OracleDraft
    return draft.setup(truth, wrong)


@pytest.mark.parametrize("wrong", [None, 0, 2, 5])
def test_acceptance_is_counted_per_position(wrong, speculators_drafts, runtime_target):
    B, steps = 8, 3
    prompt = PROMPTS[0]
    a = B - 1 if wrong is None else wrong  # drafts accepted per step
    n = 1 + steps * (a + 1)  # the prefill token, then a + 1 tokens per step
    base = target_generate(runtime_target, prompt, max_new_tokens=n)
    draft = oracle(speculators_drafts["full"], prompt + base.tokens, wrong)
    gen = speculative_generate(draft, runtime_target, prompt, max_new_tokens=n)
    assert gen.tokens == base.tokens
    s = gen.stats
    assert s.num_drafts == steps and s.accepted == steps * a and s.tau == a + 1
    assert s.per_position_rates == [1.0] * a + [0.0] * (B - 1 - a)
    assert s.drafted == sum(min(B, n - 1 - i * (a + 1) + 1) - 1 for i in range(steps))
    assert draft.cache.end == len(prompt) + n - 1


def test_stop_tokens_and_max_new_tokens(speculators_drafts, runtime_target, reference):
    draft = load_draft(speculators_drafts["full"])
    ref = reference[tuple(PROMPTS[2])]
    stop = ref[5]
    first = ref.index(stop)
    stopping = Sampling(stop_token_ids=[stop])
    for gen in (speculative_generate(draft, runtime_target, PROMPTS[2], max_new_tokens=N, sampling=stopping),
                target_generate(runtime_target, PROMPTS[2], max_new_tokens=N, sampling=stopping)):
        assert gen.tokens == ref[:first + 1]
    for n in (1, 2, 9):
        assert speculative_generate(draft, runtime_target, PROMPTS[1], max_new_tokens=n).tokens == \
            reference[tuple(PROMPTS[1])][:n]


def test_sampling_is_reproducible_with_a_seed(speculators_drafts, runtime_target):
    draft = load_draft(speculators_drafts["non_causal"])
    runs = [speculative_generate(draft, runtime_target, PROMPTS[0], max_new_tokens=N,
                                 sampling=Sampling(temperature=1.5, seed=s)).tokens for s in (7, 7, 8)]
    assert runs[0] == runs[1] and runs[0] != runs[2]
    base = [target_generate(runtime_target, PROMPTS[0], max_new_tokens=N,
                            sampling=Sampling(temperature=1.5, seed=s)).tokens for s in (7, 7)]
    assert base[0] == base[1] and all(0 <= t < 512 for t in runs[0] + base[0])


def test_draft_window_and_run_time_block_size(speculators_drafts, runtime_target, reference):
    draft = load_draft(speculators_drafts["non_causal"])
    with pytest.warns(UserWarning, match="run-time block size 5 differs from the draft's trained block size 8"):
        gen = speculative_generate(draft, runtime_target, PROMPTS[2], max_new_tokens=N, block_size=5, draft_window=3)
    assert gen.tokens == reference[tuple(PROMPTS[2])] and len(draft.cache) == 3


def test_bad_decode_arguments(speculators_drafts, runtime_target):
    draft = load_draft(speculators_drafts["full"])
    with pytest.raises(UsageError, match="block_size must be at least 2"):
        speculative_generate(draft, runtime_target, [1, 2], block_size=1)
    with pytest.raises(UsageError, match="the prompt is empty"):
        speculative_generate(draft, runtime_target, [])
    with pytest.raises(UsageError, match="draft_window must be at least 1"):
        speculative_generate(draft, runtime_target, [1], draft_window=0)
    with pytest.raises(UsageError, match="max_new_tokens must be at least 1"):
        target_generate(runtime_target, [1], max_new_tokens=0)
    with pytest.raises(UsageError, match="draft sampling 'typical'"):
        speculative_generate(draft, runtime_target, [1], draft_sampling="typical")
    for bad in (-0.5, float("nan"), float("inf")):
        with pytest.raises(UsageError, match="temperature must be a finite number >= 0"):
            Sampling(temperature=bad)
    for bad in (dict(top_p=0.0), dict(top_p=1.5), dict(min_p=-0.1), dict(min_p=2.0)):
        with pytest.raises(UsageError, match=r"top_p must be in \(0, 1\] and min_p in \[0, 1\]"):
            Sampling(**bad)
    for bad, says in ((dict(repetition=0.0), "repetition penalty must be a finite number > 0"),
                      (dict(repetition=float("inf")), "repetition penalty must be a finite number > 0"),
                      (dict(presence=2.5), r"presence and frequency penalties must be in \[-2, 2\]"),
                      (dict(frequency=-3.0), r"presence and frequency penalties must be in \[-2, 2\]")):
        with pytest.raises(UsageError, match=says):
            Penalties(**bad)
    assert Sampling(stop_token_ids=[3, 4]).stop_token_ids == (3, 4)  # frozen, hashable: one per run


FAMILY = ["dflash2", "dflash2_k3", "dspark", "dspark_gated", "dspark_rnn", "dspark_plain_conf", "dspark_no_conf",
          "dspark_bonus_anchor", "dspark_pruned"]


@pytest.mark.parametrize("name", FAMILY)
@pytest.mark.parametrize("backend, compile", [("eager", False), ("sdpa", False), ("flex", False), ("sdpa", True)])
def test_family_greedy_decoding_is_lossless(name, backend, compile, family_drafts, runtime_target):
    """dflash2 (convolutions, selector walk) and DSpark (Markov walk, confidence heads) drafts on every backend:
    greedy speculative output is target-only output, with acceptance counted over the draft's proposing slots."""
    draft = load_draft(family_drafts[name], backend=backend, compile=compile)
    prompt = [3, 14, 15, 92, 65, 35]
    ours = speculative_generate(draft, runtime_target, prompt, max_new_tokens=20)
    assert ours.tokens == target_generate(runtime_target, prompt, max_new_tokens=20).tokens
    assert ours.stats.num_drafts > 0 and len(ours.stats.per_position_rates) == draft.proposals()
    predicted = ours.stats.predicted_rates  # a confidence head's survival estimates, per position
    if getattr(draft.head, "confidence", None) is not None:  # a dspark head with a confidence head
        assert draft.last_confidence is not None and ((draft.last_confidence > 0) & (draft.last_confidence < 1)).all()
        assert len(predicted) == draft.proposals() and all(0 <= p <= 1 for p in predicted)
        assert predicted == sorted(predicted, reverse=True)  # a product of probabilities only shrinks along a block
    else:
        assert predicted == []


@pytest.mark.parametrize("name, module, walk", [("dflash2", "dflash2", "walk"), ("dspark_rnn", "dspark", "sequential")])
def test_family_sampled_decoding_proposes_from_the_walk(name, module, walk, family_drafts, runtime_target, monkeypatch):
    """At temperature 1 the proposals are the walk's samples (each slot after the previous pick: dflash2's selector
    walk, DSpark's Markov walk), not redrawn from the draft's logits."""
    draft = load_draft(family_drafts[name])
    calls = record_calls(monkeypatch, importlib.import_module(f"dflash_runtime.{module}"), walk)
    g = speculative_generate(draft, runtime_target, [3, 14, 15], max_new_tokens=12,
                             sampling=Sampling(temperature=1.0, seed=0), draft_sampling="probabilistic")
    assert len(g.tokens) == 12 and calls and all(c.get("temperature") == 1.0 for c in calls)
