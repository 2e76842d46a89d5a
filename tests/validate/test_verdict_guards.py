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


class _PathsTarget:
    """A target of scripted logits: row k (the logits after prompt + tokens[:k]) is `block[k]` when it is a row of a
    verify block (two or more tokens after the prompt), else `one[k]` (one token at a time, a prefill, and the
    teacher-forced pass over the prompt and output, which finds the suspects). bf16 values, as a bf16 target
    gives."""

    dtype = torch.bfloat16
    device = torch.device("cpu")

    def __init__(self, prompt_len: int, one: torch.Tensor, block: torch.Tensor):
        self.p = prompt_len
        self.one, self.block = one.to(torch.bfloat16).float(), block.to(torch.bfloat16).float()
        self.length = 0

    def set_capture(self, ids):
        pass

    def reset(self, max_len=None, block_size=None):
        self.length = 0

    def crop(self, length):
        self.length = min(self.length, length)

    def forward(self, ids, start, *, last_logits_only=False):
        assert start == self.length
        n = len(ids)
        self.length += n
        def row(i: int) -> torch.Tensor:  # after the token at start + i
            k = start + i - self.p + 1
            if not 0 <= k < len(self.one):
                return torch.zeros(V)
            return (self.block if n > 1 and start > 0 else self.one)[k]

        rows = torch.stack([row(i) for i in range(n)])
        return (rows[-1:] if last_logits_only else rows), None


def _greedy_verdict(one_rows, block_rows):
    """greedy_output_equal of prompt [1, 2] and a speculative output [3, 4] made by one verify step accepting
    nothing (token 3 from the prefill, token 4 from the verify block's first row)."""
    from types import SimpleNamespace

    from dflash_convert.validate.end_to_end import _greedy_check

    checks = []
    target = _PathsTarget(2, one_rows, block_rows)
    run = SimpleNamespace(tokens=[3, 4], accepted_per_step=[0])
    same = _greedy_check(checks, target, [[1, 2]], [run], [], proposals=3, max_new_tokens=2)
    return checks[0], same


def _rows(second: dict[int, float]) -> torch.Tensor:
    rows = torch.zeros(2, V)
    rows[0, 3] = 9.0  # after the prompt: token 3
    for token, logit in second.items():
        rows[1, token] = logit
    return rows


@pytest.mark.parametrize("verify_4,status", [(8.0 + 0.0625, "pass"), (8.0 - 0.1875, "fail")])
def test_greedy_output_equal_judges_a_parting_by_the_noise_measured_between_the_target_paths(verify_4, status):
    """After token 3 the target's one-token decode prefers 5 at 8.0, with token 4 three bf16 ulps below (7.8125; an
    ulp is 0.0625 at 8): the speculative output took 4. Where the target's own verify block puts 4 on top (8.0625),
    the paths' rounding chose it: a near-tie, named with both gaps, though wider than a fixed 2 ulps. Where the
    verify block agrees with the one-token decode (no noise to explain it), the parting fails."""
    one = _rows({5: 8.0, 4: 8.0 - 0.1875})
    block = _rows({5: 8.0, 4: verify_4})
    check, same = _greedy_verdict(one, block)
    assert (check.status, same) == (status, [False]), check.message
    assert check.value == "0/1" and "token 2" in check.message and "3.0 bfloat16 ulps" in check.message
    assert ("a near-tie" in check.message and "not a near-tie" not in check.message) == (status == "pass")
    if status == "pass":
        assert "the verify block computes them 8 and 8.062" in check.message


def test_greedy_output_equal_within_one_ulp_is_a_near_tie_whatever_the_paths():
    check, _ = _greedy_verdict(_rows({5: 8.0, 4: 8.0 - 0.0625}), _rows({5: 8.0, 4: 8.0 - 0.0625}))
    assert check.status == "pass" and "a near-tie" in check.message


def test_greedy_output_equal_refuses_a_verdict_where_the_target_paths_differ_beyond_rounding():
    """The verify block moves a logit by 96 ulps (6.0 at 8): not rounding; the tool cannot run this target
    exactly, and says so (exit 1), neither passing the parting nor blaming the draft."""
    from dflash_convert.errors import DFlashError

    with pytest.raises(DFlashError, match=r"cannot judge greedy_output_equal: at prompt 1, token 2.*beyond rounding"):
        _greedy_verdict(_rows({5: 8.0, 4: 7.0}), _rows({5: 2.0, 4: 7.0}))


def test_partings_keep_only_the_parting_rows_and_equal_the_whole_tensors(runtime_target, monkeypatch):
    """A 6-token output off the target's greedy choice at tokens 3 and 6 (penalties on; each the second row of its
    verify block): the partings are those the
    whole [N, V] tensors of both paths give, bit for bit, with the teacher-forced rows argmaxed 2 at a time; of each
    path only the parting rows are kept ([V] each)."""
    from types import SimpleNamespace

    from dflash_convert.validate import end_to_end
    from dflash_runtime.paths import one_token_logits, one_token_partings, verify_logits
    from dflash_runtime.sampling import Penalties

    target, prompt, penalties = runtime_target, [3, 17, 250, 9], Penalties(repetition=1.3, frequency=0.2)
    target.set_capture([])

    def output(parted: tuple[int, ...]) -> list[int]:
        """6 tokens, each the target's greedy choice after the ones before, but at `parted` its second choice."""
        tokens: list[int] = []
        for k in range(6):
            row = one_token_logits(target, prompt, tokens + [0], max_new_tokens=8, penalties=penalties)[-1]
            tokens.append(int(row.topk(2).indices[1 if k in parted else 0]))
        return tokens

    tokens = output((2, 5))
    run = SimpleNamespace(tokens=tokens, accepted_per_step=[2, 2])  # 1 + 3 + 2 tokens
    kw = dict(max_new_tokens=8, penalties=penalties)
    one = one_token_logits(target, prompt, tokens, **kw)
    verify = verify_logits(target, prompt, tokens, run.accepted_per_step, proposals=3, **kw)
    greedy, kept = one_token_partings(target, prompt, tokens, **kw)
    assert greedy == one.argmax(dim=-1).tolist() and sorted(kept) == [2, 5]
    assert all(row.shape == (one.shape[1],) and torch.equal(row, one[k]) for k, row in kept.items())
    rows = verify_logits(target, prompt, tokens, run.accepted_per_step, proposals=3, rows=[2, 5], **kw)
    assert rows.shape == (2, one.shape[1]) and torch.equal(rows, verify[[2, 5]])
    monkeypatch.setattr(end_to_end, "SUSPECT_ROWS", 2)
    found = end_to_end._partings(target, prompt, run, None, "float32", penalties, proposals=3, max_new_tokens=8)
    want = [end_to_end.PathParting(k, greedy[k], tokens[k], "float32", float(one[k, greedy[k]]),
                                   float(one[k, tokens[k]]), float(verify[k, greedy[k]]), float(verify[k, tokens[k]]))
            for k in (2, 5)]
    assert found == want
    import dflash_runtime.paths

    def refused(*args, **kwargs):
        raise AssertionError("the one-token path recomputed an output that is the target's greedy output")

    monkeypatch.setattr(dflash_runtime.paths, "one_token_partings", refused)  # the chunked gate lets it through
    greedy_run = SimpleNamespace(tokens=output(()), accepted_per_step=[2, 2])
    assert end_to_end._partings(target, prompt, greedy_run, None, "float32", penalties, proposals=3,
                                max_new_tokens=8) == []
