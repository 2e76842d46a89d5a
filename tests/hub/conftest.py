"""The Hub tests' fixtures: every test here runs against its own loopback Hub (tests/conftest.py's hub and
hub_env), with a speculators draft whose verifier is a Hub id."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

TARGET_ID = "test-org/tiny-qwen3"  # the drafts' verifier, as a Hub id


@pytest.fixture(autouse=True)
def hub_env(hub_env) -> Path:
    """tests/conftest.py's hub_env, for every test of this folder."""
    return hub_env


@pytest.fixture(scope="session")
def hub_draft(tmp_path_factory, tiny_target) -> Path:
    """A speculators-format draft saved by speculators 0.9.0, its verifier renamed to a Hub id."""
    from factories import make_speculators_draft

    path = make_speculators_draft(tmp_path_factory.mktemp("hub") / "draft", tiny_target)
    cfg = json.loads((path / "config.json").read_text())
    cfg["speculators_config"]["verifier"]["name_or_path"] = TARGET_ID
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    return path


@pytest.fixture
def draft(hub_draft, tmp_path) -> Path:
    """A private copy per test (push writes README.md into it)."""
    return Path(shutil.copytree(hub_draft, tmp_path / "draft"))
