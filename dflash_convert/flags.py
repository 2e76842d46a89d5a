"""How an options model's field is spelled on the command line, declared beside the field itself.

An options model (validate's ValidateOptions, convert's ConvertOptions) is the one declaration of each
option: its name, type, default and help (the pydantic Field's description). A `Flag` in the field's
`Annotated[...]` metadata adds only the command-line spelling; the CLI generates its options from the
model (dflash_convert.cli._options), so adding an option is one field plus its consumer:

    max_new_tokens: Annotated[int, Flag("--max-new-tokens")] = Field(64, description="Tokens per prompt.")

A field the caller fills in itself (a resolved path, a commit sha) says so: `Flag(None, why="...")`.

A value's range is the field's own pydantic constraint (`Field(64, ge=1, le=8192)`), a choice its `Literal`;
a `CommandOptions` model turns whatever pydantic refuses into one UsageError naming the flag, its words
generated from that declaration (`usage_error`): "--max-new-tokens must be an integer in [1, 8192], got 0".
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.fields import FieldInfo

from dflash_convert.errors import UsageError

# the help of a flag two commands' options models share
ALLOW_PICKLE_HELP = "Accept pickle weight files (.bin/.pt)."
VALIDATE_ALLOW_PICKLE_HELP = ("Accept pickle files: .bin/.pt weights, and a mask_embedding.pt (loaded with "
                              "weights_only=True).")
CAUSAL_HELP = "Force every draft layer causal / non-causal (default: as the checkpoint declares)."

# how the text of a flag becomes the field's value (the CLI holds the parsers)
Parse = Literal["ints", "floats", "levels", "json", "memory", "dtype", "names", "lengths", "length", "thresholds"]


@dataclass(frozen=True)
class Flag:
    name: str | None  # "--max-new-tokens", "--causal/--non-causal"; None: not on the command line
    short: str | None = None  # "-o"
    aliases: tuple[str, ...] = ()  # former spellings, still accepted, hidden from --help
    metavar: str | None = None
    choices: tuple[str, ...] | None = None  # the values --help lists and click checks (a Literal's by default)
    parse: Parse | None = None  # the flag takes text, parsed into the field's value
    type: type | None = None  # the flag's value type where the field's is wider (a path for `str | Path | list`)
    why: str = ""  # with name None: who fills the field in
    reads: bool = False  # the value names a local file or directory the command reads: no output may be written over it

    def __post_init__(self) -> None:
        if (self.name is None) == (not self.why):
            raise ValueError("a Flag has a name, or (name None) a `why` saying who fills the field in")

    @property
    def field_flag(self) -> str | None:
        """The long flag the field's name must read as (its first spelling for a --x/--no-x pair)."""
        return None if self.name is None else self.name.split("/")[0]


def flag_of(metadata: list) -> Flag | None:
    """The Flag among a pydantic field's metadata, if any."""
    return next((m for m in metadata if isinstance(m, Flag)), None)


@dataclass(frozen=True)
class Off:
    """The value(s) that turn a setting off ("-1 or 0"), said with its range when a value is out of it."""

    values: str


# ----------------------------------------------------------------------------- errors that name the flag

BOUNDS = ("ge", "gt", "le", "lt", "allow_inf_nan")  # the pydantic constraints a range is said from


def _without_none(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return args[0] if len(args) == 1 else annotation
    return annotation


def _is_item(loc: tuple) -> bool:
    return len(loc) > 1 and isinstance(loc[1], int)


def declared(model: type[BaseModel], loc: tuple) -> tuple[Any, list]:
    """(type, metadata) declared at `loc`: a field (its constraints and markers), or an item of a list field."""
    info = model.model_fields[loc[0]]
    kind, metadata = _without_none(info.annotation), list(info.metadata)
    if _is_item(loc) and get_origin(kind) is list:  # an item of a list: its own declaration
        kind, metadata = _without_none(get_args(kind)[0]), []
    while get_origin(kind) is Annotated:
        kind, *extra = get_args(kind)
        metadata += [m for e in extra for m in (e.metadata if isinstance(e, FieldInfo) else [e])]
    return kind, metadata


def _number(bound: Any) -> str:
    return str(int(bound)) if float(bound).is_integer() else f"{bound:g}"


def wanted(model: type[BaseModel], loc: tuple) -> str | None:
    """What the value at `loc` must be, said from its declaration: "an integer in [1, 8192]", "a finite number
    >= 0", "a number in (0, 1]", "an integer >= -1 (-1 or 0: off)"; None for what is not a number."""
    kind, metadata = declared(model, loc)
    if kind not in (int, float):
        return None
    c = {name: getattr(m, name) for m in metadata for name in BOUNDS if getattr(m, name, None) is not None}
    low, high = c.get("ge", c.get("gt")), c.get("le", c.get("lt"))
    finite = kind is float and c.get("allow_inf_nan") is False and (low is None or high is None)
    text = "an integer" if kind is int else "a finite number" if finite else "a number"
    if low is not None and high is not None:
        text += f" in {'[' if 'ge' in c else '('}{_number(low)}, {_number(high)}{']' if 'le' in c else ')'}"
    elif low is not None or high is not None:
        text += f" {next(s for s, k in (('>=', 'ge'), ('>', 'gt'), ('<=', 'le'), ('<', 'lt')) if k in c)} " \
                f"{_number(low if low is not None else high)}"
    off = next((m for m in metadata if isinstance(m, Off)), None)
    return text + (f" ({off.values}: off)" if off else "")


def either(choices: list[str]) -> str:
    """"a, b or c"."""
    return " or ".join([", ".join(choices[:-1]), choices[-1]] if len(choices) > 1 else choices)


def named(model: type[BaseModel], name: str) -> str:
    """How an error names a field: its flag (`--max-new-tokens`), or for a field the caller fills in, its
    name in words (`timing rounds`)."""
    spelling = flag_of(model.model_fields[name].metadata)
    return spelling.field_flag if spelling is not None and spelling.name else name.replace("_", " ")


def usage_error(exc: ValidationError, model: type[BaseModel]) -> UsageError:
    """The first of pydantic's errors as the one line a user reads, naming the flag: a value out of its
    range (`--max-new-tokens must be an integer in [1, 8192], got 0`), not one of the choices, or failing a
    field's own rule (its validator's words after the flag)."""
    error = exc.errors()[0]
    loc, given = error["loc"], error.get("input")
    if not loc or loc[0] not in model.model_fields:
        return UsageError(f"{model.__name__} has no option {loc[0]!r}" if loc else error["msg"])
    subject = f"each {named(model, loc[0])} value" if _is_item(loc) else named(model, loc[0])
    if error["type"] == "value_error":  # a field's own rule: a predicate, e.g. "must be distinct values, got [4, 4]"
        return UsageError(f"{named(model, loc[0])} {error['ctx']['error']}")
    kind, _ = declared(model, loc)
    if get_origin(kind) is Literal:
        allowed = [str(a) for a in get_args(kind)]
        return UsageError(f"{named(model, loc[0])} {given!r}: choose {either(allowed)}")
    if error["type"] == "too_short":
        return UsageError(f"{subject} must have at least {error['ctx']['min_length']} value(s), got {given!r}")
    phrase = wanted(model, loc)
    if phrase is not None:
        return UsageError(f"{subject} must be {phrase}, got {given!r}")
    return UsageError(f"{subject}: {error['msg']}, got {given!r}")


class CommandOptions(BaseModel):
    """An options model a command's flags are generated from: any value pydantic refuses (at construction or
    assignment) is the UsageError naming its flag (exit 2). A rule between options (a model_validator)
    raises its own UsageError, naming the flags in its sentence. An option it does not know is refused."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="wrap")
    @classmethod
    def _errors_name_the_flag(cls, values: Any, handler: Any) -> Any:
        try:
            return handler(values)
        except ValidationError as exc:
            raise usage_error(exc, cls) from None


def token_count(text: str) -> int:
    """A count of tokens as context lengths are spoken of: 1024, 2k (2048), 32K (32768): k is 1024. ASCII digits
    only (str.isdigit and int() also take other scripts' digits and superscripts)."""
    digits = text[:-1] if text[-1:] in ("k", "K") else text
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(text)
    return int(digits) * (1024 if digits != text else 1)


token_count.__name__ = "token count (1024, 2k, 32k)"
