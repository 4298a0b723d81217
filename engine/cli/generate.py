"""`python -m engine generate ...`"""
from ..methods import generate


def add_parser(sub, common_arguments) -> None:
    generate.add_cli(sub, common_arguments)
