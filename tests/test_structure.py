"""The layering the project promises, checked against the folders: errors, format/, io/ (bottom) ->
dflash_runtime, predict/ -> convert/, validate/, hub/ -> publish, schemas -> cli; no import runs up a layer or
across the middle one; format knowledge only in the config models and the mapping table; schemas/
current."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from dflash_convert import regenerate

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "dflash_convert"
RUNTIME = ROOT / "runtime" / "dflash_runtime"
# Each unit (a folder, or a top-level module) and its layer; a unit may import its own layer's
# layer and any lower one, except that the middle layer's three folders stay apart.
LAYERS = {
    "dflash_convert.errors": 1, "dflash_convert.flags": 1, "dflash_convert.chart": 1, "dflash_convert.format": 1,
    "dflash_convert.user_text": 1,  # user-given text made inert in reports (validate and hub both print it)
    "dflash_convert.io": 1,
    "dflash_runtime": 2, "dflash_convert.predict": 2,  # predict: configs -> costs; validate, hub and cli ask it
    "dflash_convert.convert": 3, "dflash_convert.validate": 3, "dflash_convert.hub": 3,
    "dflash_convert.publish": 4, "dflash_convert.schemas": 4, "dflash_convert.regenerate": 4,
    "dflash_convert.cli": 5, "dflash_convert.__main__": 5, "dflash_convert": 0,  # the root: __version__ only
}  # dflash_convert.cli is a package: its modules (commands, _output, _entry, ...) are all layer 5, by unit_of
MIDDLE = 3  # convert/, validate/ and hub/ do not import each other: what two of them need lives below


def unit_of(module: str) -> str:
    """The layer unit a dotted module belongs to: its sub-package folder, else itself."""
    parts = module.split(".")
    if parts[0] == "dflash_runtime":
        return "dflash_runtime"
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


def module_name(path: Path) -> str:
    rel = path.relative_to(RUNTIME.parent if RUNTIME in path.parents else ROOT).with_suffix("")
    parts = list(rel.parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """dflash_convert / dflash_runtime modules a file imports (absolute or relative), as dotted names."""
    pkg = module_name(path) if path.name == "__init__.py" else module_name(path).rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return {m for m in found if m.split(".")[0] in ("dflash_convert", "dflash_runtime")}


def all_modules() -> list[Path]:
    return sorted(p for p in [*PKG.rglob("*.py"), *RUNTIME.rglob("*.py")] if "__pycache__" not in p.parts)


def known_unit(module: str) -> str | None:
    """The unit of an imported name; names below a module (functions, classes) map to that module's unit."""
    unit = unit_of(module)
    if unit in LAYERS:
        return unit
    if module.count(".") == 1 and module.startswith("dflash_convert."):  # `from dflash_convert import __version__`
        return "dflash_convert"
    return None


def test_every_module_has_a_layer():
    for path in all_modules():
        assert unit_of(module_name(path)) in LAYERS, f"{path.relative_to(ROOT)} is in no layer: add it to LAYERS"


def test_no_import_runs_up_or_across_a_layer():
    for path in all_modules():
        own = unit_of(module_name(path))
        for imported in imports_of(path):
            unit = known_unit(imported)
            assert unit is not None, f"{path.relative_to(ROOT)} imports {imported}, which is in no layer"
            if unit == own or unit == "dflash_convert":
                continue
            assert LAYERS[unit] < LAYERS[own] or (LAYERS[unit] == LAYERS[own] != MIDDLE), \
                f"{path.relative_to(ROOT)} (layer {LAYERS[own]}, {own}) imports {imported} (layer {LAYERS[unit]})"


@pytest.mark.parametrize("folder, line", [
    ("format", "from dflash_convert.validate.report import ValidationReport"),  # up
    ("format", "from ..validate import report"),
    ("format", "import dflash_runtime.model"),
    ("hub", "from dflash_convert.validate.report import ValidationReport"),  # across the middle layer
    ("convert", "from ..hub import client"),
    ("validate", "import dflash_convert.convert.conversion"),
])
def test_the_layer_check_sees_an_import_up_or_across(folder, line):
    probe = PKG / folder / "_probe_import.py"
    try:
        probe.write_text(line + "\n")
        with pytest.raises(AssertionError, match=f"{folder}/_probe_import.py .layer"):
            test_no_import_runs_up_or_across_a_layer()
    finally:
        probe.unlink()


# dflash_runtime ships in this distribution under its own import name, as a layer of it: it reads checkpoints
# through these and imports nothing else of dflash_convert (no flags, no chart, nothing of a layer above)
RUNTIME_READS = ("dflash_convert.format", "dflash_convert.io", "dflash_convert.errors")


def runtime_imports_outside_its_reads() -> list[str]:
    return sorted(f"{path.relative_to(ROOT)} imports {imported}" for path in modules(RUNTIME)
                  for imported in imports_of(path)
                  if imported.startswith("dflash_convert") and unit_of(imported) not in RUNTIME_READS)


def test_the_runtime_imports_only_format_io_and_errors():
    assert runtime_imports_outside_its_reads() == []


def test_predict_imports_only_format_io_and_errors():
    """predict/ shares the runtime's layer so that validate, hub and the cli can all ask it: it reads what the
    runtime reads and nothing else (not the runtime: a prediction needs no torch), and the options models' flag
    declarations (dflash_convert.flags: its PredictOptions is a command's options model)."""
    allowed = (*RUNTIME_READS, "dflash_convert.flags", "dflash_convert.predict")
    found = sorted(f"{path.relative_to(ROOT)} imports {imported}" for path in modules(PKG / "predict")
                   for imported in imports_of(path) if unit_of(imported) not in allowed)
    assert found == []


@pytest.mark.parametrize("line, refused", [
    ("from dflash_convert.validate.report import ValidationReport", True),  # a layer above
    ("from dflash_convert.flags import Flag", True),  # the bottom layer, but not what the runtime reads
    ("from dflash_convert import __version__", True),
    ("from dflash_convert.io.checkpoint import open_checkpoint", False),
])
def test_the_runtime_import_check_sees_an_import_outside_its_reads(line, refused):
    probe = RUNTIME / "_probe_import.py"
    try:
        probe.write_text(line + "\n")
        found = runtime_imports_outside_its_reads()
        assert bool(found) == refused and all("_probe_import.py imports" in f for f in found), found
    finally:
        probe.unlink()


def test_the_cli_does_not_import_the_process_entry():
    """`__main__` imports the cli (after its early Ctrl-C handler); the cli never imports `__main__` back."""
    for path in [*(PKG / "cli").rglob("*.py")]:
        up = {m for m in imports_of(path) if m.startswith("dflash_convert.__main__")}
        assert not up, f"{path.relative_to(ROOT)} imports {sorted(up)}: take the name from io.staging"
    assert unit_of("dflash_convert.cli._output") == "dflash_convert.cli"


def test_the_bottom_layer_needs_no_torch():
    code = ("import sys, importlib, pkgutil, dflash_convert.format as f, dflash_convert.io as i\n"
            "for pkg in (f, i):\n"
            "    for m in pkgutil.iter_modules(pkg.__path__):\n"
            "        importlib.import_module(f'{pkg.__name__}.{m.name}')\n"
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def modules(pkg_dir: Path):
    return sorted(p for p in pkg_dir.rglob("*.py") if "__pycache__" not in p.parts)


FORMAT_KEYS = ("dflash_config", "speculators_model_type", "transformer_layer_config", "sliding_window_non_causal",
               "aux_hidden_state_layer_ids")


def test_format_keys_live_in_the_config_models_and_mapping_table():
    # inspect reports aux ids under their speculators name; engines.py is the table of how engines read the keys,
    # engine_reading.py its readers (one per rule kind), which read those keys as each engine does
    allowed = {"configs.py", "mapping.py", "inspect.py", "engines.py", "engine_reading.py"}
    for path in modules(PKG) + modules(RUNTIME):
        if path.name in allowed:
            continue
        strings = [n.value for n in ast.walk(ast.parse(path.read_text()))
                   if isinstance(n, ast.Constant) and isinstance(n.value, str)]
        for key in FORMAT_KEYS:
            assert not any(s == key or f'"{key}"' in s for s in strings), f"{path.name} spells the config key {key!r}"


def test_every_generated_file_is_current_and_one_command_regenerates_them(tmp_path):
    """`python -m dflash_convert.regenerate` knows every generated file: each is current, and from a stale copy
    (a table's body emptied, a schema gone) it writes exactly what the code states, naming what it rewrote."""
    assert not regenerate.stale(), f"stale generated files {regenerate.stale()}: run {regenerate.COMMAND}"
    paths = list(regenerate.generated())
    assert {"docs/formats.md", "docs/engines.md"} <= set(paths) and sum(p.startswith("schemas/") for p in paths) > 1
    for path in paths:
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text((ROOT / path).read_text())
    doc = tmp_path / "docs" / "formats.md"
    begin, end = regenerate.KINDS_BEGIN, regenerate.KINDS_END
    doc.write_text(doc.read_text().replace(doc.read_text().partition(begin)[2].partition(end)[0], "\n"))
    (tmp_path / "schemas" / "hf-config.schema.json").unlink()
    assert regenerate.stale(tmp_path) == ["docs/formats.md", "schemas/hf-config.schema.json"]
    for path in regenerate.stale(tmp_path):
        (tmp_path / path).write_text(regenerate.current(path, tmp_path))
    assert all((tmp_path / p).read_text() == (ROOT / p).read_text() for p in paths)
    r = subprocess.run([sys.executable, "-m", "dflash_convert.regenerate", "--check"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 0 and r.stdout == "", (r.returncode, r.stdout, r.stderr)


def test_schemas_are_current():
    from dflash_convert import schemas

    for name in schemas.NAMES:
        on_disk = ROOT / "schemas" / f"{name}.schema.json"
        assert on_disk.exists(), f"schemas/{on_disk.name} missing: run {regenerate.COMMAND}"
        assert on_disk.read_text() == schemas.render(name), f"schemas/{on_disk.name} is stale: run {regenerate.COMMAND}"


def test_schema_command(cli):
    from dflash_convert import schemas

    r = cli("schema", "conversion-record")
    assert r.code == 0 and json.loads(r.out)["title"] == "ConversionRecord"
    r = cli("schema", "--all")
    assert set(json.loads(r.out)) == set(schemas.NAMES) >= {"speculators-config", "hf-config", "conversion-record",
                                                           "validation-report", "diff-report", "inspect-report"}
    r = cli("schema")  # the names, one a line, not 2,600 lines of JSON
    assert r.code == 0 and r.out.split() == list(schemas.NAMES), r.out
    assert cli("schema", "nope").code == 2


def test_reference_config_validates_against_schema():
    import jsonschema

    from dflash_convert import schemas

    ref = json.loads((ROOT / "tests" / "fixtures" / "speculators-0.9.0-tiny-config.json").read_text())
    jsonschema.validate(ref, schemas.schema("speculators-config"))


def test_inspect_does_not_import_torch(speculators_drafts):
    code = ("import sys; from dflash_convert.validate.inspect import inspect_checkpoint; "
            f"inspect_checkpoint({str(speculators_drafts['pruned'])!r}); "
            "assert 'torch' not in sys.modules, 'torch imported'")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_console_script_and_module_entry_points():
    for cmd in (["dflash-convert", "--version"], [sys.executable, "-m", "dflash_convert", "--version"]):
        r = subprocess.run(cmd, capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout.strip() == __import__("dflash_convert").__version__


def test_pyproject_ships_every_package_and_the_readme_names_every_module():
    """A wheel carries every package folder (a missing one installs a console script that cannot import),
    package data globs match files, and the README's layout names every module and folder of the package."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    declared = set(project["packages"])
    found = {module_name(p) for p in [*PKG.rglob("__init__.py"), *RUNTIME.rglob("__init__.py")]
             if "__pycache__" not in p.parts}
    assert found == declared, f"packages in pyproject.toml: missing {found - declared}, stale {declared - found}"
    for package, globs in project.get("package-data", {}).items():
        base = PKG if package == "dflash_convert" else RUNTIME
        for pattern in globs:
            assert list(base.glob(pattern)), f"package-data {package}: {pattern} matches no file"
    layout = (ROOT / "README.md").read_text().partition("## Layout")[2]
    for path in sorted(PKG.iterdir()):
        if path.name.startswith("__pycache__") or path.name == "__init__.py":
            continue
        name = path.name + "/" if path.is_dir() else path.name
        assert name in layout, f"README's layout does not name dflash_convert/{name}"
        if path.is_dir():
            for module in sorted(path.glob("*.py")):
                stem = module.stem
                if stem != "__init__" and not stem.startswith("_"):
                    assert stem in layout, f"README's layout does not name {path.name}/{module.name}"


def test_no_private_name_is_imported_from_another_module():
    """A leading underscore means 'this module's own': another module importing it couples the two
    behind the name's back (what checks._check and the Hub client's _api/_hub_call/_say were)."""
    found = []
    for path in all_modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in
                                                     ("dflash_convert", "dflash_runtime")):
                found += [f"{path.relative_to(ROOT)}: {node.module}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not a.name.startswith("__")]
    assert not found, found


def import_graph() -> dict[str, set[str]]:
    """module -> the package modules it imports, at the top or inside a function (a lazy import is an
    import all the same: it only moves the moment a circle bites)."""
    modules = {module_name(p): p for p in all_modules()}
    graph = {}
    for name, path in modules.items():
        deps = set()
        for imported in imports_of(path):
            parts = imported.split(".")
            owner = next((".".join(parts[:i]) for i in range(len(parts), 0, -1)
                          if ".".join(parts[:i]) in modules), None)
            if owner is not None and owner != name:
                deps.add(owner)
        graph[name] = deps
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_circle_even_through_lazy_imports():
    assert circles(import_graph()) == []
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]  # the check sees one


def test_tests_share_helpers_through_conftest_and_helper_modules_not_test_modules():
    """A test module importing another one runs (and collects) it twice over and hides what it depends on:
    shared fixtures live in a conftest.py, shared helpers in a module whose name does not start with test_."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[-1].startswith("test_")]
    assert not found, found
