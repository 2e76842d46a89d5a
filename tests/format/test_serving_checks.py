"""inspect's serving-config checks: each fires on a launch vLLM 0.33 or SGLang 0.5.23 refuses (or runs otherwise
than asked), with the engine's reason; a launch they accept passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from dflash_convert.format.serving import ServingConfig, serving_checks, slots
from dflash_convert.io.checkpoint import open_checkpoint

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"


@pytest.fixture(scope="module")
def pair():
    ckpt = open_checkpoint(PAIR / "draft")
    assert ckpt.spec.block_size == 16
    return ckpt.spec, ckpt.raw_config


def by_name(checks) -> dict:
    return {c.name: c for c in checks}


def test_a_launch_the_engines_accept_passes(pair):
    spec, raw = pair
    checks = serving_checks(spec, raw, ServingConfig("vllm", 15, max_num_seqs=128, max_num_batched_tokens=2048))
    assert {c.status for c in checks} == {"pass"}
    assert {c.status for c in serving_checks(spec, raw, ServingConfig("sglang", 15, draft_window_size=16))} == {"pass"}


def test_k_past_the_trained_block_warns(pair):
    spec, raw = pair
    check = by_name(serving_checks(spec, raw, ServingConfig("vllm", 16)))["serving_k"]
    assert check.status == "warn" and "1 slot(s) past the trained block of 16" in check.message


def test_vllm_refuses_a_budget_without_room_and_lowers_concurrency(pair):
    """vLLM 0.33: max_num_batched_tokens <= the K+1 draft slots is refused; room for fewer than max_num_seqs
    sequences lowers max_num_active_seqs (vllm #50708's negative budget under default batching)."""
    spec, raw = pair
    refused = by_name(serving_checks(spec, raw, ServingConfig("vllm", 15, max_num_batched_tokens=16)))
    assert refused["serving_token_budget"].status == "fail" and "vLLM refuses" in refused["serving_token_budget"].message
    lowered = by_name(serving_checks(spec, raw, ServingConfig("vllm", 7, max_num_seqs=256,
                                                              max_num_batched_tokens=1024)))["serving_token_budget"]
    assert lowered.status == "warn" and "lowers max_num_active_seqs to 128" in lowered.message
    assert "at least 2048 tokens" in lowered.message


def test_sglang_refuses_a_draft_window_below_the_block(pair):
    spec, raw = pair
    check = by_name(serving_checks(spec, raw, ServingConfig("sglang", 15, draft_window_size=8)))["serving_draft_window"]
    assert check.status == "fail" and "below --speculative-num-draft-tokens 16" in check.message


def test_dspark_slots_and_the_qwen3_omni_rule(pair):
    """A DSpark draft with sample_from_anchor drafts K slots (its anchor proposes), without it 1+K; vLLM 0.33 holds
    a Qwen3-Omni DSpark draft to K equal to its trained block_size."""
    spec, raw = pair
    anchored = spec.model_copy(update={"variant": "dspark", "variant_fields": {"sample_from_anchor": True}})
    fill_in = spec.model_copy(update={"variant": "dspark", "variant_fields": {"sample_from_anchor": False}})
    assert (slots(anchored, 16), slots(fill_in, 15), slots(spec, 15)) == (16, 16, 16)
    omni = {**raw, "architectures": ["Qwen3OmniDSparkModel"]}
    refused = by_name(serving_checks(anchored, omni, ServingConfig("vllm", 8)))["serving_omni_dspark"]
    assert refused.status == "fail" and "must match the trained block_size (16)" in refused.message
    assert "serving_omni_dspark" not in by_name(serving_checks(anchored, omni, ServingConfig("vllm", 16)))


def test_inspect_flags_a_launch(cli):
    r = cli("inspect", PAIR / "draft", "--engine", "vllm", "--num-speculative-tokens", "16",
            "--max-num-batched-tokens", "16", "--json")
    assert r.code == 3
    problems = {p["name"]: p["status"] for p in r.json()["problems"]}
    assert problems["serving_token_budget"] == "fail" and problems["serving_k"] == "warn"
    assert cli("inspect", PAIR / "draft", "--num-speculative-tokens", "7").code == 2  # no engine named
    assert cli("inspect", PAIR / "draft", "--engine", "vllm", "--num-speculative-tokens", "7", "--json").code == 0
