"""How often the 95% share intervals contain the planted share in the synthetic world, for the
Jeffreys interval GapLens shows (issue 16) and the percentile bootstrap it replaced, at the N
people use. Exact over the binomial (no simulation noise): for each planted share p of 8
prompts × 3 axes, coverage = Σ_k P(k | N, p)·[p ∈ interval(k)].

    python bench/interval_coverage.py

Prints name=value lines; the headline ratio last (the bootstrap's miss rate over Jeffreys' at N = 8).
"""
from __future__ import annotations

import numpy as np
from scipy import stats

from _common import report

from engine.backends.synthetic import load_world
from engine.metrics.intervals import share_interval
from engine.models.presets import SYNTHETIC_TABLE

PROMPTS = [f"a photo of a {s}" for s in
           ("firefighter", "nurse", "doctor", "ceo", "teacher", "chef", "engineer", "farmer")]


def percentile_bootstrap(k: np.ndarray, n: int, alpha: float = 0.05):
    """The percentile bootstrap of a share k/n in the limit of many resamples: binomial quantiles."""
    p = k / n
    return stats.binom.ppf(alpha / 2, n, p) / n, stats.binom.ppf(1 - alpha / 2, n, p) / n


def coverage(interval, n: int, planted: list[float]) -> float:
    k = np.arange(n + 1)
    low, high = interval(k, n)
    return float(np.mean([stats.binom.pmf(k, n, p)[(low <= p) & (p <= high)].sum() for p in planted]))


def main() -> None:
    world = load_world(SYNTHETIC_TABLE)
    planted = [p for prompt in PROMPTS for axis in ("gender", "age", "skin tone")
               for p in world.expected_distribution(prompt, axis).values()]
    values = {}
    for n in (8, 16, 48):
        values[f"jeffreys_coverage_n{n}"] = coverage(share_interval, n, planted)
        values[f"percentile_bootstrap_coverage_n{n}"] = coverage(percentile_bootstrap, n, planted)
    values["miss_ratio_bootstrap_over_jeffreys_n8"] = ((1 - values["percentile_bootstrap_coverage_n8"])
                                                       / (1 - values["jeffreys_coverage_n8"]))
    report(**values)


if __name__ == "__main__":
    main()
