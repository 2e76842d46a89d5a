"""The validation report on the console (rich): one row per check, the figures, the acceptance chart in
unicode bars, the runs per K, and the verdict line last."""

from __future__ import annotations

from dflash_convert.chart import text_chart
from dflash_convert.predict.prediction import speedup_text
from dflash_convert.predict.prediction import text_lines as prediction_text
from dflash_convert.user_text import printable
from dflash_convert.validate.options import LEVELS
from dflash_convert.validate.report import (AcceptanceStats, EngineStats, ValidationReport, cost_at, counting_rows,
                                            engine_line, sampling_line, served_version, short, tau_text,
                                            verdict_text, verdict_word)


STYLE = {"pass": "green", "fail": "bold red", "warn": "yellow", "skip": "dim"}


VERDICT_STYLE = {"PASSED": "green", "FAILED": "bold red", "INCOMPLETE": "bold yellow"}


def render_table(report: ValidationReport, console, quiet: bool = False) -> None:
    """The report on `console` (stdout): per level one row per check (status, name, what it found), the
    acceptance chart, and the verdict line. quiet: only the failed and warned checks and the verdict."""
    from rich.markup import escape
    from rich.table import Column, Table

    if not quiet:
        run = ", ".join(report.levels_run) or "none"
        console.print(printable(f"validate {report.checkpoint or report.endpoint.url} (levels run: {run})"),
                      markup=False)
    # the name column never wraps; the message wraps on words (80-column logs)
    table = Table(Column("status", no_wrap=True), Column("check", no_wrap=True), Column("message", ratio=1),
                  box=None, show_header=False, pad_edge=False)
    for level in LEVELS:
        rows = [c for c in report.checks if c.level == level and (not quiet or c.status in ("fail", "warn"))]
        if not rows:
            continue
        table.add_row("", f"[bold]{level}[/bold]", "")
        for c in rows:
            detail = c.message
            if c.status == "fail" and (c.value is not None or c.threshold is not None):
                detail += f" (value {short(c.value)}, threshold {short(c.threshold)})"
            # a check's name and message carry user text (a category): its control characters as escapes
            table.add_row(f"  [{STYLE[c.status]}]{c.status}[/]", escape(printable(c.name)), escape(printable(detail)))
    if table.rows:
        console.print(table)
    if not quiet:
        for level, why in report.levels_skipped.items():
            console.print(f"{level} skipped: {why}", markup=False)
    a = report.acceptance
    if a is not None and not quiet:
        console.print("", markup=False)
        for line in acceptance_lines(report):
            console.print(line, markup=False)
        if a.sampling is not None:
            u = a.sampling
            console.print(sampling_line(u) + (f"; prompts: {a.prompt_format}" if a.prompt_format else ""),
                          markup=False)
        for name, s in a.per_prompt_set.items():
            console.print(f"  {name}: tau {s.acceptance_length:.2f} over {s.prompts} prompts ({s.num_drafts} draft "
                          f"steps), per-position {short(s.per_position_rates, 200)}; {s.source}", markup=False)
        if a.target_attention:
            compiled = {None: "", True: ", verify step compiled",
                        False: f", not compiled: {a.target_eager_reason}"}[a.target_compiled]
            console.print(f"target attention {a.target_attention}{compiled}", markup=False)
    if not quiet:
        from dflash_convert.validate.breakdown import breakdown_lines  # context length, output position, ...

        for line in breakdown_lines(report):
            console.print(printable(line), markup=False)
    if a is not None and not quiet and (a.vllm_counting is not None or report.engine_run is not None):
        _render_counting(a, report.engine_run, console)
    if report.endpoint is not None and not quiet:
        console.print("", markup=False)
        for line in endpoint_lines(report):
            console.print(printable(line), markup=False)
    if not quiet:
        for line in per_k_lines(report):
            console.print(line, markup=False)
        if report.prediction is not None:
            for line in ["", *prediction_text(report.prediction)]:
                console.print(line, markup=False, highlight=False, soft_wrap=True)
    low = next((c for c in report.checks if c.name == "acceptance_length" and c.status == "warn"), None)
    if low is not None:  # the default mis-wiring alarm: loud, though it keeps the exit code
        console.print(f"[bold yellow]WARNING:[/bold yellow] {escape(printable(low.message))}")
    word = verdict_word(report)
    console.print(f"[{VERDICT_STYLE[word]}]{word}[/] {escape(printable(verdict_text(report)))}")


def per_k_lines(report: ValidationReport) -> list[str]:
    """The runs per num_speculative_tokens side by side (tau, rates, step costs, expected and measured speedup)
    and the recommended K per concurrency, naming the device the costs are from."""
    rows = report.per_num_speculative_tokens
    if len(rows) < 2:  # one K: its figures are the acceptance lines above (its costs are in the JSON)
        return []
    served = served_version(rows)
    gpus = gpu_columns(report)
    lines = ["", f"{'K':>3} {'block':>5} {'tau':>6} " + (f"{'as vLLM':>7} {'vLLM':>6} " if served else "")
             + f"{'draft ms':>9} {'verify ms':>9} {'target ms':>9} {'expected':>14} {'measured':>8}  "
             + "".join(f"{name[:12]:>12} " for name in gpus) + " per-position rates"]
    for r in rows:
        low, high = r.expected_speedup_range
        lines.append(f"{r.num_speculative_tokens:>3} {r.block_size:>5} {r.acceptance_length:>6.2f} "
                     + (f"{tau_text(r.vllm_counting):>7} {tau_text(r.engine_run and r.engine_run.counts):>6} "
                        if served else "")
                     + f"{r.draft_step_s * 1e3:>9.3f} {r.verify_step_s * 1e3:>9.3f} {r.target_step_s * 1e3:>9.3f} "
                     f"{r.expected_speedup:>5.2f}x [{low:.2f}-{high:.2f}] {r.measured_speedup:>7.2f}x  "
                     + "".join(f"{_predicted(x.get(r.num_speculative_tokens)):>12} " for x in gpus.values())
                     + " " + short(r.per_position_rates, 120))
    if gpus:
        p = report.prediction
        lines.append(f"ms and expected: measured on {report.environment.device} (they do not transfer to a GPU); "
                     f"{', '.join(gpus)}: the speedup predicted at concurrency {p.recommendation[0].concurrency} by "
                     f"the cost model from this tau ({p.engine}; {p.error_band.line})")
    for c in sorted({c.concurrency for r in rows for c in r.per_concurrency}):
        at = [(r.num_speculative_tokens, cost_at(r, c)) for r in rows if cost_at(r, c) is not None]
        lines.append(f"concurrency {c} (target steps timed at batch {c}; draft: {c} of its batch-1 steps, an upper "
                     "bound): " + "; ".join(
            f"K={k} verify {x.verify_step_s * 1e3:.3f} ms, target {x.target_step_s * 1e3:.3f} ms, expected "
            f"{x.expected_speedup:.2f}x [{x.expected_speedup_range[0]:.2f}-{x.expected_speedup_range[1]:.2f}]"
            for k, x in at))
    if served:
        lines.append(f"tau: the runtime's (last block shortened); as vLLM: the same runs counted as vLLM counts (full "
                     f"last blocks); vLLM: the counters of {served} serving each K (one process)")
    for rec in report.recommendation:
        low, high = rec.expected_speedup_range
        other = (f"; runner-up K={rec.runner_up} at {rec.runner_up_speedup:.2f}x"
                 + ("" if rec.clear else " (within the rounds' spread: no clear winner)")) if rec.runner_up else ""
        lines.append(f"recommended at concurrency {rec.concurrency}: {rec.advice()}"
                     f", expected {speedup_text(rec.expected_speedup)}x [{low:.2f}-{high:.2f}]{other}; costs measured on "
                     f"{rec.device}, which do not transfer to another device")
    return lines


def gpu_columns(report: ValidationReport) -> dict[str, dict[int, float]]:
    """--predict-gpu: per GPU, the predicted speedup per K at the first concurrency predicted."""
    p = report.prediction
    if p is None or not p.predictions:
        return {}
    first = p.predictions[0].concurrency
    out: dict[str, dict[int, float]] = {}
    for row in p.predictions:
        if row.concurrency == first:
            out.setdefault(row.gpu, {})[row.num_speculative_tokens] = row.speedup
    return out


def _predicted(speedup: float | None) -> str:
    return "-" if speedup is None else f"{speedup_text(speedup)}x"


def acceptance_lines(report: ValidationReport) -> list[str]:
    """tau, speedup and outputs in a few lines, then the chart of acceptance per draft position."""
    a = report.acceptance
    if a is None:
        return []
    t = report.thresholds()
    spread = f", per round {a.speedup_range[0]:.2f}-{a.speedup_range[1]:.2f}x" if a.speedup_range else ""
    threads = report.environment.threads
    tau_min = f" (min {t['min_acceptance_length']})" if "min_acceptance_length" in t else ""
    speed_min = f" (min {t['min_speedup']})" if "min_speedup" in t else ""
    outputs = (f"outputs equal to the target's greedy output on {a.outputs_equal}/{a.prompts} prompts"
               if a.outputs_equal is not None else f"sampled at temperature {a.temperature} ({a.draft_sampling} "
               "drafting)")
    return [f"tau {a.acceptance_length:.2f}{tau_min} tokens per step (block {a.block_size}, {a.prompts} prompts, "
            f"{a.new_tokens} tokens); {outputs}",
            f"speedup {a.speedup:.2f}x{speed_min} ({a.speculative_tokens_per_s:.1f} vs {a.target_tokens_per_s:.1f} "
            f"tok/s over {a.timing_rounds} interleaved round(s){spread}"
            + (f", {threads} thread(s)" if threads else "") + ")",
            "acceptance per draft position (fraction of steps whose draft token there was accepted):",
            *text_chart(a.per_position_rates, t.get("min_position_rates")),
            *([f"the draft's confidence head predicted per position: {short(a.predicted_position_rates, 200)}"]
              if a.predicted_position_rates else [])]


def endpoint_lines(report: ValidationReport) -> list[str]:
    """The live endpoint's figures: tau both ways, throughput, latency, the comparison, the chart."""
    e = report.endpoint
    c = e.counts
    sglang = f", {e.sglang_acceptance_length:.2f} in SGLang's" if e.sglang_acceptance_length is not None else ""
    server = (f"; server-reported TTFT {e.ttft_ms_mean:.1f} ms, inter-token {e.itl_ms_mean:.2f} ms"
              if e.ttft_ms_mean is not None and e.itl_ms_mean is not None else "")
    lines = [f"endpoint {e.url} ({e.engine}, model {e.model}): tau {c.acceptance_length:.2f} in vLLM's counting"
             f"{sglang}, {c.num_drafts} verify steps over {e.prompts} prompts ({e.new_tokens} tokens); from "
             f"{e.counted}",
             f"  {e.tokens_per_s:.1f} tokens/s at concurrency {e.concurrency}; request latency mean "
             f"{e.latency_s_mean:.3f} s, p50 {e.latency_s_p50:.3f} s, p90 {e.latency_s_p90:.3f} s{server}",
             "  sampling: " + ", ".join(f"{k} {v}" for k, v in e.sampling.items()) + f"; max tokens {e.max_tokens}"]
    for name, s in {**e.per_prompt_set, **{f"category {c}": v for c, v in e.per_category.items()},
                    **{f"prompt tokens {g}": v for g, v in e.per_prompt_length.items()}}.items():
        lines.append(f"  {name}: tau {s.acceptance_length:.2f} over {s.prompts} prompts ({s.num_drafts} steps)")
    if e.accepted_histogram:
        lines.append("  verify steps by draft tokens accepted (0, 1, ...): " + " ".join(map(str, e.accepted_histogram)))
    from dflash_convert.validate.breakdown import context_lines, output_lines, trained_positions

    lines += context_lines(e, trained_positions(report)) + output_lines(e)
    b = e.baseline_endpoint
    if b is not None:
        spread = f", per round {b.speedup_range[0]:.2f}-{b.speedup_range[1]:.2f}x" if b.speedup_range else ""
        equal = (f"; greedy outputs equal on {b.outputs_equal}/{b.prompts} prompts" if b.outputs_equal is not None
                 else "; sampled: outputs not compared")
        lines.append(f"  against {b.url} (no speculation): speedup {b.speedup:.2f}x ({b.tokens_per_s:.1f} vs "
                     f"{b.baseline_tokens_per_s:.1f} tokens/s over {b.rounds} interleaved rounds{spread}; latency "
                     f"{b.latency_s:.3f} vs {b.baseline_latency_s:.3f} s){equal}")
    if e.offline is not None:
        lines.append(f"  offline emulation of the engine (vLLM's counting): tau {e.offline.acceptance_length:.2f}")
    lines.append("endpoint acceptance per draft position:")
    return lines + text_chart(c.per_position_rates, report.thresholds().get("min_position_rates"))


def _render_counting(a: AcceptanceStats, engine: EngineStats | None, console) -> None:
    """Our figures both ways and the engine's own, side by side."""
    from rich.table import Table

    table = Table("counted", "drafts", "accepted", "tau", "per-position rates", title="acceptance, side by side",
                  title_justify="left")
    for name, drafts, accepted, tau, rates in counting_rows(a, engine):
        table.add_row(name, str(drafts), str(accepted), f"{tau:.3f}", short(rates, 200))
    console.print(table)
    if engine is not None:
        console.print(engine_line(engine), markup=False)
