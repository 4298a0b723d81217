"""BiasConnect's views as self-contained HTML (no gradio, so the Runs export reuses them):
the Bias Intersectionality Matrix as a heatmap whose cells explain themselves in words, and
the BiasGraph of kept χ² edges as an interactive pyvis network.

The graph is a full HTML document with vis-network inlined (pyvis `cdn_resources="in_line"`,
the template's CDN stylesheet and script removed), so it renders offline; embed it with
`iframe()`. Edge colour is the sign of IS (blue helps, red harms), width grows with |IS|;
MaxImp (most outgoing weight) and MaxInf (most incoming) are marked.
"""
from __future__ import annotations

import html
import json
import math
import re

from . import charts

POSITIVE, NEGATIVE = "#2b6cb0", "#c53030"
# pyvis' template loads bootstrap from a CDN (unused here) and comments out a node_modules copy of vis
_EXTERNAL = re.compile(r"<link[^>]*https?://[^>]*>|<script[^>]*src=\"https?://[^\"]*\"[^>]*>\s*</script>"
                       r"|<!--\s*<link[^>]*node_modules.*?-->", re.S)


def _num(value, digits: int = 2) -> str:
    return "n/a" if value is None or value != value else f"{value:.{digits}f}"


def cell_text(x: str, y: str, value: float, w_init: float, w_mixed: float, ci=None) -> str:
    """One matrix cell in words: what making `x` diverse does to `y`."""
    subject = f"{y} itself" if x == y else y
    if value is None or value != value:
        return f"Making {x} diverse: no effect measurable on {subject} (no answers among its choices)."
    if abs(value) < 0.005:
        effect = f"leaves {subject} where it was"
    else:
        effect = f"moves {subject} {abs(value):.2f} {'closer to' if value > 0 else 'further from'} its target"
    text = (f"Making {x} diverse (its counterfactuals equally represented) {effect}: distance from the "
            f"target {_num(w_init)} → {_num(w_mixed)} (IS {value:+.2f})")
    if ci and ci[0] is not None and ci[0] == ci[0]:
        text += f"; 95% CI [{ci[0]:+.2f}, {ci[1]:+.2f}]"
        if ci[0] <= 0 <= ci[1]:
            text += ", which includes 0: not distinguishable from no effect at this number of images"
    return text + "."


def matrix_html(results: dict, table_id: str = "is-matrix") -> str:
    """The signed IS heatmap of an intersectional run's results (rows intervene, columns are
    affected); cells whose bootstrap CI spans 0 are faded."""
    s = results["sensitivity"]
    axes, matrix = s["axes"], s["matrix"]
    low, high = s.get("ci_low"), s.get("ci_high")
    n = len(axes)
    ci = [[(low[i][j], high[i][j]) if low else None for j in range(n)] for i in range(n)]
    hover = [[cell_text(axes[i], axes[j], matrix[i][j], s["w_bar_init"][j], s["w_bar_mixed"][i][j], ci[i][j])
              for j in range(n)] for i in range(n)]
    # faded: the CI spans 0, or the pair is not a kept edge (pruned); the diagonal is no edge
    kept = {(e["source"], e["target"]) for e in results.get("edges", []) if e.get("kept")}
    faded = [[bool(c and c[0] is not None and c[0] <= 0 <= c[1])
              or (i != j and "edges" in results and (axes[i], axes[j]) not in kept)
              for j, c in enumerate(row)] for i, row in enumerate(ci)]
    for i in range(n):
        for j in range(n):
            if i != j and "edges" in results and (axes[i], axes[j]) not in kept:
                hover[i][j] += " Pruned: not a kept edge."
    values = [[math.nan if v is None else v for v in row] for row in matrix]   # None: no answers to measure
    return charts.heatmap(values, axes, axes, diverging=True, hover=hover, faded=faded, digits=2,
                          title="Intersectional Sensitivity IS (row made diverse → column's distance from its target)",
                          row_title="made diverse", col_title="affected", table_id=table_id)


def graph_html(axes: list[str], edges: list[dict], max_impact: str | None = None,
               max_influenced: str | None = None, height: int = 460) -> str:
    """A self-contained HTML document drawing the kept edges ({"source", "target", "is",
    "p_value", "kept"}) between the axes as an interactive directed graph."""
    from pyvis.network import Network

    net = Network(height=f"{height - 40}px", width="100%", directed=True, cdn_resources="in_line")
    radius = 60 + 30 * len(axes)
    for k, axis in enumerate(axes):  # a fixed circle: the same picture every time, no drifting
        angle = 2 * math.pi * k / max(1, len(axes)) - math.pi / 2
        marks = [m for m, node in (("MaxImp", max_impact), ("MaxInf", max_influenced)) if node == axis]
        title = "; ".join({"MaxImp": "MaxImp: most impact on other axes (outgoing edges)",
                           "MaxInf": "MaxInf: most influenced by other axes (incoming edges)"}[m] for m in marks)
        net.add_node(axis, label=axis + (f"\n({', '.join(marks)})" if marks else ""), title=title or axis,
                     x=radius * math.cos(angle), y=radius * math.sin(angle), physics=False, shape="box",
                     color="#f6ad55" if "MaxImp" in marks else "#b794f4" if marks else "#e2e8f0",
                     borderWidth=3 if marks else 1, font={"size": 16})
    for e in edges:
        if not e.get("kept"):
            continue
        value = 0.0 if e["is"] is None or e["is"] != e["is"] else e["is"]
        net.add_edge(e["source"], e["target"], color=POSITIVE if value >= 0 else NEGATIVE,
                     width=1 + 12 * min(1.0, abs(value)), label=f"{value:+.2f}",
                     title=f"making {e['source']} diverse moves {e['target']} {abs(value):.2f} "
                           f"{'closer to' if value >= 0 else 'further from'} its target (χ² p = {e['p_value']:.1e})")
    net.set_options(json.dumps({
        "physics": {"enabled": False},
        "edges": {"arrows": {"to": {"enabled": True, "scaleFactor": 0.8}},
                  "smooth": {"type": "curvedCW", "roundness": 0.15}, "font": {"size": 14, "align": "top"}},
        "interaction": {"hover": True}}))
    document = _EXTERNAL.sub("", net.generate_html())
    legend = (f"<div style='font:13px sans-serif;margin:4px'>Edges: χ²-tested dependencies kept; "
              f"<span style='color:{POSITIVE}'>blue</span> = making the source diverse helps the target, "
              f"<span style='color:{NEGATIVE}'>red</span> = it harms; width = |IS|. "
              f"{'No edge was kept.' if not any(e.get('kept') for e in edges) else ''}</div>")
    refit = "<script>window.addEventListener('resize', () => network.fit()); setTimeout(() => network.fit(), 300);</script>"
    return document.replace("<body>", "<body>" + legend, 1).replace("</body>", refit + "</body>", 1)


def graph_from_results(results: dict, height: int = 460) -> str:
    return graph_html(results["sensitivity"]["axes"], results["edges"], results.get("max_impact"),
                      results.get("max_influenced"), height)


def iframe(document: str, height: int = 480, elem_id: str = "") -> str:
    """`document` inside an <iframe srcdoc=...> (attribute-escaped), e.g. for gr.HTML."""
    return (f'<iframe id="{html.escape(elem_id)}" srcdoc="{html.escape(document, quote=True)}" '
            f'style="width:100%;height:{height}px;border:1px solid #ddd;border-radius:6px" '
            f'sandbox="allow-scripts" title="BiasGraph"></iframe>')



def summary_html(results: dict) -> str:
    """MaxImp/MaxInf, the distortion 𝓘, and the settings behind the numbers, in words."""
    kept = results["kept_edges"]
    policy = {"drop": "dropped (distributions renormalised over the choices)",
              "other_bin": "counted in an 'other' category the target gives 0"}[results["other_policy"]]
    ideals = "; ".join(f"{a}: " + ", ".join(f"{v} {w:.2f}" for v, w in d.items()) for a, d in results["ideals"].items())
    return (f"<div id='ic-summary' style='font-size:13px'><p><b>{len(kept)}</b> of {len(results['edges'])} ordered "
            f"pairs kept ({results['level']} level: χ² p &lt; {results['p_threshold']:g}"
            + (f" and |IS| ≥ {results['min_abs_is']:g}" if results["min_abs_is"] else "") + "). "
            f"MaxImp (most impact, by {'edge count' if results['importance'] == 'count' else 'sum of |IS|'}): "
            f"<b id='ic-maximp'>{html.escape(str(results['max_impact'] or 'none (no kept edge)'))}</b>; MaxInf (most "
            f"influenced): <b id='ic-maxinf'>{html.escape(str(results['max_influenced'] or 'none'))}</b>. Intersectional distortion 𝓘 = "
            f"Σ|IS| off the diagonal = <b>{results['distortion']:.2f}</b>.</p>"
            f"<p>Answers outside an axis' choices are {policy}. Distance from the target: w̄ = TV(D, D*) / "
            f"(1 − min D*), 0 = on target, 1 = as far as possible. The diagonal is how far making an axis diverse "
            f"fixes that axis itself; it is not an edge. Target D*: {html.escape(ideals)}.</p></div>")


def intersectional_html(results: dict) -> str:
    """A whole Intersectional run: summary, questions, matrix, kept edges and the graph."""
    questions = "".join(f"<li>{html.escape(a)}: <i>{html.escape(q)}</i> (choices: "
                        f"{html.escape(', '.join(results['values'][a]))})</li>" for a, q in results["questions"].items())
    edges = "".join(f"<tr><td>{html.escape(e['source'])} → {html.escape(e['target'])}</td><td>{_num(e['is'])}</td>"
                    f"<td>{e['p_value']:.1e}</td></tr>" for e in results["kept_edges"])
    return (f"<h3>Intersectional Matrix (BiasConnect): {html.escape(results.get('prompt', ''))}</h3>"
            f"{summary_html(results)}<ul style='font-size:12px'>{questions}</ul>{matrix_html(results)}"
            f"<table style='font-size:12px'><tr><th>kept edge</th><th>IS</th><th>χ² p</th></tr>{edges}</table>"
            f"{iframe(graph_from_results(results))}")


def pair_html(results: dict, intervened: str, affected: str) -> str:
    """The affected axis' distribution on the initial images and after making `intervened`
    diverse (its counterfactual sets mixed equally), each against the target D* (dashed)."""
    d = results["distributions"][affected]
    s = results["sensitivity"]
    i, j = s["axes"].index(intervened), s["axes"].index(affected)
    charts_ = [charts.bar_chart(d["values"], [0.0 if v is None else v for v in values], reference=d["ideal"],
                                vmax=1.0, width=360, title=title, chart_id=f"pair-{key}")
               for key, title, values in (("initial", f"{affected}: initial images", d["initial"]),
                                          ("mixed", f"{affected}: {intervened} made diverse", d["mixed"][intervened]))]
    text = cell_text(intervened, affected, s["matrix"][i][j], s["w_bar_init"][j], s["w_bar_mixed"][i][j],
                     (s["ci_low"][i][j], s["ci_high"][i][j]) if s.get("ci_low") else None)
    from .methods.intersectional import edge_status

    status = edge_status(results, intervened, affected)
    return (f"<div id='ic-pair-panel' data-kept='{str(status['kept']).lower()}'>"
            f"<p style='font-size:13px'><b>{html.escape(status['reason'][0].upper() + status['reason'][1:])}.</b></p>"
            f"<p style='font-size:13px' class='{'' if status['kept'] else 'gl-faded-text'}'>{html.escape(text)}</p>"
            f"<div style='display:flex;flex-wrap:wrap;gap:12px'>" + "".join(f"<div class='gl-chart'>{c}</div>" for c in charts_)
            + "</div><p style='font-size:12px'>Dashed ticks: the target D*.</p></div>")
