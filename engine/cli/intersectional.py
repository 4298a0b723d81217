"""`python -m engine intersectional ...`"""
from ..methods import intersectional


def add_parser(sub, common_arguments) -> None:
    intersectional.add_cli(sub, common_arguments)
