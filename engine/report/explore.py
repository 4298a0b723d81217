"""The Explore pages: concept strips with the lean and its interval, inverse queries, the hypothesis
tree, identity clusters, and the tree's offline HTML page. Charts are Altair (Vega-Lite) specs
drawn by `charts.vega`; a dot's tooltip shows the image's thumbnail (its `image` field) and a
click on it dispatches `gl-vega-click` with the dot's datum (the image's key). Markup:
templates/explore.html."""
from __future__ import annotations

import hashlib
import time

from .. import __version__
from . import Markup, charts, macro, render, static, thumbnail_data_uri
from .charts import PALETTE
from .distilled import sources_html
from .single_prompt import axes_html, axis_html

STRIPS_ID = "explore-strips"


def _alt():
    import altair as alt   # imported on first chart

    return alt


def _jitter(key: str) -> float:
    """A fixed offset in [-1, 1] per image (from its key), so dots of equal score do not hide each other."""
    return int(hashlib.sha1(key.encode()).hexdigest()[:6], 16) / 0x7FFFFF - 1.0


def strip_rows(images: list[dict], concepts: list[str], thumbs: dict | None = None, group: str = "") -> list[dict]:
    """One row per (image, concept) with a score: the strips' data (concept, score, seed, key,
    nearest, image: the thumbnail's URL, jitter, group)."""
    rows = []
    for item in images:
        for c in concepts:
            score = (item.get("scores") or {}).get(c)
            if score is None:
                continue
            rows.append({"concept": c, "score": score, "seed": item.get("seed"), "key": item.get("key"),
                         "nearest": item.get("nearest", ""), "image": (thumbs or {}).get(item.get("key"), ""),
                         "jitter": _jitter(str(item.get("key"))), "group": group})
    return rows


def strips_chart(rows: list[dict], concepts: list[str], strips: dict | None = None, title: str = ""):
    """One horizontal strip per concept: a dot per image at its score (colour: its nearest concept),
    the median as a black tick and its 95% interval as a black rule. Returns the Vega-Lite spec (a
    dict): the rows go in as its named `datasets`, which Altair need not walk (a thousand dots)."""
    alt = _alt()
    y = alt.Y("concept:N", sort=concepts, title=None, axis=alt.Axis(labelLimit=220))
    x_scale = alt.Scale(domain=[0, 1])
    colour = alt.Color("nearest:N", scale=alt.Scale(domain=concepts, range=PALETTE[:len(concepts)]),
                       title="nearest concept", legend=alt.Legend(orient="bottom", labelLimit=260))
    dots = alt.Chart(alt.Data(name="dots")).mark_circle(size=70, opacity=0.75, cursor="pointer").encode(
        x=alt.X("score:Q", scale=x_scale, title="score: softmax over the concepts of 100 · cosine"),
        y=y, yOffset=alt.YOffset("jitter:Q", scale=alt.Scale(domain=[-3, 3])), color=colour,
        tooltip=[alt.Tooltip("seed:Q"), alt.Tooltip("concept:N"), alt.Tooltip("score:Q", format=".3f"),
                 alt.Tooltip("image:N")])
    layers = []   # the median and its interval under the dots: a dot on them still takes the pointer
    summary = [{"concept": c, "median": v.get("median"), "lo": v["ci"][0], "hi": v["ci"][1]}
               for c, v in (strips or {}).items() if v.get("median") is not None]
    if summary:
        base = alt.Chart(alt.Data(name="summary"))
        layers += [base.mark_rule(color="black", strokeWidth=2).encode(x=alt.X("lo:Q", scale=x_scale), x2="hi:Q", y=y),
                   base.mark_tick(color="black", thickness=3, size=26).encode(
                       x=alt.X("median:Q", scale=x_scale), y=y,
                       tooltip=[alt.Tooltip("concept:N"), alt.Tooltip("median:Q", format=".3f"),
                                alt.Tooltip("lo:Q", title="95% CI low", format=".3f"),
                                alt.Tooltip("hi:Q", title="95% CI high", format=".3f")])]
    spec = alt.layer(*layers, dots).properties(width=560, height=alt.Step(56), title=title or alt.Undefined).to_dict()
    spec["datasets"] = {"dots": rows, "summary": summary}
    return spec


def scatter_chart(images: list[dict], concepts: list[str], versus: list[str], thumbs: dict | None = None):
    """The 2-D view of two axes: each image at (its score for the first axis' first concept, its score
    for the second axis' first concept); colour: nearest concept of the first axis, shape: of the
    second. Dots are spread by up to ±0.015 so that equal scores stay visible. Returns the Vega-Lite spec."""
    alt = _alt()
    rows = []
    for item in images:
        x, y = (item.get("scores") or {}).get(concepts[0]), (item.get("versus_scores") or {}).get(versus[0])
        if x is None or y is None:
            continue
        key = str(item.get("key"))
        rows.append({"x": x + 0.015 * _jitter(key), "y": y + 0.015 * _jitter(key[::-1]), "seed": item.get("seed"),
                     "key": key, "nearest": item.get("nearest", ""), "versus_nearest": item.get("versus_nearest", ""),
                     "image": (thumbs or {}).get(key, ""), "score_x": x, "score_y": y})
    scale = alt.Scale(domain=[-0.03, 1.03], nice=False)
    chart = alt.Chart(alt.Data(name="dots")).mark_point(filled=True, size=80, opacity=0.7, cursor="pointer").encode(
        x=alt.X("x:Q", scale=scale, title=f"score for '{concepts[0]}'"),
        y=alt.Y("y:Q", scale=scale, title=f"score for '{versus[0]}'"),
        color=alt.Color("nearest:N", scale=alt.Scale(domain=concepts, range=PALETTE[:len(concepts)]),
                        legend=alt.Legend(orient="bottom", labelLimit=200)),
        shape=alt.Shape("versus_nearest:N", scale=alt.Scale(domain=versus), legend=alt.Legend(orient="bottom")),
        tooltip=[alt.Tooltip("seed:Q"), alt.Tooltip("score_x:Q", title=concepts[0], format=".3f"),
                 alt.Tooltip("score_y:Q", title=versus[0], format=".3f"), alt.Tooltip("image:N")],
    ).properties(width=360, height=360, title="two axes: each image by its scores")
    spec = chart.to_dict()
    spec["datasets"] = {"dots": rows}
    return spec


def vega_chart(chart, chart_id: str) -> Markup:
    """The chart (Altair, or a Vega-Lite dict) as the pages' `<div class="gl-vega">` (charts.vega)."""
    return charts.vega(chart, chart_id=chart_id)


def lean_rows(lean: dict) -> list[dict]:
    """The lean table's rows: concept, share, interval, count (largest share first)."""
    rows = [{"concept": c, "share": v.get("share"), "ci": v.get("ci") or [None, None], "count": v.get("count", 0)}
            for c, v in (lean or {}).items() if isinstance(v, dict)]
    return sorted(rows, key=lambda r: -(r["share"] or 0))


def _top_text(lean: dict, before: str) -> str:
    """`before` + "'<concept>' 0.71 [0.62, 0.80]" of the largest share ('' when nothing was measured)."""
    rows = lean_rows(lean)
    if not rows or rows[0]["share"] is None:
        return ""
    top = rows[0]
    lo, hi = top["ci"]
    return f"{before}'{top['concept']}' {top['share']:.2f} [{lo:.2f}, {hi:.2f}]"


def distribution_text(axis: str, dist: dict) -> str:
    """"gender: 'male' 0.75 [0.62, 0.86]": an axis' most frequent answer with its interval ('' when none)."""
    return _top_text(dist, f"{axis}: ")


def lean_text(lean: dict) -> str:
    """"leans 'a photo of a man' 0.71 [0.62, 0.80]" ('' when nothing was measured)."""
    return _top_text(lean, "leans ")


def page(results: dict, thumbs: dict | None = None) -> Markup:
    """An Explore step: the strips with the lean, then each inverse query's lean and strips.
    `thumbs`: image key -> thumbnail URL for the dots' tooltips (none: no thumbnails)."""
    concepts = results.get("concepts") or []
    images = results.get("images") or []
    strips = strips_chart(strip_rows(images, concepts, thumbs), concepts, results.get("strips"),
                          f"{len(images)} images of '{results.get('prompt', '')}'") if concepts else ""
    inverse = []
    for test, lean in (results.get("inverse") or {}).items():
        placed = (results.get("inverse_sets") or {}).get(test) or {}
        chart = strips_chart(strip_rows(placed.get("images") or [], concepts, thumbs), concepts, None,
                             f"images of '{placed.get('prompt', test)}'")
        rows = lean_rows(lean)
        inverse.append({"test": test, "prompt": placed.get("prompt", ""), "rows": rows,
                        "n": sum(r["count"] for r in rows), "text": lean_text(lean),
                        "chart": vega_chart(chart, f"explore-inverse-{len(inverse)}")})
    versus = results.get("versus") or []
    second = None
    if versus and concepts:
        rows = [{**i, "scores": i.get("versus_scores"), "nearest": i.get("versus_nearest", "")} for i in images]
        second = {"concepts": versus, "lean": lean_rows(results.get("versus_lean")),
                  "text": lean_text(results.get("versus_lean")),
                  "strips": vega_chart(strips_chart(strip_rows(rows, versus, thumbs), versus,
                                                    results.get("versus_strips"), "the second axis"),
                                       "explore-versus-strips"),
                  "scatter": vega_chart(scatter_chart(images, concepts, versus, thumbs), "explore-scatter")}
    norm = results.get("normalisation") or {}
    lean = lean_rows(results.get("lean"))
    return macro("explore.html", "page")(
        prompt=results.get("prompt", ""), source_run=results.get("source_run", ""), concepts=concepts,
        lean=lean, n=sum(r["count"] for r in lean),
        text=lean_text(results.get("lean")), excluded=results.get("excluded", 0),
        strips=vega_chart(strips, STRIPS_ID) if strips else "", inverse=inverse, second=second,
        scale=norm.get("logit_scale", 100), tree=results.get("tree", ""), parent=results.get("parent", ""),
        axes=axes_html(axis_html(name, m) for name, m in (results.get("axes") or {}).items())
        + sources_html(results.get("answer_sources")) if results.get("axes") else "")


def tree_html(nodes: list[dict], selected: str = "") -> Markup:
    """The hypothesis tree as nested lists: each node's prompt, its lean and its inverse queries' leans."""
    children: dict[str, list[dict]] = {}
    ids = {n["id"] for n in nodes}
    for n in nodes:
        children.setdefault(n["parent"] if n["parent"] in ids else "", []).append(
            {**n, "text": lean_text(n.get("lean")),
             "inverse_text": [(t, lean_text(lean)) for t, lean in (n.get("inverse") or {}).items()],
             "axes_text": [distribution_text(a, d) for a, d in (n.get("axes") or {}).items()]})
    return macro("explore.html", "tree")(children=children, selected=selected)


def tree_page(tree: dict, pages: dict, thumbs: dict | None = None) -> Markup:
    """The tree as one self-contained HTML document (opens offline): the tree, then every node's
    page. `tree`: engine.methods.explore.tree_json; `pages`: node id -> its run's results;
    `thumbs`: image key -> data: URL."""
    sections = [{"id": n["id"], "prompt": n["prompt"], "html": page(pages[n["id"]], thumbs)}
                for n in tree["nodes"] if n["id"] in pages]
    return render("explore_tree.html", title=f"GapLens tree: {tree['nodes'][0]['prompt'] if tree['nodes'] else ''}",
                  tree=tree_html(tree["nodes"]), sections=sections, css=Markup(static("report.css")),
                  runtime=charts.runtime_head(), version=__version__, date=time.strftime("%Y-%m-%d %H:%M"))


def tree_document(engine, tree_id: str) -> Markup:
    """The tree `tree_id` of the store as one self-contained page (`tree_page`, thumbnails inline)."""
    from engine.methods.explore import node_images, tree_json

    tree = tree_json(engine, tree_id)
    pages = {n["id"]: (engine.store.get_run(n["id"]) or {}).get("results") or {} for n in tree["nodes"]}
    thumbs = {}
    for results in pages.values():
        for image in node_images(results):
            if image["key"] in thumbs:   # a child scoring its parent's images shows them again
                continue
            try:
                thumbs[image["key"]] = thumbnail_data_uri(image["path"], 96)
            except (OSError, KeyError):
                pass   # an image no longer in the store: its dot has no thumbnail
    return tree_page(tree, pages, thumbs)


def clusters_html(clusters: dict, thumbs: dict | None = None) -> Markup:
    """Identity clusters: each cluster's size and most central thumbnails, and each group's share of
    it with its interval (a table and a heat map of the shares)."""
    alt = _alt()
    rows = [{"cluster": f"cluster {i + 1}", "group": g, "share": v["share"], "lo": v["ci"][0], "hi": v["ci"][1],
             "count": v["count"]}
            for i, c in enumerate(clusters["clusters"]) for g, v in c["shares"].items()]
    heat = alt.Chart(alt.Data(values=rows)).mark_rect().encode(
        x=alt.X("cluster:N", title=None, sort=None), y=alt.Y("group:N", title=None, axis=alt.Axis(labelLimit=260)),
        color=alt.Color("share:Q", scale=alt.Scale(domain=[0, 1], scheme="blues"), title="share"),
        tooltip=[alt.Tooltip("group:N"), alt.Tooltip("cluster:N"), alt.Tooltip("share:Q", format=".2f"),
                 alt.Tooltip("lo:Q", title="95% CI low", format=".2f"),
                 alt.Tooltip("hi:Q", title="95% CI high", format=".2f"), alt.Tooltip("count:Q")]
    ).properties(title="each group's share of every cluster", width=alt.Step(70), height=alt.Step(24))
    cells = [{"n": i + 1, "size": c["size"],
              "thumbs": [{"url": (thumbs or {}).get(img["key"], ""), "seed": img["seed"], "prompt": img["prompt"]}
                         for img in c["central"]],
              "shares": c["shares"]} for i, c in enumerate(clusters["clusters"])]
    return macro("explore.html", "clusters")(clusters=cells, groups=[g["label"] for g in clusters["groups"]],
                                             k=clusters["k"], chart=vega_chart(heat, "explore-clusters"))
