"""Where a command's words go: its result on stdout (one JSON object under --json), progress, info lines and
warnings on stderr, and on a terminal the one live line of the step being run."""

import json
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import typer
from rich.console import Console

from dflash_convert.errors import DFlashError
from dflash_convert.format.configs import is_hub_id

err = Console(stderr=True, highlight=False, soft_wrap=True)
out_console = Console(highlight=False, soft_wrap=True)  # results: lines kept whole for grep; tables fit the width


class Output:
    """Where a command's words go: its result on stdout (one JSON object under --json), the rest on stderr."""

    def __init__(self, as_json: bool = False, quiet: bool = False):
        self.json, self.quiet = as_json, quiet

    def hub(self):
        """The hub module, the Hub client's own tqdm bars off under --json / -q / not a terminal (the client's
        switch); its info lines come to `info` where the command passes it (on_info).

        Asked for only where the Hub is used: local work never imports huggingface_hub.
        """
        from dflash_convert.hub import client as hub
        from dflash_convert.hub.transport import say_retries

        say_retries(self.status)  # a retry's wait is said on stderr as progress (-q: not)

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
                                          verify_weights=verify_weights, on_info=self.info)
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
        live.show(text)

    def warn(self, text: str) -> None:
        err.print(f"[yellow]warning:[/yellow] {_escape(text)}")

    def result(self, obj: Any, text: Optional[str] = None,
               render: Optional[Callable[[Console, bool], None]] = None) -> None:
        """The command's answer on stdout: `obj` as JSON under --json; else `render(console, quiet)` (under -q
        only its verdict line, failures and warnings) and/or `text`."""
        live.stop()
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
        live.stop()
        bar.start()  # at once: planning and the first large tensor are not silent

        def update(done: int, total: int) -> None:
            if bar.live.is_started:
                bar.update(task, completed=done, total=total, refresh=True)
                if done >= total:  # stop before whatever follows (validation, push) prints
                    bar.stop()
                    if shown and then:
                        live.show(then)

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


live = _LiveStep()


def emit_json(obj: Any) -> None:
    """The one JSON object of a `--json` run, on stdout."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")
    sys.stdout.flush()


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
