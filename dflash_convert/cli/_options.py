"""A command's options generated from its options model (as mergekit's MergeOptions gives its flags):
each field with a `Flag` becomes one typer option, its help the field's description, its default the
field's, its choices the field's Literal (or the Flag's). The command takes the values as one dict
of field values, ready for the model.

A flag given more than once (every command's, generated or not: `refuse_repeated`, which each command's
parse runs): a list-valued one adds up (`--levels static --levels numeric` is `--levels static,numeric`);
a single-valued one given with different values (as the flag reads them: 16k and 16384 are one) is a usage
error naming it, never the last one silently winning (`--engine given twice: vllm, sglang`)."""

import enum
import inspect
import os
import types
from functools import wraps
from typing import Annotated, Any, Callable, Literal, Optional, Union, get_args, get_origin

import typer
from pydantic import BaseModel

from dflash_convert.errors import UsageError

from dflash_convert.cli._params import (choices, csv, dtype_name, flag, json_object, max_memory, thresholds,
                                       token_count, token_length)
from dflash_convert.flags import Flag, flag_of
from dflash_convert.validate.options import LEVELS

PARSERS: dict[str, Callable[[Optional[str]], Any]] = {
    "ints": csv(int), "floats": csv(float), "levels": csv(str, LEVELS), "json": json_object, "memory": max_memory,
    "names": csv(str), "lengths": csv(token_count, empty_entries=False), "length": token_length,
    "thresholds": thresholds,
}
METAVARS = {"ints": "IDS", "floats": "RATES", "levels": "LEVELS", "json": "JSON", "memory": "BUDGET", "names": "NAMES",
            "lengths": "L[,L...]", "length": "TOKENS", "thresholds": "X[,CATEGORY=X...]"}
ALIAS = "_alias_"  # the parameter name prefix of a hidden former spelling
FORMER_OF: dict[str, str] = {}  # a former spelling's parameter -> its field's: the two are one flag
# the text kinds whose value is a list: the flag given again adds its items, as one comma-separated value would
ADDS_UP = ("ints", "floats", "levels", "names", "lengths")


def _joined(parse: Callable[[Optional[str]], Any]) -> Callable[[Optional[list[str]]], Any]:
    """A list flag's parser over every time it was given: `--levels static --levels numeric` reads as
    `--levels static,numeric` (None: not given)."""
    return lambda texts: None if not texts else parse(",".join(texts))


def flagged_fields(model: type[BaseModel]) -> dict[str, tuple[Flag, Any]]:
    """name -> (its Flag, its pydantic FieldInfo), for every field that is on the command line."""
    found = {}
    for name, info in model.model_fields.items():
        spelling = flag_of(info.metadata)
        if spelling is not None and spelling.name is not None:
            found[name] = (spelling, info)
    return found


def _plain(annotation: Any) -> tuple[Any, bool]:
    """The annotation without None, and whether None was allowed."""
    if get_origin(annotation) in (Union, types.UnionType):
        args = [a for a in get_args(annotation) if a is not type(None)]
        return (args[0] if len(args) == 1 else Union[tuple(args)]), len(args) < len(get_args(annotation))
    return annotation, False


def _default(info) -> Any:
    return info.get_default(call_default_factory=True)


def _panel(model: type[BaseModel], name: str) -> Optional[str]:
    """The -h heading a field's flag is listed under (the model's HELP_PANELS; None: the plain Options)."""
    return next((panel for panel, names in getattr(model, "HELP_PANELS", {}).items() if name in names), None)


def _option(name: str, spelling: Flag, info, panel: Optional[str] = None) -> tuple[Any, Any]:
    """(the typer annotation, the default) of one field's option."""
    kind, optional = _plain(info.annotation)
    default = _default(info)
    names = [n for n in (spelling.name, spelling.short) if n]
    text = dict(help=info.description or "", rich_help_panel=panel)
    if spelling.parse in ADDS_UP:  # repeatable, each time's items added
        option = typer.Option(*names, metavar=spelling.metavar or METAVARS[spelling.parse],
                              callback=_joined(PARSERS[spelling.parse]), **text)
        # default []: typer reads an empty list from a list flag's parser as unset (`--predict-gpu ,` names no GPU)
        return Annotated[Optional[list[str]], option], []
    if spelling.parse is not None and spelling.parse != "dtype":  # text, parsed into the value
        option = typer.Option(*names, metavar=spelling.metavar or METAVARS[spelling.parse],
                              callback=PARSERS[spelling.parse], **text)
        return Annotated[Optional[str], option], None if not isinstance(default, str) else default
    allowed = spelling.choices or (get_args(kind) if get_origin(kind) is Literal else None)
    if allowed is not None:
        values = choices("".join(p.title() for p in name.split("_")), allowed)
        option = typer.Option(*names, metavar=spelling.metavar, **text) if spelling.metavar else \
            typer.Option(*names, **text)
        return (Annotated[Optional[values] if optional else values, option],
                None if default is None else values(default))
    if kind is bool:
        return Annotated[Optional[bool] if optional else bool, flag(*names, **text)], default
    kind = spelling.type or kind
    extra = {"metavar": spelling.metavar} if spelling.metavar else {}
    return Annotated[Optional[kind] if optional else kind, typer.Option(*names, **extra, **text)], default


def option_parameters(model: type[BaseModel]) -> list[inspect.Parameter]:
    """The typer parameters of every flagged field, then one hidden parameter per former spelling."""
    params, aliases = [], []
    for name, (spelling, info) in flagged_fields(model).items():
        annotation, default = _option(name, spelling, info, _panel(model, name))
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, annotation=annotation,
                                        default=inspect.Parameter.empty if info.is_required() else default))
        kind = get_args(annotation)[0]
        for alias in spelling.aliases:
            hidden = typer.Option(alias, hidden=True, help=f"Former name of {spelling.name}.",
                                  **({"metavar": spelling.metavar} if spelling.metavar else {}))
            FORMER_OF[ALIAS + alias.lstrip("-").replace("-", "_")] = name
            aliases.append(inspect.Parameter(ALIAS + alias.lstrip("-").replace("-", "_"),
                                             inspect.Parameter.KEYWORD_ONLY, default=None,
                                             annotation=Annotated[Optional[_plain(kind)[0]], hidden]))
    return params + aliases


def field_values(model: type[BaseModel], given: dict[str, Any]) -> dict[str, Any]:
    """The options' values as the model's fields (popped from `given`); an unset or empty text flag leaves
    the field's own default, a former spelling stands in for its flag."""
    values = {}
    for name, (spelling, info) in flagged_fields(model).items():
        value = given.pop(name)
        for alias in spelling.aliases:
            former = given.pop(ALIAS + alias.lstrip("-").replace("-", "_"))
            if former is not None:
                value = former
        if isinstance(value, enum.Enum):
            value = value.value
        if spelling.parse == "dtype":
            value = dtype_name(value)
        if (value is None or (spelling.parse is not None and not value)) and _default(info) is not None:
            continue  # an unset (or empty) text flag: the field's own default (all levels, no engine args)
        values[name] = value
    return values


def with_options(model: type[BaseModel]) -> Callable[[Callable], Callable]:
    """Replace the command's `options` parameter by the model's generated options; the command gets their
    values as `options`, a dict of field values."""

    def decorate(command: Callable) -> Callable:
        signature = inspect.signature(command)
        params = []
        for param in signature.parameters.values():
            if param.name == "options":
                params += option_parameters(model)
            else:
                params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY))
        names = {p.name for p in option_parameters(model)}

        @wraps(command)
        def run(**kwargs: Any) -> Any:
            given = {k: kwargs.pop(k) for k in list(kwargs) if k in names}
            return command(**kwargs, options=field_values(model, given))

        run.__signature__ = signature.replace(parameters=params)
        run.__annotations__ = {p.name: p.annotation for p in params}
        del run.__wrapped__  # typer reads the generated signature, not the command's own
        return run

    return decorate



def _as_read(param: Any, ctx: Any, text: Any) -> Any:
    """A repeated flag's value as the flag reads it, to tell repeats apart by value: a choice or number through
    the flag's own type (a value it refuses is refused here, with click's words: `--engine VLLM --engine vllm` is
    an invalid choice, not a repeat), a token count (16k = 16384), a GPU part (h100 = H100), an existing path
    resolved (./x = x). Any other text is itself."""
    if not isinstance(text, str) or getattr(param, "is_flag", False):  # a switch: the spelling given
        return text
    descriptor = getattr(param, "type_descriptor", None)
    if hasattr(param, "get_runtime_param") and getattr(descriptor, "file_annotation", 1) is None:  # not a file to open
        text = param.get_runtime_param().coerce(text, param=param, ctx=ctx)  # a bad value: the error one alone gets
        if not isinstance(text, str):
            return text
    try:
        return ("tokens", token_count(text.strip()))
    except ValueError:
        pass
    if param.name == "gpu":
        from dflash_convert.predict.gpus import gpu

        try:
            return ("gpu", gpu(text).name)
        except UsageError:
            return text
    if text and os.path.exists(text):
        return ("path", os.path.realpath(text))
    return text


def _long_name(param: Any) -> str:
    return next((o for o in param.opts if o.startswith("--")), param.opts[0])


def given_values(command: Any, ctx: Any, args: list[str]) -> dict[Any, list[str]]:
    """Each single-valued option of `command` -> the values `args` give it, in order (a switch: the spelling
    given, `--causal` or `--non-causal`), read by click's own parser for the command (so a value that looks
    like a flag, `--x=v`, -ov and `--` read as click reads them). A repeatable option is not listed."""
    parser = command.make_parser(ctx)
    given: dict[Any, list[str]] = {}

    def recorder(option: Any) -> Callable[[Any, Any], None]:
        process = option.process

        def record(value: Any, state: Any) -> None:
            spelling = (option._long_opts or option._short_opts)[0]
            given.setdefault(option.obj, []).append(spelling if option.action == "store_const" else value)
            process(value, state)

        return record

    # click's parser keeps one value per option ("store"): each option's is recorded as it is read
    for option in {id(o): o for o in (*parser._long_opt.values(), *parser._short_opt.values())}.values():
        if option.action in ("store", "store_const"):
            option.process = recorder(option)
    parser.parse_args(args=list(args))  # (typer carries its own copy of click: its parser, read alike)
    return given


def refuse_repeated(command: Any, ctx: Any, args: list[str]) -> None:
    """A single-valued flag given more than once with different values is a usage error naming it (the user
    who wrote it twice meant something: keeping the last, as click does, is a run of another setting); given
    twice with one value, or a repeatable flag (its values add up), is fine. A switch's two spellings both given
    (`--causal --non-causal`) contradict each other."""
    by_name = {p.name: p for p in command.params}
    flags: dict[Any, list[str]] = {}  # a flag's values, its former spelling's (--engine-kv-cache) among them
    for param, values in given_values(command, ctx, args).items():
        flags.setdefault(by_name.get(FORMER_OF.get(param.name), param), []).extend(values)
    for param, values in flags.items():
        distinct = list(dict.fromkeys(values))
        if len(distinct) > 1:  # texts that differ may read as one value (16k and 16384): only values count
            distinct = list(dict.fromkeys(_as_read(param, ctx, v) for v in values))
        if len(distinct) < 2:
            continue
        if getattr(param, "is_flag", False) and getattr(param, "secondary_opts", None):
            raise UsageError(f"{' and '.join(distinct)} both given: give one")
        times = "twice" if len(values) == 2 else f"{len(values)} times"
        raise UsageError(f"{_long_name(param)} given {times}: {', '.join(map(str, values))}")
