"""`python -m engine mine ...`"""
from ..methods import mine


def add_parser(sub, common_arguments) -> None:
    mine.add_cli(sub, common_arguments)
