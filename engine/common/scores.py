"""Score rows: one number of a run with its optional 95% interval.

Data only (no HTML, no store): methods build their rows here (`METHODS[name].scores`), the
Runs tab, comparison and export read them through `engine.runs.history.scores`; `difference` compares
one score of two runs.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

from .meanings import clip_interval, difference_range


@dataclass
class Score:
    """One number of a run: `group` (e.g. an axis) and `metric` name it; `low`/`high` is its
    95% interval when the method computed one."""

    group: str
    metric: str
    value: float
    low: float | None = None
    high: float | None = None

    @property
    def name(self) -> str:
        return f"{self.group} / {self.metric}" if self.group else self.metric

    def to_json(self) -> dict:
        return {"group": self.group, "metric": self.metric, "value": self.value, "low": self.low,
                "high": self.high}


def is_finite(x) -> bool:
    """True for an int or float (not a bool) that is neither nan nor infinite.

    >>> is_finite(1), is_finite(float("nan")), is_finite(True), is_finite("1")
    (True, False, False, False)
    """
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def is_missing(x) -> bool:
    """True for None and NaN (a value that was not measured); False for any other value, inf
    and strings included. The one NaN test: not `x != x`, not `isinstance(x, float) and ...`.

    >>> is_missing(None), is_missing(float("nan")), is_missing(0.0), is_missing("n/a")
    (True, True, False, False)
    """
    return x is None or (isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isnan(x))


def finite_or_none(x) -> float | None:
    """`x` as a float when it is a finite number, else None (JSON has no nan).

    >>> finite_or_none(2), finite_or_none(float("nan")), finite_or_none(None)
    (2.0, None, None)
    """
    return None if x is None or not math.isfinite(float(x)) else float(x)


def number(x) -> float | None:
    """A JSON value as a float when it is a number (bools and None are not), else None.

    >>> number(3), number(True), number("3")
    (3.0, None, None)
    """
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    return None


def as_interval(x) -> tuple[float, float] | None:
    """[low, high] (two numbers) as a tuple of floats, else None."""
    if isinstance(x, (list, tuple)) and len(x) == 2 and all(number(v) is not None for v in x):
        return float(x[0]), float(x[1])
    return None


def short_number(v) -> str:
    """A number for a one-line headline: integers whole, else 3 significant digits.

    >>> short_number(12.0), short_number(0.38512)
    ('12', '0.385')
    """
    v = float(v)
    return f"{v:.0f}" if v.is_integer() and abs(v) < 1e6 else f"{v:.3g}"


Z95 = 1.959963984540054


def _se(s: Score) -> float | None:
    """The standard error a 95% interval implies when read as a normal one; None without one."""
    if s.low is None or s.high is None or any(map(math.isnan, (s.low, s.high))):
        return None
    return (s.high - s.low) / (2 * Z95)


def difference(a: Score | None, b: Score | None) -> dict | None:
    """b − a with an approximate 95% interval: the two runs' intervals read as normal ones from
    independent image sets, se = sqrt(se_a² + se_b²), clipped to the range a difference of the
    metric can take (±(high − low), engine.common.meanings). `significant` when it excludes 0."""
    if a is None or b is None or math.isnan(a.value) or math.isnan(b.value):
        return None
    d = {"value": b.value - a.value, "low": None, "high": None, "significant": None}
    se_a, se_b = _se(a), _se(b)
    if se_a is not None and se_b is not None:
        se = math.hypot(se_a, se_b)
        low, high = clip_interval(d["value"] - Z95 * se, d["value"] + Z95 * se, *difference_range(b.metric))
        d.update(low=low, high=high)
        d["significant"] = bool(d["low"] > 0 or d["high"] < 0)
    return d
