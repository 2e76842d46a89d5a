"""What long steps report as they go: a line of text that may carry a count.

Progress receivers are plain `Callable[[str], None]` (print works); a `Step` is a str that also
carries `done` and `total`, from which the command line draws a bar with an ETA on a terminal.
"""

from __future__ import annotations


class Step(str):
    """A progress line of a counted step, e.g. `Step("end to end: prompt 3/16", done=3, total=16)`."""

    done: int
    total: int

    def __new__(cls, text: str, *, done: int, total: int) -> "Step":
        step = super().__new__(cls, text)
        step.done, step.total = done, total
        return step
