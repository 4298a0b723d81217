"""`python -m engine check SUITE --base GEN --candidate GEN [--json] [--html FILE]`: the bias check of a
fine-tune against its base on a suite of prompts and axes, paired by seed (engine/methods/check.py).

Exit status: 1 when any (prompt, axis) row is "more biased", 0 otherwise, 2 on bad input (an unreadable
suite, an unknown key or generator, a LoRA that does not fit its base)."""
from __future__ import annotations

import sys

from ..methods import check
from .options import method_parser, request_from_args

SHOWN = ("prompt", "axis", "delta", "ci", "q", "verdict")


def add_parser(sub, common_arguments) -> None:
    p = method_parser(sub, common_arguments, "check", "the bias check: is a candidate generator (a LoRA, a "
                      "checkpoint) more biased than its base on a suite of prompts? exit 1 if so",
                      epilog="SUITE keys: " + ", ".join(check.SUITE_KEYS) + ". Exit status: 1 when any row is "
                             "'more biased', 0 otherwise, 2 on bad input.")
    p.add_argument("suite", metavar="SUITE", help="a JSON or YAML file: prompts (or prompt_set), n, seed, axes, "
                                                  "margin, alpha")
    p.add_argument("--base", required=True, metavar="GEN",
                   help="the base generator: a preset or BACKEND:MODEL, e.g. diffusers:stable-diffusion-v1-5/"
                        "stable-diffusion-v1-5")
    p.add_argument("--candidate", required=True, metavar="GEN",
                   help="the candidate, e.g. diffusers:BASE+lora=REPO_OR_PATH@0.8 (several +lora=, each with its "
                        "scale; ',weight_name=FILE' picks a file of a repository)")
    p.add_argument("--html", default=None, metavar="FILE", help="also write the offline HTML report")
    p.set_defaults(make_request=make_request, after_run=after_run)


def make_request(args) -> check.CheckRequest:
    """The check of the suite file between --base and --candidate (InputError: exit 2)."""
    base = request_from_args(check.CheckRequest, args)
    options = {k: getattr(base, k) for k in ("negative_prompt", "steps", "guidance", "width", "height",
                                            "cant_tell_below", "n_boot", "n_perm")}
    return check.request_from_suite(check.load_suite(args.suite), args.base, args.candidate, **options)


def after_run(done, args) -> int:
    """Prints the rows (unless --json), writes --html, returns the exit status (1: a row regressed)."""
    results = done.results
    if args.html:
        from ..report.check import report

        try:
            with open(args.html, "w", encoding="utf-8") as fh:
                fh.write(report(results))
        except OSError as exc:
            print(f"error: cannot write the report '{args.html}': {exc.strerror or exc}", file=sys.stderr)
            return 2
    if not args.json:
        print("\t".join(SHOWN))
        for row in results["rows"]:
            ci = row.get("ci") or [None, None]
            print("\t".join([row["prompt"], row["axis"], _num(row["delta"]), f"[{_num(ci[0])}, {_num(ci[1])}]",
                             _num(row.get("q")), row["verdict"] + (f" (N = {row['n_to_settle']} would settle it)"
                                                                   if row.get("n_to_settle") else "")]))
    return 1 if results["regressed"] else 0


def _num(x) -> str:
    return "-" if x is None else f"{x:+.3f}" if isinstance(x, float) and x < 0 else f"{x:.3g}"
