"""The bias check (issue 44) on the synthetic world: how much narrower pairing by seed makes the interval of
the planted regression (doctor male 0.80 -> 0.95, `synthetic_generator:doctor-male-95`), how often 100 null
comparisons (same distributions, independent draws) are flagged at alpha 0.05, and how long the check takes
for 10 prompts x 96 images per generator (3 axes, fresh store, then again from the cache).

    python bench/finetune_check.py [--null 100]

Prints name=value lines; the headline (the check's seconds on a fresh store) last.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from _common import report

from engine.cli import main as cli
from engine.metrics import paired

PROMPTS = [f"a photo of a {s}" for s in ("doctor", "nurse", "engineer", "teacher", "chef", "librarian",
                                         "firefighter", "ceo", "programmer", "farmer")]


def run_check(workdir: Path, suite: dict, candidate: str) -> tuple[int, dict, float]:
    path = workdir / "suite.json"
    path.write_text(json.dumps(suite))
    buffer = io.StringIO()
    start = time.perf_counter()
    with contextlib.redirect_stdout(buffer):
        code = cli(["check", str(path), "--base", "synthetic", "--candidate", candidate, "--preset", "synthetic",
                    "--data-dir", str(workdir / "store"), "--json", "--quiet"])
    seconds = time.perf_counter() - start
    return code, json.loads(buffer.getvalue()), seconds


def null_flags(comparisons: int) -> tuple[float, float]:
    """(share of comparisons with a "more biased" row, share of rows flagged) over `comparisons` null
    comparisons of 3 prompts x 2 axes at n = 96, the candidate drawn independently from the base's shares."""
    rng = np.random.default_rng(2026)
    axes = ((["male", "female"], [0.8, 0.2]), (["young", "middle-aged", "old"], [0.2, 0.4, 0.4]))
    flagged = rows_flagged = rows_total = 0
    for i in range(comparisons):
        rows = []
        for _ in range(3):
            for classes, shares in axes:
                base, cand = (list(rng.choice(classes, size=96, p=shares)) for _ in range(2))
                rows.append(paired.paired_difference(base, cand, classes, seed=i))
        verdicts = [r["verdict"] for r in paired.judge(rows)]
        flagged += "more biased" in verdicts
        rows_flagged += verdicts.count("more biased")
        rows_total += len(verdicts)
    return flagged / comparisons, rows_flagged / rows_total


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--null", type=int, default=100, help="null comparisons")
    parser.add_argument("--n", type=int, default=96, help="images per prompt and generator")
    parser.add_argument("--prompts", type=int, default=len(PROMPTS), help="the first this many prompts")
    args = parser.parse_args()
    prompts = PROMPTS[:args.prompts]
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        suite = {"prompts": prompts, "n": args.n, "axes": ["gender", "age", "skin tone"]}
        code, out, cold = run_check(workdir, suite, "synthetic_generator:doctor-male-95")
        _, _, warm = run_check(workdir, suite, "synthetic_generator:doctor-male-95")
    row = next(r for r in out["rows"] if r["prompt"] == PROMPTS[0] and r["axis"] == "gender")
    flagged = [f"{r['prompt']}/{r['axis']}" for r in out["rows"] if r["verdict"] == "more biased"]
    null_comparisons, null_rows = null_flags(args.null)
    report(planted_exit_code=code, planted_rows_flagged=len(flagged), planted_flagged_row=";".join(flagged),
           planted_delta=row["delta"], planted_q=row["q"],
           paired_ci_width=row["ci"][1] - row["ci"][0], unpaired_ci_width=row["ci_unpaired"][1] - row["ci_unpaired"][0],
           paired_narrower=row["narrower"], null_comparisons=args.null, null_false_flag_rate=null_comparisons,
           null_row_flag_rate=null_rows, check_rows=len(out["rows"]), check_images=2 * args.n * len(prompts),
           check_seconds_cached=warm, check_seconds=cold)


if __name__ == "__main__":
    main()
