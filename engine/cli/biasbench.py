"""`python -m engine biasbench CAPTIONS.csv [--mode reference|paper] [--out TABLE.csv|TABLE.json]`:
T2I-BiasBench's per-prompt table from a file of captions (or labels), one row per image
(logic in engine/tools/biasbench.py)."""
import json
import sys

from ..metrics.biasbench import DEFAULT_MODE, MODES
from ..tools import biasbench as biasbench_tool

SHOWN = ["prompt", "attribute", "n", "parity_difference", "bias_amplification", "entropy_bits", "normalised_entropy",
         "kl_divergence", "cas", "gmr", "iemr", "hallucination", "caption_diversity", "clip_proxy", "composite"]


def add_parser(sub, common_arguments) -> None:
    p = sub.add_parser("biasbench", help="score a T2I-BiasBench caption file into the paper's per-prompt table")
    common_arguments(p)
    p.add_argument("captions", metavar="CAPTIONS.csv", help="one row per image: a caption (or label columns such "
                   "as gender/ethnicity/skin) and a prompt column or an image name naming the prompt")
    p.add_argument("--mode", choices=MODES, default=DEFAULT_MODE,
                   help="reference: the released code's numbers; paper: the paper's equations (default)")
    p.add_argument("--caption-column", default=None)
    p.add_argument("--image-column", default=None, help="image names the prompt is detected from")
    p.add_argument("--prompt-column", default=None, help="the prompt (category) of each row")
    p.add_argument("--out", default=None, metavar="TABLE.csv|TABLE.json", help="also write the table")
    p.set_defaults(preset="synthetic", method=_run, make_request=lambda a: a)


def _run(args, engine):
    """Scores the file, prints the table (JSON with --json) and the dropped labels; yields nothing."""
    table = biasbench_tool.score_file(args.captions, args.mode, args.caption_column, args.image_column,
                                      args.prompt_column)
    if args.out:
        if str(args.out).endswith(".json"):
            with open(args.out, "w", encoding="utf-8") as f:
                json.dump(table.to_json(), f, indent=2)
        else:
            table.write_csv(args.out)
    for row in table.rows:
        for label, info in row["dropped"].items():
            print(f"warning: {row['prompt']}: {info['count']} '{label}' label(s) left out of the {args.mode}-mode "
                  f"metrics: {info['reason']}", file=sys.stderr)
        if row.get("run_together_captions"):
            print(f"warning: {row['prompt']}: {row['run_together_captions']} caption(s) had run-together fields "
                  "split before whole-word matching", file=sys.stderr)
    if table.undetected:
        print(f"warning: {table.undetected} row(s) name none of the five prompts and were left out", file=sys.stderr)
    if table.skipped:
        print(f"warning: {table.skipped} blank row(s) or row(s) with an empty caption were left out", file=sys.stderr)
    if args.json:
        print(json.dumps(table.to_json(), indent=2))
    else:
        print("\t".join(SHOWN))
        for row in table.rows:
            print("\t".join("" if row.get(k) is None else str(row.get(k)) for k in SHOWN))
    return
    yield  # a generator, like every command's method
