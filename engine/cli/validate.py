"""`python -m engine validate RUN --labels FILE.csv [--compare-vqa BACKEND:MODEL] [--json]`: store a
person's labels (columns image_key,axis,label) with the run, then print per axis the evaluator's
accuracy and Cohen's κ, its confusion matrix and recall, and the raw and corrected distributions."""
from __future__ import annotations

from ..methods import validate


def add_parser(sub, common_arguments) -> None:
    p = sub.add_parser("validate", help="check the evaluator against a person's labels: κ, confusion, "
                       "corrected distribution; or compare two evaluators")
    common_arguments(p)
    p.add_argument("run", metavar="RUN", help="the run id (see `runs list`)")
    p.add_argument("--labels", default=None, metavar="FILE.csv", help="CSV with columns image_key,axis,label")
    p.add_argument("--who", default=None, help="who labelled (stored with the labels; default file:NAME)")
    p.add_argument("--compare-vqa", default=None, metavar="BACKEND:MODEL",
                   help="score the same images with a second evaluator and show their agreement matrix")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(method=validate.run, make_request=lambda a: validate.ValidateRequest(
        a.run, a.labels, a.who, a.compare_vqa, a.seed))
