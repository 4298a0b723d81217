"""Turning user-given weights (reference distributions, ideals, priorities) into distributions."""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def normalised_weights(names: Sequence[str], weights: Mapping[str, float], what: str) -> np.ndarray:
    """Return `weights` over `names` scaled to sum 1 (a name without a weight gets 0).

    Raises ValueError, naming `what`, for weights on labels outside `names`, negative
    weights or a zero sum.
    """
    outside = set(weights) - set(names)
    if outside:
        raise ValueError(f"{what} has labels outside {list(names)}: {sorted(outside)}")
    values = np.array([float(weights.get(name, 0.0)) for name in names])
    if (values < 0).any() or values.sum() <= 0:
        raise ValueError(f"{what} must be non-negative with a positive sum, got {dict(weights)}")
    return values / values.sum()
