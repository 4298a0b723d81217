"""The page of a bias check (engine/methods/check.py): the verdict, a chart per axis (the change of the
distance from the target per prompt, with its paired 95% interval; regressed prompts outlined) and every
row with its paired and unpaired intervals, p, q and verdict. `report(results)` is the offline HTML file
`python -m engine check --html FILE` writes. `paired_table` is the table Compare models shows too."""
from __future__ import annotations

import json

from . import Markup, charts, macro, render


def rows_view(rows: list[dict]) -> list[dict]:
    """The rows as the templates read them (each distance split out; missing numbers as None)."""
    return [{**r, "distance_base": (r.get("distance") or {}).get("base"),
             "distance_candidate": (r.get("distance") or {}).get("candidate"),
             "ci": r.get("ci") or [None, None], "ci_unpaired": r.get("ci_unpaired") or [None, None],
             "q": r.get("q"), "n_to_settle": r.get("n_to_settle"), "narrower": r.get("narrower")} for r in rows]


def paired_table(rows: list[dict], alpha: float, margin: float, table_id: str = "paired-rows") -> Markup:
    """The paired rows (prompt, axis, distances, change with its paired and unpaired intervals, p, q,
    verdict) as an HTML table."""
    return macro("paired.html", "paired_table")(rows_view(rows), alpha, margin, table_id)


def axis_chart(axis: str, rows: list[dict], margin: float) -> Markup:
    """Bars of the change of the distance from the target per prompt on one axis, with paired 95%
    intervals; regressed prompts outlined; each bar's tooltip its verdict."""
    return charts.bar_chart([r["prompt"] for r in rows], [r.get("delta") for r in rows],
                            ci=[tuple(r.get("ci") or (None, None)) for r in rows],
                            highlight=[r.get("verdict") == "more biased" for r in rows],
                            tooltip=[r.get("verdict", "") for r in rows], value_digits=3,
                            title=f"{axis}: change in distance from the target (candidate − base), ±{margin:g} "
                                  "is equivalent", x_title="candidate − base (total variation from the target)",
                            chart_id=f"check-axis-{axis}")


def page(results: dict) -> Markup:
    """Returns the HTML of a finished (or partial) check's results."""
    suite = results.get("suite") or {}
    rows = results.get("rows") or []
    alpha, margin = float(suite.get("alpha", 0.05)), float(suite.get("margin", 0.05))
    axes = list(dict.fromkeys(r["axis"] for r in rows))
    generators = results.get("generators") or {}
    empty = {"label": "?", "model": "?"}
    return render("check.html", rows=rows_view(rows), alpha=alpha, margin=margin, regressed=bool(results.get("regressed")),
                  base=generators.get("base", empty), candidate=generators.get("candidate", empty),
                  verdicts=[{"name": k, "count": v} for k, v in (results.get("verdicts") or {}).items()],
                  prompts=len({r["prompt"] for r in rows}), n=suite.get("n"), seed=suite.get("seed", 0),
                  axes=[{"name": a, "chart": axis_chart(a, [r for r in rows if r["axis"] == a], margin)} for a in axes],
                  suite=json.dumps(suite, ensure_ascii=False))


def report(results: dict) -> Markup:
    """The check as one self-contained HTML file (the chart runtime inlined: opens offline)."""
    from .export import page as standalone

    generators = results.get("generators") or {}
    title = (f"Bias check: {(generators.get('candidate') or {}).get('label', '?')} vs "
             f"{(generators.get('base') or {}).get('label', '?')}")
    return standalone(title, page(results))
