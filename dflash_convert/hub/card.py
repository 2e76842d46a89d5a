"""The README.md pushed with a draft: Hub metadata (the client's ModelCard / ModelCardData) and a
generated section saying how to serve the draft with vLLM and SGLang, how it was validated and where
it came from.

The generated section sits between two markers and is replaced on every push; the user's text
around it and the user's metadata keys are kept.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from dflash_convert.chart import bar, svg_chart, text_chart
from dflash_convert.io.checkpoint import open_checkpoint

from dflash_convert.io.reading import read_json
from dflash_convert.format import kinds
from dflash_convert.format.kinds.base import RUNTIME_ONLY, CardServing
from dflash_convert.format.configs import ConversionRecord, DraftSpec
from dflash_convert.errors import DFlashError
from dflash_convert.user_text import markdown_cell

README_NAME = "README.md"
RECORD_NAME = "conversion.json"
CARD_BEGIN = "<!-- dflash-convert:begin (generated; replaced on every push, edit outside this section) -->"
CARD_END = "<!-- dflash-convert:end -->"
CARD_TAGS = ("dflash", "speculative-decoding")


def _verifier_id(spec: DraftSpec) -> str | None:
    from dflash_convert.format.configs import is_hub_id

    name = spec.verifier.name_or_path if spec.verifier else None
    return name if name and is_hub_id(name) and not Path(name).exists() else None


def _causality(spec: DraftSpec) -> str:
    if all(spec.layer_causal):
        return "causal within the block (every layer)"
    if not any(spec.layer_causal):
        return "non-causal within the block (every layer attends to the whole block)"
    kinds = ", ".join(f"{i}: {'causal' if c else 'non-causal'}" for i, c in enumerate(spec.layer_causal))
    return f"mixed per layer ({kinds})"


CHART_NAME = "acceptance.svg"  # written beside README.md when the validation has end-to-end figures
PROFILE_NAME = "speculation_profile.json"  # the measured acceptance (NVIDIA Model-Optimizer's schema), beside it


def _render_validation(validation: dict[str, Any]) -> list[str]:
    """The card's Validation section from a validation summary (`ValidationReport.summary()` as JSON):
    the verdict in words, the end-to-end figures with their thresholds and the chart, the checks that
    did not pass. Written for people: no Python values (None, True, lists)."""
    lines = ["### Validation", ""]
    checks = validation.get("checks") if isinstance(validation.get("checks"), list) else []
    counts: dict[str, int] = {}
    for c in checks:
        counts[str(c.get("status"))] = counts.get(str(c.get("status")), 0) + 1
    levels = ", ".join(str(lv).replace("_", " ") for lv in validation.get("levels_run") or [])
    when = f" on {str(validation['created_at'])[:10]} (UTC)" if validation.get("created_at") else ""
    verdict = {True: "**passed**", False: "**failed**"}.get(validation.get("passed"), "ran")
    said = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    lines.append(f"Validated by dflash-convert{when}: {verdict}" + (f" ({said}" if said else "")
                 + (f"; levels: {levels})" if said and levels else ")" if said else "") + ".")
    lines.append("")
    a = validation.get("acceptance")
    if isinstance(a, dict):
        t = validation.get("thresholds") or {}
        target = f" against `{validation['target']}`" if validation.get("target") else ""
        sampling = ("greedy" if not a.get("temperature") else
                    f"temperature {a['temperature']} ({a.get('draft_sampling', 'greedy')} drafting)")
        lines += [f"End to end{target}: {a['prompts']} prompts, up to {a['max_new_tokens']} new tokens each, block "
                  f"size {a['block_size']}, {sampling}.", "",
                  "| acceptance length (tau) | speedup | outputs equal to the target's |", "|---|---|---|",
                  f"| {a['acceptance_length']:.2f}" + (f" (min {t['min_acceptance_length']})"
                                                       if t.get("min_acceptance_length") is not None else "")
                  + f" | {a['speedup']:.2f}x" + (f" (min {t['min_speedup']})" if t.get("min_speedup") is not None
                                                 else "")
                  + " | " + (f"{a['outputs_equal']}/{a['prompts']}" if a.get("outputs_equal") is not None
                             else "n/a (sampling)") + " |", "",
                  f"![acceptance per draft position]({CHART_NAME})", "",
                  "Acceptance per draft position (the fraction of draft steps whose token at that position was "
                  "accepted):", "", "```text", *text_chart(a["per_position_rates"], t.get("min_position_rates")),
                  "```", ""]
    lines += _breakdown_lines(validation)
    lines += _endpoint_lines(validation.get("endpoint"), validation.get("thresholds") or {})
    lines += _profile_lines(validation.get("speculation_profile"))
    notable = [c for c in checks if c.get("status") not in ("pass", "skip")]
    if notable:
        lines += ["| check | status | message |", "|---|---|---|"]
        for c in notable:
            lines.append(f"| {markdown_cell(c.get('name'))} | {markdown_cell(c.get('status'))} | "
                         f"{markdown_cell(c.get('message', ''))} |")
    return lines + [""]


def _slice_table(title: str, what: str, slices: Any) -> list[str]:
    """One breakdown of a validation report (its SliceAcceptance rows: per context length, thinking mode, category
    or output bucket) as a Markdown table."""
    rows = [x for x in slices or [] if isinstance(x, dict)]
    if not rows:
        return []
    lines = [f"{title}:", "", f"| {what} | tau | draft steps | outputs equal to the target's |", "|---|---|---|---|"]
    for x in rows:
        equal = x.get("outputs_equal")
        lines.append(f"| {markdown_cell(x.get('label'))} | {float(x.get('acceptance_length') or 0):.2f} | "
                     f"{int(x.get('num_drafts') or 0)} | "
                     + (f"{equal}/{x.get('prompts')}" if isinstance(equal, int) else "n/a") + " |")
    return lines + [""]


def _breakdown_lines(validation: dict[str, Any]) -> list[str]:
    """Where the acceptance was measured apart: tau against context length (and where it falls below half), per
    thinking mode, per prompt category and per bucket of generated position."""
    a = validation.get("acceptance")
    a = a if isinstance(a, dict) else {}
    source = f" (long prompts cut from {markdown_cell(a['context_source'])})" if a.get("context_source") else ""
    lines = _slice_table("Acceptance against context length" + source, "context", a.get("per_context_length"))
    if lines and isinstance(a.get("context_half_tau_length"), int):
        lines.insert(-1, f"tau falls below half its short-prompt value at {a['context_half_tau_length']} tokens.")
        lines.insert(-1, "")
    lines += _slice_table("Acceptance per thinking mode", "mode", validation.get("per_thinking_mode"))
    lines += _slice_table("Acceptance per prompt category", "category", a.get("per_category"))
    lines += _slice_table("Acceptance per generated position", "positions", a.get("per_output_bucket"))
    return lines


def _profile_lines(profile: Any) -> list[str]:
    """The card's citation of the speculation profile uploaded beside it."""
    if not isinstance(profile, dict):
        return []
    rates = ", ".join(f"{r:.2f}" for r in profile.get("conditional_accept_rates") or [])
    more = len(profile.get("profiles") or [])
    return [f"Measured acceptance profile: [{PROFILE_NAME}]({PROFILE_NAME}) (NVIDIA Model-Optimizer's "
            f"speculation_profile schema): K = {profile.get('num_speculative_tokens')}, mean acceptance length "
            f"{profile.get('mean_accept_length')}, conditional acceptance per position [{rates}]"
            + (f"; {more} more profile(s) in it (other K, context lengths)" if more else "") + ".", ""]


def _endpoint_lines(e: Any, thresholds: dict[str, Any]) -> list[str]:
    """A live deployment's figures (validate --endpoint), as it served them."""
    if not isinstance(e, dict):
        return []
    c = e["counts"]
    b = e.get("baseline_endpoint") or {}
    speed = (f" {b['speedup']:.2f}x the tokens/s of the same target served without speculation"
             + (f", greedy outputs equal on {b['outputs_equal']}/{b['prompts']} prompts" if b.get("outputs_equal")
                is not None else "") + ".") if b else ""
    return [f"Served by {e['engine']} (model `{e['model']}`, measured over HTTP): tau {c['acceptance_length']:.2f} "
            f"in vLLM's counting over {c['num_drafts']} verify steps of {e['prompts']} prompts, "
            f"{e['tokens_per_s']:.0f} tokens/s at concurrency {e['concurrency']}.{speed}", "", "```text",
            *text_chart(c["per_position_rates"], thresholds.get("min_position_rates")), "```", ""]


def _render_k(validation: dict[str, Any], target: str, repo_id: str, serving: CardServing) -> list[str]:
    """The validation's runs per num_speculative_tokens (when it ran several): tau, step costs and expected
    speedup per K, a chart per concurrency, and the launch lines at the recommended K, naming the device the
    costs are from."""
    from dflash_convert.predict.prediction import speedup_text

    rows = [r for r in validation.get("per_num_speculative_tokens") or [] if isinstance(r, dict)]
    if len(rows) < 2:
        return []
    lines = ["### Which K to serve", "", "| num_speculative_tokens | tau | draft step | verify step | target step | "
             "expected speedup | measured speedup |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['num_speculative_tokens']} | {r['acceptance_length']:.2f} | {r['draft_step_s'] * 1e3:.2f} ms | "
              f"{r['verify_step_s'] * 1e3:.2f} ms | {r['target_step_s'] * 1e3:.2f} ms | "
              f"{r['expected_speedup']:.2f}x | {r['measured_speedup']:.2f}x |" for r in rows]
    for rec in validation.get("recommendation") or []:
        k, concurrency = rec["num_speculative_tokens"], rec["concurrency"]
        at = [(r["num_speculative_tokens"], _speedup_at(r, concurrency)) for r in rows]
        at = [(n, x) for n, x in at if x is not None]
        top = max((x for _, x in at), default=0.0) or 1.0
        lines += ["", f"Expected speedup (tau x target step / (draft step + verify step)) at concurrency "
                  f"{concurrency}, from step costs measured on {rec['device']}"
                  + ("" if concurrency == 1 else f" (the target's steps at batch {concurrency})")
                  + ": they do not transfer to another device.", "", "```text"]
        lines += [f"K={n:<3} {bar(x / top, 40)} {x:.2f}x" for n, x in at]
        if not rec.get("speculate", True):  # no K reaches 1.0x there: no launch line at a K that slows serving
            lines += ["```", "", f"Recommended at concurrency {concurrency}: no speculation: no K reaches 1.0x on "
                      f"{rec['device']} (the best, K={k}, {speedup_text(rec['expected_speedup'])}x).", ""]
            continue
        lines += ["```", "", f"Recommended at concurrency {rec['concurrency']}: `num_speculative_tokens` {k}.", "",
                  "```bash", f"vllm serve {target} \\",
                  f"  --speculative-config '{{\"method\": \"{serving.vllm_method}\", \"model\": \"{repo_id}\", "
                  f"\"num_speculative_tokens\": {k}}}'", "```", ""]
        if serving.sglang_block_of_k:
            lines += [f"SGLang: `--speculative-num-draft-tokens {k + 1}` (the block of K+1).", ""]
    return lines


def _render_prediction(validation: dict[str, Any], target: str, repo_id: str, spec: DraftSpec) -> list[str]:
    """validate --predict-gpu's prediction, its launch lines naming this repo (not the path validate read), served
    as the draft's kind is."""
    from dflash_convert.predict.prediction import PredictionReport, launch_line, markdown_lines

    raw = validation.get("prediction")
    if not isinstance(raw, dict):
        return []
    p = PredictionReport.model_validate(raw)
    for rec in p.recommendation:
        if rec.num_speculative_tokens is not None:
            rec.launch = launch_line(p.engine, target, repo_id, rec.num_speculative_tokens, p.tensor_parallel,
                                     spec.variant, spec.block_size or 0)
    return ["### Predicted throughput on GPUs", "", *markdown_lines(p), ""]


def _speedup_at(row: dict[str, Any], concurrency: int) -> float | None:
    """A K row's expected speedup at a concurrency: batch 1's, or its `per_concurrency` entry's."""
    if concurrency == 1:
        return row.get("expected_speedup")
    return next((c.get("expected_speedup") for c in row.get("per_concurrency") or []
                 if isinstance(c, dict) and c.get("concurrency") == concurrency), None)


def _generated_section(spec: DraftSpec, repo_id: str, validation: dict[str, Any] | None,
                       record: ConversionRecord | None) -> str:
    target = _verifier_id(spec) or "<TARGET_MODEL>"
    block, kind = spec.block_size, kinds.of(spec.variant)
    fmt = {"speculators": "speculators (vLLM speculators library layout)",
           "hf": "Hugging Face / z-lab (flat Qwen3 config with DFlash keys)",
           "transformers": "transformers' own (`MuseGlimmerAssistantConfig`: `AutoModel` loads it, "
                           "`generate(speculation_type=\"dflash\")` runs it)"}[spec.source_format]
    vocab = (f"pruned: the draft predicts {spec.draft_vocab_size} of the target's {spec.vocab_size} tokens "
             "(mapped back through d2t)" if spec.is_pruned_vocab else f"full target vocabulary ({spec.vocab_size} tokens)")
    rows = [
        ("format", fmt),
        ("variant", spec.variant),
        ("target model", f"`{target}`" if _verifier_id(spec) else "not recorded in config.json"),
        ("block size", f"{block} (up to {kind.proposals(block, spec.variant_fields)} speculative tokens per step)"
         if block else "not recorded"),
        ("target layer ids", f"{spec.target_layer_ids} (0-based target layers whose outputs feed the draft)"
         if spec.target_layer_ids is not None else "not recorded"),
        ("mask token id", str(spec.mask_token_id) if spec.mask_token_id is not None else "not recorded"),
        ("attention", _causality(spec)),
        ("draft layers", f"{spec.num_layers} x (hidden {spec.hidden_size}, {spec.num_heads} heads, "
                         f"{spec.num_kv_heads} KV heads, head dim {spec.head_dim})"),
        ("vocabulary", vocab),
        ("dtype", spec.dtype or "not recorded"),
    ]
    lines = [CARD_BEGIN, "", "## DFlash draft", "",
             f"A [DFlash](https://github.com/z-lab/dflash) block-diffusion draft model for speculative decoding "
             f"of `{target}`: it proposes a block of tokens in one forward pass from the target's hidden states, "
             "and the target verifies them.", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in rows]
    lines.append("")
    lines += kind.card_note()
    # the kind's serving line: vLLM's method, SGLang's algorithm and block (DSpark: every slot drafts with
    # sample_from_anchor, and SGLang's draft tokens are its gamma + 1)
    anchor = kind.anchor_predicts(spec.variant_fields)
    num_spec = (f"{kind.proposals(block, spec.variant_fields)}" if block else "<BLOCK_SIZE>" if anchor
                else "<BLOCK_SIZE - 1>")
    draft_tokens = kind.sglang_draft_tokens(block)
    serving = kind.card_serving(block, num_spec, anchor)
    non_causal = not all(spec.layer_causal)
    runtime_only = kind.engine_support == RUNTIME_ONLY
    if runtime_only:  # no engine has a model of the kind: no serving command would load it
        lines += ["### Serving", "", f"No serving engine has a model of {kind.title} drafts: dflash-convert's bundled "
                  "runtime runs it (`dflash-convert validate`).", ""]
    else:
        lines += ["### Serve with vLLM", "", "```bash", f"vllm serve {target} \\",
                  f"  --speculative-config '{{\"method\": \"{serving.vllm_method}\", \"model\": \"{repo_id}\", "
                  f"\"num_speculative_tokens\": {num_spec}}}'" + (" \\" if non_causal else ""),
                  *(["  --attention-backend FLASH_ATTN"] if non_causal else []), "```", ""]
        if non_causal:
            lines += ["The draft attends non-causally inside a block: vLLM needs an attention backend with non-causal "
                      "support, e.g. `FLASH_ATTN` or `FLEX_ATTENTION` (`--attention-backend`); backends without it are "
                      "refused or give wrong drafts.", ""]
        lines += ["### Serve with SGLang", "", "```bash", "python -m sglang.launch_server \\",
                  f"  --model-path {target} \\", f"  --speculative-algorithm {serving.sglang_algorithm} \\",
                  f"  --speculative-draft-model-path {repo_id} \\", f"  --speculative-num-draft-tokens {draft_tokens}",
                  "```", "", serving.sglang_note, ""]
    if validation:
        lines += _render_validation(validation)
        if not runtime_only:
            lines += _render_k(validation, target, repo_id, serving)
            lines += _render_prediction(validation, target, repo_id, spec)
    if record is not None:
        rev = f" at `{record.source_revision}`" if record.source_revision else ""
        lines += ["### Provenance", "",
                  f"Converted from the {record.source_format} format{rev} to {record.destination_format} by "
                  f"{record.tool} {record.tool_version}; `conversion.json` lists every input file's sha256 and "
                  "every tensor kept, renamed, dropped or added.", ""]
    lines.append(CARD_END)
    return "\n".join(lines) + "\n"


def _with_section(body: str, section: str, repo_id: str) -> str:
    """body with the generated section replaced, or appended (a title first when the body is empty)."""
    begin = CARD_BEGIN.split(" (")[0]
    if begin in body and CARD_END in body:
        start, end = body.index(begin), body.index(CARD_END) + len(CARD_END)
        return body[:start] + section.rstrip("\n") + body[end:]
    if body.strip():
        return body.rstrip("\n") + "\n\n" + section
    return f"\n# {repo_id.split('/')[-1]}\n\n" + section


def model_card(spec: DraftSpec, *, repo_id: str, validation: dict[str, Any] | None = None,
               existing: str | None = None, record: ConversionRecord | None = None) -> str:
    """README.md text: metadata (library_name, base_model, tags) + the generated section.

    With `existing` (the current README), the user's text outside the generated section and the
    user's metadata are kept; only the section between the markers is replaced.
    """
    from huggingface_hub import ModelCard, ModelCardData
    from huggingface_hub.repocard import REGEX_YAML_BLOCK  # the Hub's own front-matter rule

    text = (existing or "").lstrip("\ufeff")
    card = None
    if REGEX_YAML_BLOCK.search(text):
        try:
            card = ModelCard(text)
        except Exception as exc:  # noqa: BLE001 - YAML errors, a non-mapping block, invalid model-index
            raise DFlashError(f"the metadata block does not parse: {' '.join(str(exc).split())}",
                              file=README_NAME) from None
    data = card.data if card is not None else ModelCardData()
    data.library_name = data.library_name or ("speculators" if spec.source_format == "speculators" else "transformers")
    if _verifier_id(spec) and not data.base_model:
        data.base_model = _verifier_id(spec)
    tags = [data.tags] if isinstance(data.tags, str) else list(data.tags or [])
    data.tags = tags + [t for t in CARD_TAGS if t not in tags]
    body = _with_section(card.text if card is not None else text, _generated_section(spec, repo_id, validation, record),
                         repo_id)
    if card is None:
        return f"---\n{data.to_yaml()}\n---\n{body if body.startswith(chr(10)) else chr(10) + body}"
    card.text = body
    return str(card)


def write_model_card(directory: str | Path, spec: DraftSpec | None = None, *, repo_id: str,
                     validation: dict[str, Any] | None = None, existing: str | None = None) -> Path:
    """Write or update directory/README.md (atomically; a symlinked README is replaced, not written through).

    The README updated is the local one, else `existing` (e.g. the README already on the Hub).
    """
    directory = Path(directory)
    if spec is None:
        spec = open_checkpoint(directory).spec
    readme = directory / README_NAME
    if readme.exists():
        existing = readme.read_text(encoding="utf-8")
    record = None
    if (directory / RECORD_NAME).exists():
        try:
            record = ConversionRecord.model_validate(read_json(directory / RECORD_NAME, allow_bom=True))
        except Exception:  # noqa: BLE001 - a foreign conversion.json only loses the provenance paragraph
            record = None
    text = model_card(spec, repo_id=repo_id, validation=validation, existing=existing, record=record)
    acceptance = (validation or {}).get("acceptance")
    if isinstance(acceptance, dict):  # the chart the card shows, uploaded with it
        thresholds = (validation or {}).get("thresholds") or {}
        chart = svg_chart(acceptance["per_position_rates"], thresholds.get("min_position_rates"),
                          title=f"acceptance per draft position: tau {acceptance['acceptance_length']:.2f}, "
                          f"speedup {acceptance['speedup']:.2f}x")
        chart_tmp = directory / f".{CHART_NAME}.tmp"
        chart_tmp.write_text(chart, encoding="utf-8")
        os.replace(chart_tmp, directory / CHART_NAME)
    profile = (validation or {}).get("speculation_profile")
    if isinstance(profile, dict):  # the measured acceptance, for deployment tools, uploaded with the card
        profile_tmp = directory / f".{PROFILE_NAME}.tmp"
        profile_tmp.write_text(json.dumps(profile, indent=2) + "\n", encoding="utf-8")
        os.replace(profile_tmp, directory / PROFILE_NAME)
    tmp = directory / f".{README_NAME}.tmp"
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, readme)
    return readme
