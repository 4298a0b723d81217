"""`--generators A B ...` on the audit commands (single-prompt, counterfactuals, intersectional):
the same audit on each generator, side by side (engine/methods/compare_models.py). build_parser
adds it to every method compare_models runs."""
from __future__ import annotations

from dataclasses import fields

from ..methods import compare_models


def add_generators(parser, method_name: str) -> None:
    """Adds --generators to the command `parser` (whose defaults hold `method` and
    `make_request`): with two or more generators the command runs compare_models instead."""
    parser.add_argument("--generators", nargs="+", default=None, metavar="GENERATOR",
                        help="run the same audit on each generator and compare them side by side: preset "
                             "names or BACKEND:MODEL (e.g. --generators sd-turbo sdxl-turbo "
                             "diffusers:/models/my-sd); loaded one after another")
    method, make_request = parser.get_default("method"), parser.get_default("make_request")

    def make(args):
        request = make_request(args)
        if not args.generators:
            return request
        return compare_models.CompareModelsRequest(
            method_name, list(args.generators), {f.name: getattr(request, f.name) for f in fields(request)})

    def run(request, engine):
        if isinstance(request, compare_models.CompareModelsRequest):
            return compare_models.run(request, engine)
        return method(request, engine)

    parser.set_defaults(make_request=make, method=run)
