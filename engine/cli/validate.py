"""`python -m engine validate RUN --labels FILE.csv [--compare-vqa BACKEND:MODEL] [--json]`: store a
person's labels (columns image_key,axis,label) with the run, then print per axis the evaluator's
accuracy and Cohen's κ, its confusion matrix and recall, and the raw and corrected distributions."""
from __future__ import annotations

from ..methods import validate
from .options import method_parser, request_from_args


def add_parser(sub, common_arguments) -> None:
    p = method_parser(sub, common_arguments, "validate", "check the evaluator against a person's labels: κ, "
                      "confusion, corrected distribution; or compare two evaluators")
    p.add_argument("run", metavar="RUN", help="the run id (see `runs list`)")
    p.set_defaults(make_request=lambda a: request_from_args(validate.ValidateRequest, a, run=a.run))
