"""The Explore pages: concept strips with the lean and its interval, inverse queries, the hypothesis
tree, identity clusters, and the tree's offline HTML page. Charts are Altair (Vega-Lite) specs
drawn by `charts.vega`; a dot's tooltip shows the image's thumbnail (its `image` field) and a
click on it dispatches `gl-vega-click` with the dot's datum (the image's key). Markup:
templates/explore.html."""
from __future__ import annotations

import hashlib
import math
import time

from .. import __version__
from ..methods import explore as method
from . import Markup, charts, macro, render, static, thumbnail_data_uri
from .charts import PALETTE
from .distilled import sources_html
from .single_prompt import axes_html, axis_html

STRIPS_ID = "explore-strips"
SCALES = ("probability", "log-odds")   # the strips' x axis: the score, or ln(s / (1 − s))
SHOWN_DEPTH = 24                       # the tree view nests this many levels; deeper nodes are folded (issue 43)
LOG_ODDS_EDGE = 1e-6                   # scores are stored to 6 decimals: 0 and 1 are read as 1e-6 and 1 − 1e-6


def _alt():
    import altair as alt   # imported on first chart

    return alt


def _jitter(key: str) -> float:
    """A fixed offset in [-1, 1] per image (from its key), so dots of equal score do not hide each other."""
    return int(hashlib.sha1(key.encode()).hexdigest()[:6], 16) / 0x7FFFFF - 1.0


def log_odds(score: float) -> float:
    """ln(s / (1 − s)) of a score, with s kept within [LOG_ODDS_EDGE, 1 − LOG_ODDS_EDGE]."""
    s = min(max(float(score), LOG_ODDS_EDGE), 1 - LOG_ODDS_EDGE)
    return math.log(s / (1 - s))


def _x(score, scale: str):
    """A score where `scale` puts it (None stays None)."""
    return None if score is None else (log_odds(score) if scale == "log-odds" else float(score))


BEESWARM_LANES = 13                    # lanes across a strip: 0, ±1, ..., ±6


def beeswarm(values: list[float], width: float, lanes: int = BEESWARM_LANES) -> list[int]:
    """A lane per value (0, 1, -1, 2, -2, ...): values within `width` of the first of their run share a bin and
    take the bin's lanes in turn (after `lanes` of them the lanes repeat), so dots of equal scores stack across
    the strip instead of hiding each other (a beeswarm, in O(n log n))."""
    order = [0] + [s * k for k in range(1, lanes // 2 + 1) for s in (1, -1)]
    out = [0] * len(values)
    start, taken = None, 0
    for i in sorted(range(len(values)), key=lambda i: (values[i], i)):
        if start is None or values[i] - start >= width:
            start, taken = values[i], 0
        out[i] = order[taken % len(order)]
        taken += 1
    return out


def strip_rows(images: list[dict], concepts: list[str], thumbs: dict | None = None, group: str = "",
               scale: str = "probability") -> list[dict]:
    """One row per (image, concept) with a score: the strips' data (concept, score, x: where `scale` puts it,
    seed, key, nearest, image: the thumbnail's URL, lane: its beeswarm lane on the strip, group)."""
    rows = []
    for item in images:
        for c in concepts:
            score = (item.get("scores") or {}).get(c)
            if score is None:
                continue
            rows.append({"concept": c, "score": score, "x": _x(score, scale), "seed": item.get("seed"),
                         "key": item.get("key"), "nearest": item.get("nearest", ""),
                         "image": (thumbs or {}).get(item.get("key"), ""), "group": group})
    for c in concepts:   # dots a dot's width apart (1/60 of the axis) get lanes of their own
        mine = [r for r in rows if r["concept"] == c]
        span = max([r["x"] for r in mine], default=1) - min([r["x"] for r in mine], default=0)
        for r, lane in zip(mine, beeswarm([r["x"] for r in mine], max(span, 1.0 if scale != "log-odds" else 2) / 60)):
            r["lane"] = lane
    return rows


def _domain(values: list[float], scale: str) -> list[float]:
    """The x axis' domain: [0, 1] for probabilities, the values' range for log-odds, padded by 4% on either
    side so that no dot or tick at an end is cut in half."""
    low, high = (0.0, 1.0) if scale != "log-odds" else (min(values, default=-1.0), max(values, default=1.0))
    if high - low < 1e-9:
        low, high = low - 1, high + 1
    pad = 0.04 * (high - low)
    return [low - pad, high + pad]


X_TITLES = {"probability": "score: softmax over the concepts of {scale} · cosine (CLIP's zero-shot probability)",
            "log-odds": "log-odds of the score, ln(s / (1 − s)): 0 is even, ±2.2 is 0.9 / 0.1, ±4.6 is 0.99 / 0.01"}


def strips_chart(rows: list[dict], concepts: list[str], strips: dict | None = None, title: str = "",
                 scale: str = "probability", logit_scale: float = 100):
    """One horizontal strip per concept: a dot per image at its score (colour: its nearest concept; dots of
    equal score side by side across the strip, `beeswarm`), the median as a black tick and its 95% interval
    as a black rule drawn over the dots. `scale`: "probability" (the score) or "log-odds" (`log_odds`); the
    axis is padded so that nothing at an end is cut. Returns the Vega-Lite spec (a dict): the rows go in as
    its named `datasets`, which Altair need not walk (a thousand dots)."""
    alt = _alt()
    y = alt.Y("concept:N", sort=concepts, title=None, axis=alt.Axis(labelLimit=180))
    summary = [{"concept": c, "median": v.get("median"), "lo": v["ci"][0], "hi": v["ci"][1],
                "x": _x(v.get("median"), scale), "x_lo": _x(v["ci"][0], scale), "x_hi": _x(v["ci"][1], scale)}
               for c, v in (strips or {}).items() if v.get("median") is not None]
    x_scale = alt.Scale(domain=_domain([r["x"] for r in rows] + [r["x"] for r in summary]
                                       + [r[k] for r in summary for k in ("x_lo", "x_hi") if r[k] is not None],
                                       scale), nice=False, zero=False)
    lanes = max([abs(r.get("lane", 0)) for r in rows], default=0)
    colour = alt.Color("nearest:N", scale=alt.Scale(domain=concepts, range=PALETTE[:len(concepts)]),
                       title="nearest concept", legend=alt.Legend(orient="bottom", labelLimit=260))
    dots = alt.Chart(alt.Data(name="dots")).mark_circle(size=64, opacity=0.75, cursor="pointer").encode(
        x=alt.X("x:Q", scale=x_scale, title=X_TITLES.get(scale, X_TITLES["probability"]).format(
            scale=f"{logit_scale:g}")),
        y=y, yOffset=alt.YOffset("lane:Q", scale=alt.Scale(domain=[-max(lanes, 3) - 1, max(lanes, 3) + 1])),
        color=colour,
        tooltip=[alt.Tooltip("seed:Q"), alt.Tooltip("concept:N"), alt.Tooltip("score:Q", format=".3f"),
                 alt.Tooltip("image:N")])
    layers = [dots]   # the median and its interval over the dots, outlined in white so they show on them
    if summary:
        base = alt.Chart(alt.Data(name="summary"))
        # the median and its interval let the pointer through to the dots under them (CSS: g[class*=gl_passive]);
        # the lean table gives their numbers
        layers += [base.mark_rule(color="white", strokeWidth=6, opacity=0.8).encode(
                       x=alt.X("x_lo:Q", scale=x_scale), x2="x_hi:Q", y=y).properties(name="gl_passive_halo"),
                   base.mark_rule(color="black", strokeWidth=2).encode(
                       x=alt.X("x_lo:Q", scale=x_scale), x2="x_hi:Q", y=y).properties(name="gl_passive_interval"),
                   base.mark_tick(color="black", thickness=3, size=30, stroke="white", strokeWidth=1).encode(
                       x=alt.X("x:Q", scale=x_scale), y=y).properties(name="gl_passive_median")]
    spec = alt.layer(*layers).properties(width=560, height=alt.Step(64), title=title or alt.Undefined).to_dict()
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
    scale = alt.Scale(domain=[-0.05, 1.05], nice=False)
    chart = alt.Chart(alt.Data(name="dots")).mark_point(filled=True, size=80, opacity=0.7, cursor="pointer").encode(
        x=alt.X("x:Q", scale=scale, title=f"score for '{concepts[0]}'"),
        y=alt.Y("y:Q", scale=scale, title=f"score for '{versus[0]}'"),
        color=alt.Color("nearest:N", scale=alt.Scale(domain=concepts, range=PALETTE[:len(concepts)]),
                        title="nearest concept, first axis (colour)",
                        legend=alt.Legend(orient="bottom", labelLimit=200, titleLimit=300)),
        shape=alt.Shape("versus_nearest:N", scale=alt.Scale(domain=versus), title="nearest concept, second axis (shape)",
                        legend=alt.Legend(orient="bottom", labelLimit=200, titleLimit=300)),
        tooltip=[alt.Tooltip("seed:Q"), alt.Tooltip("score_x:Q", title=concepts[0], format=".3f"),
                 alt.Tooltip("score_y:Q", title=versus[0], format=".3f"), alt.Tooltip("image:N")],
    ).properties(width=360, height=360, title="two axes: each image by its scores")
    spec = chart.to_dict()
    spec["datasets"] = {"dots": rows}
    return spec


def inverse_chart(sets: list[dict], concepts: list[str]):
    """The inverse queries side by side (issue 42, as ViBEx compares test concepts between its anchors): a
    row per set (the node's own images first, then each test concept's), and on it the share of the set's
    images nearest to each concept (the anchors, by colour) with its 95% interval; the dashed line is the
    even share 1/k. `sets`: [{"set", "lean"}]. Returns the Vega-Lite spec."""
    alt = _alt()
    rows = [{"set": s["set"], "concept": c, "share": v["share"], "lo": v["ci"][0], "hi": v["ci"][1],
             "count": v.get("count", 0)}
            for s in sets for c, v in (s["lean"] or {}).items() if isinstance(v, dict) and v.get("share") is not None]
    order = [s["set"] for s in sets]
    y = alt.Y("set:N", sort=order, title=None, axis=alt.Axis(labelLimit=300))
    x_scale = alt.Scale(domain=[-0.04, 1.04], nice=False)
    colour = alt.Color("concept:N", scale=alt.Scale(domain=concepts, range=PALETTE[:len(concepts)]),
                       title="anchor concept", legend=alt.Legend(orient="bottom", labelLimit=260))
    offset = alt.YOffset("concept:N", sort=concepts)
    tip = [alt.Tooltip("set:N"), alt.Tooltip("concept:N"), alt.Tooltip("share:Q", format=".2f"),
           alt.Tooltip("lo:Q", title="95% CI low", format=".2f"), alt.Tooltip("hi:Q", title="95% CI high", format=".2f"),
           alt.Tooltip("count:Q", title="images")]
    base = alt.Chart(alt.Data(values=rows))
    even = alt.Chart(alt.Data(values=[{"even": method.even_share(len(concepts))}])).mark_rule(
        strokeDash=[4, 4], color="#666").encode(x=alt.X("even:Q", scale=x_scale))
    chart = alt.layer(
        even,
        base.mark_rule(strokeWidth=2).encode(x=alt.X("lo:Q", scale=x_scale), x2="hi:Q", y=y, yOffset=offset,
                                             color=colour, tooltip=tip),
        base.mark_point(filled=True, size=70).encode(
            x=alt.X("share:Q", scale=x_scale, title="share of the set's images nearest to each concept (95% interval)"),
            y=y, yOffset=offset, color=colour, tooltip=tip),
    ).properties(width=520, height=alt.Step(18 * max(len(concepts), 2)),
                 title="inverse queries side by side: where each set sits between the concepts")
    return chart.to_dict()


def vega_chart(chart, chart_id: str) -> Markup:
    """The chart (Altair, or a Vega-Lite dict) as the pages' `<div class="gl-vega">` (charts.vega)."""
    return charts.vega(chart, chart_id=chart_id)


def lean_rows(lean: dict, strips: dict | None = None) -> list[dict]:
    """The lean table's rows: concept, share, interval, count, and with `strips` the strip's median score and
    its interval (largest share first)."""
    rows = [{"concept": c, "share": v.get("share"), "ci": v.get("ci") or [None, None], "count": v.get("count", 0),
             "strip": (strips or {}).get(c)}
            for c, v in (lean or {}).items() if isinstance(v, dict)]
    return sorted(rows, key=lambda r: -(r["share"] or 0))


def distribution_text(axis: str, dist: dict) -> str:
    """"gender: 'male' 0.75 [0.62, 0.86]": an axis' most frequent answer with its interval ('' when none)."""
    rows = lean_rows(dist)
    if not rows or rows[0]["share"] is None:
        return ""
    top = rows[0]
    lo, hi = top["ci"]
    interval = f" [{lo:.2f}, {hi:.2f}]" if lo is not None and hi is not None else ""
    return f"{axis}: '{top['concept']}' {top['share']:.2f}{interval}"


def lean_text(lean: dict) -> str:
    """"leans 'a photo of a man' 0.71 [0.62, 0.80]", or "no clear lean: ..." when the interval includes the
    even share (engine.methods.explore.lean_claim: the one rule); '' when nothing was measured."""
    return method.lean_text(lean)


def page(results: dict, thumbs: dict | None = None, scale: str = "probability") -> Markup:
    """An Explore step: the strips with the lean, then the inverse queries side by side and each one's lean
    and strips. `thumbs`: image key -> thumbnail URL for the dots' tooltips (none: no thumbnails); `scale`:
    the strips' x axis (SCALES)."""
    concepts = results.get("concepts") or []
    images = results.get("images") or []
    norm = results.get("normalisation") or {}
    logit_scale = norm.get("logit_scale", 100)
    scale = scale if scale in SCALES else "probability"
    strips = strips_chart(strip_rows(images, concepts, thumbs, scale=scale), concepts, results.get("strips"),
                          f"{len(images)} images of '{results.get('prompt', '')}'", scale, logit_scale) \
        if concepts else ""
    inverse = []
    for test, lean in (results.get("inverse") or {}).items():
        placed = (results.get("inverse_sets") or {}).get(test) or {}
        chart = strips_chart(strip_rows(placed.get("images") or [], concepts, thumbs, scale=scale), concepts, None,
                             f"images of '{placed.get('prompt', test)}'", scale, logit_scale)
        inverse.append({"test": test, "prompt": placed.get("prompt", ""), "rows": lean_rows(lean),
                        "text": method.lean_sentence(lean, f"The set of '{test}'"),
                        "chart": vega_chart(chart, f"explore-inverse-{len(inverse)}")})
    compared = None
    if inverse:   # the test concepts side by side, with the node's own images as the reference
        sets = [{"set": f"this node: '{results.get('prompt', '')}'", "lean": results.get("lean")}] + [
            {"set": f"inverse: '{test}'", "lean": lean} for test, lean in (results.get("inverse") or {}).items()]
        compared = {"chart": vega_chart(inverse_chart(sets, concepts), "explore-inverse-compared"),
                    "rows": [{"set": s["set"], "n": method.measured(s["lean"]), "text": lean_text(s["lean"]),
                              "cells": [(s["lean"] or {}).get(c) or {} for c in concepts]} for s in sets]}
    versus = results.get("versus") or []
    second = None
    if versus and concepts:
        rows = [{**i, "scores": i.get("versus_scores"), "nearest": i.get("versus_nearest", "")} for i in images]
        second = {"concepts": versus, "lean": lean_rows(results.get("versus_lean"), results.get("versus_strips")),
                  "text": method.lean_sentence(results.get("versus_lean") or {}),
                  "strips": vega_chart(strips_chart(strip_rows(rows, versus, thumbs, scale=scale), versus,
                                                    results.get("versus_strips"), "the second axis", scale,
                                                    logit_scale), "explore-versus-strips"),
                  "scatter": vega_chart(scatter_chart(images, concepts, versus, thumbs), "explore-scatter")}
    return macro("explore.html", "page")(
        prompt=results.get("prompt", ""), source_run=results.get("source_run", ""), concepts=concepts,
        lean=lean_rows(results.get("lean"), results.get("strips")), text=method.lean_sentence(results.get("lean") or {}),
        excluded=results.get("excluded", 0), strips=vega_chart(strips, STRIPS_ID) if strips else "",
        inverse=inverse, compared=compared, second=second, scale=logit_scale, strip_scale=scale,
        axes=axes_html(axis_html(name, m) for name, m in (results.get("axes") or {}).items())
        + sources_html(results.get("answer_sources")) if results.get("axes") else "")


def tree_html(nodes: list[dict], selected: str = "") -> Markup:
    """The hypothesis tree as nested lists, built without recursion (issue 43: a 1,000-node chain): each
    node's prompt, what it holds (`engine.methods.explore.node_holds`), its lean and its inverse queries'
    leans. Levels deeper than SHOWN_DEPTH are folded, and a line says how many nodes that folded (they stay in
    the node picker), as it says where the walk of the tree stopped (the root's "cut")."""
    ids = {n["id"] for n in nodes}
    children: dict[str, list[dict]] = {}
    for n in nodes:
        children.setdefault(n["parent"] if n["parent"] in ids and n["parent"] != n["id"] else "", []).append(n)
    items, folded, seen = [], [], set()
    todo = [(n, 0) for n in reversed(children.get("", []))]    # depth first, oldest child first
    while todo:
        n, depth = todo.pop()
        if n["id"] in seen:
            continue
        seen.add(n["id"])
        todo += [(c, depth + 1) for c in reversed(children.get(n["id"], []))]
        if depth >= SHOWN_DEPTH:
            folded.append(n)
            continue
        items.append({**n, "level": depth, "text": lean_text(n.get("lean")), "holds": method.node_holds(n),
                      "inverse_text": [(t, lean_text(lean)) for t, lean in (n.get("inverse") or {}).items()],
                      "axes_text": [distribution_text(a, d) for a, d in (n.get("axes") or {}).items()]})
    for i, item in enumerate(items):   # how many lists open before an item, and close after it
        following = items[i + 1]["level"] if i + 1 < len(items) else 0
        item["opens"] = following > item["level"]
        item["closes"] = max(item["level"] - following, 0)
    notes = [n["cut"] for n in nodes[:1] if n.get("cut")]
    if folded:
        notes.append(f"{len(folded)} node(s) more than {SHOWN_DEPTH} levels deep are folded here; pick them in the "
                     f"node picker" + (" (the selected node is one of them)" if selected in {f['id'] for f in folded}
                                       else ""))
    return macro("explore.html", "tree")(items=items, selected=selected, notes=notes)


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
    tree, pages = method.tree_and_results(engine, tree_id)   # the nodes' results read with the tree, not again
    thumbs = {}
    for results in pages.values():
        for image in method.node_images(results):
            if image["key"] in thumbs:   # a child scoring its parent's images shows them again
                continue
            try:
                thumbs[image["key"]] = thumbnail_data_uri(image["path"], 96)
            except (OSError, KeyError):
                pass   # an image no longer in the store: its dot has no thumbnail
    return tree_page(tree, pages, thumbs)


def image_panel(record, key: str, scores: dict, caption: str, answers: list[dict], cant_tell_below: float,
                labels: dict[str, str] | None = None) -> Markup:
    """A clicked dot's image panel: seed, prompt, its scores on the concepts, its caption, and every stored
    answer credited to its evaluator, by the name in `labels` ({model id: name}) where it has one, with the
    probabilities behind it and "can't tell" where its top probability is below `cant_tell_below` (issue 42).
    `answers`: the store's rows (evaluator, question, answer, probs as JSON text)."""
    import json

    rows = []
    for a in answers:
        try:
            probs = json.loads(a.get("probs") or "{}") or {}
        except ValueError:
            probs = {}
        probs = {str(c): float(p) for c, p in probs.items() if isinstance(p, (int, float))}
        cant_tell = bool(probs) and max(probs.values()) < cant_tell_below
        rows.append({"evaluator": a.get("evaluator", ""), "question": a.get("question", ""),
                     "answer": "can't tell" if cant_tell else a.get("answer", ""), "said": a.get("answer", ""),
                     "cant_tell": cant_tell, "probs": sorted(probs.items(), key=lambda kv: -kv[1])})
    by_evaluator: dict[str, list[dict]] = {}
    for r in rows:
        by_evaluator.setdefault(r["evaluator"], []).append(r)
    return macro("explore.html", "image_panel")(seed=record.seed, prompt=record.prompt, key=key,
                                                scores=sorted((scores or {}).items(), key=lambda kv: -kv[1]),
                                                caption=caption, evaluators=by_evaluator,
                                                labels=labels or {}, threshold=cant_tell_below)


def clusters_html(clusters: dict, thumbs: dict | None = None) -> Markup:
    """Identity clusters: each cluster's size and most central thumbnails, and the share of each group's
    images that falls in it, with its interval (a table and a heat map; groups in the order picked)."""
    alt = _alt()
    groups = [g["label"] for g in clusters["groups"]]
    rows = [{"cluster": f"cluster {i + 1}", "group": g, "share": v["share"], "lo": v["ci"][0], "hi": v["ci"][1],
             "count": v["count"]}
            for i, c in enumerate(clusters["clusters"]) for g, v in c["shares"].items()]
    heat = alt.Chart(alt.Data(values=rows)).mark_rect().encode(
        x=alt.X("cluster:N", title=None, sort=None),
        y=alt.Y("group:N", title=None, sort=groups, axis=alt.Axis(labelLimit=320)),
        color=alt.Color("share:Q", scale=alt.Scale(domain=[0, 1], scheme="blues"),
                        title="share of the group's images"),
        tooltip=[alt.Tooltip("group:N"), alt.Tooltip("cluster:N"), alt.Tooltip("share:Q", format=".2f"),
                 alt.Tooltip("lo:Q", title="95% CI low", format=".2f"),
                 alt.Tooltip("hi:Q", title="95% CI high", format=".2f"), alt.Tooltip("count:Q", title="images")]
    ).properties(title="the share of each group's images in each cluster (a row sums to 1)", width=alt.Step(70),
                 height=alt.Step(24))
    cells = [{"n": i + 1, "size": c["size"],
              "thumbs": [{"url": (thumbs or {}).get(img["key"], ""), "seed": img["seed"], "prompt": img["prompt"]}
                         for img in c["central"]],
              "shares": [(g, c["shares"][g]) for g in groups if g in c["shares"]],
              "sizes": {g["label"]: g["n"] for g in clusters["groups"]}} for i, c in enumerate(clusters["clusters"])]
    return macro("explore.html", "clusters")(clusters=cells, groups=groups,
                                             k=clusters["k"], chart=vega_chart(heat, "explore-clusters"))
