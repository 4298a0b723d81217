"""`python -m engine counterfactuals ...`"""
from ..methods import counterfactuals
from .compare import add_generators


def add_parser(sub, common_arguments) -> None:
    counterfactuals.add_cli(sub, common_arguments)
    add_generators(sub.choices["counterfactuals"], "counterfactuals")
