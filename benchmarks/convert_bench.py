"""Conversion speed and memory at the Qwen3-8B-DFlash-b16 shape (issue 2 targets).

Builds the checkpoint (random bf16, ~2.1 GB) in a temporary directory, then times, with a warm
page cache, `cp -r` of it against `dflash-convert convert` in both directions (whole CLI process,
peak RSS from wait4), repeats with a draft twice as large, and times `dflash-convert inspect`.
Targets: convert within 1.3x of cp, peak RSS under 600 MB and flat with size, inspect under 0.5 s.

    python benchmarks/convert_bench.py [--repeat 3] [--dir /tmp/...]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _shapes  # noqa: E402


# Peak RSS must be read inside the child: getrusage/wait4 report a high-water mark that survives
# exec and so includes this (big) benchmark process at fork time. VmHWM belongs to the new image.
HWM = ("import atexit, sys, runpy; atexit.register(lambda: sys.stderr.write('VmHWM ' + "
       "[l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM')][0] + chr(10))); "
       "sys.argv = sys.argv[1:]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)")


def run(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one child process, started with no dirty pages pending."""
    os.sync()  # else one run's writeback throttles the next (cp and ours alike)
    python_module = cmd[:2] == [sys.executable, "-m"]
    if python_module:
        cmd = [sys.executable, "-c", HWM, *cmd[2:]]
    t = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - t
    if p.returncode not in (0, 3):
        raise SystemExit(f"{' '.join(cmd)} failed: {p.stderr}")
    hwm = [line.split()[1] for line in p.stderr.splitlines() if line.startswith("VmHWM ")]
    return wall, (int(hwm[-1]) / 1024 if hwm else float("nan"))


def warm(path: Path) -> None:
    for f in path.iterdir():
        with open(f, "rb") as fh:
            while fh.read(64 << 20):
                pass


def best(cmd: list[str], repeat: int, cleanup: Path | None = None) -> tuple[float, float]:
    results = []
    for _ in range(repeat):
        if cleanup is not None and cleanup.exists():
            shutil.rmtree(cleanup)
        results.append(run(cmd))
    return min(r[0] for r in results), max(r[1] for r in results)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir, removed after)")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="dflash-bench-"))
    exe = [sys.executable, "-m", "dflash_convert"]
    print(f"{'case':<38} {'size GB':>8} {'cp s':>7} {'ours s':>7} {'ratio':>6} {'peak RSS MB':>12}")
    try:
        for layers in (5, 10):
            for src_fmt in ("speculators", "hf"):
                src = _shapes.write_draft(root / f"{src_fmt}-{layers}", src_fmt, layers)
                warm(src)
                gb = _shapes.size_bytes(layers) / 1e9
                cp_dst = root / "cp"
                cp_s, _ = best(["cp", "-r", str(src), str(cp_dst)], args.repeat, cp_dst)
                out = root / "out"
                ours_s, rss = best(exe + ["convert", str(src), "-o", str(out)], args.repeat, out)
                dst_fmt = "hf" if src_fmt == "speculators" else "speculators"
                print(f"{src_fmt + ' -> ' + dst_fmt + f' ({layers} layers)':<38} {gb:>8.2f} {cp_s:>7.2f} "
                      f"{ours_s:>7.2f} {ours_s / cp_s:>6.2f} {rss:>12.0f}")
                shutil.rmtree(out, ignore_errors=True)
                shutil.rmtree(cp_dst, ignore_errors=True)
                if layers == 5 and src_fmt == "hf":
                    insp_s, insp_rss = best(exe + ["inspect", str(src), "--json"], args.repeat)
                    print(f"{'inspect (5 layers, headers only)':<38} {gb:>8.2f} {'':>7} {insp_s:>7.2f} {'':>6} "
                          f"{insp_rss:>12.0f}")
                shutil.rmtree(src)
        print("targets: ratio <= 1.3, peak RSS < 600 MB and flat from 5 to 10 layers, inspect < 0.5 s")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
