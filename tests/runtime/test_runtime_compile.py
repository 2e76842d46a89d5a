"""The static cache and the compiled path: the draft's context cache is preallocated and written by
index (growing context and cropping it copy nothing); the draft step and the target's verify step
through torch.compile compute what the eager path computes, with one graph per shape, so later steps
with longer contexts do not recompile. Inductor compiles on CPU as well, so these run everywhere;
the models are tiny because compiling is the slow part."""

from __future__ import annotations

import importlib.util
import json

import pytest
import torch
from torch._dynamo.utils import counters

from dflash_convert.errors import DFlashError
from dflash_runtime import load_draft, load_target, speculative_generate, target_generate
from runtime_helpers import DEVICES, close, one_torch_thread, speculators_draft, target_dir, write_hf_draft  # noqa: F401

pytestmark = pytest.mark.usefixtures("one_timing_round")  # no test here reads the speedup


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test starts from no compiled code: dynamo keeps a few entries per function (8), and the
    device/backend/dtype parameters here would otherwise use them up on a GPU machine."""
    torch._dynamo.reset()


@pytest.fixture(scope="module")
def windowed_draft(tiny_target):
    """Pruned vocab (own lm_head scattered through d2t) and sliding window 4: the mask's every term."""
    return speculators_draft(tiny_target, "window4", sliding_window=4, draft_vocab=200)


def random_embedding(hidden: int, vocab: int, device):
    table = (torch.randn(vocab, hidden, generator=torch.Generator().manual_seed(0)) * 0.5).to(device)
    return lambda ids: torch.nn.functional.embedding(ids, table)


def run_steps(draft, features, embed):
    """Prefill 10 positions, then three steps that each propose a block and add 3, 1 and 2 committed
    rows (so the context length differs at every step); the second uses a draft window of 5."""
    draft.reset(64, draft.block_size)
    draft.add_context(features[:10], 0)
    start, logits = 10, []
    for n, window in ((3, None), (1, 5), (2, None)):
        ids, out = draft.propose(7, start, embed=embed, lm_head=None, draft_window=window)
        assert ids.shape == (draft.block_size - 1,)
        logits.append(out)
        draft.add_context(features[start:start + n], start)
        start += n
    return logits


def test_context_cache_is_written_in_place(tmp_path):
    """Adding context, dropping old context and starting over reuse the same preallocated rows."""
    draft = load_draft(write_hf_draft(tmp_path / "d"))
    draft.reset(40)
    assert draft.cache.capacity >= 40
    pointers = [t.data_ptr() for t in draft.cache.k + draft.cache.v]
    features = torch.randn(30, 192, generator=torch.Generator().manual_seed(0))
    draft.add_context(features[:10], 0)
    for start in range(10, 30, 5):
        draft.add_context(features[start:start + 5], start)
        draft.block_hidden(torch.randn(6, 64) * 0.02, start + 5)
    draft.keep_last_context(4)
    assert (draft.cache.start, draft.cache.end, len(draft.cache)) == (26, 30, 4)
    draft.reset(40)
    assert [t.data_ptr() for t in draft.cache.k + draft.cache.v] == pointers
    # rows are positions: the cache holds the K of position 12 at row 12, whatever was added since
    draft.add_context(features[:13], 0)
    row12 = draft.cache.k[0][0, :, 12].clone()
    draft.add_context(features[13:20], 13)
    assert torch.equal(draft.cache.k[0][0, :, 12], row12)


def test_backend_variant_shares_the_weights_and_the_context_cache(tmp_path):
    """with_backend gives the same draft with another backend over the same weights and the one cache:
    context added through either (growing the cache past its rows included) is what both attend to."""
    draft = load_draft(write_hf_draft(tmp_path / "d"), backend="eager")
    draft.reset(16)
    sdpa = draft.with_backend("sdpa")
    assert sdpa.backend == "sdpa" and draft.backend == "eager"
    assert sdpa.fc.data_ptr() == draft.fc.data_ptr() and sdpa.layers[2].q_proj.data_ptr() == \
        draft.layers[2].q_proj.data_ptr()
    g = torch.Generator().manual_seed(0)
    features, x = torch.randn(300, 192, generator=g), torch.randn(6, 64, generator=g) * 0.02
    draft.add_context(features[:10], 0)
    assert torch.allclose(sdpa.block_hidden(x, 10), draft.block_hidden(x, 10), atol=1e-5)
    sdpa.add_context(features[10:300], 10)  # past the 256 rows allocated: the cache is reallocated
    assert len(draft.cache) == 300 and draft.cache.capacity >= 306
    assert torch.allclose(draft.block_hidden(x, 300), sdpa.block_hidden(x, 300), atol=1e-5)


def test_one_layer_alone_reads_its_own_cache_rows(tmp_path):
    """block_hidden(layers=[i]) runs layer i (and the final norm) as a one-layer draft of its weights would:
    with its own context K/V, not the first layer's (validate probes each layer's causality this way)."""
    from safetensors.torch import load_file, save_file

    full_dir = write_hf_draft(tmp_path / "full")
    one_dir = tmp_path / "one"
    one_dir.mkdir()
    cfg = json.loads((full_dir / "config.json").read_text())
    cfg.update(num_hidden_layers=1, layer_types=["full_attention"])
    (one_dir / "config.json").write_text(json.dumps(cfg))
    tensors = load_file(full_dir / "model.safetensors")
    save_file({k.replace("layers.2.", "layers.0."): v for k, v in tensors.items() if not k.startswith("layers.")
               or k.startswith("layers.2.")}, one_dir / "model.safetensors")
    full, one = load_draft(full_dir), load_draft(one_dir)
    g = torch.Generator().manual_seed(0)
    features, x = torch.randn(12, 192, generator=g), torch.randn(6, 64, generator=g) * 0.02
    for d in (full, one):
        d.reset()
        d.add_context(features, 0)
    assert torch.equal(full.block_hidden(x, 12, layers=[2]), one.block_hidden(x, 12))
    assert not torch.equal(full.block_hidden(x, 12, layers=[1]), one.block_hidden(x, 12))


NO_CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
NO_FLASH_ATTN = pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="flash-attn not installed")


# One GPU loan compiles what deployments run (bf16, sdpa and flex); the float32 and eager-attention variants (two
# graphs each, some 20 s of compiling apiece) are left to a second loan (docs/gpu.md)
SECOND_LOAN = pytest.mark.beyond_one_loan


@pytest.mark.parametrize("device,backend,dtype", [
    ("cpu", "sdpa", torch.float32),
    *[pytest.param("cuda", b, dt, marks=[NO_CUDA] + ([SECOND_LOAN] if dt == torch.float32 or b == "eager" else []))
      for b in ("sdpa", "flex", "eager") for dt in (torch.float32, torch.bfloat16)],
    pytest.param("cuda", "flash_attn", torch.bfloat16, marks=[NO_CUDA, NO_FLASH_ATTN]),
])
def test_compiled_draft_step_equals_eager_without_recompiling(device, backend, dtype, windowed_draft):
    """On CUDA also: CUDA graphs are recorded, none skipped (every tensor the step reads or writes
    in place is a static input), and the replayed outputs equal eager within the dtype's tolerance."""
    eager = load_draft(windowed_draft, device=device, dtype=dtype, backend=backend)
    compiled = load_draft(windowed_draft, device=device, dtype=dtype, backend=backend, compile=True)
    features = torch.randn(20, eager.spec.context_width, generator=torch.Generator().manual_seed(1)).to(device)
    embed = random_embedding(eager.spec.hidden_size, eager.spec.vocab_size, device)
    ref = run_steps(eager, features, embed)
    before, skips = counters["stats"]["unique_graphs"], counters["inductor"]["cudagraph_skips"]
    out = run_steps(compiled, features, embed)
    if backend != "flash_attn":  # flash-attn's call runs eagerly between two graphs (host-int key slicing)
        # one graph for the step, one for context additions: every later step reuses them
        assert counters["stats"]["unique_graphs"] - before == 2
    assert counters["inductor"]["cudagraph_skips"] == skips
    for a, b in zip(out, ref):
        assert close(a, b, torch.float32 if dtype == torch.float32 else dtype), (a - b).abs().max()
    with torch._dynamo.config.patch(error_on_recompile=True):  # a different context length again
        run_steps(compiled, features.roll(1, 0), embed)


@pytest.mark.parametrize("device", DEVICES)
def test_compiled_pair_equals_transformers_generate(device, tmp_path):
    """Static target cache + compiled verify + compiled draft: greedy output is transformers'."""
    from transformers import StaticCache

    path = target_dir("layers2", layers=2)
    target = load_target(path, device=device, compile=True)
    draft = load_draft(write_hf_draft(tmp_path / "d", layers=1, target_ids=(0, 1), n_target=2, block_size=4),
                       device=device, backend="sdpa", compile=True)
    eager_target = load_target(path, device=device)

    def check(prompt):
        with torch.no_grad():
            ref = eager_target.model.generate(torch.tensor([prompt], device=device), max_new_tokens=10,
                                              do_sample=False, pad_token_id=509)[0, len(prompt):].tolist()
        assert speculative_generate(draft, target, prompt, max_new_tokens=10).tokens == ref
        assert target_generate(target, prompt, max_new_tokens=10).tokens == ref

    check([3, 17, 250, 9])
    assert isinstance(target.cache, StaticCache)
    cache = target.cache
    with torch._dynamo.config.patch(error_on_recompile=True):  # other lengths: no recompiles, same cache
        check(list(range(40, 61)))
    assert target.cache is cache


def test_compiled_flex_is_refused_on_cpu(windowed_draft):
    with pytest.raises(DFlashError, match="compiled draft step cannot use FlexAttention on CPU"):
        load_draft(windowed_draft, backend="flex", compile=True)


def test_validate_compile_flag_runs_end_to_end_compiled(cli, tmp_path):
    """`validate --compile`: the end-to-end level runs on static caches and compiled steps, and the
    greedy outputs still equal the target's."""
    draft = write_hf_draft(tmp_path / "d", layers=1, target_ids=(0, 1), n_target=2, block_size=4)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("3 17 250 9\n40 41 42 43 44 45 46\n")
    before = counters["stats"]["unique_graphs"]
    result = cli("validate", draft, "--target", target_dir("layers2", layers=2), "--prompts", prompts,
                 "--levels", "end_to_end", "--max-new-tokens", "8", "--device", "cpu", "--compile", "--sampling",
                 "greedy", "--json")
    assert result.code == 0, result.err
    checks = {c["name"]: c for c in result.json()["checks"]}
    assert checks["greedy_output_equal"]["status"] == "pass"
    assert counters["stats"]["unique_graphs"] > before  # the steps went through torch.compile


def walk_steps(draft, features, device):
    """Greedy proposals of three steps with growing context (as run_steps), picks, logits and confidences."""
    g = torch.Generator().manual_seed(2)
    vocab, hidden = draft.spec.vocab_size, draft.spec.hidden_size
    table, head = torch.randn(vocab, hidden, generator=g).to(device), torch.randn(vocab, hidden, generator=g).to(device)
    draft.reset(64, draft.block_size)
    draft.add_context(features[:10], 0)
    start, out = 10, []
    for n in (3, 1, 2):
        ids, logits = draft.propose(7, start, embed=lambda i: torch.nn.functional.embedding(i, table),
                                    lm_head=lambda h: torch.nn.functional.linear(h, head.to(h.dtype)))
        out.append((ids.cpu(), logits.cpu(), None if draft.last_confidence is None else draft.last_confidence.cpu()))
        draft.add_context(features[start:start + n], start)
        start += n
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["dflash2", "dspark_pruned"])
def test_the_greedy_walk_runs_inside_the_compiled_step_as_eager(name, device, family_drafts, monkeypatch):
    """dflash2's selector walk and DSpark's Markov walk are captured with the compiled step (one graph with it, one
    for context additions, no recompiles as the context grows) and pick what the eager walk picks. On the CPU dynamo
    captures the graph and runs it eagerly (backend "eager": seconds, where inductor takes minutes here); on CUDA
    inductor compiles it, with CUDA graphs."""
    if device == "cpu":
        real_compile = torch.compile
        monkeypatch.setattr(torch, "compile", lambda fn, **kw: real_compile(fn, **{**kw, "backend": "eager"}))
    eager = load_draft(family_drafts[name], device=device)
    compiled = load_draft(family_drafts[name], device=device, compile=True)
    assert compiled.head.walks
    features = torch.randn(20, eager.spec.context_width, generator=torch.Generator().manual_seed(1)).to(device)
    ref = walk_steps(eager, features, device)
    before = counters["stats"]["unique_graphs"]
    out = walk_steps(compiled, features, device)
    assert counters["stats"]["unique_graphs"] - before == 2  # the step with its walk, and the context additions
    assert sorted(compiled._compiled_fns) == ["context", "step_walk"]  # no walk left outside the graph
    for (ids, logits, conf), (ref_ids, ref_logits, ref_conf) in zip(out, ref):
        assert torch.equal(ids, ref_ids)
        finite = torch.isfinite(ref_logits)
        assert torch.equal(finite, torch.isfinite(logits)) and close(logits[finite], ref_logits[finite], torch.float32)
        assert (conf is None) == (ref_conf is None) and (conf is None or torch.allclose(conf, ref_conf, atol=1e-5))
    with torch._dynamo.config.patch(error_on_recompile=True):
        walk_steps(compiled, features.roll(1, 0), device)
