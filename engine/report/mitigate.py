"""The Mitigate (InterMit) page, from a run's stored results alone (partial ones too): the stop
reason, τ per step against ε (measured and previewed), every step's w̄ bars before and after
with the mitigated axes outlined, the prompt set in use with its sampling weights, trade-off
alerts, the final per-axis report (initial vs final distribution with 95% CIs, target ticks),
the quality checks and the exported prompt set. Markup: templates/mitigate.html."""
from __future__ import annotations

import json

from ..backends.base import CANT_TELL
from . import Markup, cant_tell_note, charts, macro
from .distilled import sources_html

NAN = float("nan")
QUALITY_NAMES = {"is_person": "IsP? (VQA finds a person)", "quality": "CLIP-IQA quality", "real": "CLIP-IQA real",
                 "natural": "CLIP-IQA natural", "colorfulness": "CLIP-IQA colorfulness"}


def _nan(x):
    return NAN if x is None else x


def w_bar_chart(before: dict, after: dict, axes: list[str], mitigated: list[str], title: str,
                chart_id: str) -> Markup:
    """w̄ per axis before and after a step, side by side in one chart with 95% CIs; mitigated
    axes ticked (✓)."""
    def values(state):
        w, ci = state.get("w_bar", {}), state.get("w_bar_ci", {})
        return [_nan(w.get(a)) for a in axes], [tuple(_nan(x) for x in (ci.get(a) or (None, None))) for a in axes]

    (b, b_ci), (a, a_ci) = values(before), values(after)
    labels = [f"✓ {x}" if x in mitigated else x for x in axes]
    return charts.grouped_bars(labels, {"before": b, "after": a}, ci={"before": b_ci, "after": a_ci}, vmax=1.0,
                               title=title, chart_id=chart_id, x_title="w̄: distance from the target (0 = on it)")


def tau_chart(results: dict) -> Markup:
    """τ per step (measured, and previewed from S) against the ε line."""
    taus = [_nan(s.get("tau")) for s in results.get("states", [])]
    series = {"measured": taus}
    preview = results.get("preview") or {}
    if preview.get("steps"):
        series["preview"] = [preview.get("tau0")] + [s["tau"] for s in preview["steps"]]
    n = max(len(v) for v in series.values())
    series[f"ε = {results.get('epsilon'):g}"] = [results.get("epsilon")] * max(n, 2)
    return charts.line_chart(series, title="τ = ⟨w̄_B*, p⟩ per step (dots) against ε", x_label="step",
                             chart_id="mitigate-tau", width=460)


def prompt_set_table(prompt_set: list[dict], limit: int = 40) -> Markup:
    """The prompts in use with their sampling weights (first `limit`)."""
    return macro("mitigate.html", "prompt_set")(prompt_set[:limit], len(prompt_set) - limit)


def step_html(results: dict, step: dict, before: dict, after: dict) -> Markup:
    """One step: γ per candidate, w̄ bars before and after, S's prediction, the prompt set, alerts."""
    axes = list(results.get("axes", {}))
    t = step["step"]
    mitigated = step.get("mitigated", [])
    gammas = sorted((step.get("gamma") or {}).items(), key=lambda kv: -(kv[1] if kv[1] is not None else -9))
    return macro("mitigate.html", "step")(
        step=step, gammas=gammas, prompt_set=prompt_set_table(step.get("prompt_set", [])),
        chart=w_bar_chart(before, after, axes, mitigated, f"w̄ before and after step {t}", f"mitigate-step-{t}"))


def preview_html(preview: dict | None) -> Markup:
    """The preview from the sensitivity matrix alone: predicted steps, τ and where it stops."""
    return macro("mitigate.html", "preview")(preview) if preview else Markup("")


def report_html(results: dict) -> Markup:
    """Initial vs final distribution of every axis, with 95% CIs and the target ticks."""
    report = results.get("report") or {}
    cells = []
    for axis, r in report.items():
        d = {which: r[which] for which in ("initial", "final")}
        labels = list(d["initial"]["values"])
        shares = {which: [_nan(s) for s in d[which]["shares"]] for which in d}
        ci = {which: [(_nan(lo), _nan(hi)) for lo, hi in zip(d[which]["low"], d[which]["high"])] for which in d}
        if any("cant_tell" in d[which] for which in d):   # issue 35: a bar of its own, outside the distribution
            labels.append(CANT_TELL)
            for which in d:
                shares[which].append(d[which].get("cant_tell_share", 0.0))
                ci[which].append((NAN, NAN))
        chart = charts.grouped_bars(labels, shares, ci=ci, reference=r["ideal"], vmax=1.0, width=260,
                                    title=f"{axis}: initial and final shares", chart_id=f"mitigate-final-{axis}",
                                    x_title="share of images")
        cells.append({"axis": axis, "r": r, "chart": chart, "notes": [cant_tell_note(d[which]) for which in d]})
    return macro("mitigate.html", "report")(cells) if cells else Markup("")


def quality_html(quality: dict | None) -> Markup:
    """Quality scores (IsP?, CLIP-IQA) initial vs final, with 95% CIs, and the warnings."""
    if not quality:
        return Markup("")
    final = quality.get("final", {})
    rows = [(QUALITY_NAMES.get(k, k), v, final.get(k, {})) for k, v in quality.get("initial", {}).items()]
    return macro("mitigate.html", "quality")(rows, quality.get("warnings", []))


def page(results: dict, with_preview: bool = True, images: Markup | str = "") -> Markup:
    """A whole Mitigate run (or the part of it finished so far); `with_preview=False` leaves
    the preview table out (the tab shows it in a box of its own); `images`: the initial and
    the mitigated images side by side (`image_columns`; the tab has them, a stored run not)."""
    ideals = results.get("ideals", {})
    custom = [a for a, d in ideals.items() if d and max(d.values()) - min(d.values()) > 1e-9]   # not uniform
    states, steps = results.get("states", []), results.get("steps", [])
    stop = results.get("stop")
    return macro("mitigate.html", "page")(
        results=results, priorities=results.get("priorities", {}), d_star=[(a, ideals[a]) for a in custom],
        stop=stop, states=states, n_steps=len(steps), n_targets=len(results.get("targets", [])) or 1,
        tau=tau_chart(results) if states else "", images=images,
        preview=preview_html(results.get("preview")) if with_preview else "",
        steps=[step_html(results, step, states[k], states[k + 1]) for k, step in enumerate(steps) if k + 1 < len(states)],
        report=report_html(results), quality=quality_html(results.get("quality")),
        sources=sources_html(results.get("answer_sources")),
        prompt_set=(json.dumps(results["prompt_set"], indent=1, ensure_ascii=False)
                    if results.get("prompt_set") else ""))
