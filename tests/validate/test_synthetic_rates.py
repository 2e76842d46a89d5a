"""What vLLM can replay: the validate report's synthetic rejection-sampler keys (`rejection_sample_method:
synthetic`, `synthetic_acceptance_rates`), accepted by vLLM's own SpeculativeConfig in the vLLM venv."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest
from pydantic import ValidationError

from dflash_convert.validate.report import SyntheticAcceptance
from processes import VLLM_PYTHON, needs_vllm

PAIR = Path(__file__).resolve().parents[2] / "examples" / "pair"

# Builds vLLM's SpeculativeConfig for the pair with each set of keys and prints the rates it resolved, or
# its refusal on one line.
SPECULATIVE_CONFIG = textwrap.dedent("""
    import json, sys
    from vllm.config import ModelConfig, ParallelConfig, SpeculativeConfig
    pair, keys = sys.argv[1], json.loads(sys.argv[2])
    target = ModelConfig(model=pair + "/target", dtype="bfloat16", max_model_len=256)
    for attempt in keys:
        try:
            config = SpeculativeConfig(method="dflash", model=pair + "/draft", target_model_config=target,
                                       target_parallel_config=ParallelConfig(), **attempt)
            print(json.dumps({"rates": config.synthetic_acceptance_rates}))
        except Exception as exc:
            print(json.dumps({"refused": " ".join(str(exc).split())}))
""")

pytestmark = pytest.mark.usefixtures("one_timing_round")  # no test here reads the speedup


def test_rates_are_checked_as_vllm_checks_them():
    ok = SyntheticAcceptance(num_speculative_tokens=3, synthetic_acceptance_rates=[0.9, 0.5, 0.5], counted="vllm")
    assert ok.speculative_config() == {"num_speculative_tokens": 3, "rejection_sample_method": "synthetic",
                                       "synthetic_acceptance_rates": [0.9, 0.5, 0.5]}
    for rates in ([0.5, 0.9, 0.5], [0.9, 0.5], [1.2, 0.5, 0.1]):
        with pytest.raises(ValidationError):
            SyntheticAcceptance(num_speculative_tokens=3, synthetic_acceptance_rates=rates, counted="vllm")


@needs_vllm
def test_vllm_accepts_the_reported_rates(cli, tmp_path):
    """The pair's report (--engine vllm: counted as vLLM counts) gives K = block - 1 rates that vLLM 0.32's
    SpeculativeConfig takes as they are; the same rates one position longer (a block's K + 1 slots) it refuses."""
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PAIR.joinpath("prompts.txt").read_text().splitlines()[:3]) + "\n")
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--prompts", prompts, "--max-new-tokens", "24",
            "--levels", "end_to_end", "--engine", "vllm", "--json")
    assert r.code == 0, r.err
    acceptance = r.json()["acceptance"]
    synthetic = SyntheticAcceptance.model_validate(acceptance["synthetic"])
    assert synthetic.counted == "vllm" and synthetic.num_speculative_tokens == acceptance["block_size"] - 1
    assert synthetic.synthetic_acceptance_rates == acceptance["vllm_counting"]["per_position_rates"]
    keys = synthetic.speculative_config()
    longer = {**keys, "synthetic_acceptance_rates": keys["synthetic_acceptance_rates"] + [0.0]}  # K + 1 rates
    run = subprocess.run([VLLM_PYTHON, "-c", SPECULATIVE_CONFIG, str(PAIR), json.dumps([keys, longer])],
                         capture_output=True, text=True, timeout=300)
    answers = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert len(answers) == 2, run.stderr[-2000:]
    assert answers[0] == {"rates": keys["synthetic_acceptance_rates"]}
    assert "synthetic_acceptance_rates must have length" in answers[1]["refused"]
