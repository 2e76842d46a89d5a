"""scripts/gpu-check.sh, the one call a short GPU loan runs: its dry run goes through every part on this CPU
at tiny shapes (so the script cannot rot unnoticed between loans), a part that overruns its budget is
stopped with its whole process group and the next part still runs, and the goals are read off the figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import gpu_check  # noqa: E402


def test_dry_run_runs_every_part_and_writes_every_figure(tmp_path):
    out = tmp_path / "out"
    env = dict(os.environ, PYTHON=sys.executable)
    p = subprocess.run(["bash", str(ROOT / "scripts" / "gpu-check.sh"), "--dry-run", str(out)], env=env,
                       capture_output=True, text=True, timeout=3600)
    log = (out / "gpu-check.log").read_text() if (out / "gpu-check.log").exists() else ""
    assert p.returncode == 0, p.stderr[-2000:] + log[-4000:]
    assert sorted(os.listdir(out)) == ["figures.json", "figures.txt", "gpu-check.log"]  # what a loan brings back
    report = json.loads((out / "figures.json").read_text())
    assert report["environment"]["dry_run"] is True and report["environment"]["missing"] == []
    parts = report["parts"]
    assert list(parts) == [part.name for part in gpu_check.PARTS]
    assert {name: part["status"] for name, part in parts.items()} == {name: "ok" for name in parts}
    tests = parts["tests"]["tests"]
    assert tests["skipped"] > 0 and tests["failed"] == tests["passed"] == 0  # every CUDA test collected, skipped here
    assert tests["not_reached"] == []  # every shard ran to its end
    figures = {name: part["figures"] for name, part in parts.items() if name != "tests"}
    steps = figures["steps"]
    assert steps["dflash"]["eager_ms"] > 0 and steps["dflash"]["eager_first_round_ms"] > 0
    assert steps["dflash"]["floor_ms"] > 0 and steps["dflash"]["profile"]["eager"]["top"]
    assert steps["dflash2"]["eager_ratio"] > 0 and steps["dspark"]["eager_ratio"] > 0
    for pair, prompts in (("bundled", 2), ("small", 1)):  # ours equals generate on the same weights and prompts
        assert figures["zlab"][pair]["ours_eager"]["equal"] == prompts
        assert figures["zlab"][pair]["zlab"].get("equal", prompts) == prompts  # z-lab's loop, where a copy is here
    assert figures["zlab"]["bundled"]["ours_eager"]["tau"] > 3  # the trained pair accepts
    assert figures["hybrid"]["hybrid"]["eager"]["rollback_vs_attention"] > 0
    run = figures["validate"]["tiny-shaped pair, static,end_to_end"]
    assert run["wall_s"] > 0 and run["levels"] == ["static", "end_to_end"] and run["device"] == "cpu"
    table = (out / "figures.txt").read_text()
    assert all(f"\n{name} " in table for name in parts) and table.count("not measured") == len(gpu_check.GOALS)
    assert "steps.dflash.profile.eager.bound: CPU operators" in table


def test_a_part_over_its_budget_is_stopped_with_its_children_and_the_next_part_runs(tmp_path, monkeypatch):
    pid_file = tmp_path / "grandchild.pid"
    slow = ["-c", f"import subprocess, sys, time; c = subprocess.Popen([sys.executable, '-c', 'import time; "
            f"time.sleep(60)']); open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(60)"]
    quick = ["-c", "import json, sys; open(sys.argv[-1], 'w').write(json.dumps({'x': 1}))"]
    monkeypatch.setattr(gpu_check, "PARTS", [gpu_check.Part("step", 600, "slow"), gpu_check.Part("verify", 30, "q")])
    monkeypatch.setattr(gpu_check, "part_argv",
                        lambda name, dry, out, zlab: [*(slow if name == "step" else quick), str(out)])
    monkeypatch.setattr(gpu_check, "environment", lambda dry: {"python": "3", "dry_run": dry, "missing": [],
                                                               "torch": "2", "cuda": "13", "device": "a GPU"})
    t = time.perf_counter()
    assert gpu_check.main([str(tmp_path / "out"), "--budget", "step=2"]) == 1  # a part did not finish: exit 1
    assert time.perf_counter() - t < 30
    parts = json.loads((tmp_path / "out" / "figures.json").read_text())["parts"]
    assert parts["step"]["status"] == "stopped at its 2 s budget" and "figures" not in parts["step"]
    assert parts["verify"]["status"] == "ok" and parts["verify"]["figures"] == {"x": 1}
    grandchild = int(pid_file.read_text())
    for _ in range(50):  # the overrunning part's own children went with it
        if not alive(grandchild):
            break
        time.sleep(0.1)
    assert not alive(grandchild)


def alive(pid: int) -> bool:
    """Running (a zombie left for a parent that never reaps it does not count)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_test_run_stopped_at_its_budget_is_counted_from_its_log():
    text = ("tests/test_a.py::t[cuda] PASSED     [ 10%]\ntests/test_a.py::u[cpu-cuda] FAILED  [ 20%]\n"
            "tests/test_b.py::v[cuda] SKIPPED (no CUDA device)  [ 30%]\nsome other line PASSED\n")
    assert gpu_check.log_counts(text) == {"passed": 1, "failed": 1, "skipped": 1, "stopped_early": True,
                                          "failures": ["tests/test_a.py::u[cpu-cuda]"]}


def test_a_budget_names_a_part_and_whole_seconds(tmp_path, capsys):
    for bad in ("stpe=20", "step=1.5", "step"):
        with pytest.raises(SystemExit) as exit_:
            gpu_check.main([str(tmp_path), "--budget", bad])
        assert exit_.value.code == 2
        assert f"--budget {bad!r}: PART=SECONDS, PART one of tests, steps" in capsys.readouterr().err


def test_missing_packages_stop_the_check_before_any_part(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu_check, "NEEDED", [*gpu_check.NEEDED, "no_such_package_here"])
    assert gpu_check.main([str(tmp_path), "--dry-run"]) == 1
    assert "cannot run: missing: no_such_package_here (carry build/gpu-wheels" in capsys.readouterr().err
    assert json.loads((tmp_path / "figures.json").read_text())["parts"] == {}


def test_goals_are_read_off_the_figures():
    """The figures as the parts' scripts write them (profile_step.py, zlab_bench.py, validate_bench.py --json)."""
    parts = {"steps": {"figures": {"dflash": {"compiled_ms": 3.0, "floor_ms": 2.5}, "dflash2": {"compiled_ratio": 1.2}}},
             "zlab": {"figures": {"8b": {"floor_ms_per_token": 4.8, "ours_compiled": {"ms_per_token": 9.0}}}},
             "validate": {"figures": {"8b-shaped pair, all levels": {"wall_s": 41.0}}}}
    rows = gpu_check.goal_rows(parts)
    assert [row.split(": ")[-1] for row in rows] == ["met", "MISSED", "not measured", "met", "not measured", "met"]
    assert "    1.20  goal <= 1.15" in rows[1]


def test_a_failing_cuda_test_comes_back_with_its_message_and_traceback(tmp_path):
    """The tests part's record (gpu_check_plugin) holds each failure's message and first traceback lines, and what
    a passing test recorded (a near-tie's figures), and figures.txt shows them: a loan brings back figures.txt and figures.json, not always the log."""
    (tmp_path / "test_x.py").write_text(
        "def helper(v):\n    assert v == 3, f'logits {v} and 3 part'\n\n"
        "def test_near_tie_cuda(record_property):\n    record_property('near_tie', 'gap 3 ulps, moved 4')\n\n"
        "def test_fails_cuda():\n    helper(2)\n\ndef test_passes_cuda():\n    pass\n\n"
        "def test_never_reached_cuda():\n    pass\n")
    record = tmp_path / "tests.jsonl"
    env = dict(os.environ, GPU_CHECK_TESTS_JSONL=str(record),
               PYTHONPATH=os.pathsep.join([str(ROOT / "benchmarks"), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "gpu_check_plugin",
                    "-x", str(tmp_path / "test_x.py")], env=env, cwd=tmp_path, capture_output=True, timeout=300)
    tests = gpu_check.recorded_tests([record, tmp_path / "a-shard-that-never-started.jsonl"])
    assert (tests["passed"], tests["failed"]) == (1, 1) and tests["failures"] == ["test_x.py::test_fails_cuda"]
    assert tests["notes"] == [{"test": "test_x.py::test_near_tie_cuda", "note": "near_tie: gap 3 ulps, moved 4"}]
    assert tests["not_reached"] == ["test_x.py::test_passes_cuda", "test_x.py::test_never_reached_cuda"]
    detail = tests["failure_details"][0]
    assert detail["message"].startswith("AssertionError: logits 2 and 3 part") and detail["where"].endswith(":2")
    assert any("test_x.py:8" in line for line in detail["traceback"])  # the frames, the test's own first
    assert any(line.startswith("E ") and "logits 2 and 3 part" in line for line in detail["traceback"])
    text = gpu_check.table({"dry_run": False, "python": "3", "device": "a GPU"},
                           {"tests": {"status": "ok", "seconds": 1.0, "budget_s": 150, "what": "CUDA tests",
                                      "tests": tests}})
    assert "FAILED test_x.py::test_fails_cuda\n            failed at " in text and "logits 2 and 3 part" in text
    assert "not reached: test_x.py::test_never_reached_cuda" in text
    assert "note test_x.py::test_near_tie_cuda: near_tie: gap 3 ulps, moved 4" in text  # a passing test's figures


def test_the_one_loan_run_fits_its_budget_and_leaves_the_long_tests_to_a_second():
    """The default parts fit one loan (500 s of budgets, under 9 minutes with the install: a loan is 15 minutes with start-up), and the
    tests part deselects the tests marked beyond_one_loan unless asked."""
    assert sum(p.budget_s for p in gpu_check.PARTS) <= 500
    assert ["-m", "not beyond_one_loan"] == gpu_check.tests_argv(["t.py"], False)[-3:-1]
    assert "beyond_one_loan" not in " ".join(gpu_check.tests_argv(["t.py"], True))
    assert sorted(f for shard in gpu_check.TEST_SHARDS for f in shard) == sorted(set(gpu_check.TEST_FILES))
