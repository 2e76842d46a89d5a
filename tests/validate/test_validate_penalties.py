"""Penalties as vLLM applies them: repetition, presence and frequency penalties from the target's
generation_config.json (or flags) on the target's distribution in verification, with what counts as
already generated at each speculative position as vLLM's rejection sampler counts it; the target-only
baseline and the self-check's `generate` reference with the same rule."""

from __future__ import annotations

import json
import os

import pytest

from runtime_helpers import one_torch_thread  # noqa: F401 (autouse fixture)
from factories import chat_target
from processes import VLLM_PYTHON, needs_vllm

PENALTIES = {"repetition_penalty": 1.1, "presence_penalty": 0.5}

pytestmark = pytest.mark.usefixtures("one_timing_round")  # no test here reads the speedup


def test_chat_prompts_with_penalties_in_generation_config_validate(speculators_drafts, tiny_target, tmp_path, cli):
    """A generation_config.json with repetition_penalty 1.1 and presence_penalty 0.5 and chat prompts: the
    run applies both (as vLLM does by default) and says so. Before: exit 1 'the runtime cannot run this
    target', because the self-check's generate applied the repetition penalty and the runtime did not."""
    target = chat_target(tiny_target, tmp_path / "target", generation=dict(PENALTIES))
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"messages": [{"role": "user", "content": c}]}) + "\n"
                               for c in ("the cat sat", "hello world", "the world")))
    args = ["validate", speculators_drafts["full"], "--target", target, "--prompts", prompts, "--levels",
            "end_to_end", "--max-new-tokens", "24", "--threads", "1", "--sampling", "greedy", "--json"]
    r = cli(*args)
    assert r.code == 0, r.err[-2000:]
    a = r.json()["acceptance"]
    s = a["sampling"]
    assert (s["repetition_penalty"], s["presence_penalty"], s["frequency_penalty"]) == (1.1, 0.5, 0.0)
    assert s["sources"]["repetition_penalty"] == "generation_config.json"
    assert s["sources"]["frequency_penalty"] == "vLLM default"
    assert a["outputs_equal"] == 3


def _vllm_rule(logits, prompt, history, rep, pres, freq):
    """vLLM's rule for one row, transcribed independently, token by token: `history` the output so far."""
    out = logits.clone()
    for t in range(logits.numel()):
        n = history.count(t)
        if rep != 1.0 and (t in prompt or n):
            out[t] = out[t] * (1 / rep) if out[t] > 0 else out[t] * rep
        out[t] = out[t] - freq * n - pres * (1 if n else 0)
    return out


def test_penalize_counts_what_vllms_rejection_sampler_counts():
    """Row i of a verify block sees the committed output plus proposals 1..i-1 (vLLM's
    _combine_outputs_with_spec_tokens); repetition counts the prompt too, presence and frequency do not.
    A planted 'every row sees the whole block' or 'presence counts the prompt' fails here."""
    import torch

    from dflash_runtime.sampling import Penalties, penalize

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 12, generator=g) * 3  # [n=4 slots, V=12]
    prompt, committed, proposals = [1, 2, 2], [3, 4, 3], [5, 3, 1]
    p = Penalties(repetition=1.3, presence=0.5, frequency=0.25)
    got = penalize(logits, p, torch.tensor(prompt), torch.tensor(committed + proposals), len(committed))
    for i in range(4):
        want = _vllm_rule(logits[i], prompt, committed + proposals[:i], 1.3, 0.5, 0.25)
        assert torch.allclose(got[i], want, atol=1e-6), i
    assert torch.equal(penalize(logits, Penalties(), torch.tensor(prompt), torch.tensor(committed + proposals), 3),
                       logits)  # neutral: untouched


def test_repetition_alone_is_transformers_processor():
    """Where the semantics coincide (repetition only: transformers' input ids are prompt + output), the
    rule equals transformers' RepetitionPenaltyLogitsProcessor on every row."""
    import torch
    from transformers import RepetitionPenaltyLogitsProcessor

    from dflash_runtime.sampling import Penalties, penalize

    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 20, generator=g) * 4
    prompt, output = [1, 7, 7, 9], [4, 11, 7, 2]
    got = penalize(logits, Penalties(repetition=1.1), torch.tensor(prompt), torch.tensor(output), 2)
    theirs = RepetitionPenaltyLogitsProcessor(1.1)
    for i in range(3):
        ids = torch.tensor([prompt + output[:2 + i]])
        assert torch.allclose(got[i], theirs(ids, logits[i:i + 1].clone())[0], rtol=1e-6, atol=0), i


@pytest.mark.parametrize("pen", [dict(repetition=1.5), dict(presence=1.5, frequency=0.7),
                                 dict(repetition=1.1, presence=0.5)])
def test_speculative_equals_target_only_and_generate_with_penalties(speculators_drafts, tiny_target, pen):
    """Greedy speculative decoding with penalties is target-only decoding with them, and both are
    transformers' generate with vLLM's rule as a logits processor (repetition alone: with transformers' own
    repetition_penalty); the penalties change the output (the comparison is not vacuous)."""
    import torch

    from dflash_convert.validate.end_to_end import VllmPenaltiesProcessor
    from dflash_runtime import Penalties, Sampling, load_draft, load_target, speculative_generate, target_generate

    target = load_target(tiny_target, device="cpu", dtype=torch.float32)
    draft = load_draft(speculators_drafts["full"], device="cpu", dtype=torch.float32)
    p = Penalties(**pen)
    prompt = [5, 6, 7, 8, 9, 10, 5, 6]
    plain = target_generate(target, prompt, max_new_tokens=40).tokens
    base = target_generate(target, prompt, max_new_tokens=40, sampling=Sampling(penalties=p)).tokens
    spec = speculative_generate(draft, target, prompt, max_new_tokens=40, sampling=Sampling(penalties=p))
    assert spec.tokens == base and base != plain
    ids = torch.tensor([prompt])
    kw = dict(attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        ref = target.model.generate(ids, logits_processor=[VllmPenaltiesProcessor(p, len(prompt))], **kw)
        assert ref[0, len(prompt):].tolist() == base
        if set(pen) == {"repetition"}:
            own = target.model.generate(ids, repetition_penalty=pen["repetition"], **kw)
            assert own[0, len(prompt):].tolist() == base


def test_flags_override_and_what_is_not_applied_is_named(speculators_drafts, tiny_target, tmp_path, cli):
    gen = dict(PENALTIES, frequency_penalty=0.2, max_new_tokens=512, no_repeat_ngram_size=3)
    target = chat_target(tiny_target, tmp_path / "target", generation=gen)
    prompts = tmp_path / "p.txt"
    prompts.write_text("5 6 7 8 9 10\n")
    args = ["validate", speculators_drafts["full"], "--target", target, "--prompts", prompts, "--levels",
            "end_to_end", "--max-new-tokens", "8", "--threads", "1", "--sampling", "greedy", "--json"]
    r = cli(*args, "--repetition-penalty", "1", "--presence-penalty", "0.25")
    assert r.code == 0, r.err[-2000:]
    s = r.json()["acceptance"]["sampling"]
    assert (s["repetition_penalty"], s["presence_penalty"], s["frequency_penalty"]) == (1.0, 0.25, 0.2)
    assert (s["sources"]["repetition_penalty"], s["sources"]["presence_penalty"],
            s["sources"]["frequency_penalty"]) == ("--repetition-penalty", "--presence-penalty",
                                                   "generation_config.json")
    assert set(s["not_applied"]) == {"max_new_tokens", "no_repeat_ngram_size"}
    assert "--max-new-tokens" in s["not_applied"]["max_new_tokens"]
    assert cli(*args, "--presence-penalty", "2.5").code == 2
    (target / "generation_config.json").write_text(json.dumps({"repetition_penalty": 0}))
    r = cli(*args)
    assert r.code == 1 and "generation_config.json" in r.err and "repetition_penalty" in r.err, r.err[-500:]


VLLM_PENALIZE = """
import json, sys, torch
from vllm.v1.sample.ops.penalties import apply_all_penalties
from vllm.v1.sample.rejection_sampler import RejectionSampler
d = json.load(open(sys.argv[1]))
logits = torch.tensor(d["logits"], dtype=torch.float32)
n, vocab = logits.shape
# the draft slots as the rejection sampler counts them, then the bonus token as the sampler does
rows = RejectionSampler._combine_outputs_with_spec_tokens([d["output"]], [d["spec"]]) + [d["output"] + d["spec"]]
prompt = torch.tensor([d["prompt"]] * n)
pen = {k: torch.full((n,), d[k], dtype=torch.float32) for k in ("presence", "frequency", "repetition")}
out = apply_all_penalties(logits.clone(), prompt, pen["presence"], pen["frequency"], pen["repetition"], rows)
print("RESULT " + json.dumps(out.tolist()))
"""


@needs_vllm
def test_penalize_equals_vllms_own_penalties(tmp_path):
    """vLLM's own apply_all_penalties, fed the rows its rejection sampler builds (committed output plus the
    proposals before each draft slot, then all of them for the bonus token), gives the same float32 logits,
    bit for bit."""
    import subprocess

    import torch

    from dflash_runtime.sampling import Penalties, penalize

    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 40, generator=g) * 3
    logits[:, :3] = 0.0  # a zero logit: neither scaled up nor down
    d = {"logits": logits.tolist(), "prompt": [1, 2, 2, 7, 30], "output": [3, 7, 3], "spec": [5, 3, 39],
         "presence": 0.5, "frequency": 0.25, "repetition": 1.1}
    (tmp_path / "d.json").write_text(json.dumps(d))
    (tmp_path / "p.py").write_text(VLLM_PENALIZE)
    done = subprocess.run([VLLM_PYTHON, str(tmp_path / "p.py"), str(tmp_path / "d.json")], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHONPATH": ""})
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
    assert line is not None, (done.stdout + done.stderr)[-3000:]
    theirs = torch.tensor(json.loads(line.removeprefix("RESULT ")), dtype=torch.float32)
    ours = penalize(torch.tensor(d["logits"]), Penalties(repetition=1.1, presence=0.5, frequency=0.25),
                    torch.tensor(d["prompt"]), torch.tensor(d["output"] + d["spec"]), len(d["output"]))
    assert torch.equal(ours, theirs)


def test_sampled_runs_apply_penalties_too(speculators_drafts, tiny_target, tmp_path, cli):
    """At temperature > 0 (generation_config's temperature and penalties) the run samples the penalized
    target distribution and its greedy exactness pass applies the penalties as well (else it would report
    the runtime's own greedy output as wrong)."""
    target = chat_target(tiny_target, tmp_path / "target", generation=dict(PENALTIES, temperature=0.8))
    prompts = tmp_path / "p.txt"
    prompts.write_text("5 6 7 8 9 10\n11 12 13 14 15\n")
    r = cli("validate", speculators_drafts["full"], "--target", target, "--prompts", prompts, "--levels",
            "end_to_end", "--max-new-tokens", "24", "--threads", "1", "--draft-sampling", "probabilistic", "--json")
    assert r.code == 0, r.err[-2000:]
    a = r.json()["acceptance"]
    assert a["temperature"] == 0.8 and a["sampling"]["presence_penalty"] == 0.5
    assert next(c for c in r.json()["checks"] if c["name"] == "greedy_output_equal")["status"] == "pass"
