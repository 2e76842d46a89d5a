#!/usr/bin/env python
"""The GPU check's parts, run by scripts/gpu-check.sh: the CUDA tests, then the GPU figures, each part a child
process with its own time budget. A part that overruns is stopped (its whole process group) and the next
one runs, so one slow part cannot eat a short GPU loan. After every part, OUT/figures.json (every figure,
every part's status) and OUT/figures.txt (a short table, the goals beside it) are rewritten, and every
part's output goes to OUT/gpu-check.log: three files, whatever happens.

--dry-run runs the same parts on the CPU at tiny shapes, eager only, in about half a minute of CPU time (the
tests part then skips every CUDA test: it checks that they are still collected).

    python benchmarks/gpu_check.py OUT [--dry-run] [--parts tests step ...]   (through scripts/gpu-check.sh)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
# What the CUDA tests are: every test these files parametrize over the cuda device (ids hold "cuda"). The
# compiling ones last: a run stopped at its budget has done the rest.
TEST_FILES = ["tests/runtime/test_runtime_attention.py", "tests/runtime/test_runtime_decode.py",
              "tests/runtime/test_runtime_target.py", "tests/runtime/test_targets.py",
              "tests/runtime/test_runtime_dflash2.py", "tests/runtime/test_runtime_dspark.py",
              "tests/validate/test_validate.py", "tests/runtime/test_runtime_compile.py"]
# Imported by the project and its tests; absent ones are listed before anything runs.
NEEDED = ["torch", "transformers", "safetensors", "accelerate", "huggingface_hub", "pydantic", "typer", "rich",
          "numpy", "pytest", "jsonschema", "speculators"]
OPTIONAL = ["flash_attn", "fla"]  # flash-attn backend; transformers' fast Gated DeltaNet path (hybrid targets)
DISTRIBUTIONS = {"flash_attn": "flash-attn", "fla": "fla-core"}  # where the module's name is not its package's


def version(distribution: str) -> str:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return "present"


@dataclass(frozen=True)
class Part:
    name: str
    budget_s: int  # on one H100, from the first run there (2026-11-28): 490 s in all. step, verify, family and
    # validate are what they took plus a margin; tests and hybrid stop at theirs (their compiles take minutes)
    what: str


PARTS = [
    Part("tests", 130, "CUDA tests (bf16 at the tests' stated tolerances, flex compiled vs eager, flash-attn where "
                       "installed, hybrid rollback)"),
    Part("step", 55, "draft step, Qwen3-8B-DFlash-b16 shape, eager and compiled (CUDA graphs), vs weight-read floor"),
    Part("verify", 105, "verify step of a Qwen3-8B-shaped random target (block 16 after 512)"),
    Part("hybrid", 60, "hybrid (Qwen3.5 layout) verify step with rollback vs attention-only of the same size"),
    Part("family", 60, "dflash2 and DSpark draft steps vs dflash, same body"),
    Part("validate", 80, "validate end to end, 8B-shaped random pair (36-layer target): wall time, peak GPU memory"),
]
# The budgets are the GPU loan's: a dry run is not timed (a loaded CPU must not fail it), only bounded.
DRY_RUN_BUDGET_S = 600
# The goals on the GPU: (part, what, how to read it from the part's figures (the JSON its script wrote), at most)
GOALS = [
    ("step", "compiled draft step / weight-read floor",
     lambda f: f["step"]["compiled_ms"] / f["step"]["floor_ms"], 1.5),
    ("hybrid", "hybrid with rollback / attention-only, compiled",
     lambda f: f["hybrid"]["compiled"]["rollback_vs_attention"], 1.2),
    ("family", "dflash2 / dflash draft step, compiled", lambda f: f["dflash2"]["compiled_ratio"], 1.15),
    ("validate", "validate end to end, 8B-shaped pair, wall s",
     lambda f: f["8b-shaped pair, all levels"]["wall_s"], 60.0),
]


def part_argv(name: str, dry: bool, json_out: Path) -> list[str]:
    """The child command of one part (after the interpreter)."""
    if name == "tests":
        return ["-m", "pytest", "-v", "-p", "no:cacheprovider", "--durations=10", "-k", "cuda",
                f"--junitxml={json_out}", *TEST_FILES]
    if name == "validate":
        size = ["--target-shape", "tiny", "--device", "cpu", "--size-levels", "static,end_to_end"] if dry else \
            ["--target-shape", "8b", "--device", "cuda"]
        return [str(BENCH / "validate_bench.py"), "--skip-8b", "--skip-pair", *size, "--json", str(json_out)]
    sizes = ["--shape", "small", "--device", "cpu", "--modes", "eager", "--steps", "1", "--threads", "1"] if dry \
        else ["--shape", "8b", "--device", "cuda", "--modes", "eager", "compiled", "--steps", "20"]
    return [str(BENCH / "runtime_bench.py"), "--parts", *(["dflash2", "dspark"] if name == "family" else [name]),
            *sizes, "--json", str(json_out)]


def run_part(argv: list[str], budget_s: int, log) -> tuple[str, float]:
    """Run one child in a process group of its own; stop the group at the budget. (status, seconds)."""
    t = time.perf_counter()
    child = subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
    try:
        rc = child.wait(timeout=budget_s)
    except subprocess.TimeoutExpired:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(child.pid, sig)
                child.wait(timeout=10)
                break
            except (ProcessLookupError, subprocess.TimeoutExpired):
                continue
        return f"stopped at its {budget_s} s budget", time.perf_counter() - t
    return ("ok" if rc == 0 else f"failed (exit {rc})"), time.perf_counter() - t


def junit_counts(junit: Path) -> dict:
    """passed / failed / skipped and the names of the failures, from pytest's JUnit XML."""
    cases = ET.parse(junit).getroot().iter("testcase")
    counts: dict = {"passed": 0, "failed": 0, "skipped": 0, "failures": []}
    for case in cases:
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            counts["failed"] += 1
            counts["failures"].append(f"{case.get('classname')}::{case.get('name')}")
        elif "skipped" in kinds:
            counts["skipped"] += 1
        else:
            counts["passed"] += 1
    return counts


def log_counts(text: str) -> dict:
    """The same counts from pytest -v's lines ("tests/x.py::name[cuda] PASSED"), for a run stopped at its
    budget (pytest writes its JUnit XML only at the end)."""
    counts: dict = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "stopped_early": True}
    for test, outcome in re.findall(r"^(tests/\S+::\S+) (PASSED|FAILED|ERROR|SKIPPED)", text, re.MULTILINE):
        if outcome in ("FAILED", "ERROR"):
            counts["failed"] += 1
            counts["failures"].append(test)
        else:
            counts["passed" if outcome == "PASSED" else "skipped"] += 1
    return counts


def environment(dry: bool) -> dict:
    """Which torch, CUDA and device this is, and which of the packages the check needs are absent (found on
    the path, not imported: the parts import them, and a broken one fails its part)."""
    env: dict = {"python": sys.version.split()[0], "executable": sys.executable, "dry_run": dry}
    for name in NEEDED + OPTIONAL:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        env[name] = (version(DISTRIBUTIONS.get(name, name)) if found else None)
    env["missing"] = [name for name in NEEDED if env[name] is None]
    if env["torch"] is not None:
        import torch

        env["cuda"] = torch.version.cuda
        env["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return env


def goal_rows(parts: dict) -> list[str]:
    rows = []
    for part, what, read, limit in GOALS:
        try:
            value = read(parts[part]["figures"])
        except (KeyError, TypeError, ZeroDivisionError):
            rows.append(f"  {what:52} {'-':>8}  goal <= {limit:g}: not measured")
            continue
        rows.append(f"  {what:52} {value:8.2f}  goal <= {limit:g}: {'met' if value <= limit else 'MISSED'}")
    return rows


def leaves(value, path: str = ""):
    """(dotted path, number) of every number in a part's figures, in order."""
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from leaves(inner, f"{path}.{key}" if path else key)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        yield path, value


def table(env: dict, parts: dict) -> str:
    lines = [f"GPU check{' (dry run on CPU, tiny shapes)' if env['dry_run'] else ''}: {env.get('device') or 'no GPU'}, "
             f"torch {env.get('torch')}, CUDA {env.get('cuda')}, python {env['python']}, "
             f"flash_attn {env.get('flash_attn') or 'absent'}, fla {env.get('fla') or 'absent'}", ""]
    for name, p in parts.items():
        lines.append(f"{name:9} {p['status']:34} {p['seconds']:6.1f} s of {p['budget_s']} s  {p['what']}")
        tests = p.get("tests")
        if tests:
            lines.append(f"          {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped"
                         + "".join(f"\n          FAILED {n}" for n in tests["failures"]))
    lines += ["", "figures (ms: median per step; _s: seconds; _bytes; _GBps; ratios):"]
    lines += [f"  {name}.{path:66} {value:12.4g}" for name, p in parts.items()
              for path, value in leaves(p.get("figures", {}))]
    lines += ["", "goals:", *goal_rows(parts)]
    return "\n".join(lines) + "\n"


def save(out: Path, env: dict, parts: dict) -> None:
    (out / "figures.json").write_text(json.dumps({"environment": env, "parts": parts}, indent=1) + "\n")
    (out / "figures.txt").write_text(table(env, parts))


def parse(argv) -> tuple[argparse.Namespace, dict[str, int]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="directory for figures.json, figures.txt and gpu-check.log")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, eager only")
    ap.add_argument("--parts", nargs="+", choices=[p.name for p in PARTS], default=[p.name for p in PARTS])
    ap.add_argument("--budget", nargs="+", default=[], metavar="PART=SECONDS",
                    help="another budget for a part (a rerun of one part that overran, say)")
    args = ap.parse_args(argv)
    budgets = {p.name: DRY_RUN_BUDGET_S if args.dry_run else p.budget_s for p in PARTS}
    for item in args.budget:
        name, _, seconds = item.partition("=")
        if name not in budgets or not seconds.isdigit():
            ap.error(f"--budget {item!r}: PART=SECONDS, PART one of {', '.join(budgets)}")
        budgets[name] = int(seconds)
    return args, budgets


def run_parts(args, budgets: dict[str, int], env: dict) -> dict:
    """Each chosen part in turn, figures.json and figures.txt rewritten after each."""
    parts: dict = {}
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))
    with open(args.out / "gpu-check.log", "a") as log:
        for part in (p for p in PARTS if p.name in args.parts):
            result = work / f"{part.name}.{'xml' if part.name == 'tests' else 'json'}"
            budget = budgets[part.name]
            log.write(f"\n===== {part.name}: {part.what} (budget {budget} s)\n")
            log.flush()
            begin = log.tell()
            status, seconds = run_part(part_argv(part.name, args.dry_run, result), budget, log)
            parts[part.name] = {"status": status, "seconds": round(seconds, 1), "budget_s": budget,
                                "what": part.what}
            if part.name == "tests":
                with open(args.out / "gpu-check.log") as text:
                    text.seek(begin)
                    parts[part.name]["tests"] = junit_counts(result) if result.exists() else log_counts(text.read())
            elif result.exists():
                parts[part.name]["figures"] = json.loads(result.read_text())
            save(args.out, env, parts)
            print(f"gpu-check: {part.name}: {status} ({seconds:.1f} s)", file=sys.stderr)
    return parts


def main(argv=None) -> int:
    args, budgets = parse(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    env = environment(args.dry_run)
    save(args.out, env, {})
    problem = ("missing: " + ", ".join(env["missing"]) + " (carry build/gpu-wheels, made by scripts/prepare-gpu.sh; "
               "torch must be the machine's own CUDA build)") if env["missing"] else \
        None if args.dry_run or env.get("device") else f"torch {env['torch']} sees no CUDA device"
    if problem:
        print(f"gpu-check: cannot run: {problem}", file=sys.stderr)
        return 1
    print(f"gpu-check: {env.get('device') or 'CPU (dry run)'}, torch {env['torch']}, CUDA {env['cuda']}",
          file=sys.stderr)
    parts = run_parts(args, budgets, env)
    sys.stdout.write((args.out / "figures.txt").read_text())
    return 0 if all(p["status"] == "ok" for p in parts.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
