"""Run history: list, search, sort, open, delete and compare the runs in the store.

Any method's run works here. A method's row in `engine.methods.METHODS` gives its *scores*
(its results -> score rows, each a value with an optional 95% interval) and its headline;
runs of methods without scores are scored by flattening the numbers of their `summary` and
`results` (`flatten_scores`), so comparison and export work for every method, including
ones written after this module.

Pages of a stored run (its method's page, comparisons, thumbnails) are made by
engine/report/runs.py; this module holds the queries and scores. Nothing here recomputes a
result. No gradio here; the Runs tab (tabs/runs.py) and the CLI (engine/cli/runs.py) are thin.
"""
from __future__ import annotations

import time
from typing import Iterable

from ..common.errors import InputError
from ..common.names import readable
from ..common.scores import Score, as_interval, difference, number, short_number
from ..common.texts import check_text
from ..methods import METHODS
from ..store.store import ImageRecord, Store

STATUSES = ("done", "running", "stopped", "failed", "interrupted")
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
    """The prompt a run is about (request, summary or results), or a short description of its prompts."""
    for source in (run.get("request") or {}, run.get("summary") or {}, run.get("results") or {}):
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
    text = " · ".join(f"{readable(k)} {short_number(v)}" for k, v in items[:3])
    return text, (float(items[0][1]) if items else None)


def list_runs(store: Store, search: str = "", method: str | None = None, status: str | None = None,
              sort: str = "newest") -> list[dict]:
    """Every run as a table row: id, method, status, prompt, models, date, headline, ...;
    `search` matches (case-insensitively, every word) id, method, prompt, models, status and
    headline; `sort` is one of SORTS."""
    if sort not in SORTS:
        raise InputError(f"unknown sort '{sort}'; choose one of {', '.join(SORTS)}")
    check_text(search, "the search")
    rows = [_row(run) for run in store.list_runs(method or None) if not status or run["status"] == status]
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


PAGE_SIZE = 50


def list_page(store: Store, search: str = "", method: str | None = None, status: str | None = None,
              sort: str = "newest", page: int = 1, per_page: int = PAGE_SIZE) -> dict:
    """One page of `list_runs` for the Runs tab: {"rows": the page's rows, "total": rows
    matching, "page", "pages", "methods": every method with a visible run}. Without search
    or filters, newest/oldest pages are read straight from the database (an index on
    `created`), so the first page costs the same with 20 runs or 20,000."""
    page, per_page = max(1, int(page)), max(1, int(per_page))
    check_text(search, "the search")
    if not search.strip() and not method and not status and sort in ("newest", "oldest"):
        total = store.count_runs()
        pages = max(1, -(-total // per_page))
        page = min(page, pages)
        rows = [_row(r) for r in store.list_runs(limit=per_page, offset=(page - 1) * per_page,
                                                 oldest_first=sort == "oldest")]
    else:
        matching = list_runs(store, search, method, status, sort)
        total = len(matching)
        pages = max(1, -(-total // per_page))
        page = min(page, pages)
        rows = matching[(page - 1) * per_page:page * per_page]
    return {"rows": rows, "total": total, "page": page, "pages": pages, "methods": store.run_methods()}


def _row(run: dict) -> dict:
    """A stored run (as Store.list_runs gives it) as a runs-table row."""
    text, value = headline(run)
    models = run.get("models") or {}
    return {"id": run["id"], "method": run["method"], "status": run["status"], "prompt": run_prompt(run),
            "generator": short_model(models.get("generator", "")),
            "models": {k: short_model(v) for k, v in models.items()},
            "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(run["created"])),
            "created": run["created"], "updated": run["updated"], "headline": text, "score": value,
            "summary": run.get("summary") or {}, "request": run.get("request") or {},
            "version": run.get("version"), "error": run.get("error"), "published": bool(run.get("published"))}


# -- one run ---------------------------------------------------------------------------------
def get_run(store: Store, run_id: str) -> dict:
    return store.require_run(run_id, hint=" (`python -m engine runs list` shows the runs there)")


def run_records(store: Store, run: dict) -> list[tuple[ImageRecord, str]]:
    """The run's stored images in their recorded order, each with its set label. Images whose
    files are gone are left out."""
    found = store.get_images([r["image_key"] for r in run["images"]], verify=False)
    return [(found[r["image_key"]], r["label"]) for r in run["images"] if r["image_key"] in found]


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
    by_model: dict[str, list[str]] = {}     # generator -> the runs made with it, in the order picked
    for r in runs:
        by_model.setdefault(short_model((r.get("models") or {}).get("generator", "")), []).append(r["id"])
    return {"by_model": [{"generator": g, "runs": ids} for g, ids in by_model.items()],
            "runs": [{"id": r["id"], "method": r["method"], "status": r["status"], "prompt": run_prompt(r),
                      "generator": short_model((r.get("models") or {}).get("generator", "")),
                      "date": time.strftime("%Y-%m-%d %H:%M", time.localtime(r["created"])),
                      "headline": headline(r)[0]} for r in runs],
            "method": methods[0] if same else None, "methods": methods, "rows": table,
            "note": ("" if same else "These runs are of different methods: only their summaries are compared.")}
