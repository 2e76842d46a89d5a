"""The layering the project promises: bottom (format models + checkpoint I/O) -> runtime -> convert /
validate / hub -> CLI; format knowledge only in configs.py and mapping.py; schemas/ current."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BOTTOM = {"errors", "configs", "dtypes", "catalogue", "mapping", "compat", "safetensors_io", "checkpoint"}
TOP = {"cli", "__main__"}


def imports_of(path: Path) -> set[str]:
    """dflash_convert / dflash_runtime modules a file imports (absolute or relative)."""
    pkg = path.parent.name
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg if not node.module else f"{pkg}.{node.module}"
                if node.module:
                    found.add(base)
                else:
                    found.update(f"{pkg}.{a.name}" for a in node.names)
            elif node.module:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.split(".")[0] in ("dflash_convert", "dflash_runtime")}


def modules(pkg_dir: Path):
    return sorted(p for p in pkg_dir.glob("*.py"))


def test_bottom_layer_imports_only_itself():
    for path in modules(ROOT / "dflash_convert"):
        if path.stem in BOTTOM:
            bad = {m for m in imports_of(path) if m.split(".")[1:2] and m.split(".")[1] not in BOTTOM}
            bad |= {m for m in imports_of(path) if m.startswith("dflash_runtime")}
            assert not bad, f"{path.name} (bottom layer) imports {bad}"


def test_runtime_imports_only_the_bottom_layer():
    for path in modules(ROOT / "runtime" / "dflash_runtime"):
        for m in imports_of(path):
            parts = m.split(".")
            if parts[0] == "dflash_convert" and len(parts) > 1:
                assert parts[1] in BOTTOM, f"runtime/{path.name} imports {m}"


def test_nothing_imports_the_cli():
    for path in modules(ROOT / "dflash_convert") + modules(ROOT / "runtime" / "dflash_runtime"):
        if path.stem not in TOP:
            assert not any(m.endswith(".cli") for m in imports_of(path)), path.name


FORMAT_KEYS = ("dflash_config", "speculators_model_type", "transformer_layer_config", "sliding_window_non_causal",
               "aux_hidden_state_layer_ids")


def test_format_keys_live_in_the_config_models_and_mapping_table():
    # inspect reports aux ids under their speculators name; engines.py is the table of how engines read the keys
    allowed = {"configs.py", "mapping.py", "inspect.py", "engines.py"}
    for path in modules(ROOT / "dflash_convert") + modules(ROOT / "runtime" / "dflash_runtime"):
        if path.name in allowed:
            continue
        strings = [n.value for n in ast.walk(ast.parse(path.read_text()))
                   if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        for key in FORMAT_KEYS:
            assert not any(s == key or f'"{key}"' in s for s in strings), f"{path.name} spells the config key {key!r}"


def test_schemas_are_current():
    from dflash_convert import schemas

    for name in schemas.NAMES:
        on_disk = ROOT / "schemas" / f"{name}.schema.json"
        assert on_disk.exists(), f"schemas/{on_disk.name} missing: run python -m dflash_convert.schemas"
        assert on_disk.read_text() == schemas.render(name), \
            f"schemas/{on_disk.name} is stale: run python -m dflash_convert.schemas"


def test_schema_command(cli):
    from dflash_convert import schemas

    r = cli("schema", "conversion-record")
    assert r.code == 0 and json.loads(r.out)["title"] == "ConversionRecord"
    r = cli("schema")
    assert set(json.loads(r.out)) == set(schemas.NAMES) >= {"speculators-config", "hf-config", "conversion-record",
                                                           "validation-report", "diff-report", "inspect-report"}
    assert cli("schema", "nope").code == 2


def test_reference_config_validates_against_schema():
    import jsonschema

    from dflash_convert import schemas

    ref = json.loads((ROOT / "tests" / "fixtures" / "speculators-0.9.0-tiny-config.json").read_text())
    jsonschema.validate(ref, schemas.schema("speculators-config"))


def test_inspect_does_not_import_torch(speculators_drafts):
    code = ("import sys; from dflash_convert.inspect import inspect_checkpoint; "
            f"inspect_checkpoint({str(speculators_drafts['pruned'])!r}); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_console_script_and_module_entry_points():
    for cmd in (["dflash-convert", "--version"], [sys.executable, "-m", "dflash_convert", "--version"]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.strip() == __import__("dflash_convert").__version__
