"""DSpark in the runtime: the Markov head (vanilla, gated, rnn) and the confidence head equal speculators 0.9.0's
own modules bit for bit on random weights, the Markov walk does what vLLM's DSparkSpeculator does, the anchor's
slot proposes (a block proposes block_size tokens), acceptance is counted over those block_size positions as
vLLM counts dspark, and decoding is lossless on every CPU backend and compiled."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dflash_runtime import dspark, load_draft, load_target, speculative_generate, target_generate
from runtime_helpers import (DEVICES, assert_decode_alike, bf16_logits_against_speculators, close, our_block_logits,
                             one_torch_thread, speculators_logits, target_context)  # noqa: F401 (autouse fixture)

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "examples" / "pair"

pytestmark = pytest.mark.usefixtures("one_timing_round")  # no test here reads the speedup


def _random_markov(kind: str, *, vocab=512, rank=16, hidden=64, seed=0):
    from speculators.models.dspark.model_definitions import MarkovHead

    torch.manual_seed(seed)
    module = MarkovHead(verifier_vocab_size=vocab, draft_vocab_size=vocab, markov_rank=rank, hidden_size=hidden,
                        head_type=kind)
    with torch.no_grad():  # random, far from the init's small scale
        for p in module.parameters():
            p.normal_()
    proj = {"gated": getattr(module, "gate_proj", None), "rnn": getattr(module, "joint_proj", None)}.get(kind)
    ours = dspark.Markov(module.markov_w1.weight.detach(), module.markov_w2.weight.detach(), kind,
                         *((proj.weight.detach(), proj.bias.detach()) if proj is not None else ()))
    return module, ours


@pytest.mark.parametrize("kind", dspark.MARKOV_HEAD_TYPES)
def test_markov_head_equals_speculators_bit_for_bit(kind):
    """speculators' MarkovHead.block_bias over N blocks of B slots, previous tokens and hidden states random.
    Ours at the shapes speculators computes them (vanilla and gated: every slot at once; rnn: slot by slot over
    the N blocks, its state carried), so the same kernels run: torch.equal."""
    module, ours = _random_markov(kind)
    n, b = 3, 8
    prev, hidden = torch.randint(0, 512, (n, b)), torch.randn(n, b, 64)
    with torch.no_grad():
        theirs = module.block_bias(prev_token_ids=prev, hidden_states=hidden)  # [N, B, V]
        if kind == "rnn":
            state = None
            for k in range(b):
                bias, emb, state = dspark.markov_bias(ours, prev[:, k], hidden[:, k], state)
                assert torch.equal(bias, theirs[:, k]), k
                assert torch.equal(emb, module.prev_embeddings(prev[:, k]))
        else:
            bias, emb, _ = dspark.markov_bias(ours, prev.reshape(-1), hidden.reshape(n * b, 64))
            assert torch.equal(bias.view(n, b, -1), theirs)
            assert torch.equal(emb.view(n, b, -1), module.prev_embeddings(prev))


@pytest.mark.parametrize("with_markov", [True, False])
def test_confidence_head_equals_speculators_bit_for_bit(with_markov):
    """speculators' ConfidenceHead gives a logit; vLLM's compute_confidence its sigmoid, which is ours."""
    from speculators.models.dspark.model_definitions import ConfidenceHead

    torch.manual_seed(2)
    module = ConfidenceHead(64 + (16 if with_markov else 0))
    with torch.no_grad():
        for p in module.parameters():
            p.normal_()
    hidden, emb = torch.randn(24, 64), torch.randn(24, 16)
    with torch.no_grad():
        theirs = module(torch.cat([hidden, emb], -1) if with_markov else hidden)
    ours = dspark.confidence(dspark.Confidence(module.proj.weight.detach(), module.proj.bias.detach(), with_markov),
                             hidden, emb)
    assert torch.equal(ours, torch.sigmoid(theirs))


def _hand_markov(transitions: dict[int, dict[int, float]], vocab: int = 40) -> dspark.Markov:
    """A vanilla head of rank vocab whose bias after token a is transitions[a] (token -> value, 0 elsewhere)."""
    w2 = torch.zeros(vocab, vocab)
    for a, row in transitions.items():
        for b, value in row.items():
            w2[b, a] = value
    return dspark.Markov(torch.eye(vocab), w2, "vanilla")


def test_the_markov_walk_follows_the_previous_pick():
    """vLLM 0.33's DSparkSpeculator._sample_sequential: prev starts as the anchor (the input id at query offset 0)
    and becomes each slot's sampled token; slot i's logits are base_logits[:, i] + markov_bias(markov_embed(prev)).
    Base logits 1 at 10, 20, 30 and 0 elsewhere; the bias after the anchor 5 lifts 11 by 2, after 11 lifts 21 by
    2, after 10 would lift 20 by 9 and after 20 would lift 31 by 5: so the walk picks 11, 21, then 30. A walk
    that skipped the anchor's bias would go 10, 20, 31; one that ignored the previous pick, 11, 20, 30."""
    head = _hand_markov({5: {11: 2.0}, 11: {21: 2.0}, 20: {31: 5.0}, 10: {20: 9.0}})
    base = torch.zeros(3, 40)
    base[0, 10], base[1, 20], base[2, 30] = 1.0, 1.0, 1.0
    picked, logits, conf = dspark.sequential(head, torch.tensor(5), base, torch.zeros(3, 4))
    assert picked.tolist() == [11, 21, 30] and conf is None
    assert logits[0, 11] == 2.0 and logits[1, 21] == 2.0 and logits[1, 20] == 1.0 and logits[2, 31] == 0.0
    # a pruned vocab: the bias is added in the draft vocab, scattered to target ids; -inf stays outside it
    d2t = torch.tensor([10, 11, 20, 21, 30, 31])
    pruned = dspark.Markov(torch.eye(40), _hand_markov({5: {11: 2.0}, 11: {21: 2.0}}).w2[d2t], "vanilla")
    masked = torch.full((3, 40), float("-inf"))
    masked[:, d2t] = base[:, d2t]
    picked, logits, _ = dspark.sequential(pruned, torch.tensor(5), masked, torch.zeros(3, 4), d2t)
    assert picked.tolist() == [11, 21, 30] and torch.isinf(logits).sum() == 3 * (40 - 6)


@pytest.mark.parametrize("name", ["dspark", "dspark_gated", "dspark_rnn", "dspark_plain_conf", "dspark_no_conf",
                                  "dspark_bonus_anchor", "dspark_pruned"])
def test_loader_reads_the_heads_speculators_saved(name, family_drafts):
    """Every head speculators' DSparkDraftModel built is the runtime's, weight for weight, with its type and layout."""
    from speculators.model import SpeculatorModel

    draft = load_draft(family_drafts[name])
    model = SpeculatorModel.from_pretrained(str(family_drafts[name]))
    cfg = model.config
    assert draft.anchor_predicts is cfg.sample_from_anchor
    assert draft.proposals() == (cfg.block_size if cfg.sample_from_anchor else cfg.block_size - 1)
    assert draft.head.markov.kind == cfg.markov_head_type
    theirs = model.markov_head
    assert torch.equal(draft.head.markov.w1, theirs.markov_w1.weight)
    assert torch.equal(draft.head.markov.w2, theirs.markov_w2.weight)
    proj = {"gated": getattr(theirs, "gate_proj", None),
            "rnn": getattr(theirs, "joint_proj", None)}.get(cfg.markov_head_type)
    assert (draft.head.markov.proj is None) == (proj is None)
    if proj is not None:
        assert torch.equal(draft.head.markov.proj, proj.weight) and torch.equal(draft.head.markov.proj_bias, proj.bias)
    assert (draft.head.confidence is None) == (model.confidence_head is None)
    if model.confidence_head is not None:
        assert torch.equal(draft.head.confidence.weight, model.confidence_head.proj.weight)
        assert torch.equal(draft.head.confidence.bias, model.confidence_head.proj.bias)
        assert draft.head.confidence.with_markov is cfg.confidence_head_with_markov


@pytest.mark.parametrize("name", ["dspark", "dspark_bonus_anchor", "dspark_pruned"])
def test_block_logits_equal_speculators_forward(name, family_drafts, runtime_target):
    """The backbone's logits of every proposing slot (all B with sample_from_anchor, B-1 without) against
    speculators' own forward; then the Markov walk over them against speculators' block_bias fed the tokens the
    walk picked (its previous tokens: the anchor, then the picks)."""
    from speculators.model import SpeculatorModel  # noqa: F401 (registers the dspark classes)

    draft = load_draft(family_drafts[name])
    anchor = 13
    ids, features, block = target_context(runtime_target, draft, 30, seed=0, anchor=anchor)
    theirs, model = speculators_logits(family_drafts[name], features, ids, anchor)  # [B, Vd]
    ours = our_block_logits(draft, runtime_target, features[:anchor], block)  # [B, V]
    if draft.draft_to_target is not None:
        ours = ours[:, draft.draft_to_target]
    assert torch.allclose(ours, theirs, atol=2e-5, rtol=1e-5), (ours - theirs).abs().max()
    rows = slice(0, None) if draft.anchor_predicts else slice(1, None)
    draft.reset()
    draft.add_context(features[:anchor], 0)
    picked, logits = draft.propose(int(ids[anchor]), anchor, embed=runtime_target.embed,
                                   lm_head=runtime_target.lm_head)
    prev = torch.cat([ids[anchor:anchor + 1], picked[:-1]])
    hidden = draft.block_hidden(runtime_target.embed(block), anchor)[rows]
    with torch.no_grad():
        bias = model.markov_head.block_bias(prev_token_ids=prev[None], hidden_states=hidden[None])[0]
    want = theirs[rows] + bias
    got = logits if draft.draft_to_target is None else logits[:, draft.draft_to_target]
    assert torch.allclose(got, want, atol=5e-5, rtol=1e-5), (got - want).abs().max()
    assert torch.equal(picked, got.argmax(-1) if draft.draft_to_target is None else
                       draft.draft_to_target[got.argmax(-1)])
    assert len(picked) == (draft.block_size if draft.anchor_predicts else draft.block_size - 1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["dspark", "dspark_pruned"])
def test_bf16_block_logits_within_the_stated_tolerance(name, device, family_drafts, runtime_target, tiny_target):
    """Draft and target in bf16, on each device present: the backbone's logits of every proposing slot are
    speculators' fp32 ones within REL_TOL[bf16]."""
    from speculators.model import SpeculatorModel  # noqa: F401 (registers the dspark classes)

    ours, theirs = bf16_logits_against_speculators(family_drafts[name], device, runtime_target, tiny_target)
    assert close(ours, theirs, torch.bfloat16), (ours - theirs).abs().max()


def test_acceptance_counts_every_slot_as_vllm_counts_dspark(family_drafts, runtime_target, monkeypatch):
    """vLLM 0.33 (config/speculative.py: num_speculative_tokens defaults to the dspark block_size; the DFlash
    prepare-inputs kernel samples at every query offset when sample_from_anchor): a block of B slots proposes B
    tokens. An oracle draft proposing the target's own greedy continuation is accepted whole at every step:
    B + 1 tokens committed per step (B proposals + the target's bonus), tau = B + 1, every one of the B
    per-position rates 1, and B tokens drafted per step."""
    draft = load_draft(family_drafts["dspark"])
    b = draft.block_size
    prompt, n = [3, 14, 15], 3 * (b + 1)
    truth = target_generate(runtime_target, prompt, max_new_tokens=n + b).tokens

    def oracle(anchor_id, start, **kw):
        at = start - len(prompt) + 1  # index in `truth` of the token after the anchor
        assert truth[at - 1] == anchor_id and kw["block_size"] == b
        return torch.tensor(truth[at:at + b]), torch.zeros(b, 512)
    monkeypatch.setattr(draft, "propose", oracle)
    g = speculative_generate(draft, runtime_target, prompt, max_new_tokens=n)
    assert g.tokens == truth[:n]
    assert g.stats.num_drafts == 3 and g.stats.accepted == 3 * b and g.stats.drafted == 3 * b
    assert g.stats.tau == b + 1 and g.stats.per_position_rates == [1.0] * b


def test_zero_markov_bonus_anchor_dspark_is_the_dflash_draft_it_was_made_from():
    """A dspark with sample_from_anchor false (the anchor is the bonus token, as in dflash) and a Markov head that
    adds nothing is the dflash draft: the trained pair's draft with a zero Markov head gives the same tokens
    and the same acceptance at every step, greedy."""
    pair_target = load_target(PAIR / "target")
    d1 = load_draft(PAIR / "draft")
    d2 = load_draft(PAIR / "draft")
    vocab, hidden = d2.spec.vocab_size, d2.spec.hidden_size
    d2.head = dspark.Head(dspark.Markov(torch.randn(vocab, 8), torch.zeros(vocab, 8), "rnn",
                                        torch.randn(24, 16 + hidden), torch.randn(24)), None, anchor_predicts=False)
    assert_decode_alike(d1, d2, pair_target)


@pytest.mark.parametrize("name, extra", [
    ("dspark", ["--sampling", "greedy", "--backend", "eager"]),
    ("dspark_rnn", ["--sampling", "greedy", "--backend", "sdpa", "--compile"]),
    ("dspark_pruned", ["--sampling", "greedy", "--backend", "flex"]),
    ("dspark_gated", ["--temperature", "1.0", "--draft-sampling", "probabilistic", "--seed", "0"]),
])
def test_validate_runs_a_dspark_end_to_end(name, extra, cli, family_drafts, tiny_target):
    """Greedy: every output equals the target's own greedy output; sampled: the greedy exactness pass still runs.
    Rates are over block_size positions (the anchor's slot proposes), beside the confidence head's prediction."""
    r = cli("validate", family_drafts[name], "--target", tiny_target, "--levels", "end_to_end", "--threads", "1",
            "--max-new-tokens", "16", "--json", *extra)
    assert r.code == 0, r.err[-3000:]
    report = r.json()
    greedy = next(c for c in report["checks"] if c["name"] == "greedy_output_equal")
    assert greedy["status"] == "pass", greedy
    acceptance = report["acceptance"]
    assert len(acceptance["per_position_rates"]) == 8 == acceptance["block_size"]
    assert len(acceptance["predicted_position_rates"]) == 8


@pytest.mark.parametrize("name", ["dspark_rnn", "dspark_pruned", "dspark_bonus_anchor"])
def test_hf_layout_runs_as_the_speculators_draft(name, cli, family_drafts, runtime_target, tmp_path):
    """`convert --to hf` (vLLM's Qwen3DSparkModel layout, the DSpark keys at the top level): the runtime reads the
    same heads and anchor layout from it, so decoding gives the same tokens, rates and confidence predictions."""
    out = tmp_path / "hf"
    assert cli("convert", family_drafts[name], "--to", "hf", "-o", out).code == 0
    a, b = load_draft(family_drafts[name]), load_draft(out)
    assert b.spec.source_format == "hf" and b.anchor_predicts is a.anchor_predicts
    for prompt in ([3, 14, 15, 92], [7, 8, 9]):
        x = speculative_generate(a, runtime_target, prompt, max_new_tokens=24)
        y = speculative_generate(b, runtime_target, prompt, max_new_tokens=24)
        assert x.tokens == y.tokens
        assert (x.stats.per_position_rates, x.stats.predicted_rates) == (y.stats.per_position_rates,
                                                                          y.stats.predicted_rates)


def test_validate_with_vllm_on_a_dspark_draft_keeps_the_emulation_counted_as_vllm_counts(cli, family_drafts,
                                                                                     tiny_target):
    """No GPU: vLLM's CPU build (V1 model runner) refuses DSpark drafts, so real vLLM is not started (one line under
    levels_skipped.served); the emulation is still counted as vLLM counts dspark: block_size proposals per draft."""
    import sys

    r = cli("validate", family_drafts["dspark"], "--target", tiny_target, "--levels", "end_to_end", "--threads", "1",
            "--max-new-tokens", "8", "--sampling", "greedy", "--engine", "vllm", "--engine-python", sys.executable,
            "--json")
    assert r.code == 0, r.err[-3000:]
    report = r.json()
    assert "V1 model runner" in report["levels_skipped"]["served"] and report.get("engine_run") is None
    counting = report["acceptance"]["vllm_counting"]
    assert counting["num_drafts"] > 0 and counting["drafted"] == 8 * counting["num_drafts"]
    assert len(counting["per_position_rates"]) == 8


def test_an_hf_dspark_without_head_keys_runs_the_heads_speculators_trained(cli, family_drafts, runtime_target,
                                                                            tmp_path):
    """An HF config without markov_head_type or confidence_head_with_markov: the runtime builds what speculators
    fills in (keys.trained_value): the vanilla Markov head, and the confidence head over [hidden; Markov] that
    the tensors hold (the catalogue sizes it from the same value), so it decodes as the speculators draft."""
    import json

    out = tmp_path / "hf"
    assert cli("convert", family_drafts["dspark"], "--to", "hf", "-o", out).code == 0
    cfg = json.loads((out / "config.json").read_text())
    for key in ("markov_head_type", "confidence_head_with_markov"):
        del cfg[key]
    (out / "config.json").write_text(json.dumps(cfg))
    a, b = load_draft(family_drafts["dspark"]), load_draft(out)
    assert b.head.markov is not None and b.head.markov.kind == "vanilla"
    assert b.head.confidence is not None and b.head.confidence.with_markov
    x = speculative_generate(a, runtime_target, [3, 14, 15, 92], max_new_tokens=24)
    y = speculative_generate(b, runtime_target, [3, 14, 15, 92], max_new_tokens=24)
    assert x.tokens == y.tokens and x.stats.predicted_rates == y.stats.predicted_rates


@pytest.fixture(scope="module")
def rnn_bonus_anchor(tmp_path_factory, tiny_target) -> Path:
    """An rnn Markov head trained with sample_from_anchor false (the anchor is the bonus token)."""
    from factories import make_speculators_draft

    return make_speculators_draft(tmp_path_factory.mktemp("rnn") / "rnn_bonus", tiny_target, algorithm="dspark",
                                  markov_rank=16, markov_head_type="rnn", sample_from_anchor=False, seed=9)


def _rnn_walk(head, anchor: int, base: torch.Tensor, hidden: torch.Tensor, state: torch.Tensor) -> tuple:
    """SGLang 0.5.23's draft_markov_block for an rnn head, greedy, from `state`: each row is one slot, the previous
    token the anchor, then the previous pick -> (picks, logits)."""
    prev, picks, rows = anchor, [], []
    for s in range(base.shape[0]):
        z = torch.cat([state, head.w1[prev], hidden[s]])
        gate_raw, candidate_raw, out_raw = (head.proj @ z + head.proj_bias).chunk(3)
        gate = torch.sigmoid(gate_raw)
        state = gate * state + (1 - gate) * torch.tanh(candidate_raw)
        rows.append(base[s] + head.w2 @ torch.tanh(out_raw))
        prev = int(rows[-1].argmax())
        picks.append(prev)
    return picks, torch.stack(rows)


def test_rnn_head_with_a_bonus_anchor_starts_as_sglang_starts_it(rnn_bonus_anchor, runtime_target):
    """SGLang (the engine serving rnn heads; vLLM 0.33 has none) feeds the rnn the drafting rows 1..B-1 only
    (select_draft_hidden_without_anchor), from a zero state at slot 1 (RNNHead.init_state). speculators trains
    the recurrence from slot 0 (the anchor's row, the anchor as previous token): not what is served."""
    draft = load_draft(rnn_bonus_anchor)
    assert not draft.anchor_predicts and draft.head.markov.kind == "rnn"
    anchor = 13
    ids, features, block = target_context(runtime_target, draft, 30, seed=0, anchor=anchor)
    draft.reset()
    draft.add_context(features[:anchor], 0)
    picked, logits = draft.propose(int(ids[anchor]), anchor, embed=runtime_target.embed, lm_head=runtime_target.lm_head)
    hidden = draft.block_hidden(runtime_target.embed(block), anchor)  # [B, H], slot 0 the anchor's
    base = draft.logits(hidden, runtime_target.lm_head)
    head, zero = draft.head.markov, torch.zeros(draft.head.markov.rank)
    want_picks, want = _rnn_walk(head, int(ids[anchor]), base[1:], hidden[1:], zero)
    assert picked.tolist() == want_picks
    assert torch.allclose(logits, want, atol=1e-5), (logits - want).abs().max()
    # speculators' start: one step at the anchor's slot first; its state carries into slot 1
    z = torch.cat([zero, head.w1[int(ids[anchor])], hidden[0]])
    gate_raw, candidate_raw, _ = (head.proj @ z + head.proj_bias).chunk(3)
    trained_state = (1 - torch.sigmoid(gate_raw)) * torch.tanh(candidate_raw)
    _, trained = _rnn_walk(head, int(ids[anchor]), base[1:], hidden[1:], trained_state)
    assert not torch.allclose(logits[0], trained[0], atol=1e-3)
    from dflash_convert.format.engine_views import checkpoint_views
    from dflash_convert.io.checkpoint import open_checkpoint

    sglang, = checkpoint_views(open_checkpoint(rnn_bonus_anchor), "sglang")
    assert [(d.field, d.severity) for d in sglang.divergences if "rnn" in d.consequence] == [
        ("markov_head_type", "warning")]


def test_the_markov_walk_is_one_graph_for_torch_compile():
    """torch.compile captures the Markov walk and the confidence head whole (no graph break), so it can be
    captured with the step."""
    import functools

    g = torch.Generator().manual_seed(3)
    markov = dspark.Markov(torch.randn(512, 32, generator=g), torch.randn(512, 32, generator=g))
    conf = dspark.Confidence(torch.randn(1, 64 + 32, generator=g), torch.randn(1, generator=g), True)
    walk = functools.partial(dspark.sequential, markov, conf=conf)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(walk)(torch.tensor(7), torch.randn(15, 512, generator=g),
                                           torch.randn(15, 64, generator=g))
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
