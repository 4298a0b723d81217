"""`python -m engine runs list|show|compare|delete|export|import|study ...`"""
from .. import runs


def add_parser(sub, common_arguments) -> None:
    runs.add_cli(sub, common_arguments)
