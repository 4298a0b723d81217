"""The Single Prompt page: per-axis distributions and metrics, diversity, the gap score and
Top-K concepts (the tab, the Runs view, exported reports). Markup: templates/single_prompt.html."""
from __future__ import annotations

from ..common.meanings import equal_by_construction
from . import Markup, charts, clip, explain, fmt, macro, trust, with_cant_tell
from .distilled import sources_html

METRICS = [("Composite Bias Score", "composite_bias_score"), ("Parity Difference", "parity_difference"),
           ("Normalised entropy", "normalised_entropy"), ("KL from reference", "kl_divergence"),
           ("Bias Amplification", "bias_amplification")]


def axis_html(name: str, m: dict) -> Markup:
    """One axis: its distribution (bars with counts and 95% CIs, target ticks) and its metrics."""
    classes = m["classes"]
    counts = m["counts"]
    shares = [m["representation_parity"].get(c, 0.0) for c in classes]
    share_ci = [tuple(m["share_ci"][c]) for c in classes] if "share_ci" in m else None
    ref = m.get("reference")
    targets = ([ref.get(c) for c in classes] if isinstance(ref, dict)
               else [1 / len(classes)] * len(classes) if classes else None)
    corrected = m.get("distribution") == "corrected"   # issue 16: the spot-check-corrected shares
    title = f"{name} (corrected for the evaluator's errors)" if corrected else str(name)
    bar_counts = [counts.get(c, 0) for c in classes]
    n_classes = len(classes)
    classes, shares, bar_counts, share_ci = with_cant_tell(m, classes, shares, bar_counts, share_ci)
    chart = charts.bar_chart(classes, shares, title=title, counts=bar_counts,
                             ci=share_ci, reference=targets, vmax=1.0, chart_id=f"axis-{name}", x_title="share of images")
    ci = m.get("ci", {})
    same = equal_by_construction(n_classes, ref if isinstance(ref, dict) and m.get("mode") == "paper" else None)
    rows = [{"label": label + (f" ({m.get('kl_unit', '')})" if key == "kl_divergence" else "")
             + (" (= parity difference: two classes)" if same and key == "bias_amplification" else ""),
             "key": key, "tip": explain.tip(key) + (f" {same}" if same and key == "bias_amplification" else ""),
             "value": m.get(key), "ci": ci.get(key)} for label, key in METRICS]
    answered = m.get("n")   # 0: nothing to measure, one sentence rather than a table of n/a
    return macro("single_prompt.html", "axis")(name=name, chart=chart, mode=m.get("mode", ""), rows=rows,
                                                n_excluded=m.get("n_excluded"), cant_tell=m.get("cant_tell") or 0,
                                                cant_tell_note=m.get("cant_tell_note", ""), answered=answered,
                                                extras=trust.axis_extras_html(name, m) if answered != 0 else "")


def axes_html(blocks) -> Markup:
    """Axis blocks (from `axis_html`) side by side, then what their metrics mean."""
    blocks = list(blocks)
    return macro("single_prompt.html", "axes")(blocks, explain.info([key for _, key in METRICS], "sp-meanings")
                                               if blocks else "")


def evaluators_html(comparison: dict | None) -> Markup | str:
    """The other evaluators' agreement with the run's on its images (trust.comparison_html; issue 35),
    "" when none was asked."""
    return trust.comparison_html(comparison, element_id="sp-evaluators") if comparison else ""


def gap_reading(gap: dict) -> dict:
    """Returns two sentences that read a gap result's numbers the way they point: "score"
    (what its sign means here) and "least" (what the least-aligned images' matches mean)."""
    score, m = gap["score"], gap["coverage_term"]
    if gap.get("combine", "diff") == "diff":
        side = ("below 0: the missed readings are covered worse than the images are aligned, so some "
                "plausible readings of the prompt get no matching image (a sign of bias)" if score < 0 else
                "0 or above: the readings are covered about as well as the images are aligned (no sign of "
                "a missed reading)")
        text = f"Lower means more biased; B = M − A = {fmt(score, 4)} is {side}."
    else:
        text = "Lower means more biased: some plausible readings of the prompt get no matching image."
    worst = min((x["alignment"] for x in gap.get("least_aligned", [])), default=None)
    least = ""
    if worst is not None and worst >= m:
        least = ("Even these match some variation better than the missed readings match any image: the bias "
                 "is in the readings no image shows, not in off-prompt images.")
    return {"score": text, "least": least}


def gap_html(gap: dict) -> Markup:
    """Gap score, its terms, the missed interpretations, the least-aligned images and the heatmap."""
    order = sorted(range(len(gap["variations"])), key=lambda i: gap["coverage"][i])
    variations = [clip(gap["variations"][i], 60) for i in order]
    seeds = [f"seed {s}" for s in gap["image_seeds"]]
    hover = [[f"{gap['variations'][i]} × image of seed {s}: similarity {fmt(gap['similarity'][i][j], 3)}"
              for j, s in enumerate(gap["image_seeds"])] for i in order]
    heat = charts.heatmap([gap["similarity"][i] for i in order], variations, seeds, diverging=False, digits=2,
                          title="CLIP similarity: text variations (rows, worst covered first) × images (columns)",
                          row_title="LLM text variation", col_title="image", legend="CLIP similarity", hover=hover,
                          table_id="gap-heatmap", max_size=420)
    return macro("single_prompt.html", "gap")(gap=gap, heat=heat, reading=gap_reading(gap), meaning=explain.tip("gap_score"))


def diversity_text(d: dict) -> str:
    """The diversity sentence as Markdown (for a gr.Markdown); numbers only, nothing to escape."""
    return (f"**Diversity** (CLIP image embeddings, N = {d['n']}): Vendi score **{fmt(d['vendi'], 2)}** of at most "
            f"{d['n']} (normalised {fmt(d['vendi_normalised'])}); mean pairwise similarity "
            f"{fmt(d['mean_pairwise_similarity'])}. *{explain.tip('vendi')}*")


def page(results: dict) -> Markup:
    """A whole Single Prompt result: axes, diversity, gap score and Top-K concepts."""
    axes = results.get("axes", {})
    return macro("single_prompt.html", "page")(
        prompt=results.get("prompt", ""), headline=trust.headline_html(results.get("headline")),
        axes=axes_html(axis_html(n, m) for n, m in axes.items()) if axes else "",
        diversity=results.get("diversity"), gap=gap_html(results["gap"]) if results.get("gap") else "",
        top_concepts=results.get("top_concepts") or [], notes=results.get("notes") or [],
        evaluators=evaluators_html(results.get("evaluators")), vendi_meaning=explain.tip("vendi"),
        sources=sources_html(results.get("answer_sources")))
