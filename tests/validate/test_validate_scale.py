"""validate at real size, tried on tiny models: the memory plan refuses a target too large before
anything is loaded; a target with missing weights fails naming the tensor (never random values); a
device-mapped target with part of it offloaded to disk gives the single-device outputs; the reported
speedup is the ratio of the reported tokens/s; both draft-sampling modes keep the target's output
distribution."""

from __future__ import annotations

import itertools
import json
import math
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from dflash_convert.errors import DFlashError
from runtime_helpers import one_torch_thread, write_hf_draft  # noqa: F401 (autouse fixture)

CAPTURE = [1, 4, 6]  # the speculators drafts' aux ids (2, 5, 7) as z-lab target ids


def _prompts(tmp_path: Path) -> Path:
    p = tmp_path / "prompts.txt"
    p.write_text("5 6 7 8 9 10\n100 3 44 2\n")
    return p


# ----------------------------------------------------------------------------- memory plan

def _header_only_target(path: Path, source: Path, total_bytes: int) -> Path:
    """A Qwen3 target whose config implies `total_bytes` of float32 weights, stored as a sparse
    safetensors file (a valid header; the data region is a hole): nothing real to load."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from dflash_convert.io.safetensors import header_bytes

    raw = json.loads((source / "config.json").read_text())
    raw["num_hidden_layers"] = 512  # deep rather than absurdly wide: every size stays within the config bounds
    raw.pop("layer_types", None)
    per_unit = raw["num_hidden_layers"] * 3 * raw["hidden_size"] * 4  # MLP bytes per unit of intermediate size
    raw["intermediate_size"] = math.ceil(total_bytes / per_unit)
    raw["dtype"] = "float32"
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(raw))
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    entries = [(name, "F32", tuple(t.shape)) for name, t in model.state_dict().items()]
    head, offsets = header_bytes(entries, {"format": "pt"})
    with open(path / "model.safetensors", "wb") as f:
        f.write(head)
        f.truncate(len(head) + offsets[-1][1])
    return path


@pytest.fixture
def no_loading(monkeypatch):
    """Record any attempt to load a draft or a target."""
    import dflash_runtime.draft_load
    import dflash_runtime.target_load

    calls = []

    def refuse(what):
        def load(*args, **kwargs):
            calls.append(what)
            raise AssertionError(f"{what} was loaded")
        return load

    monkeypatch.setattr(dflash_runtime.target_load, "load_target", refuse("target"))
    monkeypatch.setattr(dflash_runtime.draft_load, "load_draft", refuse("draft"))
    return calls


def test_memory_plan_refuses_a_target_too_large_before_loading(speculators_drafts, tiny_target, tmp_path, cli,
                                                               no_loading):
    from dflash_convert.validate import memory

    free = memory.cpu_available()
    assert free and free > 0
    big = _header_only_target(tmp_path / "big", tiny_target, 3 * free)  # 3x free memory in float32
    r = cli("validate", speculators_drafts["full"], "--target", big, "--prompts", _prompts(tmp_path), "--json")
    assert r.code == 1, r.err[-2000:]
    line = r.err.strip().splitlines()[-1]
    assert line.startswith("Error: not enough memory on cpu: the run needs ")
    assert "float32" in line and "free; options: --dtype bfloat16 (needs " in line
    assert "--device-map auto" in line and "--levels static,numeric (needs " in line
    assert no_loading == []  # refused before anything was loaded
    target_bytes = float(line.split("target ")[1].split(" GB")[0]) * 1e9
    assert target_bytes == pytest.approx(3 * free, rel=0.01)  # the plan counts the real parameter bytes
    assert float(line.split("the run needs ")[1].split(" GB")[0]) * 1e9 > target_bytes
    # the draft alone fits: the levels that do not need the target run
    r = cli("validate", speculators_drafts["full"], "--target", big, "--levels", "static", "--json")
    assert r.code == 0 and r.json()["levels_run"] == ["static"]


def test_memory_plan_figures(speculators_drafts, tiny_target, tmp_path):
    from dflash_convert.validate import memory
    from dflash_convert.io.checkpoint import open_checkpoint

    ckpt = open_checkpoint(speculators_drafts["full"])
    tensors = list(ckpt.tensors.values())
    target_tensors = memory.weight_headers(tiny_target)
    f32 = sum(t.numel for t in target_tensors.values()) * 4
    plan = memory.plan(tensors, "float32", device="cpu", target_dir=tiny_target, target_dtype="bfloat16",
                       draft_layers=2, draft_kv_width=32, sequence=100, block=8)
    assert plan.target_bytes == f32 // 2 and plan.draft_bytes == sum(t.nbytes for t in tensors)
    assert plan.fits and plan.runtime_bytes > 2 * 8 * 2 * 16 * 100 * 2  # at least the target's KV cache
    # a device map lets the target spill: only the draft and the runtime must fit on the draft's device
    free = memory.cpu_available()
    huge = _header_only_target(tmp_path / "huge", tiny_target, 3 * free)
    plan = memory.plan(tensors, "float32", device="cpu", target_dir=huge, target_dtype="float32", sequence=20)
    assert not plan.fits and plan.target_bytes >= 3 * free
    plan = memory.plan(tensors, "float32", device="cpu", target_dir=huge, target_dtype="float32", sequence=20,
                       device_map="auto")
    assert plan.fits and "device map auto" in plan.describe()
    assert memory.parse_max_memory("0=20GiB, cpu=200MB") == {"0": 20 * 2**30, "cpu": 200 * 10**6}


def test_a_long_context_plan_counts_scores_only_for_eager_and_logits_only_for_the_rows_kept(speculators_drafts,
                                                                                              tiny_target):
    """At 8k context the old plan counted [heads, 8k, 8k] float32 scores and [8k, V] logits three times: an
    8B-shaped target at 8k asked for 46 GB on a 24 GB machine. sdpa (the Qwen3 target's default) never holds the
    scores and the run keeps at most max(new tokens, block) rows of logits; eager attention does hold them."""
    from dflash_convert.io.checkpoint import open_checkpoint
    from dflash_convert.validate import memory

    tensors = list(open_checkpoint(speculators_drafts["full"]).tensors.values())
    seq, rows, heads, vocab = 8192 + 64 + 8, 64, 4, 512  # the tiny target: 4 heads, vocab 512

    def plan(**kw):
        return memory.plan(tensors, "float32", device="cpu", target_dir=tiny_target, target_dtype="bfloat16",
                           draft_layers=2, draft_kv_width=32, sequence=seq, block=8, **kw).runtime_bytes

    scores, logits = heads * seq * seq * 4, 3 * (seq - rows) * vocab * 4
    assert plan(attention="eager", logit_rows=rows) - plan(logit_rows=rows) == scores  # sdpa picked: no scores
    assert plan(attention="sdpa", logit_rows=rows) == plan(logit_rows=rows)
    assert plan() - plan(logit_rows=rows) == logits
    for bad in ("cpu", "gpu=1GB", "cpu=lots", "cpu=0", ""):
        with pytest.raises(ValueError):
            memory.parse_max_memory(bad)


# ----------------------------------------------------------------------------- incomplete weights

def _rewrite(target: Path, dest: Path, edit) -> Path:
    from safetensors.torch import load_file, save_file

    shutil.copytree(target, dest)
    tensors = load_file(str(dest / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dest / "model.safetensors"), metadata={"format": "pt"})
    return dest


def test_target_missing_a_layer_fails_naming_the_tensor(speculators_drafts, tiny_target, tmp_path, cli):
    from dflash_runtime import load_target

    def drop_layer_3(t):
        for name in [n for n in t if n.startswith("model.layers.3.")]:
            del t[name]

    broken = _rewrite(tiny_target, tmp_path / "no-layer-3", drop_layer_3)
    with pytest.raises(DFlashError, match=r"target weights are incomplete: `model\.layers\.3\.[a-z_.]+weight` and "
                                          r"10 more of its \d+ parameters are missing .*random values"):
        load_target(broken)
    r = cli("validate", speculators_drafts["full"], "--target", broken, "--prompts", _prompts(tmp_path), "--json")
    assert r.code == 1 and "`model.layers.3." in r.err.strip().splitlines()[-1]

    def add_unknown(t):
        t["model.layers.3.mlp.extra.weight"] = torch.zeros(2, 2)

    extra = _rewrite(tiny_target, tmp_path / "extra", add_unknown)
    with pytest.raises(DFlashError, match=r"`model\.layers\.3\.mlp\.extra\.weight` is not parameters of "
                                          r"Qwen3ForCausalLM"):
        load_target(extra)

    def wrong_shape(t):
        t["model.norm.weight"] = torch.ones(7)

    with pytest.raises(DFlashError, match=r"`model\.norm\.weight` has shape \[7\], its config implies \[64\]"):
        load_target(_rewrite(tiny_target, tmp_path / "shape", wrong_shape))


def test_tied_embeddings_are_complete_without_lm_head(tmp_path):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from dflash_runtime import load_target

    cfg = Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=1, head_dim=16, tie_word_embeddings=True)
    Qwen3ForCausalLM(cfg).save_pretrained(tmp_path / "tied")
    from dflash_convert.validate.memory import weight_headers

    assert "lm_head.weight" not in weight_headers(tmp_path / "tied")
    target = load_target(tmp_path / "tied")
    assert torch.equal(target.lm_head.weight, target.embed_tokens.weight)


# ----------------------------------------------------------------------------- device map

def test_device_map_with_disk_offload_equals_the_single_device_run(speculators_drafts, tiny_target, tmp_path, cli):
    from dflash_runtime import Sampling, load_draft, load_target, speculative_generate

    whole = load_target(tiny_target)
    mapped = load_target(tiny_target, device_map="auto", max_memory={"cpu": 1_000_000})  # ~2/3 of its 1.5 MB
    assert mapped.offloaded.get("disk", 0) >= 1 and mapped.offloaded.get("cpu", 0) >= 1  # really split
    assert mapped.model.model.layers[-1].self_attn.q_proj.weight.device.type == "meta"  # on disk until used
    ids = torch.tensor([5, 6, 7, 8, 9, 10, 11])
    for t in (whole, mapped):
        t.set_capture(CAPTURE)
        t.reset()
    (la, fa), (lb, fb) = whole.forward(ids, 0), mapped.forward(ids, 0)
    assert torch.equal(la, lb) and torch.equal(fa, fb)
    assert torch.equal(whole.embed(ids), mapped.embed(ids))
    draft = load_draft(speculators_drafts["full"], device=mapped.draft_device)
    for at in (Sampling(seed=3), Sampling(temperature=0.8, seed=3)):
        a = speculative_generate(draft, whole, [5, 6, 7, 8], max_new_tokens=12, sampling=at)
        b = speculative_generate(draft, mapped, [5, 6, 7, 8], max_new_tokens=12, sampling=at)
        assert a.tokens == b.tokens and a.stats.accepted == b.stats.accepted
    prompts = tmp_path / "one.txt"
    prompts.write_text("5 6 7 8 9 10\n")
    r = cli("validate", speculators_drafts["full"], "--target", tiny_target, "--prompts", prompts,
            "--levels", "end_to_end", "--max-memory", "cpu=1MB", "--max-new-tokens", "4", "--sampling", "greedy",
            "--json")
    assert r.code == 0, r.err[-2000:]
    report = r.json()
    assert report["environment"]["device_map"] == "auto" and report["acceptance"]["outputs_equal"] == 1
    assert "module(s) on disk" in r.err
    assert cli("validate", speculators_drafts["full"], "--max-memory", "cpu=lots").code == 2
    assert cli("validate", speculators_drafts["full"], "--device-map", "everywhere").code == 2


# ----------------------------------------------------------------------------- honest numbers

def test_speedup_is_the_ratio_of_the_reported_rates(speculators_drafts, tiny_target, tmp_path, cli):
    args = ["validate", speculators_drafts["full"], "--target", tiny_target, "--prompts", _prompts(tmp_path),
            "--levels", "end_to_end", "--max-new-tokens", "8", "--json"]
    r = cli(*args)
    assert r.code == 0, r.err[-2000:]
    report = r.json()
    a = report["acceptance"]
    assert a["speedup"] == a["speculative_tokens_per_s"] / a["target_tokens_per_s"]
    assert a["timing_rounds"] == 3 and a["speedup_range"][0] <= a["speedup_range"][1]
    for key in ("speculative_tokens_per_s", "target_tokens_per_s"):
        low, high = a[key + "_range"]
        assert 0 < low <= high
    assert report["environment"]["threads"] == 1  # a tiny pair: one thread by default, and said
    speed = next(c for c in report["checks"] if c["name"] == "speedup")
    assert speed["status"] in ("pass", "warn") and "informational" in speed["message"]
    assert speed["value"] == pytest.approx(a["speedup"], rel=1e-3)
    assert "timing round 3/3" in r.err and "CPU threads: 1" in r.err
    r = cli(*args, "--min-speedup", "1000")  # a gate only when asked for
    assert r.code == 3 and [c["name"] for c in r.json()["checks"] if c["status"] == "fail"] == ["speedup"]
    assert r.err.strip().splitlines()[-1].endswith("failed: speedup")


# ----------------------------------------------------------------------------- draft sampling

def _tv(counts: dict, probs: dict, n: int) -> float:
    keys = set(counts) | set(probs)
    return 0.5 * sum(abs(counts.get(k, 0) / n - probs.get(k, 0.0)) for k in keys)


class MarkovTarget:
    """A stand-in target for the real decode loop: its next-token distribution depends on the previous
    token only (p_next[prev]), its context features come from a fixed table, its KV cache is a length.
    The exact output distribution is then known in closed form."""

    def __init__(self, p_next: torch.Tensor, hidden: int, layers: int = 2, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.p_next = p_next  # [V, V]
        self.vocab_size, self.hidden_size, self.num_layers = p_next.shape[0], hidden, layers
        self.device = self.draft_device = torch.device("cpu")
        self.table = torch.randn(self.vocab_size, hidden, generator=g)  # [V, Ht]
        self.lm_head = torch.nn.Linear(hidden, self.vocab_size, bias=False)
        with torch.no_grad():
            self.lm_head.weight.copy_(torch.randn(self.vocab_size, hidden, generator=g) * 0.5)
        self.capture_ids: list[int] = []
        self.cache_len = 0
        self.config = SimpleNamespace(_name_or_path="markov", architectures=[], pad_token_id=None, eos_token_id=None)

    def set_capture(self, ids):
        self.capture_ids = list(ids)

    def reset(self, max_len=None, block_size=None):  # noqa: ARG002 - a length needs no preallocation
        self.cache_len = 0

    def crop(self, length: int):
        self.cache_len = min(self.cache_len, length)

    def embed(self, ids):
        return self.table[ids] * 0.05

    def forward(self, ids, start, *, last_logits_only=False):
        assert start == self.cache_len
        self.cache_len += ids.numel()
        logits = self.p_next[ids].log()  # [n, V]: the distribution after each input token
        features = torch.cat([self.table[ids]] * len(self.capture_ids), -1) if self.capture_ids else None
        return (logits[-1:] if last_logits_only else logits), features


def _filtered(row: list[float], *, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> list[float]:
    """The reference filter, written from vLLM's description in plain Python (temperature 1): min-p
    against the most likely token, top-k with ties kept, then top-p: smallest tokens dropped while the
    mass dropped stays <= 1 - top_p (the most likely always stays); renormalized."""
    kept = [p if p >= min_p * max(row) else 0.0 for p in row]
    if 0 < top_k < len(row):
        kth = sorted(kept, reverse=True)[top_k - 1]
        kept = [p if p >= kth else 0.0 for p in kept]
    total = sum(kept)
    kept = [p / total for p in kept]
    if top_p < 1:
        order = sorted(range(len(kept)), key=lambda i: kept[i])
        dropped = 0.0
        for i in order[:-1]:
            if dropped + kept[i] > 1 - top_p:
                break
            dropped += kept[i]
            kept[i] = 0.0
    total = sum(kept)
    return [p / total for p in kept]



# The exact boundaries are vLLM's (v1/sample/ops/topk_topp_sampler.py apply_top_k_top_p_pytorch: sorted
# ascending, a token goes while the cumulative probability is <= 1 - top_p, the largest always stays;
# v1/sample/logits_processor/builtin.py MinPLogitsProcessor: a token goes when its probability is < min_p
# x the largest). Probabilities chosen to be exact in float32, so the boundary is hit exactly.
@pytest.mark.parametrize("top_p, kept", [(0.75, [0.0, 1 / 3, 2 / 3]), (0.5, [0.0, 0.0, 1.0]),
                                         (0.76, [0.25, 0.25, 0.5]), (1.0, [0.25, 0.25, 0.5])])
def test_top_p_drops_the_mass_up_to_and_including_one_minus_top_p(top_p, kept):
    """0.25, 0.25, 0.5 at top-p 0.75: the cumulative 0.25 equals 1 - top_p, so exactly one 0.25 token goes."""
    from dflash_runtime.sampling import filtered_probs

    probs = filtered_probs(torch.tensor([[0.0, 0.0, math.log(2.0)]]), 1.0, top_p=top_p)
    assert probs[0].tolist() == pytest.approx(kept, abs=1e-6)
    assert _filtered([0.25, 0.25, 0.5], top_p=top_p) == pytest.approx(kept, abs=1e-6)


@pytest.mark.parametrize("min_p, kept", [(1.0, [0.0, 1.0, 0.0]), (0.5, [0.0, 2 / 3, 1 / 3]),
                                         (0.25, [1 / 7, 4 / 7, 2 / 7])])
def test_min_p_keeps_tokens_at_the_threshold(min_p, kept):
    """Probabilities 1/7, 4/7, 2/7: min-p 1.0 keeps the argmax alone (never an empty row, never NaN);
    a token exactly at min_p x the largest stays."""
    from dflash_runtime.sampling import filtered_probs

    probs = filtered_probs(torch.tensor([[0.0, 2 * math.log(2.0), math.log(2.0)]]), 1.0, min_p=min_p)
    assert not probs.isnan().any(), f"min-p {min_p} emptied the row (every token dropped): {probs.tolist()}"
    assert probs[0].tolist() == pytest.approx(kept, abs=1e-6)


# each moves the chain's distribution by TV 0.17-0.24 from the unfiltered one and keeps 2-4 tokens per row
FILTERS = {"none": {}, "top_k": {"top_k": 2}, "top_p": {"top_p": 0.8}, "min_p": {"min_p": 0.15},
           "all": {"top_k": 3, "top_p": 0.9, "min_p": 0.2}}


@pytest.mark.parametrize("sampling", ["greedy", "probabilistic"])
@pytest.mark.parametrize("filters", list(FILTERS))
def test_speculative_sampling_keeps_the_target_distribution_end_to_end(tmp_path, monkeypatch, sampling, filters):
    """Many seeded runs through the real decode loop and a real draft on a 5-token vocabulary: tokens 2
    and 3 (made by draft + verify steps) are distributed as the target's distribution filtered by
    top-k / top-p / min-p (a reference filter written here, in plain Python), within a total-variation
    bound; always accepting (a planted bug) lands far outside it (measured: TV 0.7-0.96), and so does
    verifying against the unfiltered distribution (filtering only the token after the prompt)."""
    from dflash_runtime import Sampling, decode, load_draft, speculative_generate

    g = torch.Generator().manual_seed(0)
    vocab, runs = 5, 800
    p_next = torch.softmax(torch.randn(vocab, vocab, generator=g) * 1.5, -1)
    target = MarkovTarget(p_next, hidden=32)
    path = write_hf_draft(tmp_path / "draft", hidden=32, layers=1, heads=2, kv_heads=1, head_dim=16, inter=64,
                          vocab=vocab, target_ids=(0, 1), n_target=2, block_size=4, mask=vocab - 1, bias=False)
    draft = load_draft(path, backend="eager")
    prompt = [2, 3]
    kw = FILTERS[filters]
    rows = [_filtered(p_next[i].tolist(), **kw) for i in range(vocab)]
    exact: dict = {}  # P(t2, t3) = sum over t1 of the chain's probabilities after the prompt's last token
    for seq in itertools.product(range(vocab), repeat=3):
        prob, prev = 1.0, prompt[-1]
        for tok in seq:
            prob, prev = prob * rows[prev][tok], tok
        exact[seq[1:]] = exact.get(seq[1:], 0.0) + prob

    def sample(n):
        counts: dict = {}
        accepted = 0
        for seed in range(n):
            out = speculative_generate(draft, target, prompt, max_new_tokens=3, draft_sampling=sampling,
                                       sampling=Sampling(temperature=1.0, seed=seed, **kw))
            counts[tuple(out.tokens[1:3])] = counts.get(tuple(out.tokens[1:3]), 0) + 1
            accepted += out.stats.accepted
        return counts, accepted

    counts, accepted = sample(runs)
    assert accepted > 0.15 * runs  # acceptance really happens, so the rule is exercised
    # sampling noise of 800 runs: ~0.05 over 25 outcomes, ~0.04 over the filtered chains' fewer (measured)
    bound = 0.15 if filters == "none" else 0.1
    tv = _tv(counts, exact, runs)
    assert tv < bound, tv
    if filters != "none":  # the filter matters: the unfiltered chain is far from the filtered one
        unfiltered: dict = {}
        for seq in itertools.product(range(vocab), repeat=3):
            prob, prev = 1.0, prompt[-1]
            for tok in seq:
                prob, prev = prob * float(p_next[prev, tok]), tok
            unfiltered[seq[1:]] = unfiltered.get(seq[1:], 0.0) + prob
        assert 0.5 * sum(abs(unfiltered.get(k, 0) - exact.get(k, 0)) for k in set(exact) | set(unfiltered)) > 0.15

    def always_accept(block, target_logits, draft_probs, **kw):
        return block.numel() - 1, block[1:].tolist() + [int(torch.multinomial(target_logits[-1].exp(), 1,
                                                                              generator=kw["generator"]))]

    monkeypatch.setattr(decode, "accept_block", always_accept)
    counts, _ = sample(200)
    assert _tv(counts, exact, 200) > 3 * bound
