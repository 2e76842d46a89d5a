"""What an engine does with a serving config before it launches, from its own rules (vLLM 0.33, SGLang 0.5.23):
the K it drafts against the trained block, and the settings it refuses or lowers.

vLLM: a DFlash step queries K+1 slots (the bonus token and K mask slots); a DSpark draft with
sample_from_anchor queries K (its anchor slot proposes). Each running sequence needs those slots within
max_num_batched_tokens: a budget of at most that many slots is refused, a budget for fewer than max_num_seqs
sequences lowers the sequences drafted at once. A Qwen3-Omni DSpark draft (Qwen3OmniDSparkModel) must be
served at K equal to its trained block_size. SGLang: the block is --speculative-num-draft-tokens, and a
--speculative-draft-window-size below it is refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dflash_convert.format.compat import Check, make_check
from dflash_convert.format import kinds
from dflash_convert.format.configs import DraftSpec

QWEN3_OMNI_DSPARK = "Qwen3OmniDSparkModel"  # vLLM 0.33 holds it to K == block_size


@dataclass(frozen=True)
class ServingConfig:
    """A launch's settings in vLLM's names (K = num_speculative_tokens); None: not given."""

    engine: str
    num_speculative_tokens: int
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    draft_window_size: int | None = None  # SGLang's --speculative-draft-window-size


def anchor_proposes(spec: DraftSpec) -> bool:
    """A draft whose anchor slot proposes (DSpark's sample_from_anchor): K proposals take K slots, not K+1."""
    return kinds.of(spec.variant).anchor_predicts(spec.variant_fields)


def slots(spec: DraftSpec, k: int) -> int:
    """Query slots of one drafting step at K (vLLM's num_lookahead_tokens for DFlash and DSpark)."""
    return k if anchor_proposes(spec) else k + 1


def serving_checks(spec: DraftSpec, raw: dict[str, Any], cfg: ServingConfig) -> list[Check]:
    """One check per rule the config meets: fail where the engine refuses it, warn where it runs otherwise
    than asked or than trained, pass where it runs as asked."""
    checks = [_trained_block(spec, cfg)]
    if cfg.engine == "vllm":
        checks += _vllm(spec, raw, cfg)
    elif cfg.engine == "sglang" and cfg.draft_window_size is not None:
        block = slots(spec, cfg.num_speculative_tokens)
        checks.append(make_check("serving_draft_window", cfg.draft_window_size >= block,
                                 f"SGLang refuses --speculative-draft-window-size {cfg.draft_window_size} below "
                                 f"--speculative-num-draft-tokens {block} (the block): the window must cover it"
                                 if cfg.draft_window_size < block else
                                 f"the draft window {cfg.draft_window_size} covers the block of {block}",
                                 value=cfg.draft_window_size, threshold=f">= {block}"))
    return checks


def _trained_block(spec: DraftSpec, cfg: ServingConfig) -> Check:
    k, trained = cfg.num_speculative_tokens, spec.block_size or 0
    most = trained if anchor_proposes(spec) else trained - 1  # proposals the trained block makes
    if k > most:
        return make_check("serving_k", False, f"num_speculative_tokens {k} drafts {k - most} slot(s) past the "
                          f"trained block of {trained} ({most} proposals): those positions were never trained and "
                          "accept little; the step still pays for them", value=k, threshold=f"<= {most}", bad="warn")
    return make_check("serving_k", True, f"num_speculative_tokens {k}: {slots(spec, k)} slots per step, within the "
                      f"trained block of {trained}", value=k, threshold=f"<= {most}")


def _vllm(spec: DraftSpec, raw: dict[str, Any], cfg: ServingConfig) -> list[Check]:
    k, checks = cfg.num_speculative_tokens, []
    if QWEN3_OMNI_DSPARK in (raw.get("architectures") or []) and k != spec.block_size:
        checks.append(make_check("serving_omni_dspark", False, f"vLLM 0.33 refuses a Qwen3-Omni DSpark draft at "
                                 f"num_speculative_tokens {k}: it must match the trained block_size "
                                 f"({spec.block_size})", value=k, threshold=spec.block_size))
    budget, need = cfg.max_num_batched_tokens, slots(spec, k)
    if budget is None:
        return checks
    if budget <= need:
        checks.append(make_check("serving_token_budget", False, f"vLLM refuses max_num_batched_tokens {budget}: a "
                                 f"drafting step of one sequence needs {need} slots (K={k}) and a budget above them "
                                 "(no token could be scheduled)", value=budget, threshold=f"> {need}"))
    elif cfg.max_num_seqs is not None and budget // need < cfg.max_num_seqs:
        checks.append(make_check("serving_token_budget", False, f"max_num_batched_tokens {budget} holds the "
                                 f"{need} draft slots of {budget // need} sequences, not max_num_seqs "
                                 f"{cfg.max_num_seqs}: vLLM lowers max_num_active_seqs to {budget // need} (give "
                                 f"at least {cfg.max_num_seqs * need} tokens)", value=budget,
                                 threshold=f">= {cfg.max_num_seqs * need}", bad="warn"))
    else:
        checks.append(make_check("serving_token_budget", True, f"max_num_batched_tokens {budget} holds {need} draft "
                                 "slots per sequence for every running sequence", value=budget))
    return checks
