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


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory) -> Path:
    """Random Qwen3 target: 8 layers, hidden 64, vocab 512."""
    from factories import make_target

    return make_target(tmp_path_factory.mktemp("target") / "target")


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
