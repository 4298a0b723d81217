"""Charts drawn with Altair (Vega-Lite): bars with confidence intervals, heatmaps with a colour
legend, lines with x ticks, grouped before/after bars.

Every helper builds an Altair chart from a tidy table (one dict per mark) with axis titles,
ticks, legends, colour scales and tooltips, and returns `vega(chart)`: a `<div class="gl-vega">`
carrying the Vega-Lite spec as JSON in its `data-spec` attribute (autoescaped by
`templates/charts.html`) and a one-line text fallback for readers without JavaScript.
`static/vega_runtime.js` draws every such element (SVG renderer, hover tooltips) in the app and
in an exported report; `runtime_js()` is the vega/vega-lite/vega-embed bundle of
`vl-convert-python` plus that loader, so both render offline, with the same spec: an exported
report inlines it (`runtime_head`), the app links it as a cached file (`runtime_file`).
"""
from __future__ import annotations

import hashlib
import json
import math
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Sequence

from ..common.scores import is_finite
from . import Markup, fmt, macro, static

PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#ff9da7",
           "#9c755f", "#bab0ac"]
FONT = 12


def _alt():
    import altair as alt  # imported on first chart: pages without charts never pay for it

    return alt


def _number(x) -> float | None:
    """`x` as a float, None when missing or not finite (JSON has no NaN)."""
    return float(x) if is_finite(x) else None


def _clean(obj):
    """`obj` with every non-finite float replaced by None, so that it is valid JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def spec_of(chart) -> dict:
    """The Vega-Lite spec (a dict) of an Altair chart or of a spec given as a dict."""
    return _clean(chart if isinstance(chart, dict) else chart.to_dict())


def spec_in(markup: str, chart_id: str = "") -> dict:
    """The Vega-Lite spec of the (first, or `chart_id`'s) chart in `markup` made by `vega`."""
    import html
    import re

    pattern = (r'data-chart="%s" data-spec="([^"]*)"' % re.escape(str(html.escape(chart_id))) if chart_id
               else r'data-spec="([^"]*)"')
    return json.loads(html.unescape(re.search(pattern, str(markup)).group(1)))


def vega(chart, *, chart_id: str = "", fallback: str = "") -> Markup:
    """Returns `<div class="gl-vega" id=chart_id data-chart=chart_id data-spec="…json…">` with
    `fallback` (or the chart's title) as the text shown until the runtime draws the chart."""
    spec = spec_of(chart)
    text = json.dumps(spec, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    chart_id = chart_id or "gl-chart-" + hashlib.sha1(text.encode()).hexdigest()[:10]
    title = spec.get("title")
    title = title.get("text", "") if isinstance(title, dict) else title or ""
    return macro("charts.html", "vega")(id=chart_id, spec=text,
                                        fallback=fallback or (f"Chart: {title}" if title else "Chart"))


@lru_cache(maxsize=1)
def runtime_js() -> str:
    """The vega, vega-lite and vega-embed bundle (from vl-convert-python, no network; it sets
    window.vegaEmbed) followed by `static/vega_runtime.js`, safe to inline in a `<script>`
    element. Computed once."""
    import vl_convert

    # in a function: the bundle's top-level names would clash with the page's other classic scripts
    text = "(function () {\n" + vl_convert.javascript_bundle() + "\n})();\n" + static("vega_runtime.js")
    return text.replace("</script", "<\\/script").replace("</SCRIPT", "<\\/SCRIPT")


def runtime_head() -> Markup:
    """`<script>` with `runtime_js()` inlined, for an exported report's head: it opens with the
    network off. The app links the same text as a file instead (`runtime_file`, `runtime_link`)."""
    return macro("charts.html", "runtime")(Markup(runtime_js()))


def runtime_file(directory: str | Path) -> Path:
    """`runtime_js()` written once to `directory/gaplens-charts-<hash of its text>.js` and that
    path: a name that changes whenever the text does, so a browser may keep the file for good."""
    text = runtime_js().encode("utf-8")
    path = Path(directory) / f"gaplens-charts-{hashlib.sha256(text).hexdigest()[:16]}.js"
    if not path.is_file() or path.stat().st_size != len(text):
        path.parent.mkdir(parents=True, exist_ok=True)
        part = path.with_name(f"{path.name}.{os.getpid()}.part")   # another process may write it too
        part.write_bytes(text)
        os.replace(part, path)
    return path


def runtime_link(url: str) -> Markup:
    """`<script src=url defer>`: the chart runtime as a separate file, for the app's head; the
    page draws its charts once it has loaded (static/vega_runtime.js watches for them)."""
    return macro("charts.html", "runtime_link")(url)


def _title(alt, title: str) -> dict:
    """{"title": …} for a chart's properties, {} without a title."""
    return {"title": alt.TitleParams(title, anchor="start", fontSize=13, limit=640)} if title else {}


def _unique(labels: Sequence[Any]) -> list[str]:
    """`labels` as strings, a repeated one suffixed " (2)", " (3)"… (a scale would merge them)."""
    seen: dict[str, int] = {}
    out = []
    for label in map(str, labels):
        seen[label] = seen.get(label, 0) + 1
        out.append(label if seen[label] == 1 else f"{label} ({seen[label]})")
    return out


def _bar_row(label: str, value, bounds, reference, i: int, digits: int) -> dict:
    """One bar's row of a bar chart's table: its value, 95% CI `bounds` (low, high) and target
    `reference[i]` as numbers (None when missing) and as text."""
    lo, hi = bounds or (None, None)
    target = reference[i] if reference is not None and i < len(reference) else None
    return {"label": label, "value": _number(value), "low": _number(lo), "high": _number(hi),
            "target": _number(target), "text": fmt(value, digits),
            "ci": f"[{fmt(lo, digits)}, {fmt(hi, digits)}]" if _number(lo) is not None else ""}


def _x_domain(rows: list[dict], vmax: float | None) -> list[float]:
    """[min(0, every value, bound and target), `vmax` or the largest of them]: a bar chart's x scale."""
    numbers = [x for r in rows for x in (r["value"], r["low"], r["high"], r["target"]) if x is not None]
    return [min(numbers + [0.0]), vmax if vmax is not None else max(numbers + [1e-9])]


def bar_chart(labels: Sequence[str], values: Sequence[float], *, title: str = "",
              counts: Sequence[int] | None = None, ci: Sequence[tuple[float, float]] | None = None,
              reference: Sequence[float] | None = None, highlight: Sequence[bool] | None = None,
              vmax: float | None = None, value_digits: int = 2, width: int = 300,
              bar_height: int = 22, chart_id: str = "", x_title: str = "",
              tooltip: Sequence[str] | None = None) -> Markup:
    """Horizontal bars, one per label, with the value (and count) written next to each bar,
    optional 95% CI whiskers, a red reference tick (e.g. the target share), highlighted bars
    outlined; the x axis runs from min(0, values) to `vmax` (else the largest value or bound).
    `tooltip`: one extra line per bar (e.g. what the metric means)."""
    alt = _alt()
    labels = _unique(labels)
    rows = [_bar_row(label, value, ci[i] if ci is not None else None, reference, i, value_digits)
            | {"highlight": bool(highlight and highlight[i]), "note": str(tooltip[i]) if tooltip else ""}
            | ({"text": f"{fmt(value, value_digits)} (n={counts[i]})"} if counts is not None else {})
            for i, (label, value) in enumerate(zip(labels, values))]
    x = alt.X("value:Q", title=x_title or None, scale=alt.Scale(domain=_x_domain(rows, vmax), clamp=True, nice=False),
              axis=alt.Axis(tickCount=5, grid=True))
    y = alt.Y("label:N", sort=labels, title=None, axis=alt.Axis(labelLimit=200, labelFontSize=FONT))
    tips = [alt.Tooltip("label:N", title="class"), alt.Tooltip("text:N", title="value"),
            alt.Tooltip("ci:N", title="95% CI"), alt.Tooltip("target:Q", title="target", format=".3f")]
    if tooltip:
        tips.append(alt.Tooltip("note:N", title="meaning"))
    base = alt.Chart().encode(y=y)
    bars = base.mark_bar(height=max(6, bar_height - 6)).encode(
        x=x, color=alt.Color("label:N", scale=alt.Scale(domain=labels, range=PALETTE), legend=None),
        stroke=alt.condition(alt.datum.highlight, alt.value("#222"), alt.value(None)),
        strokeWidth=alt.condition(alt.datum.highlight, alt.value(2), alt.value(0)), tooltip=tips)
    whiskers = base.mark_rule(color="#222", strokeWidth=1.5).encode(x="low:Q", x2="high:Q", tooltip=tips) \
        .transform_filter("isValid(datum.low) && isValid(datum.high)")
    ticks = base.mark_tick(color="#c00", thickness=2, size=max(8, bar_height - 2), strokeDash=[3, 2]) \
        .encode(x="target:Q", tooltip=tips).transform_filter("isValid(datum.target)")
    text = base.mark_text(align="left", dx=6, fontSize=FONT).encode(x=alt.value(width), text="text:N")
    layers = [bars] + ([whiskers] if ci is not None else []) + ([ticks] if reference is not None else []) + [text]
    chart = alt.layer(*layers, data=alt.Data(values=rows)).properties(
        width=width, height=alt.Step(bar_height), **_title(alt, title))
    fallback = f"{title}: " + ", ".join(f"{r['label']} {r['text']}" for r in rows)
    return vega(chart, chart_id=chart_id or title, fallback=fallback)


def heatmap(matrix: Sequence[Sequence[float]], row_labels: Sequence[str], col_labels: Sequence[str], *,
            title: str = "", diverging: bool = True, digits: int = 2,
            hover: Sequence[Sequence[str]] | None = None, faded: Sequence[Sequence[bool]] | None = None,
            row_title: str = "", col_title: str = "", table_id: str = "", legend: str = "value",
            domain: tuple[float, float] | None = None, max_size: int = 520) -> Markup:
    """A heatmap of `matrix` (rows × columns) with a colour legend titled `legend`: diverging
    (red below 0, blue above, white at 0) or sequential; the value written in each cell when the
    matrix is small; `hover[i][j]` as the cell's tooltip; faded cells drawn pale. Cells shrink
    so that the matrix fits in `max_size` pixels each way (at least 9 px a cell)."""
    alt = _alt()
    rows_, cols_ = _unique(row_labels), _unique(col_labels)
    data = []
    for i, (label, row) in enumerate(zip(rows_, matrix)):
        for j, v in enumerate(row):
            data.append({"row": label, "col": cols_[j], "value": _number(v), "text": fmt(v, digits)}
                        | ({"tip": str(hover[i][j])} if hover else {}) | ({"faded": True} if faded and faded[i][j] else {}))
    values = [d["value"] for d in data if d["value"] is not None]
    cell = int(max(9, min(34, max_size // max(1, len(rows_), len(cols_)))))
    tips = (alt.Tooltip("tip:N", title=" ") if hover else
            [alt.Tooltip("row:N", title=row_title or "row"), alt.Tooltip("col:N", title=col_title or "column"),
             alt.Tooltip("text:N", title=legend)])
    if domain is None:
        top = max([abs(v) for v in values] or [1.0]) or 1.0
        domain = (-top, top) if diverging else (min(values or [0.0]), max(values or [1.0]))
    scale = (alt.Scale(scheme="redblue", domain=list(domain), domainMid=0) if diverging
             else alt.Scale(scheme="blues", domain=list(domain)))
    x = alt.X("col:N", sort=cols_, title=col_title or None,
              axis=alt.Axis(orient="top", labelAngle=-60, labelLimit=160, labelFontSize=min(FONT, cell)))
    # maxExtent: Vega caps the labels' room (and so the title's offset) at 200 px by default, which put
    # the title over labels up to 320 px long
    y = alt.Y("row:N", sort=rows_, title=row_title or None,
              axis=alt.Axis(labelLimit=320, maxExtent=340, labelFontSize=min(FONT, max(9, cell - 2))))
    base = alt.Chart().encode(x=x, y=y)
    rects = base.mark_rect(stroke="#fff", strokeWidth=0.5).encode(
        color=alt.Color("value:Q", scale=scale, title=legend,
                        legend=alt.Legend(orient="right", gradientLength=min(200, max(80, cell * len(rows_))))),
        opacity=alt.condition(alt.datum.faded, alt.value(0.3), alt.value(1.0)), tooltip=tips)
    layers = [rects]
    if cell >= 28:
        dark = f"abs(datum.value) > {0.6 * max(abs(domain[0]), abs(domain[1])):.6g}" if diverging else \
            f"datum.value > {domain[0] + 0.6 * (domain[1] - domain[0]):.6g}"
        layers.append(base.mark_text(fontSize=11).encode(
            text="text:N", tooltip=tips, color=alt.condition(dark, alt.value("#fff"), alt.value("#000"))))
    chart = alt.layer(*layers, data=alt.Data(values=data)).properties(
        width=alt.Step(cell), height=alt.Step(cell), **_title(alt, title))
    return vega(chart, chart_id=table_id or title,
                fallback=f"{title}: a {len(rows_)} × {len(cols_)} heatmap (needs JavaScript to draw)")


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
               width: int = 420, height: int = 220, chart_id: str = "", min_span: float = 0.0,
               y_title: str = "") -> Markup:
    """Lines over x = 0, 1, 2, … (integer ticks), a dot per value with its value on hover, a
    legend of the series below; the y axis spans at least `min_span` (value_range)."""
    alt = _alt()
    names = [str(n) for n in series]
    data = [{"series": str(name), "x": i, "y": _number(v), "text": fmt(v, 4)}
            for name, ys in series.items() for i, v in enumerate(ys) if is_finite(v)]
    if not data:
        return macro("charts.html", "empty")(id=chart_id or title, text=f"{title}: no data yet")
    lo, hi = value_range([d["y"] for d in data], min_span)
    n = max(len(ys) for ys in series.values())
    chart = alt.Chart(alt.Data(values=data)).mark_line(point=alt.OverlayMarkDef(size=40)).encode(
        x=alt.X("x:Q", title=x_label, scale=alt.Scale(domain=[0, max(1, n - 1)], nice=False),
                axis=alt.Axis(tickMinStep=1, format="d", values=list(range(n)) if n <= 30 else alt.Undefined)),
        y=alt.Y("y:Q", title=y_title or None, scale=alt.Scale(domain=[lo, hi], nice=False, zero=False)),
        color=alt.Color("series:N", sort=names, scale=alt.Scale(domain=names, range=PALETTE),
                        legend=alt.Legend(orient="bottom", title=None, labelLimit=260)),
        tooltip=[alt.Tooltip("series:N"), alt.Tooltip("x:Q", title=x_label), alt.Tooltip("text:N", title="value")],
    ).properties(width=width, height=height, **_title(alt, title))
    return vega(chart, chart_id=chart_id or title, fallback=f"{title}: " + "; ".join(
        f"{name} {fmt(ys[-1], 4)} at {x_label} {len(ys) - 1}" for name, ys in series.items() if len(ys)))


def grouped_bars(labels: Sequence[str], groups: dict[str, Sequence[float]], *, title: str = "",
                 ci: dict[str, Sequence[tuple[float, float]]] | None = None,
                 reference: Sequence[float] | None = None, vmax: float | None = None, width: int = 300,
                 chart_id: str = "", x_title: str = "", digits: int = 2) -> Markup:
    """Bars of several groups (e.g. "before" and "after") side by side for each label, each
    group in its colour (legend below), with optional 95% CI whiskers and reference ticks."""
    alt = _alt()
    labels = _unique(labels)
    names = [str(g) for g in groups]
    rows = [_bar_row(label, value, ci[g][i] if ci and g in ci else None, reference, i, digits) | {"group": str(g)}
            for g, values in groups.items() for i, (label, value) in enumerate(zip(labels, values))]
    x = alt.X("value:Q", title=x_title or None, scale=alt.Scale(domain=_x_domain(rows, vmax), nice=False, clamp=True))
    y = alt.Y("label:N", sort=labels, title=None, axis=alt.Axis(labelLimit=200))
    offset = alt.YOffset("group:N", sort=names)
    tips = [alt.Tooltip("label:N", title="class"), alt.Tooltip("group:N"), alt.Tooltip("text:N", title="value"),
            alt.Tooltip("ci:N", title="95% CI"), alt.Tooltip("target:Q", title="target", format=".3f")]
    base = alt.Chart().encode(y=y, yOffset=offset)
    bars = base.mark_bar().encode(x=x, color=alt.Color("group:N", sort=names, scale=alt.Scale(domain=names,
                                                                                             range=PALETTE),
                                                       legend=alt.Legend(orient="bottom", title=None)),
                                  tooltip=tips)
    whiskers = base.mark_rule(color="#222").encode(x="low:Q", x2="high:Q", tooltip=tips) \
        .transform_filter("isValid(datum.low) && isValid(datum.high)")
    layers = [bars, whiskers]
    if reference is not None:
        layers.append(alt.Chart().mark_tick(color="#c00", thickness=2, strokeDash=[3, 2]).encode(
            y=y, x="target:Q", tooltip=tips).transform_filter(alt.datum.group == names[0]).transform_filter("isValid(datum.target)"))
    chart = alt.layer(*layers, data=alt.Data(values=rows)).properties(width=width, **_title(alt, title))
    fallback = f"{title}: " + "; ".join(f"{g}: " + ", ".join(f"{r['label']} {r['text']}" for r in rows
                                                           if r["group"] == g) for g in names)
    return vega(chart, chart_id=chart_id or title, fallback=fallback)
