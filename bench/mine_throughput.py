"""Mine Prompts throughput: prompts scored per second on the synthetic stacks (cold store,
then the same run replayed from the store), and what a resumed run serves from the cache.

    python bench/mine_throughput.py [--iterations 4] [--population 8] [-n 16]

The resume case is the hard one: a CLI run is killed (SIGKILL, no chance to save) in the
middle of an iteration, then resumed in this process. Its saved state is up to a second
older than its images, so the resumed run scores some prompts again: their images must all
come from the store. `resume_regenerated_images` counts images generated again although the
store already had them (must be 0). Headline figures last.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time

from _common import ROOT, report

GA = dict(iterations=4, population=8, select=2, mutations=3, n=16, seed=0)


def throughput(preset: str) -> dict:
    from engine.core.engine import Engine
    from engine.methods import mine

    data = tempfile.mkdtemp(prefix=f"gaplens-bench-{preset}-")
    engine = Engine(preset, data_dir=data, max_images=256)
    engine.model_id("generator")                          # load outside the timing
    start = time.perf_counter()
    results = mine.search(mine.MineRequest(**GA), engine)
    cold = time.perf_counter() - start
    prompts = sum(n.get("score") is not None for n in results["nodes"])
    mine._SCORE_MEMO.clear()                             # replay through the store, not memory
    start = time.perf_counter()
    mine.search(mine.MineRequest(**GA), Engine(preset, data_dir=data, max_images=256))
    warm = time.perf_counter() - start
    return {f"{preset}_prompts": prompts, f"{preset}_images_per_prompt": GA["n"],
            f"{preset}_cold_prompts_per_s": prompts / cold, f"{preset}_cached_prompts_per_s": prompts / warm}


def killed_then_resumed() -> dict:
    from engine.core.engine import Engine
    from engine.methods import mine

    data = tempfile.mkdtemp(prefix="gaplens-bench-resume-")
    cmd = [sys.executable, "-m", "engine", "mine", "--preset", "synthetic", "--data-dir", data, "--quiet",
           *[f"--{k.replace('_', '-')}={GA[k]}" for k in ("iterations", "population", "select", "mutations", "seed")],
           "-n", str(GA["n"]),
           # each image takes a GPU's time (the cost model: no output or cache key changes), so the kill lands
           # in the middle of iteration 2 however small the run
           "--generator-option", "seconds_per_image=0.02"]
    child = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})
    engine = Engine("synthetic", data_dir=data, max_images=256)
    deadline, run_id = time.time() + 120, None
    while time.time() < deadline:                       # kill it in the middle of iteration 2
        if child.poll() is not None:
            raise SystemExit(f"the mining run ended (exit {child.returncode}) before it could be killed")
        runs = mine.list_runs(engine)
        if runs:
            run_id = runs[0]["id"]
            results = engine.store.get_run(run_id)["results"]
            pending = results.get("pending") or {}
            scored = sum(n.get("score") is not None for n in results.get("nodes", []))
            if pending.get("iteration") == 1 and engine.store.count("images") >= (scored + 2) * GA["n"]:
                break                                   # images made after the last saved state
        time.sleep(0.05)
    child.send_signal(signal.SIGKILL)
    child.wait()
    before = {row["key"] for row in engine.store._read("SELECT key FROM images")}
    saved = engine.store.get_run(run_id)["results"]
    scored_saved = sum(n.get("score") is not None for n in saved["nodes"])

    start = time.time()
    fresh = Engine("synthetic", data_dir=data, max_images=256)
    done = list(mine.run(mine.MineRequest(resume=run_id), fresh))[-1]
    regenerated = engine.store._read("SELECT COUNT(*) FROM images WHERE created >= ?", (start,))[0][0]
    regenerated_known = sum(1 for row in engine.store._read("SELECT key FROM images WHERE created >= ?", (start,))
                            if row["key"] in before)
    stats = fresh.stats
    asked = stats.image_cache_hits + stats.images_generated
    return {"resume_images_in_store_at_kill": len(before), "resume_prompts_saved_as_scored": scored_saved,
            "resume_images_generated": stats.images_generated, "resume_image_cache_hits": stats.image_cache_hits,
            "resume_llm_calls": stats.llm_calls, "resume_llm_cache_hits": stats.llm_cache_hits,
            "resume_new_images_written": regenerated, "resume_complete": int(done.results["complete"]),
            "resume_image_cache_hit_rate": stats.image_cache_hits / asked if asked else 1.0,
            "resume_already_made_hit_rate": (stats.image_cache_hits / (stats.image_cache_hits + regenerated_known)
                                             if stats.image_cache_hits + regenerated_known else 1.0),
            "resume_regenerated_images": regenerated_known}


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=GA["iterations"])
    ap.add_argument("--population", type=int, default=GA["population"])
    ap.add_argument("-n", type=int, default=GA["n"], help="images per prompt")
    args = ap.parse_args()
    GA.update(iterations=args.iterations, population=args.population, n=args.n)
    colour = throughput("colour")
    synthetic = throughput("synthetic")
    resumed = killed_then_resumed()
    headline = {"synthetic_prompts_per_s": synthetic.pop("synthetic_cold_prompts_per_s"),
                "resume_regenerated_images": resumed.pop("resume_regenerated_images"),
                "resume_already_made_hit_rate": resumed.pop("resume_already_made_hit_rate")}
    report(**{"cpu_count": os.cpu_count()}, **colour, **synthetic, **resumed, **headline)


if __name__ == "__main__":
    main()
