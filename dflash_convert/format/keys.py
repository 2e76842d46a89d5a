"""The table of DFlash-family config keys that an engine reads beyond the draft's decoder config, as data.

One row per key: which draft kinds have it, where each format keeps it, the value that leaves the
computation unchanged (`neutral`), who reads it and what it changes. Conversion reads this table to
carry each key or refuse it by name (never drop it), `diff` compares every key in it, and
docs/formats.md's key table is generated from it (`python -m dflash_convert.regenerate`). Each row lives with
the kind that has it (format/kinds/: the backbone's rows in kinds/base.py); this module reads them from the
registry and says what the table means.

Where the keys live:
- HF / z-lab format: inside `dflash_config` (vLLM's `qwen3_dflash*.py` and SGLang's `dflash_utils.py`
  read them there); DSpark's own keys (`hf_top`) at the top level, where vLLM's `qwen3_dspark.py` reads them.
- speculators format: top-level, but only the keys vLLM's speculators reader copies into the `dflash_config`
  it builds (`transformers_utils/configs/speculators/algos.py`: the dflash2 convolution and selector sizes,
  `sample_from_anchor`; for dspark the Markov and confidence keys, copied to the top). speculators 0.9.0's
  config classes accept extra top-level fields (pydantic `extra="allow"`) and save them, but neither its own
  model nor vLLM's reader applies them: a key with `speculators=None` is therefore refused when converting to
  the speculators format with a value that changes the computation (writing it there would be a key nobody
  reads), and refused when found at the top level of a speculators config being converted to HF (it was not
  used in training, yet an HF reader would apply it).
"""

from __future__ import annotations

from typing import Any

from dflash_convert.format import kinds
from dflash_convert.format.kinds.base import ConfigKey

__all__ = ["ConfigKey", "config_keys", "by_name", "keys_for", "key_for", "hf_top_names", "trained_value",
           "effective", "changes_computation", "family_problems"]


def config_keys() -> tuple[ConfigKey, ...]:
    """Every row of the table: each registered kind's keys (kinds/), in the table's order."""
    return kinds.config_keys()


def by_name() -> dict[str, ConfigKey]:
    """name -> its row for the DFlash kinds (a name has one row per kind; DSpark's sample_from_anchor is its own
    row: the first row of a name wins)."""
    return {k.name: k for k in reversed(config_keys())}


def keys_for(kind: str) -> tuple[ConfigKey, ...]:
    return kinds.of(kind).keys


def key_for(kind: str, name: str) -> ConfigKey:
    """The row of key `name` for draft kind `kind`."""
    return kinds.of(kind).key(name)


def hf_top_names(kind: str) -> tuple[str, ...]:
    """Keys this kind's HF layout keeps at the top level of config.json."""
    return tuple(k.name for k in keys_for(kind) if k.hf_top)


def trained_value(kind: str, fields: dict[str, Any], name: str) -> Any:
    """The value a draft was trained with: its config's, else what speculators fills in for an absent key, else
    the neutral one (what the runtime runs)."""
    return kinds.of(kind).trained_value(fields, name)


def effective(kind: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Every table key of this kind with the value an engine acts on (absent = neutral), for comparisons."""
    return {k.name: k.default if k.is_neutral(fields.get(k.name)) else fields.get(k.name) for k in keys_for(kind)}


def changes_computation(name: str, value: Any, kind: str = "dflash") -> bool:
    key = next((k for k in keys_for(kind) if k.name == name), None) if kinds.get(kind) else None
    return key is not None and not key.is_neutral(value)


def family_problems(kind: str, fields: dict[str, Any], *, hidden: int, vocab: int, block: int | None,
                    pruned: bool) -> list[str]:
    """The rules of the kind (its `rules`: what speculators' own model and the engines need) this draft breaks,
    each with the values it has."""
    shown = ", ".join(f"{k}={fields.get(k)!r}" for k in (k.name for k in keys_for(kind) if k.required))
    return [f"{rule} (has {shown}, hidden_size={hidden}, vocab_size={vocab}, block_size={block})"
            for rule, holds in kinds.of(kind).rules if not holds(fields, hidden, vocab, block, pruned)]

# ----------------------------------------------------------------------------- docs

DOC_BEGIN, DOC_END = "<!-- config-keys:begin -->", "<!-- config-keys:end -->"


def markdown_table() -> str:
    rows = ["| key | kinds | HF / z-lab | speculators | transformers' own | neutral | read by | what it changes |",
            "|---|---|---|---|---|---|---|---|"]
    for k in config_keys():
        spec = f"`{k.speculators}` (top level)" if k.speculators else "no field: refused unless neutral"
        neutral = "required" if k.required else " or ".join(["absent", *(f"`{n!r}`" for n in k.neutral)])
        if k.filled:
            neutral += f" (absent: speculators fills `{k.filled[0]!r}`" + (
                f", HF readers act on `{k.hf_filled[0]!r}`)" if k.hf_filled else ")")
        # transformers' own layout has a place for none of them (docs/formats.md section 15)
        native = "no place: refused unless neutral" if "dflash" in k.kinds else "the layout holds dflash drafts only"
        rows.append(f"| `{k.name}` | {', '.join(k.kinds)} | `{k.hf_path}` | {spec} | {native} | {neutral} | "
                    f"{k.readers} | "
                    f"{k.effect} |")
    return "\n".join(rows)


def render_into(text: str) -> str:
    """`text` with the table between its markers replaced by the current one."""
    head, _, rest = text.partition(DOC_BEGIN)
    _, _, tail = rest.partition(DOC_END)
    return f"{head}{DOC_BEGIN}\n{markdown_table()}\n{DOC_END}{tail}"

