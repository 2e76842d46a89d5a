"""--context-lengths under --engine vllm: the long prompts served in real vLLM (CPU) beside the short ones, in the
same engine run, vLLM's own per-request counts grouped per context length (and per output bucket), each length
against our runtime's decoding of it counted as vLLM counts. The draft is the bundled pair's with a sliding window
shorter than the longer context, and the same draft without the window: the runtime and vLLM must agree per
length with the window and without, and the two must differ where the context passes the window (so a window
honoured by one side only fails). Two validate runs, one vLLM process each (the draft, then target-only)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dflash_convert.io.reading import read_json
from processes import VLLM_PYTHON, needs_vllm, require_vllm

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "examples" / "pair"
WINDOW = 24  # the draft's window: shorter than both lengths (vLLM's per-query window bites past WINDOW - block)
SHORT, LONG = 32, 64  # the pair's 16 prompts joined hold 440 tokens: 4 windows of each
TOKENS = 48
# float32 on both sides: in bfloat16 a decision 5 ulps from a tie (just past the comparison's 4) was broken otherwise
NO_WINDOW = 2048  # the bundled draft's own window: past the pair's 512 positions, so no position is ever cut


def _draft(dst: Path, layer_types: list[str], window: int) -> Path:
    """The bundled draft with its two layers' types and window set (speculators: transformer_layer_config). Without
    the window is the same two causal sliding layers with a window no context here reaches: only the window differs
    (full_attention layers would also change the layers' causality as vLLM serves speculators drafts)."""
    shutil.copytree(PAIR / "draft", dst)
    cfg = read_json(dst / "config.json")
    cfg["transformer_layer_config"].update(layer_types=layer_types, sliding_window=window)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def _validate(draft: Path, prompts: Path, engine_python: str | None):
    from dflash_convert.validate import ValidateOptions, validate

    return validate(draft, ValidateOptions(
        target=PAIR / "target", prompts=prompts, max_new_tokens=TOKENS, sampling="greedy", engine="vllm",
        engine_python=engine_python, engine_args={"enforce_eager": True, "dtype": "float32"} if engine_python else {}, dtype="float32", context_lengths=[SHORT, LONG],
        long_context_file=PAIR / "prompts.txt", levels=["static", "end_to_end"], keep_going=True, timing_rounds=1,
        threads=1))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{"window": report, "full": report}: each draft validated with vLLM serving it."""
    import torch

    require_vllm()
    root = tmp_path_factory.mktemp("vllm-context")
    prompts = root / "prompts.txt"
    prompts.write_text("\n".join((PAIR / "prompts.txt").read_text().splitlines()[:4]) + "\n")
    drafts = {"window": _draft(root / "window", ["sliding_attention"] * 2, WINDOW),
              "full": _draft(root / "full", ["sliding_attention"] * 2, NO_WINDOW)}
    threads = torch.get_num_threads()
    try:
        return {name: _validate(d, prompts, VLLM_PYTHON) for name, d in drafts.items()}
    finally:
        torch.set_num_threads(threads)


def _counts(s) -> tuple:
    return s.label, s.prompts, s.num_drafts, s.accepted, s.accepted_histogram


@needs_vllm
@pytest.mark.parametrize("name", ["window", "full"])
def test_vllm_counts_equal_the_runtime_per_context_length(runs, name):
    """Per context length, vLLM's own counts (its verify steps per request) equal the runtime's counted as vLLM
    counts, and the engine_context_lengths check passes on them; vLLM's outputs of the long prompts are the
    target's greedy output."""
    report = runs[name]
    status = {c.name: c.status for c in report.checks}
    check = next(c for c in report.checks if c.name == "engine_context_lengths")
    assert status["engine_acceptance_agrees"] == status["engine_outputs_equal"] == "pass", report.checks
    assert check.status == "pass", check.message
    served, ours = report.engine_run.per_context_length, report.acceptance.vllm_context_counting
    assert [s.label for s in served] == [f"{SHORT} tokens", f"{LONG} tokens"]
    assert [_counts(s) for s in served] == [_counts(s) for s in ours], check.message
    assert [s.outputs_equal for s in served] == [s.prompts for s in served] == [4, 4]
    assert report.engine_run.engine_config["max_model_len"] == 512  # the target's own: it holds the long prompts
    assert report.engine_run.per_output_bucket  # vLLM's steps of the short prompts by output position


@needs_vllm
def test_the_window_changes_the_counts(runs):
    """Both lengths pass the window: with and without it the counts differ, in vLLM and in the runtime alike (so
    a window honoured by one side only fails the test above)."""
    served = {n: [_counts(s)[1:] for s in r.engine_run.per_context_length] for n, r in runs.items()}
    ours = {n: [_counts(s)[1:] for s in r.acceptance.vllm_context_counting] for n, r in runs.items()}
    for counts in (served, ours):
        assert counts["window"][1] != counts["full"][1], counts


@needs_vllm
def test_the_report_shows_vllms_figures_per_context_length(runs):
    from dflash_convert.validate.breakdown import breakdown_lines
    from dflash_convert.validate.report_markdown import to_markdown

    report = runs["window"]
    lines = "\n".join(breakdown_lines(report))
    version = report.engine_run.version
    assert f"vllm {version}'s tau per context length (runtime beside): {SHORT} tokens" in lines, lines
    assert f"### vllm {version}: tau per context length" in to_markdown(report)


def _context_case(dtype: str, vllm_steps: list[list[int]]):
    """context_check on one length of one prompt whose emulation accepted [3, 2] (no near-tie) and whose vLLM
    run accepted `vllm_steps`, vLLM and the runtime both in `dtype`; outputs equal."""
    from dflash_convert.validate.breakdown import context_slice
    from dflash_convert.validate.engine.level import context_check
    from dflash_convert.validate.report import AcceptanceStats, EngineStats, SliceAcceptance, StepDecisions

    stats = AcceptanceStats.model_construct(per_position_rates=[0.0] * 3, vllm_context_counting=[
        SliceAcceptance(**context_slice(8, [[3, 2]], 7, 3, None))], vllm_context_steps=[[StepDecisions(
            accepted=[3, 2], margin=[None, None], next_margin=[None, None])]])
    stats._context_outputs = [[[1, 2, 3]]]
    engine = EngineStats.model_construct(per_context_length=[])
    run = {"steps": [[1, 1, 1]] + vllm_steps, "outputs": [[9]] + [[1, 2, 3]], "engine_config": {"dtype": dtype}}
    check = context_check(engine, stats, run, {"outputs": [[9], [1, 2, 3]]}, 1, [(8, [[5] * 8])], sampled=False,
                          emulated_dtypes=[dtype], max_new_tokens=3)
    return check, engine


@pytest.mark.parametrize("dtype, steps, status", [("float32", [3, 2], "pass"), ("float32", [3, 1], "fail"),
                                                  ("bfloat16", [3, 1], "warn"), ("bfloat16", [3, 2], "pass")])
def test_a_long_context_difference_fails_in_float32_and_warns_in_half_precision(dtype, steps, status):
    """The length's prompts are the rows after the run's own (one here); vLLM's steps of them grouped as that
    length's figures; a difference fails in float32 and is a warning saying how to compare exactly in bfloat16."""
    check, engine = _context_case(dtype, [steps])
    assert check.status == status, check.message
    assert [(s.label, s.num_drafts, s.accepted) for s in engine.per_context_length] == [("8 tokens", 2, sum(steps))]
    assert ("--dtype float32" in check.message) == (status == "warn"), check.message
