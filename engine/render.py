"""HTML renderings of method results, shared by the tabs, the Runs view and exported reports.

Plain strings (engine/charts.py for the charts): no gradio, no JavaScript, readable offline.
"""
from __future__ import annotations

import html

from . import charts


def fmt(value, digits: int = 3) -> str:
    if value is None or (isinstance(value, float) and value != value):
        return "n/a"
    return f"{value:.{digits}f}"


def fmt_ci(value, ci, digits: int = 3) -> str:
    lo, hi = ci if ci else (None, None)
    return f"{fmt(value, digits)} [{fmt(lo, digits)}, {fmt(hi, digits)}]"


def axis_html(name: str, m: dict) -> str:
    """One axis: its distribution (bars with counts and 95% CIs, target ticks) and its metrics."""
    classes = m["classes"]
    counts = m["counts"]
    shares = [m["representation_parity"].get(c, 0.0) for c in classes]
    share_ci = [tuple(m["share_ci"][c]) for c in classes] if "share_ci" in m else None
    ref = m.get("reference")
    targets = ([ref.get(c) for c in classes] if isinstance(ref, dict)
               else [1 / len(classes)] * len(classes) if classes else None)
    chart = charts.bar_chart(classes, shares, title=f"{name}", counts=[counts.get(c, 0) for c in classes],
                             ci=share_ci, reference=targets, vmax=1.0, chart_id=f"axis-{name}")
    ci = m.get("ci", {})
    rows = [("Composite Bias Score", "composite_bias_score"), ("Parity Difference", "parity_difference"),
            ("Normalised entropy", "normalised_entropy"),
            (f"KL from reference ({m.get('kl_unit', '')})", "kl_divergence"),
            ("Bias Amplification", "bias_amplification")]
    table = "".join(f"<tr><td>{label}</td><td class='gl-metric' data-metric='{key}'>"
                    f"{fmt_ci(m.get(key), ci.get(key))}</td></tr>" for label, key in rows)
    excluded = (f"<p style='font-size:12px'>{m['n_excluded']} answer(s) outside the classes "
                f"(e.g. 'other') are excluded.</p>" if m.get("n_excluded") else "")
    return (f"<div class='gl-axis' data-axis='{name}'><div class='gl-chart'>{chart}</div>"
            f"<table style='font-size:13px'><tr><th>metric ({m.get('mode', '')} mode)</th><th>value [95% CI]</th></tr>"
            f"{table}</table>{excluded}</div>")


def gap_html(gap: dict) -> str:
    """Gap score, its terms, the missed interpretations, the least-aligned images and the heatmap."""
    missed = "".join(f"<li data-coverage='{m['coverage']:.3f}'>{html.escape(m['text'])} "
                     + (f"<span class='gl-badge'>written {m['times']}×</span> " if m.get("times", 1) > 1 else "")
                     + f"<span class='gl-badge'>best image match {m['coverage']:.3f}</span></li>"
                     for m in gap["missed"])
    least = ", ".join(f"seed {x['seed']} (best match {x['alignment']:.3f})" for x in gap["least_aligned"])
    reading = gap_reading(gap)
    order = sorted(range(len(gap["variations"])), key=lambda i: gap["coverage"][i])
    matrix = [gap["similarity"][i] for i in order]
    rows = [gap["variations"][i][:60] for i in order]
    cols = [f"s{s}" for s in gap["image_seeds"]]
    heat = charts.heatmap(matrix, rows, cols, diverging=False, digits=2, title="CLIP similarity: text variations "
                          "(rows, worst covered first) × images (columns)", table_id="gap-heatmap")
    return (f"<div id='gap-panel'><h4>MineTheGap gap score <span class='gl-badge'>reconstructed (spec A.3)</span></h4>"
            f"<p><b id='gap-score'>{fmt(gap['score'], 4)}</b> "
            f"({gap['combine']}: M = {fmt(gap['coverage_term'], 4)} missed-concepts term, "
            f"A = {fmt(gap['alignment_term'], 4)} least-aligned-images term, α = {gap['alpha']:g}). "
            f"<span id='gap-reading'>{html.escape(reading['score'])}</span> "
            f"No bootstrap interval: resampling images with replacement lowers any coverage score; "
            f"rerun with other seeds to see its spread.</p>"
            f"<p><b>Missed interpretations</b> (variations no image covers):</p><ol id='missed'>{missed}</ol>"
            f"<p><b>Least-aligned images</b> (each image's best match with any variation; 1 = a perfect "
            f"match): {least}. <span id='gap-least-note'>{html.escape(reading['least'])}</span></p>"
            f"<details><summary>All {len(gap['variations'])} LLM text variations (the reference distribution)</summary>"
            f"<ol>{''.join(f'<li>{html.escape(v)}</li>' for v in gap['variations'])}</ol></details>"
            f"<div style='overflow-x:auto'>{heat}</div></div>")


def gap_reading(gap: dict) -> dict:
    """Returns two sentences that read a gap result's numbers the way they point: "score"
    (what its sign means here) and "least" (what the least-aligned images' matches mean)."""
    score, m, a = gap["score"], gap["coverage_term"], gap["alignment_term"]
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


def single_prompt_html(results: dict) -> str:
    """A whole Single Prompt result: axes, diversity, gap score and Top-K concepts."""
    parts = [f"<h3>Single Prompt: {html.escape(results.get('prompt', ''))}</h3>"]
    axes = results.get("axes", {})
    if axes:
        parts.append("<div style='display:flex;flex-wrap:wrap;gap:18px'>"
                     + "".join(axis_html(name, m) for name, m in axes.items()) + "</div>")
    d = results.get("diversity")
    if d:
        parts.append(diversity_text(d, markdown=False))
    if results.get("gap"):
        parts.append(gap_html(results["gap"]))
    if results.get("top_concepts"):
        rows = "".join(f"<tr><td>{html.escape(str(c))}</td><td>{f}</td></tr>" for c, f in results["top_concepts"])
        parts.append(f"<table><tr><th>concept</th><th>share of images</th></tr>{rows}</table>")
    return "\n".join(parts)


def diversity_text(d: dict, markdown: bool = True) -> str:
    bold = (lambda x: f"**{x}**") if markdown else (lambda x: f"<b>{x}</b>")
    text = (f"{bold('Diversity')} (CLIP image embeddings, N = {d['n']}): Vendi score "
            f"{bold(fmt(d['vendi'], 2))} of at most {d['n']} (normalised {fmt(d['vendi_normalised'])}); "
            f"mean pairwise similarity {fmt(d['mean_pairwise_similarity'])}.")
    return text if markdown else f"<p>{text}</p>"


def generate_html(results: dict) -> str:
    """A Generate run: its prompt, settings and images (the images themselves are shown by the
    caller: a gallery in the app, inline thumbnails in an exported report)."""
    images = results.get("images", [])
    settings = results.get("settings", {})
    seeds = [i.get("seed") for i in images]
    flagged = [i.get("seed") for i in images if i.get("nsfw")]
    rows = "".join(f"<tr><td>{html.escape(str(k))}</td><td>{html.escape(str(v))}</td></tr>"
                   for k, v in settings.items())
    seed_text = (f"seeds {seeds[0]}–{seeds[-1]}" if seeds and seeds == list(range(seeds[0], seeds[0] + len(seeds)))
                 else "seeds " + ", ".join(map(str, seeds)))
    flag_text = (f"<p>{len(flagged)} image(s) flagged by the safety checker (seeds {flagged}).</p>" if flagged else "")
    return (f"<h3>Generate: {html.escape(results.get('prompt', ''))}</h3>"
            f"<p id='generate-count'>{len(images)} image(s), {seed_text}.</p>{flag_text}"
            f"<table style='font-size:13px'><tr><th>setting</th><th>value</th></tr>{rows}</table>")


def generic_html(results: dict) -> str:
    """Any method's results without a renderer of their own: their numbers as a table (with the
    95% intervals found next to them) and a chart of the ones that have an interval, then the
    whole results as readable JSON."""
    import json

    from .runs import flatten_scores

    rows = flatten_scores(results)
    parts = []
    if results.get("prompt"):
        parts.append(f"<h3>{html.escape(str(results['prompt']))}</h3>")
    # bars start at 0: chart the (first 24) scores whose whole interval is non-negative
    with_ci = [s for s in rows if s.low is not None and s.high is not None and s.low >= 0 and s.value >= 0][:24]
    if with_ci:
        parts.append("<div class='gl-chart'>" + charts.bar_chart(
            [s.name[-40:] for s in with_ci], [s.value for s in with_ci], ci=[(s.low, s.high) for s in with_ci],
            title="scores with 95% intervals", chart_id="generic-scores", width=560) + "</div>")
    if rows:
        body = "".join(f"<tr><td>{html.escape(s.group)}</td><td>{html.escape(s.metric)}</td>"
                       f"<td class='gl-metric'>{fmt_ci(s.value, (s.low, s.high)) if s.low is not None else fmt(s.value)}"
                       f"</td></tr>" for s in rows)
        parts.append(f"<table class='gl-generic' style='font-size:13px'><tr><th>group</th><th>score</th>"
                     f"<th>value [95% CI]</th></tr>{body}</table>")
    else:
        parts.append("<p>No numeric results stored for this run.</p>")
    dump = json.dumps(results, indent=1, default=str, ensure_ascii=False)
    if len(dump) > 200_000:
        dump = dump[:200_000] + "\n… (truncated)"
    parts.append(f"<details><summary>All results (JSON)</summary><pre style='white-space:pre-wrap;font-size:11px'>"
                 f"{html.escape(dump)}</pre></details>")
    return "\n".join(parts)


# Renderers kept in their methods' own modules (imported when called: they import this one).
def counterfactuals_html(results: dict) -> str:
    from .render_tibet import counterfactuals_html as render_counterfactuals

    return render_counterfactuals(results)


def intersectional_html(results: dict) -> str:
    from .biasgraph import intersectional_html as render_intersectional

    return render_intersectional(results)


def mine_html(results: dict) -> str:
    from .render_mine import mine_html as render_mine

    return render_mine(results)


def mitigate_html(results: dict) -> str:
    from .render_mitigate import mitigate_html as render_mitigate

    return render_mitigate(results)
