"""`python -m engine mitigate ...`"""
from ..methods import mitigate


def add_parser(sub, common_arguments) -> None:
    mitigate.add_cli(sub, common_arguments)
