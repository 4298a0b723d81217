"""The views of issue 16 ("trust the numbers"): the evaluator checked against a person, two
evaluators compared, one spot-check image's question, each distribution's N and the images a
narrower interval needs, and headlines that say how sure they are. Templates:
`templates/trust/*.html` (autoescaped)."""
from __future__ import annotations

from . import Markup, render

METRIC_LABELS = [("parity_difference", "Parity Difference"), ("normalised_entropy", "Normalised entropy"),
                 ("composite_bias_score", "Composite Bias Score")]


def validation_html(validation: dict) -> Markup:
    """Per axis: accuracy and κ with intervals, confusion and recall, raw beside corrected shares
    and metrics (engine.methods.validate.validate_run's result)."""
    return render("trust/validation.html", run_id=validation.get("run_id"), axes=validation.get("axes", {}),
                  metric_labels=METRIC_LABELS)


def comparison_html(comparison: dict) -> Markup:
    """The agreement matrix and κ of two evaluators (engine.methods.validate.compare_evaluators)."""
    return render("trust/comparison.html", **comparison)


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
                  method="posterior" if "posterior" in m.get("interval_method", "") else "BCa")


def headline_html(claim: dict | None) -> Markup:
    """A headline with its certainty ("no clear winner ... N that would settle it")."""
    if not claim or not claim.get("text"):
        return Markup("")
    return render("trust/headline.html", claim=claim)
