"""Store at scale: `runs list`, opening a run and the Runs tab's first page on a store of
100,000 images and 2,000 runs.

    python bench/store_scale.py [--images 100000] [--runs 2000] [--repeats 3]

The store is built fast and honestly: real `images` rows (one per key, as generation writes
them) whose files are one shared tiny PNG (the rows record its sha256, so every read verifies
as it would for a real image), and 2,000 `generate` / `single_prompt` runs whose results list
their 50 images like real runs do. Times are medians over `--repeats`; targets < 0.5 s each.
Also delete_run_s (a run and the images only it used). Headline last: slowest_s, the slowest of
the three.
"""
from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import random
import tempfile
import time

from _common import median_time, report


def build(data_dir: str, n_images: int, n_runs: int) -> None:
    from PIL import Image

    from engine.store.store import Store, content_key

    store = Store(data_dir)
    png = io.BytesIO()
    Image.new("RGB", (8, 8), (120, 80, 40)).save(png, format="PNG")
    shared = store.image_dir / "shared.png"
    shared.write_bytes(png.getvalue())
    sha = hashlib.sha256(png.getvalue()).hexdigest()
    per_run = max(1, n_images // n_runs)
    rng = random.Random(0)
    now = time.time()
    images, runs, links = [], [], []
    for r in range(n_runs):
        prompt = f"a photo of a {rng.choice(['doctor', 'nurse', 'pilot', 'chef', 'judge'])} number {r}"
        keys = [content_key("image", "bench", prompt, s) for s in range(per_run)]
        images += [(k, "synthetic_generator:synthetic_world.json", prompt, "", s, 1, 0.0, 64, 64, "default",
                    str(shared), sha, 0, now, "local", now, len(png.getvalue())) for s, k in enumerate(keys)]
        records = [{"key": k, "prompt": prompt, "seed": s, "path": str(shared), "nsfw": False, "cached": False}
                   for s, k in enumerate(keys)]
        method = "generate" if r % 2 else "single_prompt"
        summary = ({"n": per_run, "flagged": 0} if method == "generate" else
                   {"cbs_gender": rng.random(), "cbs_age": rng.random(), "vendi": 1 + 5 * rng.random(), "n": per_run})
        results = {"prompt": prompt, "images": records, "settings": {"steps": 1, "width": 64, "height": 64}}
        created = now - (n_runs - r) * 60
        runs.append((f"bench-{r:05d}", method, "done", json.dumps({"prompt": prompt, "n": per_run}),
                     json.dumps(results), json.dumps(summary),
                     json.dumps({"generator": "synthetic_generator:synthetic_world.json"}), "bench", None,
                     created, created))
        links += [(f"bench-{r:05d}", k, "", i) for i, k in enumerate(keys)]
    with store._write() as db:
        db.executemany(f"INSERT INTO images VALUES ({','.join('?' * 17)})", images)
        db.executemany("INSERT INTO runs (id, method, status, request, results, summary, models, version, error, "
                       "created, updated) VALUES (?,?,?,?,?,?,?,?,?,?,?)", runs)
        db.executemany("INSERT INTO run_images VALUES (?,?,?,?)", links)
    store.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--images", type=int, default=100_000)
    ap.add_argument("--runs", type=int, default=2_000)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()

    from engine.runs import history as runs
    from engine.cli import main as cli
    from engine.report.runs import open_run as open_run_page

    data_dir = tempfile.mkdtemp(prefix="gaplens-store-scale-")
    start = time.perf_counter()
    build(data_dir, args.images, args.runs)
    build_s = time.perf_counter() - start

    from engine.store.store import Store

    store = Store(data_dir)
    middle = f"bench-{args.runs // 2:05d}"

    def runs_list():  # the command as a user types it, output discarded
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink):
            assert cli(["runs", "list", "--data-dir", data_dir]) == 0

    def open_run():
        opened = open_run_page(store, middle)  # as the Runs tab opens it: header, results page, images
        assert len(opened["records"]) == args.images // args.runs

    def runs_tab_first_page():
        page = runs.list_page(store, page=1)
        assert len(page["rows"]) == runs.PAGE_SIZE and page["total"] == n_runs

    victims = iter(f"bench-{i:05d}" for i in range(args.runs))

    def delete_run():  # finds the images no other run links to (the index on run_images.image_key)
        assert store.delete_run(next(victims))["runs"] == 1

    images, n_runs = store.count("images"), store.count("runs")
    times = {name: median_time(fn, args.repeats) for name, fn in
             (("runs_list_s", runs_list), ("open_run_s", open_run), ("runs_tab_first_page_s", runs_tab_first_page))}
    delete_s = median_time(delete_run, args.repeats)
    report(images=images, runs=n_runs, build_s=build_s, **times, delete_run_s=delete_s,
           slowest_s=max(times.values()))


if __name__ == "__main__":
    main()
