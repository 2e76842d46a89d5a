"""The `dflash-convert` command line: one typer app, each command a thin wrapper over a library call.

Conventions (as the `hf` CLI): `-h`/`--help`; results (the inspect view, the diff summary, the
validation report and its verdict, convert's summary, a pulled path or pushed URL) on stdout;
progress, info lines, warnings and errors on stderr; `--json` prints exactly one JSON object on
stdout, errors included (`{"error": {"message", "file", "exit_code"}}`); `-q` keeps the verdict
line, failures, warnings and errors. Plain text when not a terminal (rich's own rule) or with
NO_COLOR. Exit 0 ok, 1 error, 2 usage, 3 validation ran and failed, 130 interrupted (Ctrl-C; 128 +
the signal for other stop signals). `--debug` anywhere on the line (or HF_DEBUG=1,
DFLASH_CONVERT_DEBUG=1) shows tracebacks.
"""

import enum
import json
import os
import re
import signal
import sys
import traceback
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, Callable, Iterator, Optional, get_args

import typer
from rich.console import Console

from dflash_runtime import BACKEND_NAMES, DEVICE_MAPS, DRAFT_SAMPLING

from dflash_convert import schemas
from dflash_convert.format.configs import Format, is_hub_id
from dflash_convert.format.dtypes import CAST_TARGETS, DTYPES, code_for_name
from dflash_convert.format.engines import ENGINE_NAMES
from dflash_convert.errors import DFlashError, Interrupted, missing_extra
from dflash_convert.validate.checks import Level
from dflash_convert.validate.options import ENGINE_TIMEOUT_S, SAMPLING_MODES

app = typer.Typer(
    name="dflash-convert",
    help="Convert, inspect, validate and ship DFlash speculative-decoding drafts "
    "(speculators <-> Hugging Face / z-lab formats).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,  # click's plain help: wraps at any width, never cuts a flag name
    context_settings={"help_option_names": ["-h", "--help"]},
)
err = Console(stderr=True, highlight=False, soft_wrap=True)
out_console = Console(highlight=False, soft_wrap=True)  # results: lines kept whole for grep; tables fit the width


def _choices(name: str, values) -> type[enum.Enum]:
    """An Enum of the library's own names, so --help lists the choices and click checks them."""
    return enum.Enum(name, {v: v for v in values}, type=str)


To = _choices("To", get_args(Format))
DType = _choices("DType", ("auto", *CAST_TARGETS, *(d.short for d in DTYPES.values() if d.cast_target)))
Backend = _choices("Backend", ("auto", *BACKEND_NAMES))
DraftSampling = _choices("DraftSampling", DRAFT_SAMPLING)
SamplingMode = _choices("SamplingMode", SAMPLING_MODES)
DeviceMap = _choices("DeviceMap", DEVICE_MAPS)
Engine = _choices("Engine", ENGINE_NAMES)
LEVELS = get_args(Level)


def _value(choice: enum.Enum | None) -> str | None:
    return None if choice is None else choice.value


def _dtype_name(choice: enum.Enum) -> str:
    """auto, or the torch name of a --dtype spelling (bf16 -> bfloat16)."""
    return "auto" if choice.value == "auto" else DTYPES[code_for_name(choice.value)].torch


def _csv(kind: Callable[[str], Any], choices: tuple[str, ...] | None = None):
    """Parse a comma-separated option ("1,9,17" or "[1, 9, 17]") into a list, checking each item."""

    def parse(text: Optional[str]) -> Optional[list]:
        if text is None:
            return None
        try:
            items = [kind(x) for x in text.replace(" ", "").strip("[]").split(",") if x != ""]
        except ValueError:
            raise typer.BadParameter(f"expected comma-separated {kind.__name__} values, got {text!r}") from None
        bad = [x for x in items if choices is not None and x not in choices]
        if bad:
            raise typer.BadParameter(f"unknown {', '.join(map(str, bad))}; choose from {', '.join(choices)}")
        return items

    return parse


def _one_of(choices: tuple[str, ...]):
    """Check a value against `choices` (for lists too long for a metavar: the help names them, wrapped)."""

    def check(value: Optional[str]) -> Optional[str]:
        if value is not None and value not in choices:
            raise typer.BadParameter(f"{value!r} is not one of the choices: {', '.join(choices)}")
        return value

    return check


def _json_object(text: Optional[str]) -> Optional[dict[str, Any]]:
    """Parse a JSON object option ('{"enable_thinking": false}')."""
    if text is None:
        return None
    try:
        value = json.loads(text)
    except ValueError:
        raise typer.BadParameter(f"not valid JSON: {text[:80]!r}") from None
    if not isinstance(value, dict):
        raise typer.BadParameter(f"expected a JSON object, got {text[:80]!r}")
    return value


def _flag(*names: str, help: str, **kw: Any):
    """A boolean switch, shown as a flag (no `<bool>` value column in --help)."""
    return typer.Option(*names, help=help, metavar="", show_default=False, **kw)


def _json_object(text: Optional[str]) -> Optional[dict[str, Any]]:
    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc.msg} at character {exc.pos}") from None
    if not isinstance(value, dict):
        raise typer.BadParameter("a JSON object is needed, e.g. '{\"dtype\": \"float32\"}'")
    return value


def _max_memory(text: Optional[str]) -> Optional[dict[str, int]]:
    from dflash_convert.validate.memory import parse_max_memory

    try:
        return None if text is None else parse_max_memory(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def _examples(*lines: str) -> str:
    return "Examples:\n\n\b\n" + "\n".join(f"  $ {line}" for line in lines)  # \b: click keeps the lines


# ----------------------------------------------------------------------------- shared options (declared once)

Source = Annotated[str, typer.Argument(metavar="SRC", help="Checkpoint directory or Hub repo id (org/name).")]
Revision = Annotated[Optional[str], typer.Option("--revision", help="Hub revision: branch, tag or commit sha "
                                                 "(default: main).")]
Token = Annotated[Optional[str], typer.Option("--token", help="Hub token (default: HF_TOKEN, then the stored "
                                              "token).")]
Json = Annotated[bool, _flag("--json", help="Print one JSON object on stdout (errors too).")]
Quiet = Annotated[bool, _flag("-q", "--quiet", help="Print only the verdict line, failures, warnings and errors "
                              "(no progress, no passing checks).")]
AllowPickle = Annotated[bool, _flag("--allow-pickle", help="Accept pickle files: .bin/.pt weights, and for validate "
                                    "a mask_embedding.pt (loaded with "
                                    "weights_only=True).")]
Causal = Annotated[Optional[bool], _flag("--causal/--non-causal", help="Force every draft layer causal / "
                                         "non-causal (default: as the checkpoint declares).")]
Private = Annotated[bool, _flag("--private", help="Create the Hub repo private.")]
CommitMessage = Annotated[Optional[str], typer.Option("--commit-message", help="Commit title.")]
CommitDescription = Annotated[Optional[str], typer.Option("--commit-description", help="Commit description.")]
CreatePr = Annotated[bool, _flag("--create-pr", help="Open a pull request instead of committing to the branch.")]
EngineOpt = Annotated[Optional[Engine], typer.Option("--engine", help="A serving engine: show only its view "
                                                     "(inspect), or run the draft as it would (validate).")]


# ----------------------------------------------------------------------------- output

class Output:
    """Where a command's words go: its result on stdout (one JSON object under --json), the rest on stderr."""

    def __init__(self, as_json: bool = False, quiet: bool = False):
        self.json, self.quiet = as_json, quiet

    def hub(self):
        """The hub module, the Hub client's own tqdm bars off under --json / -q / not a terminal (its switch).

        Asked for only where the Hub is used: local work never imports huggingface_hub.
        """
        from dflash_convert.hub import client as hub

        hub.say_info = not self.quiet
        if self.json or self.quiet or not err.is_terminal:  # as `hf`: bars only where someone watches
            from huggingface_hub.utils import disable_progress_bars

            disable_progress_bars()
        return hub

    def local(self, source: str, *, revision: Optional[str] = None, token: Optional[str] = None,
              allow_pickle: bool = False, for_target: bool = False, config_only: bool = False,
              verify_weights: bool = True):
        """A local path as is, or a Hub id downloaded to the cache: (path, commit sha or None)."""
        if revision is None and Path(source).exists():  # the common case stays free of huggingface_hub imports
            return Path(source), None
        hub = self.hub()
        try:
            resolved = hub.resolve_source(source, revision=revision, token=token, allow_pickle=allow_pickle,
                                          for_target=for_target, config_only=config_only,
                                          verify_weights=verify_weights)
        except DFlashError as exc:
            if revision is None and is_hub_id(source):  # say both readings of an ambiguous argument
                raise type(exc)(f"{source} is not a local directory, and as a Hub repo id: {exc}") from None
            raise
        return resolved.path, resolved.commit_sha

    def info(self, text: str, *, markup: bool = False) -> None:
        if not self.quiet:
            err.print(text, markup=markup)

    def status(self, text: str) -> None:
        """A progress line of a long step (also under --json: stdout holds only the JSON). On a terminal the
        step being run stays on a live line with its elapsed time, and a counted step (io.progress.Step)
        is a bar with an ETA instead of one line per count."""
        if self.quiet:
            return
        counted = getattr(text, "total", None) is not None
        if not err.is_terminal or self.json:
            err.print(text, style="dim", markup=False)
            return
        if not counted or text.done >= text.total:
            err.print(text, style="dim", markup=False)
        _live.show(text)

    def warn(self, text: str) -> None:
        err.print(f"[yellow]warning:[/yellow] {_escape(text)}")

    def result(self, obj: Any, text: Optional[str] = None,
               render: Optional[Callable[[Console, bool], None]] = None) -> None:
        """The command's answer on stdout: `obj` as JSON under --json; else `render(console, quiet)` (under -q
        only its verdict line, failures and warnings) and/or `text`."""
        _live.stop()
        if self.json:
            emit_json(obj)
            return
        if render is not None:
            render(out_console, self.quiet)
        if text is not None:
            typer.echo(text)

    @contextmanager
    def progress(self, description: str, then: Optional[str] = None) -> Iterator[Callable[[int, int], None]]:
        """A byte-progress bar (size, rate, ETA) on a terminal (none under --json / -q); yields update(done,
        total). `then`: what runs after the last byte, shown as a live step until the next line prints."""
        from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

        shown = not (self.json or self.quiet or not err.is_terminal)
        bar = Progress("[progress.description]{task.description}", BarColumn(), DownloadColumn(),
                       TransferSpeedColumn(), TimeRemainingColumn(), console=err, transient=True, disable=not shown)
        task = bar.add_task(description, total=None)
        _live.stop()
        bar.start()  # at once: planning and the first large tensor are not silent

        def update(done: int, total: int) -> None:
            if bar.live.is_started:
                bar.update(task, completed=done, total=total, refresh=True)
                if done >= total:  # stop before whatever follows (validation, push) prints
                    bar.stop()
                    if shown and then:
                        _live.show(then)

        try:
            yield update
        finally:
            bar.stop()


class _LiveStep:
    """The one live line on a terminal (stderr): the current step, its elapsed time, and for a counted step
    its count and ETA; removed before anything else prints its result."""

    def __init__(self) -> None:
        self.bar: Any = None

    def show(self, text: str) -> None:
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn

        counted = getattr(text, "total", None) is not None
        if self.bar is not None and self.counted != counted:
            self.stop()
        if self.bar is None:
            self.counted = counted
            columns = [SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn()]
            if counted:
                columns[2:2] = [BarColumn(bar_width=24)]
                columns += [TextColumn("ETA"), TimeRemainingColumn()]
            self.bar = Progress(*columns, console=err, transient=True)
            self.task = self.bar.add_task(str(text), total=text.total if counted else None,
                                          completed=text.done if counted else 0)
            self.bar.start()
        elif counted:
            self.bar.update(self.task, description=str(text), total=text.total, completed=text.done)
        else:
            self.bar.reset(self.task, description=str(text), total=None)

    def stop(self) -> None:
        if self.bar is not None:
            self.bar.stop()
            self.bar = None


_live = _LiveStep()


def emit_json(obj: Any) -> None:
    """The one JSON object of a `--json` run, on stdout."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


# ----------------------------------------------------------------------------- entry point

def _print_version(value: bool) -> None:
    if value:
        from dflash_convert import __version__

        typer.echo(__version__)
        raise typer.Exit(0)


@app.callback()
def _root(
    debug: Annotated[bool, _flag("--debug", help="Show tracebacks on errors (accepted anywhere on the line; "
                                        "also HF_DEBUG=1).")] = False,
    version: Annotated[bool, _flag("--version", is_eager=True, callback=_print_version,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Convert, inspect, validate and ship DFlash speculative-decoding drafts."""


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no", "off")


def _fail(message: str, *, exit_code: int, file: Optional[str], as_json: bool, debug: bool) -> None:
    _quiet_interrupts()
    _live.stop()
    if debug:
        traceback.print_exc()
    err.print(f"Error: {message}", markup=False, soft_wrap=True)
    if as_json:
        emit_json({"error": {"message": message, "file": file, "exit_code": exit_code}})
    sys.exit(exit_code)


def _on_sigint(handler) -> None:
    """Install a SIGINT handler unless SIGINT is ignored (nohup, `&`), or this is not the main thread."""
    try:
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            signal.signal(signal.SIGINT, handler)
    except (ValueError, TypeError):  # not the main thread; a handler Python did not install
        pass


def _quiet_interrupts() -> None:
    """From here to the exit a Ctrl-C still ends the process with its one line, never a traceback."""
    from dflash_convert.__main__ import interrupted_now
    from dflash_convert.io.staging import stopping

    # once a stop signal is being answered, a second one must not add a line (or cut the first short)
    _on_sigint(signal.SIG_IGN if stopping() else interrupted_now)


def _usage_message(exc: Exception) -> str:
    """click's message, with typer's pydantic wording of a bad choice said plainly."""
    text = exc.format_message()
    bad = re.search(r"Value error, (.+) is not one of (.+?)\.?$", text)
    if bad:
        choices = ", ".join(c.strip(" '") for c in bad.group(2).split(","))
        text = text[: bad.start()] + f"{bad.group(1)} is not one of the choices: {choices}"
    return text


def main(argv: Optional[list[str]] = None) -> None:
    """Console-script entry point: run the app, turn every error into one line (and JSON) and an exit code.

    The SIGINT handler it found is put back when it returns (the console script's says `interrupted` until
    the process ends; an in-process caller, e.g. a test, gets its own back)."""
    previous = signal.getsignal(signal.SIGINT)
    try:
        _main(argv)
    finally:
        if previous is not None:
            _on_sigint(previous)


def _main(argv: Optional[list[str]]) -> None:
    from dflash_convert.__main__ import INTERRUPTED, INTERRUPTED_EXIT

    args = list(sys.argv[1:] if argv is None else argv)
    end = args.index("--") if "--" in args else len(args)  # after `--` everything is an argument
    debug = "--debug" in args[:end] or _env_flag("HF_DEBUG") or _env_flag("DFLASH_CONVERT_DEBUG")
    as_json = "--json" in args[:end]
    args = [a for i, a in enumerate(args) if not (a == "--debug" and i < end)]
    from dflash_convert.io.staging import STOP_SIGNALS, stop_on_signals

    try:
        _on_sigint(signal.default_int_handler)  # from here a Ctrl-C is a KeyboardInterrupt
        from dflash_convert.hub.tokens import redact_output

        redact_output(args)  # before anything can print: no token in any stream, traceback or warning
        # SIGTERM, SIGHUP, SIGQUIT end any command (a Hub download too) with one line; a second one is ignored
        with stop_on_signals(tuple(s for s in STOP_SIGNALS if s != signal.SIGINT)):
            rc = app(args=args, prog_name="dflash-convert", standalone_mode=False)  # typer.Exit codes come back
        _quiet_interrupts()
        _live.stop()
        if rc == INTERRUPTED_EXIT:  # typer turns a KeyboardInterrupt into this code, silently
            _fail(INTERRUPTED, exit_code=INTERRUPTED_EXIT, file=None, as_json=as_json, debug=False)
        sys.exit(rc if isinstance(rc, int) else 0)
    except (DFlashError, Interrupted) as exc:  # Interrupted: a stop signal during a write (staging already gone)
        _fail(str(exc), exit_code=exc.exit_code, file=exc.file, as_json=as_json, debug=debug)
    except (KeyboardInterrupt, typer.Abort):
        _fail(INTERRUPTED, exit_code=INTERRUPTED_EXIT, file=None, as_json=as_json, debug=debug)
    except Exception as exc:  # noqa: BLE001 - unexpected: still one line unless --debug
        missing = missing_extra(exc) if isinstance(exc, ModuleNotFoundError) else None
        if missing is not None:  # an optional dependency: name the extra that installs it
            _fail(str(missing), exit_code=missing.exit_code, file=None, as_json=as_json, debug=debug)
        if hasattr(exc, "format_message") and hasattr(exc, "exit_code"):  # click's usage errors
            _quiet_interrupts()
            _live.stop()
            message = _usage_message(exc)
            if as_json:
                emit_json({"error": {"message": message, "file": None, "exit_code": exc.exit_code}})
            if getattr(exc, "ctx", None) is not None:
                typer.echo(exc.ctx.get_usage() + f"\nTry '{exc.ctx.command_path} -h' for help.\n", err=True)
            typer.echo(f"Error: {message}", err=True)
            sys.exit(exc.exit_code)
        _fail(f"{type(exc).__name__}: {exc}" + ("" if debug else " (rerun with --debug for the traceback)"),
              exit_code=1, file=None, as_json=as_json, debug=debug)


# ----------------------------------------------------------------------------- convert

@app.command(epilog=_examples(
    "dflash-convert convert ./draft-speculators -o ./draft-hf",
    "dflash-convert convert org/draft --revision v1 -o ./draft-hf --verifier Qwen/Qwen3-8B --validate",
    "dflash-convert convert ./draft-hf -o ./out --to speculators --dtype bfloat16 --max-shard-size 5GB",
    "dflash-convert convert ./draft -o ./draft-hf --push org/draft-hf --create-pr"))
def convert(
    src: Source,
    output: Annotated[Path, typer.Option("-o", "--output", help="Destination directory (written atomically).")],
    to: Annotated[Optional[To], typer.Option("--to", help="Destination format (default: the other one).")] = None,
    verifier: Annotated[Optional[str], typer.Option("--verifier", help="Target model directory, its config.json, "
                                                    "or Hub id: fills num_target_layers and the verifier block, "
                                                    "and checks the pair.")] = None,
    mask_token_id: Annotated[Optional[int], typer.Option("--mask-token-id", help="Override/supply the mask token "
                                                         "id.")] = None,
    target_layer_ids: Annotated[Optional[str], typer.Option(
        "--target-layer-ids", metavar="IDS", callback=_csv(int),
        help="Override/supply z-lab target layer ids (0-based layer outputs), e.g. 1,9,17,25,33.")] = None,
    derive_target_layer_ids: Annotated[bool, _flag(
        "--derive-target-layer-ids", help="Derive missing ids with the published z-lab/SGLang rule (needs "
        "--verifier); never done silently.")] = False,
    no_verifier: Annotated[bool, _flag(
        "--no-verifier", help="Write a speculators output that names no verifier (vLLM cannot serve it).")] = False,
    block_size: Annotated[Optional[int], typer.Option("--block-size", help="Override/supply the block size.")] = None,
    causal: Causal = None,
    dtype: Annotated[DType, typer.Option("--dtype", help="Floating-point dtype written (auto keeps each "
                                         "tensor's).")] = DType.auto,
    max_shard_size: Annotated[Optional[str], typer.Option("--max-shard-size", help="Shard the output, HF syntax "
                                                          "(e.g. 5GB).")] = None,
    overwrite: Annotated[bool, _flag("--overwrite", help="Replace a non-empty destination.")] = False,
    allow_pickle: AllowPickle = False,
    validate: Annotated[bool, _flag("--validate", help="Run static + numeric validation on the output before it "
                                    "is committed (always done with --push).")] = False,
    strict: Annotated[bool, _flag("--strict", help="Fail (exit 3, nothing written) when the output has any problem "
                                  "`inspect` reports; without it they are warnings.")] = False,
    revision: Revision = None,
    token: Token = None,
    push: Annotated[Optional[str], typer.Option("--push", metavar="REPO", help="Then push the output to this Hub "
                                                "repo (created if missing).")] = None,
    push_revision: Annotated[Optional[str], typer.Option("--push-revision", help="With --push: the branch to push "
                                                         "to (default: main).")] = None,
    private: Private = False,
    commit_message: CommitMessage = None,
    commit_description: CommitDescription = None,
    create_pr: CreatePr = False,
    as_json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Convert a DFlash checkpoint between the speculators and HF / z-lab formats."""
    from dflash_convert.convert.conversion import ConvertOptions
    from dflash_convert.publish import convert_and_publish

    out = Output(as_json, quiet)
    # the weights are hashed against their Hub cache names in the conversion's own read of them
    src_path, src_sha = out.local(src, revision=revision, token=token, allow_pickle=allow_pickle,
                                  verify_weights=False)
    verifier_path = out.local(verifier, token=token, config_only=True)[0] if verifier else None
    opts = ConvertOptions(to=_value(to), verifier=verifier_path, verifier_name=verifier, mask_token_id=mask_token_id,
                          target_layer_ids=target_layer_ids, derive_target_layer_ids=derive_target_layer_ids,
                          block_size=block_size, causal=causal, dtype=_dtype_name(dtype), max_shard_size=max_shard_size,
                          overwrite=overwrite, allow_pickle=allow_pickle, no_verifier=no_verifier,
                          source_revision=src_sha, source_id=src if src_sha else None)
    if push:
        out.hub()
    push_options = dict(revision=push_revision, private=private, commit_message=commit_message,
                        commit_description=commit_description, create_pr=create_pr, token=token)
    with out.progress("converting", then="checking the inputs: sha256 of each file, NaN/Inf") as update:
        done = convert_and_publish(src_path, output, opts, validate=validate, push=push, push_options=push_options,
                                   on_progress=update, on_warning=out.warn, on_status=out.status, strict=strict)
    record = done.record
    lines = [f"converted {record.source_format} -> {record.destination_format}: {output} "
             f"({len(record.tensors_kept)} tensors kept, {len(record.tensors_dropped)} dropped)"]
    if not quiet:
        lines += [f"  dropped {name}: {reason}" for name, reason in record.tensors_dropped.items()]
        lines += [f"  added {name}: {how}" for name, how in record.tensors_added.items()]
        lines += [f"  config {c.key} {c.change}" + (f": {c.why}" if c.why else "") for c in record.config_changes]
    if done.push:
        lines.append(done.push.pr_url or done.push.commit_url)
    out.result(done.to_dict(), "\n".join(lines))


# ----------------------------------------------------------------------------- inspect / diff / schema

@app.command(epilog=_examples(
    "dflash-convert inspect ./draft",
    "dflash-convert inspect org/draft --revision v1 --json",
    "dflash-convert inspect ./draft --scan --engine sglang"))
def inspect(
    path: Source,
    scan: Annotated[bool, _flag("--scan", help="Also read tensor values (NaN/Inf, all-zero); imports torch.")] = False,
    allow_pickle: AllowPickle = False,
    revision: Revision = None,
    token: Token = None,
    engine: EngineOpt = None,
    as_json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Show the format, what each engine will apply, the tensors, and every problem found (exit 3 if any fails)."""
    from dflash_convert.errors import ValidationFailed
    from dflash_convert.validate.inspect import inspect_checkpoint

    out = Output(as_json, quiet)
    local, sha = out.local(path, revision=revision, token=token, allow_pickle=allow_pickle)
    report = inspect_checkpoint(local, scan=scan, allow_pickle=allow_pickle, engine=_value(engine))
    report.revision = sha
    out.result(report.model_dump(mode="json"), render=report.render)
    if not report.ok:
        raise typer.Exit(ValidationFailed.exit_code)


@app.command(epilog=_examples(
    "dflash-convert diff ./draft-speculators ./draft-hf",
    "dflash-convert diff org/draft org/draft --revision-a v1 --revision-b main --json",
    "dflash-convert diff ./draft ./draft-bf16 --tolerance 0.01"))
def diff(
    a: Annotated[str, typer.Argument(metavar="A", help="First checkpoint (directory or Hub id).")],
    b: Annotated[str, typer.Argument(metavar="B", help="Second checkpoint (directory or Hub id).")],
    tolerance: Annotated[float, typer.Option("--tolerance", help="Max abs difference still counted as equal.")] = 0.0,
    revision: Revision = None,
    revision_a: Annotated[Optional[str], typer.Option("--revision-a", help="Hub revision of A (default: "
                                                      "--revision).")] = None,
    revision_b: Annotated[Optional[str], typer.Option("--revision-b", help="Hub revision of B (default: "
                                                      "--revision).")] = None,
    token: Token = None,
    as_json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Compare two checkpoints (also across formats): exit 0 when equivalent, 3 when not."""
    from dflash_convert.convert.diff import diff_checkpoints
    from dflash_convert.errors import ValidationFailed

    out = Output(as_json, quiet)
    pa, _ = out.local(a, revision=revision_a or revision, token=token)
    pb, _ = out.local(b, revision=revision_b or revision, token=token)
    report = diff_checkpoints(pa, pb, tolerance=tolerance)
    out.result(report.model_dump(mode="json"), render=report.render)
    if not report.equivalent:
        raise typer.Exit(ValidationFailed.exit_code)


@app.command(epilog=_examples("dflash-convert schema",
                              "dflash-convert schema validation-report > validation-report.schema.json",
                              "dflash-convert schema --all > schemas.json"))
def schema(
    name: Annotated[Optional[str], typer.Argument(
        metavar="NAME", callback=_one_of(schemas.NAMES),
        help=f"The schema to print: {', '.join(schemas.NAMES)} (without NAME: the list of names).")] = None,
    all_: Annotated[bool, _flag("--all", help="Print every schema, as one JSON object keyed by name.")] = False,
) -> None:
    """Print the JSON Schemas of the files and reports dflash-convert reads and writes."""
    if all_:
        emit_json({n: schemas.schema(n) for n in schemas.NAMES})
    elif name is not None:
        sys.stdout.write(schemas.render(name))
    else:
        typer.echo("\n".join(schemas.NAMES))
        err.print("dflash-convert schema NAME prints one (JSON Schema); --all prints every one", markup=False)


# ----------------------------------------------------------------------------- Hub: pull / push

@app.command(epilog=_examples("dflash-convert pull org/draft",
                              "dflash-convert pull org/draft --revision v1 -o ./draft"))
def pull(
    repo: Annotated[str, typer.Argument(metavar="REPO", help="Hub repo id (org/name).")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Materialize the files in DIR instead of "
                                                   "only the cache.")] = None,
    revision: Revision = None,
    token: Token = None,
    allow_pickle: AllowPickle = False,
    overwrite: Annotated[bool, _flag("--overwrite", help="Replace a non-empty -o DIR (once the pull is "
                                     "complete).")] = False,
    as_json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Download a DFlash checkpoint from the Hub (config, safetensors, index, README); prints its local path."""
    out = Output(as_json, quiet)
    resolved = out.hub().pull(repo, output, revision=revision, token=token, allow_pickle=allow_pickle,
                              overwrite=overwrite)
    out.info(f"pulled {repo}@{resolved.revision} (commit {resolved.commit_sha})")
    out.result(resolved.to_dict(), str(resolved.path))


@app.command(epilog=_examples("dflash-convert push ./draft-hf org/draft-hf",
                              "dflash-convert push ./draft-hf org/draft-hf --revision dev --private"))
def push(
    directory: Annotated[Path, typer.Argument(metavar="DIRECTORY", help="Checkpoint directory to upload.")],
    repo: Annotated[str, typer.Argument(metavar="REPO", help="Hub repo id (org/name); created if missing.")],
    revision: Revision = None,
    private: Private = False,
    commit_message: CommitMessage = None,
    commit_description: CommitDescription = None,
    create_pr: CreatePr = False,
    token: Token = None,
    no_validate: Annotated[bool, _flag("--no-validate", help="Push even if static validation fails.")] = False,
    validation_report: Annotated[Optional[Path], typer.Option(
        "--validation-report", metavar="FILE", help="A `validate --json` report of this draft (e.g. end to end): "
        "its results (tau, the acceptance chart, target, prompts, thresholds, date) go in the model card; a failed "
        "report stops the push.")] = None,
    as_json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Upload a checkpoint directory in one commit to a branch (--revision, created from main if missing), with a
    README model card; prints the commit (or PR) URL."""
    from dflash_convert.publish import push_checkpoint

    out = Output(as_json, quiet)
    report = _read_validation_report(validation_report) if validation_report is not None else None
    out.hub()
    result = push_checkpoint(directory, repo, validate=not no_validate, report=report, revision=revision,
                             private=private, commit_message=commit_message, commit_description=commit_description,
                             create_pr=create_pr, token=token)
    out.result(result.to_dict(), result.pr_url or result.commit_url)


def _read_validation_report(path: Path):
    """A `validate --json` report file, checked against its schema (one line naming the file otherwise)."""
    from pydantic import ValidationError

    from dflash_convert.io.reading import read_json
    from dflash_convert.validate.report import ValidationReport

    try:
        return ValidationReport.model_validate(read_json(path, allow_bom=True))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "the top level"
        raise DFlashError(f"not a validation report (`validate --json` writes one): {where}: {first['msg']}",
                          file=path) from None


# ----------------------------------------------------------------------------- validate

@app.command(epilog=_examples(
    "dflash-convert validate ./draft",
    "dflash-convert validate ./draft --target Qwen/Qwen3-8B --min-acceptance-length 3 --junit report.xml",
    "dflash-convert validate org/draft --target ./qwen3-8b --levels static,numeric --backend sdpa --json"))
def validate(
    checkpoint: Annotated[str, typer.Argument(metavar="CHECKPOINT", help="Draft checkpoint (either format): "
                                              "directory or Hub id.")],
    target: Annotated[Optional[str], typer.Option("--target", help="Target model directory, its config.json, or Hub "
                                                  "id. A config alone enables the static pair checks; weights "
                                                  "enable end to end.")] = None,
    prompts: Annotated[Optional[Path], typer.Option("--prompts", help="One prompt per line (text, or token ids as "
                                                    "space-separated ints / a JSON list), or JSONL with a `prompt` "
                                                    "field or OpenAI-style `messages`. Default: a built-in set.")] = None,
    dataset: Annotated[Optional[list[str]], typer.Option(
        "--dataset", metavar="NAME[@REV]", help="A benchmark prompt set from the Hub (repeatable; tau per set): "
        "gsm8k, math500, humaneval, mt-bench, mt-bench-2, mbpp, alpaca.")] = None,
    num_prompts: Annotated[Optional[int], typer.Option("--num-prompts", help="Prompts drawn from each --dataset "
                                                       "(with --seed; default: all).")] = None,
    chat_template: Annotated[str, typer.Option("--chat-template", metavar="auto|none|FILE", help="Render text prompts "
                                               "and messages with the target tokenizer's chat template (auto, when "
                                               "it has one), none, or a Jinja FILE; as vLLM's chat endpoint.")] = "auto",
    chat_template_kwargs: Annotated[Optional[str], typer.Option(
        "--chat-template-kwargs", metavar="JSON", callback=_json_object,
        help='Template variables, as vLLM\'s chat_template_kwargs, e.g. \'{"enable_thinking": false}\'.')] = None,
    sampling: Annotated[SamplingMode, typer.Option(
        "--sampling", help="auto: temperature, top-k, top-p, min-p from the target's generation_config.json, as "
        "vLLM serves it; greedy: temperature 0. Flags below override.")] = SamplingMode.auto,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens generated per prompt (end to "
                                                "end).")] = 64,
    block_size: Annotated[Optional[int], typer.Option("--block-size", help="Run-time block size (default: the "
                                                      "draft's).")] = None,
    temperature: Annotated[Optional[float], typer.Option("--temperature", help="0 = greedy (output must equal the "
                                                         "target's). Default: per --sampling.")] = None,
    top_k: Annotated[Optional[int], typer.Option("--top-k", help="Top-k of the target's distribution (0: off). "
                                                 "Default: per --sampling.")] = None,
    top_p: Annotated[Optional[float], typer.Option("--top-p", help="Top-p (1: off). Default: per --sampling.")] = None,
    min_p: Annotated[Optional[float], typer.Option("--min-p", help="Min-p (0: off). Default: per --sampling.")] = None,
    repetition_penalty: Annotated[Optional[float], typer.Option("--repetition-penalty", help="vLLM's (1: off). "
                                                                "Default: generation_config.json.")] = None,
    presence_penalty: Annotated[Optional[float], typer.Option("--presence-penalty", help="vLLM's (0: off). "
                                                              "Default: generation_config.json.")] = None,
    frequency_penalty: Annotated[Optional[float], typer.Option("--frequency-penalty", help="vLLM's (0: off). "
                                                               "Default: generation_config.json.")] = None,
    device: Annotated[str, typer.Option("--device", help="auto, cpu, cuda or cuda:N.")] = "auto",
    dtype: Annotated[DType, typer.Option("--dtype", help="Compute dtype (auto: each checkpoint's own, from "
                                         "its config or weights).")] = DType.auto,
    backend: Annotated[Backend, typer.Option("--backend", help="Draft attention backend (auto: the numeric level "
                                             "tries every available one).")] = Backend.auto,
    target_backend: Annotated[Optional[str], typer.Option(
        "--target-backend", help="The target's attn_implementation (eager, sdpa, flex_attention, ...); default: sdpa "
        "where its model supports it, else eager.")] = None,
    causal: Causal = None,
    min_acceptance_length: Annotated[Optional[float], typer.Option(
        "--min-acceptance-length", help="Fail when tau (mean tokens per step) is lower.")] = None,
    min_position_rates: Annotated[Optional[str], typer.Option(
        "--min-position-rates", metavar="RATES", callback=_csv(float),
        help="Comma-separated minimum acceptance rate per draft position, e.g. 0.9,0.8,0.7.")] = None,
    levels: Annotated[Optional[str], typer.Option(
        "--levels", metavar="LEVELS", callback=_csv(str, LEVELS),
        help=f"Comma-separated subset of {','.join(LEVELS)} (default: all the inputs allow).")] = None,
    junit: Annotated[Optional[Path], typer.Option("--junit", metavar="FILE", help="Also write a JUnit XML report "
                                                  "(one testcase per check) to FILE.")] = None,
    report_md: Annotated[Optional[Path], typer.Option(
        "--report-md", metavar="FILE", help="Also write a Markdown report to FILE (the acceptance chart beside it, "
        "as FILE with the suffix .svg). GITHUB_STEP_SUMMARY set: the report is appended there too.")] = None,
    revision: Revision = None,
    token: Token = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the synthetic inputs and of sampling.")] = 0,
    threads: Annotated[Optional[int], typer.Option("--threads", help="CPU threads for torch (default: 1 for tiny "
                                                   "pairs, else torch's; shown in the report).")] = None,
    draft_sampling: Annotated[DraftSampling, typer.Option(
        "--draft-sampling", help="greedy: the draft's argmax (vLLM's default); probabilistic: sampled at "
        "--temperature, accepted by rejection sampling.")] = DraftSampling.greedy,
    device_map: Annotated[Optional[DeviceMap], typer.Option(
        "--device-map", help="Place the target with transformers + accelerate (GPUs, then CPU, then "
        "disk).")] = None,
    max_memory: Annotated[Optional[str], typer.Option(
        "--max-memory", metavar="BUDGET", callback=_max_memory,
        help="Per-device budget for --device-map, e.g. 0=20GiB,cpu=30GiB (implies --device-map auto).")] = None,
    min_speedup: Annotated[Optional[float], typer.Option(
        "--min-speedup", help="Fail when the measured speedup is lower (otherwise it is "
        "informational).")] = None,
    baseline: Annotated[Optional[Path], typer.Option("--baseline", help="An earlier `validate --json` report of "
                        "the same prompts and settings: fail (exit 3) on a drop beyond what the counts explain.")] = None,
    max_regression: Annotated[float, typer.Option("--max-regression", help="With --baseline: a drop tolerated "
                              "beyond the statistical bound, as a fraction of the baseline's value.")] = 0.0,
    keep_going: Annotated[bool, _flag("--keep-going", help="Run numeric and end-to-end levels even when static "
                                      "checks failed.")] = False,
    engine: EngineOpt = None,
    engine_python: Annotated[Optional[str], typer.Option(
        "--engine-python", metavar="PATH", help="With --engine vllm: also serve the pair in real vLLM, run by the "
        "Python interpreter at PATH (`self`: this one), and check its outputs and acceptance against ours.")] = None,
    engine_args: Annotated[Optional[str], typer.Option(
        "--engine-args", metavar="JSON", callback=_json_object, help="Arguments for vLLM's LLM(...), e.g. "
        "'{\"dtype\": \"float32\", \"tensor_parallel_size\": 2}'.")] = None,
    engine_timeout: Annotated[float, typer.Option("--engine-timeout", help="Seconds the engine run may take; "
                                                  "then it is killed (exit 1).")] = ENGINE_TIMEOUT_S,
    engine_kv_cache: Annotated[float, typer.Option("--engine-kv-cache", metavar="GIB", help="vLLM's CPU KV cache "
                                                   "in GiB (VLLM_CPU_KVCACHE_SPACE).")] = 1.0,
    compile: Annotated[bool, _flag("--compile", help="End to end with static caches and torch.compile'd draft and "
                                   "verify steps (CUDA graphs on a GPU); compiling takes a while.")] = False,
    allow_pickle: AllowPickle = False,
    as_json: Json = False,
    quiet: Quiet = False,
) -> None:
    """Check a draft before deployment: static, numeric and end-to-end levels; exit 0 passed, 3 a check failed."""
    from dflash_convert.errors import ValidationFailed
    from dflash_convert.validate.report import render_table, to_json, to_junit
    from dflash_convert.validate.options import PromptSet, ValidateOptions
    from dflash_convert.validate.run import validate as run_validation

    out = Output(as_json, quiet)
    ckpt_path, ckpt_sha = out.local(checkpoint, revision=revision, token=token, allow_pickle=allow_pickle)
    target_path, target_sha = (None, None) if target is None else \
        out.local(target, token=token, for_target=True)
    if num_prompts is not None and num_prompts < 1:
        raise typer.BadParameter(f"must be at least 1, got {num_prompts}", param_hint="--num-prompts")
    prompt_sets = []
    if dataset:
        out.hub()  # its info lines and progress bars follow -q / --json
        from dflash_convert.hub.datasets import dataset_prompts
    for spec in dataset or []:  # resolved here: validate reads local prompts, never the Hub
        pulled = dataset_prompts(spec, num_prompts=num_prompts, seed=seed, token=token)
        prompt_sets.append(PromptSet(name=pulled.name, source=pulled.source, prompts=pulled.prompts))
    opts = ValidateOptions(
        target=target_path, target_name=target, target_revision=target_sha, checkpoint_revision=ckpt_sha,
        prompts=prompts, prompt_sets=prompt_sets, chat_template=chat_template,
        chat_template_kwargs=chat_template_kwargs, levels=levels or list(LEVELS), max_new_tokens=max_new_tokens,
        block_size=block_size, sampling=sampling.value, temperature=temperature, top_k=top_k, top_p=top_p,
        min_p=min_p, repetition_penalty=repetition_penalty, presence_penalty=presence_penalty,
        frequency_penalty=frequency_penalty, draft_sampling=_value(draft_sampling), seed=seed, device=device, dtype=_value(dtype),
        backend=_value(backend), target_backend=target_backend, causal=causal, engine=_value(engine), compile=compile,
        engine_python=engine_python, engine_args=engine_args or {}, engine_timeout=engine_timeout,
        engine_kv_cache_gib=engine_kv_cache,
        device_map=_value(device_map), max_memory=max_memory, threads=threads,
        min_acceptance_length=min_acceptance_length, min_position_rates=min_position_rates, min_speedup=min_speedup,
        baseline=baseline, max_regression=max_regression, keep_going=keep_going, allow_pickle=allow_pickle)
    report = run_validation(ckpt_path, opts, progress=None if quiet else out.status)
    if junit is not None:
        junit.parent.mkdir(parents=True, exist_ok=True)
        junit.write_text(to_junit(report))
    _markdown_reports(report, report_md, out)
    if as_json and not quiet:  # stdout holds the JSON: the log still shows the report and its verdict
        _live.stop()
        render_table(report, err)
    out.result(to_json(report), render=lambda console, q: render_table(report, console, q))
    if not report.passed:
        raise typer.Exit(ValidationFailed.exit_code)


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
        path.write_text(to_markdown(report, image), encoding="utf-8")
        out.info(f"Markdown report written: {path}")
    summary = os.environ.get("GITHUB_STEP_SUMMARY")
    if summary:  # an image beside a step summary is not served: the unicode chart stands in
        with open(summary, "a", encoding="utf-8") as f:
            f.write(to_markdown(report) + "\n")
