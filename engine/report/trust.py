"""The views of issue 16 ("trust the numbers"): the evaluator checked against a person, two
evaluators compared, one spot-check image's question, each distribution's N and the images a
narrower interval needs, and headlines that say how sure they are. Templates:
`templates/trust/*.html` (autoescaped)."""
from __future__ import annotations

from . import Markup, macro, render, thumbnail_data_uri

METRIC_LABELS = [("parity_difference", "Parity Difference"), ("normalised_entropy", "Normalised entropy"),
                 ("composite_bias_score", "Composite Bias Score")]


def validation_html(validation: dict) -> Markup:
    """Per axis: accuracy and κ with intervals, confusion and recall, raw beside corrected shares
    and metrics (engine.methods.validate.validate_run's result)."""
    return render("trust/validation.html", run_id=validation.get("run_id"), axes=validation.get("axes", {}),
                  metric_labels=METRIC_LABELS)


DISAGREEMENTS_SHOWN = 24   # per axis; the JSON has every one


def comparison_html(comparison: dict, paths: dict[str, str] | None = None,
                    element_id: str = "trust-comparison") -> Markup:
    """Per axis the agreement of several evaluators, how many images each answered within the classes,
    κ over those all answered (or why it is undefined; Fleiss' with every pair's Cohen's for three or
    more), the distribution where they agree, the agreement matrix of two, and the images where they
    disagree with every answer and its probabilities (thumbnails from `paths`, image key -> file, else
    the disagreements' own "path"); the axes left out, and why: engine.methods.validate.
    compare_evaluators or a Single Prompt run's results["evaluators"]."""
    paths = dict(paths or {})
    thumbs = {}
    for a in comparison.get("axes", {}).values():
        for d in a.get("disagreements", [])[:DISAGREEMENTS_SHOWN]:
            path = paths.get(d["key"]) or d.get("path")
            if path and d["key"] not in thumbs:
                try:
                    thumbs[d["key"]] = thumbnail_data_uri(path, 96)
                except OSError:
                    pass
    evaluators = comparison.get("evaluators") or [comparison.get("first", ""), comparison.get("second", "")]
    return render("trust/comparison.html", evaluators=evaluators, axes=comparison.get("axes", {}), thumbs=thumbs,
                  limit=DISAGREEMENTS_SHOWN, element_id=element_id, left_out=comparison.get("left_out") or {})


def spot_item_html(prefix: str, run_id: str, axis: str, question: str, classes: list[str], key: str,
                   position: int, total: int) -> Markup:
    """The question over one spot-check image, where the check is, and its keys (`prefix`: the panel's id)."""
    return render("trust/spot_item.html", prefix=prefix, run_id=run_id, axis=axis, question=question,
                  classes=classes, key=key, position=position, total=total)


def spot_done_html(prefix: str, run_id: str, answered: int, who: str, more: str = "") -> Markup:
    return render("trust/spot_done.html", prefix=prefix, run_id=run_id, answered=answered, who=who, more=more)


def axis_extras_html(name: str, m: dict) -> Markup:
    """Under one Single Prompt distribution: its N, the interval methods, the sample-size advice."""
    if "n" not in m:
        return Markup("")
    return render("trust/axis_extras.html", name=name, m=m, s=m.get("sample_size"),
                  method=next((word for word in ("posterior", "BCa", "no interval") if word in m.get("interval_method", "")),
                              "BCa"))


def headline_html(claim: dict | None) -> Markup:
    """A headline with its certainty ("no clear winner ... N that would settle it")."""
    if not claim or not claim.get("text"):
        return Markup("")
    return render("trust/headline.html", claim=claim)


def image_answers_html(seed: int, key: str, flagged: bool, questions: list[dict], caption: str = "") -> Markup:
    """A clicked image: its seed and key, and per question (engine.methods.single_prompt.image_answers)
    every evaluator's answer by name with its class probabilities, then the caption."""
    return macro("trust/image.html", "answers")(seed, key, flagged, questions, caption)


def image_message_html(text: str) -> Markup:
    """One sentence in the clicked image's panel (no image clicked yet, or the regenerated image)."""
    return macro("trust/image.html", "message")(text)
