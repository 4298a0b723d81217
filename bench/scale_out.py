"""Scale out: one job on 1 process vs several (gloo), measured in one run, as a ratio.

    python bench/scale_out.py [--occupations 6] [--n 16] [--processes 4] [--vqa-cost blip_vqa] [--projection]
    python bench/scale_out.py --projection-only [--teacher-share 0.2]
    python bench/scale_out.py --tiny-sd [--prompts 16] [--n 4] [--steps 4] [--threads 1] [--repeats 1]

Default: the occupation study's subset (BiasConnect, `intersectional --axes-preset occupations`): the
first `--occupations` occupations × all 27 sets × N images, 8 multiple-choice questions per image, on
the synthetic world with the GPU cost model (engine/backends/gpu_costs.py: every generator and VQA
call sleeps the time an H100/H200 would take: sd-turbo 0.032 s an image, BLIP 0.01 s a question asked
alone, 0.017 s an image's 8 questions asked at once).
The arithmetic of the synthetic world is about 2 ms an image, so the figures measure the
orchestration: what runs on every rank and what on rank 0 alone. Both sides are timed by the run's
own clock (`seconds` in its summary: from the request to the record, process start left out), the
1-process side started plainly, the other with `accelerate launch --multi_gpu --num_processes P`.
`rank0_alone_share` is the part of the P-process run outside its distributed steps (the `.merged`
records of shards/: planning, dealing, every rank working, adopting), when rank 0 works and the
others wait. Headline last: scale_out_ratio (1-process seconds over P-process seconds; P is linear).
`--projection` adds the time of the full study (26 occupations, 48 images: 33,696 images, 269,568
answers) on 1 and 8 GPUs: from the cost model's GPU seconds (plus, on 8, the measured rank-0-alone
seconds per image) with the `--vqa-cost` evaluator, a VLM and the distilled evaluator taught by the VLM
(`projection`), and from the measured per-image seconds of the 1-process run; `--projection-only`
prints the cost model's alone, running no job.

`--tiny-sd`: images/s of one generate job on 1 vs 2 processes (tiny SD pipeline, CPU):

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


def occupation_study(args) -> None:
    """The occupation subset with the GPU cost model on 1 and `args.processes` processes."""
    occupations = json.loads((ROOT / "assets" / "occupation_axes.json").read_text())["occupations"][:args.occupations]
    job = ["intersectional", "--preset", "synthetic", "--axes-preset", "occupations", "--fill", *occupations,
           "-n", str(args.n), "--generator-option", f"gpu={args.generator_cost}", "--vqa-option",
           f"gpu={args.vqa_cost}", "--embedder-option", "gpu=clip", "--quiet", "--json"]
    work = Path(tempfile.mkdtemp(prefix="gaplens-scale-"))
    seconds, walls, alone = {}, {}, 0.0
    for processes in (1, args.processes):
        store = work / f"store-{processes}"
        summary, walls[processes] = run_job(processes, job, store, 1)
        seconds[processes] = summary["seconds"]
        if processes > 1:
            steps = [json.loads(m.read_text()) for m in store.glob("shards/*/*/.merged")]
            alone = max(0.0, seconds[processes] - sum(s.get("seconds", 0.0) for s in steps))
    db = sqlite3.connect(work / f"store-{args.processes}" / "gaplens.sqlite")
    images, answers = (db.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("images", "answers"))
    one, many = seconds[1], seconds[args.processes]
    values = dict(occupations=len(occupations), sets=27 * len(occupations), n=args.n, images=images, answers=answers,
                  processes=args.processes, generator_cost=args.generator_cost, vqa_cost=args.vqa_cost,
                  run_s_1proc=one, run_s_nproc=many, wall_s_1proc=walls[1], wall_s_nproc=walls[args.processes],
                  rank0_alone_s=alone, rank0_alone_share=alone / many if many else 0.0)
    if args.projection:
        per_image, alone_per_image = one / images, alone / images
        values.update(projection(args, alone_per_image),
                      measured_full_study_min_1gpu=FULL_STUDY_IMAGES * per_image / 60,
                      measured_full_study_min_8gpu=FULL_STUDY_IMAGES * ((per_image - alone_per_image) / 8
                                                                        + alone_per_image) / 60)
    report(**values, scale_out_ratio=one / many)


FULL_STUDY_IMAGES = 26 * 27 * 48   # the occupation study: 26 occupations x 27 sets x 48 images, 8 answers each


def projection(args, alone_per_image: float = 0.0) -> dict:
    """The full occupation study's GPU minutes by the cost model (engine/backends/gpu_costs.py), on 1 and 8
    H100s (8: the GPU seconds dealt out, plus the measured rank-0-alone seconds per image), with the
    evaluator of `--vqa-cost`, with a VLM, and with the distilled evaluator whose teacher is the VLM: every
    image embedded once (its probe reads the embedding) and `--teacher-share` of the images (the calibration
    sample and the unsure ones; bench/evaluation_cost.py's distilled_teacher_share) asked of the teacher.
    Each image's 8 questions are asked at once (gpu_costs.vqa_seconds)."""
    from engine.backends.gpu_costs import EMBED_SECONDS, image_seconds, vqa_seconds

    generation = image_seconds(args.generator_cost, 1)
    evaluators = {args.vqa_cost: vqa_seconds(args.vqa_cost, 8), "vlm": vqa_seconds("vlm", 8),
                  "distilled_vlm": EMBED_SECONDS + args.teacher_share * vqa_seconds("vlm", 8)}
    out = {"full_study_images": FULL_STUDY_IMAGES, "full_study_answers": FULL_STUDY_IMAGES * 8,
           "teacher_share": args.teacher_share}
    for name, evaluation in evaluators.items():
        per_image = generation + evaluation
        out[f"cost_model_full_study_min_1gpu_{name}"] = FULL_STUDY_IMAGES * per_image / 60
        out[f"cost_model_full_study_min_8gpu_{name}"] = FULL_STUDY_IMAGES * (per_image / 8 + alone_per_image) / 60
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tiny-sd", action="store_true", help="the tiny SD generate job on 1 vs 2 processes instead")
    ap.add_argument("--occupations", type=int, default=6, help="occupations of the study's subset (at most 26)")
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--generator-cost", default="sd-turbo", help="the generator's entry in the GPU cost table")
    ap.add_argument("--vqa-cost", default="blip_vqa", help="the VQA's entry in the GPU cost table (vlm: a VLM)")
    ap.add_argument("--projection", action="store_true", help="project the full study's time on 1 and 8 GPUs")
    ap.add_argument("--projection-only", action="store_true", help="the cost model's projection alone (no job runs)")
    ap.add_argument("--teacher-share", type=float, default=0.2,
                    help="the distilled evaluator's share of images asked of its teacher (for the projection)")
    ap.add_argument("--prompts", type=int, default=16, help=f"prompts in the job (at most {len(WORDS)})")
    ap.add_argument("--n", type=int, default=None, help="images per set (default 16; --tiny-sd: 4 per prompt)")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--threads", type=int, default=1, help="torch/OpenMP threads per process")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    if args.projection_only:
        return report(**projection(args))
    if not args.tiny_sd:
        args.n = args.n or 16
        return occupation_study(args)
    args.n = args.n or 4
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
