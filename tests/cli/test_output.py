"""Where output goes and how it reads: results on stdout (grep finds them), -q keeps the verdict, failures
and warnings, 80-column help and tables that never cut a name, plain text in pipes, one line for Ctrl-C
at any moment (exit 130), a missing extra named, convert flagging what inspect would."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from processes import stop_signals_at_default

ROOT = Path(__file__).resolve().parents[2]
PAIR = ROOT / "examples" / "pair"


def run(*args: str, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    """`dflash-convert ARGS` in a fresh interpreter, output piped (not a terminal)."""
    base = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "COLUMNS", "FORCE_COLOR")}
    return subprocess.run([sys.executable, "-m", "dflash_convert", *map(str, args)], capture_output=True, text=True,
                          env={**base, "PYTHONPATH": f"{ROOT}:{ROOT / 'runtime'}", **(env or {})}, **kw)


def scrambled(src: Path, dest: Path) -> Path:
    """A copy whose target layer ids are listed out of order (engines capture them sorted)."""
    shutil.copytree(src, dest)
    cfg = json.loads((dest / "config.json").read_text())
    cfg["aux_hidden_state_layer_ids"] = list(reversed(cfg["aux_hidden_state_layer_ids"]))
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


# ----------------------------------------------------------------------------- stdout, -q

def test_results_go_to_stdout_for_pipes_and_grep(cli, tmp_path):
    r = cli("inspect", PAIR / "draft")
    assert r.code == 0 and r.err == "", r.err
    assert re.search(r"^block_size\s+16\s*$", r.out, re.M) and "layers.0.self_attn.q_proj.weight" in r.out
    r = cli("convert", PAIR / "draft", "-o", tmp_path / "hf")
    assert r.code == 0 and r.out.startswith(f"converted speculators -> hf: {tmp_path / 'hf'}"), (r.out, r.err)
    r = cli("diff", PAIR / "draft", tmp_path / "hf")
    assert r.code == 0 and r.out.splitlines()[-1].endswith(": equivalent") and r.err == "", (r.out, r.err)


def test_quiet_keeps_the_verdict_failures_and_warnings(cli, tmp_path):
    bad = scrambled(PAIR / "draft", tmp_path / "bad")
    loud, quiet = cli("inspect", bad), cli("inspect", bad, "-q")
    assert loud.code == quiet.code == 3
    lines = quiet.out.splitlines()
    assert lines[0].startswith("FAIL target_layer_ids: ") and "DIFFERS from training" in quiet.out
    assert lines[-1] == f"{bad}: FAILED: 4 failed, 0 warning(s) in the config and tensor headers (values not read: " \
                        "--scan reads them)"
    assert "tensors" not in quiet.out and "as trained" not in quiet.out and "note (" not in quiet.out
    assert "25 tensors" in loud.out and loud.out.splitlines()[-1] == lines[-1]
    # validate -q: the failed check and the verdict naming it, no passing check
    r = cli("validate", bad, "--levels", "static", "-q")
    assert r.code == 3 and r.err == "", r.err
    assert re.search(r"^\s+fail\s+target_layer_ids\s+target layer ids", r.out, re.M), r.out
    assert " pass " not in r.out and r.out.splitlines()[-1].startswith("FAILED (static; numeric not run: not requested; ")
    assert r.out.splitlines()[-1].endswith("failed: target_layer_ids")
    # diff -q: the differences and the verdict, without the informational lines
    r = cli("diff", PAIR / "draft", bad, "-q")
    assert r.code == 3 and r.out.splitlines()[-1].endswith("different"), r.out
    assert "config target_layer_ids: [1, 5] != [5, 1]" in r.out and "info:" not in r.out


def test_json_is_one_object_on_stdout(cli, tmp_path):
    r = cli("validate", scrambled(PAIR / "draft", tmp_path / "bad"), "--levels", "static", "--json")
    assert r.code == 3 and json.loads(r.out)["passed"] is False
    assert r.err.strip().splitlines()[-1].startswith("FAILED (static; ")  # the log still shows the verdict


# ----------------------------------------------------------------------------- 80 columns, plain text

def test_help_at_80_columns_shows_every_flag_whole():
    import typer

    from dflash_convert.cli import app

    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        r = run(name, "-h", env={"COLUMNS": "80"})
        assert r.returncode == 0, r.stderr
        flags = {o for p in command.params if not getattr(p, "hidden", False)  # a former spelling is hidden
                 for o in (*p.opts, *p.secondary_opts) if o.startswith("-")}
        missing = {f for f in flags if not re.search(rf"(^|[\s,/]){re.escape(f)}([\s,/=]|$)", r.stdout, re.M)}
        assert not missing, (name, missing, r.stdout)
        assert "…" not in r.stdout and "\x1b[" not in r.stdout
        assert all(len(line) <= 80 for line in r.stdout.splitlines()), r.stdout  # examples continued with ` \`
        usage = r.stdout.splitlines()[0]
        assert usage.startswith("Usage: ") and "{" not in usage, usage  # SRC, not typer's {SRC}


def test_tables_fit_80_columns_without_cutting_names(tmp_path):
    r = run("inspect", PAIR / "draft", env={"COLUMNS": "80"})
    assert r.returncode == 0, r.stderr
    names = json.loads(run("inspect", PAIR / "draft", "--json").stdout)["tensors"]
    rows = {t["name"]: next((line for line in r.stdout.splitlines() if f" {t['name']} " in line), None)
            for t in names}
    assert all(rows.values()), [n for n, line in rows.items() if line is None]  # every name whole
    assert all(len(line) <= 80 for line in rows.values())
    r = run("validate", scrambled(PAIR / "draft", tmp_path / "bad"), "--levels", "static", env={"COLUMNS": "80"})
    rows = [line for line in r.stdout.splitlines() if re.match(r"\s+(pass|fail|warn|skip)\s", line)]
    assert len(rows) > 10 and all(len(line) <= 80 for line in rows), r.stdout
    assert re.search(r"^\s+fail\s+target_layer_ids\s", r.stdout, re.M)


def test_plain_text_in_pipes_and_no_color_honoured(tmp_path):
    bad = scrambled(PAIR / "draft", tmp_path / "bad")
    piped = run("validate", bad, "--levels", "static")
    assert piped.returncode == 3 and "\x1b[" not in piped.stdout + piped.stderr
    forced = run("validate", bad, "--levels", "static", env={"FORCE_COLOR": "1"})
    assert re.search(r"\x1b\[[0-9;]*3[1-7]m", forced.stdout)  # the control: a terminal gets colour
    no_color = run("validate", bad, "--levels", "static", env={"FORCE_COLOR": "1", "NO_COLOR": "1"})
    assert not re.search(r"\x1b\[[0-9;]*(3[0-7]|9[0-7])m", no_color.stdout), no_color.stdout


# ----------------------------------------------------------------------------- Ctrl-C

INTERRUPT_DURING = """
import os, signal, sys
class Interrupt:  # Ctrl-C while `{module}` is being imported (the command line's heavy start-up)
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Interrupt())
sys.argv = ["dflash-convert", *{args!r}]
from dflash_convert.__main__ import main
main()
"""


@pytest.mark.parametrize("module", ["typer", "dflash_runtime", "dflash_convert.validate.run"])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_ctrl_c_at_any_moment_is_one_line_and_exit_130(module, as_json):
    args = ["validate", str(PAIR / "draft"), "--levels", "static", *(["--json"] if as_json else [])]
    r = subprocess.run([sys.executable, "-c", INTERRUPT_DURING.format(module=module, args=args)],
                       capture_output=True, text=True, env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'runtime'}"},
                       preexec_fn=stop_signals_at_default)
    assert r.returncode == 130, (r.returncode, r.stderr)
    assert r.stderr.strip().splitlines() == ["Error: interrupted (Ctrl-C)"]  # validate writes no destination
    if as_json:
        assert json.loads(r.stdout)["error"]["exit_code"] == 130
    else:
        assert r.stdout == ""


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_ctrl_c_during_end_to_end_validation(as_json):
    p = subprocess.Popen([sys.executable, "-m", "dflash_convert", "validate", str(PAIR / "draft"), "--target",
                          str(PAIR / "target"), "--levels", "end_to_end", "--threads", "1",
                          *(["--json"] if as_json else [])], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'runtime'}"},
                         preexec_fn=stop_signals_at_default)
    seen = []
    for line in p.stderr:  # status lines (not a terminal: one per step)
        seen.append(line)
        if "end to end: prompt 1/" in line:
            break
    p.send_signal(signal.SIGINT)
    err = p.stderr.read()  # the same buffered reader: what it already holds is not lost
    out = p.stdout.read()
    p.wait(timeout=120)
    assert p.returncode == 130, (p.returncode, "".join(seen) + err)
    assert "Traceback" not in err and err.strip().splitlines()[-1] == \
        "Error: interrupted (Ctrl-C); the report is incomplete", err
    assert "destination" not in err  # validate has none
    # what had been measured is reported, marked incomplete and not passed
    if as_json:
        report = json.loads(out)
        assert report["incomplete"] == "interrupted (Ctrl-C)" and report["passed"] is False
        assert report["levels_skipped"]["end_to_end"] == "interrupted (Ctrl-C)"
        partial = next(c for c in report["checks"] if c["name"] == "end_to_end_partial")
        assert partial["status"] == "skip" and partial["message"].startswith("interrupted (Ctrl-C) after "), partial
    else:
        verdict = out.splitlines()[-1]
        assert verdict.startswith("INCOMPLETE (") and "end to end not run: interrupted (Ctrl-C)" in verdict, out
        assert "end_to_end_partial" in out, out



def _raise(exc):
    def hook(*args, **kwargs):  # noqa: ARG001
        raise exc
    return hook


@pytest.mark.parametrize("where", ["redaction", "command", "app"])
@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_an_interrupt_that_escapes_the_app_is_the_same_one_line(cli, monkeypatch, where, as_json):
    """A Ctrl-C the app does not turn into its exit code (raised while the output redaction is set up,
    before typer runs; a typer.Abort out of a command; one out of the typer app itself, whatever module
    the entry point lives in) ends the same way as any other: exit 130, one `Error: interrupted` line,
    and under --json one JSON error object on stdout."""
    import typer

    if where == "redaction":
        monkeypatch.setattr("dflash_convert.hub.tokens.redact_output", _raise(KeyboardInterrupt()))
    elif where == "command":
        monkeypatch.setattr("dflash_convert.validate.inspect.inspect_checkpoint", _raise(typer.Abort()))
    else:
        monkeypatch.setattr(typer.Typer, "__call__", _raise(KeyboardInterrupt()))
    r = cli("inspect", str(PAIR / "draft"), *(["--json"] if as_json else []))
    assert r.code == 130, (r.code, r.err)
    assert r.err.strip().splitlines()[-1] == "Error: interrupted (Ctrl-C)"  # inspect writes no destination
    if as_json:
        assert r.out.startswith("{"), f"no JSON error object on stdout: {r.out!r}"  # json.loads: one, nothing else
        assert json.loads(r.out) == {"error": {"message": "interrupted (Ctrl-C)", "file": None, "exit_code": 130}}
    else:
        assert r.out == ""


# ----------------------------------------------------------------------------- errors users meet

def test_missing_extra_names_what_to_install(tmp_path):
    """Without transformers (a plain `pip install dflash-convert`) the end-to-end level says which extra."""
    code = ("import sys\nsys.modules['transformers'] = None  # as if not installed\n"
            f"sys.argv = ['dflash-convert', 'validate', {str(PAIR / 'draft')!r}, '--target', "
            f"{str(PAIR / 'target')!r}, '--levels', 'end_to_end']\n"
            "from dflash_convert.__main__ import main\nmain()\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": f"{ROOT}:{ROOT / 'runtime'}"})
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip().splitlines()[-1] == ("Error: this command needs transformers, which is not installed: "
                                                 "run pip install -e '.[runtime]' in your clone of dflash-convert"), \
        r.stderr  # the package is not on the index: the extra is installed from the clone


def test_choice_errors_in_plain_words(cli, tmp_path):
    r = cli("convert", PAIR / "draft", "-o", tmp_path / "x", "--to", "gguf")
    assert r.code == 2 and not (tmp_path / "x").exists()
    assert r.err.strip().splitlines()[-1] == ("Error: Invalid value for '--to': 'gguf' is not one of the choices: "
                                              "speculators, hf, transformers"), r.err


def test_clean_example_inspects_without_noise_or_none(cli):
    r = cli("inspect", PAIR / "draft")
    assert r.code == 0 and "WARNING" not in r.out and "None" not in r.out and "True" not in r.out, r.out
    assert r.out.count("note (") <= 3  # a note said once, naming the engines, not once per engine
    assert r.out.splitlines()[-1].endswith("no problems found in the config and tensor headers (values not read: "
                                           "--scan reads them)")
    scanned = cli("inspect", PAIR / "draft", "--scan")
    assert scanned.out.splitlines()[-1].endswith("no problems found in the config, tensor headers and values")


def test_convert_flags_what_inspect_would_and_strict_refuses(cli, tmp_path):
    bad = scrambled(PAIR / "draft", tmp_path / "bad")
    r = cli("convert", bad, "-o", tmp_path / "out")
    assert r.code == 0 and (tmp_path / "out" / "config.json").exists()
    assert "warning: the output fails inspect's target_layer_ids check" in r.err, r.err
    r = cli("convert", bad, "-o", tmp_path / "strict", "--strict")
    assert r.code == 3 and not (tmp_path / "strict").exists()
    assert r.err.strip().splitlines()[-1] == ("Error: --strict: inspect finds 4 problem(s) in the output "
                                              "(target_layer_ids, engine_view.vllm-speculators, engine_view.vllm-hf, "
                                              "engine_view.sglang); nothing was written")
    r = cli("convert", PAIR / "draft", "-o", tmp_path / "clean", "--strict")  # the clean pair: no warning at all
    assert r.code == 0 and r.err == "", r.err


# ----------------------------------------------------------------------------- the CI example runs as shipped

WORKFLOW = ROOT / "examples" / "ci-workflow.yml"


def _workflow_commands() -> list[tuple[str, str, list[str]]]:
    """(job, install line, dflash-convert argv) for every dflash-convert command of the example workflow,
    with `${{ inputs.X }}` replaced by the input's default."""
    import yaml

    flow = yaml.safe_load(WORKFLOW.read_text())
    inputs = flow[True]["workflow_dispatch"]["inputs"] if True in flow else flow["on"]["workflow_dispatch"]["inputs"]
    found = []
    for job, spec in flow["jobs"].items():
        runs = [s["run"] for s in spec["steps"] if "run" in s]
        install = next(r for r in runs if r.startswith("pip install"))
        for script in runs:
            text = re.sub(r"\$\{\{\s*inputs\.(\w+)\s*\}\}", lambda m: inputs[m.group(1)]["default"], script)
            for line in text.replace("\\\n", " ").splitlines():
                words = shlex.split(line)
                if words and words[0] == "dflash-convert":
                    found.append((job, install, words[1:words.index(">")] if ">" in words else words[1:]))
    return found


def _extras_needed(argv: list[str]) -> set[str]:
    """The pyproject extras a command needs: torch for dtype casts and the numeric level, transformers
    for end to end (both in `runtime`)."""
    command, flags = argv[0], set(argv)
    levels = argv[argv.index("--levels") + 1].split(",") if "--levels" in argv else ["static", "numeric",
                                                                                     "end_to_end"]
    if command == "validate" and levels != ["static"]:
        return {"runtime"}
    if command == "convert" and ({"--validate", "--push"} & flags or ("--dtype" in flags and
                                                                        argv[argv.index("--dtype") + 1] != "auto")):
        return {"runtime"}
    if command == "inspect" and "--scan" in flags:
        return {"runtime"}
    return set()


def test_ci_workflow_commands_exist_and_their_installs_suffice():
    import click
    import typer

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    from dflash_convert.cli import app

    group = typer.main.get_command(app)
    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    commands = _workflow_commands()
    assert {argv[0] for _, _, argv in commands} == {"pull", "convert", "validate", "push"}
    for job, install, argv in commands:
        command = group.commands[argv[0]]
        try:  # parses every flag and value as the CLI would, without running anything
            command.make_context(argv[0], list(argv[1:]))
        except click.ClickException as exc:
            pytest.fail(f"{job}: `dflash-convert {' '.join(argv)}`: {exc.format_message()}")
        installed = set(re.findall(r"dflash-convert\[([\w,]+)\]", install))
        installed = {e for group_ in installed for e in group_.split(",")}
        assert installed <= declared, (job, install)
        assert _extras_needed(argv) <= installed, f"{job}: `{install}` lacks what `{' '.join(argv)}` needs"


# ----------------------------------------------------------------------------- the acceptance chart, Markdown

def test_text_chart_bars_are_proportional_and_mark_low_positions():
    from dflash_convert.chart import bar, text_chart

    assert bar(1.0, 8) == "█" * 8 and bar(0.0, 8) == " " * 8 and bar(0.5, 8) == "████    "
    assert bar(1 / 16, 8) == "▌       "  # half a cell: eighths, not rounding to whole cells
    lines = text_chart([0.9, 0.5, 0.25], [0.8, 0.6], width=40)
    assert [line.split()[0] for line in lines[1:]] == ["1", "2", "3"]
    assert [len(line.split()[2].rstrip()) for line in lines[1:]] == [36, 20, 10]
    assert lines[1].endswith("min 0.80 ok") and lines[2].endswith("min 0.60 LOW") and "min" not in lines[3]


def test_svg_chart_is_well_formed_with_one_bar_per_position():
    import xml.etree.ElementTree as ET

    from dflash_convert.chart import svg_chart

    svg = ET.fromstring(svg_chart([1.0, 0.5, 0.0, 0.25], [0.9], title="t <&>"))
    ns = "{http://www.w3.org/2000/svg}"
    bars = [r for r in svg.iter(f"{ns}rect") if r.find(f"{ns}title") is not None]
    heights = [float(r.get("height")) for r in bars]
    assert len(bars) == 4 and heights[0] == 2 * heights[1] == 4 * heights[3] and heights[2] == 0
    assert len([ln for ln in svg.iter(f"{ns}line") if ln.get("stroke") == "#222222"]) == 1  # one minimum
    assert [r.get("fill") for r in bars] == ["#4c78a8"] * 4  # 1.0 meets its minimum 0.9
    assert svg.find(f"{ns}text").text == "t <&>"
    # a bar below its minimum is red; a tau minimum is the dashed mean rate it needs: (tau - 1) / positions
    svg = ET.fromstring(svg_chart([1.0, 0.5], [0.9, 0.6], tau_minimum=2.0))
    bars = [r for r in svg.iter(f"{ns}rect") if r.find(f"{ns}title") is not None]
    assert [r.get("fill") for r in bars] == ["#4c78a8", "#d62728"]
    dashed = [ln for ln in svg.iter(f"{ns}line") if ln.get("stroke-dasharray")]
    assert len(dashed) == 1 and "mean rate of 0.500" in dashed[0].find(f"{ns}title").text


def test_validate_writes_the_markdown_report_and_the_step_summary(cli, tmp_path, monkeypatch):
    summary = tmp_path / "step-summary.md"
    summary.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    md = tmp_path / "reports" / "e2e.md"
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--levels", "end_to_end", "--threads", "1",
            "--max-new-tokens", "24", "--sampling", "greedy", "--min-position-rates", "0.2,0.99", "--report-md", md,
            "--json")
    assert r.code == 3, r.err[-2000:]  # position 2 cannot reach 0.99
    report = json.loads(r.out)
    a = report["acceptance"]
    # per-prompt figures add up to the run's
    per = a["per_prompt"]
    assert [p["prompt"] for p in per] == list(range(1, a["prompts"] + 1))
    assert sum(p["new_tokens"] for p in per) == a["new_tokens"]
    assert sum(p["steps"] for p in per) == a["num_drafts"]
    assert all(p["output_equal"] is True for p in per) and a["outputs_equal"] == a["prompts"]
    text = md.read_text()
    assert text.startswith("## dflash-convert validate: FAILED")
    assert f"| {a['acceptance_length']:.2f} | {a['speedup']:.2f}x | {a['prompts']}/{a['prompts']} |" in text
    assert "![acceptance per draft position](e2e.svg)" in text and (md.parent / "e2e.svg").read_text().startswith(
        "<svg")
    rates = a["per_position_rates"]
    assert f"   2  {rates[1]:.2f}  " in text and "min 0.99 LOW" in text and "| position_rates | end_to_end | fail |" \
        in text
    assert text.count("| 1 | ") == 1 and "<summary>Per prompt</summary>" in text
    # rendered by a Markdown library as GitHub would: tables are tables, no cell shows literal backticks
    from markdown_it import MarkdownIt

    html = MarkdownIt("commonmark").enable("table").render(text)
    assert html.count("<table>") >= 3 and "``" not in html and "<code></code>" not in html, html
    assert "<h2>dflash-convert validate: FAILED</h2>" in html
    # the picture says the verdict, and the position below its minimum is the red bar
    svg = (md.parent / "e2e.svg").read_text()
    assert "FAILED: tau " in svg and "below its minimum 0.99" in svg
    assert svg.count('fill="#d62728"') == text.count(" LOW") >= 1
    # an engine run is in the Markdown, with the side-by-side table the terminal shows
    from dflash_convert.validate.report import EngineStats, ValidationReport
    from dflash_convert.validate.report_markdown import to_markdown

    served = ValidationReport.model_validate(report)
    counts = {k: a[k] for k in ("num_drafts", "accepted", "acceptance_length", "per_position_rates")}
    served.engine_run = EngineStats(engine="vllm", version="0.32.0", python="/venv/bin/python", prompts=a["prompts"],
                                    outputs_equal=a["prompts"], counts={**counts, "drafted": 0})
    html = MarkdownIt("commonmark").enable("table").render(to_markdown(served))
    assert "Served in real vllm 0.32.0" in html and "<td>vllm 0.32.0 (its counters)</td>" in html, html
    step = summary.read_text()
    assert step.startswith("earlier step\n## dflash-convert validate: FAILED") and "![" not in step  # no image there
    # the terminal report draws the same chart, on stdout
    r = cli("validate", PAIR / "draft", "--target", PAIR / "target", "--levels", "end_to_end", "--threads", "1",
            "--max-new-tokens", "24", "--sampling", "greedy")
    assert r.code == 0 and re.search(r"^\s+1\s+\d\.\d\d\s+█", r.out, re.M), r.out
    assert len(summary.read_text()) > len(step)  # appended, not replaced


def test_progress_on_a_terminal_counts_prompts_with_an_eta(cli, monkeypatch):
    from rich.console import Console

    from dflash_convert.cli import _output

    args = ["validate", PAIR / "draft", "--target", PAIR / "target", "--levels", "end_to_end", "--threads", "1",
            "--max-new-tokens", "16", "--sampling", "greedy"]
    monkeypatch.setattr(_output, "err", Console(stderr=True, force_terminal=True, force_interactive=True, width=120))
    r = cli(*args)
    assert r.code == 0, r.err[-2000:]
    shown = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", r.err)
    assert re.search(r"end to end: prompt \d+/\d+.*ETA", shown), shown[-3000:]  # a counted step: bar and ETA
    assert "end to end: loading the target" in shown and "Loading weights" not in shown  # one bar, ours
    assert r.out.splitlines()[-1].startswith("PASSED")  # the live line is gone before the result prints
    quiet = cli(*args, "-q")
    assert quiet.code == 0 and quiet.err == "" and quiet.out.splitlines()[-1].startswith("PASSED"), quiet.err
    assert " pass " not in quiet.out  # -q: warnings (none of the passing checks) and the verdict


def test_a_passing_run_with_a_warning_shows_the_warning_in_markdown(cli, tmp_path):
    """A run that passes but warned (a speculators draft naming no verifier: vLLM cannot find its target)
    lists the warned check in the Markdown report, where a reviewer looks before deploying."""
    from factories import copy_draft

    draft = copy_draft(PAIR / "draft", tmp_path / "draft", spec_update={"verifier": None})
    md = tmp_path / "static.md"
    r = cli("validate", draft, "--levels", "static", "--report-md", md)
    assert r.code == 0, r.err[-2000:]
    text = md.read_text()
    assert text.startswith("## dflash-convert validate: PASSED")
    rows = [line for line in text.splitlines() if line.startswith("| verifier |")]
    assert len(rows) == 1, f"the warned check is not in the Markdown report:\n{text}"
    assert "| static | warn |" in rows[0] and "names no verifier" in rows[0]


def test_the_verdict_line_names_the_levels_that_did_not_run(cli, monkeypatch):
    """A forgotten --target: the verdict line (all -q shows) says end to end did not run and why, and suggests the
    target the draft records when it is at hand; --require-end-to-end makes the missing level a failure (exit 3);
    `--json -q` still writes the verdict to stderr."""
    monkeypatch.chdir(ROOT)  # the draft records its target as examples/pair/target
    args = ("validate", "examples/pair/draft", "--levels", "static,end_to_end", "-q")
    hint = ("end to end not run: no --target given; the draft names examples/pair/target, found here: add --target "
            "examples/pair/target)")
    r = cli(*args)
    assert r.code == 0 and r.out.splitlines()[-1].startswith(
        f"PASSED (static; numeric not run: not requested; {hint}: "), r.out
    required = cli(*args, "--require-end-to-end")
    assert required.code == 3 and required.out.splitlines()[-1].startswith(f"FAILED (static; ") and \
        required.out.splitlines()[-1].endswith("failed: end_to_end_ran"), required.out
    quiet_json = cli(*args, "--json")
    assert quiet_json.code == 0 and quiet_json.json()["passed"] and hint in quiet_json.err, quiet_json.err


def test_a_long_list_of_rates_is_cut_between_numbers():
    """A failed position_rates row shows its value and threshold lists shortened: whole numbers and a count of
    the rest, never `0....` cut inside a number."""
    from dflash_convert.validate.report import short

    text = short([0.95, 0.9, 0.85, 0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4, 0.35, 0.3, 0.25])
    assert re.fullmatch(r"\[(\d\.\d\d, )+\+\d+ more\]", text) and len(text) <= 48, text


def test_push_with_swapped_arguments_says_so(cli, tmp_path):
    """`hf upload` takes the repo first; `push DIRECTORY REPO` given the other way round is a usage error that
    says the arguments look swapped, with the command in the right order."""
    draft = tmp_path / "draft"
    draft.mkdir()
    r = cli("push", "my-org/my-draft", draft)
    assert r.code == 2 and "look swapped" in r.err and f"dflash-convert push {draft} my-org/my-draft" in r.err, r.err


@pytest.mark.parametrize("command,option,foreign", [("inspect", "--allow-pickle", "validate"),
                                                     ("pull", "--quiet", "verdict"), ("push", "--quiet", "verdict")])
def test_help_texts_are_each_commands_own(command, option, foreign):
    """A shared option's help does not talk about another command (inspect's --allow-pickle about validate's
    mask embedding, pull's -q about a verdict line it never prints)."""
    r = run(command, "-h", env={"COLUMNS": "200"})
    line = next(line for line in r.stdout.splitlines() if option in line)
    assert foreign not in line, line


def test_validate_help_groups_its_flags():
    """validate -h lists its flags under headings users look for, in this order, from the options model's
    HELP_PANELS (and the command's own report flags); -h leads the first group, no plain Options heading is left."""
    from dflash_convert.cli._options import flagged_fields
    from dflash_convert.validate.options import ValidateOptions

    r = run("validate", "-h", env={"COLUMNS": "80"})
    headings = [line[:-1] for line in r.stdout.splitlines() if re.fullmatch(r"[A-Z][A-Za-z ]+:", line)]
    assert headings == ["Arguments", "Inputs", "Long contexts and outputs", "Decoding", "Runtime", "Engine",
                        "Live deployment", "GPU prediction", "Thresholds", "Reports"]
    inputs = r.stdout.split("\nInputs:\n")[1].split("\n\n")[0]
    assert inputs.split()[:7] == ["-h,", "--help", "Show", "this", "message", "and", "exit."], inputs
    grouped = {n for names in ValidateOptions.HELP_PANELS.values() for n in names}
    assert set(flagged_fields(ValidateOptions)) <= grouped
    thresholds = r.stdout.split("\nThresholds:\n")[1].split("\n\n")[0]
    assert "--min-acceptance-length" in thresholds and "--require-end-to-end" in thresholds
