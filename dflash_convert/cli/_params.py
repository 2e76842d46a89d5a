"""The command line's parameter kinds: choice enums made from the library's own names, the parsers of
list / JSON / memory-budget options, and the options several commands share (declared once here)."""

import copy
import enum
import json
import math
from typing import Annotated, Any, Callable, Optional, get_args

import typer

from dflash_convert.flags import ALLOW_PICKLE_HELP, token_count
from dflash_convert.format.dtypes import DTYPES, code_for_name
from dflash_convert.format.engines import ENGINE_NAMES


def choices(name: str, values) -> type[enum.Enum]:
    """An Enum of the library's own names, so --help lists the choices and click checks them."""
    return enum.Enum(name, {v: v for v in values}, type=str)


Engine = choices("Engine", ENGINE_NAMES)


def value(choice: enum.Enum | None) -> str | None:
    return None if choice is None else choice.value


def dtype_name(choice: enum.Enum | str) -> str:
    """auto, or the torch name of a --dtype spelling (bf16 -> bfloat16)."""
    name = choice.value if isinstance(choice, enum.Enum) else choice
    return "auto" if name == "auto" else DTYPES[code_for_name(name)].torch


def csv(kind: Callable[[str], Any], allowed: tuple[str, ...] | None = None, empty_entries: bool = True):
    """Parse a comma-separated option ("1,9,17" or "[1, 9, 17]") into a list, checking each item; `empty_entries`
    False: "64,,128" is refused (an entry left out by mistake), not read as 64,128."""

    def parse(text: Optional[str]) -> Optional[list]:
        if text is None:
            return None
        entries = text.replace(" ", "").strip("[]").split(",")
        if not empty_entries and "" in entries and any(entries):
            raise typer.BadParameter(f"{text!r} has an empty entry (entry {entries.index('') + 1}): give "
                                     "comma-separated values, e.g. 1024,2k,32k")
        try:
            items = [kind(x) for x in entries if x != ""]
        except ValueError:
            raise typer.BadParameter(f"expected comma-separated {kind.__name__} values, got {text!r}") from None
        bad = [x for x in items if allowed is not None and x not in allowed]
        if bad:
            raise typer.BadParameter(f"unknown {', '.join(map(str, bad))}; choose from {', '.join(allowed)}")
        return items

    return parse


def token_length(text: Optional[str]) -> Optional[int]:
    """One token count (--max-model-len of validate and inspect): 32768 or 32k, at least 1."""
    if text is None:
        return None
    try:
        count = token_count(text.strip())
    except ValueError:
        raise typer.BadParameter(f"expected a token count (32768, 32k; k = 1024), got {text!r}") from None
    if count < 1:
        raise typer.BadParameter(f"must be at least 1 token, got {text!r}")
    return count


def thresholds(text: Optional[str]) -> Optional[dict[str, float]]:
    """--min-acceptance-length "3" or "3,code=2.5,prose=4": {"": 3.0, "code": 2.5, "prose": 4.0} (the plain value
    keyed ""); or the same as a JSON object, '{"": 3, "qa, misc": 4}', for category names holding `,` or `=`."""
    if text is None:
        return None
    if text.lstrip().startswith("{"):
        return _checked_gates(_json_thresholds(text), text)
    if any(x.strip().startswith("{") for x in text.split(",")):  # a JSON object after plain values
        raise typer.BadParameter(f"{text!r} mixes the two forms: the JSON form must be the whole value, e.g. "
                                 '\'{"": 3, "code": 2.5}\'')
    out: dict[str, float] = {}
    for item in (x.strip() for x in text.split(",") if x.strip()):
        name, equals, number = item.rpartition("=")
        name = name.strip()
        if equals and not name:
            raise typer.BadParameter(f"{item!r} names no category: give X or CATEGORY=X")
        if name in out:  # a second value for the same gate would replace the first, silently lowering it
            which = f"category {name}" if name else "the whole run"
            raise typer.BadParameter(f"two thresholds for {which} ({out[name]:g} and {number.strip()})")
        try:
            out[name] = float(number)
        except ValueError:
            raise typer.BadParameter(f"expected X or CATEGORY=X (numbers), got {item!r}") from None
    return _checked_gates(out, text) if text.strip() else out


def _checked_gates(gates: dict[str, float], text: str) -> dict[str, float]:
    """At least one gate, each a finite number >= 0 (tau is a count of tokens per step): refused here, naming the
    flag, rather than by the options model's field (whose message names no flag)."""
    if not gates:
        raise typer.BadParameter(f"{text!r} gives no threshold: give X, CATEGORY=X or '{{\"\": X, \"CATEGORY\": X}}'")
    for name, number in gates.items():
        # the whole run's gate is the options model's field, refused there in one line naming the flag
        if name and not (math.isfinite(number) and number >= 0):
            raise typer.BadParameter(f"the threshold for category {name!r} must be a finite number >= 0, got "
                                     f"{number:g}")
    return gates


def _json_thresholds(text: str) -> dict[str, float]:
    """A JSON object of thresholds: key "" the whole run's (as the plain X), any other key a category's; a key given
    twice is refused as in the plain form (JSON would keep the last one, silently)."""
    def pairs(items: list[tuple[str, Any]]) -> dict[str, Any]:
        seen: dict[str, Any] = {}
        for name, number in items:
            if name in seen:
                which = f"category {name!r}" if name else "the whole run"
                raise typer.BadParameter(f"two thresholds for {which} ({seen[name]} and {number})")
            seen[name] = number
        return seen

    try:
        parsed = json.loads(text, object_pairs_hook=pairs)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc.msg} at character {exc.pos}") from None
    bad = [f"{k!r}: {v!r}" for k, v in parsed.items() if isinstance(v, bool) or not isinstance(v, (int, float))]
    if bad:
        raise typer.BadParameter(f'expected {{"": X, "CATEGORY": X}} (numbers), got {bad[0]}')
    return {k: float(v) for k, v in parsed.items()}


def one_of(allowed: tuple[str, ...]):
    """Check a value against `allowed` (for lists too long for a metavar: the help names them, wrapped)."""

    def check(text: Optional[str]) -> Optional[str]:
        if text is not None and text not in allowed:
            raise typer.BadParameter(f"{text!r} is not one of the choices: {', '.join(allowed)}")
        return text

    return check


# the example a JSON-object flag's error gives (the flag's own kind of object)
JSON_EXAMPLES = {"--chat-template-kwargs": '\'{"enable_thinking": false}\'', "--engine-args": '\'{"dtype": "float32"}\''}


def json_object(param: typer.CallbackParam, text: Optional[str]) -> Optional[dict[str, Any]]:
    """Parse a JSON object option ('{"enable_thinking": false}')."""
    if text is None:
        return None
    example = next((JSON_EXAMPLES[o] for o in param.opts if o in JSON_EXAMPLES), '\'{"key": "value"}\'')
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as exc:
        raise typer.BadParameter(f"not JSON: {exc.msg} at character {exc.pos}") from None
    if not isinstance(parsed, dict):
        raise typer.BadParameter(f"a JSON object is needed, e.g. {example}")
    return parsed


def max_memory(text: Optional[str]) -> Optional[dict[str, int]]:
    from dflash_convert.validate.memory import parse_max_memory

    try:
        return None if text is None else parse_max_memory(text)
    except ValueError as exc:
        raise typer.BadParameter(str(exc)) from None


def flag(*names: str, help: str, **kw: Any):
    """A boolean switch, shown as a flag (no `<bool>` value column in --help)."""
    return typer.Option(*names, help=help, metavar="", show_default=False, **kw)


def in_panel(option: Any, panel: str) -> Any:
    """A shared option (Json, Quiet, ...) listed under `panel` by a command whose -h groups its flags."""
    kind, info = get_args(option)
    info = copy.copy(info)
    info.rich_help_panel = panel
    return Annotated[kind, info]


EXAMPLE_WIDTH = 80  # columns of an example line as --help shows it (click indents it 2), continued with " \\"


def examples(*lines: str) -> str:
    return "Examples:\n\n\b\n" + "\n".join(_example(line) for line in lines)  # \b: click keeps the lines


def _example(line: str) -> str:
    r"""`  $ LINE`, broken at spaces into lines of at most EXAMPLE_WIDTH columns ending in ` \`."""
    out, current = [], "  $"
    for word in line.split(" "):
        if len(current) + 1 + len(word) > EXAMPLE_WIDTH - 4 and current.strip() not in ("$", ""):
            out.append(current + " \\")
            current = "     "
        current += " " + word if current.strip() else word
    return "\n".join(out + [current])


# ----------------------------------------------------------------------------- shared options (declared once)

Source = Annotated[str, typer.Argument(metavar="SRC", help="Checkpoint directory or Hub repo id (org/name).")]
Revision = Annotated[Optional[str], typer.Option("--revision", help="Hub revision: branch, tag or commit sha "
                                                 "(default: main).")]
Token = Annotated[Optional[str], typer.Option("--token", help="Hub token (default: HF_TOKEN, then the stored "
                                              "token).")]
Json = Annotated[bool, flag("--json", help="Print one JSON object on stdout (errors too).")]
Quiet = Annotated[bool, flag("-q", "--quiet", help="Print only the verdict line, failures, warnings and errors "
                             "(no progress, no passing checks).")]
QuietTransfer = Annotated[bool, flag("-q", "--quiet", help="Print only the result line, warnings and errors (no "
                                     "progress).")]  # the commands that write or move files: no verdict
AllowPickle = Annotated[bool, flag("--allow-pickle", help=ALLOW_PICKLE_HELP)]
Private = Annotated[bool, flag("--private", help="Create the Hub repo private.")]
CommitMessage = Annotated[Optional[str], typer.Option("--commit-message", help="Commit title.")]
CommitDescription = Annotated[Optional[str], typer.Option("--commit-description", help="Commit description.")]
CreatePr = Annotated[bool, flag("--create-pr", help="Open a pull request instead of committing to the branch.")]
EngineOpt = Annotated[Optional[Engine], typer.Option("--engine", help="A serving engine: show only its view "
                                                     "(inspect), or run the draft as it would (validate).")]


def refuse_swapped(given: str, fixed: str) -> None:
    """Arguments given the other way round (a directory and a repo id, a draft and its target): one line saying what
    each one is and the command written the right way (exit 2)."""
    from dflash_convert.errors import UsageError

    raise UsageError(f"the arguments look swapped: {given}; {fixed}")


def is_draft(path) -> bool:
    """Whether a local directory (or its config.json) holds a DFlash draft's config (any format); False for anything
    else, a config that cannot be read included (the command's own reading says what is wrong with it)."""
    from pathlib import Path

    from dflash_convert.errors import DFlashError
    from dflash_convert.format.mapping import detect_format
    from dflash_convert.io.reading import read_json

    config = Path(path) if Path(path).is_file() else Path(path) / "config.json"
    try:
        detect_format(read_json(config))
    except (DFlashError, OSError):
        return False
    return True
