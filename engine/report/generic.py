"""The page of any method without one of its own: its numbers as a table (with the 95%
intervals found next to them), a chart of the ones that have an interval, then the whole
results as readable JSON."""
from __future__ import annotations

import json

from . import Markup, charts, clip, macro

MAX_JSON = 200_000


def page(results: dict) -> Markup:
    """Score table, chart of the (first 24) non-negative scores with intervals, and the JSON."""
    from engine.runs.history import flatten_scores

    rows = flatten_scores(results)
    # bars start at 0: chart the scores whose whole interval is non-negative
    with_ci = [s for s in rows if s.low is not None and s.high is not None and s.low >= 0 and s.value >= 0][:24]
    chart = (charts.bar_chart([clip(s.name, 40, keep="end") for s in with_ci], [s.value for s in with_ci],
                              ci=[(s.low, s.high) for s in with_ci], title="scores with 95% intervals",
                              chart_id="generic-scores", width=560) if with_ci else "")
    dump = json.dumps(results, indent=1, default=str, ensure_ascii=False)
    if len(dump) > MAX_JSON:
        dump = dump[:MAX_JSON] + f"\n… (truncated: {len(dump) - MAX_JSON} more characters)"
    return macro("generic.html", "page")(prompt=results.get("prompt"), chart=chart, rows=rows, dump=dump)
