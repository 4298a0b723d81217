"""HTML renderings of Mine Prompts results (the tab, the Runs view, exported reports).

Plain strings (engine/charts.py for the chart): no gradio, no JavaScript, readable offline.
"""
from __future__ import annotations

import html

from . import charts
from .render import fmt, gap_html

RECONSTRUCTED = ("<span class='gl-badge'>reconstructed</span> The gap score (spec A.3: M − A over "
                 "α-percentiles of a CLIP text-variation × image similarity matrix) and the genetic "
                 "algorithm's defaults (A.4) are our reconstruction: the MineTheGap paper's formula and "
                 "code are not public. Lower = more biased.")


# gap scores vary by tenths between prompts: a y axis narrower than this would magnify noise
MIN_SPAN = 0.05


def mine_chart(results: dict, baseline: dict | None = None) -> str:
    """Best gap score per iteration and best so far (and a random baseline's best so far)."""
    series = {"best this iteration": results.get("best_per_iteration") or [],
              "best so far": results.get("best_so_far") or []}
    if baseline and baseline.get("best_so_far"):
        series["random baseline, best so far"] = baseline["best_so_far"]
    title = ("random prompts: best gap score" if results.get("strategy") == "random"
             else "genetic search: best gap score")
    return charts.line_chart(series, title=f"{title} (reconstructed; lower = more biased)",
                             x_label="iteration (from 0)", chart_id="mine-best", width=520, min_span=MIN_SPAN)


def lineage_html(chain: list[dict]) -> str:
    """parent -> child chain of a mined prompt, with each one's score and origin."""
    items = "".join(f"<li data-node='{html.escape(n['id'])}'>{html.escape(n['prompt'])} "
                    f"<span class='gl-badge'>{html.escape(n.get('origin', ''))}, iteration {n.get('born', 0) + 1}, "
                    f"gap {fmt(n.get('score'))}</span></li>" for n in chain)
    return f"<ol class='gl-lineage' id='mine-lineage-list'>{items}</ol>"


def archive_table_html(archive: list[dict], limit: int = 50) -> str:
    rows = "".join(f"<tr><td>{a['rank']}</td><td class='gl-metric'>{fmt(a['score'], 4)}</td>"
                   f"<td>{html.escape(a['prompt'])}</td><td>{a.get('archived_in', a.get('born', 0)) + 1}</td>"
                   f"<td>{html.escape(' → '.join(a.get('lineage', [])))}</td></tr>" for a in archive[:limit])
    return ("<table class='gl-archive' style='font-size:13px'><tr><th>rank</th><th>gap score</th><th>prompt</th>"
            f"<th>iteration</th><th>lineage (parent → child)</th></tr>{rows}</table>")


def mine_html(results: dict) -> str:
    """A whole Mine Prompts run: settings, best-score chart, ranked archive, top prompt's details."""
    p = results.get("params", {})
    strategy = "random prompts (baseline)" if results.get("strategy") == "random" else "genetic algorithm"
    state = "complete" if results.get("complete") else "stopped or running (resumable)"
    head = (f"<h3>Mine Prompts: {html.escape(strategy)}, bias '{html.escape(str(results.get('bias', 'open')))}'</h3>"
            f"<p>T = {p.get('T')}, b = {p.get('b')}, s = {p.get('s')}, m = {p.get('m')}, r = {p.get('r')}, "
            f"N = {p.get('n')} images and {p.get('n_variations')} variations per prompt, α = {p.get('alpha')}, "
            f"{html.escape(str(p.get('combine')))}, keep parents {p.get('keep_parents')}, seed {p.get('seed')}; "
            f"{len(results.get('iterations', []))} iteration(s), {html.escape(state)}.</p><p>{RECONSTRUCTED}</p>")
    parts = [head, f"<div class='gl-chart'>{mine_chart(results)}</div>",
             archive_table_html(results.get("archive", []))]
    archive = results.get("archive") or []
    top = (results.get("details") or {}).get(archive[0]["id"]) if archive else None
    if top:
        parts.append(f"<h4>Most biased prompt: {html.escape(archive[0]['prompt'])}</h4>{gap_html(top)}")
    return "\n".join(parts)
