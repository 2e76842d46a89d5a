"""How an options model's field is spelled on the command line, declared beside the field itself.

An options model (validate's ValidateOptions, convert's ConvertOptions) is the one declaration of each
option: its name, type, default and help (the pydantic Field's description). A `Flag` in the field's
`Annotated[...]` metadata adds only the command-line spelling; the CLI generates its options from the
model (dflash_convert.cli._options), so adding an option is one field plus its consumer:

    max_new_tokens: Annotated[int, Flag("--max-new-tokens")] = Field(64, description="Tokens per prompt.")

A field the caller fills in itself (a resolved path, a commit sha) says so: `Flag(None, why="...")`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# the help of a flag two commands' options models share
ALLOW_PICKLE_HELP = "Accept pickle weight files (.bin/.pt)."
VALIDATE_ALLOW_PICKLE_HELP = ("Accept pickle files: .bin/.pt weights, and a mask_embedding.pt (loaded with "
                              "weights_only=True).")
CAUSAL_HELP = "Force every draft layer causal / non-causal (default: as the checkpoint declares)."

# how the text of a flag becomes the field's value (the CLI holds the parsers)
Parse = Literal["ints", "floats", "levels", "json", "memory", "dtype"]


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
