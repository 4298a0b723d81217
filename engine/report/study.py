"""The user-study pages: the participant's form (one static HTML file, images inlined, no
network; markup templates/study.html, CSS and JS in static/study_form.*) and the analysis
panel. The design and the analysis themselves are engine/tools/study.py."""
from __future__ import annotations

from . import Markup, charts, macro, render, static, thumbnail_data_uri


def form_page(pack: dict) -> Markup:
    """The static study form of a pack from `engine.tools.study.build_pack`: its participant data
    (images as inline JPEG data URIs) embedded as JSON in a script the form's code reads."""
    size = int(pack.get("thumbnail_size", 256))
    data = {**pack["participant"],
            "sets": {set_id: [thumbnail_data_uri(p, size, 85) for p in paths]
                     for set_id, paths in pack["images"].items()}}
    kind = data["question_type"]
    how = ("You will see one set of images at a time and rate it on a scale from 1 to 5." if kind == "rating"
           else "You will see two sets of images at a time and choose one of them.")
    return render("study.html", data=data, how=how, css=Markup(static("study_form.css")),
                  js=Markup(static("study_form.js")))


def analysis_html(a: dict) -> Markup:
    """Agreement, Spearman ρ, a chart of the human scores and the per-set table of `engine.tools.study.analyse`."""
    chart = charts.bar_chart([c["set"] for c in a["conditions"]], [c["human_score"] or 0.0 for c in a["conditions"]],
                             title=f"human score ({a['human_score']})", chart_id="study-human",
                             vmax=5.0 if a["question_type"] == "rating" else 1.0)
    return macro("study.html", "analysis")(a=a, chart=chart)
