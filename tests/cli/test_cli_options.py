"""Each option of validate, convert and predict is declared once, in its options model (type, default, help, and its
spelling in a `Flag`); the CLI's flags are generated from it. These tests hold the two together: a flag
that disagrees with its field (name, default, help), a field without a flag (or a reason for none), or a
hand-written option shadowing a field fails here."""

import enum
from typing import Annotated

import pytest
import typer
from pydantic import BaseModel, Field

from dflash_convert.cli import app
from dflash_convert.cli._options import ALIAS, flagged_fields, with_options
from dflash_convert.convert.conversion import ConvertOptions
from dflash_convert.errors import DFlashError, UsageError
from dflash_convert.flags import CommandOptions, Flag, Off, flag_of
from dflash_convert.predict.options import PredictOptions
from dflash_convert.validate.options import MAX_PROMPT_TOKENS, ValidateOptions, check_value

COMMANDS = {"validate": ValidateOptions, "convert": ConvertOptions, "predict": PredictOptions}


def _plain(default):
    return default.value if isinstance(default, enum.Enum) else default


def disagreements(command, model: type[BaseModel]) -> list[str]:
    """Every way the click command's options and the model's fields disagree, in words."""
    found = []
    params = {p.name: p for p in command.params}
    for name, info in model.model_fields.items():
        spelling = flag_of(info.metadata)
        if spelling is None:
            found.append(f"{name}: no Flag (give Flag(None, why=...) where the caller fills it in)")
    for name, (spelling, info) in flagged_fields(model).items():
        param = params.get(name)
        if param is None:
            found.append(f"{name}: no option")
            continue
        long = "--" + name.replace("_", "-")
        if spelling.field_flag != long or long not in param.opts:
            found.append(f"{name}: flag {param.opts} is not {long}")
        if param.help != info.description:
            found.append(f"{name}: help {param.help!r} is not the field's {info.description!r}")
        if info.is_required() != bool(param.required):  # a field without a default: a flag that must be given
            found.append(f"{name}: required {info.is_required()}, its flag's {param.required}")
        default, own = _plain(param.default), info.get_default(call_default_factory=True)
        if spelling.parse == "dtype":
            own = default if own == "auto" else own
        if default != own and not (default in (None, []) and spelling.parse is not None) and not info.is_required():
            found.append(f"{name}: default {default!r} is not the field's {own!r}")  # text unset: field default
        for alias in spelling.aliases:
            hidden = params.get(ALIAS + alias.lstrip("-").replace("-", "_"))
            if hidden is None or alias not in hidden.opts or not hidden.hidden:
                found.append(f"{name}: former spelling {alias} is not a hidden option")
    fields = set(model.model_fields)
    spellings = [o for p in command.params for o in [*p.opts, *p.secondary_opts]]
    found += [f"{o}: given twice" for o in sorted(set(spellings)) if spellings.count(o) > 1]
    for param in command.params:
        if param.name not in fields and not param.name.startswith(ALIAS):
            shadow = [n for n in fields if any(o == "--" + n.replace("_", "-") for o in param.opts)]
            found += [f"{param.name}: a hand-written option for the field {n}" for n in shadow]
    return found


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_flag_agrees_with_its_field(name):
    command = typer.main.get_command(app).commands[name]
    assert disagreements(command, COMMANDS[name]) == []


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_field_is_a_flag_or_says_who_fills_it(name):
    for field, info in COMMANDS[name].model_fields.items():
        spelling = flag_of(info.metadata)
        assert spelling is not None, f"{name}: {field} has no Flag"
        assert spelling.name is not None or spelling.why, field


class Planted(BaseModel):
    size: Annotated[int, Flag("--size")] = Field(3, description="The size.")
    extra: int = 0  # no Flag at all


def test_the_check_sees_a_disagreement():
    """A flag renamed, its help or default changed by hand, a field without a flag: each one is named."""
    drift = typer.Typer()

    @drift.command()
    @with_options(Planted)
    def run(options: dict, size2: Annotated[int, typer.Option("--size-2")] = 0) -> None:  # noqa: ARG001
        pass

    @drift.command()
    def other(size: Annotated[int, typer.Option("--sizes", help="Size.")] = 4) -> None:  # noqa: ARG001
        pass

    group = typer.main.get_command(drift)
    assert disagreements(group.commands["run"], Planted) == ["extra: no Flag (give Flag(None, why=...) where the "
                                                             "caller fills it in)"]
    found = disagreements(group.commands["other"], Planted)
    assert any("flag ['--sizes'] is not --size" in f for f in found), found
    assert any("help 'Size.'" in f for f in found) and any("default 4" in f for f in found), found


def test_a_flag_without_a_name_says_who_fills_it_in():
    with pytest.raises(ValueError, match="why"):
        Flag(None)


@pytest.mark.parametrize("spelling", ["--engine-kv-cache-gib", "--engine-kv-cache"])
def test_the_renamed_flag_and_its_former_spelling(cli, speculators_drafts, spelling):
    r = cli("validate", speculators_drafts["full"], "--levels", "static", spelling, "2.5", "--json", "-q")
    assert r.code in (0, 3), r.err
    assert r.json()["options"]["engine_kv_cache_gib"] == 2.5
    bad = cli("validate", speculators_drafts["full"], "--levels", "static", spelling, "0")
    assert bad.code == 2 and "--engine-kv-cache-gib must be a number > 0, got 0.0" in bad.err, bad.err


def test_the_former_spelling_is_hidden_from_help(cli):
    r = cli("validate", "--help")
    assert r.code == 0 and "--engine-kv-cache-gib" in r.out and "--engine-kv-cache " not in r.out, r.out


def test_unset_text_options_leave_the_field_defaults(cli, speculators_drafts):
    r = cli("validate", speculators_drafts["full"], "--levels", "static", "--json", "-q")
    options = r.json()["options"]
    defaults = ValidateOptions().model_dump(mode="json")
    for name in ("engine_args", "chat_template_kwargs", "max_memory", "min_position_rates", "dtype", "backend",
                 "draft_sampling", "sampling", "engine_timeout", "engine_kv_cache_gib", "max_new_tokens"):
        assert options[name] == defaults[name], name


# ----------------------------------------------------------------------------- errors said from the declaration

REFUSED = [
    (dict(max_new_tokens=0), f"--max-new-tokens must be an integer in [1, {MAX_PROMPT_TOKENS}], got 0"),
    (dict(top_p=0.0), "--top-p must be a number in (0, 1], got 0.0"),
    (dict(top_k=-2), "--top-k must be an integer >= -1 (-1 or 0: off), got -2"),
    (dict(temperature=float("inf")), "--temperature must be a finite number >= 0, got inf"),
    (dict(max_regression=1.0), "--max-regression must be a number in [0, 1), got 1.0"),
    (dict(min_position_rates=[0.9, 1.5]), "each --min-position-rates value must be a number in [0, 1], got 1.5"),
    (dict(draft_sampling="top"), "--draft-sampling 'top': choose greedy or probabilistic"),
    (dict(concurrency=[4, 4]), "--concurrency must be distinct values, got [4, 4]"),
    (dict(timing_rounds=0), "timing rounds must be an integer >= 1, got 0"),  # no flag: the field in words
    (dict(num_speculative_tokens=[3], block_size=4), "give --num-speculative-tokens or --block-size, not both "
                                                     "(the block is K+1 slots)"),
]


@pytest.mark.parametrize("bad, says", REFUSED, ids=["-".join(bad) for bad, _ in REFUSED])
def test_a_refused_value_is_one_usage_error_naming_its_flag(bad, says):
    with pytest.raises(UsageError) as refused:
        ValidateOptions(**bad)
    assert str(refused.value) == says


def test_assignment_and_copies_are_held_to_the_same_declaration():
    options = ValidateOptions()
    with pytest.raises(UsageError, match=r"^--threads must be an integer >= 1, got 0$"):
        options.threads = 0
    with pytest.raises(UsageError, match="--max-new-tokens"):  # model_copy skips pydantic; check() does not
        options.model_copy(update={"max_new_tokens": 0}).check()


def test_a_generation_config_value_is_held_to_its_flags_range():
    """generation_config.json's values and the flags are checked against one declaration, said the same way."""
    with pytest.raises(DFlashError) as from_file:
        check_value("top_p", 0, file="g.json")
    with pytest.raises(UsageError) as from_flag:
        ValidateOptions(top_p=0)
    assert str(from_file.value) == "g.json: field `top_p` must be a number in (0, 1], got 0"
    assert str(from_flag.value) == "--top-p must be a number in (0, 1], got 0"
    with pytest.raises(DFlashError, match="got '0.5'"):  # a JSON string is no number, as before
        check_value("temperature", "0.5", file="g.json")
    assert check_value("top_k", -1) == 0 and check_value("temperature", 1) == 1.0


class Sized(CommandOptions):
    size: Annotated[int, Flag("--size"), Off("0")] = Field(3, ge=0, le=9, description="The size.")


def test_the_translator_works_for_any_options_model():
    with pytest.raises(UsageError, match=r"^--size must be an integer in \[0, 9\] \(0: off\), got 10$"):
        Sized(size=10)
    with pytest.raises(UsageError, match="^Sized has no option 'colour'$"):
        Sized(colour=1)


@pytest.mark.parametrize("command", ["convert", "inspect", "diff", "validate", "pull", "push", "schema"])
def test_help_leads_with_h_and_its_usage_line_brackets_once(cli, command):
    """-h: the usage line writes an optional argument in one pair of brackets (`[CHECKPOINT]`, never
    `[[CHECKPOINT]]`); -h is the first option of the first group of options, not a lone `Options:` heading between
    the others; every group in the house order."""
    import re

    from dflash_convert.cli._help import PANEL_ORDER

    r = cli(command, "-h")
    assert r.code == 0, r.err
    lines = r.out.splitlines()
    assert "[[" not in lines[0] and "{" not in lines[0], lines[0]
    headings = [line[:-1] for line in lines if re.fullmatch(r"[A-Z][A-Za-z ]*:", line)]
    options = [h for h in headings if h != "Arguments"]
    assert options and all(h in PANEL_ORDER for h in options), headings
    assert [PANEL_ORDER.index(h) for h in options] == sorted(PANEL_ORDER.index(h) for h in options), headings
    first = lines.index(options[0] + ":")
    assert lines[first + 1].lstrip().startswith("-h, --help"), lines[first:first + 2]
    assert r.out.count("-h, --help") == 1
