"""`python -m engine status`: the engine status (preset, models, store) as JSON."""


def add_parser(sub, common_arguments) -> None:
    p = sub.add_parser("status", help="print the engine status (preset, models, store)")
    common_arguments(p)
    p.set_defaults(method=None)
