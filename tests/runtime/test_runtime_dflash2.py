"""dflash2 in the runtime: the convolutions and the candidate selector equal speculators 0.9.0's own modules
bit for bit on random weights, the whole draft equals speculators' forward, the walk does what vLLM's
does, decoding is lossless, and a dflash2 with identity convolutions and a neutral selector behaves
exactly as the dflash draft it was made from."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from dflash_runtime import dflash2, load_draft, load_target
from runtime_helpers import (DEVICES, assert_decode_alike, bf16_logits_against_speculators, close, our_block_logits,
                             one_torch_thread, speculators_logits, target_context)  # noqa: F401 (autouse fixture)

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "examples" / "pair"


@pytest.mark.parametrize("taps, group, block, rows", [(2, 16, 8, 8), (3, 8, 8, 16), (1, 4, 4, 12), (4, 64, 4, 8)])
def test_grouped_conv_equals_speculators_bit_for_bit(taps, group, block, rows):
    """Several blocks in a row, random taps: taps stay inside each block (speculators' grouped_dynamic_conv)."""
    from speculators.models.dflash2.model_definitions import grouped_dynamic_conv

    g = torch.Generator().manual_seed(taps * 100 + group)
    x = torch.randn(rows, 64, generator=g)
    dynamic = torch.randn(rows, taps, 64 // group, generator=g)
    base = torch.randn(taps, 64, generator=g)
    ours = dflash2.grouped_conv(x, dynamic, base, block_size=block, group_size=group)
    theirs = grouped_dynamic_conv(x, dynamic, base, block_size=block, group_size=group)
    assert torch.equal(ours, theirs)
    # a tap never reaches into an earlier block: the first slot of each block is x * (base[0] + dynamic[0])
    first = torch.arange(0, rows, block)
    assert torch.equal(ours[first], (x.view(rows, -1, group) * (base[0].view(1, -1, group) + dynamic[:, 0, :, None]))
                       .reshape(rows, 64)[first])


def test_conv_module_sides_equal_speculators_bit_for_bit():
    from speculators.models.dflash2.model_definitions import GroupedDynamicCausalConv

    torch.manual_seed(0)
    module = GroupedDynamicCausalConv(64, block_size=8, kernel_size=3, group_size=16)
    with torch.no_grad():  # random, not the identity initialisation
        module.base_kernel.normal_()
        module.kernel_projection.weight.normal_()
    conv = dflash2.Conv(module.base_kernel.detach(), module.kernel_projection.weight.detach(), group_size=16,
                        block_size=8)
    h, y = torch.randn(16, 64), torch.randn(16, 64)
    with torch.no_grad():
        theirs, their_taps = module.prepare(h)
        ours, our_taps = dflash2.conv_prepare(conv, h)
        assert torch.equal(ours, theirs) and torch.equal(our_taps, their_taps)
        assert torch.equal(dflash2.conv_finish(conv, y, our_taps), module.finish(y, their_taps))


def test_selector_scores_equal_speculators_bit_for_bit():
    """Each slot's scores after any predecessor: speculators' CandidateSelector.score_candidates."""
    from speculators.models.dflash2.model_definitions import CandidateSelector

    torch.manual_seed(1)
    sel = CandidateSelector(vocab_size=512, hidden_size=64, rank=32, top_k=8, initializer_range=0.5)
    ours_sel = dflash2.Selector(sel.predecessor_codebook.detach(), sel.successor_codebook.detach(),
                                sel.hidden_projection.weight.detach(), top_k=8)
    unary, hidden = torch.randn(5, 512), torch.randn(5, 64)
    with torch.no_grad():
        candidates, top, projected = dflash2.candidate_scores(ours_sel, unary, hidden)
        assert torch.equal(candidates, unary.topk(8, dim=-1).indices)
        for predecessor in (torch.tensor(17), torch.tensor(400)):
            theirs = sel.score_candidates(unary, hidden, predecessor.expand(5), candidates)  # [5, 8]
            for s in range(5):
                ours = dflash2.scores_after(ours_sel, predecessor, candidates[s], top[s], projected[s])
                assert torch.equal(ours, theirs[s]), s


def _hand_selector(scores: dict[tuple[int, int], float], vocab: int = 40) -> dflash2.Selector:
    """A rank vocab^2 selector whose transition from token a to token b is scores[(a, b)] (0 elsewhere)."""
    pred, succ = torch.zeros(vocab, vocab * vocab), torch.zeros(vocab, vocab * vocab)
    for (a, b), value in scores.items():
        pred[a, a * vocab + b] = value
        succ[b, a * vocab + b] = 1.0
    return dflash2.Selector(pred, succ, torch.ones(vocab * vocab, 1), top_k=2)


def test_the_walk_follows_the_previous_pick():
    """vLLM's selector walk (v1/worker/gpu/spec_decode/dflash2 _selector_walk_kernel): slot s is scored after
    the token picked at slot s-1 (slot 0 after the anchor). Hand-made transitions where the best
    continuation of each predecessor differs; unary logits all 0, projected hidden 1."""
    sel = _hand_selector({(5, 11): 1.0, (11, 21): 2.0, (10, 20): 5.0, (21, 30): 4.0, (20, 31): 3.0})
    candidates = torch.tensor([[10, 11], [20, 21], [30, 31]])
    top, projected = torch.zeros(3, 2), torch.ones(3, 1)
    picked, logits = dflash2.walk(sel, torch.tensor(5), candidates, top, projected, vocab=40)
    assert picked.tolist() == [11, 21, 30]  # after 10 the walk would have gone to 20, then 31
    assert logits[1, 20] == 0.0 and logits[1, 21] == 2.0 and logits[2, 30] == 4.0 and logits[2, 31] == 0.0
    assert torch.isinf(logits).sum() == 3 * (40 - 2)  # only the candidates are finite
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(2)
    for _ in range(400):  # sampled: slot 0 drawn from softmax(scores / T) over its candidates
        picked, _ = dflash2.walk(sel, torch.tensor(5), candidates, top, projected, vocab=40, temperature=1.0,
                                 generator=g)
        counts[int(picked[0]) - 10] += 1
    assert abs(counts[1] / 400 - torch.softmax(torch.tensor([0.0, 1.0]), 0)[1]) < 0.08


@pytest.mark.parametrize("name", ["dflash2", "dflash2_k3"])
def test_block_logits_equal_speculators_forward(name, family_drafts, runtime_target):
    """The whole dflash2 draft (random non-identity convolutions) against speculators' own forward."""
    draft = load_draft(family_drafts[name])
    anchor = 13
    ids, features, block = target_context(runtime_target, draft, 30, seed=0, anchor=anchor)
    theirs, _ = speculators_logits(family_drafts[name], features, ids, anchor)
    ours = our_block_logits(draft, runtime_target, features[:anchor], block)
    assert torch.allclose(ours, theirs, atol=2e-5, rtol=1e-5), (ours - theirs).abs().max()


@pytest.mark.parametrize("device", DEVICES)
def test_bf16_block_logits_within_the_stated_tolerance(device, family_drafts, runtime_target, tiny_target):
    """Draft and target in bf16, on each device present: speculators' fp32 logits within REL_TOL[bf16]."""
    ours, theirs = bf16_logits_against_speculators(family_drafts["dflash2"], device, runtime_target, tiny_target)
    assert close(ours, theirs, torch.bfloat16), (ours - theirs).abs().max()


def identity_dflash2(src: Path, dst: Path, *, taps: int = 2, group: int = 16, top_k: int = 4) -> Path:
    """The dflash draft at src as a speculators dflash2: identity convolutions (speculators' own initial
    state) and zero codebooks (the selector adds nothing, so the unary order decides)."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    cfg = json.loads((dst / "config.json").read_text())
    cfg.update(speculators_model_type="dflash2", architectures=["DFlash2DraftModel"], conv_kernel_size=taps,
               conv_group_size=group, selector_rank=8, selector_top_k=top_k)
    cfg["speculators_config"]["algorithm"] = "dflash2"
    (dst / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(dst / "model.safetensors")
    hidden, vocab = cfg["transformer_layer_config"]["hidden_size"], cfg["transformer_layer_config"]["vocab_size"]
    dtype = tensors["fc.weight"].dtype
    for i in range(cfg["transformer_layer_config"]["num_hidden_layers"]):
        for part in ("attention", "mlp"):
            base = torch.zeros(2, taps, hidden, dtype=dtype)
            base[:, 0] = 1.0
            tensors[f"layers.{i}.{part}_conv.base_kernel"] = base
            tensors[f"layers.{i}.{part}_conv.kernel_projection.weight"] = torch.zeros(2 * taps * hidden // group,
                                                                                      hidden, dtype=dtype)
    tensors["candidate_selector.predecessor_codebook"] = torch.zeros(vocab, 8, dtype=dtype)
    tensors["candidate_selector.successor_codebook"] = torch.zeros(vocab, 8, dtype=dtype)
    tensors["candidate_selector.hidden_projection.weight"] = torch.zeros(8, hidden, dtype=dtype)
    save_file(tensors, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


def test_identity_dflash2_is_the_dflash_draft_it_was_made_from(tmp_path):
    """The bundled trained pair: same tokens, same acceptance at every step, greedy."""
    pair_target = load_target(PAIR / "target")
    made = identity_dflash2(PAIR / "draft", tmp_path / "d2")
    d1, d2 = load_draft(PAIR / "draft"), load_draft(made)
    assert_decode_alike(d1, d2, pair_target)


def test_validate_runs_a_dflash2_end_to_end(cli, family_drafts, tiny_target):
    r = cli("validate", family_drafts["dflash2"], "--target", tiny_target, "--levels", "end_to_end",
            "--threads", "1", "--max-new-tokens", "16", "--sampling", "greedy", "--json")
    assert r.code == 0, r.err[-3000:]
    report = r.json()
    greedy = next(c for c in report["checks"] if c["name"] == "greedy_output_equal")
    assert greedy["status"] == "pass", greedy


# ----------------------------------------------------------------------------- logit maps and the selector's k

def test_unary_logits_multiply_then_cap_as_vllms_candidate_path():
    """vLLM's candidate path (LogitsProcessor.get_top_k_tokens) maps the k raw logits as cap * tanh(m * x / cap).
    Non-neutral values where the other order (m * cap * tanh(x / cap)) is far off."""
    x = torch.tensor([[0.1, -0.05, 0.02, 0.3]])
    for m, cap in ((3.0, 0.15), (0.5, 0.15), (2.0, 1.0)):
        expected = torch.tensor([[cap * math.tanh(m * v / cap) for v in x[0].tolist()]])
        other_order = torch.tensor([[m * cap * math.tanh(v / cap) for v in x[0].tolist()]])
        assert not torch.allclose(expected, other_order, atol=1e-3)
        assert torch.allclose(dflash2.unary_logits(x, multiplier=m, softcap=cap), expected, atol=1e-6)
    assert torch.equal(dflash2.unary_logits(x, multiplier=3.0, softcap=None), x * 3.0)


@pytest.fixture(scope="module")
def hf_dflash2_pair(family_drafts, tmp_path_factory) -> tuple[Path, Path]:
    """The dflash2 draft converted to HF, neutral, and the same draft with all three logit maps set."""
    from dflash_convert.convert.conversion import convert

    root = tmp_path_factory.mktemp("hf2maps")
    convert(family_drafts["dflash2"], root / "plain")
    mapped = shutil.copytree(root / "plain", root / "mapped")
    cfg = json.loads((mapped / "config.json").read_text())
    cfg["dflash_config"].update(input_embedding_scale=2.0, output_multiplier=MULTIPLIER, final_logit_softcapping=CAP)
    (mapped / "config.json").write_text(json.dumps(cfg))
    (mapped / "conversion.json").unlink(missing_ok=True)
    return root / "plain", mapped


MULTIPLIER, CAP = 0.5, 0.25  # logits of the tiny target are ~0.1-0.6: tanh is far from saturating


def _candidates(draft, target, embed_scale: float = 1.0):
    """One block's (candidate ids [B-1, k], unary logits [B-1, k], projected hidden [B-1, R]) after 13 tokens."""
    ids, features, _ = target_context(target, draft, 30, seed=0, anchor=13)
    draft.reset()
    draft.add_context(features[:13], 0)
    with torch.inference_mode():
        candidates, top, projected = draft._step(int(ids[13]), 13, embed=lambda i: embed_scale * target.embed(i),
                                              lm_head=target.lm_head, block_size=None, draft_window=None)
    return candidates, top, projected


def test_hf_logit_maps_apply_as_vllm_applies_them(hf_dflash2_pair, runtime_target):
    """An HF dflash2 with input_embedding_scale 2 has the plain draft's candidates when the plain one is fed
    2 * embed(ids), and their unary logits are cap * tanh(m * x / cap) of the plain draft's raw ones."""
    plain, mapped = (load_draft(p) for p in hf_dflash2_pair)
    ours_ids, ours_top, ours_projected = _candidates(mapped, runtime_target)
    raw_ids, raw_top, raw_projected = _candidates(plain, runtime_target, embed_scale=2.0)
    assert torch.equal(ours_ids, raw_ids)
    assert torch.allclose(ours_projected, raw_projected, atol=1e-6)
    assert 0.2 < (MULTIPLIER * raw_top / CAP).abs().max() < 2  # the cap bends these values without flattening them
    assert torch.allclose(ours_top, CAP * torch.tanh(MULTIPLIER * raw_top / CAP), atol=1e-6)
    assert not torch.allclose(ours_top, MULTIPLIER * CAP * torch.tanh(raw_top / CAP), atol=1e-3)


@pytest.mark.parametrize("name, k", [("dflash2", 16), ("dflash2_k3", 8)])
def test_exactly_selector_top_k_finite_draft_logits_per_slot(name, k, family_drafts, runtime_target):
    """The config's selector_top_k candidates per slot, no more, no fewer (greedy tokens alone do not show k)."""
    draft = load_draft(family_drafts[name])
    assert json.loads((family_drafts[name] / "config.json").read_text())["selector_top_k"] == k
    ids, features, _ = target_context(runtime_target, draft, 30, seed=1, anchor=13)
    draft.reset()
    draft.add_context(features[:13], 0)
    _, logits = draft.propose(int(ids[13]), 13, embed=runtime_target.embed, lm_head=runtime_target.lm_head)
    assert logits.shape[0] == draft.block_size - 1
    assert torch.isfinite(logits).sum(dim=-1).tolist() == [k] * (draft.block_size - 1)


def test_the_walk_is_one_graph_for_torch_compile():
    """torch.compile captures the selector walk whole (no graph break, no recompile per token id: a 0-dim tensor
    index read as a host int had broken it at every slot), so it can be captured with the step; eager results
    are the same."""
    import functools

    g = torch.Generator().manual_seed(3)
    sel = dflash2.Selector(torch.randn(512, 32, generator=g), torch.randn(512, 32, generator=g),
                           torch.randn(32, 64, generator=g), top_k=8)
    candidates, top, projected = dflash2.candidate_scores(sel, torch.randn(15, 512, generator=g),
                                                          torch.randn(15, 64, generator=g))
    walk = functools.partial(dflash2.walk, sel, vocab=512)
    torch._dynamo.reset()
    explained = torch._dynamo.explain(walk)(torch.tensor(7), candidates, top, projected)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons
    compiled = torch.compile(walk, backend="eager", fullgraph=True)
    for anchor in (7, 300):
        ours, theirs = compiled(torch.tensor(anchor), candidates, top, projected), walk(torch.tensor(anchor), candidates,
                                                                                      top, projected)
        assert torch.equal(ours[0], theirs[0]) and torch.equal(ours[1], theirs[1])
