"""The page of a Compare models run: each model's main view side by side (distributions,
MAD per axis, IS matrices and BiasGraphs), then every compared number with the differences
from the first model and their intervals."""
from __future__ import annotations

import statistics

from ..common.names import readable
from . import Markup, counterfactuals, explain, fmt, fmt_ci, intersectional, render
from .check import paired_table
from .runs import image_columns
from .single_prompt import axis_html

TITLES = {"single_prompt": "Single Prompt", "counterfactuals": "Counterfactuals (TIBET)",
          "intersectional": "Intersectional Matrix (BiasConnect)"}
NO_EDGE = "No edge was kept for this model: nothing to draw."


def _letter(i: int) -> str:
    return chr(ord("A") + i) if i < 26 else str(i + 1)


def _views(method: str, results: list[dict]) -> list[tuple[str, list[str]]]:
    """(section title, one HTML fragment per model) for the method's main views."""
    if method == "single_prompt":
        axes = list(dict.fromkeys(a for r in results for a in r.get("axes", {})))
        return [(f"Distribution: {axis}", [axis_html(axis, r["axes"][axis]) if axis in r.get("axes", {})
                                           else render("note.html", text="–") for r in results]) for axis in axes]
    if method == "counterfactuals":
        return [("MAD per axis", [counterfactuals.mad_html(r) for r in results])]
    if method == "intersectional":
        graphs = [intersectional.iframe(intersectional.graph_from_results(r), height=380) if r.get("kept_edges")
                  else render("note.html", text=NO_EDGE) for r in results]
        return [("Intersectional Sensitivity (IS) matrices", [intersectional.matrix_html(r, f"is-matrix-{_letter(i)}")
                                                             for i, r in enumerate(results)]),
                ("BiasGraphs (kept edges)", graphs)]
    return []


def _cell(value: dict | None) -> str:
    if not value:
        return "–"
    if value.get("low") is not None and value.get("high") is not None:
        return fmt_ci(value["value"], (value["low"], value["high"]))
    return fmt(value["value"])


def _difference(d: dict | None) -> dict:
    if not d:
        return {"text": "–", "significant": "none", "paired": False, "unpaired": ""}
    text = fmt_ci(d["value"], (d["low"], d["high"])) if d.get("low") is not None else fmt(d["value"])
    sign = "+" if d["value"] > 0 else ""
    unpaired = d.get("unpaired") or [None, None]
    narrower = d.get("narrower")
    return {"text": sign + text, "significant": {True: "true", False: "false"}.get(d.get("significant"), "none"),
            "paired": bool(d.get("paired")),
            "unpaired": (f"unpaired [{fmt(unpaired[0])}, {fmt(unpaired[1])}]"
                         + (f", paired {narrower:.0%} narrower" if narrower is not None else "")) if d.get("paired") else ""}


def _paired(results: dict) -> list[dict]:
    """Each model's paired verdict table against the first (the models ran on the same seeds)."""
    pairs = (results.get("comparison") or {}).get("paired") or {}
    return [{"model": p["model"], "narrowest": _median_narrower(p["rows"]),
             "table": paired_table(p["rows"], pairs["alpha"], pairs["margin"], f"cm-paired-{i + 1}")}
            for i, p in enumerate(pairs.get("pairs") or [])]


def _median_narrower(rows: list[dict]) -> float | None:
    values = [r["narrower"] for r in rows if r.get("narrower") is not None]
    return statistics.median(values) if values else None


def page(results: dict, images: list[list[dict]] | None = None) -> Markup:
    """Returns the HTML of a finished (or partial) compare_models run's results; `images`: each
    model's images ({"src", "caption"}) shown side by side (the tab has them; a stored run does not)."""
    method, labels = results["method"], results["generators"]
    done = results.get("results") or []
    models = [{"letter": _letter(i), "generator": g, "model": (results.get("models") or labels)[i],
               "run_id": results["runs"][i] if i < len(results.get("runs", [])) else "not run yet"}
              for i, g in enumerate(labels)]
    sections = [{"title": title, "views": [{"letter": _letter(i), "generator": labels[i], "html": Markup(html)}
                                           for i, html in enumerate(views)]}
                for title, views in _views(method, done)]
    comparison = results.get("comparison") or {"rows": []}
    rows = [{"group": row["group"], "metric": row["metric"], "name": readable(row["metric"]),
             "tip": explain.tip(row["metric"]),
             "cells": [{"text": _cell(v), "pruned": p} for v, p in zip(row["values"], row.get("pruned") or
                                                                      [False] * len(row["values"]))],
             "differences": [_difference(d) for d in row["differences"]]} for row in comparison["rows"]]
    pairs = (results.get("comparison") or {}).get("paired") or {}
    return render("compare_models.html", method=method, title=f"Compare models: {TITLES.get(method, method)}",
                  paired=_paired(results), seeds=pairs.get("seeds"),
                  prompt=(results.get("request") or {}).get("prompt", ""), models=models, sections=sections,
                  rows=rows, images=image_columns([{"key": _letter(i), "title": f"{_letter(i)}: {labels[i]}",
                                                    "images": ims} for i, ims in enumerate(images or [])
                                                   if i < len(labels)], "cm-images") if images else "")
