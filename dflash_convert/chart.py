"""Acceptance per draft position as a picture: unicode bars for terminals and CI logs, and a small SVG
for Markdown (the validation report, the model card) that needs no plotting library.

Plain functions over a list of rates in [0, 1] (position k = the fraction of draft steps whose draft
token at block slot k was accepted) and optional per-position minimums; the validation report and the
model card both draw from them.
"""

from __future__ import annotations

from xml.sax.saxutils import escape

EIGHTHS = " ▏▎▍▌▋▊▉█"  # a bar's last cell to 1/8 of a character



def _svg_frame(title: str, width: int, height: int, left: int, top: int, plot_w: float, plot_h: float,
               scale: float = 1.0) -> list[str]:
    """The opening of a chart's SVG: the canvas, the title and the grid at 0, 1/4, ... 1 of `scale`, labelled."""
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="8" y="18" font-size="13">{escape(title)}</text>']
    for tick in (0, 0.25, 0.5, 0.75, 1.0):
        y = top + plot_h * (1 - tick)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="#ddd"/>')
        parts.append(f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick * scale:g}</text>')
    return parts


def _svg_close(parts: list[str], legend: list[str], left: int, bottom: float, plot_w: float) -> str:
    """A chart's legend lines centred under the plot (whose bottom edge is `bottom`), and the SVG closed."""
    for i, line in enumerate(legend):
        parts.append(f'<text x="{left + plot_w / 2:.1f}" y="{bottom + 32 + 14 * i}" text-anchor="middle">'
                     f'{escape(line)}</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"

def bar(fraction: float, width: int) -> str:
    """`fraction` (clamped to [0, 1]) of `width` cells in unicode block characters."""
    eighths = round(max(0.0, min(1.0, fraction)) * width * 8)
    full, rest = divmod(eighths, 8)
    return ("█" * full + (EIGHTHS[rest] if rest else "")).ljust(width)


def text_chart(rates: list[float], minimums: list[float] | None = None, width: int = 40,
               baseline: list[float] | None = None) -> list[str]:
    """One line per draft position: its rate as a bar (full width = every step accepted), an earlier
    run's rate as `was X` when given, and, where a minimum was asked for, `min X` with `ok` or `LOW`."""
    minimums = list(minimums or [])
    baseline = list(baseline or [])
    lines = [f"{'pos':>4}  {'rate':>4}  {'0':<{width // 2}}{'1':>{width - width // 2}}"]
    for k, rate in enumerate(rates):
        line = f"{k + 1:>4}  {rate:4.2f}  {bar(rate, width)}"
        if k < len(baseline):
            line += f"  was {baseline[k]:.2f}"
        if k < len(minimums):
            line += f"  min {minimums[k]:.2f} {'ok' if rate >= minimums[k] else 'LOW'}"
        lines.append(line.rstrip())
    return lines


BAR, LOW_BAR, MINIMUM, TAU_MINIMUM = "#4c78a8", "#d62728", "#222222", "#ff7f0e"


def svg_chart(rates: list[float], minimums: list[float] | None = None, title: str = "",
              baseline: list[float] | None = None, tau_minimum: float | None = None) -> str:
    """A bar chart of `rates` (0..1) per draft position, an earlier run's rates as grey bars beside
    them, minimums as dark ticks (a bar below its minimum red), and a tau minimum as the dashed level
    every position must reach on average (tau = 1 + the sum of the rates); about 2 KB of SVG."""
    minimums = list(minimums or [])
    baseline = list(baseline or [])
    n = max(len(rates), 1)
    tau_drawn = tau_minimum is not None and bool(rates)
    legend = ["draft position (block slot); bar: share of steps accepted"]
    legend += [", ".join(["grey: baseline"] * bool(baseline) + ["tick: minimum, red bar: below it"] * bool(minimums)
                         + ([f"dashed: the mean rate tau {tau_minimum:g} needs"] if tau_drawn else []))]
    legend = [line for line in legend if line]
    left, top, plot_h = 44, 34, 180
    # wide enough for the title (13 px) and each legend line (11 px), at about 0.6 em a character
    plot_w = max(24 * n, 380, round(7 * len(title)) - left, round(6.4 * max(map(len, legend))) - left)
    width, height = left + plot_w + 16, top + plot_h + 26 + 14 * len(legend)
    step = plot_w / n
    parts = _svg_frame(title, width, height, left, top, plot_w, plot_h)
    for k, rate in enumerate(rates):
        x = left + k * step
        h = plot_h * max(0.0, min(1.0, rate))
        if k < len(baseline):  # the earlier run left, this run right
            hb = plot_h * max(0.0, min(1.0, baseline[k]))
            parts.append(f'<rect x="{x + step * 0.1:.1f}" y="{top + plot_h - hb:.1f}" width="{step * 0.4:.1f}" '
                         f'height="{hb:.1f}" fill="#bbbbbb"><title>position {k + 1}, baseline: {baseline[k]:.3f}'
                         '</title></rect>')
        bx, bw = (x + step * 0.5, step * 0.4) if k < len(baseline) else (x + step * 0.15, step * 0.7)
        low = k < len(minimums) and rate < minimums[k]
        parts.append(f'<rect x="{bx:.1f}" y="{top + plot_h - h:.1f}" width="{bw:.1f}" height="{h:.1f}" '
                     f'fill="{LOW_BAR if low else BAR}"><title>position {k + 1}: {rate:.3f}'
                     + (f" (below its minimum {minimums[k]:g})" if low else "") + '</title></rect>')
        if k < len(minimums):
            y = top + plot_h * (1 - max(0.0, min(1.0, minimums[k])))
            parts.append(f'<line x1="{x + step * 0.05:.1f}" y1="{y:.1f}" x2="{x + step * 0.95:.1f}" y2="{y:.1f}" '
                         f'stroke="{MINIMUM}" stroke-width="2"/>')
        parts.append(f'<text x="{x + step / 2:.1f}" y="{top + plot_h + 14}" text-anchor="middle">{k + 1}</text>')
    if tau_drawn:
        level = max(0.0, min(1.0, (tau_minimum - 1) / len(rates)))
        y = top + plot_h * (1 - level)
        parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="{TAU_MINIMUM}" '
                     f'stroke-width="1.5" stroke-dasharray="6 4"><title>tau minimum {tau_minimum:g}: a mean rate of '
                     f'{level:.3f}</title></line>')
    return _svg_close(parts, legend, left, top + plot_h, plot_w)


SERIES = ("#4c78a8", "#f58518", "#54a24b", "#b279a2", "#e45756", "#72b7b2", "#9d755d", "#eeca3b")


def svg_series_chart(series: list[tuple[str, list[float]]], title: str = "", minimums: list[float] | None = None,
                     highlight: str | None = None, labels: list[str] | None = None, top_value: float = 1.0,
                     axis: str = "draft position (block slot); bar: share of steps accepted") -> str:
    """One bar chart of several runs' values per point (a K sweep: a series per K; the points are draft positions,
    the shorter runs ending where their blocks end, or the `labels` given, context lengths with tau up to
    `top_value`): per point a group of bars, one per series in its own colour, the legend naming each
    (`highlight`, the recommended one, marked); minimums as dark ticks across the group."""
    minimums = list(minimums or [])
    n = max((len(rates) for _, rates in series), default=0) or 1
    m = max(len(series), 1)
    names = [f"{name}{' (recommended)' if name == highlight else ''}" for name, _ in series]
    ticks = list(labels) if labels is not None else [str(k + 1) for k in range(n)]
    left, top, plot_h = 44, 34, 180
    legend_w = sum(6.4 * len(label) + 28 for label in names)
    tick_w = 7 * max(map(len, ticks)) * n if labels is not None else 0  # labels such as `1024 tokens`
    plot_w = max(10 * m * n, tick_w, 380, round(7 * len(title)) - left, round(legend_w) - left)
    width, height = left + plot_w + 16, top + plot_h + 26 + 28
    step = plot_w / n
    parts = _svg_frame(title, width, height, left, top, plot_w, plot_h, top_value)
    bw = step * 0.8 / m
    for s, (name, rates) in enumerate(series):
        colour = SERIES[s % len(SERIES)]
        for k, rate in enumerate(rates):
            h = plot_h * max(0.0, min(1.0, rate / top_value))
            x = left + k * step + step * 0.1 + s * bw
            parts.append(f'<rect x="{x:.1f}" y="{top + plot_h - h:.1f}" width="{bw:.1f}" height="{h:.1f}" '
                         f'fill="{colour}"><title>{escape(name)}, {"position " if labels is None else ""}'
                         f'{escape(ticks[k])}: {rate:.3f}</title></rect>')
    for k in range(n):
        x = left + k * step
        if k < len(minimums):
            y = top + plot_h * (1 - max(0.0, min(1.0, minimums[k])))
            parts.append(f'<line x1="{x + step * 0.05:.1f}" y1="{y:.1f}" x2="{x + step * 0.95:.1f}" y2="{y:.1f}" '
                         f'stroke="{MINIMUM}" stroke-width="2"/>')
        parts.append(f'<text x="{x + step / 2:.1f}" y="{top + plot_h + 14}" text-anchor="middle">'
                     f'{escape(ticks[k])}</text>')
    x, y = left, top + plot_h + 34
    for s, label in enumerate(names):
        parts.append(f'<rect x="{x:.1f}" y="{y - 9}" width="10" height="10" fill="{SERIES[s % len(SERIES)]}"/>')
        parts.append(f'<text x="{x + 14:.1f}" y="{y}">{escape(label)}</text>')
        x += 6.4 * len(label) + 28
    parts.append(f'<text x="{left + plot_w / 2:.1f}" y="{y + 14}" text-anchor="middle">{escape(axis)}'
                 + ("; tick: minimum" if minimums else "") + '</text>')
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def text_curve(labels: list[str], values: list[float], top: float, width: int = 40,
               reference: float | None = None) -> list[str]:
    """One line per point of a curve (tau at each context length or output bucket): its value as a bar (full
    width = `top`), and `< half` where it is below half the `reference` value."""
    span = max(map(len, labels), default=0)
    lines = []
    for label, v in zip(labels, values):
        line = f"{label:>{span}}  {v:5.2f}  {bar(v / top if top else 0.0, width)}"
        if reference is not None and v < reference / 2:
            line += "  < half"
        lines.append(line.rstrip())
    return lines


def svg_curve(labels: list[str], values: list[float], top: float, title: str = "", axis: str = "",
              reference: float | None = None, marked: str | None = None) -> str:
    """Bars of `values` (0..`top`) over the `labels` (context lengths, output buckets), in svg_chart's style:
    the `reference` (the short-context tau) as a dashed level and half of it dotted, a bar below half red,
    the `marked` label (past the draft's trained positions) with a dark tick under it."""
    n = max(len(values), 1)
    legend = [axis] + ([f"dashed: {reference:.2f} (short prompts), dotted: half of it, red: below half"]
                       if reference is not None else []) + ([f"tick: past the draft's trained positions "
                                                             f"({marked})"] if marked else [])
    legend = [line for line in legend if line]
    left, top_px, plot_h = 44, 34, 180
    plot_w = max(56 * n, 380, round(7 * len(title)) - left, round(6.4 * max(map(len, legend), default=0)) - left)
    width, height = left + plot_w + 16, top_px + plot_h + 26 + 14 * len(legend)
    step = plot_w / n
    scale = top or 1.0
    parts = _svg_frame(title, width, height, left, top_px, plot_w, plot_h, scale)
    for k, (label, v) in enumerate(zip(labels, values)):
        x = left + k * step
        h = plot_h * max(0.0, min(1.0, v / scale))
        low = reference is not None and v < reference / 2
        parts.append(f'<rect x="{x + step * 0.15:.1f}" y="{top_px + plot_h - h:.1f}" width="{step * 0.7:.1f}" '
                     f'height="{h:.1f}" fill="{LOW_BAR if low else BAR}"><title>{escape(label)}: {v:.3f}</title></rect>')
        parts.append(f'<text x="{x + step / 2:.1f}" y="{top_px + plot_h + 14}" text-anchor="middle">'
                     f'{escape(label)}</text>')
        if label == marked:
            parts.append(f'<line x1="{x + step * 0.1:.1f}" y1="{top_px + plot_h + 18}" x2="{x + step * 0.9:.1f}" '
                         f'y2="{top_px + plot_h + 18}" stroke="{MINIMUM}" stroke-width="2"/>')
    if reference is not None:
        for level, dash in ((reference, "6 4"), (reference / 2, "2 3")):
            y = top_px + plot_h * (1 - max(0.0, min(1.0, level / scale)))
            parts.append(f'<line x1="{left}" y1="{y:.1f}" x2="{left + plot_w}" y2="{y:.1f}" stroke="{TAU_MINIMUM}" '
                         f'stroke-width="1.5" stroke-dasharray="{dash}"/>')
    return _svg_close(parts, legend, left, top_px + plot_h, plot_w)
