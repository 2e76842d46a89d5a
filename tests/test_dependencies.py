"""The `test` extra in pyproject.toml is the one statement of what the tests need: `pip install -e '.[test]'`
plus `pip install --no-deps speculators==0.9.0` must give an environment in which the suite collects.

Checked from the installed packages' metadata: every distribution the tests import, and every requirement
of speculators (installed without its dependencies) that speculators imports, is named by the project or
its runtime/test extras, or required by something they name.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import re
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

tomllib = pytest.importorskip("tomllib")

ROOT = Path(__file__).resolve().parents[1]
PROJECT = "dflash-convert"
# speculators 0.9.0 requirements left out on purpose (distribution: the module it would be imported as):
# the torchvision/torchaudio pins replace a CPU torch, and speculators imports none of the three
NOT_INSTALLED = {"torchvision": "torchvision", "torchaudio": "torchaudio", "protobuf": "google.protobuf"}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_by_the_test_extra() -> set[str]:
    """Distributions `pip install -e '.[test]'` installs: the project's requirements with its test extra
    (read from pyproject.toml, not from a possibly stale installed copy) and, transitively, theirs."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    todo = [Requirement(f"{PROJECT}[test]")]
    seen: set[tuple[str, frozenset[str]]] = set()
    while todo:
        req = todo.pop()
        key = (norm(req.name), frozenset(req.extras))
        if key in seen:
            continue
        seen.add(key)
        if key[0] == PROJECT:
            todo += [Requirement(r) for r in project["dependencies"]]
            todo += [Requirement(r) for extra in req.extras for r in extras[extra]]
            continue
        for spec in md.requires(req.name) or []:  # not installed: raises, and the test says which
            dep = Requirement(spec)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in {"", *req.extras}):
                todo.append(dep)
    return {name for name, _ in seen}


def imported_modules(files) -> set[str]:
    """Top-level names of the modules these files import anywhere (inside functions too)."""
    names = set()
    for file in files:
        for node in ast.walk(ast.parse(Path(file).read_text(), str(file))):
            if isinstance(node, ast.Import):
                names |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
    return names


def test_the_test_extra_installs_every_distribution_the_tests_import():
    installed = installed_by_the_test_extra()
    local = {p.stem for d in ("tests", "benchmarks") for p in (ROOT / d).glob("*.py")}
    local |= {"dflash_convert", "dflash_runtime"}
    top = {name.partition(".")[0] for name in imported_modules((ROOT / "tests").glob("*.py"))}
    by_module = md.packages_distributions()
    missing = {}
    for module in sorted(top - local - set(sys.stdlib_module_names)):
        dists = {norm(d) for d in by_module.get(module, [])}
        if not dists & (installed | {"speculators"}):
            missing[module] = sorted(dists) or "not installed"
    assert not missing, f"tests import modules the test extra does not install: {missing}"


def test_the_test_extra_installs_what_speculators_imports():
    """speculators is installed with --no-deps: the extra must bring each of its requirements but the three
    it never imports (and those it must not bring)."""
    dist = md.distribution("speculators")
    assert dist.version == "0.9.0"
    needs = {norm(Requirement(r).name) for r in dist.requires or []
             if Requirement(r).marker is None or Requirement(r).marker.evaluate({"extra": ""})}
    assert set(NOT_INSTALLED) <= needs
    missing = sorted(needs - set(NOT_INSTALLED) - installed_by_the_test_extra())
    assert not missing, f"speculators 0.9.0 requires {missing}, which the test extra does not install"
    sources = [p for p in dist.files if p.suffix == ".py"]
    imported = imported_modules(p.locate() for p in sources)
    used = sorted(m for m in NOT_INSTALLED.values() if any(i == m or i.startswith(m + ".") for i in imported))
    assert not used, f"speculators imports {used}: it can no longer be installed without them"
