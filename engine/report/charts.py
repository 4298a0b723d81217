"""Self-contained SVG/HTML charts: bars with confidence intervals, heatmaps, lines.

No JavaScript and no network, so the same chart renders in the app, in an exported HTML
report opened offline, and in a printed page; its numbers are in the DOM (a browser test can
read them). Python computes the geometry; the markup is `templates/charts.html`, where every
label is escaped and every attribute quoted.
"""
from __future__ import annotations

from typing import Sequence

from ..common.scores import is_finite
from . import Markup, fmt, macro

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac"]


def bar_chart(labels: Sequence[str], values: Sequence[float], *, title: str = "",
              counts: Sequence[int] | None = None, ci: Sequence[tuple[float, float]] | None = None,
              reference: Sequence[float] | None = None, highlight: Sequence[bool] | None = None,
              vmax: float | None = None, value_digits: int = 2, width: int = 420,
              bar_height: int = 22, chart_id: str = "") -> Markup:
    """An SVG of horizontal bars, one per label, with the value (and count) written next to
    each bar, optional CI whiskers and a dashed reference tick (e.g. the target share)."""
    n = len(labels)
    label_w, pad, top = 120, 8, 26 if title else 6
    plot_w = width - label_w - 110
    vmax = vmax or max([*(v for v in values if is_finite(v)), *(hi for _, hi in (ci or []) if is_finite(hi)),
                        *(r for r in (reference or []) if is_finite(r)), 1e-9])
    bars = []
    for i, (label, value) in enumerate(zip(labels, values)):
        y = top + i * (bar_height + pad)
        value = value if is_finite(value) else 0.0
        bar = {"label": str(label), "y": y, "text_y": round(y + bar_height * 0.7, 1),
               "w": round(max(0.0, plot_w * value / vmax), 1), "color": PALETTE[i % len(PALETTE)],
               "highlight": bool(highlight and highlight[i]),
               "text": fmt(value, value_digits) + (f" (n={counts[i]})" if counts is not None else ""),
               "ci": None, "ref": None}
        if ci is not None and is_finite(ci[i][0]) and is_finite(ci[i][1]):
            bar["ci"] = {"x1": round(label_w + plot_w * ci[i][0] / vmax, 1),
                         "x2": round(label_w + plot_w * ci[i][1] / vmax, 1), "ym": y + bar_height / 2}
        if reference is not None and i < len(reference) and is_finite(reference[i]):
            bar["ref"] = {"x": round(label_w + plot_w * reference[i] / vmax, 1),
                          "title": fmt(reference[i], value_digits)}
        bars.append(bar)
    return macro("charts.html", "bar_chart")(
        {"width": width, "height": top + n * (bar_height + pad) + 4, "id": chart_id or title, "title": title,
         "label_x": label_w - 6, "bar_x": label_w, "value_x": label_w + plot_w + 6, "bar_height": bar_height,
         "bars": bars})


def _diverging_color(value: float, vmax: float) -> str:
    """White at 0, blue for positive, red for negative."""
    if not is_finite(value):
        return "#eeeeee"
    t = max(-1.0, min(1.0, value / (vmax or 1.0)))
    if t >= 0:
        r, g, b = int(255 - 180 * t), int(255 - 120 * t), 255
    else:
        r, g, b = 255, int(255 + 150 * t), int(255 + 150 * t)
    return f"#{r:02x}{g:02x}{b:02x}"


def _sequential_color(value: float, vmin: float, vmax: float) -> str:
    if not is_finite(value):
        return "#eeeeee"
    t = max(0.0, min(1.0, (value - vmin) / ((vmax - vmin) or 1.0)))
    r, g, b = int(247 - 200 * t), int(251 - 150 * t), int(255 - 60 * t)
    return f"#{r:02x}{g:02x}{b:02x}"


def heatmap(matrix: Sequence[Sequence[float]], row_labels: Sequence[str], col_labels: Sequence[str], *,
            title: str = "", diverging: bool = True, digits: int = 2,
            hover: Sequence[Sequence[str]] | None = None, faded: Sequence[Sequence[bool]] | None = None,
            row_title: str = "", col_title: str = "", table_id: str = "") -> Markup:
    """An HTML table heatmap with the value in every cell and hover text (title attribute)."""
    values = [v for row in matrix for v in row if is_finite(v)]
    vmax = max([abs(v) for v in values] or [1.0])
    vmin = min(values or [0.0])
    rows = []
    for i, (label, row) in enumerate(zip(row_labels, matrix)):
        cells = [{"color": _diverging_color(v, vmax) if diverging else _sequential_color(v, vmin, vmax),
                  "tip": hover[i][j] if hover else f"{label} / {col_labels[j]}: {fmt(v, digits)}",
                  "faded": bool(faded and faded[i][j]), "text": fmt(v, digits)} for j, v in enumerate(row)]
        rows.append({"label": str(label), "cells": cells})
    return macro("charts.html", "heatmap")(
        {"id": table_id, "title": title, "row_title": row_title, "col_title": col_title,
         "cols": [str(c) for c in col_labels], "rows": rows})


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
               width: int = 420, height: int = 220, chart_id: str = "", min_span: float = 0.0) -> Markup:
    """An SVG of lines over x = 0, 1, 2, ... with dots and values on hover; the y axis spans at
    least `min_span` (value_range)."""
    pts = [v for ys in series.values() for v in ys if is_finite(v)]
    chart = {"width": width, "height": height, "id": chart_id or title, "title": title, "x_label": x_label,
             "empty": not pts, "series": []}
    if pts:
        lo, hi = value_range(pts, min_span)
        n = max(len(ys) for ys in series.values())
        left, right, top, bottom = 48, 10, 24, 30
        pw, ph = width - left - right, height - top - bottom
        sx = lambda i: round(left + (pw * i / max(1, n - 1)), 1)  # noqa: E731
        sy = lambda v: round(top + ph * (1 - (v - lo) / (hi - lo)), 1)  # noqa: E731
        chart.update(left=left, top=top, right_x=left + pw, bottom_y=top + ph, hi=fmt(hi, 3), lo=fmt(lo, 3),
                     x_mid=left + pw / 2)
        for k, (name, ys) in enumerate(series.items()):
            dots = [{"x": sx(i), "y": sy(v), "title": f"{name} @ {i}: {fmt(v, 4)}"}
                    for i, v in enumerate(ys) if is_finite(v)]
            chart["series"].append({"name": str(name), "color": PALETTE[k % len(PALETTE)], "dots": dots,
                                    "points": " ".join(f"{d['x']},{d['y']}" for d in dots) if len(dots) > 1 else "",
                                    "legend_x": left + 6 + 110 * k, "legend_y": top + ph + 22})
    return macro("charts.html", "line_chart")(chart)
