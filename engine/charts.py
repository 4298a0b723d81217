"""Self-contained SVG/HTML charts: bars with confidence intervals, heatmaps, lines.

Plain strings, no JavaScript and no network, so the same chart renders in the app, in an
exported HTML report opened offline, and in a printed page; its numbers are in the DOM (a
browser test can read them). No gradio here: the Runs export uses these too.
"""
from __future__ import annotations

import html
import math
from typing import Sequence

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac"]


def _esc(text) -> str:
    return html.escape(str(text), quote=True)


def _fmt(value: float, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "n/a"
    return f"{value:.{digits}f}"


def bar_chart(labels: Sequence[str], values: Sequence[float], *, title: str = "",
              counts: Sequence[int] | None = None, ci: Sequence[tuple[float, float]] | None = None,
              reference: Sequence[float] | None = None, highlight: Sequence[bool] | None = None,
              vmax: float | None = None, value_digits: int = 2, width: int = 420,
              bar_height: int = 22, chart_id: str = "") -> str:
    """Horizontal bars, one per label, with the value (and count) written next to each bar,
    optional CI whiskers and a dashed reference tick (e.g. the target share)."""
    n = len(labels)
    label_w, pad, top = 120, 8, 26 if title else 6
    plot_w = width - label_w - 110
    vmax = vmax or max([*(v for v in values if v == v), *(hi for _, hi in (ci or [])), *(reference or []), 1e-9])
    height = top + n * (bar_height + pad) + 4
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" role="img" class="gl-bar-chart" data-chart="{_esc(chart_id or title)}">']
    if title:
        out.append(f'<text x="4" y="16" font-size="13" font-weight="bold">{_esc(title)}</text>')
    for i, (label, value) in enumerate(zip(labels, values)):
        y = top + i * (bar_height + pad)
        value = 0.0 if value != value else value
        w = max(0.0, plot_w * value / vmax)
        color = PALETTE[i % len(PALETTE)]
        stroke = ' stroke="#222" stroke-width="2"' if highlight and highlight[i] else ""
        text = _fmt(value, value_digits) + (f" (n={counts[i]})" if counts is not None else "")
        out.append(f'<text x="{label_w - 6}" y="{y + bar_height * 0.7:.1f}" font-size="12" '
                   f'text-anchor="end">{_esc(label)}</text>')
        out.append(f'<rect x="{label_w}" y="{y}" width="{w:.1f}" height="{bar_height}" fill="{color}"{stroke}>'
                   f'<title>{_esc(label)}: {_esc(text)}</title></rect>')
        if ci is not None:
            lo, hi = ci[i]
            if lo == lo and hi == hi:
                x1, x2 = label_w + plot_w * lo / vmax, label_w + plot_w * hi / vmax
                ym = y + bar_height / 2
                out.append(f'<g stroke="#222" stroke-width="1.5"><line x1="{x1:.1f}" y1="{ym}" x2="{x2:.1f}" y2="{ym}"/>'
                           f'<line x1="{x1:.1f}" y1="{ym - 5}" x2="{x1:.1f}" y2="{ym + 5}"/>'
                           f'<line x1="{x2:.1f}" y1="{ym - 5}" x2="{x2:.1f}" y2="{ym + 5}"/></g>')
        if reference is not None and i < len(reference) and reference[i] is not None:
            xr = label_w + plot_w * reference[i] / vmax
            out.append(f'<line x1="{xr:.1f}" y1="{y - 2}" x2="{xr:.1f}" y2="{y + bar_height + 2}" '
                       f'stroke="#c00" stroke-dasharray="3,2" stroke-width="1.5"><title>target '
                       f'{_fmt(reference[i], value_digits)}</title></line>')
        out.append(f'<text x="{label_w + plot_w + 6}" y="{y + bar_height * 0.7:.1f}" font-size="12" '
                   f'class="gl-value">{_esc(text)}</text>')
    out.append("</svg>")
    return "".join(out)


def _diverging_color(value: float, vmax: float) -> str:
    """White at 0, blue for positive, red for negative."""
    if value != value:
        return "#eeeeee"
    t = max(-1.0, min(1.0, value / (vmax or 1.0)))
    if t >= 0:
        r, g, b = int(255 - 180 * t), int(255 - 120 * t), 255
    else:
        r, g, b = 255, int(255 + 150 * t), int(255 + 150 * t)
    return f"#{r:02x}{g:02x}{b:02x}"


def _sequential_color(value: float, vmin: float, vmax: float) -> str:
    if value != value:
        return "#eeeeee"
    t = (value - vmin) / ((vmax - vmin) or 1.0)
    t = max(0.0, min(1.0, t))
    r, g, b = int(247 - 200 * t), int(251 - 150 * t), int(255 - 60 * t)
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(matrix: Sequence[Sequence[float]], row_labels: Sequence[str], col_labels: Sequence[str], *,
            title: str = "", diverging: bool = True, digits: int = 2,
            hover: Sequence[Sequence[str]] | None = None, faded: Sequence[Sequence[bool]] | None = None,
            row_title: str = "", col_title: str = "", table_id: str = "") -> str:
    """An HTML table heatmap with the value in every cell and hover text (title attribute)."""
    values = [v for row in matrix for v in row if v == v]
    vmax = max([abs(v) for v in values] or [1.0])
    vmin = min(values or [0.0])
    head = "".join(f'<th style="writing-mode:vertical-rl;transform:rotate(180deg);padding:2px">{_esc(c)}</th>'
                   for c in col_labels)
    rows = []
    for i, (label, row) in enumerate(zip(row_labels, matrix)):
        cells = []
        for j, value in enumerate(row):
            color = _diverging_color(value, vmax) if diverging else _sequential_color(value, vmin, vmax)
            tip = hover[i][j] if hover else f"{label} / {col_labels[j]}: {_fmt(value, digits)}"
            cls = ' class="gl-faded"' if faded and faded[i][j] else ""
            cells.append(f'<td{cls} title="{_esc(tip)}" style="background:{color};text-align:center;'
                         f'padding:3px 5px;font-size:12px;min-width:34px">{_fmt(value, digits)}</td>')
        rows.append(f'<tr><th style="text-align:right;padding-right:6px;font-size:12px;font-weight:normal">'
                    f'{_esc(label)}</th>{"".join(cells)}</tr>')
    caption = f'<caption style="font-weight:bold;text-align:left">{_esc(title)}</caption>' if title else ""
    corner = f"{_esc(row_title)} \u2193 / {_esc(col_title)} \u2192" if row_title or col_title else ""
    return (f'<table class="gl-heatmap" id="{_esc(table_id)}" style="border-collapse:collapse">{caption}'
            f'<thead><tr><th style="font-size:11px;font-weight:normal">{corner}</th>{head}</tr></thead>'
            f'<tbody>{"".join(rows)}</tbody></table>')


def value_range(values: Sequence[float], min_span: float = 0.0) -> tuple[float, float]:
    """Returns the (low, high) of a value axis: the data's range, widened around its middle to
    at least `min_span` so that a change of 0.001 does not fill a chart of scores that vary by
    tenths (and to 1 when every value is equal and no span is given)."""
    lo, hi = min(values), max(values)
    span = max(hi - lo, min_span)
    if span < 1e-9:
        span = 1.0
    middle = (lo + hi) / 2
    return middle - span / 2, middle + span / 2


def line_chart(series: dict[str, Sequence[float]], *, title: str = "", x_label: str = "iteration",
               width: int = 420, height: int = 220, chart_id: str = "", min_span: float = 0.0) -> str:
    """Lines over x = 0, 1, 2, ... with dots and values on hover; the y axis spans at least
    `min_span` (value_range)."""
    pts = [v for ys in series.values() for v in ys if v == v]
    if not pts:
        return f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="40"><text x="4" y="20">{_esc(title)}: no data yet</text></svg>'
    lo, hi = value_range(pts, min_span)
    n = max(len(ys) for ys in series.values())
    left, right, top, bottom = 48, 10, 24, 30
    pw, ph = width - left - right, height - top - bottom
    sx = lambda i: left + (pw * i / max(1, n - 1))
    sy = lambda v: top + ph * (1 - (v - lo) / (hi - lo))
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
           f'height="{height}" class="gl-line-chart" data-chart="{_esc(chart_id or title)}">',
           f'<text x="4" y="15" font-size="13" font-weight="bold">{_esc(title)}</text>',
           f'<line x1="{left}" y1="{top + ph}" x2="{left + pw}" y2="{top + ph}" stroke="#999"/>',
           f'<line x1="{left}" y1="{top}" x2="{left}" y2="{top + ph}" stroke="#999"/>',
           f'<text x="{left - 4}" y="{top + 4}" font-size="10" text-anchor="end">{_fmt(hi, 3)}</text>',
           f'<text x="{left - 4}" y="{top + ph}" font-size="10" text-anchor="end">{_fmt(lo, 3)}</text>',
           f'<text x="{left + pw / 2}" y="{height - 6}" font-size="11" text-anchor="middle">{_esc(x_label)}</text>']
    for k, (name, ys) in enumerate(series.items()):
        color = PALETTE[k % len(PALETTE)]
        coords = [(sx(i), sy(v)) for i, v in enumerate(ys) if v == v]
        if len(coords) > 1:
            out.append(f'<polyline fill="none" stroke="{color}" stroke-width="2" points="'
                       + " ".join(f"{x:.1f},{y:.1f}" for x, y in coords) + '"/>')
        for i, v in enumerate(ys):
            if v == v:
                out.append(f'<circle cx="{sx(i):.1f}" cy="{sy(v):.1f}" r="3" fill="{color}">'
                           f'<title>{_esc(name)} @ {i}: {_fmt(v, 4)}</title></circle>')
        out.append(f'<text x="{left + 6 + 110 * k}" y="{top + ph + 22}" font-size="10" fill="{color}">{_esc(name)}</text>')
    out.append("</svg>")
    return "".join(out)
