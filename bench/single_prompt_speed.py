"""Single Prompt speed: time to the first image vs. to all images (N=16, tiny SD pipeline,
streamed through the method), and the metric suite's time on 1,000 images.

    python bench/single_prompt_speed.py [--n 16] [--metric-images 1000] [--n-boot 1000]

The first image should arrive after about one batch's worth of generation; the metric suite
(3 axes with 1,000-draw bootstrap CIs, Vendi, mean pairwise similarity, the gap score) must be
negligible next to generation (under 1 s). Headline figures last.
"""
from __future__ import annotations

import argparse
import tempfile
import time

import numpy as np
from _common import report, thread_settings, tiny_sd_spec


def streaming(n: int = 16, batch_size: int = 4) -> dict:
    from engine.core.engine import Engine
    from engine.common.events import Images
    from engine.methods.single_prompt import SinglePromptRequest, run

    spec = tiny_sd_spec()
    engine = Engine("synthetic", data_dir=tempfile.mkdtemp(prefix="gaplens-bench-"), generator=spec)
    engine.models.get(spec).batch_size = batch_size
    start, first, last = time.perf_counter(), None, None
    for event in run(SinglePromptRequest("a photo of a doctor", n=n, steps=4, gap=False, n_boot=200), engine):
        if isinstance(event, Images):
            first = first or time.perf_counter() - start
            last = time.perf_counter() - start
    return {"n_images": n, "batch_size": batch_size, "batches": -(-n // batch_size),
            "time_to_first_image_s": first, "time_to_all_images_s": last}


def metric_suite(n: int = 1000, dim: int = 512, n_variations: int = 16, n_boot: int = 1000) -> float:
    from engine.methods.axes import axis_for
    from engine.metrics.diversity import mean_pairwise_similarity, normalised_vendi, vendi_score
    from engine.metrics.gap import gap_score
    from engine.methods.measure import axis_metrics_with_ci

    rng = np.random.default_rng(0)
    labels = {"gender": rng.choice(["male", "female"], n, p=[.8, .2]).tolist(),
              "age": rng.choice(["young", "middle-aged", "old"], n).tolist(),
              "skin tone": rng.choice(["light", "medium", "dark", "other"], n, p=[.5, .3, .15, .05]).tolist()}
    images = rng.normal(size=(n, dim)).astype(np.float32)
    texts = rng.normal(size=(n_variations, dim)).astype(np.float32)
    start = time.perf_counter()
    for name, values in labels.items():
        axis_metrics_with_ci(values, axis_for(name), None, "paper", n_boot)
    vendi_score(images), normalised_vendi(images), mean_pairwise_similarity(images)
    gap_score(texts, images)
    return time.perf_counter() - start


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=16, help="images streamed through Single Prompt")
    ap.add_argument("--metric-images", type=int, default=1000, help="images of the metric suite")
    ap.add_argument("--n-boot", type=int, default=1000, help="bootstrap draws of the metric suite")
    args = ap.parse_args()
    s = streaming(args.n)
    suite = metric_suite(args.metric_images, n_boot=args.n_boot)
    report(**thread_settings(), **{k: v for k, v in s.items()}, metric_suite_images=args.metric_images,
           first_over_all_ratio=s["time_to_first_image_s"] / s["time_to_all_images_s"],
           **{f"metric_suite_{args.metric_images}_images_s": suite})


if __name__ == "__main__":
    main()
