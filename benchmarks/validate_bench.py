"""Validation speed (issue 4 targets), timed as a user runs it: the whole `dflash-convert validate` process.

1. static + numeric of a Qwen3-8B-DFlash-b16-shaped checkpoint (random bf16, ~2.1 GB, built in a
   temporary directory) against a Qwen3-8B target config.json (shapes only).  Target: < 60 s on 2 cores.
2. static + numeric of the bundled trained pair's draft (examples/pair).
3. the full end-to-end run on the bundled pair (its held-out prompts).      Target: < 20 s.

Each figure is the whole CLI process (imports included) plus the time the report says each level
took; peak RSS is read inside the child (VmHWM).

    python benchmarks/validate_bench.py [--dir /tmp/...] [--skip-8b] [--max-new-tokens 64]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _shapes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PAIR = ROOT / "examples" / "pair"
HWM = ("import atexit, sys, runpy; atexit.register(lambda: sys.stderr.write('VmHWM ' + "
       "[l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0] + chr(10))); "
       "sys.argv = sys.argv[1:]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")


def validate(*args: str) -> tuple[float, float, dict]:
    """(wall s, peak RSS MB, JSON report) of one `dflash-convert validate ... --json` process."""
    cmd = [sys.executable, "-c", HWM, "dflash_convert", "validate", *args, "--json"]
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.perf_counter() - t
    if p.returncode not in (0, 3):
        raise SystemExit(f"validate {' '.join(args)} could not run (exit {p.returncode}):\n{p.stderr[-3000:]}")
    hwm = [line.split()[1] for line in p.stderr.splitlines() if line.startswith("VmHWM ")]
    return wall, int(hwm[-1]) / 1024 if hwm else float("nan"), json.loads(p.stdout)


def describe(label: str, wall: float, rss: float, report: dict, target_s: float | None) -> None:
    failed = [c["name"] for c in report["checks"] if c["status"] == "fail"]
    verdict = "" if target_s is None else f"  (target < {target_s:.0f} s: {'met' if wall < target_s else 'MISSED'})"
    print(f"{label}: {wall:.1f} s wall, validation {report['duration_s']:.1f} s, peak RSS {rss:.0f} MB, "
          f"levels {','.join(report['levels_run'])}, {len(report['checks'])} checks, "
          f"failed: {failed or 'none'}{verdict}")
    a = report.get("acceptance")
    if a:
        print(f"    tau {a['acceptance_length']:.2f} (block {a['block_size']}), {a['outputs_equal']}/{a['prompts']} "
              f"outputs equal, speedup {a['speedup']:.2f}x ({a['speculative_tokens_per_s']:.0f} vs "
              f"{a['target_tokens_per_s']:.0f} tok/s), {a['new_tokens']} tokens")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir, removed after)")
    ap.add_argument("--skip-8b", action="store_true", help="only the bundled pair")
    ap.add_argument("--max-new-tokens", default="64")
    ap.add_argument("--pair", type=Path, default=PAIR, help="trained pair directory (target/, draft/, prompts.txt)")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="dflash-validate-bench-"))
    try:
        import os

        print(f"machine: {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at start; "
              f"python {sys.version.split()[0]}")
        if not args.skip_8b:
            t = time.perf_counter()
            draft = _shapes.write_draft(root / "qwen3-8b-dflash-b16", "hf", layers=5)
            (root / "qwen3-8b").mkdir(exist_ok=True)
            (root / "qwen3-8b" / "config.json").write_text(json.dumps(_shapes.target_config()))
            print(f"built the 8B-shaped draft ({_shapes.size_bytes(5) / 1e9:.2f} GB) in {time.perf_counter() - t:.1f} s")
            for f in draft.iterdir():  # warm page cache, as after a download
                with open(f, "rb") as fh:
                    while fh.read(64 << 20):
                        pass
            wall, rss, report = validate(str(draft), "--levels", "static", "--target", str(root / "qwen3-8b"))
            describe("8B-shaped, static only (with target config)", wall, rss, report, None)
            wall, rss, report = validate(str(draft), "--levels", "static,numeric", "--target", str(root / "qwen3-8b"))
            describe("8B-shaped, static + numeric", wall, rss, report, 60)
            shutil.rmtree(draft)
        pair = args.pair
        if (pair / "draft" / "config.json").exists():
            wall, rss, report = validate(str(pair / "draft"), "--levels", "static,numeric", "--target",
                                         str(pair / "target"))
            describe(f"pair {pair}, static + numeric", wall, rss, report, None)
            for threads in ([], ["--threads", "1"]):
                wall, rss, report = validate(str(pair / "draft"), "--target", str(pair / "target"), "--prompts",
                                             str(pair / "prompts.txt"), "--max-new-tokens", args.max_new_tokens,
                                             *threads)
                describe(f"pair {pair}, end to end (all levels), {report['environment']['threads']} thread(s)",
                         wall, rss, report, 20)
        else:
            print(f"trained pair {pair} not present: skipped")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
