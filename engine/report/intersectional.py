"""The Intersectional (BiasConnect) page: the Bias Intersectionality Matrix as a heatmap whose
cells explain themselves in words, and the BiasGraph of kept χ² edges as an interactive
vis-network graph (the tab, the Runs view, reports). Markup: templates/intersectional.html.

The graph is a full HTML document with vis-network inlined (the copy pyvis ships), so it
renders offline; nodes, edges and options enter its script as JSON through `|tojson` (axis
names cannot close the script), and the document enters the page through an attribute-escaped
`<iframe srcdoc>` with `sandbox="allow-scripts"`. Edge colour is the sign of IS (blue helps,
red harms), width grows with |IS|; MaxImp (most outgoing weight) and MaxInf (most incoming)
are marked.
"""
from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path

from ..common.scores import is_missing
from ..methods.intersectional import edge_status, no_edge_note, threshold_notes
from . import Markup, cant_tell_note, charts, explain, fmt, macro, signed, trust, with_cant_tell
from .distilled import sources_html

POSITIVE, NEGATIVE = "#2b6cb0", "#c53030"
MARKS = {"MaxImp": "MaxImp: most impact on other axes (outgoing edges)",
         "MaxInf": "MaxInf: most influenced by other axes (incoming edges)"}
OPTIONS = {"physics": {"enabled": False},
           "edges": {"arrows": {"to": {"enabled": True, "scaleFactor": 0.8}},
                     "smooth": {"type": "curvedCW", "roundness": 0.15}, "font": {"size": 14, "align": "top"}},
           "interaction": {"hover": True}}


def cell_text(x: str, y: str, value: float, w_init: float, w_mixed: float, ci=None) -> str:
    """One matrix cell in words: what making `x` diverse does to `y` (plain text)."""
    subject = f"{y} itself" if x == y else y
    if is_missing(value):
        return f"Making {x} diverse: no effect measurable on {subject} (no answers among its choices)."
    if abs(value) < 0.005:
        effect = f"leaves {subject} where it was"
    else:
        effect = f"moves {subject} {abs(value):.2f} {'closer to' if value > 0 else 'further from'} its target"
    text = (f"Making {x} diverse (its counterfactuals equally represented) {effect}: distance from the "
            f"target {fmt(w_init, 2)} → {fmt(w_mixed, 2)} (IS {signed(value, 2)})")
    if ci and ci[0] is not None and ci[0] == ci[0]:
        text += f"; 95% CI [{signed(ci[0], 2)}, {signed(ci[1], 2)}]"
        if ci[0] <= 0 <= ci[1]:
            text += ", which includes 0: not distinguishable from no effect at this number of images"
    return text + "."


def matrix_html(results: dict, table_id: str = "is-matrix") -> Markup:
    """The signed IS heatmap of an intersectional run's results (rows intervene, columns are
    affected); cells whose bootstrap CI spans 0, or whose pair is not a kept edge, are faded."""
    s = results["sensitivity"]
    axes, matrix = s["axes"], s["matrix"]
    low, high = s.get("ci_low"), s.get("ci_high")
    n = len(axes)
    ci = [[(low[i][j], high[i][j]) if low else None for j in range(n)] for i in range(n)]
    hover = [[cell_text(axes[i], axes[j], matrix[i][j], s["w_bar_init"][j], s["w_bar_mixed"][i][j], ci[i][j])
              for j in range(n)] for i in range(n)]
    # faded: the CI spans 0, or the pair is not a kept edge (pruned); the diagonal is no edge
    kept = {(e["source"], e["target"]) for e in results.get("edges", []) if e.get("kept")}
    pruned = [[i != j and "edges" in results and (axes[i], axes[j]) not in kept for j in range(n)] for i in range(n)]
    faded = [[bool(c and c[0] is not None and c[0] <= 0 <= c[1]) or pruned[i][j] for j, c in enumerate(row)]
             for i, row in enumerate(ci)]
    hover = [[text + (" Pruned: not a kept edge." if pruned[i][j] else "") for j, text in enumerate(row)]
             for i, row in enumerate(hover)]
    values = [[math.nan if v is None else v for v in row] for row in matrix]   # None: no answers to measure
    return charts.heatmap(values, axes, axes, diverging=True, hover=hover, faded=faded, digits=2,
                          title="Intersectional Sensitivity IS (row made diverse → column's distance from its target)",
                          row_title="made diverse", col_title="affected", table_id=table_id,
                          legend="IS (+ closer to target)")


@lru_cache(maxsize=1)
def _vis() -> tuple[Markup, Markup]:
    """(vis-network.min.js, vis-network.css) as shipped with pyvis: trusted library code, inlined."""
    import pyvis

    lib = Path(pyvis.__file__).resolve().parent / "templates" / "lib" / "vis-9.1.2"
    js = (lib / "vis-network.min.js").read_text(encoding="utf-8")
    if "</script" in js.lower():  # would end the inline <script> early
        raise RuntimeError("vis-network.min.js cannot be inlined: it contains '</script'")
    return Markup(js), Markup((lib / "vis-network.css").read_text(encoding="utf-8"))


def graph_data(axes: list[str], edges: list[dict], max_impact: str | None = None,
               max_influenced: str | None = None) -> tuple[list[dict], list[dict]]:
    """(vis nodes, vis edges): the axes on a fixed ellipse twice as wide as tall (the same picture
    every time; the frame is wide, so a circle would leave its sides blank and shrink the labels
    to fit its height), the kept edges coloured by the sign of IS and as wide as |IS|."""
    from pyvis.network import Network

    net = Network(directed=True)
    radius = 40 + 22 * len(axes)
    for k, axis in enumerate(axes):
        angle = 2 * math.pi * k / max(1, len(axes)) - math.pi / 2
        marks = [m for m, node in (("MaxImp", max_impact), ("MaxInf", max_influenced)) if node == axis]
        net.add_node(str(axis), label=str(axis) + (f"\n({', '.join(marks)})" if marks else ""),
                     title="; ".join(MARKS[m] for m in marks) or str(axis),
                     x=2.2 * radius * math.cos(angle), y=radius * math.sin(angle), physics=False, shape="box",
                     color="#f6ad55" if "MaxImp" in marks else "#b794f4" if marks else "#e2e8f0",
                     borderWidth=3 if marks else 1, font={"size": 18})
    for e in edges:
        if not e.get("kept"):
            continue
        value = 0.0 if e["is"] is None or e["is"] != e["is"] else e["is"]
        net.add_edge(str(e["source"]), str(e["target"]), color=POSITIVE if value >= 0 else NEGATIVE,
                     width=1 + 12 * min(1.0, abs(value)), label=signed(value, 2),
                     title=f"making {e['source']} diverse moves {e['target']} {abs(value):.2f} "
                           f"{'closer to' if value >= 0 else 'further from'} its target (χ² p = {e['p_value']:.1e})")
    return net.nodes, net.edges


def graph_html(axes: list[str], edges: list[dict], max_impact: str | None = None,
               max_influenced: str | None = None, height: int = 460) -> Markup:
    """A self-contained HTML document drawing the kept edges ({"source", "target", "is",
    "p_value", "kept"}) between the axes as an interactive directed graph."""
    nodes, vis_edges = graph_data(axes, edges, max_impact, max_influenced)
    js, css = _vis()
    return macro("intersectional.html", "graph")(
        nodes=nodes, edges=vis_edges, options=OPTIONS, height=height - 40, js=js, css=css,
        positive=POSITIVE, negative=NEGATIVE, any_kept=any(e.get("kept") for e in edges))


def graph_height(axes) -> int:
    """The height of a BiasGraph frame: room for its ellipse of axes, no more (a fixed 460 px left
    a few axes small in a mostly blank frame)."""
    return min(460, 220 + 30 * len(axes))


def graph_from_results(results: dict, height: int | None = None) -> Markup:
    """`graph_html` of a run's results."""
    axes = results["sensitivity"]["axes"]
    return graph_html(axes, results["edges"], results.get("max_impact"), results.get("max_influenced"),
                      height or graph_height(axes))


def iframe(document: str, height: int = 480, elem_id: str = "") -> Markup:
    """`document` inside an <iframe srcdoc=...> (attribute-escaped), e.g. for gr.HTML."""
    return macro("intersectional.html", "iframe")(document=str(document), height=height, elem_id=elem_id)


def summary_html(results: dict) -> Markup:
    """MaxImp/MaxInf, the distortion 𝓘, and the settings behind the numbers, in words (with a note
    beside a p threshold that keeps no edge or tests nothing: `threshold_notes`)."""
    policy = {"drop": "dropped (distributions renormalised over the choices)",
              "other_bin": "counted in an 'other' category the target gives 0"}.get(results["other_policy"],
                                                                                   results["other_policy"])
    return macro("intersectional.html", "summary")(r=results, policy=policy,
                                                   headline=trust.headline_html(results.get("headline")),
                                                   notes=threshold_notes(results), no_edge=no_edge_note(results),
                                                   meanings=explain.info(["is"], "ic-meanings"))


def pair_html(results: dict, intervened: str, affected: str) -> Markup:
    """The affected axis' distribution on the initial images and after making `intervened`
    diverse (its counterfactual sets mixed equally), each against the target D* (dashed)."""
    d = results["distributions"][affected]
    s = results["sensitivity"]
    i, j = s["axes"].index(intervened), s["axes"].index(affected)
    cant_tell = d.get("cant_tell", {})
    charts_, notes = [], []
    for key, title, values, m in (("initial", f"{affected}: initial images", d["initial"], cant_tell.get("initial", {})),
                                  ("mixed", f"{affected}: {intervened} made diverse", d["mixed"][intervened],
                                   cant_tell.get("mixed", {}).get(intervened, {}))):
        # issue 35: "can't tell" is a bar of its own (share of all the images), outside the distribution
        names, shares, _, _ = with_cant_tell(m, d["values"], [0.0 if v is None else v for v in values])
        charts_.append(charts.bar_chart(names, shares, reference=d["ideal"],
                                        vmax=1.0, width=360, title=title, chart_id=f"pair-{key}"))
        notes.append(cant_tell_note(m))
    text = cell_text(intervened, affected, s["matrix"][i][j], s["w_bar_init"][j], s["w_bar_mixed"][i][j],
                     (s["ci_low"][i][j], s["ci_high"][i][j]) if s.get("ci_low") else None)
    status = edge_status(results, intervened, affected)
    return macro("intersectional.html", "pair")(text=text, charts=charts_, status=status, notes=notes)


def graph_frame(results: dict, elem_id: str = "") -> Markup:
    """The BiasGraph of a run's results in its iframe, as tall as its axes need (`graph_height`)."""
    return iframe(graph_from_results(results), graph_height(results["sensitivity"]["axes"]) + 20, elem_id)


def page(results: dict) -> Markup:
    """A whole Intersectional run: summary, questions, matrix, kept edges and the graph."""
    return macro("intersectional.html", "page")(
        r=results, summary=summary_html(results), matrix=matrix_html(results), graph=graph_frame(results),
        sources=sources_html(results.get("answer_sources")))
