"""DSpark: the DFlash backbone with a Markov logit bias of the previous token and a confidence head (speculators
`dspark`: DSparkDraftModel, MarkovHead, ConfidenceHead; vLLM qwen3_dspark.py + spec_decode/dspark; SGLang
models/dspark.py). With sample_from_anchor every slot of the block proposes, the anchor's included. The HF layout
keeps its keys at the top level, where vLLM reads them (SGLang reads dflash_config first, then the top)."""

from __future__ import annotations

from typing import Any

from dflash_convert.format.kinds.base import (
    ATTENTION_VARIANTS, LOGIT_MAPS, OWN_TABLE, CardServing, ConfigKey, Kind, Tensor, sized,
)

NAME = "dspark"
MARKOV_HEAD_TYPES = ("vanilla", "gated", "rnn")
OWN_KEYS = (
    ConfigKey("sample_from_anchor", "vLLM, SGLang, speculators",
              "true: every slot, the anchor's included, predicts (block_size drafts); false: the anchor is the "
              "bonus token (block_size - 1)", speculators="sample_from_anchor", required=True, hf_top=True,
              filled=(True,), hf_filled=(True,), typed="bool"),
    ConfigKey("markov_rank", "vLLM, SGLang, speculators",
              "rank r of the Markov logit bias W2 @ W1[previous token] (0: no Markov head; engines need > 0)",
              speculators="markov_rank", required=True, hf_top=True, filled=(256,), typed="size", hf_nested=True),
    ConfigKey("markov_head_type", "SGLang, speculators (vLLM builds vanilla only)",
              "vanilla (bias from the previous token), gated (hidden-gated) or rnn (recurrent over the block)",
              speculators="markov_head_type", required=True, hf_top=True, filled=("vanilla",), typed="text",
              hf_nested=True),
    ConfigKey("enable_confidence_head", "vLLM, SGLang, speculators",
              "a per-slot acceptance-probability head (vLLM: adaptive verification; SGLang: verify window)",
              speculators="enable_confidence_head", required=True, hf_top=True, filled=(True,), typed="bool"),
    ConfigKey("confidence_head_with_markov", "vLLM, SGLang, speculators",
              "the confidence head reads [hidden; Markov embedding of the previous token] instead of hidden",
              speculators="confidence_head_with_markov", required=True, hf_top=True, filled=(True,), typed="bool"),
    ConfigKey("dspark_draft_topk", "vLLM (qwen3_dspark.py, the DSpark speculator)",
              "the Markov step scores only the top-k base candidates of each slot (a speculative-config "
              "option too)", hf_top=True),
    ConfigKey("logit_scale", "vLLM (qwen3_dspark.py's logits processor)",
              "multiplies the DSpark draft's logits", neutral=(1.0, 1), hf_top=True,
              typed="float"),
)
BOOLS = ("sample_from_anchor", "enable_confidence_head", "confidence_head_with_markov")
BONUS_ANCHOR = "dspark_bonus_anchor"  # what vLLM's speculators reader writes: not sample_from_anchor


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v > 0


def _markov(spec, head_type: str | None = None) -> bool:
    """A Markov head (of this type) is built: speculators builds one when markov_rank > 0."""
    f = spec.variant_fields
    rank = f.get("markov_rank")
    return isinstance(rank, int) and rank > 0 and (head_type is None or f.get("markov_head_type") == head_type)


def _confidence(spec) -> bool:
    return spec.variant_fields.get("enable_confidence_head") is True


def _confidence_width(spec):
    """[1, H (+ r when it reads the Markov embedding too)]; unsized while the keys are contradictory. An absent
    confidence_head_with_markov is the value the draft was trained with (speculators' fill-in), the one the runtime
    builds the head with."""
    with_markov = KIND.trained_value(spec.variant_fields, "confidence_head_with_markov")
    if not isinstance(with_markov, bool):
        return None
    if not with_markov:
        return (1, spec.hidden_size)
    return (1, spec.hidden_size + spec.variant_fields["markov_rank"]) if _markov(spec) else None


def _markov_hint(spec) -> str:
    f = spec.variant_fields
    return (f"markov_rank={f.get('markov_rank')}, markov_head_type={f.get('markov_head_type')}, "
            f"hidden_size={spec.hidden_size}, vocab_size={spec.vocab_size}, draft vocab={spec.draft_vocab}")


def _confidence_hint(spec) -> str:
    f = spec.variant_fields
    return (f"enable_confidence_head={f.get('enable_confidence_head')}, confidence_head_with_markov="
            f"{f.get('confidence_head_with_markov')}, markov_rank={f.get('markov_rank')}, "
            f"hidden_size={spec.hidden_size}")


def _entry(key: str, name: str, role: str, shape, needed, hint=_markov_hint) -> Tensor:
    return Tensor(key, name, role, shape, needed=needed, check="family_shapes", hint=hint,
                  only_if_needed=True)


# vLLM qwen3_dspark.py and SGLang models/dspark.py load the same names: W1 over the target vocab, W2 onto the draft
# vocab, rank r
TENSORS = (
    _entry("markov_w1", "markov_head.markov_w1.weight", "dspark Markov embedding of the previous token [V, r]",
           lambda s: sized(s, "vocab", "markov_rank"), _markov),
    _entry("markov_w2", "markov_head.markov_w2.weight", "dspark Markov bias projection [draft_vocab, r]",
           lambda s: sized(s, "draft_vocab", "markov_rank"), _markov),
    _entry("markov_gate", "markov_head.gate_proj.weight", "dspark gated Markov head gate [r, H + r]",
           lambda s: sized(s, "markov_rank", ("hidden", "markov_rank")), lambda s: _markov(s, "gated")),
    _entry("markov_gate_bias", "markov_head.gate_proj.bias", "dspark gated Markov head gate bias [r]",
           lambda s: sized(s, "markov_rank"), lambda s: _markov(s, "gated")),
    _entry("markov_joint", "markov_head.joint_proj.weight", "dspark rnn Markov head [3r, 2r + H]",
           lambda s: sized(s, "3*markov_rank", ("markov_rank", "markov_rank", "hidden")),
           lambda s: _markov(s, "rnn")),
    _entry("markov_joint_bias", "markov_head.joint_proj.bias", "dspark rnn Markov head bias [3r]",
           lambda s: sized(s, "3*markov_rank"), lambda s: _markov(s, "rnn")),
    _entry("confidence_proj", "confidence_head.proj.weight", "dspark confidence head [1, H (+ r)]",
           _confidence_width, _confidence, _confidence_hint),
    _entry("confidence_bias", "confidence_head.proj.bias", "dspark confidence head bias [1]",
           lambda s: (1,), _confidence, _confidence_hint),
)

# speculators 0.9.0 DSparkDraftModel / MarkovHead; vLLM qwen3_dspark.py; SGLang models/dspark.py
RULES = (
    ("markov_rank is a positive integer (vLLM and SGLang serve DSpark only with its Markov head; "
     "speculators' markov_rank 0 trains a draft no engine serves)",
     lambda f, h, v, b, p: _int(f.get("markov_rank"))),
    ("markov_head_type is vanilla, gated or rnn (speculators and SGLang refuse anything else)",
     lambda f, h, v, b, p: f.get("markov_head_type") in MARKOV_HEAD_TYPES),
    ("sample_from_anchor, enable_confidence_head and confidence_head_with_markov are true or false",
     lambda f, h, v, b, p: all(isinstance(f.get(k), bool) or f.get(k) is None for k in BOOLS)),
    ("confidence_head_with_markov needs a Markov head (speculators and SGLang refuse it with markov_rank 0)",
     lambda f, h, v, b, p: not (f.get("enable_confidence_head") and f.get("confidence_head_with_markov"))
     or _int(f.get("markov_rank"))),
)

# What each engine serves of a DSpark draft (engine row key -> kind of support)
V2_RUNNER_VANILLA, ALL_HEADS_TARGET_LM_HEAD, NOT_SERVED = "v2_runner_vanilla", "all_heads_target_lm_head", "not_served"
SUPPORT = {"vllm-speculators": V2_RUNNER_VANILLA, "vllm-hf": V2_RUNNER_VANILLA, "sglang": ALL_HEADS_TARGET_LM_HEAD,
           "zlab": NOT_SERVED, "transformers": NOT_SERVED}
SUPPORT_TEXT = {
    V2_RUNNER_VANILLA: "V2 model runner only (V1: 'Model Runner V1 does not support: dspark speculative "
                       "decoding'); vanilla Markov head only; DSpark keys read at the top level",
    ALL_HEADS_TARGET_LM_HEAD: "vanilla, gated and rnn Markov heads; the target's lm_head; the confidence "
                              "head built whatever `enable_confidence_head` says",
    NOT_SERVED: "not served",
}
# what vLLM's V1 model runner (the only one without Triton, so the CPU build's) says when it refuses a DSpark draft
VLLM_V1_DSPARK = "Model Runner V1 does not support: dspark speculative decoding"


def _view_anchor(view, rules, trained: bool | None, raw: dict[str, Any], divergence) -> None:
    """sample_from_anchor as the engine reads it. Absent, vLLM's speculators reader takes false (the anchor is the
    bonus token: 1 + N slots), its HF reader and SGLang true; speculators trained with its fill-in, true."""
    absent = raw.get("sample_from_anchor") is None
    # vLLM's speculators reader copies the DSpark keys to the top level; both engines read them there
    view.anchor_predicts = raw.get("sample_from_anchor", rules.reads != "speculators")
    if view.anchor_predicts != trained:
        said = (f"sample_from_anchor is absent and {rules.title} takes {view.anchor_predicts} (speculators trained "
                f"with its default, {trained}): " if absent else "")
        view.divergences.append(divergence(
            field="sample_from_anchor", severity="error", trained=trained, applied=view.anchor_predicts,
            consequence=said + "the engine lays the block out the other way (anchor drafting vs bonus anchor): "
                               "every slot predicts another position than trained",
            fix="write sample_from_anchor explicitly (convert does)"))


def _view_vllm(view, rules, spec, raw: dict[str, Any], divergence) -> None:
    """vLLM 0.33's Qwen3DSparkModel: top-level keys, the vanilla head, num_speculative_tokens after the anchor."""
    div, f = view.divergences, spec.variant_fields
    head, anchor = f.get("markov_head_type"), f.get("sample_from_anchor")
    if rules.reads == "hf" and raw.get("markov_rank") is None:
        view.loads = False
        div.append(divergence(field="markov_rank", severity="error", trained=f.get("markov_rank"), applied=None,
                              consequence="vLLM reads markov_rank only at the top level of config.json (this one "
                                          "has it in dflash_config): Qwen3DSparkModel fails to build",
                              fix="convert --to hf (writes the DSpark keys at the top level)"))
    if head != "vanilla":
        view.loads = False
        div.append(divergence(field="markov_head_type", severity="error", trained=head, applied="vanilla",
                              consequence=f"vLLM 0.33's Qwen3DSparkModel builds the vanilla Markov head only: the "
                                          f"{head} head's tensors have no parameter there and the load fails",
                              fix="serve it with SGLang"))
    if rules.reads == "hf" and anchor is False:
        div.append(divergence(field="block_size", severity="warning", trained=spec.block_size,
                              applied=(spec.block_size or 0) + 1,
                              consequence="vLLM's DSpark drafts num_speculative_tokens (default: block_size) "
                                          "slots after the bonus anchor, a block one longer than trained",
                              fix=f"serve with num_speculative_tokens={(spec.block_size or 1) - 1}"))


def _rnn_start_differs(divergence):
    """An rnn Markov head with a bonus anchor: SGLang starts its state where speculators' training does not."""
    return divergence(field="markov_head_type", severity="warning", trained="rnn from slot 0",
                      applied="rnn from slot 1",
                      consequence="with the anchor as bonus token, SGLang 0.5.23 runs the rnn head over the drafting "
                                  "slots 1..B-1 from a zero state, while speculators 0.9.0 trained the recurrence from "
                                  "the anchor's slot 0 (its state carries into slot 1): the Markov bias differs from "
                                  "training at every slot and acceptance may be lower than trained (the runtime "
                                  "runs SGLang's rule)",
                      fix="train the rnn head with sample_from_anchor true, or measure with validate")


class DSpark(Kind):
    name = NAME
    title = "DSpark"
    hf_architecture = "Qwen3DSparkModel"  # vLLM 0.33 and SGLang 0.5.23 load an HF-layout DSpark draft by it
    speculators_architecture = "DSparkDraftModel"  # speculators' own class (vLLM maps it to Qwen3DSparkModel)
    hf_aliases = (("DSparkDraftModel", "qwen3"),)  # an HF DSpark config with this name and model_type qwen3
    keys = (*LOGIT_MAPS, *OWN_KEYS, *ATTENTION_VARIANTS)
    tensors = TENSORS
    rules = RULES
    modules = "Markov and confidence head"
    anchor_may_propose = True
    vllm_v1_refusal = VLLM_V1_DSPARK
    vllm_v1_label = "DSpark"
    engine_support = OWN_TABLE
    support, support_text, support_title = SUPPORT, SUPPORT_TEXT, "DSpark drafts"
    drops_mask_embedding = True  # vLLM 0.33's and SGLang 0.5.23's DSpark loaders (the mask slots embed the vocab row)

    def hf_own_keys(self) -> tuple[str, ...]:
        return (*(k.name for k in self.keys if k.hf_top), BONUS_ANCHOR)

    def check_hf_fields(self, raw: dict[str, Any], fields: dict[str, Any]) -> str | None:
        bonus = raw.get(BONUS_ANCHOR)
        if bonus is not None and bonus == fields.get("sample_from_anchor"):
            return (f"field `{BONUS_ANCHOR}` is {bonus!r} while sample_from_anchor is "
                    f"{fields.get('sample_from_anchor')!r}: one says the anchor is the bonus token, the other that it "
                    "drafts; they must be opposite")
        return None

    def speculators_refusal(self, fields: dict[str, Any]) -> str | None:
        absent = next((k for k in self.keys if k.required and fields.get(k.name) is None), None)
        if absent is None:
            return None
        return (f"field `{absent.hf_path}` is absent: the HF readers disagree on what it means (vLLM, SGLang and "
                "speculators default it differently), so the speculators config, which states it, cannot be "
                f"written; set {absent.name} in the source config first")

    def engine_view(self, view, rules, spec, raw: dict[str, Any], *, divergence, v2_runner_only) -> None:
        """What the engine serves of a DSpark draft: its runner, Markov head, confidence head and anchor slot."""
        div, f, support = view.divergences, spec.variant_fields, self.support[rules.key]
        head, anchor = f.get("markov_head_type"), f.get("sample_from_anchor")
        if support == NOT_SERVED:
            view.loads = False
            div.append(divergence(field="architectures", severity="error", trained=NAME, applied=None,
                                  consequence=f"{rules.title} has no DSpark model", fix="serve it with vLLM or SGLang"))
            return
        _view_anchor(view, rules, anchor, raw, divergence)
        if support == V2_RUNNER_VANILLA:
            div.append(v2_runner_only(self.vllm_v1_label, self.vllm_v1_refusal))
            _view_vllm(view, rules, spec, raw, divergence)
        elif support == ALL_HEADS_TARGET_LM_HEAD and f.get("enable_confidence_head") is False:
            view.loads = False
            div.append(divergence(field="enable_confidence_head", severity="error", trained=False, applied=True,
                                  consequence="SGLang 0.5.23 builds the confidence head whatever "
                                              "enable_confidence_head says and refuses a checkpoint without "
                                              "confidence_head.proj (unless its ragged verify mode is static)",
                                  fix="serve it with vLLM, or SGLang with the static ragged verify mode"))
        if support == ALL_HEADS_TARGET_LM_HEAD and head == "rnn" and view.anchor_predicts is False:
            div.append(_rnn_start_differs(divergence))

    def card_serving(self, block: int | None, num_spec: str, anchor: bool) -> CardServing:
        # SGLang's draft tokens are DSpark's gamma (block_size) + 1
        draft_tokens = self.sglang_draft_tokens(block)
        return CardServing("dspark", "DSPARK", (
            f"`--speculative-num-draft-tokens` is DSpark's gamma plus one in SGLang ({draft_tokens}: gamma is the "
            f"config's block_size, as SGLang reads it); vLLM's `num_speculative_tokens` is the tokens drafted per "
            f"block ({num_spec}: "
            + ("every slot drafts, the anchor's included)." if anchor else "the anchor is the bonus token).")),
            sglang_block_of_k=False)

    def sglang_draft_tokens(self, block: int | None) -> str:
        return f"{block + 1}" if block else "<BLOCK_SIZE>"


KIND = DSpark()
