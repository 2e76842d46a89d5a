"""`dflash-convert predict` runs offline from config files in under 2 s (issue 46's target).

Times the whole CLI process (interpreter start and imports included, as a user waits for it), offline
(HF_HUB_OFFLINE=1), on two pairs: the bundled pair (examples/pair) and a MoE target (Qwen3-30B-A3B's published
config.json dimensions, written to a temporary directory) with the bundled draft, each over 2 GPUs, 2 K and 3
concurrencies. Prints the median and worst wall time of each; no assertion (a figure, not a test).

    python benchmarks/predict_bench.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "examples" / "pair"


def wall(args: list[str]) -> float:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "NO_COLOR": "1"}
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "dflash_convert", "predict", *args], capture_output=True, text=True,
                       env=env, timeout=120)
    seconds = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"predict failed ({r.returncode}): {r.stderr.strip()}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    a = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from dflash_convert.predict.calibration import QWEN3_30B_A3B

    common = ["--gpu", "H100-SXM,L4", "--tau", "7=4.5,15=6", "--concurrency", "1,16,64", "--json"]
    with tempfile.TemporaryDirectory() as tmp:
        moe = Path(tmp) / "qwen3-30b-a3b"
        moe.mkdir()
        (moe / "config.json").write_text(json.dumps({**QWEN3_30B_A3B, "architectures": ["Qwen3MoeForCausalLM"]}))
        cases = {"bundled pair": ["--target", str(PAIR / "target"), "--draft", str(PAIR / "draft")],
                 "MoE target (Qwen3-30B-A3B config)": ["--target", str(moe), "--draft", str(PAIR / "draft")]}
        wall(cases["bundled pair"] + common)  # the first run fills the page cache with the interpreter's files
        for name, args in cases.items():
            times = [wall(args + common) for _ in range(a.repeat)]
            print(f"predict, {name}: median {statistics.median(times):.2f} s, worst {max(times):.2f} s over "
                  f"{a.repeat} runs (whole process, offline; target: under 2 s)")


if __name__ == "__main__":
    main()
