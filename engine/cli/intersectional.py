"""`python -m engine intersectional ...`"""
from ..methods import intersectional
from .compare import add_generators


def add_parser(sub, common_arguments) -> None:
    intersectional.add_cli(sub, common_arguments)
    add_generators(sub.choices["intersectional"], "intersectional")
