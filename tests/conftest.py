"""Shared fixtures: tiny real checkpoints built once per test session, and an in-process CLI runner."""

from __future__ import annotations

import io
import json
import os
import sys
from contextlib import redirect_stderr, redirect_stdout
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
os.environ.setdefault("NO_COLOR", "1")
os.environ.setdefault("HF_HUB_DISABLE_XET", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def json(self):
        return json.loads(self.out)

    def failed_checks(self) -> dict[str, str]:
        """name -> message of every failed check of a --json report."""
        return {c["name"]: c["message"] for c in self.json()["checks"] if c["status"] == "fail"}


def run_cli(*args: str) -> CliResult:
    """Run `dflash-convert ARGS` in-process through the real entry point (exit codes, error lines)."""
    from dflash_convert.cli import main

    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = ["dflash-convert", *map(str, args)]
    code = 0
    try:
        with redirect_stdout(out), redirect_stderr(err):
            main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.argv = argv
    return CliResult(code, out.getvalue(), err.getvalue())


@pytest.fixture(scope="session")
def cli():
    return run_cli


@pytest.fixture
def one_timing_round(monkeypatch):
    """The CLI's validate runs one round of its speedup measurement instead of three, for tests that assert
    nothing about the speedup: each round decodes the baseline prompts twice more (a third of a low-acceptance
    run's time). The options are the CLI's own, with that one library-only default changed."""
    from typing import Annotated

    import dflash_convert.cli.validate as cli_validate

    field = cli_validate.ValidateOptions.model_fields["timing_rounds"]

    class OneRound(cli_validate.ValidateOptions):
        timing_rounds: Annotated[int, *field.metadata] = 1  # its bound and flag declaration as they are

    monkeypatch.setattr(cli_validate, "ValidateOptions", OneRound)


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    """Random Qwen3 target: 8 layers, hidden 64, vocab 512."""
    from factories import make_target

    return make_target(tmp_path_factory.mktemp("target") / "target")


@pytest.fixture(scope="session")
def runtime_target(tiny_target):
    """The tiny target loaded by the runtime, shared: a test sets its capture and resets it before use, and
    undoes any other change it makes."""
    from dflash_runtime import load_target

    return load_target(tiny_target)


@pytest.fixture(scope="session")
def speculators_drafts(tmp_path_factory, tiny_target) -> dict[str, Path]:
    """Drafts saved by speculators 0.9.0 itself, one per shape users have."""
    from factories import make_speculators_draft

    root = tmp_path_factory.mktemp("drafts")
    return {
        "full": make_speculators_draft(root / "full", tiny_target),
        "pruned": make_speculators_draft(root / "pruned", tiny_target, draft_vocab=128),
        "legacy": make_speculators_draft(root / "legacy", tiny_target, legacy_save=True),
        "legacy_pruned": make_speculators_draft(root / "legacy_pruned", tiny_target, legacy_save=True, draft_vocab=96),
        "mixed": make_speculators_draft(root / "mixed", tiny_target, full_attention_indices=[0]),
        "non_causal": make_speculators_draft(root / "non_causal", tiny_target, sliding_window_non_causal=True),
        "all_full": make_speculators_draft(root / "all_full", tiny_target, full_attention_indices=[0, 1]),
        "last_layer": make_speculators_draft(root / "last_layer", tiny_target, aux_ids=(2, 5, 8), block_size=16),
        "dflash2": make_speculators_draft(root / "dflash2", tiny_target, algorithm="dflash2"),
        "bias_last_layer": make_speculators_draft(root / "bias_last_layer", tiny_target, aux_ids=(1, 4, 8),
                                                  attention_bias=True),
    }


@pytest.fixture(scope="session")
def family_drafts(tmp_path_factory, tiny_target) -> dict[str, Path]:
    """dflash2 and DSpark drafts saved by speculators 0.9.0's own classes (save_pretrained), random
    non-identity weights, tiny sizes: one per config shape the engines read differently."""
    from factories import make_speculators_draft

    root = tmp_path_factory.mktemp("family")
    shapes = {
        # dflash2: speculators' defaults (kernel 2, group 16, rank 256, top-k 16) and a second shape
        "dflash2": dict(algorithm="dflash2"),
        "dflash2_k3": dict(algorithm="dflash2", conv_kernel_size=3, conv_group_size=8, selector_rank=32,
                           selector_top_k=8, seed=2),
        # dspark: vanilla Markov head + confidence head over [hidden; markov] (speculators' defaults)
        "dspark": dict(algorithm="dspark", markov_rank=16),
        "dspark_gated": dict(algorithm="dspark", markov_rank=16, markov_head_type="gated", seed=3),
        "dspark_rnn": dict(algorithm="dspark", markov_rank=16, markov_head_type="rnn", seed=4),
        "dspark_plain_conf": dict(algorithm="dspark", markov_rank=16, confidence_head_with_markov=False, seed=5),
        "dspark_no_conf": dict(algorithm="dspark", markov_rank=16, enable_confidence_head=False, seed=6),
        "dspark_bonus_anchor": dict(algorithm="dspark", markov_rank=16, sample_from_anchor=False, seed=7),
        "dspark_pruned": dict(algorithm="dspark", markov_rank=16, draft_vocab=128, seed=8),
    }
    return {name: make_speculators_draft(root / name, tiny_target, **kw) for name, kw in shapes.items()}


# ----------------------------------------------------------------------------- the real vLLM engine's tests
# Marked processes.needs_vllm: skipped without a Python that imports vLLM, failed instead under
# DFLASH_REQUIRE_VLLM=1 (scripts/test.sh sets it, so .ci/run cannot pass without running them), and counted in
# one line at the end of the run.

REAL_ENGINE = pytest.StashKey[set]()


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_vllm: runs the real vLLM engine (a Python with vLLM: "
                            "DFLASH_VLLM_PYTHON or build/vllm-venv)")
    config.stash[REAL_ENGINE] = set()


def pytest_collection_finish(session):
    session.config.stash[REAL_ENGINE].update(item.nodeid for item in session.items
                                             if item.get_closest_marker("needs_vllm"))


def pytest_runtest_setup(item):
    if item.get_closest_marker("needs_vllm"):
        from processes import require_vllm

        require_vllm()


def real_engine_summary(stats: dict, marked: set[str]) -> str:
    """One line: how many marked tests ran (reached their call), passed and failed; how many could not run (an
    error before the call: under DFLASH_REQUIRE_VLLM=1, no vLLM) and were skipped."""
    called: dict[str, bool] = {}  # nodeid -> passed (its call and teardown)
    unrun, skipped = set(), set()
    for key in ("passed", "failed", "error", "skipped"):
        for report in stats.get(key, []):
            nodeid = getattr(report, "nodeid", None)
            if nodeid not in marked:
                continue
            if key == "skipped":
                skipped.add(nodeid)
            elif report.when == "call" or (report.when == "teardown" and nodeid in called):
                called[nodeid] = called.get(nodeid, True) and key == "passed"
            elif key != "passed":
                unrun.add(nodeid)
    passed = sum(called.values())
    return (f"real vLLM engine tests: {len(called)} ran ({passed} passed, {len(called) - passed} failed), "
            f"{len(unrun - set(called))} could not run, {len(skipped - set(called))} skipped, of {len(marked)} "
            "collected")


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    marked = config.stash.get(REAL_ENGINE, set())
    if marked:
        terminalreporter.write_line(real_engine_summary(terminalreporter.stats, marked))


@pytest.fixture(autouse=True)
def fresh_compile_caches():
    """Each test compiles from scratch: torch.compile's caches are per function and per process, and after
    8 shapes of one function (other tests' block sizes) dynamo refuses a 9th under fullgraph=True, a failure
    no single run of the tool meets."""
    yield
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is not None:
        dynamo.reset()


# ----------------------------------------------------------------------------- the loopback Hub
# (tests/hub/ makes hub_env autouse; elsewhere a test asks for it, e.g. validate's prompt sets)

@pytest.fixture
def hub():
    """A Hub-compatible server on 127.0.0.1 (tests/hub_server.py), in memory, accepting hub_server.TOKEN."""
    from hub_server import TOKEN, HubServer

    server = HubServer(valid_token=TOKEN, lfs_threshold=64 * 1024).start()
    yield server
    server.stop()


@pytest.fixture
def forget_tokens():
    """The tokens a test made the process remember (for redaction) are forgotten after it: other
    tests' output must not lose text that happened to match a generated token."""
    from dflash_convert.hub import tokens

    saved = set(tokens._forms)
    yield
    tokens._forms.clear()
    tokens._forms.update(saved)


@pytest.fixture
def hub_env(hub, forget_tokens, tmp_path, monkeypatch) -> Path:
    """Per-test cache, token and endpoint of the `hub` server: in the environment (for subprocesses) and in
    the client's constants, which it reads from the environment once, at import. Returns HF_HOME."""
    from huggingface_hub import constants

    from hub_server import TOKEN

    home = tmp_path / "hf_home"
    monkeypatch.setattr(constants, "ENDPOINT", hub.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    monkeypatch.setenv("HF_HUB_DISABLE_XET", "1")
    monkeypatch.setenv("NO_COLOR", "1")
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))  # never a developer's stored token
    return home
