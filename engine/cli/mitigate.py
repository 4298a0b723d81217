"""`python -m engine mitigate --prompt ... -n 8 [--priorities gender=0.7,age=0.3] [--json]`"""
from ..methods.intersectional import load_reference_csv
from ..methods.mitigate import MitigateRequest, parse_priorities, parse_target
from .options import method_parser, request_from_args, set_fields, set_options


def make_request(a) -> MitigateRequest:
    """--axes also takes axis names (--axes gender,age): keep only those of the LLM's or the preset's."""
    select: list[str] = []
    if a.axes and not a.axes.lstrip().startswith(("{", "@")):
        select, a.axes = [s.strip() for s in a.axes.split(",") if s.strip()], None
    ideals = load_reference_csv(a.reference_csv) if a.reference_csv else {}
    ideals.update(dict(parse_target(t) for t in a.target))
    return request_from_args(MitigateRequest, a, **set_fields(a), select=select, ideals=ideals,
                             mitigate=[s.strip() for s in a.mitigate.split(",") if s.strip()],
                             priorities=parse_priorities(a.priorities))


def add_parser(sub, common_arguments) -> None:
    p = method_parser(sub, common_arguments, "mitigate", "InterMit: mitigate a prompt's biases axis by axis, "
                      "guided by the sensitivity matrix and priorities",
                      epilog="--axes also takes axis names (--axes gender,age) to keep only those of the LLM's "
                             "proposal or the preset.")
    set_options(p)
    p.add_argument("--mitigate", default="", metavar="AXIS,...",
                   help="B*, the axes to mitigate (default: the axes given priorities, else every axis)")
    p.add_argument("--priorities", default="", metavar="AXIS=W,...", help="priority per axis of B*, e.g. "
                   "gender=0.7,age=0.3 (scaled to sum 1; default equal)")
    p.add_argument("--target", action="append", default=[], metavar="AXIS=VALUE:SHARE,...",
                   help="ideal distribution D* of an axis, e.g. age=young:0.3,middle-aged:0.4,old:0.3 "
                        "(repeatable; default uniform)")
    p.add_argument("--reference-csv", default=None, help="real-world D*: a CSV with the columns axis, value, share")
    p.set_defaults(make_request=make_request)
