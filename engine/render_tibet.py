"""HTML renderings of Counterfactuals (TIBET) results: MAD per axis, CAS per counterfactual,
the concepts of the initial set next to a counterfactual's (the tab, the Runs view, reports).

Plain strings (engine/charts.py for the charts): no gradio, no JavaScript, readable offline.
"""
from __future__ import annotations

import html

from . import charts
from .render import fmt, fmt_ci
from .report import trust

CAS_NOTE = ("CAS: how similar the concepts in a counterfactual's images are to those of the initial prompt's "
            "images (1 = identical); the initial images lean toward the high-CAS counterfactuals. Intervals "
            "resample images and sit below the value: a resample repeats images, which lowers any overlap.")


def _esc(text) -> str:
    return html.escape(str(text), quote=True)


def mad_html(results: dict) -> str:
    """MAD per axis, most biased first, with 95% CIs; per-prompt MADs as a heatmap in aggregate mode."""
    order = results["mad_order"]
    chart = charts.bar_chart(order, [results["mad"][a] for a in order], ci=[tuple(results["mad_ci"][a]) for a in order],
                             vmax=1.0, title="Bias strength: normalised MAD per axis (most biased first)",
                             chart_id="mad", width=520)
    clip = ", ".join(f"{_esc(a)} {fmt(results['mad_clip'][a], 2)}" for a in order)
    note = (f"<p style='font-size:12px'>MAD of CAS<sup>CLIP</sup> (image-embedding similarity, which the thesis "
            f"finds agrees less with people): {clip}.</p>")
    if results.get("aggregate"):
        prompts = list(results["per_prompt"])
        matrix = [[results["per_prompt"][p]["mad"].get(a) for a in order] for p in prompts]
        note += charts.heatmap(matrix, prompts, order, diverging=False, title="MAD per prompt",
                               table_id="mad-per-prompt")
    headline = trust.headline_html(results.get("headline"))  # issue 16: how sure "most biased" is
    return f"<div id='cf-mad-panel'>{headline}<div class='gl-chart'>{chart}</div>{note}</div>"


def cas_html(axes: dict[str, dict]) -> str:
    """One CAS chart per axis ({axis: {"mad", "counterfactuals"}}), bars with 95% CIs, most biased axis first."""
    blocks = []
    for axis, a in sorted(axes.items(), key=lambda kv: -kv[1]["mad"]):
        cfs = a["counterfactuals"]
        chart = charts.bar_chart([c["value"] for c in cfs], [c["cas"] for c in cfs],
                                 ci=[tuple(c["cas_ci"]) for c in cfs], vmax=1.0, width=400,
                                 title=f"{axis}: CAS per counterfactual (MAD {fmt(a['mad'], 2)})", chart_id=f"cas-{axis}")
        blocks.append(f"<div class='gl-chart' data-axis='{_esc(axis)}'>{chart}</div>")
    return (f"<div id='cf-cas-panel' style='display:flex;flex-wrap:wrap;gap:12px'>{''.join(blocks)}</div>"
            f"<p style='font-size:12px'>{CAS_NOTE}</p>")


def by_axis(results: dict) -> dict[str, dict]:
    """{axis: {"mad", "counterfactuals"}} from a run's results (what `cas_html` draws)."""
    out = {a: {"mad": results["mad"][a], "counterfactuals": []} for a in results["mad"]}
    for c in results["counterfactuals"]:
        out[c["axis"]]["counterfactuals"].append(c)
    return out


def counterfactual_rows(results: dict) -> list[list[str]]:
    return [[c["axis"], c["prompt"], fmt_ci(c["cas"], c["cas_ci"]), fmt_ci(c["cas_clip"], c["cas_clip_ci"])]
            for c in results["counterfactuals"]]


def initial_label(label: str) -> str:
    """The label of the initial set of the prompt a set label belongs to."""
    return label.split("axis=")[0] + "initial"


def _concepts(s: dict, axis: str | None, side: str) -> str:
    words = list(s["histogram"])[:12]
    chart = charts.bar_chart(words, [s["histogram"][w] for w in words], title=f"{side}: concepts per image",
                             chart_id=f"concepts-{side}", width=360, bar_height=14)
    aligned = s["axis_top_k"].get(axis, []) if axis else []
    return (f"<div class='gl-drill' data-side='{side}'><b>{side}</b>: <i>{_esc(s['prompt'])}</i>"
            f"<p>Top-K: {_esc(', '.join(w for w, _ in s['top_k']))}</p>"
            + (f"<p>{_esc(axis)}-aligned Top-K: {_esc(', '.join(w for w, _ in aligned))}</p>" if axis else "")
            + f"<div class='gl-chart'>{chart}</div></div>")


def drill_html(results: dict, label: str) -> str:
    """The initial set next to the set `label`: their concept histograms and Top-K lists."""
    chosen = results["sets"][label]
    initial = results["sets"][initial_label(label)]
    return (f"<div id='cf-drill-panel' style='display:flex;flex-wrap:wrap;gap:16px'>"
            f"{_concepts(initial, chosen['axis'], 'initial')}{_concepts(chosen, chosen['axis'], 'counterfactual')}</div>")


def counterfactuals_html(results: dict) -> str:
    """A whole Counterfactuals run: MAD, CAS per counterfactual, the table, each set's Top-K."""
    rows = "".join("<tr>" + "".join(f"<td>{_esc(c)}</td>" for c in row) + "</tr>" for row in counterfactual_rows(results))
    top = "".join(f"<tr><td>{_esc(label)}</td><td>{_esc(', '.join(w for w, _ in s['top_k']))}</td></tr>"
                  for label, s in results.get("sets", {}).items())
    questions = "".join(f"<li>{_esc(a)}: <i>{_esc(q)}</i></li>" for a, q in results.get("questions", {}).items())
    return (f"<h3>Counterfactuals (TIBET): {_esc(results.get('prompt', ''))}</h3>"
            f"<p>{len(results.get('prompts', []))} prompt(s), {results.get('n')} images per set; VQA questions:</p>"
            f"<ul style='font-size:12px'>{questions}</ul>{mad_html(results)}{cas_html(by_axis(results))}"
            f"<table style='font-size:12px'><tr><th>axis</th><th>counterfactual</th><th>CAS [95% CI]</th>"
            f"<th>CAS CLIP [95% CI]</th></tr>{rows}</table>"
            f"<details><summary>Top-K concepts of every set</summary><table style='font-size:12px'>{top}</table></details>")
