"""`validate`: the static, numeric and end-to-end checks of a draft, and the reports they write."""

import os
import sys
from pathlib import Path
from typing import Annotated, Callable, Optional

import typer

from dflash_convert.cli._options import with_options
from dflash_convert.cli._output import Output, err, live
from dflash_convert.cli._params import Json, Quiet, Revision, Token, examples, in_panel, is_draft, refuse_swapped
from dflash_convert.io.outputs import unwritable, write_text
from dflash_convert.io.staging import INTERRUPTED_EXIT
from dflash_convert.validate.options import PromptSet, ValidateOptions

EXAMPLES = examples(
    "dflash-convert validate ./draft",
    "dflash-convert validate ./draft --target Qwen/Qwen3-8B --min-acceptance-length 3 --junit report.xml",
    "dflash-convert validate org/draft --target ./qwen3-8b --levels static,numeric --backend sdpa --json",
    "dflash-convert validate --endpoint http://staging:8000 --min-acceptance-length 3 --junit report.xml")


@with_options(ValidateOptions)
def validate(
    checkpoint: Annotated[Optional[str], typer.Argument(
        metavar="CHECKPOINT", help="Draft checkpoint (either format): directory or Hub id. Optional with "
        "--endpoint (the served figures alone).")] = None,
    options: Optional[dict] = None,  # ValidateOptions' own flags, generated (cli._options)
    dataset: Annotated[Optional[list[str]], typer.Option(
        "--dataset", metavar="NAME[@REV]", rich_help_panel="Inputs", help="A benchmark prompt set from the Hub (repeatable; tau per set): "
        "gsm8k, math500, humaneval, mt-bench, mt-bench-2, mbpp, alpaca.")] = None,
    num_prompts: Annotated[Optional[int], typer.Option("--num-prompts", rich_help_panel="Inputs", help="Prompts drawn from each --dataset "
                                                       "(with --seed; default: all).")] = None,
    junit: Annotated[Optional[Path], typer.Option("--junit", metavar="FILE", rich_help_panel="Reports", help="Also write a JUnit XML report "
                                                  "(one testcase per check) to FILE.")] = None,
    report_md: Annotated[Optional[Path], typer.Option(
        "--report-md", metavar="FILE", rich_help_panel="Reports", help="Also write a Markdown report to FILE (the acceptance chart beside it, "
        "as FILE with the suffix .svg). GITHUB_STEP_SUMMARY set: the report is appended there too.")] = None,
    revision: in_panel(Revision, "Inputs") = None,
    token: in_panel(Token, "Inputs") = None,
    as_json: in_panel(Json, "Reports") = False,
    quiet: in_panel(Quiet, "Reports") = False,
) -> None:
    """Check a draft before deployment: static, numeric and end-to-end levels; exit 0 passed, 3 a check failed."""
    import time

    from dflash_convert.cli._errors import failure_of
    from dflash_convert.validate.report_junit import junit_error

    inputs = _inputs(checkpoint, options or {})
    if junit is not None:  # the file that reports every other failure: its own is said alone
        _report_files(junit, None, inputs=inputs)
    t0 = time.perf_counter()
    try:
        profile = (options or {}).get("profile_out")
        # before any slow work: a bad path is a usage error, said now
        reports = _report_files(junit, report_md, Path(profile) if profile else None, inputs=inputs)
        report = _run(checkpoint, options, dataset, num_prompts, revision, token, as_json, quiet)
    except BaseException as exc:  # whatever ends the run, CI that asked for JUnit gets a test case saying why
        if junit is not None and not isinstance(exc, (SystemExit, typer.Exit)):
            failure = failure_of(exc, debug=False)
            _write_quietly(junit, junit_error(failure.message, failure.exit_code, time.perf_counter() - t0))
        raise
    _finish(report, reports, out=Output(as_json, quiet), as_json=as_json, quiet=quiet)


def _run(checkpoint, options, dataset, num_prompts, revision, token, as_json, quiet):
    """The run itself: the checkpoint and target at hand (pulled from the Hub if need be), then the levels."""
    from dflash_convert.validate.run import validate as run_validation

    out = Output(as_json, quiet)
    if checkpoint is None and options.get("endpoint") is None:
        raise typer.BadParameter("give a CHECKPOINT, or --endpoint URL to measure a live server",
                                 param_hint="CHECKPOINT")
    target = options.get("target")
    if checkpoint is not None and target is not None and Path(checkpoint).exists() and Path(target).exists() and \
            not is_draft(checkpoint) and is_draft(target):
        refuse_swapped(f"{checkpoint} is no DFlash draft and --target {target} is one",
                       f"validate takes the draft first: dflash-convert validate {target} --target {checkpoint}")
    ckpt_path, ckpt_sha = (out.local(checkpoint, revision=revision, token=token,
                                     allow_pickle=options.get("allow_pickle", False))
                           if checkpoint is not None else (None, None))
    if target is not None:
        options["target"], options["target_revision"] = out.local(target, token=token, for_target=True)
        options["target_name"] = target
    if num_prompts is not None and num_prompts < 1:
        raise typer.BadParameter(f"must be at least 1, got {num_prompts}", param_hint="--num-prompts")
    opts = ValidateOptions(**options, checkpoint_revision=ckpt_sha,
                           prompt_sets=_prompt_sets(dataset or [], num_prompts, options.get("seed", 0), token, out))
    report = run_validation(ckpt_path, opts, progress=None if quiet else out.status, report_interrupted=True)
    if report.prediction is not None:  # the options hold the parts' names: a family name typed picked one, say which
        from dflash_convert.predict.gpus import variant_note

        picked = [variant_note(name, "--predict-gpu") for name in options.get("predict_gpu") or []]
        report.prediction.notes[:0] = [n for n in picked if n]
    return report


def _finish(report, reports: list[tuple[str, Path, Callable]], *, out: Output, as_json: bool, quiet: bool) -> None:
    """Every report file that can be written, then the result (JSON: the report, and the error when a file could
    not be written), then the exit code: 130 interrupted, 1 a report not written, 3 a check failed, 0 passed."""
    from dflash_convert.errors import ValidationFailed
    from dflash_convert.validate.report import to_json
    from dflash_convert.validate.report_terminal import render_table

    from dflash_convert.validate.report import verdict_word

    unwritten = []
    for flag, path, render in reports:
        try:
            text = render(report)
            if text is None:  # no chart: no end-to-end figures
                if flag == "--profile-out":  # a file CI will look for: say why it is not there
                    out.info(f"--profile-out {path}: not written: the end-to-end level did not run, so there is "
                             "no measured acceptance to profile")
                continue
            write_text(path, text)
        except Exception as exc:  # noqa: BLE001 - checked before the run; the disk can still fill, the directory go
            why = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
            unwritten.append(f"{flag} {path} ({why})")
            continue
        if flag == "--report-md":
            out.info(f"Markdown report written: {path}")
        if flag == "--profile-out":
            out.info(f"speculation profile written: {path}")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:
        try:
            _step_summary(report, summary)
        except OSError as exc:
            unwritten.append(f"GITHUB_STEP_SUMMARY {summary} ({exc.strerror or exc})")
    result = to_json(report)
    error = None
    if unwritten:
        error = "could not write " + "; ".join(unwritten) + (
            "; the other reports were written" if len(unwritten) < len(reports) else "") + \
            f"; verdict: {verdict_word(report)}"
        result["error"] = {"message": error, "file": None, "exit_code": 1}
    if as_json:  # stdout holds the JSON: the log still shows the report (-q: its failures, warnings, verdict)
        live.stop()
        render_table(report, err, quiet)
    out.result(result, render=lambda console, q: render_table(report, console, q))
    if report.incomplete:  # Ctrl-C: the report above holds what was measured; the shells' code for it
        err.print(f"Error: {report.incomplete}; the report is incomplete", markup=False)
        sys.exit(INTERRUPTED_EXIT)
    if error is not None:
        err.print(f"Error: {error}", markup=False, soft_wrap=True)
        sys.exit(1)
    if not report.passed:
        raise typer.Exit(ValidationFailed.exit_code)


def _inputs(checkpoint: Optional[str], options: dict) -> list[tuple[str, str]]:
    """(flag, real path) of each local file or directory the run reads: CHECKPOINT, and the options declared
    `Flag(reads=True)` (a Hub id, or --chat-template auto, names none)."""
    from dflash_convert.flags import flag_of

    named = [("CHECKPOINT", checkpoint)]
    for name, info in ValidateOptions.model_fields.items():
        flag = flag_of(info.metadata)
        value = options.get(name)
        if flag is not None and flag.reads and isinstance(value, (str, Path)) and \
                not (name == "chat_template" and value in ("auto", "none")):
            named.append((flag.field_flag, value))
    return [(flag, os.path.realpath(path)) for flag, path in named if path is not None and os.path.exists(path)]


def _a_report(path: str) -> bool:
    """A file of a kind validate writes and no loader reads (an earlier run's report, a model card, the profile
    `push` uploads beside the weights): rewritten inside the checkpoint's directory on a rerun, not an input."""
    from dflash_convert.hub.card import PROFILE_NAME

    return Path(path).suffix.lower() in (".md", ".xml", ".svg") or Path(path).name == PROFILE_NAME


def _report_files(junit: Optional[Path], report_md: Optional[Path], profile_out: Optional[Path] = None,
                  inputs: list[tuple[str, str]] = ()) -> list[tuple[str, Path, Callable]]:
    """(flag, path, the report -> its text, None: nothing to write) of each report file asked for, each checked
    writable now: one that is not ends the command before any work (exit 2, naming it), as does one that is the
    file of another report, or one of the `inputs` (flag, real path: `_inputs`) or a file inside one of them. The
    charts are written beside the Markdown: acceptance per position (FILE.svg), tau against context length and
    output position."""
    import json

    from dflash_convert.errors import UsageError
    from dflash_convert.validate.breakdown import context_svg, output_svg
    from dflash_convert.validate.report_markdown import acceptance_svg, to_markdown
    from dflash_convert.validate.report_junit import to_junit

    files: list[tuple[str, Path, Callable]] = []
    if junit is not None:
        files.append(("--junit", junit, to_junit))
    if report_md is not None:
        image = report_md.with_suffix(".svg")
        curves = [(report_md.with_name(report_md.stem + suffix), draw)
                  for suffix, draw in (("-context-length.svg", context_svg), ("-output-position.svg", output_svg))]
        if image != report_md:
            files.append(("--report-md (chart)", image, acceptance_svg))
        files += [("--report-md (chart)", path, draw) for path, draw in curves]
        files.append(("--report-md", report_md, lambda report: to_markdown(
            report, image.name if image != report_md and acceptance_svg(report) is not None else None,
            *[path.name if draw(report) is not None else None for path, draw in curves])))
    if profile_out is not None:  # no end-to-end figures: nothing to profile, no file
        files.append(("--profile-out", profile_out, lambda report: None if report.speculation_profile is None
                      else json.dumps(report.speculation_profile, indent=2) + "\n"))
    seen: dict[str, str] = {}
    for flag, path, _ in files:  # one file written by two reports, or a report over an input, replaces it silently
        where = os.path.realpath(path)
        if where in seen:
            raise UsageError(f"{flag.split()[0]} {path}: {seen[where]} writes that file too; give each report its "
                             "own path; nothing was run")
        for read_flag, read in inputs:
            if where == read or (os.path.isdir(read) and os.path.isfile(where) and not _a_report(where) and
                                 where.startswith(os.path.join(read, ""))):
                what = f"the {read_flag} {'directory' if os.path.isdir(read) else 'file'}" if where == read else \
                    f"a file of the {read_flag} directory {read}"
                raise UsageError(f"{flag.split()[0]} {path}: that is {what}, which the run reads; give the report "
                                 "another path; nothing was run")
        seen[where] = flag.split()[0]
    for flag, path, _ in sorted(files, key=lambda file: "(chart)" in file[0]):  # the file named on the line first
        problem = unwritable(path)
        if problem is not None:
            raise UsageError(f"{flag.split()[0]} {path}: cannot write it: {problem}; nothing was run")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary and unwritable(summary, appended=True) is not None:
        raise UsageError(f"GITHUB_STEP_SUMMARY {summary}: cannot write it: {unwritable(summary, appended=True)}; "
                         "nothing was run")
    return files


def _write_quietly(path: Path, text: str) -> None:
    try:
        write_text(path, text)
    except OSError:  # the path was checked before the run: what ends the run is the error said, not this one
        pass


def _prompt_sets(specs: list[str], num_prompts: Optional[int], seed: int, token: Optional[str],
                 out: Output) -> list[PromptSet]:
    """Each --dataset, pulled from the Hub here: validate reads local prompts, never the Hub."""
    if not specs:
        return []
    out.hub()  # its progress bars follow -q / --json
    from dflash_convert.hub.datasets import dataset_prompts

    sets = []
    for spec in specs:
        pulled = dataset_prompts(spec, num_prompts=num_prompts, seed=seed, token=token, on_info=out.info)
        sets.append(PromptSet(name=pulled.name, source=pulled.source, prompts=pulled.prompts))
    return sets


def _step_summary(report, summary: str) -> None:
    """The report appended to the GitHub Actions step summary (an image beside it is not served: the unicode
    chart stands in)."""
    from dflash_convert.validate.report_markdown import to_markdown

    with open(summary, "a", encoding="utf-8") as f:
        f.write(to_markdown(report) + "\n")
