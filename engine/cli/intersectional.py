"""`python -m engine intersectional --prompt ... -n 8 [--axes JSON] [--generators A B] [--json]`"""
import sys

from ..methods.intersectional import IntersectionalRequest, load_reference_csv, no_edge_note
from .options import method_parser, request_from_args, set_fields, set_options


def add_parser(sub, common_arguments) -> None:
    p = method_parser(sub, common_arguments, "intersectional",
                      "BiasConnect: intersectional sensitivity matrix and χ² bias graph")
    set_options(p)
    p.add_argument("--reference-csv", default=None, help="real-world D*: a CSV with the columns axis, value, share")
    p.set_defaults(make_request=lambda a: request_from_args(
        IntersectionalRequest, a, **set_fields(a), ideals=load_reference_csv(a.reference_csv) if a.reference_csv else {}),
        after_run=why_no_edge)


def why_no_edge(done, args) -> int:
    """When no edge passes, what the page says about it (methods.intersectional.no_edge_note), on
    stderr after the summary line (not with --json or --quiet). Exit status 0."""
    note = no_edge_note(done.results)
    if note and not (args.json or args.quiet):
        print(note["text"], file=sys.stderr)
    return 0
