"""greedy_output_equal in the dtype users deploy: a parting is judged by the noise measured between the target's
two paths (validate.partings), not by a fixed count of ulps.

A lookalike target (the bundled target's shape, random weights with each tensor's mean and standard deviation)
parts from its one-token decode in bfloat16 on about half the bundled prompts, by a few ulps after a few layers,
and nowhere in float32: its verdict must be a pass in both, naming the near-ties in bfloat16. A defect of the loop
(the verify block fed at positions one too far) must still fail, in both dtypes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime_helpers import plant_verify_one_position_too_far

PAIR = Path("examples/pair")
pytestmark = pytest.mark.usefixtures("one_timing_round")  # no test here reads the speedup
LOOKALIKE_SEEDS = (2, 5)


def _lookalike(directory: Path, seed: int) -> Path:
    """A same-shape target whose every tensor is random with the bundled target's per-tensor mean and std."""
    directory.mkdir(parents=True)
    for name in ("config.json", "generation_config.json"):
        shutil.copy(PAIR / "target" / name, directory)
    generator = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, t in load_file(PAIR / "target" / "model.safetensors").items():
        x = t.float()
        std = x.std() if x.numel() > 1 else torch.tensor(0.0)
        tensors[name] = (torch.randn(x.shape, generator=generator) * std + x.mean()).to(t.dtype)
    save_file(tensors, directory / "model.safetensors", metadata={"format": "pt"})
    return directory


def _greedy(cli, target, *extra, prompts=PAIR / "prompts.txt"):
    r = cli("validate", PAIR / "draft", "--target", target, "--prompts", prompts, "--levels",
            "end_to_end", "--sampling", "greedy", "--device", "cpu", "--json", *extra)
    checks = {c["name"]: c for c in r.json()["checks"]} if r.out else {}
    return r, checks.get("greedy_output_equal")


@pytest.mark.parametrize("seed", LOOKALIKE_SEEDS)
def test_a_lookalike_target_passes_in_bf16_with_its_near_ties_named(cli, tmp_path, seed):
    """The first 8 bundled prompts (16 cost twice as long and part the same way)."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join((PAIR / "prompts.txt").read_text().splitlines(keepends=True)[:8]))
    r, check = _greedy(cli, _lookalike(tmp_path / "t", seed), "--dtype", "bfloat16", prompts=prompts)
    assert check is not None and check["status"] == "pass", (r.code, r.err, check)
    equal, n = map(int, check["value"].split("/"))
    assert equal < n, "the lookalike no longer parts in bf16: this test no longer tests the rule"
    assert "part from it only at near-ties" in check["message"] and "the verify block computes them" in \
        check["message"] and "the paths moved it by" in check["message"]


def test_a_lookalike_target_passes_in_float32_with_no_parting(cli, tmp_path):
    r, check = _greedy(cli, _lookalike(tmp_path / "t", LOOKALIKE_SEEDS[0]), "--dtype", "float32")
    assert check is not None and check["status"] == "pass" and check["value"] == "16/16", (r.code, r.err, check)


@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_a_verify_block_at_the_wrong_positions_still_fails(cli, monkeypatch, dtype):
    """The planted defect: the decode loop's verify blocks run at positions one too far (the target's own
    recomputation of its paths, outside the loop, is right): the partings are not near-ties, exit 3."""
    plant_verify_one_position_too_far(monkeypatch)
    r, check = _greedy(cli, PAIR / "target", "--dtype", dtype, "--max-new-tokens", "24")
    assert r.code == 3 and check is not None and check["status"] == "fail", (r.code, r.err, check)
    assert "not a near-tie" in check["message"] or "the target's greedy output has" in check["message"]
