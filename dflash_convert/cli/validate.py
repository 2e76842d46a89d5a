"""`validate`: the static, numeric and end-to-end checks of a draft, and the reports they write."""

import os
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from dflash_convert.cli._options import with_options
from dflash_convert.cli._output import Output, err, live
from dflash_convert.cli._params import Json, Quiet, Revision, Token, examples, in_panel
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
        metavar="[CHECKPOINT]", help="Draft checkpoint (either format): directory or Hub id. Optional with "
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
    from dflash_convert.errors import ValidationFailed
    from dflash_convert.validate.report import render_table, to_json, to_junit
    from dflash_convert.validate.run import validate as run_validation

    out = Output(as_json, quiet)
    if checkpoint is None and options.get("endpoint") is None:
        raise typer.BadParameter("give a CHECKPOINT, or --endpoint URL to measure a live server",
                                 param_hint="CHECKPOINT")
    ckpt_path, ckpt_sha = (out.local(checkpoint, revision=revision, token=token,
                                     allow_pickle=options.get("allow_pickle", False))
                           if checkpoint is not None else (None, None))
    target = options.get("target")
    if target is not None:
        options["target"], options["target_revision"] = out.local(target, token=token, for_target=True)
        options["target_name"] = target
    if num_prompts is not None and num_prompts < 1:
        raise typer.BadParameter(f"must be at least 1, got {num_prompts}", param_hint="--num-prompts")
    opts = ValidateOptions(**options, checkpoint_revision=ckpt_sha,
                           prompt_sets=_prompt_sets(dataset or [], num_prompts, options.get("seed", 0), token, out))
    report = run_validation(ckpt_path, opts, progress=None if quiet else out.status, report_interrupted=True)
    if junit is not None:
        junit.parent.mkdir(parents=True, exist_ok=True)
        junit.write_text(to_junit(report))
    _markdown_reports(report, report_md, out)
    if opts.profile_out is not None:
        _profile_file(report, Path(opts.profile_out), out)
    if as_json:  # stdout holds the JSON: the log still shows the report (-q: its failures, warnings, verdict)
        live.stop()
        render_table(report, err, quiet)
    out.result(to_json(report), render=lambda console, q: render_table(report, console, q))
    if report.incomplete:  # Ctrl-C: the report above holds what was measured; the shells' code for it
        err.print(f"Error: {report.incomplete}; the report is incomplete", markup=False)
        sys.exit(INTERRUPTED_EXIT)
    if not report.passed:
        raise typer.Exit(ValidationFailed.exit_code)


def _profile_file(report, path: Path, out: Output) -> None:
    """--profile-out FILE: the report's speculation_profile.json, written whole or not at all."""
    import json

    if report.speculation_profile is None:
        out.info(f"--profile-out: no end-to-end figures to profile; {path} not written")
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(report.speculation_profile, indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    out.info(f"speculation profile written: {path}")


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


def _markdown_reports(report, path: Optional[Path], out: Output) -> None:
    """--report-md FILE (+ FILE.svg, the chart), and the GitHub Actions step summary when one is open."""
    from dflash_convert.validate.report import acceptance_svg, to_markdown

    svg = acceptance_svg(report)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        image = None
        if svg is not None:
            image_path = path.with_suffix(".svg")
            image_path.write_text(svg, encoding="utf-8")
            image = image_path.name
        from dflash_convert.validate.breakdown import context_svg, output_svg

        curves = []  # tau against context length, against output position: SVG files beside the Markdown
        for suffix, drawn in (("-context-length.svg", context_svg(report)), ("-output-position.svg", output_svg(report))):
            curves.append(None if drawn is None else path.with_name(path.stem + suffix).name)
            if drawn is not None:
                path.with_name(path.stem + suffix).write_text(drawn, encoding="utf-8")
        path.write_text(to_markdown(report, image, *curves), encoding="utf-8")
        out.info(f"Markdown report written: {path}")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:  # an image beside a step summary is not served: the unicode chart stands in
        with open(summary, "a", encoding="utf-8") as f:
            f.write(to_markdown(report) + "\n")
