"""HTML of a Mitigate (InterMit) run, from its stored results alone (partial ones too): the
stop reason, τ per step against ε (measured and previewed), every step's w̄ bars before and
after with the mitigated axes outlined, the prompt set in use with its sampling weights,
trade-off alerts, the final per-axis report (initial vs final distribution with 95% CIs,
target ticks), the quality checks and the exported prompt set."""
from __future__ import annotations

import html
import json

from . import charts
from .render import fmt

ESC = html.escape


def _ci(ci) -> str:
    lo, hi = ci if ci else (None, None)
    return f"[{fmt(lo)}, {fmt(hi)}]"


def w_bar_chart(state: dict, axes: list[str], mitigated: list[str], title: str, chart_id: str) -> str:
    """w̄ per axis with 95% CIs; mitigated axes outlined and ticked."""
    w, ci = state.get("w_bar", {}), state.get("w_bar_ci", {})
    intervals = [tuple(x if x is not None else float("nan") for x in (ci.get(a) or (None, None))) for a in axes]
    labels = [f"✓ {a}" if a in mitigated else a for a in axes]   # outlined bars of w̄ = 0 are invisible
    return charts.bar_chart(labels, [w.get(a) if w.get(a) is not None else float("nan") for a in axes],
                            ci=intervals, highlight=[a in mitigated for a in axes], vmax=1.0, title=title,
                            chart_id=chart_id)


def tau_chart(results: dict) -> str:
    states = results.get("states", [])
    taus = [s.get("tau") if s.get("tau") is not None else float("nan") for s in states]
    series = {"measured": taus}
    preview = results.get("preview") or {}
    if preview.get("steps"):
        series["preview"] = [preview.get("tau0")] + [s["tau"] for s in preview["steps"]]
    n = max(len(v) for v in series.values())
    series[f"ε = {results.get('epsilon'):g}"] = [results.get("epsilon")] * max(n, 2)
    return charts.line_chart(series, title="τ = ⟨w̄_B*, p⟩ per step (dots) against ε", x_label="step",
                             chart_id="mitigate-tau", width=460)


def prompt_set_table(prompt_set: list[dict], limit: int = 40) -> str:
    rows = "".join(f"<tr><td>{ESC(p['prompt'])}</td><td>{p['weight']:.3f}</td><td>{p.get('n', '')}</td></tr>"
                   for p in prompt_set[:limit])
    more = f"<tr><td colspan=3>… {len(prompt_set) - limit} more</td></tr>" if len(prompt_set) > limit else ""
    return (f"<table class='gl-mit-prompts' style='font-size:12px'><tr><th>prompt in use</th><th>sampling weight</th>"
            f"<th>images</th></tr>{rows}{more}</table>")


def _alerts(alerts: list[dict]) -> str:
    items = "".join(
        f"<li data-axis='{ESC(a['axis'])}' data-step='{a['step']}'>step {a['step']}: <b>{ESC(a['axis'])}</b> w̄ "
        f"{fmt(a['before'])} → {fmt(a['after'])} (change {a['change']:+.3f}, 95% CI {_ci(a.get('change_ci'))}"
        f"{'' if a.get('significant') else ', within sampling noise'}"
        + (f"; worse in {a['probability_worse']:.0%} of resamples" if a.get("probability_worse") is not None else "")
        + ")</li>" for a in alerts)
    return f"<ul class='gl-mit-tradeoffs'>{items}</ul>" if alerts else "<p>No axis got worse.</p>"


def step_html(results: dict, step: dict, before: dict, after: dict) -> str:
    """One step: γ per candidate, w̄ bars before and after, S's prediction, the prompt set, alerts."""
    axes = list(results.get("axes", {}))
    t, axis = step["step"], step["axis"]
    mitigated = step.get("mitigated", [])
    outside = "" if step.get("in_targets", True) else " <span class='gl-badge'>outside B*</span>"
    ranked = sorted((step.get("gamma") or {}).items(), key=lambda kv: -(kv[1] if kv[1] is not None else -9))
    gammas = ", ".join(f"{ESC(a)} {fmt(g)}" for a, g in ranked)
    small = "<p style='font-size:12px'>"
    parts = [f"<div class='gl-mit-step' id='mt-step-{t}' data-step='{t}' data-axis='{ESC(axis)}'>",
             f"<h4>Step {t}: mitigated <b>{ESC(axis)}</b>{outside}: τ {fmt(step.get('tau_before'))} → "
             f"<b>{fmt(step.get('tau'))}</b> {_ci(step.get('tau_ci'))}</h4>"]
    if gammas:
        parts.append(f"{small}γ (alignment of each candidate's row of S with p): {gammas}</p>")
    before_chart = w_bar_chart(before, axes, mitigated[:-1], f"w̄ before step {t}", f"mitigate-step-{t}-before")
    after_chart = w_bar_chart(after, axes, mitigated, f"w̄ after step {t}", f"mitigate-step-{t}-after")
    parts.append(f"<div style='display:flex;flex-wrap:wrap;gap:12px'><div class='gl-chart'>{before_chart}</div>"
                 f"<div class='gl-chart'>{after_chart}</div></div>")
    predicted = step.get("predicted_w_bar")
    if predicted:
        values = ", ".join(f"{ESC(a)} {fmt(v)}" for a, v in predicted.items())
        parts.append(f"{small}Predicted by S (w̄ after, row {ESC(axis)}): {values}; "
                     f"τ {fmt(step.get('predicted_tau'))}</p>")
    parts += [prompt_set_table(step.get("prompt_set", [])), f"{small}<b>Trade-offs:</b></p>",
              _alerts(step.get("tradeoffs", [])), "</div>"]
    return "".join(parts)


def preview_html(preview: dict | None) -> str:
    if not preview:
        return ""
    rows = "".join(f"<tr data-axis='{ESC(s['axis'])}'><td>{s['step']}</td><td>{ESC(s['axis'])}</td>"
                   f"<td>{fmt((s.get('gamma') or {}).get(s['axis']))}</td><td>{fmt(s['tau'])}</td></tr>"
                   for s in preview.get("steps", []))
    stop = f"<span id='mt-preview-stop' data-reason='{ESC(str(preview.get('stop')))}'>" \
           f"{ESC(preview.get('message', ''))}</span>"
    return (f"<div id='mt-preview'><h4>Preview (from the sensitivity matrix only, no mitigated image)</h4>"
            f"<p>τ now {fmt(preview.get('tau0'))}, ε = {fmt(preview.get('epsilon'), 2)}. Predicted: {stop}.</p>"
            f"<table style='font-size:13px'><tr><th>step</th><th>axis</th><th>γ</th><th>predicted τ</th></tr>"
            f"{rows}</table><p style='font-size:12px'>Later steps compose the first step's effects additively "
            f"(w̄ − IS, clipped to [0, 1]); the run re-measures S before every further step.</p></div>")


def report_html(results: dict) -> str:
    report = results.get("report") or {}
    if not report:
        return ""
    cells = []
    for axis, r in report.items():
        charts_ = []
        for which in ("initial", "final"):
            d = r[which]
            ci = [(lo if lo is not None else float("nan"), hi if hi is not None else float("nan"))
                  for lo, hi in zip(d["low"], d["high"])]
            charts_.append(charts.bar_chart(d["values"], [s if s is not None else float("nan") for s in d["shares"]],
                                            counts=d["counts"], ci=ci, reference=r["ideal"], vmax=1.0, width=360,
                                            title=f"{axis}: {which}", chart_id=f"mitigate-final-{axis}-{which}"))
        badge = " <span class='gl-badge'>B*</span>" if r.get("in_targets") else ""
        cells.append(f"<div class='gl-mit-axis' data-axis='{ESC(axis)}'><p><b>{ESC(axis)}</b>{badge}: w̄ "
                     f"{fmt(r['w_bar_initial'])} → <b>{fmt(r['w_bar_final'])}</b></p>"
                     f"<div style='display:flex;flex-wrap:wrap;gap:8px'>{''.join(charts_)}</div></div>")
    return ("<div id='mt-report'><h4>Final report: initial vs final distribution of every axis (95% CIs; "
            "dashed ticks: the target D*)</h4><div style='display:flex;flex-wrap:wrap;gap:18px'>"
            + "".join(cells) + "</div></div>")


def quality_html(quality: dict | None) -> str:
    if not quality:
        return ""
    names = {"is_person": "IsP? (VQA finds a person)", "quality": "CLIP-IQA quality", "real": "CLIP-IQA real",
             "natural": "CLIP-IQA natural", "colorfulness": "CLIP-IQA colorfulness"}
    final = quality.get("final", {})
    cell = lambda e: f"{fmt(e.get('value'))} {_ci((e.get('low'), e.get('high')))}"  # noqa: E731
    rows = "".join(f"<tr><td>{names.get(k, k)}</td><td>{cell(v)}</td><td>{cell(final.get(k, {}))}</td></tr>"
                   for k, v in quality.get("initial", {}).items())
    warnings = "".join(f"<li>{ESC(w)}</li>" for w in quality.get("warnings", []))
    return (f"<div id='mt-quality'><h4>Quality checks (spec §4.5)</h4><table style='font-size:13px'><tr><th>score</th>"
            f"<th>initial [95% CI]</th><th>final [95% CI]</th></tr>{rows}</table>"
            + (f"<ul class='gl-warning'>{warnings}</ul>" if warnings else "<p>No quality drop.</p>")
            + "<p style='font-size:12px'>CLIP-IQA-style: softmax(100·cos) of each image with an antonym prompt pair "
              "(e.g. 'Good photo.' vs 'Bad photo.') under the preset's embedder, averaged over images.</p></div>")


def mitigate_html(results: dict, with_preview: bool = True) -> str:
    """A whole Mitigate run (or the part of it finished so far); `with_preview=False` leaves
    the preview table out (the tab shows it in a box of its own)."""
    axes = list(results.get("axes", {}))
    priorities = results.get("priorities", {})
    ideals = results.get("ideals", {})
    custom = [a for a, d in ideals.items() if d and max(d.values()) - min(d.values()) > 1e-9]   # not uniform
    targets = ", ".join(f"{ESC(a)} <b>{priorities.get(a, 0):.2f}</b>" for a in results.get("targets", []))
    d_star = "; ".join(f"{ESC(a)}: " + ", ".join(f"{ESC(v)} {s:.0%}" for v, s in ideals[a].items()) for a in custom)
    stop = results.get("stop")
    stop_html = (f"<p id='mt-stop' data-reason='{ESC(stop['reason'])}' data-reached='{str(stop['reached']).lower()}'>"
                 f"<b>{'Reached' if stop['reached'] else 'Not reached'}</b>: {ESC(stop['message'])}.</p>"
                 if stop else "<p id='mt-stop' data-reason='running'>Running…</p>")
    states, steps = results.get("states", []), results.get("steps", [])
    parts = [f"<div class='gl-mitigate'><h3>Mitigate (InterMit): {ESC(str(results.get('prompt', '')))}</h3>",
             f"<p>B* and priorities p (‖p‖₁ = 1): {targets}. ε = {fmt(results.get('epsilon'), 2)}; "
             f"N = {results.get('n')} images per set; strategy {ESC(str(results.get('strategy')))}. "
             f"D*: {d_star or 'uniform for every axis'}{'; uniform for the other axes' if d_star else ''}.</p>",
             stop_html]
    if states:
        taus = " → ".join(fmt(s.get("tau")) for s in states)
        amount = f", MitAmt {fmt(states[-1].get('tau'))}" if stop else ""
        used = f"MitSteps {len(steps)}/{len(results.get('targets', [])) or 1}"
        parts.append(f"<p id='mt-taus'>τ per step: {taus} ({used}{amount})</p>")
        initial = w_bar_chart(states[0], axes, [], "w̄ on the initial images", "mitigate-initial")
        parts.append(f"<div style='display:flex;flex-wrap:wrap;gap:12px'><div class='gl-chart'>{tau_chart(results)}"
                     f"</div><div class='gl-chart'>{initial}</div></div>")
    if with_preview:
        parts.append(preview_html(results.get("preview")))
    for k, step in enumerate(steps):
        if k + 1 < len(states):
            parts.append(step_html(results, step, states[k], states[k + 1]))
    if results.get("tradeoffs") and stop:
        parts.append(f"<div id='mt-all-tradeoffs'><h4>All trade-off alerts</h4>{_alerts(results['tradeoffs'])}</div>")
    parts.append(report_html(results))
    parts.append(quality_html(results.get("quality")))
    if results.get("prompt_set"):
        parts.append("<details><summary>Mitigated prompt set (JSON export)</summary><pre style='font-size:11px;"
                     f"white-space:pre-wrap'>{ESC(json.dumps(results['prompt_set'], indent=1, ensure_ascii=False))}"
                     "</pre></details>")
    parts.append("</div>")
    return "\n".join(p for p in parts if p)
