"""Bootstrap confidence intervals over images (DESIGN.md: every score with its uncertainty).

Items (images) are resampled with replacement; the interval is the percentile interval of
the statistic over the resamples. All resamples come from one (n_boot, n_items) index
matrix drawn once from `numpy.random.default_rng(seed)`, so a fixed seed gives the same
interval on every run and several arrays are resampled jointly (image i keeps its label,
embedding and caption together).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

URL = "https://doi.org/10.1201/9780429246593"
CITATION = """\
@book{efron1993introduction,
  title={An Introduction to the Bootstrap},
  author={Efron, Bradley and Tibshirani, Robert J.},
  publisher={Chapman and Hall/CRC},
  year={1993}
}
"""


@dataclass(frozen=True)
class Estimate:
    """A statistic on all items (`value`) and its bootstrap interval [`low`, `high`]."""

    value: float
    low: float
    high: float


def resample_indices(n_items: int, n_boot: int = 1000, seed: int = 0) -> np.ndarray:
    """Return an (n_boot, n_items) matrix of item indices drawn with replacement."""
    if n_items < 1:
        raise ValueError(f"need at least one item to resample, got {n_items}")
    if n_boot < 1:
        raise ValueError(f"n_boot must be positive, got {n_boot}")
    return np.random.default_rng(seed).integers(0, n_items, size=(n_boot, n_items))


def percentile_interval(values: np.ndarray, alpha: float = 0.05) -> tuple[float, float]:
    """Return the (α/2, 1 − α/2) percentiles of `values`, ignoring nan; nan if all are nan."""
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must be in (0, 1), got {alpha}")
    values = np.asarray(values, dtype=float)
    if np.isnan(values).all():
        return float("nan"), float("nan")
    low, high = np.nanpercentile(values, [50 * alpha, 100 - 50 * alpha])
    return float(low), float(high)


def bootstrap_ci(
    statistic: Callable,
    *arrays,
    n_items: int | None = None,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    batched: bool = False,
) -> Estimate:
    """Return Estimate(value, low, high): `statistic` on all items and its percentile interval.

    Two ways to call it:

    - `bootstrap_ci(statistic, a, b, ...)`: arrays with the same first dimension (one entry
      per image); `statistic(a_resampled, b_resampled, ...)` gets them resampled jointly.
    - `bootstrap_ci(statistic, n_items=n)`: `statistic(indices)` gets an int array of item
      indices (length n, with repeats) and looks the items up itself; use this for data that
      is not an array (lists of VQA answers, captions of different lengths).

    With `batched=True` the statistic is called once with the whole resample: arrays indexed
    by the (n_boot, n) index matrix, or the index matrix itself, and must return n_boot
    values; the value on all items is then computed from a single-row batch.
    Resamples where the statistic is nan (e.g. a class vanished) are left out of the
    percentiles.
    """
    if arrays and n_items is not None:
        raise ValueError("give either arrays or n_items, not both")
    if arrays:
        arrays = tuple(np.asarray(a) for a in arrays)
        lengths = {len(a) for a in arrays}
        if len(lengths) != 1:
            raise ValueError(f"arrays must have the same number of items, got lengths {sorted(lengths)}")
        n_items = lengths.pop()
    elif n_items is None:
        raise ValueError("give the arrays to resample or n_items")

    def apply(index: np.ndarray):
        return statistic(*(a[index] for a in arrays)) if arrays else statistic(index)

    index = resample_indices(n_items, n_boot, seed)
    everything = np.arange(n_items)
    if batched:
        value = float(np.asarray(apply(everything[None, :]), dtype=float).reshape(-1)[0])
        resampled = np.asarray(apply(index), dtype=float).reshape(-1)
        if resampled.shape != (n_boot,):
            raise ValueError(f"a batched statistic must return {n_boot} values, got shape {resampled.shape}")
    else:
        value = float(apply(everything))
        resampled = np.array([apply(row) for row in index], dtype=float)
    low, high = percentile_interval(resampled, alpha)
    return Estimate(value, low, high)
