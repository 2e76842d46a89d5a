"""The command line's conventions, as users of the `hf` CLI expect them: -h everywhere, one JSON
object on stdout under --json (errors included), --debug anywhere, -q, choices listed from the
library, progress in output bytes, and the diff report's schema."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import typer

from dflash_convert import cli as cli_module

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = sorted(typer.main.get_command(cli_module.app).commands)


@pytest.fixture
def bad_config(speculators_drafts, tmp_path) -> Path:
    """A draft whose config.json is not JSON: a one-line error naming the file."""
    src = Path(shutil.copytree(speculators_drafts["full"], tmp_path / "bad"))
    (src / "config.json").write_text("{not json")
    return src


def only_json(r) -> dict:
    """stdout is exactly one JSON object (json.loads refuses anything before or after it)."""
    obj = json.loads(r.out)
    assert isinstance(obj, dict), r.out
    return obj


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_on_every_command(cli, flag):
    assert {"convert", "inspect", "diff", "schema", "pull", "push", "validate"} <= set(COMMANDS)
    r = cli(flag)
    assert r.code == 0 and "Usage" in r.out and all(c in r.out for c in COMMANDS), r.out
    for command in COMMANDS:
        r = cli(command, flag)
        assert r.code == 0 and "Usage" in r.out, (command, r.err)
        assert f"$ dflash-convert {command}" in r.out, f"{command} --help shows no examples"
        shown_as_values = [line for line in r.out.splitlines() if "<bool>" in line and "--help" not in line]
        assert not shown_as_values, f"{command}: boolean flags shown with a value: {shown_as_values}"


def test_choices_come_from_the_library(cli, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # one option per line in --help
    import torch  # noqa: F401 - attention.BACKENDS needs it

    from dflash_convert.format.dtypes import CAST_TARGETS
    from dflash_convert.validate.report import LEVELS
    from dflash_runtime import BACKEND_NAMES
    from dflash_runtime.attention import BACKENDS

    assert set(BACKEND_NAMES) == set(BACKENDS)
    text = cli("validate", "-h").out
    for name in (*BACKEND_NAMES, *CAST_TARGETS):
        assert name in text, name
    assert ",".join(LEVELS) in text.replace(" ", "")
    assert "speculators|hf" in cli("convert", "-h").out


def test_json_error_on_bad_input(cli, bad_config, tmp_path):
    out = tmp_path / "out"
    for args in (["convert", bad_config, "-o", out], ["inspect", bad_config], ["validate", bad_config],
                 ["diff", bad_config, bad_config]):
        r = cli(*args, "--json")
        assert r.code == 1, (args, r.code, r.err)
        error = only_json(r)["error"]
        assert error["exit_code"] == 1 and error["file"] == str(bad_config / "config.json")
        assert "not valid JSON" in error["message"] and "Traceback" not in r.err
        assert r.err.count("Error:") == 1  # the human line still goes to stderr
    assert not out.exists()


def test_json_error_on_usage_errors(cli, speculators_drafts, tmp_path):
    full, out = speculators_drafts["full"], tmp_path / "out"
    cases = [
        (["convert", full, "-o", out, "--to", "gguf", "--json"], "gguf"),
        (["convert", full, "-o", out, "--max-shard-size", "lots", "--json"], "lots"),
        (["convert", full, "-o", out, "--target-layer-ids", "a,b", "--json"], "a,b"),
        (["convert", full, "--json"], "--output"),
        (["validate", full, "--levels", "static,fast", "--json"], "fast"),
        (["validate", full, "--backend", "cudnn", "--json"], "cudnn"),
        (["inspect", "--json"], "SRC"),
        (["inspect", full, "--json", "--no-such-flag"], "--no-such-flag"),
    ]
    for args, needle in cases:
        r = cli(*args)
        assert r.code == 2, (args, r.code, r.out, r.err)
        error = only_json(r)["error"]
        assert error["exit_code"] == 2 and needle.lower() in error["message"].lower(), (args, error)
    assert not out.exists()


def test_json_is_one_object_on_success(cli, speculators_drafts, tmp_path):
    r = cli("convert", speculators_drafts["pruned"], "-o", tmp_path / "hf", "--json")
    assert r.code == 0 and only_json(r)["destination_format"] == "hf"
    r = cli("inspect", tmp_path / "hf", "--engine", "vllm", "--json")  # SGLang does not serve its pruned vocab
    assert r.code == 0 and only_json(r)["format"] == "hf"


@pytest.mark.parametrize("where", ["after", "before", "env"])
def test_debug_anywhere_shows_the_traceback(cli, bad_config, tmp_path, monkeypatch, where):
    args = ["inspect", bad_config]
    assert "Traceback" not in cli(*args).err
    if where == "env":
        monkeypatch.setenv("HF_DEBUG", "1")
    r = cli(*(["--debug", *args] if where == "before" else [*args, "--debug"] if where == "after" else args))
    assert r.code == 1 and "Traceback" in r.err and "not valid JSON" in r.err, r.err


def test_quiet_silences_progress_and_info(cli, speculators_drafts, tmp_path, monkeypatch):
    from rich.console import Console

    # stderr as a terminal: rich draws its progress bar there
    monkeypatch.setattr(cli_module._output, "err", Console(stderr=True, force_terminal=True, force_interactive=True))
    r = cli("convert", speculators_drafts["full"], "-o", tmp_path / "loud")
    assert r.code == 0 and "converting" in r.err and "converted speculators -> hf" in r.out, r.err
    # the config's changes in one line counting them; -v one line per key with why (conversion.json has them)
    assert "  config: " in r.out and "(-v lists them" in r.out and "  config is_causal" not in r.out, r.out
    verbose = cli("convert", speculators_drafts["full"], "-o", tmp_path / "verbose", "-v")
    assert "  config is_causal added: SGLang and z-lab read" in verbose.out, verbose.out
    r = cli("convert", speculators_drafts["full"], "-o", tmp_path / "quiet", "-q")
    # -q: the one summary line; on stderr only the warnings (these drafts are F32: inspect's dtype warning)
    assert r.code == 0 and r.out.startswith("converted speculators -> hf") and len(r.out.splitlines()) == 1, r.out
    assert r.err.startswith("warning:") and r.err.count("warning:") == 1 and "convert" not in r.err.split(";")[0], \
        r.err
    r = cli("inspect", tmp_path / "quiet", "--quiet")  # the verdict line (and the problems), nothing else
    assert r.code == 0 and r.err == "" and r.out.splitlines()[-1].startswith(f"{tmp_path / 'quiet'}: "), r.out
    assert "tensors" not in r.out and "block_size" not in r.out
    r = cli("convert", tmp_path / "missing", "-o", tmp_path / "x", "-q")  # errors still print
    assert r.code != 0 and r.err.startswith("Error:")


def test_progress_counts_output_bytes(speculators_drafts, tmp_path):
    """The bar's total and its advances are both output bytes: with --dtype they differ from the input's."""
    from dflash_convert.convert.conversion import ConvertOptions, convert
    from dflash_convert.io.safetensors import read_header

    calls: list[tuple[int, int]] = []
    out = tmp_path / "bf16"
    convert(speculators_drafts["full"], out, ConvertOptions(dtype="bfloat16"),
            on_progress=lambda done, total: calls.append((done, total)))
    tensors, _ = read_header(out / "model.safetensors")
    written = sum(t.nbytes for t in tensors.values())
    assert all(t.dtype in ("BF16", "I64", "BOOL") for t in tensors.values())
    assert calls and all(total == written for _, total in calls)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls) and calls[-1][0] == written


def test_diff_report_validates_against_its_schema(cli, speculators_drafts, tmp_path):
    import jsonschema

    from dflash_convert import schemas

    schema = json.loads((ROOT / "schemas" / "diff-report.schema.json").read_text())
    assert schema == schemas.schema("diff-report")
    hf, bf, cfg_changed = tmp_path / "hf", tmp_path / "bf16", tmp_path / "cfg"
    assert cli("convert", speculators_drafts["pruned"], "-o", hf).code == 0
    assert cli("convert", speculators_drafts["pruned"], "-o", bf, "--dtype", "bf16").code == 0
    assert cli("convert", speculators_drafts["pruned"], "-o", cfg_changed, "--mask-token-id", "7").code == 0
    reports = []
    for other in (hf, bf, cfg_changed, speculators_drafts["full"]):
        r = cli("diff", speculators_drafts["pruned"], other, "--json")
        assert r.code in (0, 3), r.err
        report = only_json(r)
        jsonschema.validate(report, schema)
        assert report["equivalent"] == (r.code == 0)
        reports.append(report)
    assert reports[0]["equivalent"] and not reports[1]["equivalent"]
    assert reports[2]["config_differences"]["mask_token_id"]["b"] == 7
    statuses = {t["status"] for t in reports[3]["tensors"].values()}
    assert statuses & {"only_in_a", "only_in_b", "shape_differs"}, statuses
    # the schema does hold the report to its shape
    broken = dict(reports[1], tensors={"fc.weight": {"status": "similar"}})
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schema)


def test_convert_validate_reports_the_shared_summary(cli, speculators_drafts, tmp_path):
    from dflash_convert.validate.report import ValidationSummary

    r = cli("convert", speculators_drafts["full"], "-o", tmp_path / "out", "--validate", "--json")
    assert r.code == 0, r.err
    summary = ValidationSummary.model_validate(only_json(r)["validation"])
    assert summary.passed and summary.levels_run == ["static", "numeric"]
    assert sum(summary.counts.values()) == len(summary.checks) > 0


def test_local_work_imports_neither_the_hub_client_nor_torch(speculators_drafts):
    """The CLI's start-up stays light: choices come from torch-free names, the Hub client only for Hub work."""
    import subprocess
    import sys

    code = ("import sys\nfrom dflash_convert.cli import main\n"
            f"sys.argv = ['dflash-convert', 'inspect', {str(speculators_drafts['full'])!r}, '--json']\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    assert exc.code == 0, exc.code\n"
            "assert 'huggingface_hub' not in sys.modules and 'torch' not in sys.modules, 'heavy import'\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr[-2000:]
