"""`python -m engine counterfactuals --prompt ... -n 8 [--axes JSON] [--generators A B] [--json]`"""
from ..methods.counterfactuals import CounterfactualsRequest
from .options import method_parser, request_from_args, set_fields, set_options


def add_parser(sub, common_arguments) -> None:
    p = method_parser(sub, common_arguments, "counterfactuals",
                      "TIBET: counterfactual prompts, CAS per counterfactual, MAD per axis")
    set_options(p)
    p.set_defaults(make_request=lambda a: request_from_args(CounterfactualsRequest, a, **set_fields(a)))
