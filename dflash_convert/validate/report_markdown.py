"""The validation report in Markdown (`--report-md`, a GitHub step summary, a PR comment), and the acceptance
chart written beside it as SVG."""

from __future__ import annotations

from dflash_convert.chart import bar, svg_chart, svg_series_chart, text_chart
from dflash_convert.predict.prediction import markdown_lines as prediction_markdown
from dflash_convert.predict.prediction import speedup_text
from dflash_convert.validate.report import (UNRELIABLE_TIMING, AcceptanceStats, BaselineComparison, EngineStats,
                                            ValidationReport, ValidationSummary, counting_rows, engine_line,
                                            headline_k, headline_recommendation, sampling_line, served_version,
                                            short, speedup_at, tau_text,
                                            verdict_text, verdict_word)
from dflash_convert.validate.report_terminal import endpoint_lines  # the endpoint's lines, in a text block
from dflash_convert.user_text import markdown_cell, markdown_code, printable


def acceptance_svg(report: ValidationReport | ValidationSummary) -> str | None:
    """The acceptance chart as SVG (None without end-to-end figures); an --endpoint run alone: the endpoint's."""
    a = report.acceptance
    e = getattr(report, "endpoint", None)
    if a is None and e is not None:
        return svg_chart(e.counts.per_position_rates, report.thresholds().get("min_position_rates"),
                         title=f"acceptance per draft position at {e.url}: tau {e.counts.acceptance_length:.2f}")
    if a is None:
        return None
    t = report.thresholds() if isinstance(report, ValidationReport) else report.thresholds
    b = getattr(report, "baseline", None)
    if b is not None:
        return svg_chart(b.rates, t.get("min_position_rates"), baseline=b.baseline_rates,
                         title=f"{verdict_word(report)}: tau {b.tau:.2f} (baseline {b.baseline_tau:.2f}); acceptance "
                         "per draft position")
    best = headline_k(report)
    if best is not None:  # a K sweep: one chart, a series per K
        speculate = getattr(headline_recommendation(report), "speculate", True)
        return svg_series_chart(  # no K marked recommended where the advice is not to speculate
            [(f"K={r.num_speculative_tokens}: tau {r.acceptance_length:.2f}", r.per_position_rates)
             for r in report.per_num_speculative_tokens], minimums=t.get("min_position_rates"),
            highlight=f"K={best.num_speculative_tokens}: tau {best.acceptance_length:.2f}" if speculate else None,
            title=f"{verdict_word(report)}: "
            + ("recommended" if speculate else
               "no speculation (no K reaches 1.0x on the measured machine); best")
            + f" K={best.num_speculative_tokens}, tau "
            f"{best.acceptance_length:.2f}, speedup {best.measured_speedup:.2f}x; acceptance per draft position per K")
    tau_min = t.get("min_acceptance_length")
    speedup = next((c for c in report.checks if c.name == "speedup"), None)
    unreliable = speedup is not None and UNRELIABLE_TIMING in speedup.message
    return svg_chart(a.per_position_rates, t.get("min_position_rates"), tau_minimum=tau_min,
                     title=f"{verdict_word(report)}: tau {a.acceptance_length:.2f}"
                     + (f" (min {tau_min:g})" if tau_min is not None else "") + f", speedup {a.speedup:.2f}x"
                     + (" (unreliable: a busy machine)" if unreliable else "") + "; acceptance per draft position")


def to_markdown(report: ValidationReport, image: str | None = None, curve: str | None = None,
                outputs_curve: str | None = None) -> str:
    """A Markdown report (a GitHub step summary, a PR comment): verdict, figures, the chart (`image`, a
    path to the SVG beside the file, else the unicode bars; `curve`, `outputs_curve`: tau against context length's
    and output position's), the failed
    and warned checks, per-prompt table."""
    verdict = verdict_word(report)
    target = f" against {markdown_code(report.target)}" if report.target else ""
    lines = [f"## dflash-convert validate: {verdict}", "",
             f"{markdown_code(report.checkpoint or report.endpoint.url)}{target}, levels run: "
             f"{', '.join(report.levels_run) or 'none'} "
             f"({report.created_at})", "", f"**{verdict}** {_cell(verdict_text(report))}", ""]  # and why levels did not
    a = report.acceptance
    if a is not None and headline_k(report) is not None:
        lines += [f"A K sweep: the figures below are the first K's (K="
                  f"{report.per_num_speculative_tokens[0].num_speculative_tokens}); the chart shows every K, and the "
                  "table after them every K's figures and the one recommended.", ""]
    if a is not None:
        t = report.thresholds()
        lines += ["", "| tau (tokens per step) | speedup | outputs equal | prompts | block | max new tokens |",
                  "|---|---|---|---|---|---|",
                  f"| {a.acceptance_length:.2f}" + (f" (min {t['min_acceptance_length']})"
                                                    if "min_acceptance_length" in t else "")
                  + f" | {a.speedup:.2f}x" + (f" (min {t['min_speedup']})" if "min_speedup" in t else "")
                  + f" | {'n/a (sampling)' if a.outputs_equal is None else f'{a.outputs_equal}/{a.prompts}'}"
                  f" | {a.prompts} | {a.block_size} | {a.max_new_tokens} |", ""]
        if a.sampling is not None:
            lines += [_cell(sampling_line(a.sampling)), ""]
        if image:
            lines += [f"![acceptance per draft position]({image})", ""]
        b = report.baseline
        lines += ["Acceptance per draft position" + (" (`was`: the baseline's)" if b else "") + ":", "", "```text",
                  *text_chart(b.rates if b else a.per_position_rates, t.get("min_position_rates"),
                              baseline=b.baseline_rates if b else None), "```", ""]
        if b is not None:
            lines += baseline_markdown(b)
        if a.vllm_counting is not None or report.engine_run is not None:
            lines += counting_markdown(a, report.engine_run)
    from dflash_convert.validate.breakdown import breakdown_markdown  # context length, output position, ...

    lines += breakdown_markdown(report, curve, outputs_curve)
    if report.endpoint is not None:
        lines += ["```text", *map(printable, endpoint_lines(report)), "```", ""]
    lines += per_k_markdown(report)
    if report.prediction is not None:
        lines += ["### Predicted on a GPU", "", *prediction_markdown(report.prediction), ""]
    notable = [c for c in report.checks if c.status in ("fail", "warn")]
    if notable:
        lines += ["| check | level | status | message |", "|---|---|---|---|"]
        lines += [f"| {_cell(c.name)} | {c.level} | {c.status} | {_cell(c.message)} |" for c in notable]
        lines.append("")
    if a is not None and a.per_request_histogram:
        lines += histogram_markdown(a)
    if a is not None and a.per_prompt:
        lines += ["<details><summary>Per prompt</summary>", "",
                  "| prompt | prompt tokens | new tokens | steps | tau | output equal | steps by drafts accepted |",
                  "|---|---|---|---|---|---|---|"]
        lines += [f"| {_cell(p.prompt)} | {p.prompt_tokens} | {p.new_tokens} | {p.steps} | {p.acceptance_length:.2f} | "
                  f"{'n/a' if p.output_equal is None else 'yes' if p.output_equal else 'no'} | "
                  f"{' '.join(map(str, p.accepted_histogram))} |" for p in a.per_prompt]
        lines += ["", "</details>", ""]
    return "\n".join(lines)


def per_k_markdown(report: ValidationReport) -> list[str]:
    """The runs per num_speculative_tokens as a Markdown table, the expected speedup per K as bars (one chart
    per concurrency measured) and the recommendation with the device its costs are from."""
    rows = report.per_num_speculative_tokens
    if len(rows) < 2:
        return []
    served = served_version(rows)
    lines = ["| num_speculative_tokens | block | tau | "
             + ("tau as vLLM counts | " + served + " tau | " if served else "")
             + "draft step | verify step | target step | expected speedup | measured speedup |",
             "|---|---|---|" + ("---|---|" if served else "") + "---|---|---|---|---|"]
    lines += [f"| {r.num_speculative_tokens} | {r.block_size} | {r.acceptance_length:.2f} | "
              + (f"{tau_text(r.vllm_counting)} | {tau_text(r.engine_run and r.engine_run.counts)} | " if served else "")
              + f"{r.draft_step_s * 1e3:.3f} ms | {r.verify_step_s * 1e3:.3f} ms | {r.target_step_s * 1e3:.3f} ms | "
              f"{r.expected_speedup:.2f}x [{r.expected_speedup_range[0]:.2f}-{r.expected_speedup_range[1]:.2f}] | "
              f"{r.measured_speedup:.2f}x |" for r in rows]
    for rec in report.recommendation:
        at = [(r.num_speculative_tokens, speedup_at(r, rec.concurrency)) for r in rows]
        at = [(k, x) for k, x in at if x is not None]
        top = max((x for _, x in at), default=0.0) or 1.0
        batched = "" if rec.concurrency == 1 else (
            f"; the target's steps timed at batch {rec.concurrency}, the draft's as {rec.concurrency} single-sequence "
            "steps, an upper bound")
        lines += ["", f"Expected speedup per K at concurrency {rec.concurrency} (costs from {rec.device}; they do "
                  f"not transfer to another device{batched}):", "", "```text"]
        lines += [f"K={k:<3} {bar(x / top, 40)} {x:.2f}x" for k, x in at]
        lines += ["```", "", f"Recommended at concurrency {rec.concurrency}: **{rec.advice()}** ({speedup_text(rec.expected_speedup)}x, rounds "
                  f"{rec.expected_speedup_range[0]:.2f}-{rec.expected_speedup_range[1]:.2f}x"
                  + (f"; runner-up {rec.runner_up} at {rec.runner_up_speedup:.2f}x" if rec.runner_up else "")
                  + ("" if rec.clear else ", within the rounds' spread") + ")."]
    return lines + [""]


def histogram_markdown(a: AcceptanceStats) -> list[str]:
    """Prompts per tau band as a Markdown table with bars."""
    most = max(a.per_request_histogram) or 1
    last = len(a.per_request_histogram) - 1
    lines = ["Per-request acceptance (prompts per tau band):", "", "| tau | prompts | |", "|---|---|---|"]
    cells = [bar(n / most, 20).rstrip() for n in a.per_request_histogram]
    lines += [f"| {i + 1}-{i + 2}{'' if i == last else ' (excl.)'} | {n} | {f'`{cell}`' if cell else ''} |"
              for i, (n, cell) in enumerate(zip(a.per_request_histogram, cells))]
    return lines + [""]


def baseline_markdown(b: BaselineComparison) -> list[str]:
    """The comparison with the baseline report as a Markdown table: both runs' figures, the allowed drops."""
    verdict = "REGRESSED" if b.regressed else "no regression"
    lines = [f"Against the baseline {markdown_code(b.path)} ({b.created_at}, dflash-convert {b.tool_version}): **{verdict}**", "",
             f"This run: {b.counted}, {b.num_drafts} draft steps; baseline: {b.baseline_counted}, "
             f"{b.baseline_num_drafts} draft steps. Rule: {_cell(b.rule)}.", "",
             "| figure | baseline | this run | drop | allowed drop |", "|---|---|---|---|---|",
             f"| tau | {b.baseline_tau:.3f} | {b.tau:.3f} | {b.baseline_tau - b.tau:+.3f} | "
             f"{b.tau_allowed_drop:.3f} |"]
    lines += [f"| position {k + 1} | {x:.3f} | {y:.3f} | {x - y:+.3f} | {d:.3f} |"
              for k, (x, y, d) in enumerate(zip(b.baseline_rates, b.rates, b.rates_allowed_drop))]
    return lines + [""]


_cell = markdown_cell  # every cell and sentence of user-derived or message text


def counting_markdown(a: AcceptanceStats, engine: EngineStats | None) -> list[str]:
    """The side-by-side table in Markdown, after a line on the engine run (when one ran)."""
    lines = ([f"Served in real {engine.engine} {engine.version} (run by {engine.python}): "
              f"{_cell(engine_line(engine))}.", ""] if engine is not None else [])
    lines += ["Acceptance, side by side:", "", "| counted | drafts | accepted | tau | per-position rates |",
              "|---|---|---|---|---|"]
    lines += [f"| {name} | {drafts} | {accepted} | {tau:.3f} | {short(rates, 200)} |"
              for name, drafts, accepted, tau, rates in counting_rows(a, engine)]
    return lines + [""]
