"""`python -m engine mine --preset synthetic --iterations 2 -n 8 --json` (--resume RUN_ID)."""
import sys

from ..methods.mine import budget_text, estimate_budget
from .options import method_parser


def print_budget(request, engine) -> None:
    """What the settings imply (images, LLM calls, time), on stderr before starting."""
    sys.stderr.write("budget: " + budget_text(estimate_budget(request, engine)) + "\n")


def add_parser(sub, common_arguments) -> None:
    p = method_parser(sub, common_arguments, "mine",
                      "MineTheGap: mine the prompts the model is most biased on (genetic search)")
    p.set_defaults(before_run=print_budget)
