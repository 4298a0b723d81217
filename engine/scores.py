"""Score rows: one number of a run with its optional 95% interval.

Data only (no HTML, no store): methods build their rows here (`METHODS[name].scores`), the
Runs tab, comparison and export read them through `engine.runs.scores`.
"""
from __future__ import annotations

from dataclasses import dataclass


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
