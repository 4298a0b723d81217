"""The meaning of the numbers on a page (engine.common.meanings): a hover text per metric and
an info block listing what each metric shown measures, which way is more biased and its range.
Markup: templates/explain.html."""
from __future__ import annotations

from ..common.meanings import meaning
from . import Markup, macro


def tip(key: str) -> str:
    """Returns the one-line meaning of the metric `key` ("" for a number that is not a metric)."""
    m = meaning(key)
    return m.line() if m else ""


def info(keys, block_id: str = "", note: str = "") -> Markup:
    """Returns a block with one line per metric of `keys` (what it measures, which way is more
    biased, its range), then `note`."""
    rows = [{"key": k, "m": m} for k in dict.fromkeys(keys) if (m := meaning(k))]
    return macro("explain.html", "info")(rows=rows, id=block_id, note=note)
