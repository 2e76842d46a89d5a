"""Targets of every architecture DFlash drafts are made for: speculative greedy output is transformers'
own `generate` of the same target, token for token, including hybrid linear-attention targets whose
recurrent state must be rolled back after rejected proposals (eager and compiled); published
ForConditionalGeneration layouts load their text model; a cache the runtime cannot roll back is refused
before decoding."""

from __future__ import annotations

import pytest
import torch

import target_zoo
from dflash_convert.errors import DFlashError
from dflash_runtime import Sampling, load_draft, load_target, speculative_generate, target_generate
from runtime_helpers import (_ROOT, DEVICES, close, greedy_or_near_tie, one_torch_thread,  # noqa: F401 (autouse fixture)
                             write_hf_draft)

PROMPTS = ([3, 17, 250, 9], list(range(40, 61)))
N = 16
BLOCK = 4

pytestmark = pytest.mark.usefixtures("one_timing_round")  # no test here reads the speedup


def zoo(kind: str):
    return target_zoo.make(kind, _ROOT / "zoo" / kind)


def draft_for(tmp_path, block=BLOCK, device="cpu"):
    return load_draft(write_hf_draft(tmp_path / "draft", layers=1, target_ids=(0, 2), n_target=target_zoo.LAYERS,
                                     block_size=block, bias=False), backend="sdpa", device=device)


def reference(model, prompt, n=N):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt], device=model.device), max_new_tokens=n, do_sample=False,
                             pad_token_id=target_zoo.VOCAB - 3)
    return out[0, len(prompt):].tolist()


def scripted(draft, script):
    """Let `draft` propose `script`'s tokens (the right continuation) with a wrong token at a slot that
    moves every step: every verify block has accepted and rejected proposals. Returns the draft."""
    real = draft.propose
    step = [0]

    def propose(anchor, start, **kw):
        ids, logits = real(anchor, start, **kw)
        k = ids.numel()
        ahead = script["prompt_len"]
        right = (script["tokens"] + [0] * k * 2)[start - ahead + 1:start - ahead + 1 + k]
        ids = torch.tensor(right, dtype=ids.dtype, device=ids.device)
        wrong = step[0] % (k + 1)  # k: all right
        if wrong < k:
            ids[wrong] = (ids[wrong] + 1) % (target_zoo.VOCAB - 4)
        step[0] += 1
        return ids, logits

    draft.propose = propose
    return draft


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", target_zoo.KINDS)
def test_speculative_greedy_equals_transformers_generate(kind, device, tmp_path, record_property):
    """A real random draft (mostly rejected) and a scripted one (accepted up to a moving slot, then
    rejected) against each architecture, on each device present: both emit exactly transformers' greedy
    generate, or part from it only where the target's own verify block and one-token decode, recomputed,
    disagree within rounding (validate's near-tie rule); such a parting is recorded with its logits and noise."""
    target = load_target(zoo(kind), device=device)
    assert target.unrollable is None
    draft = draft_for(tmp_path, device=device)
    for prompt in PROMPTS:
        ref = reference(target.model, prompt)
        expect_greedy(target, prompt, speculative_generate(draft, target, prompt, max_new_tokens=N), ref,
                      record_property)
    for prompt in PROMPTS:
        ref = reference(target.model, prompt)
        gen = speculative_generate(scripted(draft_for(tmp_path, device=device), {"prompt_len": len(prompt),
                                                                                 "tokens": ref}),
                                   target, prompt, max_new_tokens=N)
        expect_greedy(target, prompt, gen, ref, record_property)
        assert 0 < gen.stats.accepted < gen.stats.drafted  # partial blocks really happened


def expect_greedy(target, prompt, gen, ref, record_property) -> None:
    equal, why = greedy_or_near_tie(target, prompt, gen, ref, proposals=BLOCK - 1, max_new_tokens=N)
    assert equal, why
    if why:  # a near-tie: the test passes, and the GPU check brings the figures back
        record_property("near_tie", why)


def test_attention_is_chosen_from_what_the_model_supports():
    """gpt-oss (attention sinks) has no sdpa path in transformers: it runs eager unless told; others sdpa."""
    assert load_target(zoo("gpt_oss")).attention == "eager"
    assert load_target(zoo("qwen3")).attention == "sdpa"
    assert load_target(zoo("qwen3"), attn_implementation="eager").attention == "eager"


def test_compile_says_when_the_target_runs_eagerly():
    gpt_oss = load_target(zoo("gpt_oss"), compile=True)
    assert not gpt_oss.compile and "sliding-window" in gpt_oss.eager_reason
    qwen = load_target(zoo("qwen3_5"), compile=True)
    assert qwen.compile and qwen.eager_reason is None


@pytest.mark.parametrize("kind,compile,mixers", [("qwen3_next", False, True), ("qwen3_5", False, True),
                                                 ("qwen3_5", True, True), ("qwen3_5", False, False)],
                         ids=["qwen3_next", "qwen3_5", "qwen3_5-compiled", "qwen3_5-decoder-rerun"])
def test_rollback_leaves_the_state_of_the_accepted_prefix(kind, compile, mixers):
    """Verify a block, keep part of it, continue: the logits equal one forward over the committed
    sequence (the state holds nothing of the rejected tokens), on a second prompt too (a reused static
    cache starts from zero state). Replaying the linear-attention mixers, and (a model whose mixers are
    not found) re-running the whole decoder."""
    target = load_target(zoo(kind), compile=compile)
    assert set(target.rollback.mixers) == {0, 2}  # the Gated DeltaNet layers
    if not mixers:
        target.rollback.mixers = {}
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        for got, want in rolled_back_and_fresh(target, g):
            assert torch.allclose(got, want, atol=1e-5, rtol=0), (got - want).abs().max()


@pytest.mark.parametrize("device", DEVICES)
def test_rollback_in_bf16_within_the_stated_tolerance(device):
    """The hybrid rollback with the target in bf16 on each device present (on a GPU, transformers' fast
    Gated DeltaNet kernels where flash-linear-attention is installed): REL_TOL[bf16] of one fresh forward."""
    target = load_target(zoo("qwen3_5"), device=device, dtype=torch.bfloat16)
    assert set(target.rollback.mixers) == {0, 2}
    g = torch.Generator().manual_seed(0)
    for _ in range(2):
        for got, want in rolled_back_and_fresh(target, g):
            assert close(got, want, torch.bfloat16), (got.float().cpu() - want.cpu()).abs().max()


def rolled_back_and_fresh(target, g: torch.Generator):
    """Verify a block, keep part of it, continue: [(logits after the rollback, the same rows of one forward
    over the committed sequence)] for the next block and for one token after it."""
    prompt, block, more = (torch.randint(0, 500, (n,), generator=g) for n in (7, BLOCK, BLOCK))
    target.reset(32, BLOCK)
    target.forward(prompt, 0, last_logits_only=True)
    target.forward(block, 7)  # anchor + 3 proposals
    target.crop(9)  # 1 proposal accepted, 2 rejected
    logits, _ = target.forward(more, 9)
    target.crop(9 + BLOCK)  # all accepted: nothing to undo
    last, _ = target.forward(more[:1], 9 + BLOCK)
    seq = torch.cat([prompt, block[:2], more, more[:1]])
    with torch.no_grad():
        ref = target.model(input_ids=seq[None].to(target.device)).logits[0].float()
    return [(logits, ref[9:9 + BLOCK]), (last[-1], ref[-1])]


def test_compiled_hybrid_equals_transformers_generate(tmp_path):
    """Static cache reused across prompts + compiled verify on a hybrid target, scripted partial blocks."""
    target = load_target(zoo("qwen3_5"), compile=True)
    eager = load_target(zoo("qwen3_5"))
    for prompt in PROMPTS:
        ref = reference(eager.model, prompt)
        draft = scripted(draft_for(tmp_path), {"prompt_len": len(prompt), "tokens": ref})
        assert speculative_generate(draft, target, prompt, max_new_tokens=N).tokens == ref, prompt
        assert target_generate(target, prompt, max_new_tokens=N).tokens == ref, prompt


def test_published_conditional_generation_layout_loads_its_text_model():
    """Qwen3.5 as published (vision tower + MTP heads beside the text model): the causal LM loads with
    nothing missing, the tensors transformers ignores are ignored, output equals the full model's."""
    from transformers import AutoModelForCausalLM

    path = zoo("qwen3_5_conditional")
    target = load_target(path)
    assert type(target.model).__name__ == "Qwen3_5ForCausalLM"
    _, info = AutoModelForCausalLM.from_pretrained(path, output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"]


def test_target_that_cannot_be_rolled_back_is_refused(monkeypatch):
    """A cache layer holding linear-attention state and a sliding window at once (transformers'
    "hybrid_sliding") cannot be restored: refused in one line naming the layer, before any decoding."""
    from dflash_runtime import target as target_mod

    try:
        from transformers.models.zaya.configuration_zaya import ZayaConfig
    except ImportError:
        pytest.skip("this transformers has no hybrid_sliding cache layers")
    config = ZayaConfig(num_hidden_layers=2, layer_types=["hybrid", "hybrid_sliding"], sliding_window=8)
    why = target_mod.rollback_refusal(config)
    assert why is not None and "layer 1 (hybrid_sliding" in why and "\n" not in why
    assert target_mod.rollback_refusal(target_zoo._classes("qwen3_5")[0](**target_zoo._classes("qwen3_5")[2])) is None


# ----------------------------------------------------------------------------- validate

def _prompts(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("3 17 250 9\n40 41 42 43 44 45 46\n")
    return path


def _draft_dir(tmp_path):
    return write_hf_draft(tmp_path / "draft", layers=1, target_ids=(0, 2), n_target=target_zoo.LAYERS,
                          block_size=BLOCK, bias=False)


@pytest.mark.parametrize("kind", ["qwen3_5_conditional", "gpt_oss"])
def test_validate_runs_published_hybrid_and_sink_targets(kind, cli, tmp_path):
    """validate on Qwen3.5 as published and on gpt-oss: passes, and says which attention the target ran."""
    r = cli("validate", _draft_dir(tmp_path), "--target", zoo(kind), "--prompts", _prompts(tmp_path),
            "--levels", "end_to_end", "--max-new-tokens", "12", "--device", "cpu", "--sampling", "greedy", "--json")
    assert r.code == 0, r.err
    report = r.json()
    assert {c["name"]: c["status"] for c in report["checks"]}["greedy_output_equal"] == "pass"
    assert report["acceptance"]["target_attention"] == ("eager" if kind == "gpt_oss" else "sdpa")
    assert report["acceptance"]["target_compiled"] is None


def test_validate_refuses_a_target_path_that_differs_from_transformers(cli, tmp_path, monkeypatch):
    """A runtime bug on the target side (here: linear-attention state not zeroed between prompts of a
    reused static cache, as it once was) ends the run "cannot run this target" (exit 1), not with the
    draft failing greedy_output_equal (exit 3)."""
    from dflash_runtime import rollback

    monkeypatch.setattr(rollback, "_reset_state", lambda layer: None)
    r = cli("validate", _draft_dir(tmp_path), "--target", zoo("qwen3_5"), "--prompts", _prompts(tmp_path),
            "--levels", "end_to_end", "--max-new-tokens", "12", "--device", "cpu", "--compile", "--sampling", "greedy",
            "--json")
    assert r.code == 1, r.err
    message = r.json()["error"]["message"]
    assert message.startswith("the runtime cannot run this target (Qwen3_5ForCausalLM): its target-only greedy "
                              "decoding of prompt 1 differs from transformers' generate") and "\n" not in message


# ----------------------------------------------------------------------------- sampling

def test_probabilistic_drafting_on_a_hybrid_keeps_the_target_distribution(tmp_path, monkeypatch):
    """The statistical test of the Markov stand-in (test_validate_scale), on a real hybrid target with
    a 5-token vocabulary: tokens 2 and 3 of many seeded speculative runs (probabilistic drafting, rollback
    after each rejection) are distributed as the target's own, computed exactly from its logits."""
    import itertools

    from transformers.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from dflash_runtime import decode

    vocab, runs, prompt = 5, 500, [2, 3, 1]
    torch.manual_seed(0)
    config = Qwen3_5TextConfig(vocab_size=vocab, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               num_key_value_heads=1, head_dim=16, intermediate_size=48, linear_num_key_heads=1,
                               linear_num_value_heads=2, linear_key_head_dim=16, linear_value_head_dim=16,
                               linear_conv_kernel_dim=4, full_attention_interval=2, eos_token_id=None,
                               pad_token_id=None, bos_token_id=None, tie_word_embeddings=False)
    model = Qwen3_5ForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(10)  # a peaked but not one-hot next-token distribution
        model.model.layers[0].linear_attn.out_proj.weight.mul_(8)
    target = load_target(model)
    draft = load_draft(write_hf_draft(tmp_path / "draft", hidden=32, layers=1, heads=2, kv_heads=1, head_dim=16,
                                      inter=64, vocab=vocab, target_ids=(0, 1), n_target=2, block_size=4,
                                      mask=vocab - 1, bias=False), backend="eager")
    exact: dict = {}  # P(t2, t3) from the target's own logits at temperature 1
    with torch.no_grad():
        for seq in itertools.product(range(vocab), repeat=3):
            logits = model(input_ids=torch.tensor([prompt + list(seq[:2])])).logits[0, len(prompt) - 1:]
            prob = float(torch.softmax(logits.float(), -1)[torch.arange(3), torch.tensor(seq)].prod())
            exact[seq[1:]] = exact.get(seq[1:], 0.0) + prob

    def sample(n):
        counts, accepted, drafted = {}, 0, 0
        for seed in range(n):
            out = speculative_generate(draft, target, prompt, max_new_tokens=3,
                                       sampling=Sampling(temperature=1.0, seed=seed), draft_sampling="probabilistic")
            counts[tuple(out.tokens[1:3])] = counts.get(tuple(out.tokens[1:3]), 0) + 1
            accepted, drafted = accepted + out.stats.accepted, drafted + out.stats.drafted
        return counts, accepted, drafted

    def tv(counts, n):
        return 0.5 * sum(abs(counts.get(k, 0) / n - exact.get(k, 0.0)) for k in set(counts) | set(exact))

    counts, accepted, drafted = sample(runs)
    assert 0.15 * runs < accepted < drafted, (accepted, drafted)  # acceptance and rejection (rollback) both happen
    bound = 0.15  # sampling noise of 500 runs over 25 outcomes: ~0.06
    assert tv(counts, runs) < bound, tv(counts, runs)

    def always_accept(block, target_logits, draft_probs, **kw):
        return block.numel() - 1, block[1:].tolist() + [int(torch.multinomial(
            torch.softmax(target_logits[-1], -1), 1, generator=kw["generator"]))]

    monkeypatch.setattr(decode, "accept_block", always_accept)
    counts, _, _ = sample(150)
    assert tv(counts, 150) > 2 * bound
