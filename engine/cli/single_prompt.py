"""`python -m engine single-prompt --prompt P -n N [--axes A ...] [--json]`: the Single Prompt tab's
distributions, metrics and intervals from the command line."""
from __future__ import annotations

from ..axes import parse_targets
from ..methods import single_prompt
from ..methods.generate import add_generation_arguments


def add_parser(sub, common_arguments) -> None:
    p = sub.add_parser("single-prompt", help="Single Prompt: attribute distributions with small-N intervals, "
                       "T2I-BiasBench metrics, diversity and the gap score of one prompt")
    common_arguments(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("-n", type=int, default=16, help="images")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--axes", nargs="+", default=list(single_prompt.DEFAULT_AXES), metavar="AXIS",
                   help="axes to measure (known: gender, age, 'skin tone', ethnicity, ...; others are free-text)")
    p.add_argument("--targets", default="", metavar="'axis: v=share, ...; ...'",
                   help="reference shares per axis (default uniform)")
    p.add_argument("--mode", choices=["paper", "reference"], default="paper", help="T2I-BiasBench mode")
    p.add_argument("--n-boot", type=int, default=1000, help="posterior draws / bootstrap resamples per interval")
    p.add_argument("--half-width", type=float, default=0.1,
                   help="the ± interval the 'how many images' advice aims at")
    p.add_argument("--until-half-width", type=float, default=None, metavar="X",
                   help="add images (reusing the cache) until every share's interval is within ±X")
    p.add_argument("--no-gap", action="store_true", help="skip the MineTheGap gap score (no LLM)")
    p.add_argument("--n-variations", type=int, default=None, help="LLM text variations for the gap score")
    p.add_argument("--top-k", type=int, default=10)
    add_generation_arguments(p)
    p.set_defaults(method=single_prompt.run, make_request=make_request)


def make_request(a) -> single_prompt.SinglePromptRequest:
    return single_prompt.SinglePromptRequest(
        prompt=a.prompt, n=a.n, seed=a.seed, negative_prompt=a.negative_prompt, steps=a.steps,
        guidance=a.guidance, width=a.width, height=a.height, axes=list(a.axes),
        references=parse_targets(a.targets), mode=a.mode, n_variations=a.n_variations, n_boot=a.n_boot,
        top_k=a.top_k, gap=not a.no_gap, half_width=a.half_width, until_half_width=a.until_half_width)
