"""What serving store images as private copies costs (issue 26): a gallery of N stored images made
ready for the page, as before (Gradio copies the store's files into its cache itself while it
post-processes the Gallery) and now (tabs.common.served copies them first, then the same
post-processing), each on a fresh cache (first view) and again (a page shown twice).

    python bench/served_images.py [--n 64] [--repeats 5]

Headline last: served_over_gradio_ratio (first view, now / before; target about 1: the copy is
the one Gradio made anyway, only made earlier).
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

os.environ["GRADIO_TEMP_DIR"] = tempfile.mkdtemp(prefix="gaplens-bench-cache-")

from _common import median_time, report  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    import gradio as gr
    from gradio import processing_utils

    from engine.core.engine import Engine
    from tabs.common import gallery_items

    engine = Engine("synthetic", data_dir=tempfile.mkdtemp(prefix="gaplens-bench-"))
    records = engine.image_set("a photo of a doctor", list(range(args.n)))
    gallery = gr.Gallery()
    cache = os.environ["GRADIO_TEMP_DIR"]

    def show(items) -> None:
        processing_utils.move_files_to_cache(gallery.postprocess(items), gallery, postprocess=True)

    def before() -> None:   # the store's paths, copied by Gradio
        show([(r.path, f"seed {r.seed}") for r in records])

    def now() -> None:      # private copies first (tabs.common.served)
        show(gallery_items(records))

    def first_view(fn) -> float:   # the cache emptied before each (untimed)
        times = []
        for _ in range(args.repeats):
            shutil.rmtree(cache, ignore_errors=True)
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    first_before, first_now = first_view(before), first_view(now)
    again_before = median_time(before, args.repeats)
    again_now = median_time(now, args.repeats)
    report(images=args.n, first_view_before_ms=first_before * 1000, first_view_now_ms=first_now * 1000,
           again_before_ms=again_before * 1000, again_now_ms=again_now * 1000,
           again_ratio=again_now / again_before, served_over_gradio_ratio=first_now / first_before)


if __name__ == "__main__":
    main()
