"""What "can't tell" buys (issue 35): on the synthetic world, an evaluator made noisy on purpose
(the synthetic VQA at error rate E, whose class probabilities are calibrated) answers the default
axes of N images of a prompt; its accuracy against the world's truth (the attributes the renderer
drew) on every image, and on the images it answered when answers below the threshold are "can't tell".

    python bench/abstention.py [--error 0.3] [-n 300] [--threshold 0.6] [--prompt "a photo of a doctor"]

Prints name=value lines: per axis and over all axes the accuracy without abstention, with it, and
the share answered; the headline last: the accuracy on the answered images over all axes.
"""
from __future__ import annotations

import argparse
import sys
import tempfile

import _common  # noqa: F401  (offline environment, repository on the path)
from _common import report

from engine.backends.base import CANT_TELL
from engine.backends.synthetic import render_attributes
from engine.core.engine import Engine
from engine.methods.axes import axis_for

AXES = ("gender", "age", "skin tone")


def measure(error: float, n: int, threshold: float, prompt: str = "a photo of a doctor",
            data_dir: str | None = None) -> dict:
    """Returns {axis or "all": {"accuracy", "accuracy_answered", "answered"}}: the noisy evaluator's
    accuracy on all n images, on those it answered at `threshold`, and the share it answered."""
    engine = Engine("synthetic", data_dir=data_dir or tempfile.mkdtemp(prefix="gaplens-abstention-"),
                    max_images=max(n, 128), options={"vqa": {"error_rate": error}})
    records = engine.image_set(prompt, range(n))
    truth = [render_attributes(prompt, r.seed) for r in records]
    out, pairs = {}, []
    for name in AXES:
        axis = axis_for(name)
        scored = engine.ask_scored(records, axis.question, list(axis.values))
        engine.cant_tell_below = threshold
        labels = engine.ask(records, axis.question, list(axis.values))
        rows = [(t[name], a.answer, label) for t, a, label in zip(truth, scored, labels)]
        pairs += rows
        out[name] = _accuracies(rows)
    out["all"] = _accuracies(pairs)
    return out


def _accuracies(rows: list[tuple[str, str, str]]) -> dict:
    answered = [(t, label) for t, _, label in rows if label != CANT_TELL]
    return {"accuracy": sum(t == a for t, a, _ in rows) / len(rows),
            "accuracy_answered": sum(t == label for t, label in answered) / len(answered) if answered else float("nan"),
            "answered": len(answered) / len(rows)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--error", type=float, default=0.3)
    parser.add_argument("-n", type=int, default=300)
    parser.add_argument("--threshold", type=float, default=0.6)
    parser.add_argument("--prompt", default="a photo of a doctor")
    args = parser.parse_args(argv)
    out = measure(args.error, args.n, args.threshold, args.prompt)
    for name in AXES:
        report(**{f"{name.replace(' ', '_')}_{k}": v for k, v in out[name].items()})
    report(accuracy=out["all"]["accuracy"], answered=out["all"]["answered"],
           accuracy_answered=out["all"]["accuracy_answered"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
