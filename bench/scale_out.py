"""Scale out: images/s of one generate job on 1 vs 2 processes (tiny SD pipeline, CPU), measured
in one run, as a ratio.

    python bench/scale_out.py [--prompts 16] [--n 4] [--steps 4] [--threads 1] [--repeats 1]

Both sides run the same CLI job, `python -m engine generate --prompts-file F -n N`, on a fresh
store: 1 process started plainly, 2 processes with `accelerate launch --multi_gpu
--num_processes 2` (without CUDA the ranks join over gloo; engine/core/distributed.py). Every
process gets --threads torch/OpenMP threads, so 2 processes use twice the cores of 1.
images/s is N / image_seconds from the run summary: from the loaded model to the last image in
the store, so process start and model loading are left out on both sides (rank 0 and the
other rank load theirs at the same time); the 2-process figure includes broadcasting the plan,
the lockstep progress all-reduce, adopting the other rank's shard and re-reading every image.
Repeats alternate 1 and 2 processes. Headline last: scale_out_ratio (2-process images/s over
1-process images/s; 2.0 is linear).
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from _common import ROOT, report, tiny_sd_spec

WORDS = ("doctor nurse chef pilot farmer teacher judge baker lawyer artist singer dancer "
         "plumber writer banker driver").split()


def run_job(processes: int, args: list[str], data_dir: Path, threads: int) -> tuple[dict, float]:
    """One job on a fresh store: (the run's summary, wall seconds of the whole command)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads), "CUDA_VISIBLE_DEVICES": "", "TOKENIZERS_PARALLELISM": "false",
           "GAPLENS_DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT)}
    if processes == 1:
        cmd = [sys.executable, "-m", "engine", *args]
    else:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes),
               "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
               "--main_process_port", str(port), "-m", "engine", *args]
    start = time.perf_counter()
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if out.returncode != 0:
        sys.exit(f"{processes}-process job failed:\n{out.stderr[-3000:]}")
    db = sqlite3.connect(data_dir / "gaplens.sqlite")
    (summary,) = db.execute("SELECT summary FROM runs WHERE status='done'").fetchone()
    return json.loads(summary), wall


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", type=int, default=16, help=f"prompts in the job (at most {len(WORDS)})")
    ap.add_argument("--n", type=int, default=4, help="images per prompt")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads per process")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()

    spec = tiny_sd_spec()
    work = Path(tempfile.mkdtemp(prefix="gaplens-scale-"))
    prompts = work / "prompts.txt"
    prompts.write_text("\n".join(f"a photo of a {w}" for w in WORDS[:args.prompts]) + "\n")
    job = ["generate", "--preset", "synthetic", "--generator", f"diffusers:{spec.model}", "--prompts-file",
           str(prompts), "-n", str(args.n), "--steps", str(args.steps), "--quiet"]
    rates: dict[int, list[float]] = {1: [], 2: []}
    walls: dict[int, list[float]] = {1: [], 2: []}
    generation_only = []
    for r in range(args.repeats):
        for processes in (1, 2):
            summary, wall = run_job(processes, job, work / f"store-{processes}-{r}", args.threads)
            rates[processes].append(summary["n"] / summary["image_seconds"])
            walls[processes].append(wall)
            if processes > 1:
                generation_only.append(summary["distributed"]["images_per_second"])
    one, two = statistics.median(rates[1]), statistics.median(rates[2])
    report(cpu_count=os.cpu_count(), threads_per_process=args.threads, omp_num_threads_1proc=args.threads,
           omp_num_threads_2proc=f"{args.threads} per process ({2 * args.threads} in all)",
           images=args.prompts * args.n, prompts=args.prompts, n=args.n, steps=args.steps, size=64,
           repeats=args.repeats, wall_s_1proc=statistics.median(walls[1]), wall_s_2proc=statistics.median(walls[2]),
           images_per_s_1proc=one, images_per_s_2proc=two,
           generation_only_images_per_s_2proc=statistics.median(generation_only),
           scale_out_ratio=two / one)


if __name__ == "__main__":
    main()
