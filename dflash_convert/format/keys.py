"""The table of DFlash-family config keys that an engine reads beyond the draft's decoder config, as data.

One row per key: which draft kinds have it, where each format keeps it, the value that leaves the
computation unchanged (`neutral`), who reads it and what it changes. Conversion reads this table to
carry each key or refuse it by name (never drop it), `diff` compares every key in it, and
docs/formats.md's key table is generated from it (`python -m dflash_convert.format.keys`).

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

from dataclasses import dataclass
from typing import Any

DFLASH_KINDS = ("dflash", "dflash2")
FAMILY = ("dflash", "dflash2", "dspark")  # dspark runs on the DFlash backbone: its attention keys are DFlash's


@dataclass(frozen=True)
class ConfigKey:
    name: str
    kinds: tuple[str, ...]
    readers: str  # who reads it (engines, training library)
    effect: str  # what it changes
    neutral: tuple = ()  # values (besides absent / null) at which it changes nothing
    speculators: str | None = None  # where the speculators format keeps it (top-level name) or None: no field
    required: bool = False  # a draft of these kinds must have it
    hf_top: bool = False  # the HF layout keeps it at the top level (DSpark's keys), not inside dflash_config
    filled: tuple = ()  # (value,): what speculators' config class fills in when its config.json lacks the key
    hf_filled: tuple = ()  # (value,): what every HF reader (vLLM, SGLang) acts on when the key is absent

    @property
    def hf_path(self) -> str:
        return self.name if self.hf_top else f"dflash_config.{self.name}"

    def is_neutral(self, value: Any) -> bool:
        """Whether this value leaves the computation as without the key (bools are not numbers here)."""
        if self.required:
            return False
        return value is None or any(type(value) is type(n) and value == n for n in self.neutral)

    @property
    def default(self) -> Any:
        """The value an engine acts on when the key is absent."""
        return self.neutral[0] if self.neutral else None


CONFIG_KEYS: tuple[ConfigKey, ...] = (
    # dflash2: convolutions and candidate selector (speculators trains them; vLLM copies them from the top level)
    ConfigKey("conv_kernel_size", ("dflash2",), "vLLM, SGLang, speculators",
              "taps of each grouped dynamic causal convolution inside a block", speculators="conv_kernel_size",
              required=True),
    ConfigKey("conv_group_size", ("dflash2",), "vLLM, SGLang, speculators",
              "hidden channels sharing one dynamic kernel (must divide hidden_size)",
              speculators="conv_group_size", required=True),
    ConfigKey("selector_rank", ("dflash2",), "vLLM, SGLang, speculators",
              "rank of the bilinear candidate selector", speculators="selector_rank", required=True),
    ConfigKey("selector_top_k", ("dflash2",), "vLLM, SGLang, speculators",
              "unary candidates the selector re-ranks (only they get finite draft logits)",
              speculators="selector_top_k", required=True),
    # logit maps z-lab's DFlash2 drafts carry (applied to the unary logits before the selector)
    ConfigKey("input_embedding_scale", FAMILY, "vLLM (dflash2)", "multiplies the block's token embeddings",
              neutral=(1.0, 1)),
    ConfigKey("output_multiplier", FAMILY, "vLLM (dflash2), SGLang",
              "multiplies the draft's logits (before the cap)",
              neutral=(1.0, 1)),
    ConfigKey("final_logit_softcapping", FAMILY, "vLLM (dflash2), SGLang",
              "caps the multiplied logits: c * tanh(m * logits / c)", neutral=(0.0, 0)),
    # anchor: DFlash's anchor slot is a bonus token; vLLM refuses true for DFlash (DSpark's mode)
    ConfigKey("sample_from_anchor", DFLASH_KINDS, "vLLM", "whether the anchor slot predicts a token",
              neutral=(False,), speculators="sample_from_anchor"),
    # DSpark (speculators `dspark`; vLLM qwen3_dspark.py + spec_decode/dspark, SGLang models/dspark.py): the HF
    # layout keeps these at the top level, where vLLM reads them (SGLang reads dflash_config first, then the top)
    ConfigKey("sample_from_anchor", ("dspark",), "vLLM, SGLang, speculators",
              "true: every slot, the anchor's included, predicts (block_size drafts); false: the anchor is the "
              "bonus token (block_size - 1)", speculators="sample_from_anchor", required=True, hf_top=True,
              filled=(True,), hf_filled=(True,)),
    ConfigKey("markov_rank", ("dspark",), "vLLM, SGLang, speculators",
              "rank r of the Markov logit bias W2 @ W1[previous token] (0: no Markov head; engines need > 0)",
              speculators="markov_rank", required=True, hf_top=True, filled=(256,)),
    ConfigKey("markov_head_type", ("dspark",), "SGLang, speculators (vLLM builds vanilla only)",
              "vanilla (bias from the previous token), gated (hidden-gated) or rnn (recurrent over the block)",
              speculators="markov_head_type", required=True, hf_top=True, filled=("vanilla",)),
    ConfigKey("enable_confidence_head", ("dspark",), "vLLM, SGLang, speculators",
              "a per-slot acceptance-probability head (vLLM: adaptive verification; SGLang: verify window)",
              speculators="enable_confidence_head", required=True, hf_top=True, filled=(True,)),
    ConfigKey("confidence_head_with_markov", ("dspark",), "vLLM, SGLang, speculators",
              "the confidence head reads [hidden; Markov embedding of the previous token] instead of hidden",
              speculators="confidence_head_with_markov", required=True, hf_top=True, filled=(True,)),
    ConfigKey("dspark_draft_topk", ("dspark",), "vLLM (qwen3_dspark.py, the DSpark speculator)",
              "the Markov step scores only the top-k base candidates of each slot (a speculative-config "
              "option too)", hf_top=True),
    ConfigKey("logit_scale", ("dspark",), "vLLM (qwen3_dspark.py's logits processor)",
              "multiplies the DSpark draft's logits", neutral=(1.0, 1), hf_top=True),
    # attention variants of published HF drafts
    ConfigKey("use_swa", FAMILY, "vLLM", "makes every layer sliding-window, whatever layer_types says",
              neutral=(False,)),
    ConfigKey("swa_window_size", FAMILY, "vLLM, SGLang", "the sliding window, before `sliding_window`"),
    ConfigKey("attention_sink_bias", FAMILY, "vLLM, SGLang", "adds a learned attention sink per head",
              neutral=(False,)),
    ConfigKey("attention_value_scale", FAMILY, "vLLM, SGLang", "scales the attention values"),
    # SGLang's Domino projector
    ConfigKey("projector_type", DFLASH_KINDS, "SGLang", "replaces the context projector (`domino`)"),
    ConfigKey("shift_label", DFLASH_KINDS, "SGLang (domino)", "label shift of the Domino projector"),
    ConfigKey("pure_draft_prefix_len", DFLASH_KINDS, "SGLang (domino)", "Domino's pure-draft prefix"),
    ConfigKey("gru_hidden_dim", DFLASH_KINDS, "SGLang (domino)", "width of Domino's GRU"),
    ConfigKey("emb_dim", DFLASH_KINDS, "SGLang (domino)", "Domino's embedding width"),
)

# name -> its row for the DFlash kinds (a name has one row per kind; DSpark's sample_from_anchor is its own row)
BY_NAME = {k.name: k for k in reversed(CONFIG_KEYS)}
BY_KIND = {(kind, k.name): k for k in CONFIG_KEYS for kind in k.kinds}


def keys_for(kind: str) -> tuple[ConfigKey, ...]:
    return tuple(k for k in CONFIG_KEYS if kind in k.kinds)


def key_for(kind: str, name: str) -> ConfigKey:
    """The row of key `name` for draft kind `kind`."""
    return BY_KIND[(kind, name)]


def hf_top_names(kind: str) -> tuple[str, ...]:
    """Keys this kind's HF layout keeps at the top level of config.json."""
    return tuple(k.name for k in keys_for(kind) if k.hf_top)


def trained_value(kind: str, fields: dict[str, Any], name: str) -> Any:
    """The value a draft was trained with: its config's, else what speculators fills in for an absent key, else
    the neutral one (what the runtime runs)."""
    value = fields.get(name)
    if value is not None:
        return value
    key = key_for(kind, name)
    return key.filled[0] if key.filled else key.default


def effective(kind: str, fields: dict[str, Any]) -> dict[str, Any]:
    """Every table key of this kind with the value an engine acts on (absent = neutral), for comparisons."""
    return {k.name: k.default if k.is_neutral(fields.get(k.name)) else fields.get(k.name) for k in keys_for(kind)}


def changes_computation(name: str, value: Any, kind: str = "dflash") -> bool:
    key = BY_KIND.get((kind, name))
    return key is not None and not key.is_neutral(value)



# What each draft kind's keys must satisfy for speculators' own model and the engines to build it
# (speculators 0.9.0 dflash2 GroupedDynamicCausalConv / CandidateSelector / DFlash2DraftModel; vLLM
# qwen3_dflash2.py): (kind, rule, holds(fields, hidden, vocab, block, pruned)).
def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


FAMILY_RULES = (
    ("dflash2", "conv_kernel_size, conv_group_size, selector_rank and selector_top_k are positive integers "
                "(vLLM reads each with int(dflash_config[...]))",
     lambda f, h, v, b, p: all(_int(f.get(k)) for k in ("conv_kernel_size", "conv_group_size", "selector_rank",
                                                         "selector_top_k"))),
    ("dflash2", "conv_group_size divides hidden_size (vLLM and speculators refuse otherwise)",
     lambda f, h, v, b, p: not _int(f.get("conv_group_size")) or h % f["conv_group_size"] == 0),
    ("dflash2", "conv_kernel_size is at most block_size (taps stay inside a block)",
     lambda f, h, v, b, p: not _int(f.get("conv_kernel_size")) or b is None or f["conv_kernel_size"] <= b),
    ("dflash2", "selector_top_k is at most the vocabulary",
     lambda f, h, v, b, p: not _int(f.get("selector_top_k")) or f["selector_top_k"] <= v),
    ("dflash2", "the vocabulary is the target's (speculators builds dflash2 only without a pruned vocab)",
     lambda f, h, v, b, p: not p),
    # dspark (speculators 0.9.0 DSparkDraftModel / MarkovHead; vLLM qwen3_dspark.py; SGLang models/dspark.py)
    ("dspark", "markov_rank is a positive integer (vLLM and SGLang serve DSpark only with its Markov head; "
               "speculators' markov_rank 0 trains a draft no engine serves)",
     lambda f, h, v, b, p: _int(f.get("markov_rank"))),
    ("dspark", "markov_head_type is vanilla, gated or rnn (speculators and SGLang refuse anything else)",
     lambda f, h, v, b, p: f.get("markov_head_type") in ("vanilla", "gated", "rnn")),
    ("dspark", "sample_from_anchor, enable_confidence_head and confidence_head_with_markov are true or false",
     lambda f, h, v, b, p: all(isinstance(f.get(k), bool) or f.get(k) is None for k in
                               ("sample_from_anchor", "enable_confidence_head", "confidence_head_with_markov"))),
    ("dspark", "confidence_head_with_markov needs a Markov head (speculators and SGLang refuse it with markov_rank 0)",
     lambda f, h, v, b, p: not (f.get("enable_confidence_head") and f.get("confidence_head_with_markov"))
     or _int(f.get("markov_rank"))),
)


def family_problems(kind: str, fields: dict[str, Any], *, hidden: int, vocab: int, block: int | None,
                    pruned: bool) -> list[str]:
    """The rules of FAMILY_RULES this draft breaks, each with the values it has."""
    shown = ", ".join(f"{k}={fields.get(k)!r}" for k in (k.name for k in keys_for(kind) if k.required))
    return [f"{rule} (has {shown}, hidden_size={hidden}, vocab_size={vocab}, block_size={block})"
            for k, rule, holds in FAMILY_RULES if k == kind and not holds(fields, hidden, vocab, block, pruned)]

# ----------------------------------------------------------------------------- docs

DOC_BEGIN, DOC_END = "<!-- config-keys:begin -->", "<!-- config-keys:end -->"


def markdown_table() -> str:
    rows = ["| key | kinds | HF / z-lab | speculators | transformers' own | neutral | read by | what it changes |",
            "|---|---|---|---|---|---|---|---|"]
    for k in CONFIG_KEYS:
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


if __name__ == "__main__":  # rewrite docs/formats.md's table
    import sys
    from pathlib import Path

    doc = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/formats.md")
    doc.write_text(render_into(doc.read_text()))
