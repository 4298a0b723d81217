"""`python -m engine counterfactuals ...`"""
from ..methods import counterfactuals


def add_parser(sub, common_arguments) -> None:
    counterfactuals.add_cli(sub, common_arguments)
