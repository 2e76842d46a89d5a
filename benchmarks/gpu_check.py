#!/usr/bin/env python
"""The GPU check's parts, run by scripts/gpu-check.sh: the CUDA tests, then the GPU figures, each part in its own
time budget. A part that overruns is stopped (its whole process group) and the next one runs, so one slow part
cannot eat a short GPU loan. After every part, OUT/figures.json (every figure, every part's status, every failed
test's message and first traceback lines) and OUT/figures.txt (a short table, the failures, the goals beside the
figures) are rewritten, and every part's output goes to OUT/gpu-check.log: three files, whatever happens.

The budgets are one loan's (an H200: 15 minutes of device time, start-up included): the default parts add up to
500 s, under 9 minutes with the wheels' install (about 400 s expected: a part ends when its children do). What does not fit is left to a second loan: the CUDA tests
marked beyond_one_loan (--all-tests) and the parts in EXTRA_PARTS (--parts NAME).

--dry-run runs the same parts on the CPU at tiny shapes, eager only, in about a minute of CPU time (the tests
part then skips every CUDA test: it checks that they are still collected).

    python benchmarks/gpu_check.py OUT [--dry-run] [--parts tests steps ...] [--zlab DIR]  (through gpu-check.sh)
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
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "benchmarks"
# What the CUDA tests are: every test these files parametrize over the cuda device (ids hold "cuda"), less those
# marked beyond_one_loan (tests/conftest.py registers the mark; docs/gpu.md lists them). They run as shards in
# parallel, one pytest process each (the machine has 16 cores: compiling and the tiny models' host work are
# CPU-bound, the GPU is nearly idle), each shard's files in order of value: what no loan has run yet first
# (compiled steps in bf16, validate in bf16), then what failed (the hybrid target), then what passed before.
TEST_SHARDS = [
    ["tests/runtime/test_runtime_compile.py"],
    ["tests/runtime/test_targets.py", "tests/runtime/test_runtime_target.py"],
    ["tests/validate/test_validate.py", "tests/runtime/test_runtime_dflash2.py", "tests/runtime/test_runtime_dspark.py",
     "tests/runtime/test_runtime_decode.py", "tests/runtime/test_runtime_attention.py"],
]
TEST_FILES = [f for shard in TEST_SHARDS for f in shard]
BEYOND_ONE_LOAN = "beyond_one_loan"  # the pytest mark of CUDA tests left to a second loan (--all-tests)
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
    budget_s: int  # on one H200, estimated from the H100 (2026-11-28) and H200 runs: see docs/gpu.md
    what: str


PARTS = [
    Part("tests", 150, "CUDA tests in 3 parallel shards (bf16 at the tests' stated tolerances, compiled steps "
                       "(CUDA graphs) vs eager, every target kind vs generate, validate in bf16, hybrid rollback)"),
    Part("steps", 110, "draft steps (dflash, dflash2, DSpark), Qwen3-8B-DFlash-b16 shape: eager cold and warm, "
                       "compiled (CUDA graphs) vs the weight-read floor, torch.profiler's top kernels per step"),
    Part("zlab", 110, "z-lab's dflash_generate vs ours (eager, compiled) vs generate alone: bundled pair (non-causal) "
                     "and an 8B-shaped random pair; outputs equal, tau, ms per token"),
    Part("validate", 85, "validate end to end, 8B-shaped random pair (36-layer target): wall time, peak GPU memory"),
    Part("hybrid", 45, "hybrid (Qwen3.5 layout) verify step with rollback vs attention-only of the same size, eager"),
]
# Not in one loan's default run (--parts NAME): the compiled hybrid and the verify step (compiles of a 36-layer
# target take minutes; verify was measured on the H100: 37.4 ms eager, 10.6 ms compiled)
EXTRA_PARTS = [
    Part("verify", 105, "verify step of a Qwen3-8B-shaped random target (block 16 after 512), eager and compiled"),
    Part("hybrid_compiled", 300, "the hybrid part, compiled (36-layer compiles: minutes)"),
]
# The budgets are the GPU loan's: a dry run is not timed (a loaded CPU must not fail it), only bounded.
DRY_RUN_BUDGET_S = 900
# The goals on the GPU (issue 45): (part, what, how to read it from the part's figures (the JSON its script
# wrote), at most)
GOALS = [
    ("steps", "compiled draft step / weight-read floor",
     lambda f: f["dflash"]["compiled_ms"] / f["dflash"]["floor_ms"], 1.3),
    ("steps", "dflash2 / dflash draft step, compiled", lambda f: f["dflash2"]["compiled_ratio"], 1.15),
    ("steps", "DSpark / dflash draft step, compiled", lambda f: f["dspark"]["compiled_ratio"], 1.15),
    ("zlab", "8B-shaped pair at tau 1: ms per token / weights-read-once floor",
     lambda f: f["8b"]["ours_compiled"]["ms_per_token"] / f["8b"]["floor_ms_per_token"], 2.0),
    ("hybrid", "hybrid with rollback / attention-only, compiled",
     lambda f: f["hybrid"]["compiled"]["rollback_vs_attention"], 1.2),
    ("validate", "validate end to end, 8B-shaped pair, wall s",
     lambda f: f["8b-shaped pair, all levels"]["wall_s"], 60.0),
]


def part_argv(name: str, dry: bool, json_out: Path, zlab: Path | None = None) -> list[str]:
    """The child command of one part (after the interpreter); the tests part's shards: tests_argv."""
    if name == "validate":
        size = ["--target-shape", "tiny", "--device", "cpu", "--size-levels", "static,end_to_end"] if dry else \
            ["--target-shape", "8b", "--device", "cuda"]
        return [str(BENCH / "validate_bench.py"), "--skip-8b", "--skip-pair", *size, "--json", str(json_out)]
    if name == "steps":
        return [str(BENCH / "profile_step.py"), *(["--dry-run"] if dry else []), "--json", str(json_out)]
    if name == "zlab":
        # the dry run leaves our compiled runtime out (minutes of compiling on a CPU; the compile tests cover it)
        return [str(BENCH / "zlab_bench.py"),
                *(["--dry-run", "--methods", "generate", "zlab", "ours_eager"] if dry else ["--pairs", "bundled", "8b"]),
                *(["--zlab", str(zlab)] if zlab else []), "--json", str(json_out)]
    sizes = ["--shape", "small", "--device", "cpu", "--modes", "eager", "--steps", "1", "--threads", "1"] if dry \
        else ["--shape", "8b", "--device", "cuda", "--modes", "eager", *([] if name == "hybrid" else ["compiled"]),
              "--steps", "20"]
    return [str(BENCH / "runtime_bench.py"), "--parts", "hybrid" if name.startswith("hybrid") else name, *sizes,
            "--json", str(json_out)]


def tests_argv(files: list[str], all_tests: bool) -> list[str]:
    """One shard of the tests part: pytest with the recorder plugin (gpu_check_plugin) over `files`."""
    marks = [] if all_tests else ["-m", f"not {BEYOND_ONE_LOAN}"]
    return ["-m", "pytest", "-v", "-p", "no:cacheprovider", "-p", "gpu_check_plugin", "--durations=10", "-k", "cuda",
            *marks, *files]


def run_part(argvs: list[list[str]], budget_s: int, logs: list, envs: list[dict] | None = None
             ) -> tuple[str, float]:
    """Run the part's children side by side, each in a process group of its own (and its own environment, if
    given); stop every group still running at the budget. (status, seconds)."""
    t = time.perf_counter()
    children = [subprocess.Popen([sys.executable, *argv], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                                 start_new_session=True, env=env)
                for argv, log, env in zip(argvs, logs, envs or [None] * len(argvs))]
    codes, stopped = [], False
    for child in children:
        try:
            codes.append(child.wait(timeout=max(budget_s - (time.perf_counter() - t), 0.1)))
        except subprocess.TimeoutExpired:
            stopped = True
            for sig in (signal.SIGTERM, signal.SIGKILL):
                try:
                    os.killpg(child.pid, sig)
                    child.wait(timeout=10)
                    break
                except (ProcessLookupError, subprocess.TimeoutExpired):
                    continue
    if stopped:
        return f"stopped at its {budget_s} s budget", time.perf_counter() - t
    failed = [code for code in codes if code != 0]
    return ("ok" if not failed else f"failed (exit {failed[0]})"), time.perf_counter() - t


def recorded_tests(jsonl: list[Path]) -> dict:
    """passed / failed / skipped, each failure's message and first traceback lines, the slowest tests with the
    graphs torch.compile built in each, and the tests collected but never reached (a shard stopped at the
    budget), from the lines gpu_check_plugin wrote."""
    counts: dict = {"passed": 0, "failed": 0, "skipped": 0, "failures": [], "failure_details": [], "not_reached": [],
                    "notes": []}
    done, collected = [], []
    for path in jsonl:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if "collected" in record:
                collected += record["collected"]
            else:
                done.append(record)
    for record in done:
        counts["notes"].extend({"test": record["test"], "note": note} for note in record.get("notes", []))
        if record["outcome"] in ("passed", "skipped"):
            counts[record["outcome"]] += 1
            continue
        counts["failed"] += 1
        counts["failures"].append(record["test"])
        counts["failure_details"].append({k: record.get(k) for k in ("test", "outcome", "where", "message",
                                                                      "traceback")})
    seen = {record["test"] for record in done}
    counts["not_reached"] = [test for test in collected if test not in seen]
    counts["slowest"] = [{"test": r["test"], "seconds": r["seconds"], "compiled_graphs": r.get("compiled_graphs", 0)}
                         for r in sorted(done, key=lambda r: -r["seconds"])[:10]]
    counts["compiled_graphs"] = sum(r.get("compiled_graphs", 0) for r in done)
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


def notes(value, path: str):
    """figures.txt's lines for the words among a part's figures: each `bound` and non-ok `status`, each profile's
    top kernels."""
    if not isinstance(value, dict):
        return
    for key, inner in value.items():
        here = f"{path}.{key}"
        if key == "bound" or (key == "status" and inner != "ok"):
            yield f"  {here}: {inner}"
        elif key == "top" and isinstance(inner, list):
            yield from (f"  {here}: {k['ms_per_step']:8.3f} ms x{k['calls_per_step']:<4} {k['kind']:17} "
                        f"{k['name'][:80]}" for k in inner)
        else:
            yield from notes(inner, here)


def table(env: dict, parts: dict) -> str:
    lines = [f"GPU check{' (dry run on CPU, tiny shapes)' if env['dry_run'] else ''}: {env.get('device') or 'no GPU'}, "
             f"torch {env.get('torch')}, CUDA {env.get('cuda')}, python {env['python']}, "
             f"flash_attn {env.get('flash_attn') or 'absent'}, fla {env.get('fla') or 'absent'}", ""]
    for name, p in parts.items():
        lines.append(f"{name:9} {p['status']:34} {p['seconds']:6.1f} s of {p['budget_s']} s  {p['what']}")
        tests = p.get("tests")
        if tests:
            lines += test_lines(tests)
    lines += ["", "figures (ms: median per step; _s: seconds; _bytes; _GBps; ratios):"]
    lines += [f"  {name}.{path:66} {value:12.4g}" for name, p in parts.items()
              for path, value in leaves(p.get("figures", {}))]
    lines += ["", "what bounds each step, the top kernels (torch.profiler), and what did not run:"]
    lines += [line for name, p in parts.items() for line in notes(p.get("figures", {}), name)]
    lines += ["", "goals:", *goal_rows(parts)]
    return "\n".join(lines) + "\n"


def test_lines(tests: dict) -> list[str]:
    """The tests part in figures.txt: the counts, every failure with its message and first traceback lines, the
    tests never reached, the slowest tests with the graphs each compiled."""
    lines = [f"          {tests['passed']} passed, {tests['failed']} failed, {tests['skipped']} skipped"
             + (f", {len(tests['not_reached'])} not reached" if tests.get("not_reached") else "")
             + (f"; {tests['compiled_graphs']} graphs compiled" if "compiled_graphs" in tests else "")]
    details = {d["test"]: d for d in tests.get("failure_details", [])}
    for name in tests["failures"]:
        lines.append(f"          FAILED {name}")
        detail = details.get(name)
        if detail:
            lines.append(f"            {detail['outcome']} at {detail['where']}: {detail['message']}")
            lines += [f"            | {line}" for line in detail["traceback"]]
    lines += [f"          note {n['test']}: {n['note']}" for n in tests.get("notes", [])]
    lines += [f"          not reached: {name}" for name in tests.get("not_reached", [])]
    lines += [f"          slowest: {t['seconds']:7.1f} s, {t['compiled_graphs']} graphs  {t['test']}"
              for t in tests.get("slowest", []) if t["seconds"] >= 1]
    return lines


def save(out: Path, env: dict, parts: dict) -> None:
    (out / "figures.json").write_text(json.dumps({"environment": env, "parts": parts}, indent=1) + "\n")
    (out / "figures.txt").write_text(table(env, parts))


def parse(argv) -> tuple[argparse.Namespace, dict[str, int]]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path, help="directory for figures.json, figures.txt and gpu-check.log")
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny shapes, eager only")
    ap.add_argument("--parts", nargs="+", choices=[p.name for p in PARTS + EXTRA_PARTS], default=[p.name for p in PARTS])
    ap.add_argument("--all-tests", action="store_true", help=f"the tests part runs the tests marked {BEYOND_ONE_LOAN} "
                    "too (a second loan's run: give it --budget tests=400)")
    ap.add_argument("--zlab", type=Path, default=ROOT / "build" / "zlab-dflash",
                    help="a copy of z-lab/dflash (a directory holding dflash/model.py) for the zlab part; scripts/"
                    "prepare-gpu.sh puts one in build/zlab-dflash (default), a carried path on the GPU machine")
    ap.add_argument("--budget", nargs="+", default=[], metavar="PART=SECONDS",
                    help="another budget for a part (a rerun of one part that overran, say)")
    args = ap.parse_args(argv)
    budgets = {p.name: DRY_RUN_BUDGET_S if args.dry_run else p.budget_s for p in PARTS + EXTRA_PARTS}
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
        for part in (p for p in PARTS + EXTRA_PARTS if p.name in args.parts):
            budget = budgets[part.name]
            log.write(f"\n===== {part.name}: {part.what} (budget {budget} s)\n")
            log.flush()
            parts[part.name] = {"what": part.what, "budget_s": budget}
            if part.name == "tests":
                status, seconds, parts[part.name]["tests"] = run_tests(work, budget, args.all_tests, log)
            else:
                result = work / f"{part.name}.json"
                zlab = args.zlab if args.zlab and args.zlab.exists() else None
                status, seconds = run_part([part_argv(part.name, args.dry_run, result, zlab)], budget, [log])
                if result.exists():
                    parts[part.name]["figures"] = json.loads(result.read_text())
            parts[part.name].update(status=status, seconds=round(seconds, 1))
            save(args.out, env, parts)
            print(f"gpu-check: {part.name}: {status} ({seconds:.1f} s)", file=sys.stderr)
    return parts


def run_tests(work: Path, budget: int, all_tests: bool, log) -> tuple[str, float, dict]:
    """The tests part: its shards side by side, each writing its own log (appended to gpu-check.log after) and
    its own record of each test as it finishes."""
    records = [work / f"tests-{i}.jsonl" for i in range(len(TEST_SHARDS))]
    shard_logs = [open(work / f"tests-{i}.log", "w") for i in range(len(TEST_SHARDS))]  # noqa: SIM115
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(BENCH), os.environ.get("PYTHONPATH")])))
    try:
        argvs, envs = [], []
        for files, record in zip(TEST_SHARDS, records):
            argvs.append(tests_argv(files, all_tests))
            envs.append(dict(env, GPU_CHECK_TESTS_JSONL=str(record)))
        status, seconds = run_part(argvs, budget, shard_logs, envs)
    finally:
        for i, shard_log in enumerate(shard_logs):
            shard_log.close()
            log.write(f"--- tests shard {i + 1}: {' '.join(TEST_SHARDS[i])}\n{(work / f'tests-{i}.log').read_text()}")
        log.flush()
    counts = recorded_tests(records)
    if not any(r.exists() for r in records):  # the plugin did not load: count from pytest -v's lines
        counts = log_counts("".join((work / f"tests-{i}.log").read_text() for i in range(len(TEST_SHARDS))))
    return status, seconds, counts


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
