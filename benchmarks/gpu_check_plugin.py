"""A pytest plugin for the GPU check's tests part (pytest -p gpu_check_plugin, benchmarks/ on the path): one JSON
line per test as it finishes, written and flushed at once, to the file GPU_CHECK_TESTS_JSONL names. A run stopped
at its budget (its whole process group killed, so pytest writes no report of its own) still leaves every finished
test's outcome, how long it took, how many graphs torch.compile built in it, what it recorded with pytest's
record_property (a near-tie's logits and noise), and for a failure its message and the first lines of its traceback: what a short GPU loan must bring back in figures.json / figures.txt.

The first line lists every collected test id ("collected"), so the check can name the tests never reached."""

from __future__ import annotations

import json
import os
import sys

import pytest

TRACEBACK_LINES = 12  # of each failure's traceback: where it failed and the assertion's E lines
MESSAGE_CHARS = 600


class Recorder:
    def __init__(self, path: str):
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 (kept open for the session; line-buffered)
        self.tests: dict[str, dict] = {}

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        self.write({"collected": [item.nodeid for item in items]})

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        graphs = compiled_graphs()
        yield
        record = self.tests.pop(item.nodeid, None)
        if record is not None:
            record["compiled_graphs"] = compiled_graphs() - graphs
            self.write(record)

    def pytest_runtest_logreport(self, report):
        record = self.tests.setdefault(report.nodeid, {"test": report.nodeid, "outcome": "passed", "seconds": 0.0})
        record["seconds"] = round(record["seconds"] + report.duration, 2)
        if report.when == "call" and report.user_properties:  # what a passing test recorded (a near-tie's figures)
            record["notes"] = [f"{key}: {value}"[:MESSAGE_CHARS] for key, value in report.user_properties]
        if report.failed:
            record["outcome"] = "failed" if report.when == "call" else f"error in {report.when}"
            record.update(failure(report))
        elif report.skipped and record["outcome"] == "passed":
            record["outcome"] = "skipped"
            if isinstance(report.longrepr, tuple):  # (path, line, reason)
                record["message"] = str(report.longrepr[2])


def compiled_graphs() -> int:
    """Graphs torch.compile has built in this process so far (dynamo's count; 0 before anything compiles)."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])


def failure(report) -> dict:
    """The failure's one-line message and the first lines of its traceback (each frame's file:line and the
    assertion's E lines), short enough for figures.txt."""
    longrepr = report.longrepr
    crash = getattr(longrepr, "reprcrash", None)
    message = crash.message if crash is not None else (str(longrepr).strip().splitlines() or [""])[-1]
    lines: list[str] = []
    entries = getattr(getattr(longrepr, "reprtraceback", None), "reprentries", None)
    if entries:
        for entry in entries:
            where = getattr(entry, "reprfileloc", None)
            if where is not None:
                lines.append(f"{where.path}:{where.lineno}: {where.message}")
            lines += [line for line in getattr(entry, "lines", []) if line.startswith("E ")]
    else:
        lines = str(longrepr).splitlines()
    return {"message": str(message)[:MESSAGE_CHARS], "traceback": [line[:300] for line in lines[:TRACEBACK_LINES]],
            "where": f"{crash.path}:{crash.lineno}" if crash is not None else ""}


def pytest_configure(config):
    path = os.environ.get("GPU_CHECK_TESTS_JSONL")
    if path:
        config.pluginmanager.register(Recorder(path), "gpu_check_recorder")
