"""Speeds the tests used to assert with wall clocks, measured here instead (a loaded runner made them flake).

    python bench/metric_speed.py [--repeats 5]

- vendi_1000x768_ms: the Vendi score of 1,000 768-d embeddings (one 768² eigendecomposition),
  next to vendi_kernel_1000_ms, the same score from the 1,000 × 1,000 kernel; vendi_speedup is
  their ratio.
- synthetic_render_16_ms: the synthetic world renders 16 images of 512 × 512 (target < 100 ms).
- failed_load_max_s: the slowest ModelLoadError for a model that does not exist, offline (target < 2 s).
Headline last: vendi_speedup.
"""
from __future__ import annotations

import argparse

from _common import median_time, report


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()

    import numpy as np

    from engine.backends import load_backend
    from engine.backends.base import ModelSpec
    from engine.common.errors import ModelLoadError
    from engine.metrics.diversity import unit_rows, vendi_score, vendi_score_from_similarity
    from engine.models.presets import resolve_preset

    x = np.random.default_rng(2).normal(size=(1000, 768))
    u = unit_rows(x)
    vendi_ms = median_time(lambda: vendi_score(x), args.repeats) * 1000
    kernel_ms = median_time(lambda: vendi_score_from_similarity(u @ u.T), args.repeats) * 1000

    preset = resolve_preset("synthetic")[0]
    generator = load_backend(preset.generator)
    settings = generator.defaults()
    render_ms = median_time(lambda: generator.generate("a photo of a nurse", range(16), settings), args.repeats) * 1000

    missing = [ModelSpec("diffusers", "gaplens-test/no-such-model"), ModelSpec("hf_clip", "gaplens-test/no-such-clip"),
               ModelSpec("open_clip", "No-Such-ViT"), ModelSpec("hf_chat", "gaplens-test/no-such-llm"),
               ModelSpec("blip_vqa", "/nonexistent/gaplens-blip"), ModelSpec("vlm", "gaplens-test/no-such-vlm")]

    def fail(spec):
        try:
            load_backend(spec)
        except ModelLoadError:
            return
        raise AssertionError(f"{spec} loaded")

    for spec in missing:
        fail(spec)                                   # the first call pays for importing the library
    failed_load_max_s = max(median_time(lambda s=spec: fail(s), args.repeats) for spec in missing)

    report(vendi_1000x768_ms=vendi_ms, vendi_kernel_1000_ms=kernel_ms, synthetic_render_16_ms=render_ms,
           failed_load_max_s=failed_load_max_s, vendi_speedup=kernel_ms / vendi_ms)


if __name__ == "__main__":
    main()
