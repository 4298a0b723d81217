"""The Runs view: a stored run's header and page, comparisons, inline thumbnails (the Runs tab,
`runs show --html`, `runs compare --html`, exported reports). Markup: templates/runs.html.
Nothing here recomputes a result: the numbers come from engine/runs/history.py."""
from __future__ import annotations

import json
import time

from engine.common.names import readable
from engine.runs.history import get_run, run_prompt, run_records, short_model
from engine.store.store import ImageRecord, Store

from . import Markup, macro, page_for, thumbnail_data_uri
from .single_prompt import axis_html


def results_html(method: str, results: dict) -> Markup:
    """The results as the method's tab shows them (its page), else the generic page; a partial
    result the method's page cannot draw is shown generically, with a note saying so."""
    from .generic import page as generic_page

    if not results:
        return generic_page(results or {})
    try:
        return page_for(method)(results)
    except Exception as exc:  # noqa: BLE001 - e.g. a partial result of a failed or imported run
        return macro("runs.html", "incomplete")(method=method, error=type(exc).__name__) + generic_page(results)


def run_header_html(run: dict) -> Markup:
    """Who/what/when of a run: method, status, prompt, models, request, version."""
    return macro("runs.html", "header")(
        run=run, prompt=run_prompt(run), date=time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run["created"])),
        models=[(k, short_model(v)) for k, v in (run.get("models") or {}).items()],
        request=json.dumps(run.get("request") or {}, indent=1, default=str, ensure_ascii=False))


def open_run(store: Store, run_id: str) -> dict:
    """A stored run ready to show: the row, its HTML (header + results) and its images."""
    run = get_run(store, run_id)
    return {"run": run, "html": run_header_html(run) + results_html(run["method"], run.get("results") or {}),
            "records": run_records(store, run)}


def image_columns(columns: list[dict], block_id: str = "") -> Markup:
    """Image grids side by side, one per column {"key", "title", "images": [{"src", "caption"}],
    "more"}, each caption under its tile (never over the image)."""
    return macro("runs.html", "columns")(cols=columns, id=block_id)


def thumbnails_html(records: list[tuple[ImageRecord, str]], size: int = 96, limit: int = 48,
                    css_class: str = "gl-thumbs") -> Markup:
    """A grid of inline thumbnails (seed and set label as captions); no external files."""
    cells = []
    for record, label in records[:limit]:
        try:
            uri = thumbnail_data_uri(record.path, size)
        except OSError:
            continue
        caption = f"seed {record.seed}" + (f" · {label}" if label else "") + (" · flagged" if record.nsfw else "")
        cells.append({"uri": uri, "caption": caption})
    return macro("runs.html", "thumbnails")(cells=cells, size=size, css_class=css_class,
                                            more=len(records) - limit)


def _axes_side_by_side(store: Store, runs: list[dict], letters: list[str]) -> list[list[tuple[str, Markup]]]:
    """One row per axis: each run's distribution chart (same scale), next to each other."""
    results = [(store.get_run(r["id"]) or {}).get("results") or {} for r in runs]
    axes = list(dict.fromkeys(a for res in results for a in res.get("axes", {})))
    return [[(letter, axis_html(axis, res["axes"][axis]) if axis in res.get("axes", {}) else "")
             for letter, res in zip(letters, results)] for axis in axes]


def compare_html(comparison: dict, store: Store | None = None, thumbs: int = 12) -> Markup:
    """The comparison as HTML: who is compared, per-axis distributions side by side (Single
    Prompt), the score table with intervals and differences from the first run, and (given the
    store) the runs' image grids next to each other."""
    runs = comparison["runs"]
    letters = [chr(ord("A") + i) if i < 26 else str(i) for i in range(len(runs))]
    axes = (_axes_side_by_side(store, runs, letters)
            if store is not None and comparison.get("method") == "single_prompt" else [])
    grids = []
    if store is not None:
        for letter, r in zip(letters, runs):
            run = store.get_run(r["id"])
            grids.append((letter, r["prompt"], thumbnails_html(run_records(store, run) if run else [], 72, thumbs)))
    letter_of = {r["id"]: letter for letter, r in zip(letters, runs)}
    by_model = [(g["generator"], [letter_of[i] for i in g["runs"]]) for g in comparison.get("by_model") or []]
    names = {row["metric"]: readable(row["metric"]) for row in comparison["rows"]}
    return macro("runs.html", "compare")(comparison=comparison, runs=runs, letters=letters, axes=axes, grids=grids,
                                         by_model=by_model if len(by_model) > 1 else [], names=names)
