"""Rules a verdict rests on, each pinned where a plausible slip would survive the rest of the suite:
the bonus token comes from the target's row after the last accepted proposal; greedy_output_equal
checks every prompt's every token; the memory plan counts both K and V; integer tensors keep their
own width in the memory plan."""

from __future__ import annotations

import json

import pytest
import torch

from dflash_runtime.decode import accept_block
from dflash_runtime.sampling import Sampling
from runtime_helpers import one_torch_thread  # noqa: F401 (autouse fixture)

V = 8


def _one_hot_rows(*tokens: int) -> torch.Tensor:
    """Target logits [len(tokens), V] whose row k puts all mass on tokens[k]."""
    logits = torch.full((len(tokens), V), -1e4)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 0.0
    return logits


@pytest.mark.parametrize("temperature,sampling", [(0.0, "greedy"), (1.0, "greedy"), (1.0, "probabilistic")])
def test_bonus_token_is_the_target_row_after_the_last_proposal(temperature, sampling):
    """Block [anchor, 1, 2]; the target's rows say 1, 2, then 4: both proposals are accepted and the
    committed tokens are [1, 2, 4] (a bonus taken from the row before, the bug, gives [1, 2, 2])."""
    block = torch.tensor([0, 1, 2])
    draft_probs = torch.zeros(2, V)
    draft_probs[0, 1] = draft_probs[1, 2] = 1.0
    accepted, committed = accept_block(block, _one_hot_rows(1, 2, 4), draft_probs, Sampling(temperature=temperature),
                                       torch.Generator().manual_seed(0), sampling)
    assert (accepted, committed) == (2, [1, 2, 4])


def test_greedy_output_equal_checks_every_prompt_past_the_baselines(cli, tmp_path, tiny_target, monkeypatch):
    """Six prompts, the fifth's speculative output off the target's greedy output at its last (sixth) token: the check
    fails naming prompt 5 (only the first four are also decoded target-only; the rest rely on the
    per-token check)."""
    from dflash_convert.validate import end_to_end
    from runtime_helpers import write_hf_draft

    prompts = [[3, 17, 250, 9], [100] * 7, [40, 41, 42], [7, 8, 9, 10], [200, 201, 202, 203, 204], [55, 66]]
    path = tmp_path / "prompts.txt"
    path.write_text("".join(" ".join(map(str, p)) + "\n" for p in prompts))
    real = end_to_end.Decode.speculative

    def speculative(self, prompt, **over):
        out = real(self, prompt, **over)
        if list(prompt) == prompts[4] and not over:
            out.tokens[-1] = (out.tokens[-1] + 1) % 500
        return out

    monkeypatch.setattr(end_to_end.Decode, "speculative", speculative)
    draft = write_hf_draft(tmp_path / "d", layers=1, target_ids=(0, 1), n_target=8, block_size=4)
    r = cli("validate", draft, "--target", tiny_target, "--prompts", path, "--levels", "end_to_end",
            "--max-new-tokens", "6", "--device", "cpu", "--sampling", "greedy", "--json")
    assert r.code == 3, r.err
    check = {c["name"]: c for c in r.json()["checks"]}["greedy_output_equal"]
    assert check["status"] == "fail" and check["message"].startswith("prompt 5: token 6 ") and check["value"] == "5/6"


def test_memory_plan_counts_keys_and_values(tiny_target):
    """The KV part of the plan (what layers add) is at least twice the K and V a real transformers cache
    holds after the sequence (a cache grown by concatenation is copied once)."""
    from transformers import AutoModelForCausalLM, DynamicCache

    from dflash_convert.format.mapping import target_info
    from dflash_convert.validate.memory import runtime_bytes

    raw = json.loads((tiny_target / "config.json").read_text())
    info = target_info(raw, str(tiny_target))
    no_layers = target_info(dict(raw, num_hidden_layers=1), str(tiny_target))
    seq = 40
    per_layer = (runtime_bytes(info, 0, 0, dtype="float32", sequence=seq, block=4)
                 - runtime_bytes(no_layers, 0, 0, dtype="float32", sequence=seq, block=4)) / (info.num_layers - 1)
    model = AutoModelForCausalLM.from_pretrained(tiny_target, dtype=torch.float32)
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(input_ids=torch.arange(seq)[None], past_key_values=cache, use_cache=True)
    layer = cache.layers[0]
    real = layer.keys.nbytes + layer.values.nbytes  # K and V of one layer
    assert per_layer >= 2 * real, (per_layer, real)


def test_memory_plan_keeps_integer_tensors_at_their_width(speculators_drafts):
    """d2t / t2d are integer tensors: loaded as stored whatever the float dtype of the run."""
    from dflash_convert.io.checkpoint import weight_headers
    from dflash_convert.validate.memory import bytes_at

    tensors = weight_headers(speculators_drafts["pruned"])
    ints = [t for name, t in tensors.items() if name.endswith(("d2t", "t2d"))]
    assert ints and all(t.dtype in ("I64", "I32", "BOOL", "U8") for t in ints)
    for dtype in ("bfloat16", "float32"):
        assert bytes_at(ints, dtype) == sum(t.nbytes for t in ints)
    floats = [t for t in tensors.values() if t not in ints]
    assert bytes_at(list(tensors.values()), "bfloat16") == bytes_at(floats, "bfloat16") + sum(t.nbytes for t in ints)


class _LogitsTarget:
    """A target whose teacher-forced pass returns fixed logits [P+N, V] (bf16 values, as a bf16 target gives)."""

    dtype = torch.bfloat16

    def __init__(self, logits: torch.Tensor):
        self.logits = logits.to(torch.bfloat16).float()

    def set_capture(self, ids):
        pass

    def reset(self):
        pass

    def forward(self, ids, start):
        return self.logits[:len(ids)], None


@pytest.mark.parametrize("other_logit,status", [(8.0 - 0.0625, "pass"), (7.5, "fail")])
def test_greedy_output_equal_passes_a_bf16_near_tie_and_fails_a_real_difference(other_logit, status):
    """Prompt [1, 2], speculative output [3, 4]; the target's second row prefers 5 at 8.0. Token 4 one bf16 ulp
    below it (0.0625 at 8) is a near-tie, named as one (the batched verify and sequential decoding round
    differently); at 7.5 it is a real difference and fails."""
    from types import SimpleNamespace

    from dflash_convert.validate.end_to_end import _greedy_check

    logits = torch.zeros(4, V)
    logits[1, 3] = 9.0  # after the prompt: token 3
    logits[2, 5], logits[2, 4] = 8.0, other_logit  # after token 3: 5, the speculative output took 4
    checks = []
    same = _greedy_check(checks, _LogitsTarget(logits), [[1, 2]], [SimpleNamespace(tokens=[3, 4])], [])
    check = checks[0]
    assert (check.status, same) == (status, [False]), check.message
    assert check.value == "0/1" and "token 2" in check.message
    assert ("near-tie" in check.message and "not a near-tie" not in check.message) == (status == "pass")
