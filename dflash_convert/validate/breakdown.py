"""Acceptance where deployments lose it, broken down: by context length (--context-lengths: the same pair on
prompts of exactly L tokens cut from a real long text) and by generated position (the verify steps grouped
by where in the output they began); the long prompts themselves; and how the report shows both (terminal
lines, Markdown, an SVG curve in chart.py's style).

A context length's figures come from its own decoding; the short-context value they are held against is the
run's own tau on its prompts. `half_tau_length` names the first length whose tau is below half of it."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dflash_convert.chart import svg_curve, svg_series_chart, text_curve
from dflash_convert.errors import DFlashError
from dflash_convert.io.reading import read_text
from dflash_convert.validate.prompts import BUILTIN_TEXT_PROMPTS, read_prompts
from dflash_convert.validate.static import Check, make_check
from dflash_convert.user_text import markdown_cell, printable

# The figures are made here as the fields of report.SliceAcceptance (dicts: report_terminal and report_markdown
# render with this one, so this one does not import the report); the rendering reads a report's AcceptanceStats
# and SliceAcceptance by attribute.

BUCKET_EDGES = (0, 64, 256, 1024)  # generated positions where an output bucket starts; the last is open
CONTEXT_PROMPTS = 4  # windows of the long text per context length, where the text holds that many
MAX_LONG_TEXT_BYTES = 64 << 20  # a --long-context-file
LONG_TEXT = ("a --long-context-file (the long text --context-lengths cuts its prompts from: a document, code; token "
             "ids, space-separated ints or a JSON list per line, when the target ships no tokenizer)")


@dataclass
class LongContexts:
    """The prompts of --context-lengths: per length, up to CONTEXT_PROMPTS windows of exactly that many tokens,
    and where the text came from (said in the report)."""

    windows: dict[int, list[list[int]]]
    source: str


def context_windows(text_ids: list[int], lengths: list[int], source: str, prefix: list[int] | None = None
                    ) -> LongContexts:
    """Consecutive windows of `text_ids`, each `prefix` (the tokenizer's BOS, if it adds one) + L - len(prefix)
    text tokens: as many as the text holds (at most CONTEXT_PROMPTS), else one window of the text repeated
    until it is L long (the source then says how many times: a repeated text is easier to draft than a real
    one of that length)."""
    prefix = list(prefix or [])
    if not text_ids:
        raise ValueError("the long-context text has no tokens")
    windows: dict[int, list[list[int]]] = {}
    repeated = []
    for length in sorted(lengths):
        body = max(length - len(prefix), 1)
        n = min(CONTEXT_PROMPTS, len(text_ids) // body)
        if n == 0:
            times = -(-body // len(text_ids))
            repeated.append(f"{length} ({times}x)")
            windows[length] = [prefix + (text_ids * times)[:body]]
        else:
            windows[length] = [prefix + text_ids[i * body:(i + 1) * body] for i in range(n)]
    note = (f"; {len(text_ids)} tokens, repeated to reach " + ", ".join(repeated) + ": a repeated text is easier "
            "to draft than a real one of that length") if repeated else f"; {len(text_ids)} tokens"
    return LongContexts(windows, source + note)


def long_contexts(lengths: list[int], file: str | Path | None, tokenizer: Any, prompt_list: list | None,
                  prompt_ids: list[list[int]], vocab_size: int) -> LongContexts:
    """The prompts of --context-lengths: windows of `file` (raw text tokenized without a chat template, the
    tokenizer's BOS first where it adds one; token ids per line when the target ships no tokenizer), else of
    the prompts' own texts joined in order (a blank line between), else of their token ids joined in order."""
    prefix: list[int] = []
    if file is not None:
        if tokenizer is None:
            rows = read_prompts(file, what=LONG_TEXT)
            if not all(isinstance(r, list) and all(type(i) is int for i in r) for r in rows):
                raise DFlashError("the target ships no tokenizer: a --long-context-file must hold token ids "
                                  "(space-separated ints or a JSON list per line)", file=file)
            ids, source = [i for r in rows for i in r], f"{file} (token ids, joined in order)"
        else:
            text = read_text(Path(file), LONG_TEXT, max_bytes=MAX_LONG_TEXT_BYTES)
            ids, source = tokenizer(text, add_special_tokens=False)["input_ids"], f"{file} (raw text, no chat template)"
            prefix = tokenizer("", add_special_tokens=True)["input_ids"]
    else:
        texts = prompt_list if prompt_list is not None else (list(BUILTIN_TEXT_PROMPTS) if tokenizer else None)
        if tokenizer is not None and texts and all(isinstance(t, str) for t in texts):
            ids = tokenizer("\n\n".join(texts), add_special_tokens=False)["input_ids"]
            prefix = tokenizer("", add_special_tokens=True)["input_ids"]
            source = "the prompts' own texts joined in order (raw text, no chat template)"
        else:
            ids = [i for p in prompt_ids for i in p]
            source = ("the prompts' token ids joined in order" + (" (random ids: the target ships no tokenizer, "
                      "so this is no real text)" if prompt_list is None else ""))
    bad = [i for i in ids if not 0 <= i < vocab_size]
    if bad or not ids:
        raise DFlashError(f"token ids {bad[:3]} outside the target vocab ({vocab_size})" if bad else
                          f"no tokens to cut long prompts from: not {LONG_TEXT}" if file is not None else
                          "no tokens to cut long prompts from", file=file or "--context-lengths")
    return context_windows(ids, lengths, source, prefix)


def counts_of(steps: list[int], slots: int) -> dict:
    """num_drafts, accepted, tau, per-position rates and the steps-by-drafts-accepted histogram of verify steps
    that accepted `steps[i]` proposals each, over `slots` proposals per block."""
    n = len(steps)
    hist = [0] * (slots + 1)
    for a in steps:
        hist[min(a, slots)] += 1
    return dict(num_drafts=n, accepted=sum(steps), acceptance_length=round(1 + sum(steps) / n, 4) if n else 1.0,
                per_position_rates=[round(sum(a > k for a in steps) / n, 4) if n else 0.0 for k in range(slots)],
                accepted_histogram=hist)


def context_slice(length: int, steps: list[list[int]], new_tokens: int, slots: int,
                  outputs_equal: int | None) -> dict[str, Any]:
    """The figures of one context length's prompts (`steps`: each prompt's proposals accepted per step)."""
    return dict(label=f"{length} tokens", prompts=len(steps), new_tokens=new_tokens, context_tokens=length,
                outputs_equal=outputs_equal, **counts_of([a for s in steps for a in s], slots))


def output_buckets(steps: list[list[int]], slots: int, max_new_tokens: int) -> list[dict[str, Any]]:
    """The verify steps of every prompt grouped by the generated position each began at (the prefill's token
    is position 0, a step that accepted a proposals moves it by a + 1), in BUCKET_EDGES' buckets below
    max_new_tokens; a bucket no step reached is left out."""
    edges = [e for e in BUCKET_EDGES if e < max_new_tokens]
    found: list[list[int]] = [[] for _ in edges]
    prompts = [0] * len(edges)
    tokens = [0] * len(edges)
    for run in steps:
        seen = set()
        position = 1
        for a in run:
            i = max(k for k, e in enumerate(edges) if position >= e)
            found[i].append(a)
            tokens[i] += a + 1
            seen.add(i)
            position += a + 1
        for i in seen:
            prompts[i] += 1
    out = []
    for i, first in enumerate(edges):
        if not found[i]:
            continue
        end = edges[i + 1] if i + 1 < len(edges) else None
        out.append(dict(label=f"{first}-{end if end is not None else ''}", prompts=prompts[i],
                        new_tokens=tokens[i], first_position=first, end_position=end, **counts_of(found[i], slots)))
    return out


def category_slices(categories: list[str | None], steps: list[list[int]], new_tokens: list[int],
                    equal: list[bool] | None, slots: int) -> list[dict[str, Any]]:
    """The figures of each category's prompts (in the order categories first appear; prompts without one are
    left out), outputs equal counted where the run compared them (`equal`, greedy)."""
    names = list(dict.fromkeys(c for c in categories if c is not None))
    out = []
    for name in names:
        idx = [i for i, c in enumerate(categories) if c == name and i < len(steps)]
        out.append(dict(label=name, category=name, prompts=len(idx), new_tokens=sum(new_tokens[i] for i in idx),
                        outputs_equal=sum(equal[i] for i in idx) if equal is not None else None,
                        **counts_of([a for i in idx for a in steps[i]], slots)))
    return out


def half_tau_length(short_tau: float, slices: list) -> int | None:
    """The first context length whose tau is below half `short_tau`, else None."""
    return next((s.context_tokens for s in sorted(slices, key=lambda s: s.context_tokens or 0)
                 if s.acceptance_length < short_tau / 2), None)


def context_check(name: str, short_tau: float, slices: list, half: int | None, wrong: list[str] | None = None
                  ) -> Check:
    """The check of a context curve: fails on an output that is not the target's (`wrong`: where), warns where tau
    falls below half `short_tau` (from `half` tokens), passes otherwise."""
    curve = ", ".join(f"{s.acceptance_length:.2f} at {s.context_tokens}" for s in slices)
    message = f"tau {curve} (short prompts {short_tau:.2f})"
    if wrong:
        return make_check(name, False, f"the speculative output is not the target's greedy output at "
                          f"{'; '.join(wrong[:3])}; {message}", value=curve, level="end_to_end")
    if half is not None:
        return make_check(name, False, f"{message}: below half the short-context tau from {half} tokens",
                          value=half, threshold=round(short_tau / 2, 4), level="end_to_end", bad="warn")
    return make_check(name, True, message + ": at or above half the short-context tau at every length",
                      level="end_to_end")


# ----------------------------------------------------------------------------- rendering

def _top(a) -> float:
    return float(len(a.per_position_rates) + 1)  # tau's ceiling: every proposal and the bonus token


def context_lines(a, past: int | None = None) -> list[str]:
    """tau against context length as terminal lines (empty without --context-lengths); `past`: the positions
    the draft was trained for, when a length exceeds them."""
    if not a.per_context_length:
        return []
    s = a.per_context_length
    lines = [f"tau against context length (short prompts: {a.acceptance_length:.2f}; text: {a.context_source}):",
             *text_curve([x.label for x in s], [x.acceptance_length for x in s], _top(a), reference=a.acceptance_length)]
    equal = [f"{x.outputs_equal}/{x.prompts}" for x in s if x.outputs_equal is not None]
    if equal:
        lines.append("  outputs equal to the target's greedy output: " + ", ".join(
            f"{x.label} {x.outputs_equal}/{x.prompts}" for x in s if x.outputs_equal is not None))
    lines.append(half_sentence(a))
    if past is not None:
        lines.append(past_sentence(a, past))
    return lines


def half_sentence(a) -> str:
    if a.context_half_tau_length is None:
        return (f"  tau stays at or above half its short-context value ({a.acceptance_length / 2:.2f}) at every "
                "length measured")
    return (f"  tau falls below half its short-context value ({a.acceptance_length / 2:.2f}) at "
            f"{a.context_half_tau_length} tokens")


def past_sentence(a, trained: int) -> str:
    """What the measured curve shows past the draft's trained positions."""
    beyond = [x for x in a.per_context_length if (x.context_tokens or 0) > trained]
    if not beyond:
        return f"  no length measured past the draft's trained positions ({trained})"
    return (f"  past the draft's trained positions ({trained}): tau " + ", ".join(
        f"{x.acceptance_length:.2f} at {x.context_tokens}" for x in beyond) + f" (short prompts {a.acceptance_length:.2f})")


def k_context_runs(report) -> list:
    """A K sweep's runs (report.SpeculativeTokensRun) that measured --context-lengths; empty unless two or more."""
    runs = [r for r in report.per_num_speculative_tokens if r.per_context_length]
    return runs if len(runs) > 1 else []


def _k_grid(runs: list) -> tuple[list[str], list[list[float | None]]]:
    """(the lengths' labels, per K its tau at each, None where that K did not measure it)."""
    labels = list(dict.fromkeys(x.label for r in runs for x in r.per_context_length))
    taus = [[{x.label: x.acceptance_length for x in r.per_context_length}.get(label) for label in labels]
            for r in runs]
    return labels, taus


def k_half_sentence(runs: list) -> str:
    return "tau falls below half its short-context value: " + "; ".join(
        f"K={r.num_speculative_tokens} at " + (f"{r.context_half_tau_length} tokens" if r.context_half_tau_length
                                               is not None else "none of the lengths") for r in runs)


def k_context_lines(report) -> list[str]:
    """A K sweep's tau against context length, one column per K, and where each K falls below half its own
    short-context tau (empty without a sweep that measured --context-lengths)."""
    runs = k_context_runs(report)
    if not runs:
        return []
    labels, taus = _k_grid(runs)
    span = max(map(len, [*labels, "context"]))
    lines = ["tau against context length per K (short prompts: " + ", ".join(
        f"K={r.num_speculative_tokens} {r.acceptance_length:.2f}" for r in runs) + "):",
             f"  {'context':<{span}}" + "".join(f" {'K=' + str(r.num_speculative_tokens):>7}" for r in runs)]
    lines += [f"  {label:<{span}}" + "".join(f" {'n/a' if t[i] is None else f'{t[i]:.2f}':>7}" for t in taus)
              for i, label in enumerate(labels)]
    return lines + ["  " + k_half_sentence(runs)]


def output_lines(a) -> list[str]:
    """tau against generated position (empty when every step fell in the first bucket)."""
    b = a.per_output_bucket
    if len(b) < 2:
        return []
    return ["tau against output position (verify steps by the generated position they began at):",
            *text_curve([x.label for x in b], [x.acceptance_length for x in b], _top(a), reference=b[0].acceptance_length)]


def category_lines(a, minimums: dict[str, float] | None = None) -> list[str]:
    """tau per prompt category, each against its --min-acceptance-length CATEGORY=X where given."""
    if not a.per_category:
        return []
    minimums = minimums or {}
    lines = ["tau per prompt category:"]
    span = max(len(c.label) for c in a.per_category)
    for c in a.per_category:
        need = minimums.get(c.category)
        lines.append(f"  {c.label:<{span}}  tau {c.acceptance_length:5.2f} over {c.prompts} prompts ({c.num_drafts} "
                     f"steps)" + (f", outputs equal {c.outputs_equal}/{c.prompts}" if c.outputs_equal is not None
                                  else "") + (f"  min {need:g} {'ok' if c.acceptance_length >= need else 'LOW'}"
                                              if need is not None else ""))
    return lines


def mode_slice(label: str, report) -> dict[str, Any] | None:
    """A --compare-thinking run's figures as one slice (fields of report.SliceAcceptance): its end-to-end
    acceptance, else its endpoint's; None when it measured neither."""
    a, e = report.acceptance, report.endpoint
    if a is not None:
        hist = [sum(h) for h in zip(*(p.accepted_histogram for p in a.per_prompt))] if a.per_prompt else []
        return dict(label=label, prompts=a.prompts, new_tokens=a.new_tokens, num_drafts=a.num_drafts,
                    accepted=a.accepted, acceptance_length=a.acceptance_length,
                    per_position_rates=a.per_position_rates, outputs_equal=a.outputs_equal, accepted_histogram=hist)
    if e is not None:
        c = e.counts
        return dict(label=label, prompts=e.prompts, new_tokens=e.new_tokens, num_drafts=c.num_drafts,
                    accepted=c.accepted, acceptance_length=c.acceptance_length,
                    per_position_rates=c.per_position_rates, accepted_histogram=list(e.accepted_histogram or []))
    return None


def thinking_lines(report) -> list[str]:
    modes = report.per_thinking_mode
    if not modes:
        return []
    return ["tau per thinking mode (--compare-thinking): " + " | ".join(
        f"{m.label} {m.acceptance_length:.2f}" + (f" (outputs equal {m.outputs_equal}/{m.prompts})"
                                                  if m.outputs_equal is not None else "") for m in modes)]


def trained_positions(report) -> int | None:
    """The positions the draft was trained for, as the static level read them (its `trained_context` check)."""
    check = next((c for c in report.checks if c.name == "trained_context"), None)
    value = check.value if check is not None else None
    return value.get("draft") if isinstance(value, dict) else None


def breakdown_lines(report) -> list[str]:
    """The terminal lines of the breakdowns of `report`'s end-to-end run."""
    a = report.acceptance
    minimums = (report.options or {}).get("min_category_acceptance_length")
    return thinking_lines(report) + ([] if a is None else (category_lines(a, minimums) + context_lines(
        a, trained_positions(report)) + k_context_lines(report) + output_lines(a))) + engine_lines(report)


def engine_pairs(report) -> list[tuple[str, list, list]]:
    """(what, the engine's slices, the runtime's) for each breakdown the real engine's run has (--engine vllm)."""
    e, a = report.engine_run, report.acceptance
    if e is None or a is None:
        return []
    pairs = [("context length", e.per_context_length, a.vllm_context_counting or a.per_context_length),
             ("prompt category", e.per_category, a.per_category),
             ("output position", e.per_output_bucket, a.per_output_bucket)]
    return [(what, mine, ours) for what, mine, ours in pairs if mine and (what != "output position" or len(mine) > 1)]


def engine_lines(report) -> list[str]:
    """The real engine's own per-request counts per context length, category and output bucket, beside the
    runtime's (per context length: the runtime's counted as vLLM counts, what they are compared with)."""
    lines = []
    for what, mine, ours in engine_pairs(report):
        by_label = {x.label: x for x in ours}
        lines.append(f"{report.engine_run.engine} {report.engine_run.version}'s tau per {what} (runtime beside): "
                     + ", ".join(f"{x.label} {x.acceptance_length:.2f}" + (
                         f" ({by_label[x.label].acceptance_length:.2f})" if x.label in by_label else "")
                                 for x in mine))
    return lines


def _table(rows: list, head: str) -> list[str]:
    lines = [f"| {head} | prompts | steps | tau | outputs equal | per position |", "|---|---|---|---|---|---|"]
    lines += [f"| {markdown_cell(x.label)} | {x.prompts} | {x.num_drafts} | {x.acceptance_length:.2f} | "
              f"{'n/a' if x.outputs_equal is None else f'{x.outputs_equal}/{x.prompts}'} | "
              f"{' '.join(f'{r:.2f}' for r in x.per_position_rates)} |" for x in rows]
    return lines + [""]


def breakdown_markdown(report, image: str | None = None, outputs_image: str | None = None) -> list[str]:
    """The context-length and output-position sections of the Markdown report; `image`, `outputs_image`: their
    curves' SVG files (else unicode bars)."""
    a = report.acceptance
    lines: list[str] = []
    if report.per_thinking_mode:
        lines += ["### tau per thinking mode", ""] + _table(report.per_thinking_mode, "mode")
    if a is None:
        return lines + _context_markdown(report, image)
    if a.per_category:
        lines += ["### tau per prompt category", ""] + _table(a.per_category, "category")
    lines += _context_markdown(report, image)
    if len(a.per_output_bucket) > 1:
        lines += ["### tau against output position", ""]
        lines += [f"![tau against output position]({outputs_image})", ""] if outputs_image else [
            "```text", *output_lines(a)[1:], "```", ""]
        lines += _table(a.per_output_bucket, "generated positions")
    for what, mine, ours in engine_pairs(report):
        lines += [f"### {report.engine_run.engine} {report.engine_run.version}: tau per {what}", "",
                  "The engine's own per-request counts; the runtime's tau beside"
                  + (" (counted as vLLM counts: full last blocks)" if what == "context length" and
                     a.vllm_context_counting else "") + ".", ""]
        by_label = {x.label: x for x in ours}
        lines += [f"| {what} | prompts | steps | tau | runtime tau | per position |", "|---|---|---|---|---|---|"]
        lines += [f"| {markdown_cell(x.label)} | {x.prompts} | {x.num_drafts} | {x.acceptance_length:.2f} | "
                  f"{f'{by_label[x.label].acceptance_length:.2f}' if x.label in by_label else 'n/a'} | "
                  f"{' '.join(f'{r:.2f}' for r in x.per_position_rates)} |" for x in mine] + [""]
    return lines


def k_context_markdown(report) -> list[str]:
    """A K sweep's tau per context length as a Markdown table, a column per K (empty without one)."""
    runs = k_context_runs(report)
    if not runs:
        return []
    labels, taus = _k_grid(runs)
    lines = ["Per K (the figures above are the first K's):", "",
             "| context | " + " | ".join(f"K={r.num_speculative_tokens} (short {r.acceptance_length:.2f})"
                                        for r in runs) + " |", "|---|" + "---|" * len(runs)]
    lines += [f"| {markdown_cell(label)} | " + " | ".join("n/a" if t[i] is None else f"{t[i]:.2f}" for t in taus) + " |"
              for i, label in enumerate(labels)]
    return lines + ["", k_half_sentence(runs) + ".", ""]


def curve_of(report):
    """The figures whose context curve the report draws: the end-to-end run's, else the endpoint's (--endpoint
    alone); None when neither measured --context-lengths."""
    for a in (report.acceptance, getattr(report, "endpoint", None)):
        if a is not None and a.per_context_length:
            return a
    return None


def _context_markdown(report, image: str | None) -> list[str]:
    """The context-length section of the Markdown report (the curve of curve_of)."""
    a = curve_of(report)
    if a is None:
        return []
    trained = trained_positions(report)
    at = f" at {markdown_cell(a.url)}" if a is not report.acceptance else ""
    lines = [f"### tau against context length{at}", "", f"Long prompts cut from {markdown_cell(a.context_source)}.", ""]
    lines += [f"![tau against context length]({image})", ""] if image else [
        "```text", *map(printable, context_lines(a)[1:-1]), "```", ""]
    lines += _table(a.per_context_length, "context")
    lines += [half_sentence(a).strip() + "."] + ([past_sentence(a, trained).strip() + "."] if trained else [])
    return lines + [""] + (k_context_markdown(report) if a is report.acceptance else [])


def context_svg(report) -> str | None:
    """The tau-against-context-length curve as SVG (None without --context-lengths); the first length past
    the draft's trained positions marked. A K sweep: one series per K (chart.svg_series_chart)."""
    a, trained = curve_of(report), trained_positions(report)
    if a is None:
        return None
    runs = k_context_runs(report)
    if runs:
        labels, taus = _k_grid(runs)
        tokens = {x.label: x.context_tokens or 0 for r in runs for x in r.per_context_length}
        past = next((x for x in labels if trained is not None and tokens[x] > trained), None)
        return svg_series_chart(
            [(f"K={r.num_speculative_tokens} (short {r.acceptance_length:.2f})", [t or 0.0 for t in tau])
             for r, tau in zip(runs, taus)], labels=labels,
            top_value=max(len(r.per_position_rates) + 1 for r in runs),
            title="tau against context length per K; " + k_half_sentence(runs),
            axis="context length (prompt tokens); bar: tau, tokens per verify step"
            + (f"; past the draft's trained positions ({trained}) from {past}" if past else ""))
    s = a.per_context_length
    marked = next((x.label for x in s if trained is not None and (x.context_tokens or 0) > trained), None)
    return svg_curve([x.label for x in s], [x.acceptance_length for x in s], _top(a),
                     title=f"tau against context length (short prompts {a.acceptance_length:.2f})",
                     axis="context length (prompt tokens); bar: tau, tokens per verify step",
                     reference=a.acceptance_length, marked=marked)


def output_svg(report) -> str | None:
    """tau against generated position as SVG (None when every step fell in the first bucket)."""
    a = report.acceptance
    if a is None or len(a.per_output_bucket) < 2:
        return None
    b = a.per_output_bucket
    return svg_curve([x.label for x in b], [x.acceptance_length for x in b], _top(a),
                     title=f"tau against output position (first {b[0].end_position} tokens: {b[0].acceptance_length:.2f})",
                     axis="generated positions a verify step began at; bar: tau", reference=b[0].acceptance_length)
