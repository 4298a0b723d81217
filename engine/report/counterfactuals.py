"""The Counterfactuals (TIBET) page: MAD per axis, CAS per counterfactual, the concepts of the
initial set next to a counterfactual's, and the grid of generated sets (the tab, the Runs
view, reports). Markup: templates/counterfactuals.html."""
from __future__ import annotations

from . import Markup, charts, explain, fmt, fmt_ci, macro, trust

CAS_NOTE = ("CAS: how similar the concepts in a counterfactual's images are to those of the initial prompt's "
            "images (1 = identical); the initial images lean toward the high-CAS counterfactuals. Intervals "
            "resample images and sit below the value: a resample repeats images, which lowers any overlap.")
THUMBS_PER_SET = 8


MODE_NAMES = {"paper": "paper mode (the thesis's TIBET)", "reference": "reference mode (the authors' released code)"}


def rankings_differ(results: dict) -> dict[str, list[str]] | None:
    """{mode: axes by MAD} when the run's two modes (`results["modes"]`) rank its axes
    differently, else None."""
    orders = {m: v.get("mad_order") for m, v in (results.get("modes") or {}).items() if v}
    return orders if len(orders) == 2 and len({tuple(o or ()) for o in orders.values()}) == 2 else None


def mad_html(results: dict) -> Markup:
    """MAD per axis, most biased first, with 95% CIs; per-prompt MADs as a heatmap in aggregate
    mode; one sentence with both rankings when the paper and reference modes rank the axes differently."""
    order = results["mad_order"]
    mode = " (reference mode)" if results.get("mode") == "reference" else ""
    chart = charts.bar_chart(order, [results["mad"][a] for a in order], ci=[tuple(results["mad_ci"][a]) for a in order],
                             vmax=1.0, title=f"Bias strength: normalised MAD per axis{mode} (most biased first)",
                             chart_id="mad", width=420, x_title="MAD (0 = even, 1 = one counterfactual only)",
                             tooltip=[explain.tip("mad")] * len(order))
    heat = ""
    if results.get("aggregate"):
        prompts = list(results["per_prompt"])
        matrix = [[results["per_prompt"][p]["mad"].get(a) for a in order] for p in prompts]
        heat = charts.heatmap(matrix, prompts, order, diverging=False, title="MAD per prompt", table_id="mad-per-prompt")
    return macro("counterfactuals.html", "mad")(chart=chart, clip=[(a, results["mad_clip"][a]) for a in order],
                                                heat=heat, headline=trust.headline_html(results.get("headline")),
                                                rankings=rankings_differ(results),
                                                rescored=MODE_NAMES.get(results.get("rescored_from", ""), ""),
                                                mode=MODE_NAMES.get(results.get("mode", ""), ""),
                                                meanings=explain.info(["mad", "cas"], "cf-meanings"))


def cas_html(axes: dict[str, dict]) -> Markup:
    """One CAS chart per axis ({axis: {"mad", "counterfactuals"}}), bars with 95% CIs, most biased axis first."""
    blocks = []
    for axis, a in sorted(axes.items(), key=lambda kv: -(kv[1]["mad"] or 0.0)):
        cfs = a["counterfactuals"]
        blocks.append((axis, charts.bar_chart(
            [c["value"] for c in cfs], [c["cas"] for c in cfs], ci=[tuple(c["cas_ci"]) for c in cfs], vmax=1.0,
            width=300, title=f"{axis}: CAS per counterfactual (MAD {fmt(a['mad'], 2)})", chart_id=f"cas-{axis}",
            x_title="CAS", tooltip=[explain.tip("cas")] * len(cfs))))
    return macro("counterfactuals.html", "cas")(blocks=blocks, note=CAS_NOTE)


def by_axis(results: dict) -> dict[str, dict]:
    """{axis: {"mad", "counterfactuals"}} from a run's results (what `cas_html` draws)."""
    out = {a: {"mad": results["mad"][a], "counterfactuals": []} for a in results["mad"]}
    for c in results["counterfactuals"]:
        out[c["axis"]]["counterfactuals"].append(c)
    return out


def counterfactual_rows(results: dict) -> list[list[str]]:
    """Rows (axis, counterfactual prompt, CAS [CI], CAS CLIP [CI]) for a table."""
    return [[c["axis"], c["prompt"], fmt_ci(c["cas"], c["cas_ci"]), fmt_ci(c["cas_clip"], c["cas_clip_ci"])]
            for c in results["counterfactuals"]]


def initial_label(label: str) -> str:
    """The label of the initial set of the prompt a set label belongs to (cfsets.set_label): an
    initial set's own label, else its prompt's prefix ("prompt=<prompt>|" in aggregate mode) + "initial"."""
    if label == "initial" or label.endswith("|initial"):
        return label
    return label.split("axis=")[0] + "initial"


def _concepts(s: dict, axis: str | None, side: str) -> dict:
    words = list(s["histogram"])[:12]
    return {"side": side, "prompt": s["prompt"], "axis": axis, "top_k": [w for w, _ in s["top_k"]],
            "aligned": [w for w, _ in s["axis_top_k"].get(axis, [])] if axis else [],
            "chart": charts.bar_chart(words, [s["histogram"][w] for w in words], title=f"{side}: concepts per image",
                                      chart_id=f"concepts-{side}", width=360, bar_height=14)}


def drill_html(results: dict, label: str) -> Markup:
    """The initial set next to the set `label`: their concept histograms and Top-K lists (the
    initial set alone when `label` is one)."""
    chosen = results["sets"][label]
    initial = results["sets"][initial_label(label)]
    sides = [_concepts(initial, chosen["axis"], "initial")]
    if chosen is not initial:
        sides.append(_concepts(chosen, chosen["axis"], "counterfactual"))
    return macro("counterfactuals.html", "drill")(sides)


def sets_html(records_by_label: dict[str, list], url=lambda path: f"gradio_api/file={path}") -> Markup:
    """A grid of small image sets, one per prompt, in generation order (images served by Gradio:
    `url(path)` is an image's address)."""
    sets = []
    for label, records in records_by_label.items():
        shown = sorted(records, key=lambda r: r.seed)[:THUMBS_PER_SET]
        sets.append({"label": label, "title": label.split("|cf=")[-1] if "|cf=" in label else "initial prompt",
                     "images": [{"src": url(r.path), "seed": r.seed} for r in shown],
                     "more": len(records) - len(shown)})
    return macro("counterfactuals.html", "sets")(sets)


def modes_rows(results: dict) -> list[list[str]]:
    """Rows (axis, MAD in paper mode, MAD in reference mode), most biased first, from `results["modes"]`."""
    modes = results.get("modes") or {}
    if not all(modes.get(m) for m in MODE_NAMES):
        return []
    return [[a, *(fmt((modes[m].get("mad") or {}).get(a), 3) for m in MODE_NAMES)] for a in results["mad_order"]]


def page(results: dict) -> Markup:
    """A whole Counterfactuals run: MAD, CAS per counterfactual, the table, each set's Top-K."""
    return macro("counterfactuals.html", "page")(
        prompt=results.get("prompt", ""), n_prompts=len(results.get("prompts", [])), n=results.get("n"),
        mode=MODE_NAMES.get(results.get("mode", "paper"), ""), modes=modes_rows(results),
        questions=results.get("questions", {}), cant_tell=results.get("cant_tell", {}), mad=mad_html(results), cas=cas_html(by_axis(results)),
        rows=counterfactual_rows(results),
        top=[(label, [w for w, _ in s["top_k"]]) for label, s in results.get("sets", {}).items()])
