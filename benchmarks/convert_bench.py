"""Conversion speed and memory at the Qwen3-8B-DFlash-b16 shape (issue 2 targets).

Builds the checkpoint (random bf16, ~2.1 GB) in a temporary directory, then times, with a warm
page cache, `cp -r` of it against `dflash-convert convert` in both directions (whole CLI process,
peak RSS from wait4), repeats with a draft twice as large, and times `dflash-convert inspect`.
Then converts the same draft by Hub id from a Hub cache (offline: the cache alone), where every
input byte is hashed and checked against the blob's name, against hashing those inputs with sha256.
Targets: convert within 1.3x of cp, peak RSS under 600 MB and flat with size, inspect under 0.5 s,
convert from the Hub cache within 1.1x of sha256 of its inputs.

    python benchmarks/convert_bench.py [--repeat 3] [--dir /tmp/...]
"""

from __future__ import annotations

import argparse
import hashlib
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


def run(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float]:
    """(wall seconds, peak RSS MB) of one child process, started with no dirty pages pending."""
    os.sync()  # else one run's writeback throttles the next (cp and ours alike)
    python_module = cmd[:2] == [sys.executable, "-m"]
    if python_module:
        cmd = [sys.executable, "-c", HWM, *cmd[2:]]
    t = time.perf_counter()
    p = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
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


def best(cmd: list[str], repeat: int, cleanup: Path | None = None,
         env: dict[str, str] | None = None) -> tuple[float, float]:
    results = []
    for _ in range(repeat):
        if cleanup is not None and cleanup.exists():
            shutil.rmtree(cleanup)
        results.append(run(cmd, env))
    return min(r[0] for r in results), max(r[1] for r in results)


# The reference: sha256 of the inputs with the same OpenSSL code the conversion hashes with (coreutils'
# sha256sum may be built without the CPU's SHA instructions, and would flatter the ratio).
SHA256 = ("import hashlib, sys\nfor p in sys.argv[1:]:\n    h = hashlib.sha256()\n    f = open(p, 'rb')\n"
          "    while c := f.read(8 << 20):\n        h.update(c)\n    print(h.hexdigest(), p)")


def hub_cache(src: Path, cache: Path, repo: str = "org/draft") -> list[Path]:
    """`src` laid out as the client's cache holds a download of `repo`: blobs named by the hash the Hub
    announces (sha256 of LFS files, git blob id of config.json), snapshot links, refs/main."""
    sha = "0" * 40
    repo_dir = cache / f"models--{repo.replace('/', '--')}"
    (repo_dir / "refs").mkdir(parents=True)
    (repo_dir / "refs" / "main").write_text(sha)
    snap, blobs = repo_dir / "snapshots" / sha, repo_dir / "blobs"
    snap.mkdir(parents=True)
    blobs.mkdir()
    for f in src.iterdir():
        data = f.read_bytes() if f.suffix == ".json" else None
        name = hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest() if data is not None else \
            subprocess.run(["sha256sum", str(f)], capture_output=True, text=True, check=True).stdout.split()[0]
        shutil.copyfile(f, blobs / name)
        (snap / f.name).symlink_to(Path("../../blobs") / name)
    return [blobs / p.name for p in blobs.iterdir()]


def hub_case(src: Path, root: Path, exe: list[str], gb: float, repeat: int) -> None:
    cache, out = root / "hub-cache", root / "out"
    inputs = hub_cache(src, cache)
    warm(inputs[0].parent)
    env = {**os.environ, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    sha_s, _ = best([sys.executable, "-c", SHA256, *map(str, inputs)], repeat)
    hub_s, hub_rss = best(exe + ["convert", "org/draft", "-o", str(out)], repeat, out, env)
    local_s, _ = best(exe + ["convert", str(src), "-o", str(out)], repeat, out)
    cp_s, _ = best(["cp", "-r", str(src), str(root / "cp")], repeat, root / "cp")
    shutil.rmtree(root / "cp", ignore_errors=True)
    print(f"{'convert org/draft from the Hub cache':<38} {gb:>8.2f} {cp_s:>7.2f} {hub_s:>7.2f} "
          f"{hub_s / sha_s:>6.2f} {hub_rss:>12.0f}   (ratio to sha256 of the inputs: {sha_s:.2f} s; "
          f"the same conversion from a directory: {local_s:.2f} s)")
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(cache)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None, help="work directory (default: a temp dir, removed after)")
    ap.add_argument("--hub-only", action="store_true", help="only the Hub cache case")
    args = ap.parse_args()
    root = Path(args.dir or tempfile.mkdtemp(prefix="dflash-bench-"))
    exe = [sys.executable, "-m", "dflash_convert"]
    print(f"{'case':<38} {'size GB':>8} {'cp s':>7} {'ours s':>7} {'ratio':>6} {'peak RSS MB':>12}")
    try:
        for layers in (5,) if args.hub_only else (5, 10):
            for src_fmt in ("speculators",) if args.hub_only else ("speculators", "hf"):
                src = _shapes.write_draft(root / f"{src_fmt}-{layers}", src_fmt, layers)
                warm(src)
                gb = _shapes.size_bytes(layers) / 1e9
                out = root / "out"
                if args.hub_only:
                    hub_case(src, root, exe, gb, args.repeat)
                    continue
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
                if layers == 5 and src_fmt == "speculators":
                    hub_case(src, root, exe, gb, args.repeat)
                shutil.rmtree(src)
        print("targets: ratio <= 1.3, peak RSS < 600 MB and flat from 5 to 10 layers, inspect < 0.5 s, "
              "from the Hub cache <= 1.1x sha256 of its inputs")
    finally:
        if args.dir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
