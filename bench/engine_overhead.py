"""Engine overhead: images/s through the engine vs. a bare diffusers call on the same tiny SD
pipeline, measured side by side (interleaved) in one run, plus the cache-hit latency.

    python bench/engine_overhead.py [--n 8] [--steps 4] [--repeats 5]

The engine does more than the bare call: per-image seeds, a PNG per image, its sha256 and a
SQLite row (one transaction per generator call). Each engine round uses a fresh store, made before
its timing starts (opening a store creates its tables: a per-store cost, not a generation's). Times
are this process's CPU seconds (`time.process_time`; the wall-clock ratio is printed too): the work
itself, which other processes on a shared machine slow down in wall time but not here. Headline
figures last: engine_overhead_ratio (engine CPU seconds / bare CPU seconds; target < 1.10) and
cache_hit_ms (8 stored images served again; target < 50 ms).
"""
from __future__ import annotations

import argparse
import tempfile
import time

from _common import report, thread_settings, tiny_sd_spec


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    import torch

    from engine.core.engine import Engine

    spec = tiny_sd_spec()
    data_root = tempfile.mkdtemp(prefix="gaplens-bench-")
    engine = Engine("synthetic", data_dir=f"{data_root}/warm", generator=spec)
    settings = engine.settings(steps=args.steps, width=args.size, height=args.size)
    backend = engine.models.get(spec)
    pipe = backend.pipe  # the very same pipeline object for both paths
    seeds = list(range(args.n))

    def bare():
        pipe(prompt="a photo of a doctor", num_images_per_prompt=args.n, num_inference_steps=args.steps,
             guidance_scale=settings.guidance, height=args.size, width=args.size, output_type="pil",
             generator=[torch.Generator("cpu").manual_seed(s) for s in seeds])

    def fresh_engine(i: int) -> Engine:
        fresh = Engine("synthetic", data_dir=f"{data_root}/run{i}", generator=spec)
        fresh.models = engine.models  # same loaded pipeline, empty store: every image is generated
        return fresh

    engines = iter([fresh_engine(i) for i in range(args.repeats + 1)])

    def through_engine():
        next(engines).image_set("a photo of a doctor", seeds, settings)

    bare(), through_engine()  # warm-up
    times = {"bare": [], "engine": [], "bare_wall": [], "engine_wall": []}
    for _ in range(args.repeats):  # interleaved so drift on a busy machine hits both alike
        for name, fn in (("bare", bare), ("engine", through_engine)):
            cpu, wall = time.process_time(), time.perf_counter()
            fn()
            times[name].append(time.process_time() - cpu)
            times[f"{name}_wall"].append(time.perf_counter() - wall)
    bare_s, engine_s = (sorted(times[k])[len(times[k]) // 2] for k in ("bare", "engine"))
    wall_ratio = (sorted(times["engine_wall"])[args.repeats // 2] / sorted(times["bare_wall"])[args.repeats // 2])

    cached = Engine("synthetic", data_dir=f"{data_root}/cache", generator=spec)
    cached.models = engine.models
    cached.image_set("a photo of a doctor", seeds, settings)
    hits = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        records = cached.image_set("a photo of a doctor", seeds, settings)
        [r.image for r in records]  # decode too: what a tab needs
        hits.append((time.perf_counter() - start) * 1000)
    assert cached.stats.images_generated == args.n

    report(**thread_settings(), n_images=args.n, steps=args.steps, size=args.size, repeats=args.repeats,
           bare_images_per_cpu_s=args.n / bare_s, engine_images_per_cpu_s=args.n / engine_s,
           engine_overhead_wall_ratio=wall_ratio, engine_overhead_ratio=engine_s / bare_s,
           cache_hit_ms=sorted(hits)[len(hits) // 2])


if __name__ == "__main__":
    main()
