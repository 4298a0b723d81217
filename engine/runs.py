"""Run history: list, search, sort, open, delete and compare the runs in the store.

Any method's run works here. A method's row in `engine.methods.METHODS` gives its *scores*
(its results -> score rows, each a value with an optional 95% interval) and its headline;
runs of methods without scores are scored by flattening the numbers of their `summary` and
`results` (`flatten_scores`), so comparison and export work for every method, including
ones written after this module.

Rendering of a stored run goes through `engine/render.py`: `<method>_html(results)` when
the method has a renderer, else `generic_html(results)`. Nothing here recomputes a result.
No gradio here; the Runs tab (tabs/runs.py) and the CLI (engine/cli/runs.py) are thin.
"""
from __future__ import annotations

import base64
import html
import io
import json
import time
from typing import Callable, Iterable

from . import render
from .errors import InputError
from .methods import METHODS
from .scores import Score, as_interval, difference, number, short_number
from .store import ImageRecord, Store

STATUSES = ("done", "running", "stopped", "failed")
SORTS = ("newest", "oldest", "method", "prompt", "score", "status")


# -- score rows ------------------------------------------------------------------------------
def _is_matrix(x) -> bool:
    return (isinstance(x, list) and bool(x) and all(isinstance(r, list) and len(r) == len(x[0]) for r in x)
            and all(v is None or number(v) is not None for r in x for v in r))


# Keys whose content is not a score (per-image data, settings, large matrices, free text).
SKIP_KEYS = {"images", "settings", "labels", "answers", "captions", "similarity", "image_seeds", "request",
             "records", "keys", "key", "path", "seed", "seeds", "embedding", "embeddings", "vectors",
             "width", "height", "steps", "guidance", "created", "updated", "seconds"}
NAME_KEYS = ("name", "axis", "label", "prompt", "text", "concept", "value_name", "id")
MAX_LIST = 32


def flatten_scores(obj, prefix: str = "", limit: int = 2000) -> list[Score]:
    """Every number in a results/summary dict as a Score, with its interval where one sits
    next to it: an Estimate-like {"value", "low", "high"} dict, a sibling "ci": {name: [lo, hi]},
    a sibling "<name>_ci": [lo, hi], or for a dict "<name>" of numbers a parallel dict
    "<name>_ci" of intervals. Lists of dicts are keyed by their name-like field (so the same
    item lines up across runs); short lists of numbers by index."""
    out: list[Score] = []

    def emit(path: str, value, low=None, high=None):
        if len(out) < limit:
            group, _, metric = path.rpartition(".")
            out.append(Score(group, metric, value, low, high))

    def walk(node, path: str, outer_ci: dict | None = None):
        if len(out) >= limit:
            return
        if isinstance(node, dict):
            if "value" in node and number(node.get("value")) is not None and ("low" in node or "high" in node):
                emit(path, number(node["value"]), number(node.get("low")), number(node.get("high")))
                return
            ci = {**(outer_ci or {}), **(node["ci"] if isinstance(node.get("ci"), dict) else {})}
            matrix = node.get("matrix")
            if _is_matrix(matrix):  # a labelled matrix, its intervals in parallel ci_low / ci_high matrices
                rows = node.get("rows") or node.get("axes") or list(range(len(matrix)))
                cols = node.get("cols") or node.get("axes") or list(range(len(matrix[0])))
                low, high = node.get("ci_low"), node.get("ci_high")
                for i, row in enumerate(matrix):
                    for j, v in enumerate(row):
                        if number(v) is not None:
                            interval = ((number(low[i][j]), number(high[i][j])) if _is_matrix(low) and _is_matrix(high)
                                        else (None, None))
                            emit(f"{path}.matrix[{rows[i] if i < len(rows) else i} → {cols[j] if j < len(cols) else j}]",
                                 number(v), *interval)
            for k, v in node.items():
                k = str(k)
                if k in SKIP_KEYS or k == "ci" or k.endswith("_ci") or (
                        _is_matrix(matrix) and k in ("matrix", "ci_low", "ci_high")):
                    continue
                sub = f"{path}.{k}" if path else k
                value = number(v)
                if value is not None:
                    interval = as_interval(ci.get(k)) or as_interval(node.get(f"{k}_ci"))
                    emit(sub, value, *(interval or (None, None)))
                elif isinstance(v, (dict, list)):
                    parallel = node.get(f"{k}_ci")
                    walk(v, sub, parallel if isinstance(parallel, dict) else None)
        elif isinstance(node, list) and node and len(node) <= MAX_LIST * 4:
            if all(number(v) is not None for v in node):
                if len(node) <= MAX_LIST:
                    for i, v in enumerate(node):
                        emit(f"{path}[{i}]", number(v))
                return
            for i, item in enumerate(node[:MAX_LIST * 4]):
                if isinstance(item, dict):
                    name = next((str(item[k]) for k in NAME_KEYS if isinstance(item.get(k), str)), str(i))
                    walk(item, f"{path}[{name[:60]}]")
                elif isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and number(item[1]) is not None:
                    emit(f"{path}[{item[0][:60]}]", number(item[1]))  # [name, number] pairs, e.g. Top-K

    walk(obj, prefix)
    return out


def scores(run: dict) -> list[Score]:
    """Every score of a stored run: its method's `scores` (METHODS), else the flattened
    summary and results."""
    results, summary = run.get("results") or {}, run.get("summary") or {}
    method = METHODS.get(run["method"])
    scorer = method.scores if method else None
    if scorer is not None:
        try:
            return scorer(results, summary)
        except Exception:  # noqa: BLE001 - a partial/failed run's results may be incomplete
            pass
    rows = flatten_scores({k: v for k, v in summary.items() if k != "seconds"}, "summary")
    return rows + flatten_scores(results, "")


# -- listing ---------------------------------------------------------------------------------
def run_prompt(run: dict) -> str:
    """The prompt a run is about (request or results), or a short description of its prompts."""
    for source in (run.get("request") or {}, run.get("results") or {}):
        for key in ("prompt", "base_prompt", "seed_prompt", "initial_prompt"):
            if isinstance(source.get(key), str) and source[key].strip():
                return source[key]
        for key in ("prompts", "seed_prompts"):
            if isinstance(source.get(key), list) and source[key]:
                first = str(source[key][0])
                return first + (f" (+{len(source[key]) - 1} more)" if len(source[key]) > 1 else "")
    best = (run.get("summary") or {}).get("best_prompt")  # a mining run has no single prompt
    return f"mined; best: {best}" if best else ""


def short_model(label: str) -> str:
    """'synthetic_generator:/a/b/synthetic_world.json' -> 'synthetic_generator:synthetic_world.json'."""
    backend, sep, model = str(label).partition(":")
    if sep and ("/" in model or "\\" in model) and (model.startswith("/") or model.startswith(".")):
        model = model.replace("\\", "/").rstrip("/").rsplit("/", 1)[-1]
    return f"{backend}{sep}{model}"


def headline(run: dict) -> tuple[str, float | None]:
    """A one-line headline score for the runs table and the number it sorts by: the method's
    own (METHODS), else the first numbers of the summary."""
    method = METHODS.get(run["method"])
    if method is not None:
        try:
            return method.headline(run)
        except Exception:  # noqa: BLE001 - a partial/failed run's summary may be incomplete
            pass
    summary = run.get("summary") or {}
    items = [(k, v) for k, v in summary.items() if k not in ("seconds", "n") and number(v) is not None]
    text = " · ".join(f"{k} {short_number(v)}" for k, v in items[:3])
    return text, (float(items[0][1]) if items else None)


def list_runs(store: Store, search: str = "", method: str | None = None, status: str | None = None,
              sort: str = "newest") -> list[dict]:
    """Every run as a table row: id, method, status, prompt, models, date, headline, ...;
    `search` matches (case-insensitively, every word) id, method, prompt, models, status and
    headline; `sort` is one of SORTS."""
    if sort not in SORTS:
        raise InputError(f"unknown sort '{sort}'; choose one of {', '.join(SORTS)}")
    rows = []
    for run in store.list_runs(method or None):
        if status and run["status"] != status:
            continue
        text, value = headline(run)
        models = run.get("models") or {}
        row = {"id": run["id"], "method": run["method"], "status": run["status"], "prompt": run_prompt(run),
               "generator": short_model(models.get("generator", "")),
               "models": {k: short_model(v) for k, v in models.items()},
               "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(run["created"])),
               "created": run["created"], "updated": run["updated"], "headline": text, "score": value,
               "summary": run.get("summary") or {}, "request": run.get("request") or {},
               "version": run.get("version"), "error": run.get("error")}
        rows.append(row)
    words = (search or "").lower().split()
    if words:
        def haystack(r):
            return " ".join([r["id"], r["method"], r["status"], r["prompt"], r["headline"],
                             *r["models"].values()]).lower()
        rows = [r for r in rows if all(w in haystack(r) for w in words)]
    key = {
        "newest": (lambda r: -r["created"]), "oldest": (lambda r: r["created"]),
        "method": (lambda r: (r["method"], -r["created"])), "prompt": (lambda r: (r["prompt"].lower(), -r["created"])),
        "status": (lambda r: (r["status"], -r["created"])),
        "score": (lambda r: (r["score"] is None, -(r["score"] or 0.0), -r["created"])),
    }[sort]
    return sorted(rows, key=key)


# -- one run ---------------------------------------------------------------------------------
def get_run(store: Store, run_id: str) -> dict:
    run = store.get_run((run_id or "").strip())
    if run is None:
        raise InputError(f"no run '{run_id}' in the store at {store.data_dir} "
                         f"(`python -m engine runs list` shows the runs there)")
    return run


def run_records(store: Store, run: dict) -> list[tuple[ImageRecord, str]]:
    """The run's stored images in their recorded order, each with its set label. Images whose
    files are gone are left out."""
    found = store.get_images([r["image_key"] for r in run["images"]], verify=False)
    return [(found[r["image_key"]], r["label"]) for r in run["images"] if r["image_key"] in found]


def renderer_for(method: str) -> Callable[[dict], str] | None:
    """`render.<method>_html`, else `<method>_html` of a module `engine/render_<method>.py`."""
    fn = getattr(render, f"{method}_html", None)
    if fn is None and method.isidentifier():
        import importlib

        try:
            fn = getattr(importlib.import_module(f"{__package__}.render_{method}"), f"{method}_html", None)
        except ImportError:
            fn = None
    return fn


def results_html(method: str, results: dict) -> str:
    """The results as the method's tab shows them (its renderer), else a generic rendering."""
    fn = renderer_for(method)
    if fn is not None and results:
        try:
            return fn(results)
        except Exception as exc:  # noqa: BLE001 - e.g. a partial result of a failed run
            note = (f"<p class='gl-note'>This run's results are incomplete for the {html.escape(method)} view "
                    f"({html.escape(type(exc).__name__)}); shown generically.</p>")
            return note + render.generic_html(results)
    return render.generic_html(results)


def run_header_html(run: dict) -> str:
    """Who/what/when of a run: method, status, prompt, models, request, version."""
    models = "".join(f"<tr><td>{html.escape(k)}</td><td><code>{html.escape(short_model(v))}</code></td></tr>"
                     for k, v in (run.get("models") or {}).items())
    req = html.escape(json.dumps(run.get("request") or {}, indent=1, default=str))
    error = (f"<p class='gl-error'><b>Error:</b> {html.escape(run['error'])}</p>" if run.get("error") else "")
    date = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(run["created"]))
    status = run["status"]
    return (f"<div class='gl-run-header' data-run='{html.escape(run['id'])}'>"
            f"<p><b>Run</b> <code>{html.escape(run['id'])}</code> · <b>{html.escape(run['method'])}</b> · "
            f"status <span class='gl-status gl-status-{html.escape(status)}'>{html.escape(status)}</span> · "
            f"{date} · GapLens {html.escape(str(run.get('version', '')))}</p>"
            f"<p><b>Prompt:</b> {html.escape(run_prompt(run)) or '<i>(none)</i>'}</p>{error}"
            f"<table class='gl-models'><tr><th>role</th><th>model</th></tr>{models}</table>"
            f"<details><summary>Request</summary><pre>{req}</pre></details></div>")


def open_run(store: Store, run_id: str) -> dict:
    """A stored run ready to show: the row, its HTML (header + results) and its images."""
    run = get_run(store, run_id)
    return {"run": run, "html": run_header_html(run) + results_html(run["method"], run.get("results") or {}),
            "records": run_records(store, run)}


def delete_runs(store: Store, run_ids: Iterable[str], keep_images: bool = False) -> dict:
    """Delete runs and (unless keep_images) the images no remaining run uses."""
    total = {"runs": 0, "images": 0, "answers": 0, "embeddings": 0}
    missing = []
    for run_id in run_ids:
        removed = store.delete_run(run_id, keep_images=keep_images)
        if not removed["runs"]:
            missing.append(run_id)
        for k in total:
            total[k] += removed[k]
    total["missing"] = missing
    return total


# -- comparison ------------------------------------------------------------------------------
def compare_runs(store: Store, run_ids: list[str]) -> dict:
    """Scores of two or more runs side by side, each with its interval, and the difference of
    every run from the first (the baseline) with an approximate interval. Runs of different
    methods are compared on their flattened summaries only."""
    run_ids = [r for r in dict.fromkeys(x.strip() for x in run_ids if x and x.strip())]
    if len(run_ids) < 2:
        raise InputError("pick at least two runs to compare")
    runs = [get_run(store, r) for r in run_ids]
    methods = sorted({r["method"] for r in runs})
    same = len(methods) == 1
    if same:
        per_run = [scores(r) for r in runs]
    else:
        per_run = [flatten_scores({k: v for k, v in (r.get("summary") or {}).items() if k != "seconds"}, "summary")
                   for r in runs]
    order: dict[tuple[str, str], None] = {}
    for rows in per_run:
        for s in rows:
            order.setdefault((s.group, s.metric), None)
    lookup = [{(s.group, s.metric): s for s in rows} for rows in per_run]
    table = []
    for key in order:
        values = [lk.get(key) for lk in lookup]
        table.append({"group": key[0], "metric": key[1],
                      "values": [v.to_json() if v else None for v in values],
                      "differences": [difference(values[0], v) for v in values[1:]]})
    return {"runs": [{"id": r["id"], "method": r["method"], "status": r["status"], "prompt": run_prompt(r),
                      "generator": short_model((r.get("models") or {}).get("generator", "")),
                      "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"])),
                      "headline": headline(r)[0]} for r in runs],
            "method": methods[0] if same else None, "methods": methods, "rows": table,
            "note": ("" if same else "These runs are of different methods: only their summaries are compared.")}


def thumbnail_data_uri(path: str, size: int = 128, quality: int = 82) -> str:
    """A small JPEG of the image as a data: URI (for self-contained HTML)."""
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB")
        im.thumbnail((size, size))
        buf = io.BytesIO()
        im.save(buf, format="JPEG", quality=quality)
    return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode("ascii")


def thumbnails_html(records: list[tuple[ImageRecord, str]], size: int = 96, limit: int = 48,
                    css_class: str = "gl-thumbs") -> str:
    """A grid of inline thumbnails (seed and set label as captions); no external files."""
    cells = []
    for record, label in records[:limit]:
        try:
            uri = thumbnail_data_uri(record.path, size)
        except OSError:
            continue
        caption = f"seed {record.seed}" + (f" · {label}" if label else "") + (" · flagged" if record.nsfw else "")
        cells.append(f"<figure class='gl-thumb'><img src='{uri}' alt='{html.escape(caption)}' "
                     f"width='{size}' loading='eager'><figcaption>{html.escape(caption)}</figcaption></figure>")
    more = (f"<p class='gl-note'>… and {len(records) - limit} more image(s).</p>" if len(records) > limit else "")
    return f"<div class='{css_class}'>{''.join(cells)}</div>{more}"


def _cell(v: dict | None) -> str:
    if not v:
        return "–"
    if v.get("low") is not None and v.get("high") is not None:
        return render.fmt_ci(v["value"], (v["low"], v["high"]))
    return render.fmt(v["value"])


def _diff_cell(d: dict | None) -> str:
    if not d:
        return "–"
    text = (render.fmt_ci(d["value"], (d["low"], d["high"])) if d["low"] is not None else render.fmt(d["value"]))
    mark = " <b title='the approximate 95% interval excludes 0'>*</b>" if d.get("significant") else ""
    sign = "+" if d["value"] > 0 else ""
    return f"<span class='gl-diff' data-significant='{str(bool(d.get('significant'))).lower()}'>{sign}{text}{mark}</span>"


def compare_html(comparison: dict, store: Store | None = None, thumbs: int = 12) -> str:
    """The comparison as HTML: who is compared, per-axis distributions side by side (Single
    Prompt), the score table with intervals and differences from the first run, and (given the
    store) the runs' image grids next to each other."""
    runs = comparison["runs"]
    letters = [chr(ord("A") + i) if i < 26 else str(i) for i in range(len(runs))]
    who = "".join(f"<tr><td><b>{letters[i]}</b></td><td><code>{html.escape(r['id'])}</code></td>"
                  f"<td>{html.escape(r['method'])}</td><td>{html.escape(r['prompt'])}</td>"
                  f"<td><code>{html.escape(r['generator'])}</code></td><td>{r['date']}</td>"
                  f"<td>{html.escape(r['status'])}</td></tr>" for i, r in enumerate(runs))
    parts = [f"<div class='gl-compare'><h3>Comparison of {len(runs)} runs</h3>"
             f"<table class='gl-runs'><tr><th></th><th>run</th><th>method</th><th>prompt</th><th>generator</th>"
             f"<th>date</th><th>status</th></tr>{who}</table>"]
    if comparison.get("note"):
        parts.append(f"<p class='gl-note'>{html.escape(comparison['note'])}</p>")
    if store is not None and comparison.get("method") == "single_prompt":
        parts.append(_axes_side_by_side(store, runs, letters))
    head = "".join(f"<th>{letters[i]}</th>" for i in range(len(runs)))
    head += "".join(f"<th>{letters[i]} − A</th>" for i in range(1, len(runs)))
    body = []
    for row in comparison["rows"]:
        cells = "".join(f"<td class='gl-metric'>{_cell(v)}</td>" for v in row["values"])
        cells += "".join(f"<td class='gl-metric'>{_diff_cell(d)}</td>" for d in row["differences"])
        body.append(f"<tr data-metric='{html.escape(row['group'])}/{html.escape(row['metric'])}'>"
                    f"<td>{html.escape(row['group'])}</td><td>{html.escape(row['metric'])}</td>{cells}</tr>")
    parts.append(f"<table class='gl-compare-table'><tr><th>group</th><th>score</th>{head}</tr>{''.join(body)}</table>"
                 "<p class='gl-note'>Values are shown as value [95% interval] where the method computed one "
                 "(bootstrap over images). Differences are from run A, with an approximate 95% interval "
                 "(each run's interval read as a normal one, runs independent); * marks an interval that "
                 "excludes 0.</p>")
    if store is not None:
        grids = []
        for i, r in enumerate(runs):
            run = store.get_run(r["id"])
            records = run_records(store, run) if run else []
            grids.append(f"<div class='gl-compare-col'><h4>{letters[i]}: {html.escape(r['prompt'][:80])}</h4>"
                         f"{thumbnails_html(records, 72, thumbs)}</div>")
        parts.append(f"<div class='gl-compare-grids' style='display:flex;gap:16px;flex-wrap:wrap'>{''.join(grids)}</div>")
    parts.append("</div>")
    return "".join(parts)


def _axes_side_by_side(store: Store, runs: list[dict], letters: list[str]) -> str:
    """One row per axis: each run's distribution chart (same scale), next to each other."""
    results = [(store.get_run(r["id"]) or {}).get("results") or {} for r in runs]
    axes = list(dict.fromkeys(a for res in results for a in res.get("axes", {})))
    rows = []
    for axis in axes:
        cells = []
        for letter, res in zip(letters, results):
            m = res.get("axes", {}).get(axis)
            cells.append(f"<div><b>{letter}</b>{render.axis_html(axis, m) if m else '<p>–</p>'}</div>")
        rows.append(f"<div class='gl-compare-axis' style='display:flex;gap:18px;flex-wrap:wrap'>{''.join(cells)}</div>")
    return "".join(rows)
