"""The real engine: the bundled pair, and copies of it that exercise the engines table's rules, served by
vLLM on CPU; its counters and outputs against our emulation (`validate --engine vllm`) counted as vLLM
counts (full last blocks).

Needs a Python with vLLM: $DFLASH_VLLM_PYTHON, else build/vllm-venv/bin/python (scripts/setup-vllm.sh
builds it); those tests are skipped without one, and fail under DFLASH_REQUIRE_VLLM=1 (scripts/test.sh sets it).
vLLM starts once for every copy (served one after
another against the pair's target, in one process), once by the CLI, once with two tensor-parallel
workers; the sampled and parallel-layout refusals answer without starting an engine. The option,
timeout, tolerance and warning tests at the end need no vLLM."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import textwrap
import time
from pathlib import Path

import pytest

from dflash_convert.io.reading import read_json
from factories import copy_draft
from processes import VLLM_PYTHON, needs_vllm, require_vllm

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "examples" / "pair"
PROMPTS = 6  # of the pair's 16 held-out prompts, for the rule cases (the CLI run takes all 16)
TOKENS = 64
EAGER = {"enforce_eager": True}  # no torch.compile warm-up (a minute per engine on 2 cores); same figures

pytestmark = pytest.mark.usefixtures("one_timing_round")  # no test here reads the speedup


def _hf(dst: Path, src: Path = PAIR / "draft", dflash: dict | None = None, **config) -> Path:
    """The pair's draft converted to the HF format, config keys (and `dflash_config` keys) then set (None: removed)."""
    from dflash_convert.convert.conversion import convert

    convert(src, dst)
    cfg = read_json(dst / "config.json")
    cfg.update(config)
    cfg["dflash_config"].update(dflash or {})
    (dst / "config.json").write_text(json.dumps({k: v for k, v in cfg.items() if v is not None}))
    return dst


def _native(dst: Path) -> Path:
    """The pair's draft in transformers' own layout (MuseGlimmerAssistantConfig), made non-causal."""
    from dflash_convert.convert.conversion import ConvertOptions, convert

    convert(PAIR / "draft", dst, ConvertOptions(to="transformers", causal=False))
    return dst


def _window(dst: Path, window: int) -> Path:
    """A speculators copy whose sliding layers see `window` positions: shorter than the pair's contexts."""
    shutil.copytree(PAIR / "draft", dst)
    cfg = read_json(dst / "config.json")
    cfg["transformer_layer_config"]["sliding_window"] = window
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _pruned(dst: Path) -> Path:
    """A pruned-vocabulary copy: its own lm_head (the target's rows of 256 kept ids, the tokens of the pair's
    language among them) and d2t/t2d."""
    import torch
    from safetensors.torch import load_file

    lm_head = load_file(PAIR / "target" / "model.safetensors")["lm_head.weight"]
    vocab = lm_head.shape[0]
    used = {int(t) for t in (PAIR / "prompts.txt").read_text().split()}  # the outputs repeat the prompts' spans
    kept = sorted(used | {vocab - 1})  # and the mask token
    kept = torch.tensor(sorted(kept + [i for i in range(vocab) if i not in kept][:256 - len(kept)]))

    def edit(tensors):
        tensors["lm_head.weight"] = lm_head[kept].clone()
        tensors["d2t"] = kept - torch.arange(len(kept))
        t2d = torch.zeros(vocab, dtype=torch.bool)
        t2d[kept] = True
        tensors["t2d"] = t2d

    return copy_draft(PAIR / "draft", dst, spec_update={"draft_vocab_size": 256}, edit_tensors=edit)


def _mask_embedding(dst: Path) -> Path:
    """A copy shipping mask_embedding.pt: the target's embedding of token 0 instead of the mask token's."""
    import torch
    from safetensors.torch import load_file

    shutil.copytree(PAIR / "draft", dst)
    row = load_file(PAIR / "target" / "model.safetensors")["model.embed_tokens.weight"][0].clone()
    torch.save(row, dst / "mask_embedding.pt")
    return dst


# name -> (make the draft in a folder, run-time block size or None, the engine-table rule it exercises). The
# mis-wired copies and the wrong mask row accept almost nothing: their draft logits are near-tied, and bf16
# kernels (vLLM's, ours) break such ties differently, so they agree step by step up to each prompt's first
# near-tie, not necessarily to the count.
NEAR_TIED = {"wrong_ids", "last_layer", "mask_embedding"}
CASES = {
    "speculators": (lambda d: copy_draft(PAIR / "draft", d), None, "speculators reader, as trained"),
    "hf": (lambda d: _hf(d), None, "HF reader, causality from the converted config"),
    "speculators_non_causal": (lambda d: copy_draft(PAIR / "draft", d, raw_update={"sliding_window_non_causal": True}),
                               None, "causality speculators_global: one flag for all layers"),
    "hf_is_causal_false": (lambda d: _hf(d, is_causal=False), None, "causality: is_causal first"),
    "wrong_ids": (lambda d: copy_draft(PAIR / "draft", d, spec_update={"target_layer_ids": [2, 6]}), None,
                  "layer ids aux_minus_one (mis-wired: one layer up)"),
    "hf_unsorted_ids": (lambda d: _hf(d, dflash={"target_layer_ids": [5, 1]}), None,
                        "ids_order sorted_unique"),
    "last_layer": (lambda d: copy_draft(PAIR / "draft", d, spec_update={"target_layer_ids": [1, 7]}), None,
                   "last_layer pre_norm"),
    "pruned": (_pruned, None, "vocab own_lm_head_d2t"),
    "hf_block_8": (lambda d: _hf(d), 8, "block_size serving_flag"),
    "mask_embedding": (_mask_embedding, None, "mask_embedding used (mask_embedding.pt replaces the mask token's row)"),
    "window_6": (lambda d: _window(d, 6), None, "window_semantics per_query (6 < the block: late slots see no context)"),
    "transformers_layout": (_native, None, "native_layout read (MuseGlimmerAssistantModel, encoder.* renamed, "
                                           "ids and causality from dflash_config)"),
}


@contextlib.contextmanager
def _restored_threads():
    """torch's thread count as it was before (validate --threads 1 sets it for the process)."""
    import torch

    threads = torch.get_num_threads()
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _emulate(draft: Path, prompts: list[list[int]], block: int | None, **options):
    from dflash_convert.validate import ValidateOptions, validate

    return validate(draft, ValidateOptions(
        target=PAIR / "target", prompts=prompts, max_new_tokens=TOKENS, sampling="greedy", engine="vllm",
        levels=["static", "end_to_end"],
        keep_going=True, timing_rounds=1, threads=1, block_size=block, allow_pickle=True, **options))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """Every case: (our report, vLLM's answer for it), with vLLM's target-only outputs and our target's greedy."""
    import torch

    from dflash_convert.io.checkpoint import open_checkpoint
    from dflash_convert.validate.engine import served as engine
    from dflash_runtime import Sampling, load_target, target_generate

    require_vllm()
    root = tmp_path_factory.mktemp("vllm-cases")
    prompts = [[int(t) for t in line.split()] for line in (PAIR / "prompts.txt").read_text().splitlines()][:PROMPTS]
    threads = torch.get_num_threads()
    drafts, reports = {}, {}
    try:
        for name, (make, block, _) in CASES.items():
            drafts[name] = make(root / name)
            reports[name] = _emulate(drafts[name], prompts, block)
        target = load_target(PAIR / "target", device="cpu", dtype=torch.bfloat16)
        greedy = [target_generate(target, p, max_new_tokens=TOKENS, sampling=Sampling(stop_token_ids=[510])).tokens
                  for p in prompts]
    finally:
        torch.set_num_threads(threads)
    request = engine.EngineRequest(
        target=PAIR / "target", prompts=prompts, max_tokens=TOKENS, stop_token_ids=[510], engine_args=EAGER,
        drafts=[{"draft": str(drafts[n]), "num_speculative_tokens": reports[n].acceptance.block_size - 1,
                 "mixed_layer_types": len(set(open_checkpoint(drafts[n]).spec.layer_types)) > 1} for n in CASES])
    answer = engine.run_vllm(request, python=VLLM_PYTHON, timeout_s=1800, kv_cache_gib=1)
    return {n: (reports[n], run) for n, run in zip(CASES, answer["drafts"])}, answer["target_only"]["outputs"], greedy


def _agreement(report, run, target_only, greedy):
    """engine_acceptance_agrees and the comparison's figures, of vLLM's `run` against the emulation `report`."""
    from dflash_convert.validate.engine.served import served_checks

    checks, stats = served_checks({"vllm_version": "0.32.0", "drafts": [run], "target_only": {"outputs": target_only}},
                                  greedy, report.acceptance.vllm_counting, block=report.acceptance.block_size,
                                  engine_args=EAGER, python=VLLM_PYTHON, min_acceptance_length=None,
                                  min_position_rates=None, steps=report.acceptance.vllm_steps)
    return next(c for c in checks if c.name == "engine_acceptance_agrees"), stats.tolerance


@needs_vllm
@pytest.mark.parametrize("name", list(CASES))
def test_vllm_counts_equal_the_emulation_counted_as_vllm_counts(served, name):
    """vLLM's accepted count equals the emulation's at every verify step up to each prompt's first near-tie,
    and where no decision sat near a tie (a confident draft) its counters equal the emulation's exactly; the
    rule the case exercises is then verified, not claimed."""
    from dflash_convert.validate.engine.served import engine_counts

    cases, target_only, greedy = served
    report, run = cases[name]
    assert "error" not in run, run
    assert len(run["steps"]) == PROMPTS and all(s for s in run["steps"]), run["steps"]
    agrees, tolerance = _agreement(report, run, target_only, greedy)
    assert agrees.status == "pass", (CASES[name][2], agrees.message)
    assert tolerance["steps_compared"] > 0, agrees.message
    if tolerance["steps_not_compared"] == 0:
        assert engine_counts(run) == report.acceptance.vllm_counting, (CASES[name][2], agrees.message)
    if name not in NEAR_TIED:  # the bundled draft and its faithful copies are confident: compared whole
        assert tolerance["prompts_whole"] == PROMPTS, agrees.message


@needs_vllm
@pytest.mark.parametrize("served_as, emulated_as", [("speculators", "wrong_ids"), ("wrong_ids", "speculators"),
                                                    ("mask_embedding", "speculators"), ("speculators", "last_layer")])
def test_a_real_difference_fails_the_step_comparison(served, served_as, emulated_as):
    """vLLM serving one draft against the emulation of another (a wrong layer id or mask row in one of them
    only): the comparison finds a verify step where no tie sat, and fails naming it."""
    cases, target_only, greedy = served
    agrees, _ = _agreement(cases[emulated_as][0], cases[served_as][1], target_only, greedy)
    assert agrees.status == "fail" and "verify step" in agrees.message, agrees.message


@needs_vllm
@pytest.mark.parametrize("name", sorted(NEAR_TIED))
def test_the_comparison_holds_on_other_kernels(served, name):
    """Other kernels, other ties broken: the emulation rerun with eager attention in the draft and the target
    (another reduction order than the fixture's SDPA, as another machine's kernels round otherwise) still agrees
    with the same vLLM run, step by step where defined."""
    cases, target_only, greedy = served
    prompts = [[int(t) for t in line.split()] for line in (PAIR / "prompts.txt").read_text().splitlines()][:PROMPTS]
    with _restored_threads():
            report = _emulate(Path(cases[name][0].checkpoint), prompts, CASES[name][1], backend="eager",
                          target_backend="eager")
    agrees, tolerance = _agreement(report, cases[name][1], target_only, greedy)
    assert agrees.status == "pass" and tolerance["steps_compared"] > 0, agrees.message


@needs_vllm
@pytest.mark.parametrize("name", list(CASES))
def test_vllm_outputs_equal_target_only_and_our_greedy(served, name):
    cases, target_only, greedy = served
    report, run = cases[name]
    assert target_only == greedy
    assert run["outputs"] == greedy
    assert report.acceptance.outputs_equal == PROMPTS


@needs_vllm
def test_the_cases_measure_what_they_claim(served):
    """The copies differ where they should: wrong ids collapse acceptance, the short window and non-causal
    serving change it, unsorted ids are served sorted (as the right wiring)."""
    cases, _, _ = served
    tau = {n: r.acceptance.vllm_counting.acceptance_length for n, (r, _) in cases.items()}
    assert tau["speculators"] == tau["hf"] == tau["hf_unsorted_ids"] > 10, tau
    assert tau["wrong_ids"] < 3 and tau["last_layer"] < 3, tau
    assert tau["window_6"] < tau["speculators"] and tau["mask_embedding"] != tau["speculators"], tau
    assert cases["hf_block_8"][0].acceptance.block_size == 8 and tau["hf_block_8"] <= 8, tau
    assert tau["transformers_layout"] == tau["speculators_non_causal"], tau  # the same draft, non-causal


@needs_vllm
def test_cli_serves_the_pair_in_vllm(cli):
    """One command: the pair in real vLLM beside the emulation, both counts in the JSON, the engine's version
    and the --engine-args it was built with (max_model_len, dtype, eager: the plumbing, as vLLM reports it)."""
    args = {"enforce_eager": True, "max_model_len": 384, "dtype": "bfloat16"}
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--prompts", PAIR / "prompts.txt",
            "--sampling", "greedy", "--engine", "vllm", "--engine-python", VLLM_PYTHON, "--engine-args", json.dumps(args),
            "--levels", "static,end_to_end", "--min-acceptance-length", "14", "--json")
    assert r.code == 0, r.err[-3000:]
    report = r.json()
    status = {c["name"]: c["status"] for c in report["checks"]}
    assert status["engine_outputs_equal"] == status["engine_acceptance_agrees"] == "pass"
    assert status["engine_acceptance_length"] == "pass"
    run, ours = report["engine_run"], report["acceptance"]
    assert run["version"] == "0.32.0" and run["engine_args"] == args and run["outputs_equal"] == 16
    fidelity = next(c["message"] for c in report["checks"] if c["name"] == "engine_fidelity")
    assert "by 0.33.0's rules" in fidelity and "vLLM 0.32.0 ran the pair" in fidelity, fidelity  # rules vs ran
    assert {k: run["engine_config"][k] for k in ("max_model_len", "dtype", "enforce_eager")} == \
        {"max_model_len": 384, "dtype": "bfloat16", "enforce_eager": True}
    # the figures of the README: our loop 70 / 953, vLLM's counting 70 / 967, both in ours and in vLLM's
    assert (ours["num_drafts"], ours["accepted"]) == (70, 953)
    assert run["counts"] == ours["vllm_counting"]
    assert (run["counts"]["num_drafts"], run["counts"]["accepted"]) == (70, 967)
    assert "acceptance, side by side" in r.err and "vllm 0.32.0" in r.err


@needs_vllm
def test_cli_serves_each_k_in_one_vllm_process(cli, tmp_path):
    """--num-speculative-tokens 3,15: vLLM serves the draft at each K in one process, each K's counters against
    the emulation of that K counted as vLLM counts; each K's vLLM tau beside the runtime's (JSON, terminal,
    Markdown), equal to the emulation's where no decision sat near a tie."""
    from dflash_convert.validate.report import ValidationReport
    from dflash_convert.validate.report_markdown import to_markdown

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join((PAIR / "prompts.txt").read_text().splitlines()[:6]) + "\n")
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--prompts", prompts, "--max-new-tokens", "48",
            "--sampling", "greedy", "--engine", "vllm", "--engine-python", VLLM_PYTHON, "--engine-args",
            json.dumps(EAGER), "--levels", "static,end_to_end", "--num-speculative-tokens", "3,15", "--threads", "1",
            "--json")
    assert r.code == 0, r.err[-3000:]
    report = r.json()
    status = {c["name"]: c["status"] for c in report["checks"]}
    for name in ("engine_outputs_equal", "engine_acceptance_agrees"):
        assert status[name] == status[f"{name} (K=15)"] == "pass"
    assert r.err.count("engine: vLLM at") == 1 and "(2 draft(s)" in r.err  # one vLLM process for both K
    rows = report["per_num_speculative_tokens"]
    assert [row["num_speculative_tokens"] for row in rows] == [3, 15]
    for row in rows:
        served = row["engine_run"]
        assert len(served["counts"]["per_position_rates"]) == row["num_speculative_tokens"]
        assert served["tolerance"]["steps_not_compared"] == 0  # no tie sat: the counts are equal outright
        assert served["counts"] == row["vllm_counting"] and served["outputs_equal"] == 6
    assert rows[0]["engine_run"] == report["engine_run"]
    assert rows[0]["engine_run"]["counts"]["num_drafts"] > rows[1]["engine_run"]["counts"]["num_drafts"]
    taus = [f"{row['engine_run']['counts']['acceptance_length']:.2f}" for row in rows]
    assert "as vLLM   vLLM" in r.err and all(t in r.err for t in taus)
    assert "| tau as vLLM counts | vLLM 0.32.0 tau |" in to_markdown(ValidationReport.model_validate(report))


@needs_vllm
def test_mixed_draft_cannot_run_on_cpu_vllm(cli, tmp_path):
    """Mixed sliding + full layers need vLLM's V2 model runner, which needs Triton: on CPU the run says so
    (exit 1), it neither fails nor passes the draft."""
    draft = _hf(tmp_path / "mixed", layer_types=["sliding_attention", "full_attention"], use_sliding_window=True,
                sliding_window=2048, is_causal=None)
    r = cli("validate", draft, "--target", PAIR / "target", "--prompts", PAIR / "prompts.txt", "--max-new-tokens", "8",
            "--sampling", "greedy", "--engine", "vllm", "--engine-python", VLLM_PYTHON, "--levels", "static,end_to_end",
            "--keep-going",
            "--json")
    assert r.code == 1, r.err[-2000:]
    assert "cannot run here" in r.json()["error"]["message"] and "Triton" in r.json()["error"]["message"]


@needs_vllm
def test_hybrid_target_served_in_vllm(tmp_path):
    """A tiny random Qwen3-Next target (Gated DeltaNet + full attention layers, head_dim 64: vLLM's CPU
    attention refuses 16) and a random draft: vLLM's speculative output equals its target-only output and our
    runtime's greedy output (both roll the linear-attention state back on rejection), and its counters equal
    the emulation counted vLLM's way. Prefix caching is off (the driver turns it off for hybrid targets
    without Triton: on, vLLM 0.32 CPU fails in a Triton kernel once the draft speculates)."""
    import torch

    import target_zoo
    from dflash_convert.validate import ValidateOptions, validate
    from dflash_convert.validate.engine import served as engine
    from dflash_convert.validate.engine.served import engine_counts
    from dflash_runtime import Sampling, load_target, target_generate
    from runtime_helpers import write_hf_draft

    config_cls, model_cls, kwargs = target_zoo._classes("qwen3_next")
    kwargs.update(head_dim=64, num_attention_heads=2, num_key_value_heads=1, linear_num_key_heads=1,
                  linear_num_value_heads=2, linear_key_head_dim=64, linear_value_head_dim=64)
    torch.manual_seed(0)
    model = model_cls(config_cls(**kwargs)).eval()
    with torch.no_grad():  # as target_zoo does: make the linear-attention state matter
        for name, p in model.named_parameters():
            if "linear_attn.out_proj" in name:
                p.mul_(8)
    model.save_pretrained(tmp_path / "target")
    assert set(model.config.layer_types) == {"linear_attention", "full_attention"}
    draft = write_hf_draft(tmp_path / "draft", layers=1, heads=2, kv_heads=1, head_dim=64, target_ids=(0, 2),
                           n_target=target_zoo.LAYERS, block_size=4, bias=False)
    prompts, tokens = [[3, 17, 250, 9], list(range(40, 61))], 24
    threads = torch.get_num_threads()
    try:
        report = validate(draft, ValidateOptions(
            target=tmp_path / "target", prompts=prompts, max_new_tokens=tokens, sampling="greedy", engine="vllm",
            levels=["end_to_end"], keep_going=True, timing_rounds=1, threads=1))
        target = load_target(tmp_path / "target", device="cpu", dtype=torch.bfloat16)
        greedy = [target_generate(target, p, max_new_tokens=tokens,
                                  sampling=Sampling(stop_token_ids=[target_zoo.VOCAB - 2])).tokens
                  for p in prompts]
    finally:
        torch.set_num_threads(threads)
    answer = engine.run_vllm(engine.EngineRequest(
        target=tmp_path / "target", prompts=prompts, max_tokens=tokens, stop_token_ids=[target_zoo.VOCAB - 2],
        engine_args=EAGER, drafts=[{"draft": str(draft), "num_speculative_tokens": 3, "mixed_layer_types": False}]),
        python=VLLM_PYTHON, timeout_s=900, kv_cache_gib=1)
    run = answer["drafts"][0]
    assert "error" not in run, run
    assert run["engine_config"]["enable_prefix_caching"] is False
    assert answer["target_only"]["outputs"] == greedy and run["outputs"] == greedy
    assert report.acceptance.outputs_equal == len(prompts)
    assert engine_counts(run) == report.acceptance.vllm_counting


@needs_vllm
def test_hybrid_target_with_prefix_caching_cannot_run_on_cpu_vllm(tmp_path):
    """Prefix caching forced on for a hybrid target: no verdict, a "cannot run here" naming Triton and the
    way out (exit 1 through served_checks), answered before vLLM is imported."""
    from dflash_convert.errors import DFlashError
    from dflash_convert.validate.engine import served as engine

    (tmp_path / "target").mkdir()
    (tmp_path / "target" / "config.json").write_text(json.dumps(
        {"model_type": "qwen3_next", "layer_types": ["linear_attention", "full_attention"]}))
    answer = engine.run_vllm(engine.EngineRequest(
        target=tmp_path / "target", prompts=[[1, 2]], max_tokens=2, stop_token_ids=[], engine_args={
            "enable_prefix_caching": True}, drafts=[{"draft": str(tmp_path), "num_speculative_tokens": 3}]),
        python=VLLM_PYTHON, timeout_s=120, kv_cache_gib=1)
    assert answer["drafts"][0]["cannot_run"] and "target_only" not in answer, answer
    with pytest.raises(DFlashError, match="cannot run here .*Triton.*enable_prefix_caching"):
        engine.served_checks(answer, [[]], None, block=4, engine_args={}, python=VLLM_PYTHON,
                             min_acceptance_length=None, min_position_rates=None)


# ----------------------------------------------------------------------------- no vLLM needed

@pytest.mark.parametrize("args, message", [
    (["--engine-python", "self"], "give --engine vllm"),
    (["--engine", "vllm", "--engine-python", "/nonexistent/python", "--sampling", "greedy"], "not an executable file"),
    (["--engine", "vllm", "--engine-python", "self", "--engine-args", "[1]"], "a JSON object is needed"),
    (["--engine", "vllm", "--engine-python", "self", "--engine-args", "{"], "not JSON"),
    (["--engine", "vllm", "--engine-python", "self", "--sampling", "greedy", "--engine-args", '{"model": "x"}'],
     "set by validate itself"),
    (["--engine", "vllm", "--engine-args", '{"dtype": "float32"}'], "give --engine-python"),
    (["--engine", "vllm", "--engine-python", "self", "--draft-sampling", "probabilistic"], "proposes greedily"),
])
def test_engine_options_are_usage_errors(cli, args, message):
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", *args)
    assert r.code == 2 and message in r.err, r.err[-2000:]


def test_engine_timeout_kills_the_whole_process_group(cli, tmp_path):
    """An engine that never answers: exit 1 naming the timeout, and nothing of it left running (the fake
    interpreter and the child it started are both gone)."""
    pids = tmp_path / "pids"
    fake = tmp_path / "python"
    fake.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        sleep 300 &
        echo $$ $! > {pids}
        wait
        """))
    fake.chmod(0o755)
    lines = "\n".join((PAIR / "prompts.txt").read_text().splitlines()[:1]) + "\n"
    (tmp_path / "p.txt").write_text(lines)
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--prompts", tmp_path / "p.txt",
            "--max-new-tokens", "4", "--levels", "end_to_end", "--threads", "1", "--sampling", "greedy",
            "--engine", "vllm", "--engine-python", fake, "--engine-timeout", "3", "--json")
    assert r.code == 1 and "no answer within 3 s" in r.json()["error"]["message"], r.err[-2000:]
    for pid in map(int, pids.read_text().split()):
        for _ in range(50):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"process {pid} of the engine outlived the timeout")


def test_miswired_draft_warns_loudly_by_default(cli, tmp_path):
    """Wrong target layer ids (one layer up) keep the output lossless and accept almost nothing: with no
    threshold the run passes (exit 0) but says so loudly, naming the likely causes."""
    draft = copy_draft(PAIR / "draft", tmp_path / "wrong", spec_update={"target_layer_ids": [2, 6]})
    (tmp_path / "p.txt").write_text("\n".join((PAIR / "prompts.txt").read_text().splitlines()[:3]) + "\n")
    r = cli("validate", draft, "--target", PAIR / "target", "--prompts", tmp_path / "p.txt", "--max-new-tokens", "32",
            "--levels", "static,end_to_end", "--threads", "1", "--sampling", "greedy")
    assert r.code == 0, r.err[-2000:]
    shown = r.out + r.err  # the report goes to stdout without --json
    assert "WARNING:" in shown and "target layer ids" in shown and "mask token" in shown and "causality" in shown


@pytest.mark.skipif(__import__("importlib").util.find_spec("vllm") is not None, reason="vLLM is installed here")
def test_engine_python_without_vllm_is_an_error_not_a_verdict(cli, tmp_path):
    """`--engine-python self` where vLLM is not installed: exit 1 naming the missing module."""
    (tmp_path / "p.txt").write_text((PAIR / "prompts.txt").read_text().splitlines()[0] + "\n")
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--prompts", tmp_path / "p.txt",
            "--max-new-tokens", "4", "--levels", "end_to_end", "--threads", "1", "--sampling", "greedy",
            "--engine", "vllm", "--engine-python", "self", "--json")
    assert r.code == 1 and "No module named 'vllm'" in r.json()["error"]["message"], r.err[-2000:]


def _engine_answer(per_pos: list[int], *, num: int = 100, spec=None, base=None, top=None) -> dict:
    outputs = [[1, 2, 3], [4, 5]]
    run = {"num_drafts": num, "num_draft_tokens": num * len(per_pos), "num_accepted_tokens": sum(per_pos),
           "num_accepted_tokens_per_pos": per_pos, "outputs": spec or outputs, "engine_config": {"dtype": "bfloat16"}}
    target_only = {"outputs": base or outputs} | ({"top_logits": top} if top is not None else {})
    return {"vllm_version": "0.32.0", "drafts": [run], "target_only": target_only}


def _emulated(per_pos: list[int], num: int = 100):
    from dflash_convert.validate.report import AcceptanceCounts

    return AcceptanceCounts(num_drafts=num, drafted=num * len(per_pos), accepted=sum(per_pos),
                            acceptance_length=round(1 + sum(per_pos) / num, 4),
                            per_position_rates=[round(a / num, 4) for a in per_pos])


@pytest.mark.parametrize("engine, emulated, agrees", [
    ([90, 80, 70], [90, 80, 70], True),
    ([90, 81, 70], [90, 80, 70], True),     # one position 0.01 off, tau 0.4% off: within both least tolerances
    ([90, 60, 90], [90, 80, 70], False),    # same tau (3.4), position 2 and 3 each 0.20 off
    ([95, 85, 75], [90, 80, 70], False),    # every position 0.05 off, so tau 3.55 vs 3.40
])
def test_sampled_agreement_needs_both_tau_and_every_position(engine, emulated, agrees):
    """A sampled run agrees with the emulation only when tau AND each per-position rate are within their
    tolerances: a draft whose acceptance moved between positions (same tau) is a disagreement. (Counted over
    10^6 drafts, the interval from the counts is down to its least width.)"""
    from dflash_convert.validate.engine.served import served_checks

    scaled = [a * 10 ** 4 for a in engine], [a * 10 ** 4 for a in emulated]  # per 100 drafts -> per 10^6
    checks, _ = served_checks(_engine_answer(scaled[0], num=10 ** 6), [[1, 2, 3], [4, 5]], _emulated(scaled[1], 10 ** 6),
                              block=4, engine_args={}, python="py", min_acceptance_length=None,
                              min_position_rates=None, sampling={"temperature": 1.0, "seed": 0})
    agrees_check = next(c for c in checks if c.name == "engine_acceptance_agrees")
    assert agrees_check.status == ("pass" if agrees else "fail"), agrees_check.message


def test_emulated_tau_off_alone_is_a_disagreement():
    """Rates equal, tau not (an emulation counted another way): the tau half of the rule alone fails it."""
    from dflash_convert.validate.engine.served import served_checks

    per_pos = [900_000, 800_000, 700_000]
    emulated = _emulated(per_pos, 10 ** 6).model_copy(update={"acceptance_length": 3.6})
    checks, _ = served_checks(_engine_answer(per_pos, num=10 ** 6), [[1, 2, 3], [4, 5]], emulated, block=4,
                              engine_args={}, python="py", min_acceptance_length=None, min_position_rates=None,
                              sampling={"temperature": 1.0, "seed": 0})
    assert next(c for c in checks if c.name == "engine_acceptance_agrees").status == "fail"


BF16_ULP = 2.0 ** -7  # dflash_runtime.ties' units: a gap of one bfloat16 ulp
CLEAR = 1.0  # a decision far from any other outcome (128 ulps)


def _decisions(*prompts):
    """StepDecisions per prompt from (accepted, margin, next margin) triples (margins in bf16 ulps; None: none)."""
    from dflash_convert.validate.report import StepDecisions

    def gap(u):
        return None if u is None else u * BF16_ULP

    return [StepDecisions(accepted=[a for a, _, _ in p], margin=[gap(m) for _, m, _ in p],
                          next_margin=[gap(n) for _, _, n in p]) for p in prompts]


def _greedy_agreement(engine_steps, decisions, *, base_top=None, spec_top=None):
    from dflash_convert.validate.engine.served import served_checks

    answer = _engine_answer([90, 80, 70], spec=[[1, 2], [4]], base=[[1, 2], [4]], top=base_top)
    answer["drafts"][0]["steps"] = engine_steps
    if spec_top is not None:
        answer["drafts"][0]["top_logits"] = spec_top
    checks, stats = served_checks(answer, [[1, 2], [4]], _emulated([90, 80, 70]), block=4, engine_args={},
                                  python="py", min_acceptance_length=None, min_position_rates=None, steps=decisions,
                                  emulated_dtypes=["bfloat16"])
    return next(c for c in checks if c.name == "engine_acceptance_agrees"), stats.tolerance


@pytest.mark.parametrize("engine_steps, decisions, status, says", [
    # every step clear and equal: compared whole
    ([[3, 1], [2]], [[(3, 128, 128), (1, 128, 128)], [(2, 128, 128)]], "pass",
     "equal at each of the 3 verify steps compared (2/2 prompts to their end;"),
    # prompt 1 step 2 differs with its decision 128 ulps from any other outcome: the draft served otherwise
    ([[3, 0], [2]], [[(3, 128, 128), (1, 128, 128)], [(2, 128, 128)]], "fail",
     "prompt 1, verify step 2: vLLM accepted 0 proposal(s), the emulation 1, at a decision 128 bfloat16 ulps from "
     "another outcome"),
    # the same difference where that decision sat 3 ulps from another outcome: not compared, and said
    ([[3, 0], [2]], [[(3, 128, 128), (1, 3, 3)], [(2, 128, 128)]], "pass",
     "1 stop at a near-tie (prompt 1 step 2), 1 step(s) from there not compared"),
    # a tie in the token committed at step 1 (next margin): step 1 compared, the steps after it not
    ([[3, 2, 2], [2]], [[(3, 128, 2), (0, 128, 128), (1, 128, 128)], [(2, None, None)]], "pass",
     "equal at each of the 2 verify steps compared (1/2 prompts to their end; 1 stop at a near-tie (prompt 1 step "
     "2), 2 step(s) from there not compared"),
    # ... but a clear difference before the tie still fails
    ([[2, 2, 2], [2]], [[(3, 128, 2), (0, 128, 128), (1, 128, 128)], [(2, None, None)]], "fail",
     "prompt 1, verify step 1: vLLM accepted 2 proposal(s), the emulation 3"),
    # vLLM ran one step where the emulation ran three before a near-tie at its third: the second step, which the
    # engine never ran, is a difference (not a step past the tie)
    ([[3], [2]], [[(3, 128, 128), (1, 128, 128), (2, 3, 3)], [(2, 128, 128)]], "fail",
     "prompt 1, verify step 2: vLLM accepted nothing (it ran fewer steps), the emulation 1"),
    # vLLM ran a step more than the emulation, every decision clear
    ([[3, 1, 1], [2]], [[(3, 128, 128), (1, 128, 128)], [(2, 128, 128)]], "fail",
     "prompt 1: vLLM ran 3 verify steps, the emulation 2"),
    # 5 ulps is outside the 4-ulp tie: compared, and it differs
    ([[1], [2]], [[(0, 5, 5)], [(2, 128, 128)]], "fail", "at a decision 5 bfloat16 ulps from another outcome"),
    # every prompt starts at a tie: nothing compared, a warning (no verdict either way)
    ([[1], [0]], [[(0, 1, 1)], [(2, 4, 4)]], "warn", "no verify step could be compared"),
])
def test_greedy_counts_are_compared_step_by_step_up_to_each_near_tie(engine_steps, decisions, status, says):
    """The counts agree when vLLM accepted as many proposals as the emulation at every verify step before each
    prompt's first decision within 4 ulps of another outcome; a difference where no tie sat fails, naming the
    prompt, the step and how far the decision was from another outcome."""
    agrees, tolerance = _greedy_agreement(engine_steps, _decisions(*decisions))
    assert agrees.status == status and says in agrees.message, agrees.message
    assert tolerance["mode"] == "greedy" and tolerance["tie_ulps"] == 4 and tolerance["dtype"] == "bfloat16"


def test_greedy_counts_without_vllm_steps():
    """A vLLM that lists no per-request steps: the totals are compared exactly where no decision sat near a tie;
    otherwise the check says it cannot compare (a warning, never a verdict on the draft)."""
    clear = _decisions([(3, 128, 128)], [(2, 128, 128)])
    agrees, _ = _greedy_agreement(None, clear)
    assert agrees.status == "pass" and "the counts must be equal: they are" in agrees.message, agrees.message
    tied = _decisions([(3, 128, 128)], [(2, 1, 1)])
    agrees, _ = _greedy_agreement(None, tied)
    assert agrees.status == "warn" and "cannot be compared exactly: this vLLM lists no per-request verify steps, and " \
        "1 decision(s) sat near a tie" in agrees.message, agrees.message


def test_totals_without_steps_move_only_as_far_as_the_ties_reach():
    """No per-step lists (an endpoint's counters): the totals must lie where the emulation's near-ties can take
    them. Prompt 1 (3 then 1 accepted, clear) is fixed; prompt 2 ties at its second step, after 3 + 1 tokens of
    16: the other 12 may take 1..12 steps and 0..11 + 3 accepted."""
    from dflash_convert.validate.engine.served import greedy_agreement, totals_interval

    steps = _decisions([(3, 128, 128), (1, 128, 128)], [(2, 128, 128), (3, 1, 1), (3, 128, 128)])
    assert totals_interval(steps, 4 * BF16_ULP, 3, 16) == ((3 + 1, 3 + 12), (6 + 0, 6 + 11 + 3))
    inside = _emulated([90, 80, 70]).model_copy(update={"num_drafts": 8, "accepted": 15})
    outside = inside.model_copy(update={"num_drafts": 20})
    ok, detail, tolerance = greedy_agreement({"steps": None}, inside, _emulated([1, 1, 1]), steps, ["bfloat16"], 16)
    assert ok is True and "4..15 verify steps and 6..20 accepted tokens: they are" in detail, detail
    assert tolerance["steps"] == [4, 15] and tolerance["accepted"] == [6, 20]
    ok, detail, _ = greedy_agreement({"steps": None}, outside, _emulated([1, 1, 1]), steps, ["bfloat16"], 16)
    assert ok is False and "20 steps and 15 accepted are not" in detail, detail


def test_the_tie_is_judged_in_the_coarser_dtype():
    """Four ulps of the coarser of the engine's and the emulation's dtypes: a float32 emulation of a bfloat16
    engine is judged in bfloat16 ulps, and a float32 pair in float32 ulps (3 bf16 ulps are then no tie)."""
    from dflash_convert.validate.engine.served import acceptance_tie

    assert acceptance_tie(["bfloat16", "float32"]) == (4 * 2.0 ** -7, "bfloat16")
    assert acceptance_tie(["float32", "float32"]) == (4 * 2.0 ** -23, "float32")
    assert acceptance_tie(["float16", "float32"]) == (4 * 2.0 ** -10, "float16")
    assert acceptance_tie(["weird"]) == (4 * 2.0 ** -7, "bfloat16")


@pytest.mark.parametrize("spec, base, ours, says", [
    ([[1, 2, 3], [4, 6]], None, [[1, 2, 3], [4, 5]], "prompt 2: vLLM's speculative and target-only outputs differ"),
    (None, None, [[1, 2, 3], [4, 7]], "prompt 2: vLLM's target-only output is not our target's greedy output"),
])
def test_engine_outputs_that_differ_fail_naming_the_prompt(spec, base, ours, says):
    from dflash_convert.validate.engine.served import served_checks

    checks, stats = served_checks(_engine_answer([90, 80, 70], spec=spec, base=base), ours,
                                  _emulated([90, 80, 70]), block=4, engine_args={}, python="py",
                                  min_acceptance_length=None, min_position_rates=None)
    equal = next(c for c in checks if c.name == "engine_outputs_equal")
    assert equal.status == "fail" and says in equal.message and "(1/2 prompts equal)" in equal.message
    assert stats.outputs_equal == 1


def _top(second: dict[str, float]) -> list:
    """vLLM's target-only top logits for the two prompts [[1, 2, 3], [4, 5]]; prompt 2's second token: `second`."""
    return [[{"1": 20.0}, {"2": 20.0}, {"3": 20.0}], [{"4": 24.0}, second]]


@pytest.mark.parametrize("spec, ours, second, passes, says", [
    # vLLM took 5 at 24.23, our greedy took 7 at 24.125 (one bf16 ulp at 24 is 0.125): a near-tie
    (None, [[1, 2, 3], [4, 7]], {"5": 24.23, "7": 24.125}, True, "token 2: vLLM's target-only run took 5, our "
     "target 7, a near-tie (logits 24.23 and 24.12, within 2 bfloat16 ulps = 0.25)"),
    ([[1, 2, 3], [4, 7]], None, {"5": 24.23, "7": 24.125}, True, "vLLM's speculative run 7, a near-tie"),
    # 0.3 apart: more than 2 ulps, so a real difference, named with both logits
    (None, [[1, 2, 3], [4, 7]], {"5": 24.43, "7": 24.125}, False, "prompt 2: vLLM's target-only output is not our "
     "target's greedy output (token 2: vLLM's target-only run took 5, our target 7 (logits 24.43 and 24.12; the "
     "other run did not report both tokens' logits: nothing measured: not a near-tie))"),
    # vLLM took a token 0.5 below the other one (its greedy pick against its own logits): no tie either
    (None, [[1, 2, 3], [4, 7]], {"5": 24.23, "7": 24.73}, False, "(logits 24.23 and 24.73; the other run did not "
     "report both tokens' logits: nothing measured: not a near-tie)"),
    # the other token is not among vLLM's top candidates at all
    (None, [[1, 2, 3], [4, 7]], {"5": 24.23}, False, "(token 2: vLLM's target-only run took 5, our target 7)"),
])
def test_greedy_outputs_may_part_only_at_a_near_tie(spec, ours, second, passes, says):
    """Outputs that part where the token not taken is within 2 ulps (of the served dtype) of vLLM's pick, by
    vLLM's processed logits, are numerics: the check passes, naming where; anything further apart fails."""
    from dflash_convert.validate.engine.served import served_checks

    checks, stats = served_checks(_engine_answer([90, 80, 70], spec=spec, top=_top(second)),
                                  ours or [[1, 2, 3], [4, 5]], _emulated([90, 80, 70]), block=4, engine_args={},
                                  python="py", min_acceptance_length=None, min_position_rates=None)
    equal = next(c for c in checks if c.name == "engine_outputs_equal")
    assert (equal.status == "pass") is passes and says in equal.message, equal.message
    assert stats.outputs_equal == 1 and equal.value == "1/2"


# prompt 2's token 2 as vLLM's target-only run computes it: 5 at 24.5, 7 at 24.125, 3 bf16 ulps apart (one ulp
# at 24 is 0.125): wider than the 2-ulp floor
WIDE = {"5": 24.5, "7": 24.125}


@pytest.mark.parametrize("spec_row, passes, says", [
    # the speculative run's verify block computes 5 at 24.125 and 7 at 24.25: its own rounding put 7 on top, and
    # its rounding on the token before moved a logit by 0.25 (prefix): a gap of 3 ulps is within twice that
    ({"5": 24.125, "7": 24.25, "prefix": 23.75}, True, "vLLM's speculative run 7, a near-tie (logits 24.5 and 24.12; "
     "vLLM's speculative run (its verify block) computes them 24.12 and 24.25: the computations moved the gap by "
     "0.5 = 4.0 ulps (largest logit move 0.375); the runs' rounding before it moved a logit by 0.25 at most: the gap "
     "within that noise + 1 ulp)"),
    # the same verify row, but both runs computed the token before alike: its own row always orders the two its
    # way, and no rounding was measured to explain 3 ulps
    ({"5": 24.125, "7": 24.25}, False, "the runs' rounding before it moved a logit by 0 at most: not a near-tie"),
    # the verify block computes them as the one-token decode did: the run took 7 where its own logits put 5
    # 3 ulps above it (a token accepted against the target's argmax): not explained by rounding
    ({"5": 24.5, "7": 24.125}, False, "vLLM's speculative and target-only outputs differ (token 2: vLLM's "
     "target-only run took 5, vLLM's speculative run 7 (logits 24.5 and 24.12; vLLM's speculative run (its verify "
     "block) computes them 24.5 and 24.12: the computations moved the gap by 0 = 0.0 ulps"),
    # the speculative run's logits do not name the token not taken: nothing measured, and 3 ulps are over the floor
    ({"7": 24.25}, False, "did not report both tokens' logits: nothing measured: not a near-tie"),
])
def test_speculative_parting_is_judged_by_vllms_own_measured_noise(spec_row, passes, says):
    """vLLM's speculative output parting from its target-only output 3 ulps apart (wider than the 2-ulp floor):
    a near-tie where the speculative run's own reported logits (its verify block) moved the gap that far, a
    failure where they did not move it or were not reported. A fixed 2-ulp rule fails the first case."""
    from dflash_convert.validate.engine.served import served_checks

    answer = _engine_answer([90, 80, 70], spec=[[1, 2, 3], [4, 7]], top=_top(WIDE))
    row = {t: v for t, v in spec_row.items() if t != "prefix"}
    answer["drafts"][0]["top_logits"] = [_top(WIDE)[0], [{"4": spec_row.get("prefix", 24.0)}, row]]
    checks, _ = served_checks(answer, [[1, 2, 3], [4, 5]], _emulated([90, 80, 70]), block=4, engine_args={},
                              python="py", min_acceptance_length=None, min_position_rates=None)
    equal = next(c for c in checks if c.name == "engine_outputs_equal")
    assert (equal.status == "pass") is passes and says in equal.message, equal.message


@pytest.mark.parametrize("ours_row, passes, says", [
    # our target's one-token decode at the same prefix puts 7 at 24.375 over 5 at 24.25: a move of 0.25
    ({"5": 24.25, "7": 24.375}, True, "our target 7, a near-tie (logits 24.5 and 24.12; our target's one-token "
     "decode computes them 24.25 and 24.38"),
    # our target computes them as vLLM did: our greedy output took 7 against its own logits
    ({"5": 24.5, "7": 24.125}, False, "vLLM's target-only output is not our target's greedy output"),
    # not measured (no target to ask): the floor alone, and 3 ulps are over it
    (None, False, "nothing measured: not a near-tie"),
])
def test_cross_engine_parting_is_judged_by_the_noise_measured_between_the_engines(ours_row, passes, says):
    """vLLM's target-only output parting from our target's greedy output 3 ulps apart: judged by our target's
    one-token logits at the same prefix against vLLM's (the noise between the two engines), asked only there."""
    from dflash_convert.validate.engine.served import served_checks

    asked = []

    def ours_top(i, k, ids):
        asked.append((i, k, ids))
        return ours_row

    checks, _ = served_checks(_engine_answer([90, 80, 70], top=_top(WIDE)), [[1, 2, 3], [4, 7]],
                              _emulated([90, 80, 70]), block=4, engine_args={}, python="py",
                              min_acceptance_length=None, min_position_rates=None, ours_top=ours_top)
    equal = next(c for c in checks if c.name == "engine_outputs_equal")
    assert (equal.status == "pass") is passes and says in equal.message, equal.message
    assert asked == [(1, 1, [5, 7])]


def test_paths_that_disagree_beyond_rounding_give_no_verdict():
    """vLLM's two computations of the target moving a logit by 16 at 24 (128 bf16 ulps, past rounding's cap): the
    engine does not run this target exactly, said as an error (exit 1), not a verdict on the draft."""
    from dflash_convert.errors import DFlashError
    from dflash_convert.validate.engine.served import served_checks

    answer = _engine_answer([90, 80, 70], spec=[[1, 2, 3], [4, 7]], top=_top(WIDE))
    answer["drafts"][0]["top_logits"] = [_top(WIDE)[0], [{"4": 24.0}, {"5": 8.5, "7": 24.125}]]
    with pytest.raises(DFlashError, match="disagree by more than rounding"):
        served_checks(answer, [[1, 2, 3], [4, 5]], _emulated([90, 80, 70]), block=4, engine_args={}, python="py",
                      min_acceptance_length=None, min_position_rates=None)


def test_the_count_tie_bound_is_the_measured_noise_above_its_floor():
    """The step comparison's tie bound: the largest logit move measured between vLLM's target-only and
    speculative runs over their common prefix, never under 4 ulps nor over rounding's cap; the check names it.
    A decision 6 ulps from another outcome is compared under the floor (and differs: a failure) and is a stop at
    a near-tie where the runs' logits moved 8 ulps."""
    from dflash_convert.validate.engine.served import acceptance_tie, measured_noise

    rows = [[{"1": 16.0, "9": 15.0}, {"2": 16.0}], [{"4": 16.0}]]
    moved = [[{"1": 16.0, "9": 16.0 - 1 + 1.0}, {"2": 16.0}], [{"4": 16.0}]]  # token 9 moved by 1.0 = 8 ulps at 16
    assert measured_noise([[1, 2], [4]], rows, [[1, 2], [4]], moved) == 1.0 / 16
    assert measured_noise([[1, 2], [4]], rows, [[1, 3], [4]], None) is None
    # rows after the outputs part are not the same function: not measured
    assert measured_noise([[9, 2], [4]], moved, [[1, 2], [4]], rows) == 0.0
    assert acceptance_tie(["bfloat16"], 1.0 / 16) == (8 * BF16_ULP, "bfloat16")
    assert acceptance_tie(["bfloat16"], 0.001) == (4 * BF16_ULP, "bfloat16")  # the floor
    assert acceptance_tie(["bfloat16"], 3.0) == (32 * BF16_ULP, "bfloat16")  # the cap: not rounding
    engine_steps, decisions = [[1], [2]], _decisions([(0, 6, 6)], [(2, 128, 128)])
    agrees, tolerance = _greedy_agreement(engine_steps, decisions)
    assert agrees.status == "fail" and "within 4 bfloat16 ulps (no logit move measured" in agrees.message
    agrees, tolerance = _greedy_agreement(engine_steps, decisions, spec_top=moved, base_top=rows)
    assert agrees.status == "pass" and "1 stop at a near-tie (prompt 1 step 1)" in agrees.message
    assert "within 8 bfloat16 ulps (the largest logit move measured between vLLM's " \
        "target-only and speculative runs 0.0625 of the row's binade = 8.0 ulps" in agrees.message, agrees.message
    assert tolerance["tie_ulps"] == 8 and tolerance["measured_noise"] == 0.0625


def test_a_float32_served_answer_is_judged_in_float32():
    """The near-tie is judged in the dtype vLLM served (engine_config.dtype), not bf16 always: 24.23 and 24.125
    are within 2 bf16 ulps (0.25) but 2 float32 ulps at 24 are 4e-6, so parting there is a real difference."""
    from dflash_convert.validate.engine.served import served_checks

    answer = _engine_answer([90, 80, 70], top=_top({"5": 24.23, "7": 24.125}))
    answer["drafts"][0]["engine_config"]["dtype"] = "float32"
    checks, _ = served_checks(answer, [[1, 2, 3], [4, 7]], _emulated([90, 80, 70]), block=4, engine_args={},
                              python="py", min_acceptance_length=None, min_position_rates=None)
    equal = next(c for c in checks if c.name == "engine_outputs_equal")
    assert equal.status == "fail" and "(logits 24.23 and 24.12; " in equal.message, equal.message


def test_tie_tolerance_is_two_ulps_of_the_served_dtype():
    from dflash_convert.validate.engine.served import tie_tolerance

    assert tie_tolerance(24.23, "bfloat16") == 0.25 and tie_tolerance(-24.23, "bfloat16") == 0.25
    assert tie_tolerance(1.5, "float16") == 2 * 2.0 ** -10 and tie_tolerance(100.0, "float32") == 2 * 2.0 ** -17


@needs_vllm
def test_cli_compares_penalized_runs_with_vllm(cli):
    """A repetition penalty goes to vLLM and the comparison runs: equal outputs, or outputs parting at a
    near-tie the message names (with 1.3 on the bundled pair in bf16: 3 or 4 of 16 prompts on vLLM 0.32 CPU,
    depending on the machine's kernels), and the counts equal step by step up to each prompt's first near-tie
    (a fixed tolerance on the totals failed on another machine: 3 positions 0.05 apart)."""
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--prompts", PAIR / "prompts.txt",
            "--sampling", "greedy", "--repetition-penalty", "1.3", "--engine", "vllm", "--engine-python", VLLM_PYTHON,
            "--engine-args", json.dumps({"enforce_eager": True, "max_model_len": 384, "dtype": "bfloat16"}),
            "--levels", "static,end_to_end", "--json")
    assert r.code == 0, r.err[-3000:]
    report = r.json()
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["engine_outputs_equal"]["status"] == checks["engine_acceptance_agrees"]["status"] == "pass"
    run = report["engine_run"]
    assert run["sampling"] == {"temperature": 0.0, "repetition_penalty": 1.3}
    assert run["outputs_equal"] == 16 or "near-tie" in checks["engine_outputs_equal"]["message"]
    assert run["tolerance"]["mode"] == "greedy" and run["tolerance"]["steps_compared"] > 0, run["tolerance"]
    # vLLM reported the speculative run's processed logits too, so its two computations were measured against
    # each other (0.32 CPU in bf16: no logit moved, and the bound stays at its floor)
    assert run["tolerance"]["measured_noise"] is not None, run["tolerance"]
    assert "the largest logit move measured between vLLM's target-only and speculative runs" in \
        checks["engine_acceptance_agrees"]["message"]


# ----------------------------------------------------------------------------- sampled runs, parallel layouts

def _driver():
    """vllm_driver.py as a module (it imports only the standard library at the top)."""
    from dflash_convert.validate.engine import vllm_driver

    return vllm_driver


def _one_prompt(tmp_path: Path) -> Path:
    (tmp_path / "p.txt").write_text((PAIR / "prompts.txt").read_text().splitlines()[0] + "\n")
    return tmp_path / "p.txt"


@needs_vllm
def test_tensor_parallel_two_workers_count_as_one(served):
    """Two tensor-parallel workers on the CPU build (the driver binds one core per worker: without a binding
    vLLM stops on 'Not enough allowed NUMA nodes'): the bundled pair's counters and outputs equal one worker's."""
    from dflash_convert.validate.engine import served as engine

    cases, _, greedy = served
    one = cases["speculators"][1]
    prompts = [[int(t) for t in line.split()] for line in (PAIR / "prompts.txt").read_text().splitlines()][:PROMPTS]
    env = os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
    try:
        answer = engine.run_vllm(engine.EngineRequest(
            target=PAIR / "target", prompts=prompts, max_tokens=TOKENS, stop_token_ids=[510],
            engine_args={**EAGER, "tensor_parallel_size": 2},
            drafts=[{"draft": str(PAIR / "draft"), "num_speculative_tokens": 15, "mixed_layer_types": False}]),
            python=VLLM_PYTHON, timeout_s=900, kv_cache_gib=1)
    finally:
        if env is not None:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = env
    two = answer["drafts"][0]
    assert "error" not in two, two
    assert two["engine_config"]["tensor_parallel_size"] == 2 and one["engine_config"]["tensor_parallel_size"] == 1
    keys = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "num_accepted_tokens_per_pos")
    assert {k: two[k] for k in keys} == {k: one[k] for k in keys}
    assert two["outputs"] == one["outputs"] == greedy == answer["target_only"]["outputs"]


@needs_vllm
@pytest.mark.parametrize("args, says", [
    ({"pipeline_parallel_size": 2}, "pipeline_parallel_size 2 with a draft"),
    ({"distributed_executor_backend": "ray", "tensor_parallel_size": 2}, 'distributed_executor_backend "ray"'),
])
def test_layout_the_cpu_build_cannot_run_is_one_line(cli, tmp_path, args, says):
    """Pipeline parallel with a draft, or Ray, on vLLM's CPU build: exit 1, one line naming the setting and
    'cannot run here', answered before vLLM starts; never a verdict on the draft."""
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--prompts", _one_prompt(tmp_path),
            "--max-new-tokens", "4", "--levels", "end_to_end", "--threads", "1", "--sampling", "greedy",
            "--engine", "vllm", "--engine-python", VLLM_PYTHON, "--engine-args", json.dumps(args), "--json")
    assert r.code == 1, r.err[-2000:]
    message = r.json()["error"]["message"]
    assert says in message and "cannot run here" in message and "\n" not in message, message


@needs_vllm
def test_sampled_run_on_a_broken_sampler_is_said_not_judged(cli, tmp_path):
    """The default --sampling auto (temperature 1 here) through vLLM 0.32's CPU build, whose rejection sampler
    expands temperatures into garbage: the driver's probe of vLLM's own function finds it before serving, and
    the run says so in one line (exit 1), not a disagreement of the draft (exit 3)."""
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--prompts", _one_prompt(tmp_path),
            "--max-new-tokens", "8", "--levels", "end_to_end", "--threads", "1", "--engine", "vllm",
            "--engine-python", VLLM_PYTHON, "--engine-args", json.dumps(EAGER), "--json")
    assert r.code == 1, r.err[-2000:]
    message = r.json()["error"]["message"]
    assert "rejection sampler is broken: expand_batch_to_tokens: temperature [0.5, 2.0] expanded to" in message
    assert "cannot be compared here" in message and "\n" not in message


@needs_vllm
def test_sampler_probe_judges_behaviour_not_version(tmp_path):
    """The same vLLM 0.32 with its CPU expand kernel replaced by a correct one: the probe passes (no top-k); as
    installed it fails. The probe tests what the sampler computes, not which version it is."""
    import subprocess

    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(f"""\
        import sys, torch
        sys.path.insert(0, {str(ROOT / "dflash_convert" / "validate" / "engine")!r})
        import vllm_driver
        print("installed:", vllm_driver.broken_sampler({{"temperature": 1.0}}))
        from vllm.utils import cpu_triton_utils

        def fixed(output, input_val, cu_num_tokens, replace_from, replace_to, MAX_NUM_TOKENS=None):
            start = 0
            for i, end in enumerate(cu_num_tokens.tolist()):
                v = input_val[i]
                output[start:end] = replace_to if v == replace_from else v
                start = end
        cpu_triton_utils._expand_kernel_impl = fixed
        print("fixed:", vllm_driver.broken_sampler({{"temperature": 1.0}}))
        print("top-k:", vllm_driver.broken_sampler({{"temperature": 1.0, "top_k": 20}}))
        """))
    out = subprocess.run([VLLM_PYTHON, str(script)], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    lines = [line for line in out.stdout.splitlines() if line.startswith(("installed:", "fixed:", "top-k:"))]
    assert len(lines) == 3, out.stderr[-2000:]
    assert "rejection sampler is broken: expand_batch_to_tokens: temperature" in lines[0]
    assert lines[1] == "fixed: None"
    # vLLM 0.32 CPU's second fault, under top-k only: still found with the expand kernel fixed
    assert "apply_top_k_top_p with top-k on a step with no draft tokens raises" in lines[2]


def test_workers_get_one_core_range_each(monkeypatch):
    """Several workers on a CPU build with no binding given: one range of the allowed cores per worker; a
    binding the user gave, one worker, or a GPU build: left alone."""
    driver = _driver()
    monkeypatch.setattr(driver, "cpu_build", lambda: True)
    monkeypatch.setattr(driver.os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5, 6, 7}, raising=False)
    for args, given, want in [({"tensor_parallel_size": 2}, None, "0-3|4-7"),
                              ({"tensor_parallel_size": 4}, None, "0-1|2-3|4-5|6-7"),
                              ({"tensor_parallel_size": 2}, "0|5", "0|5"),
                              ({}, None, None)]:
        env = {} if given is None else {"VLLM_CPU_OMP_THREADS_BIND": given}
        driver.bind_cpu_workers(args, env)
        assert env.get("VLLM_CPU_OMP_THREADS_BIND") == want, args
    monkeypatch.setattr(driver.os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    env = {}
    driver.bind_cpu_workers({"tensor_parallel_size": 2}, env)
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}
    monkeypatch.setattr(driver, "cpu_build", lambda: False)
    env = {}
    driver.bind_cpu_workers({"tensor_parallel_size": 2}, env)
    assert env == {}


def test_engine_errors_of_unrunnable_layouts_are_cannot_run():
    """vLLM's own errors for a layout it cannot run (if the layout got past the pre-check) become 'cannot run
    here'; any other engine error stays an error."""
    driver = _driver()
    run = driver.known_failure({"error": "AttributeError: 'CPUModelRunner' object has no attribute 'drafter'",
                                "cannot_run": False})
    assert run["cannot_run"] and "cannot run here" in run["error"] and "drafter" in run["error"]
    other = {"error": "RuntimeError: out of memory", "cannot_run": False}
    assert driver.known_failure(other) == other


SAMPLED = {"temperature": 1.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0}


@pytest.mark.parametrize("engine, emulated, num, agrees", [
    ([63, 56, 49], [63, 56, 49], 70, True),
    ([60, 52, 44], [63, 56, 49], 70, True),     # every position ~0.06 lower: seed-to-seed spread at 70 drafts
    ([48, 38, 28], [63, 56, 49], 70, False),    # 0.2-0.3 lower: beyond what 70 drafts explain
    ([570, 490, 410], [630, 560, 490], 700, False),  # ~0.1 lower at 10x the drafts: a real drop
    ([630, 420, 630], [630, 560, 490], 700, False),  # same tau, acceptance moved between positions 2 and 3
])
def test_sampled_agreement_is_an_interval_from_the_counts(engine, emulated, num, agrees):
    """Sampled, vLLM's random stream is not ours: agreement is an interval derived from the numbers of drafts
    (stated in the message and the report), tau AND every position; outputs are not compared."""
    from dflash_convert.validate.engine.served import served_checks

    answer = _engine_answer(engine, num=num, spec=[[9], [9]])
    del answer["target_only"]
    checks, stats = served_checks(answer, [[1, 2, 3], [4, 5]], _emulated(emulated, num=num), block=4,
                                  engine_args={}, python="py", min_acceptance_length=None, min_position_rates=None,
                                  sampling=SAMPLED)
    by_name = {c.name: c for c in checks}
    assert "engine_outputs_equal" not in by_name and stats.outputs_equal is None
    assert by_name["engine_acceptance_agrees"].status == ("pass" if agrees else "fail"), \
        by_name["engine_acceptance_agrees"].message
    assert "tolerance from the counts" in by_name["engine_acceptance_agrees"].message
    assert stats.tolerance["mode"] == "sampled" and stats.tolerance["tau"] > 0.02 * 3.4
    assert stats.sampling == SAMPLED


def test_sampled_tolerance_narrows_with_the_counts():
    from dflash_convert.validate.engine.served import sampled_tolerance

    small = sampled_tolerance(_emulated([63, 56, 49], 70), _emulated([63, 56, 49], 70))
    large = sampled_tolerance(_emulated([630, 560, 490], 700), _emulated([630, 560, 490], 700))
    assert large[0] < small[0] and all(a < b for a, b in zip(large[1], small[1]))
    assert small[2] == large[2] > 2.5  # z: 0.01 two-sided over tau and 3 positions


def test_greedy_comparison_is_recorded_with_its_rule_and_figures():
    """engine_run.tolerance says how the greedy counts were compared: the tie in ulps of which dtype, how many
    steps were compared, how many prompts to their end and how many steps were left after a near-tie."""
    _, tolerance = _greedy_agreement([[3, 1], [2, 2]], _decisions([(3, 128, 128), (1, 128, 128)],
                                                                  [(2, 128, 1), (2, 128, 128)]))
    assert tolerance == {"mode": "greedy", "tie_ulps": 4, "dtype": "bfloat16", "measured_noise": None,
                         "steps_compared": 3, "prompts_whole": 1, "steps_not_compared": 1}


def test_broken_sampler_answer_is_a_one_line_error_not_a_verdict():
    from dflash_convert.errors import DFlashError
    from dflash_convert.validate.engine.served import served_checks

    line = "vLLM 0.32.0: its rejection sampler is broken: expand_batch_to_tokens: ... cannot be compared here"
    with pytest.raises(DFlashError, match="^vLLM 0.32.0: its rejection sampler"):
        served_checks({"vllm_version": "0.32.0", "drafts": [{"error": line, "cannot_run": True,
                                                             "broken_sampler": True}]}, [[1]], None, block=4,
                      engine_args={}, python="py", min_acceptance_length=None, min_position_rates=None,
                      sampling=SAMPLED)



TINY_ENGINE_TEST = """
from processes import needs_vllm


@needs_vllm
def test_engine():
    pass
"""


@pytest.mark.parametrize("python, require, outcome", [
    ("absent", "1", "1 error"),  # no Python there: .ci/run fails
    ("no_vllm", "1", "1 error"),  # a Python that cannot import vllm (a failed or unfinished build): fails too
    ("absent", "", "1 skipped"),  # a developer's run without the switch: skipped, and said
])
def test_the_require_switch_fails_what_would_be_skipped(tmp_path, python, require, outcome):
    """DFLASH_REQUIRE_VLLM=1 (set by scripts/test.sh) turns a real-engine test that cannot run into a failure, and the
    run's last lines count the real-engine tests that ran: a pytest of a one-test file under this conftest."""
    import subprocess
    import sys

    fake = tmp_path / "python"
    if python == "no_vllm":
        fake.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named vllm' >&2\nexit 1\n")
        fake.chmod(0o755)
    (tmp_path / "test_tiny.py").write_text(TINY_ENGINE_TEST)
    tests = ROOT / "tests"
    env = {**os.environ, "DFLASH_VLLM_PYTHON": str(fake), "DFLASH_REQUIRE_VLLM": require,
           "PYTHONPATH": os.pathsep.join([str(tests), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "conftest", "-rs",
                          str(tmp_path / "test_tiny.py")], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=300)
    assert (run.returncode != 0) is (require == "1") and outcome in run.stdout, run.stdout[-3000:]
    said = "no Python with vLLM at" if python == "absent" else "cannot import vllm (ModuleNotFoundError"
    assert said in run.stdout, run.stdout[-3000:]
    ran = "0 ran (0 passed, 0 failed), 1 could not run, 0 skipped" if require else \
        "0 ran (0 passed, 0 failed), 0 could not run, 1 skipped"
    assert f"real vLLM engine tests: {ran}, of 1 collected" in run.stdout, run.stdout[-3000:]


def test_our_one_token_logits_are_the_targets_at_that_prefix_with_the_runs_penalties():
    """The second computation of a parting from our output: our target's one-token decode after the prompt and our
    output's tokens before the parting, penalized as the run penalizes (vLLM's processed logits are penalized), the
    target loaded once on first use."""
    from types import SimpleNamespace

    import torch

    from dflash_convert.validate.engine.level import OurOneTokenLogits
    from dflash_convert.validate.report import SamplingUsed
    from dflash_runtime import Penalties, load_target
    from dflash_runtime.paths import one_token_logits

    prompt = [int(t) for t in (PAIR / "prompts.txt").read_text().splitlines()[0].split()]
    used = SamplingUsed(mode="greedy", temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.3,
                        sources={})
    said = []
    prep = SimpleNamespace(target=SimpleNamespace(dir=PAIR / "target"), prompts=SimpleNamespace(ids=[[1], prompt]),
                           opts=SimpleNamespace(max_new_tokens=8), sampling=used, say=said.append)
    ours = OurOneTokenLogits(prep, "cpu", torch.float32)
    with _restored_threads():
        got = ours(1, [409, 399, 63], [63, 466])
        again = ours(1, [409, 399], [399])
        target = load_target(PAIR / "target", dtype=torch.float32)
        want = one_token_logits(target, prompt, [409, 399, 63], max_new_tokens=8, penalties=Penalties(repetition=1.3))
        plain = one_token_logits(target, prompt, [409, 399, 63], max_new_tokens=8)
    assert got == {"63": float(want[2, 63]), "466": float(want[2, 466])}
    assert again == {"399": float(want[1, 399])}
    assert got["63"] != float(plain[2, 63])  # penalized: 63 is in the prompt
    assert len(said) == 1 and "loading our target" in said[0]
