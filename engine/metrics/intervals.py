"""Intervals that hold at small N, how many images an answer needs, and how sure a headline is.

Shares (one class's share of N labels) get the Jeffreys interval: the equal-tailed 95%
interval of the Beta(k + ½, N − k + ½) posterior, with the lower bound set to 0 when k = 0
and the upper to 1 when k = N (Brown, Cai & DasGupta 2001, "Interval estimation for a
binomial proportion", Statist. Sci. 16(2), §4.1.2). We pick it over Wilson because its mean
coverage is the closest to nominal of the two at N = 8–48 and its worst case is less bad
(at N = 8 the lowest exact coverage is 0.88 for Jeffreys, 0.85 for Wilson), and because it is
the marginal of the Dirichlet posterior that gives the composite metrics their intervals, so
shares and metrics agree. 7 of 8 gives [0.55, 0.99]; 8 of 8 gives [0.74, 1] — never [1, 1].

Metrics of a whole distribution (parity difference, normalised entropy, KL, composite) get
posterior intervals: shares drawn from Dirichlet(counts + ½) and the metric computed on each
draw. A statistic of items that is not a function of class counts gets a BCa bootstrap
interval (`bca_interval`, scipy.stats.bootstrap; Efron 1987).

Every bound is clipped to the metric's range and written without a negative zero.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

Z95 = 1.959963984540054


def tidy(x: float | None, low: float = -math.inf, high: float = math.inf) -> float | None:
    """Return `x` clipped to [low, high] with −0.0 turned into 0.0 (None and nan stay as they are)."""
    if x is None:
        return None
    x = float(x)
    if math.isnan(x):
        return x
    return min(max(x, low), high) + 0.0


def bounded(value: float | None, low: float | None, high: float | None, lowest: float = -math.inf,
            highest: float = math.inf) -> tuple[float | None, float | None]:
    """Return the interval (low, high) stretched to include `value` and clipped to
    [lowest, highest]: a number is never shown outside its own interval or its metric's range.
    Missing bounds give (value, value); nothing at all gives (None, None)."""
    finite = [x for x in (value, low, high) if x is not None and math.isfinite(x)]
    if not finite:
        return None, None
    if low is None or high is None or not (math.isfinite(low) and math.isfinite(high)):
        low = high = value
    if value is not None and math.isfinite(value):
        low, high = min(low, value), max(high, value)
    return tidy(low, lowest, highest), tidy(high, lowest, highest)


def share_interval(k, n, alpha: float = 0.05):
    """Return the Jeffreys interval (low, high) of the share k/n (arrays broadcast).

    Beta(k + ½, n − k + ½) quantiles at α/2 and 1 − α/2; low = 0 at k = 0, high = 1 at k = n
    (Brown, Cai & DasGupta 2001, eq. 4.1 and the boundary modification). n = 0 gives (nan, nan).
    """
    k = np.asarray(k, dtype=float)
    n = np.asarray(n, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        low = np.where(k <= 0, 0.0, stats.beta.ppf(alpha / 2, k + 0.5, n - k + 0.5))
        high = np.where(k >= n, 1.0, stats.beta.ppf(1 - alpha / 2, k + 0.5, n - k + 0.5))
    empty = n <= 0
    low, high = np.where(empty, np.nan, low), np.where(empty, np.nan, high)
    if low.ndim == 0:
        return tidy(low, 0.0, 1.0), tidy(high, 0.0, 1.0)
    return np.clip(low, 0.0, 1.0) + 0.0, np.clip(high, 0.0, 1.0) + 0.0


def dirichlet_draws(counts: Sequence[float], n_draws: int = 2000, seed: int = 0) -> np.ndarray:
    """Return (n_draws, k) share vectors from the Dirichlet(counts + ½) posterior (Jeffreys prior)."""
    alpha = np.asarray(counts, dtype=float) + 0.5
    return np.random.default_rng(seed).dirichlet(alpha, size=int(n_draws))


def posterior_interval(draws, value: float | None = None, alpha: float = 0.05,
                       low: float = -math.inf, high: float = math.inf) -> tuple[float, float]:
    """Return the equal-tailed (α/2, 1 − α/2) interval of posterior `draws`, clipped to [low, high].

    When the plug-in `value` lies outside it (a metric at the edge of its range, e.g. entropy 0
    for 8 of 8: every posterior draw is above 0) the interval is stretched to include it, so a
    number is never shown outside its own interval.
    """
    draws = np.asarray(draws, dtype=float)
    draws = draws[np.isfinite(draws)]
    if not len(draws):
        return math.nan, math.nan
    lo, hi = np.percentile(draws, [50 * alpha, 100 - 50 * alpha])
    return bounded(value, float(lo), float(hi), low, high)


def bca_interval(statistic: Callable, *data, alpha: float = 0.05, n_resamples: int = 2000, seed: int = 0,
                 low: float = -math.inf, high: float = math.inf, paired: bool = False) -> tuple[float, float]:
    """Return the BCa bootstrap interval of `statistic(*data)` (scipy.stats.bootstrap, Efron 1987).

    Items are resampled (jointly across `data` when `paired`). Where BCa is undefined because
    some resamples have no value (Cohen's κ of a resample with one class) the percentile
    interval of the resamples that have one is used; when every resample gives the same value
    the interval is that value.
    """
    value = float(statistic(*data))
    data = tuple(np.asarray(d) for d in data)
    if not math.isfinite(value):
        return math.nan, math.nan
    if len(data[0]) < 2:
        return tidy(value, low, high), tidy(value, low, high)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = stats.bootstrap(data, statistic, n_resamples=n_resamples, confidence_level=1 - alpha,
                                 method="BCa", paired=paired, vectorized=False,
                                 rng=np.random.default_rng(seed))
    lo, hi = float(result.confidence_interval.low), float(result.confidence_interval.high)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        lo, hi = posterior_interval(result.bootstrap_distribution, value, alpha)
    return bounded(value, lo, hi, low, high)


# -- how many images -----------------------------------------------------------------------------
def n_for_half_width(share: float, half_width: float = 0.1, alpha: float = 0.05, n_max: int = 100_000) -> int:
    """Return the smallest N whose Jeffreys interval around `share` is at most ± `half_width`.

    The share is held at its observed value (k = round(share · N)); found by bisection on N
    after the normal-approximation guess z²·p(1−p)/h² (Brown et al. 2001 §5).
    """
    if not 0 < half_width < 0.5:
        raise ValueError(f"half_width must be in (0, 0.5), got {half_width}")
    p = min(max(float(share), 0.0), 1.0)

    def half(n: int) -> float:
        lo, hi = share_interval(round(p * n), n, alpha)
        return (hi - lo) / 2

    guess = max(1, math.ceil(stats.norm.ppf(1 - alpha / 2) ** 2 * max(p * (1 - p), 0.01) / half_width ** 2))
    lo_n, hi_n = 1, max(2, 2 * guess)
    while half(hi_n) > half_width and hi_n < n_max:
        hi_n = min(n_max, hi_n * 2)
    # bisection: the half-width wobbles by a little at the 1-image scale (k is rounded), which
    # moves the answer by an image or two at most
    while hi_n - lo_n > 1:
        mid = (lo_n + hi_n) // 2
        lo_n, hi_n = (lo_n, mid) if half(mid) <= half_width else (mid, hi_n)
    return hi_n


def n_for_power(share: float, parity: float, alpha: float = 0.05, power: float = 0.8) -> int | None:
    """Return the N at which a two-sided level-α test of share = parity rejects with `power`
    when the true share is `share` (one-sample test of a proportion, normal approximation:
    N = ((z₁₋α/₂·√(p₀q₀) + z_power·√(pq)) / (p − p₀))², Fleiss, Levin & Paik 2003 eq. 2.5).
    None when share equals parity (no N tells them apart)."""
    p, p0 = float(share), float(parity)
    if abs(p - p0) < 1e-9:
        return None
    za, zb = stats.norm.ppf(1 - alpha / 2), stats.norm.ppf(power)
    return max(1, math.ceil(((za * math.sqrt(p0 * (1 - p0)) + zb * math.sqrt(p * (1 - p))) / (p - p0)) ** 2))


def sample_size_advice(counts: dict[str, int], half_width: float = 0.1, alpha: float = 0.05,
                       power: float = 0.8) -> dict:
    """Return, for class counts, the N each share needs for a ± `half_width` interval and to be
    told from parity (1/k) with `power`: {"n": N now, "half_width", "need_width": {class: N},
    "need_parity": {class: N or None}, "n_width": max over classes, "n_parity": min over classes}."""
    n = sum(counts.values())
    k = max(1, len(counts))
    need_width = {c: n_for_half_width(v / n if n else 0.5, half_width, alpha) for c, v in counts.items()}
    need_parity = {c: n_for_power(v / n, 1 / k, alpha, power) if n else None for c, v in counts.items()}
    finite = [v for v in need_parity.values() if v is not None]
    return {"n": n, "half_width": half_width, "power": power, "need_width": need_width,
            "need_parity": need_parity, "n_width": max(need_width.values()) if need_width else None,
            "n_parity": min(finite) if finite else None}


# -- how sure a headline is ----------------------------------------------------------------------
CLEAR = 0.95


def top_probability(draws: dict[str, Sequence[float]], largest: bool = True) -> dict[str, float]:
    """Return {name: share of draws in which it has the largest (or smallest) value}.

    `draws` holds one array per candidate, aligned draw by draw (the same bootstrap resample or
    posterior draw in row b) or independent (then of any lengths: the longer ones are cut to the
    shortest); draws where any value is nan are left out; ties split evenly.
    """
    names = list(draws)
    arrays = [np.asarray(draws[n], dtype=float).reshape(-1) for n in names]
    shortest = min((len(a) for a in arrays), default=0)
    matrix = np.array([a[:shortest] for a in arrays]).T
    matrix = matrix[np.isfinite(matrix).all(axis=1)]
    if not len(matrix) or not names:
        return {n: math.nan for n in names}
    best = matrix.max(axis=1, keepdims=True) if largest else matrix.min(axis=1, keepdims=True)
    winners = np.isclose(matrix, best, rtol=0, atol=1e-12)
    return {n: float((winners[:, j] / winners.sum(axis=1)).mean()) for j, n in enumerate(names)}


def headline_claim(values: dict[str, float], draws: dict[str, Sequence[float]], n: int,
                   largest: bool = True, what: str = "most biased axis", fmt: str = "{:.2f}",
                   clear: float = CLEAR, max_n: int = 100_000, unit: str = "images per set",
                   question: str = "it") -> dict:
    """Return a headline that matches its statistics: the top candidate, the probability that it
    is the top one over the aligned `draws`, and either a clear claim (probability ≥ `clear`) or
    "no clear winner" with the N that would settle it (`question`: what it is, in words).

    N to settle: the top-two difference d over its draw spread s shrinks like 1/√N, so
    N' = N·(z·s/d)² with z = Φ⁻¹(clear) makes d significant at one-sided level 1 − clear.
    Returns {"top", "value", "probability", "clear", "n", "n_to_settle", "runner_up", "text"}.
    """
    names = [k for k in values if values[k] is not None and math.isfinite(values[k])]
    if not names:
        return {"top": None, "probability": None, "clear": False, "n": n, "n_to_settle": None,
                "runner_up": None, "value": None, "text": f"{what}: nothing to compare"}
    order = sorted(names, key=lambda k: -values[k] if largest else values[k])
    top = order[0]
    value = values[top]
    if len(order) == 1:
        return {"top": top, "value": value, "probability": 1.0, "clear": True, "n": n, "n_to_settle": None,
                "runner_up": None, "text": f"{what}: {top} ({fmt.format(value)}; the only candidate, N = {n})"}
    probs = top_probability({k: draws[k] for k in names}, largest)
    probability = probs[top]
    runner_up = order[1]
    a, b = np.asarray(draws[top], float).reshape(-1), np.asarray(draws[runner_up], float).reshape(-1)
    diff = a[:min(len(a), len(b))] - b[:min(len(a), len(b))]
    diff = diff[np.isfinite(diff)]
    d, s = abs(values[top] - values[runner_up]), float(diff.std()) if len(diff) else math.nan
    is_clear = bool(math.isfinite(probability) and probability >= clear)
    n_settle = None
    if not is_clear and n and s > 0:
        n_settle = max_n if d <= 0 else min(max_n, max(n + 1, math.ceil(n * (stats.norm.ppf(clear) * s / d) ** 2)))
    pct = f"{probability:.0%}" if math.isfinite(probability) else "?"
    if is_clear:
        text = f"{what}: {top} ({fmt.format(value)}; the top one with probability {pct}, N = {n})"
    else:
        settle = (f"about {n_settle} {unit} would settle {question}" if n_settle and n_settle < max_n
                  else f"even {max_n} {unit} would not settle {question}: the top two are as good as tied")
        text = (f"no clear winner for {what}: {top} ({fmt.format(value)}) is the top one with probability {pct} only, "
                f"{runner_up} ({fmt.format(values[runner_up])}) is next (N = {n}); {settle}")
    return {"top": top, "value": value, "probability": probability, "clear": is_clear, "n": n,
            "n_to_settle": n_settle, "runner_up": runner_up, "text": text}
