"""The `dflash-convert` command line: one typer app, each command a thin wrapper over a library call.

Conventions (as the `hf` CLI): `--json` prints exactly one JSON object on stdout; human output,
progress and warnings go to stderr; exit 0 ok, 1 error (one `Error: ...` line), 2 usage,
3 validation ran and failed. `--debug` (before the command) shows tracebacks.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console

from .errors import DFlashError

app = typer.Typer(
    name="dflash-convert",
    help="Convert, inspect, validate and ship DFlash speculative-decoding drafts "
    "(speculators <-> Hugging Face / z-lab formats).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
err = Console(stderr=True, highlight=False, soft_wrap=True)
STATE = {"debug": False}


def emit_json(obj) -> None:
    """The one JSON object of a `--json` run, on stdout."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


def warn(message: str) -> None:
    err.print(f"[yellow]warning:[/yellow] {message}", soft_wrap=True)


def _print_version(value: bool) -> None:
    if value:
        from . import __version__

        typer.echo(__version__)
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="Print the version and exit."),
) -> None:
    STATE["debug"] = debug or bool(os.environ.get("DFLASH_CONVERT_DEBUG"))


def main() -> None:
    """Console-script entry point: run the app, turn known errors into one line and an exit code."""
    debug = "--debug" in sys.argv[1:] or bool(os.environ.get("DFLASH_CONVERT_DEBUG"))
    try:
        rc = app(standalone_mode=False)  # click returns typer.Exit codes instead of exiting
        sys.exit(rc if isinstance(rc, int) else 0)
    except DFlashError as exc:
        if debug:
            raise
        err.print(f"Error: {exc}", markup=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err.print("Error: interrupted; nothing was written at the destination", markup=False)
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - unexpected: still one line unless --debug
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):  # click's usage errors (typer vendors click)
            exc.show(file=sys.stderr)
            sys.exit(exc.exit_code)
        if debug:
            raise
        err.print(f"Error: {type(exc).__name__}: {exc} (rerun with --debug for the traceback)", markup=False,
                  soft_wrap=True)
        sys.exit(1)


# ----------------------------------------------------------------------------- shared option helpers

def parse_int_list(text: Optional[str], flag: str) -> Optional[list[int]]:
    if text is None:
        return None
    try:
        return [int(x) for x in text.replace(" ", "").strip("[]").split(",") if x != ""]
    except ValueError:
        raise typer.BadParameter(f"expected comma-separated integers, got {text!r}", param_hint=flag) from None


def resolve_local(source: str, *, revision: Optional[str], token: Optional[str], allow_pickle: bool = False,
                  for_target: bool = False, config_only: bool = False):
    """A local path as is, or a Hub id downloaded to the cache: (path, commit sha or None)."""
    if revision is None and Path(source).exists():  # the common case stays free of huggingface_hub imports
        return Path(source), None
    from . import hub

    try:
        resolved = hub.resolve_source(source, revision=revision, token=token, allow_pickle=allow_pickle,
                                      for_target=for_target, config_only=config_only)
    except DFlashError as exc:
        if revision is None and hub.is_hub_id(source):  # say both readings of an ambiguous argument
            raise type(exc)(f"{source} is not a local directory, and as a Hub repo id: {exc}") from None
        raise
    return resolved.path, resolved.commit_sha


def status_line(message: str) -> None:
    """One progress line on stderr (also under --json, whose stdout holds only the JSON)."""
    err.print(message, style="dim", markup=False, soft_wrap=True)


def _progress_bar(total: int, description: str):
    from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

    progress = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                        TransferSpeedColumn(), TimeRemainingColumn(), console=err, transient=True,
                        disable=not err.is_terminal)
    task = progress.add_task(description, total=total)
    return progress, (lambda n: progress.advance(task, n))


# ----------------------------------------------------------------------------- convert

@app.command()
def convert(
    src: str = typer.Argument(..., metavar="SRC", help="Checkpoint directory or Hub id (org/name) to convert."),
    output: Path = typer.Option(..., "-o", "--output", help="Destination directory (written atomically)."),
    to: Optional[str] = typer.Option(None, "--to", help="hf or speculators (default: the other format)."),
    verifier: Optional[str] = typer.Option(None, "--verifier", help="Target model directory, its config.json, or Hub id: fills num_target_layers and the verifier block, and checks the pair."),
    mask_token_id: Optional[int] = typer.Option(None, "--mask-token-id", help="Override/supply dflash_config.mask_token_id."),
    target_layer_ids: Optional[str] = typer.Option(None, "--target-layer-ids", help="Override/supply z-lab target layer ids (0-based layer outputs), e.g. 1,9,17,25,33."),
    derive_target_layer_ids: bool = typer.Option(False, "--derive-target-layer-ids", help="Derive missing ids with the published z-lab/SGLang rule (needs --verifier); never done silently."),
    block_size: Optional[int] = typer.Option(None, "--block-size", help="Override/supply the block size."),
    causal: Optional[bool] = typer.Option(None, "--causal/--non-causal", help="Force every draft layer causal or non-causal."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (keep), float32, bfloat16 or float16."),
    max_shard_size: Optional[str] = typer.Option(None, "--max-shard-size", help="Shard the output, HF syntax (e.g. 5GB)."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty destination."),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help="Accept .bin pickle weights (loaded with weights_only=True)."),
    validate_output: bool = typer.Option(False, "--validate", help="Run static + numeric validation on the output before it is committed."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision of SRC (branch, tag or commit)."),
    token: Optional[str] = typer.Option(None, "--token", help="Hub token (default: HF_TOKEN, then the stored token)."),
    push: Optional[str] = typer.Option(None, "--push", help="After converting and validating, push DST to this Hub repo."),
    private: bool = typer.Option(False, "--private", help="With --push: create the repo private."),
    commit_message: Optional[str] = typer.Option(None, "--commit-message", help="With --push."),
    commit_description: Optional[str] = typer.Option(None, "--commit-description", help="With --push."),
    create_pr: bool = typer.Option(False, "--create-pr", help="With --push: open a pull request instead of committing to the branch."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """Convert a DFlash checkpoint between the speculators and HF / z-lab formats."""
    from .convert import ConvertOptions, execute, plan_conversion
    from .checkpoint import check_destination, open_checkpoint

    src_path, src_sha = resolve_local(src, revision=revision, token=token, allow_pickle=allow_pickle)
    verifier_path, verifier_name = None, None
    if verifier is not None:
        verifier_path, _ = resolve_local(verifier, revision=None, token=token, config_only=True)
        verifier_name = verifier
    opts = ConvertOptions(to=to, verifier=verifier_path, verifier_name=verifier_name, mask_token_id=mask_token_id,
                          target_layer_ids=parse_int_list(target_layer_ids, "--target-layer-ids"),
                          derive_target_layer_ids=derive_target_layer_ids, block_size=block_size, causal=causal,
                          dtype=dtype, max_shard_size=max_shard_size, overwrite=overwrite, allow_pickle=allow_pickle,
                          source_revision=src_sha, source_id=src if src_sha else None)
    if max_shard_size is not None:
        from .safetensors_io import parse_size

        try:
            parse_size(max_shard_size)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--max-shard-size") from None
    ckpt = open_checkpoint(src_path, allow_pickle=allow_pickle)
    check_destination(output, overwrite, sources=(ckpt.path,))
    plan = plan_conversion(ckpt, opts)
    for w in plan.warnings:
        warn(w)
    report = None

    def before_commit(tmp: Path) -> None:
        nonlocal report
        if validate_output or push:
            from .validate import validate_output_dir
            from .errors import ValidationFailed

            status_line("validating the converted checkpoint (static, numeric)")
            report = validate_output_dir(tmp, progress=status_line)
            n = report.counts()
            status_line(f"validation {'passed' if report.passed else 'FAILED'}: {n['pass']} passed, {n['fail']} failed, "
                        f"{n['warn']} warnings ({', '.join(report.levels_run)})")
            if report.failed:
                names = ", ".join(c.name for c in report.failed_checks)
                raise ValidationFailed(f"validation of the converted checkpoint failed ({names}); nothing was written")

    progress, advance = _progress_bar(sum(ckpt.tensors[s.source].nbytes for s in plan.kept if s.source), "converting")
    with progress:
        record = execute(plan, output, opts, on_progress=advance, before_commit=before_commit)
    result = {"output": str(output), "source_format": record.source_format,
              "destination_format": record.destination_format, "tensors_kept": len(record.tensors_kept),
              "tensors_dropped": record.tensors_dropped, "tensors_added": record.tensors_added,
              "warnings": record.warnings, "source_revision": record.source_revision}
    if report is not None:
        result["validation"] = report.summary()
    if push:
        from . import hub

        pushed = hub.push(output, push, revision=None, private=private, commit_message=commit_message,
                          commit_description=commit_description, create_pr=create_pr, token=token,
                          validation=report.summary() if report is not None else None)
        result["push"] = pushed.to_dict()
    if as_json:
        emit_json(result)
    else:
        err.print(f"converted {ckpt.format} -> {record.destination_format}: {output} "
                  f"({len(record.tensors_kept)} tensors kept, {len(record.tensors_dropped)} dropped)")
        for name, reason in record.tensors_dropped.items():
            err.print(f"  dropped {name}: {reason}")
        for name, how in record.tensors_added.items():
            err.print(f"  added {name}: {how}")
        if push:
            typer.echo(result["push"].get("pr_url") or result["push"].get("commit_url"))


# ----------------------------------------------------------------------------- inspect / diff / schema

@app.command()
def inspect(
    path: str = typer.Argument(..., metavar="PATH", help="Checkpoint directory or Hub id."),
    scan: bool = typer.Option(False, "--scan", help="Also read tensor values (NaN/Inf, all-zero); imports torch."),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help="Accept .bin pickle weights (weights_only=True)."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision (branch, tag or commit)."),
    token: Optional[str] = typer.Option(None, "--token", help="Hub token."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """Show the format, the values engines read, the tensors, and every problem found (exit 3 if any fails)."""
    from .inspect import inspect_checkpoint
    from .errors import ValidationFailed

    local, sha = resolve_local(path, revision=revision, token=token, allow_pickle=allow_pickle)
    info = inspect_checkpoint(local, scan=scan, allow_pickle=allow_pickle)
    info["revision"] = sha
    if as_json:
        emit_json(info)
    else:
        _print_inspect(info)
    if not info["ok"]:
        raise typer.Exit(ValidationFailed.exit_code)


def _print_inspect(info: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    summary = Table(show_header=False, box=None, pad_edge=False)
    for key, value in info.items():
        if key in ("tensors", "checks", "problems", "files", "ok"):
            continue
        summary.add_row(key, f"{value:,}" if key == "parameters" else escape(str(value)))
    err.print(summary)
    tensors = Table("tensor", "dtype", "shape", "role", title=f"{len(info['tensors'])} tensors", title_justify="left")
    for t in info["tensors"]:
        tensors.add_row(escape(t["name"]), t["dtype"], escape(str(t["shape"])), escape(t["role"]))
    err.print(tensors)
    if info["problems"]:
        for c in info["problems"]:
            colour = "red" if c["status"] == "fail" else "yellow"
            err.print(f"[{colour}]{c['status'].upper()}[/{colour}] {c['name']}: {escape(c['message'])}")
    else:
        err.print("[green]no problems found[/green]")


@app.command()
def diff(
    a: str = typer.Argument(..., metavar="A", help="First checkpoint (directory or Hub id)."),
    b: str = typer.Argument(..., metavar="B", help="Second checkpoint (directory or Hub id)."),
    tolerance: float = typer.Option(0.0, "--tolerance", help="Max abs difference still counted as equal."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision for Hub ids."),
    token: Optional[str] = typer.Option(None, "--token", help="Hub token."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """Compare two checkpoints (also across formats): exit 0 when equivalent, 3 when not."""
    from .diff import diff_checkpoints

    pa, _ = resolve_local(a, revision=revision, token=token)
    pb, _ = resolve_local(b, revision=revision, token=token)
    result = diff_checkpoints(pa, pb, tolerance=tolerance)
    if as_json:
        emit_json(result.to_dict())
    else:
        err.print(f"{a} ({result.format_a}) vs {b} ({result.format_b})")
        for key, v in result.config.items():
            err.print(f"  config {key}: {v['a']!r} != {v['b']!r}")
        for name, t in result.tensors.items():
            if t["status"] != "equal":
                extra = f" (max abs diff {t['max_abs_diff']})" if "max_abs_diff" in t else ""
                err.print(f"  tensor {name}: {t['status']}{extra}")
        equal = sum(t["status"] == "equal" for t in result.tensors.values())
        err.print(f"{equal}/{len(result.tensors)} tensors equal, {len(result.config)} config differences, "
                  f"{len(result.ignored)} tensors ignored (dropped by design): "
                  + ("[green]equivalent[/green]" if result.equivalent else "[red]different[/red]"))
    if not result.equivalent:
        raise typer.Exit(3)


@app.command()
def schema(
    name: Optional[str] = typer.Argument(None, metavar="NAME", help="speculators-config, hf-config, conversion-record or validation-report; all when omitted."),
) -> None:
    """Print the JSON Schemas of the files and reports dflash-convert reads and writes."""
    from . import schemas

    if name is None:
        emit_json({n: schemas.schema(n) for n in schemas.NAMES})
        return
    if name not in schemas.NAMES:
        raise typer.BadParameter(f"unknown schema {name!r}; choose from {', '.join(schemas.NAMES)}", param_hint="NAME")
    sys.stdout.write(schemas.render(name))


# ----------------------------------------------------------------------------- Hub: pull / push (issue 5)

@app.command()
def pull(
    repo: str = typer.Argument(..., metavar="REPO", help="Hub repo id (org/name)."),
    output: Optional[Path] = typer.Option(None, "-o", "--output", help="Materialize the files in DIR instead of only the cache."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Branch, tag or commit (default: main)."),
    token: Optional[str] = typer.Option(None, "--token", help="Hub token (default: HF_TOKEN, then the stored token)."),
    allow_pickle: bool = typer.Option(False, "--allow-pickle", help="Also fetch .bin/.pt pickle weights."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """Download a DFlash checkpoint from the Hub (config, safetensors, index, README); prints its local path."""
    from . import hub

    resolved = hub.pull(repo, output, revision=revision, token=token, allow_pickle=allow_pickle)
    if as_json:
        emit_json(resolved.to_dict())
    else:
        err.print(f"pulled {repo}@{resolved.revision} (commit {resolved.commit_sha})", markup=False)
        typer.echo(str(resolved.path))


@app.command()
def push(
    directory: Path = typer.Argument(..., metavar="DIRECTORY", help="Checkpoint directory to upload."),
    repo: str = typer.Argument(..., metavar="REPO", help="Hub repo id (org/name); created if missing."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Branch to push to (created from main if missing)."),
    private: bool = typer.Option(False, "--private", help="Create the repo private."),
    commit_message: Optional[str] = typer.Option(None, "--commit-message", help="Commit title."),
    commit_description: Optional[str] = typer.Option(None, "--commit-description", help="Commit description."),
    create_pr: bool = typer.Option(False, "--create-pr", help="Open a pull request instead of committing to the branch."),
    token: Optional[str] = typer.Option(None, "--token", help="Hub token (default: HF_TOKEN, then the stored token)."),
    no_validate: bool = typer.Option(False, "--no-validate", help="Push even if static validation fails."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON object on stdout."),
) -> None:
    """Upload a checkpoint directory in one commit, with a README model card; prints the commit (or PR) URL."""
    from . import hub
    from .errors import ValidationFailed

    validation = None
    if not no_validate:
        from .checkpoint import open_checkpoint
        from .checks import checkpoint_checks

        checks = checkpoint_checks(open_checkpoint(directory))
        failed = [c for c in checks if c.status == "fail"]
        if failed:
            names = ", ".join(f"{c.name} ({c.message})" if c.message else c.name for c in failed)
            raise ValidationFailed(f"{directory}: static validation failed: {names}; nothing was pushed "
                                   "(--no-validate pushes anyway)")
        validation = {"static checks": "passed" if all(c.status != "warn" for c in checks) else "passed with warnings",
                      "checks": [c.model_dump(include={"name", "status", "message"}) for c in checks]}
    result = hub.push(directory, repo, revision=revision, private=private, commit_message=commit_message,
                      commit_description=commit_description, create_pr=create_pr, token=token, validation=validation)
    url = result.pr_url or result.commit_url
    if as_json:
        emit_json(result.to_dict())
    else:
        typer.echo(url)


# ----------------------------------------------------------------------------- validate (issue 4)

@app.command()
def validate(
    checkpoint: str = typer.Argument(..., metavar="CHECKPOINT", help="Draft checkpoint (either format): directory or Hub id."),
    target: Optional[str] = typer.Option(None, "--target", help="Target model directory, its config.json, or Hub id. A config alone enables the static pair checks; weights enable end to end."),
    prompts: Optional[Path] = typer.Option(None, "--prompts", help="One prompt per line (text, or token ids as space-separated ints / a JSON list), or JSONL with a `prompt` field. Default: a built-in set."),
    max_new_tokens: int = typer.Option(64, "--max-new-tokens", help="Tokens generated per prompt (end to end)."),
    block_size: Optional[int] = typer.Option(None, "--block-size", help="Run-time block size (default: the draft's)."),
    temperature: float = typer.Option(0.0, "--temperature", help="0 = greedy (output must equal the target's)."),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda."),
    dtype: str = typer.Option("auto", "--dtype", help="auto (float32 on CPU, the checkpoint's on GPU), float32, bfloat16, float16."),
    backend: str = typer.Option("auto", "--backend", help="Draft attention backend: auto (numeric level tries every available one), eager, sdpa, flex, flash_attn."),
    target_backend: str = typer.Option("sdpa", "--target-backend", help="The target's attn_implementation (eager, sdpa, flex_attention, ...)."),
    causal: Optional[bool] = typer.Option(None, "--causal/--non-causal", help="Run every draft layer causal / non-causal, as a deployment would force (default: as the checkpoint declares)."),
    min_acceptance_length: Optional[float] = typer.Option(None, "--min-acceptance-length", help="Fail when tau (mean tokens per step) is lower."),
    min_position_rates: Optional[str] = typer.Option(None, "--min-position-rates", help="Comma-separated minimum acceptance rate per draft position, e.g. 0.9,0.8,0.7."),
    levels: Optional[str] = typer.Option(None, "--levels", help="Comma-separated subset of static,numeric,end_to_end (default: all the inputs allow)."),
    as_json: bool = typer.Option(False, "--json", help="Print the report as one JSON object on stdout."),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Also write a JUnit XML report (one testcase per check) to FILE."),
    revision: Optional[str] = typer.Option(None, "--revision", help="Hub revision of CHECKPOINT."),
    token: Optional[str] = typer.Option(None, "--token", help="Hub token (default: HF_TOKEN, then the stored token)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the synthetic inputs and of sampling."),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads for torch (default: 1 for tiny pairs, else torch's; shown in the report)."),
    draft_sampling: str = typer.Option("greedy", "--draft-sampling", help="greedy (the draft's argmax, vLLM's default) or probabilistic (sampled at --temperature, accepted by rejection sampling)."),
    device_map: Optional[str] = typer.Option(None, "--device-map", help="Place the target with transformers + accelerate: auto, balanced or sequential (GPUs, then CPU, then disk)."),
    max_memory: Optional[str] = typer.Option(None, "--max-memory", help="Per-device budget for --device-map, e.g. 0=20GiB,cpu=30GiB (implies --device-map auto)."),
    min_speedup: Optional[float] = typer.Option(None, "--min-speedup", help="Fail when the measured speedup is lower (otherwise it is informational)."),
    keep_going: bool = typer.Option(False, "--keep-going", help="Run numeric and end-to-end levels even when static checks failed."),
) -> None:
    """Check a draft before deployment: static, numeric and end-to-end levels; exit 0 passed, 3 a check failed."""
    from .report import render_table, to_json, to_junit
    from .validate import validate as run_validation

    if backend not in ("auto", "eager", "sdpa", "flex", "flash_attn"):
        raise typer.BadParameter(f"{backend!r}: choose auto, eager, sdpa, flex or flash_attn", param_hint="--backend")
    rates = None
    if min_position_rates is not None:
        try:
            rates = [float(x) for x in min_position_rates.replace(" ", "").split(",") if x]
        except ValueError:
            raise typer.BadParameter(f"expected comma-separated numbers, got {min_position_rates!r}",
                                     param_hint="--min-position-rates") from None
    level_list = None
    if levels is not None:
        level_list = [x for x in levels.replace(" ", "").split(",") if x]
        bad = [x for x in level_list if x not in ("static", "numeric", "end_to_end")]
        if bad:
            raise typer.BadParameter(f"unknown level(s) {bad}; choose from static, numeric, end_to_end",
                                     param_hint="--levels")
    if threads is not None and threads < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--threads")
    if draft_sampling not in ("greedy", "probabilistic"):
        raise typer.BadParameter(f"{draft_sampling!r}: choose greedy or probabilistic", param_hint="--draft-sampling")
    if device_map is not None and device_map not in ("auto", "balanced", "sequential"):
        raise typer.BadParameter(f"{device_map!r}: choose auto, balanced or sequential", param_hint="--device-map")
    budget = None
    if max_memory is not None:
        from .memory import parse_max_memory

        try:
            budget = parse_max_memory(max_memory)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--max-memory") from None
    ckpt_path, ckpt_sha = resolve_local(checkpoint, revision=revision, token=token)
    target_path, target_sha = (None, None)
    if target is not None:
        target_path, target_sha = resolve_local(target, revision=None, token=token, for_target=True)
    report = run_validation(ckpt_path, target=target_path, prompts=prompts, max_new_tokens=max_new_tokens,
                            block_size=block_size, temperature=temperature, device=device, dtype=dtype,
                            backend=backend, target_backend=target_backend, causal=causal,
                            min_acceptance_length=min_acceptance_length, min_position_rates=rates, levels=level_list,
                            checkpoint_revision=ckpt_sha, target_revision=target_sha, target_name=target, seed=seed,
                            threads=threads, draft_sampling=draft_sampling, device_map=device_map, max_memory=budget,
                            min_speedup=min_speedup, keep_going=keep_going, progress=status_line)
    if junit is not None:
        junit.parent.mkdir(parents=True, exist_ok=True)
        junit.write_text(to_junit(report))
    render_table(report, err)
    if as_json:
        emit_json(to_json(report))
    if not report.passed:
        raise typer.Exit(3)
