"""The one draft/target compatibility checker, and the check rows every report is made of.

`compatibility_checks(spec, target)` compares a draft with its target's config (no weights) and
returns one Check per rule. The static validation level reports them all; conversion with
`--verifier` raises the first failure (warnings become conversion warnings); the runtime raises the
first failure among RUN_BLOCKING, the rules without which the forward cannot run:

- the draft's fc takes len(target_layer_ids) target states of `target_hidden_size` (default: the
  draft's hidden size) each, so the target's hidden size must be that;
- the draft embeds its block with the target's embedding table and, with a full vocabulary, reads
  the target's lm_head, so the draft's own hidden size must also be the target's (engines that load
  a draft-owned embedding exist, but conversion drops embed_tokens as a copy of the target's and
  the runtime always borrows the target's);
- every target layer id must be a layer of the target, the draft's vocab_size must be the target's
  and the mask id a row of its embedding table.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel

from dflash_convert.format.configs import DraftSpec
from dflash_convert.errors import DFlashError
from dflash_convert.format.mapping import TargetInfo

Status = Literal["pass", "fail", "warn", "skip"]
Level = Literal["static", "numeric", "end_to_end"]


class Check(BaseModel):
    """One row of a report: what was checked, the measured value and the limit it was held to."""

    name: str
    status: Status
    value: Any = None
    threshold: Any = None
    message: str = ""
    level: Level = "static"

    @property
    def failed(self) -> bool:
        return self.status == "fail"


def make_check(name: str, ok: bool | None, message: str, *, value: Any = None, threshold: Any = None,
               level: Level = "static", bad: Status = "fail") -> Check:
    """pass when ok, `bad` (fail or warn) when not ok, skip when ok is None."""
    status: Status = "skip" if ok is None else ("pass" if ok else bad)
    return Check(name=name, status=status, value=value, threshold=threshold, message=message, level=level)


def raise_first_failure(checks: list[Check], *, names: tuple[str, ...] | None = None, file=None) -> None:
    """Raise the first failed check (among `names`, when given) as a one-line DFlashError."""
    for c in checks:
        if c.failed and (names is None or c.name in names):
            raise DFlashError(c.message, file=file)


# ----------------------------------------------------------------------------- the rules

def mask_range_check(mask: int, vocab: int, *, source: str, prefix: str = "") -> Check:
    """`{prefix}mask_token_id`: the mask id is a row of the embedding table the block is embedded with."""
    ok = 0 <= mask < vocab
    return make_check(f"{prefix}mask_token_id", ok, f"mask_token_id {mask} is " + (
        f"a row of the embedding table of {source} ({vocab} rows)" if ok else
        f"outside the embedding table of {source} ({vocab} rows)"), value=mask, threshold=f"[0, {vocab})")


def mask_special_check(mask: int, pad: int | None, eos: tuple[int, ...], *, source: str, prefix: str = "") -> Check:
    """`{prefix}mask_token_id_special`: the mask id is not eos (the block would read as ended text: fail)
    nor pad (often an untrained row: warn). z-lab/dflash #73, NeMo #2461."""
    name = f"{prefix}mask_token_id_special"
    if mask in eos:
        return make_check(name, False, f"mask_token_id {mask} is the eos token of {source}: the block would be "
                          "filled with end-of-text, not a mask", value=mask, threshold=f"not eos {list(eos)}")
    if pad is not None and mask == pad:
        return make_check(name, False, f"mask_token_id {mask} is the pad token of {source}: check it is the token "
                          "the draft was trained with", value=mask, threshold=f"not pad {pad}", bad="warn")
    if pad is None and not eos:
        return make_check(name, None, f"{source} names no pad/eos token to compare the mask id with", value=mask)
    return make_check(name, True, f"mask id {mask} is neither pad ({pad}) nor eos ({list(eos)}) of {source}",
                      value=mask, threshold="not pad/eos")


def layer_ids_check(ids: list[int], num_layers: int, source: str, name: str = "target_layer_ids_in_target") -> Check:
    """Every id is a decoder layer of the target (of `source`, which has `num_layers` layers)."""
    out = [i for i in ids if not 0 <= i < num_layers]
    return make_check(name, not out,
                      f"target_layer_ids {out} are not layers of {source} ({num_layers} layers: 0..{num_layers - 1})"
                      if out else f"target_layer_ids {list(ids)} are layers of {source} ({num_layers} layers)",
                      value=list(ids), threshold=f"[0, {num_layers})")


def compatibility_checks(spec: DraftSpec, target: TargetInfo) -> list[Check]:
    """The draft against its target's config (shapes only, no weights), one check per rule."""
    source = f"target {target.name_or_path}"
    draft_th = spec.target_hidden
    n_ids = len(spec.target_layer_ids or [])
    problems = []
    if draft_th != target.hidden_size:
        problems.append(f"the draft's fc takes {n_ids} ids x target hidden {draft_th} = {n_ids * draft_th} inputs")
    if spec.hidden_size != target.hidden_size:
        problems.append(f"the draft's hidden size is {spec.hidden_size}, and it embeds its block with the target's "
                        "embedding table and reads the target's lm_head")
    checks = [make_check("target_hidden_size", not problems, f"{source} has hidden_size {target.hidden_size}; " + (
        "; ".join(problems) if problems else f"the draft's fc takes {n_ids} ids x {draft_th} and its hidden size "
        "matches"), value=draft_th, threshold=target.hidden_size)]
    if spec.target_layer_ids is None:
        checks.append(make_check("target_layer_ids_in_target", None, "draft has no target layer ids"))
    else:
        checks.append(layer_ids_check(spec.target_layer_ids, target.num_layers, source))
    if spec.num_target_layers is None:
        checks.append(make_check("target_num_layers", None, f"draft config does not record num_target_layers "
                                 f"({source} has {target.num_layers})", threshold=target.num_layers))
    else:
        checks.append(make_check("target_num_layers", spec.num_target_layers == target.num_layers,
                                 f"field `num_target_layers` = {spec.num_target_layers}; {source} has "
                                 f"{target.num_layers} layers", value=spec.num_target_layers,
                                 threshold=target.num_layers))
    checks.append(make_check("target_vocab_size", spec.vocab_size == target.vocab_size,
                             f"draft vocab_size {spec.vocab_size}; {source} has vocab_size {target.vocab_size}",
                             value=spec.vocab_size, threshold=target.vocab_size))
    if spec.mask_token_id is None:
        checks.append(make_check("target_mask_token_id", None, "draft has no mask_token_id"))
    else:
        checks += [mask_range_check(spec.mask_token_id, target.vocab_size, source=source, prefix="target_"),
                   mask_special_check(spec.mask_token_id, target.pad_token_id, target.eos_token_ids, source=source,
                                      prefix="target_")]
    if spec.is_pruned_vocab:
        vd = spec.draft_vocab_size
        checks.append(make_check("target_draft_vocab", vd <= target.vocab_size,
                                 f"draft vocab {vd} vs {source} vocab {target.vocab_size}", value=vd,
                                 threshold=f"<= {target.vocab_size}"))
    return checks


# The rules without which a draft and a target cannot run together (the runtime refuses these).
RUN_BLOCKING = ("target_hidden_size", "target_layer_ids_in_target", "target_vocab_size", "target_mask_token_id")
