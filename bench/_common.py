"""Shared set-up for benchmarks: offline env, the tiny SD pipeline, thread settings."""
from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def tiny_sd_spec(workdir: str | None = None):
    """Build (once) the tiny random-weight SD pipeline from tests/tiny_models.py; return its spec."""
    from tiny_models import build_tiny_sd

    root = Path(workdir or os.environ.get("GAPLENS_BENCH_DIR", Path(tempfile.gettempdir()) / "gaplens-bench"))
    return build_tiny_sd(root)


def median_time(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def report(**values) -> None:
    for name, value in values.items():
        print(f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}")


def thread_settings() -> dict:
    import torch

    return {"torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count()}
