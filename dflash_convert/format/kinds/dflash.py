"""The plain DFlash draft: the backbone alone (docs/formats.md sections 4-5). Its anchor is the bonus token (a block
of B proposes B - 1), vLLM's V1 model runner serves it, and its own keys are the bonus-anchor flag and SGLang's
Domino projector."""

from __future__ import annotations

from dflash_convert.format.kinds.base import ATTENTION_VARIANTS, BACKBONE_RULES, LOGIT_MAPS, ConfigKey, Kind

# anchor: DFlash's anchor slot is a bonus token; vLLM refuses true for DFlash (DSpark's mode)
SAMPLE_FROM_ANCHOR = ConfigKey("sample_from_anchor", "vLLM", "whether the anchor slot predicts a token",
                               neutral=(False,), speculators="sample_from_anchor")
# SGLang's Domino projector
DOMINO = (
    ConfigKey("projector_type", "SGLang", "replaces the context projector (`domino`)"),
    ConfigKey("shift_label", "SGLang (domino)", "label shift of the Domino projector"),
    ConfigKey("pure_draft_prefix_len", "SGLang (domino)", "Domino's pure-draft prefix"),
    ConfigKey("gru_hidden_dim", "SGLang (domino)", "width of Domino's GRU"),
    ConfigKey("emb_dim", "SGLang (domino)", "Domino's embedding width"),
)


class DFlash(Kind):
    name = "dflash"
    title = "DFlash"
    hf_architecture = "DFlashDraftModel"
    speculators_architecture = "DFlashDraftModel"
    keys = (*LOGIT_MAPS, SAMPLE_FROM_ANCHOR, *ATTENTION_VARIANTS, *DOMINO)
    engine_support = BACKBONE_RULES
    legacy_block_writer = True  # speculators PR #354 .. #456 (2026-04-15 .. 04-21)


KIND = DFlash()
