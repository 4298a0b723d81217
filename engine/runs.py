"""Run history: list, search, sort, open, delete and compare the runs in the store.

Any method's run works here. A method can register a *scorer* (its results -> score rows,
each a value with an optional 95% interval) in `SCORERS`; runs of methods without one are
scored by flattening the numbers of their `summary` and `results` (`flatten_scores`), so
comparison and export work for every method, including ones written after this module.

Rendering of a stored run goes through `engine/render.py`: `<method>_html(results)` when
the method has a renderer, else `generic_html(results)`. Nothing here recomputes a result.
No gradio here; the Runs tab (tabs/runs.py) and the CLI (`python -m engine runs ...`) are thin.
"""
from __future__ import annotations

import base64
import html
import io
import json
import math
import sys
import time
from dataclasses import dataclass
from typing import Callable, Iterable

from . import render
from .errors import InputError
from .names import readable, readable_method
from .store import ImageRecord, Store

STATUSES = ("done", "running", "stopped", "failed")
SORTS = ("newest", "oldest", "method", "prompt", "score", "status")


# -- score rows ------------------------------------------------------------------------------
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


def _num(x) -> float | None:
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, (int, float)):
        return float(x)
    return None


def _pair(x) -> tuple[float, float] | None:
    if isinstance(x, (list, tuple)) and len(x) == 2 and all(_num(v) is not None for v in x):
        return float(x[0]), float(x[1])
    return None


def _is_matrix(x) -> bool:
    return (isinstance(x, list) and bool(x) and all(isinstance(r, list) and len(r) == len(x[0]) for r in x)
            and all(v is None or _num(v) is not None for r in x for v in r))


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
            if "value" in node and _num(node.get("value")) is not None and ("low" in node or "high" in node):
                emit(path, _num(node["value"]), _num(node.get("low")), _num(node.get("high")))
                return
            ci = {**(outer_ci or {}), **(node["ci"] if isinstance(node.get("ci"), dict) else {})}
            matrix = node.get("matrix")
            if _is_matrix(matrix):  # a labelled matrix, its intervals in parallel ci_low / ci_high matrices
                rows = node.get("rows") or node.get("axes") or list(range(len(matrix)))
                cols = node.get("cols") or node.get("axes") or list(range(len(matrix[0])))
                low, high = node.get("ci_low"), node.get("ci_high")
                for i, row in enumerate(matrix):
                    for j, v in enumerate(row):
                        if _num(v) is not None:
                            interval = ((_num(low[i][j]), _num(high[i][j])) if _is_matrix(low) and _is_matrix(high)
                                        else (None, None))
                            emit(f"{path}.matrix[{rows[i] if i < len(rows) else i} → {cols[j] if j < len(cols) else j}]",
                                 _num(v), *interval)
            for k, v in node.items():
                k = str(k)
                if k in SKIP_KEYS or k == "ci" or k.endswith("_ci") or (
                        _is_matrix(matrix) and k in ("matrix", "ci_low", "ci_high")):
                    continue
                sub = f"{path}.{k}" if path else k
                value = _num(v)
                if value is not None:
                    interval = _pair(ci.get(k)) or _pair(node.get(f"{k}_ci"))
                    emit(sub, value, *(interval or (None, None)))
                elif isinstance(v, (dict, list)):
                    parallel = node.get(f"{k}_ci")
                    walk(v, sub, parallel if isinstance(parallel, dict) else None)
        elif isinstance(node, list) and node and len(node) <= MAX_LIST * 4:
            if all(_num(v) is not None for v in node):
                if len(node) <= MAX_LIST:
                    for i, v in enumerate(node):
                        emit(f"{path}[{i}]", _num(v))
                return
            for i, item in enumerate(node[:MAX_LIST * 4]):
                if isinstance(item, dict):
                    name = next((str(item[k]) for k in NAME_KEYS if isinstance(item.get(k), str)), str(i))
                    walk(item, f"{path}[{name[:60]}]")
                elif isinstance(item, list) and len(item) == 2 and isinstance(item[0], str) and _num(item[1]) is not None:
                    emit(f"{path}[{item[0][:60]}]", _num(item[1]))  # [name, number] pairs, e.g. Top-K

    walk(obj, prefix)
    return out


def _single_prompt_scores(results: dict, summary: dict) -> list[Score]:
    rows = []
    for axis, m in results.get("axes", {}).items():
        ci = m.get("ci", {})
        for key in ("composite_bias_score", "parity_difference", "normalised_entropy", "kl_divergence",
                    "bias_amplification"):
            if _num(m.get(key)) is not None:
                rows.append(Score(axis, key, float(m[key]), *(_pair(ci.get(key)) or (None, None))))
        for c in m.get("classes", []):
            share = m.get("representation_parity", {}).get(c, 0.0)
            rows.append(Score(axis, f"share: {c}", float(share), *(_pair(m.get("share_ci", {}).get(c)) or (None, None))))
    d = results.get("diversity") or {}
    for key in ("vendi", "vendi_normalised", "mean_pairwise_similarity"):
        if _num(d.get(key)) is not None:
            rows.append(Score("diversity", key, float(d[key])))
    g = results.get("gap") or {}
    for key in ("score", "coverage_term", "alignment_term"):
        if _num(g.get(key)) is not None:
            rows.append(Score("gap", key, float(g[key])))
    for concept, freq in results.get("top_concepts") or []:
        rows.append(Score("top concepts", str(concept), float(freq)))
    return rows


def _generate_scores(results: dict, summary: dict) -> list[Score]:
    return [Score("images", k, float(summary[k])) for k in ("n", "flagged") if _num(summary.get(k)) is not None]


# method -> fn(results, summary) -> list[Score]. Other methods may register theirs here.
SCORERS: dict[str, Callable[[dict, dict], list[Score]]] = {
    "single_prompt": _single_prompt_scores,
    "generate": _generate_scores,
}


def scores(run: dict) -> list[Score]:
    """Every score of a stored run (method scorer, else the flattened summary and results)."""
    results, summary = run.get("results") or {}, run.get("summary") or {}
    scorer = SCORERS.get(run["method"])
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
    """A one-line headline score for the runs table and the number it sorts by."""
    summary = run.get("summary") or {}
    method = run["method"]
    if method == "single_prompt":
        cbs = {k[4:]: v for k, v in summary.items() if k.startswith("cbs_") and _num(v) is not None}
        parts, value = [], None
        if cbs:
            axis = max(cbs, key=cbs.get)
            value = float(cbs[axis])
            parts.append(f"max {readable('composite_bias_score')} {value:.3f} ({axis})")
        if _num(summary.get("vendi")) is not None:
            parts.append(f"Vendi {summary['vendi']:.2f}")
        if _num(summary.get("gap_score")) is not None:
            parts.append(f"gap {summary['gap_score']:.3f}")
        return " · ".join(parts), value
    if method == "compare_models":
        generators = summary.get("generators") or []
        return f"{readable_method(summary.get('method', ''))} on " + " vs ".join(map(str, generators)), None
    if method == "generate":
        n = summary.get("n")
        return (f"{n} images" if n is not None else ""), _num(n)
    items = [(k, v) for k, v in summary.items() if k not in ("seconds", "n") and _num(v) is not None]
    text = " · ".join(f"{readable(k)} {_short_number(v)}" for k, v in items[:3])
    return text, (float(items[0][1]) if items else None)


def _short_number(v) -> str:
    v = float(v)
    return f"{v:.0f}" if v.is_integer() and abs(v) < 1e6 else f"{v:.3g}"


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

        try:    # a page module of engine.report (`page(results)`), e.g. compare_models
            page = getattr(importlib.import_module(f"{__package__}.report.{method}"), "page", None)
            if page is not None:
                return lambda results: str(page(results))
        except ImportError:
            pass
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
Z95 = 1.959963984540054


def _se(s: Score) -> float | None:
    if s.low is None or s.high is None or any(map(math.isnan, (s.low, s.high))):
        return None
    return (s.high - s.low) / (2 * Z95)


def difference(a: Score | None, b: Score | None) -> dict | None:
    """b − a with an approximate 95% interval: the two runs' intervals read as normal ones from
    independent image sets, se = sqrt(se_a² + se_b²). `significant` when it excludes 0."""
    if a is None or b is None or math.isnan(a.value) or math.isnan(b.value):
        return None
    d = {"value": b.value - a.value, "low": None, "high": None, "significant": None}
    se_a, se_b = _se(a), _se(b)
    if se_a is not None and se_b is not None:
        se = math.hypot(se_a, se_b)
        d.update(low=d["value"] - Z95 * se, high=d["value"] + Z95 * se)
        d["significant"] = bool(d["low"] > 0 or d["high"] < 0)
    return d


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
    letter_of = {r["id"]: letters[i] for i, r in enumerate(runs)}
    groups = comparison.get("by_model") or []
    if len(groups) > 1:
        parts.append("<p class='gl-compare-models'><b>By model:</b> " + "; ".join(
            f"<code>{html.escape(g['generator'])}</code>: {', '.join(letter_of[i] for i in g['runs'])}"
            for g in groups) + "</p>")
    if store is not None and comparison.get("method") == "single_prompt":
        parts.append(_axes_side_by_side(store, runs, letters))
    head = "".join(f"<th>{letters[i]}</th>" for i in range(len(runs)))
    head += "".join(f"<th>{letters[i]} − A</th>" for i in range(1, len(runs)))
    body = []
    for row in comparison["rows"]:
        cells = "".join(f"<td class='gl-metric'>{_cell(v)}</td>" for v in row["values"])
        cells += "".join(f"<td class='gl-metric'>{_diff_cell(d)}</td>" for d in row["differences"])
        body.append(f"<tr data-metric='{html.escape(row['group'])}/{html.escape(row['metric'])}'>"
                    f"<td>{html.escape(row['group'])}</td><td>{html.escape(readable(row['metric']))}</td>{cells}</tr>")
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


# -- command line ----------------------------------------------------------------------------
def add_cli(sub, common_arguments) -> None:
    """`python -m engine runs list|show|compare|delete|export|import|study ...`"""
    p = sub.add_parser("runs", help="list, show, compare, delete, export and import runs; build user studies")
    rsub = p.add_subparsers(dest="runs_command", required=True)

    def cmd(name, help_text):
        q = rsub.add_parser(name, help=help_text)
        common_arguments(q)
        q.set_defaults(preset="synthetic", method=_cli_main, make_request=lambda a: a)
        return q

    q = cmd("list", "every run in the store (newest first)")
    q.add_argument("--search", default="", help="words that must all appear (id, method, prompt, model, status)")
    q.add_argument("--method", dest="only_method", default=None, help="only runs of this method")
    q.add_argument("--status", default=None, choices=STATUSES)
    q.add_argument("--sort", default="newest", choices=SORTS)

    q = cmd("show", "one run: header and scores (--json: the whole stored run; --html FILE: its report)")
    q.add_argument("run_id")
    q.add_argument("--html", default=None, metavar="FILE", help="write the run's one-page HTML report")

    q = cmd("compare", "two or more runs side by side (scores, intervals, differences from the first)")
    q.add_argument("run_ids", nargs="+")
    q.add_argument("--html", default=None, metavar="FILE", help="write the comparison as an HTML report")

    q = cmd("delete", "delete runs and the images no other run uses")
    q.add_argument("run_ids", nargs="+")
    q.add_argument("--keep-images", action="store_true", help="keep every image (only the run records go)")

    q = cmd("export", "export runs: scores JSON + CSV, an imagefolder/importable zip, an HTML report")
    q.add_argument("run_ids", nargs="+")
    q.add_argument("--format", default="zip", choices=("json", "csv", "zip", "html", "all"))
    q.add_argument("--out", required=True, help="output file (or directory with --format all)")

    q = cmd("import", "import runs from an exported zip into the store")
    q.add_argument("zip_path")

    q = cmd("study", "build a user-study pack from runs, or analyse its answers")
    q.add_argument("action", choices=("build", "analyse", "analyze"))
    q.add_argument("run_ids", nargs="*", help="build: the runs whose image sets are the study's conditions")
    q.add_argument("--question", default="rating", choices=("rating", "pair"),
                   help="rating: a 1–5 bias rating of each set; pair: which of two sets is more diverse")
    q.add_argument("--axis", default="gender", help="the attribute the question is about ('overall' for none)")
    q.add_argument("--images", type=int, default=10, help="images shown per set (sampled with the seed)")
    q.add_argument("--seed", type=int, default=0)
    q.add_argument("--raters", type=int, default=None, help="number of forms (default: one full counterbalancing cycle)")
    q.add_argument("--attention", type=int, default=2, help="attention-check items per form")
    q.add_argument("--out", default=None, help="build: the pack zip to write")
    q.add_argument("--key", default=None, help="analyse: the pack zip or its researcher/answer_key.json")
    q.add_argument("--answers", nargs="*", default=[], help="analyse: the answers CSV file(s)")
    q.add_argument("--keep-inattentive", action="store_true", help="analyse: keep raters who failed a check")


def _print_json(obj) -> None:
    from .store import _json_default

    print(json.dumps(obj, indent=2, default=_json_default, ensure_ascii=False))


def _cli_main(args, engine):
    """The `runs` sub-commands; output goes to stdout. A generator so `python -m engine` runs it
    like a method (it yields no events)."""
    store = engine.store
    command = args.runs_command
    if command == "list":
        rows = list_runs(store, args.search, args.only_method, args.status, args.sort)
        if args.json:
            _print_json(rows)
        elif not rows:
            print(f"no runs in {store.data_dir}")
        else:
            for r in rows:
                print(f"{r['id']}  {r['method']:<14} {r['status']:<8} {r['date']}  {r['prompt'][:40]:<40}  "
                      f"{r['generator'][:32]:<32}  {r['headline']}")
    elif command == "show":
        run = get_run(store, args.run_id)
        if args.html:
            from .export import report_html

            with open(args.html, "w", encoding="utf-8") as fh:
                fh.write(report_html(store, [run["id"]]))
        if args.json:
            _print_json({**run, "scores": [s.to_json() for s in scores(run)]})
        else:
            text, _ = headline(run)
            print(f"{run['id']}  {run['method']}  {run['status']}  {run_prompt(run)}\n{text}")
            for s in scores(run):
                ci = f" [{s.low:.4g}, {s.high:.4g}]" if s.low is not None and s.high is not None else ""
                print(f"  {s.name}: {s.value:.4g}{ci}")
    elif command == "compare":
        comparison = compare_runs(store, args.run_ids)
        if args.html:
            from .export import page

            with open(args.html, "w", encoding="utf-8") as fh:
                fh.write(page("GapLens comparison", compare_html(comparison, store)))
        if args.json:
            _print_json(comparison)
        else:
            for row in comparison["rows"]:
                values = "  ".join(_plain(v) for v in row["values"])
                print(f"{(row['group'] + ' / ' + row['metric'])[:48]:<48} {values}")
    elif command == "delete":
        removed = delete_runs(store, args.run_ids, keep_images=args.keep_images)
        if removed["missing"]:
            raise InputError(f"no run {', '.join(removed['missing'])} in the store")
        _print_json(removed) if args.json else print(
            f"deleted {removed['runs']} run(s), {removed['images']} image(s) no other run used")
    elif command == "export":
        from .export import export_files

        written = export_files(store, args.run_ids, args.format, args.out)
        _print_json({"files": written}) if args.json else print("\n".join(written))
    elif command == "import":
        from .export import import_zip

        report = import_zip(store, args.zip_path)
        _print_json(report) if args.json else print(
            f"imported {len(report['imported'])} run(s) ({report['images_added']} new image(s)); "
            f"already present: {len(report['skipped'])}")
    elif command == "study":
        from . import study

        if args.action == "build":
            if not args.out:
                raise InputError("study build needs --out PACK.zip")
            pack = study.build_pack(engine, args.run_ids, question=args.question, axis=args.axis,
                                    images_per_set=args.images, seed=args.seed, n_raters=args.raters,
                                    n_attention=args.attention)
            study.write_pack(pack, args.out)
            _print_json({"pack": args.out, **study.pack_summary(pack)}) if args.json else print(
                f"{args.out}: {study.pack_summary(pack)['text']}")
        else:
            if not args.key or not args.answers:
                raise InputError("study analyse needs --key PACK.zip|answer_key.json and --answers FILE.csv ...")
            analysis = study.analyse(study.load_key(args.key), [open(f, encoding="utf-8").read() for f in args.answers],
                                     exclude_inattentive=not args.keep_inattentive)
            _print_json(analysis) if args.json else print(study.analysis_text(analysis))
    sys.stdout.flush()
    return
    yield  # noqa: unreachable - makes this a generator, as `python -m engine` expects


def _plain(v: dict | None) -> str:
    if not v:
        return "–".ljust(24)
    ci = f" [{v['low']:.3g}, {v['high']:.3g}]" if v.get("low") is not None and v.get("high") is not None else ""
    return f"{v['value']:.4g}{ci}".ljust(24)
