"""Export runs and import them back.

Three forms (DESIGN.md "The store"; issue 8):

(a) scores: `scores.json` (each run's record and every score) and `scores.csv` (one row per
    score: run, group, metric, value and its 95% interval).
(b) a zip that is at once a Hugging Face `imagefolder` dataset and a GapLens store extract:

        metadata.jsonl          one row per (run, image): file_name + provenance + VQA answers
        images/<key>.png        every image once, named by its content key (the original bytes)
        gaplens/manifest.json   format, version, runs, counts
        gaplens/runs.jsonl      the runs rows verbatim (request, results, summary, models, ...)
        gaplens/run_images.jsonl, images.jsonl, answers.jsonl, embeddings.jsonl, labels.jsonl
        scores.json, scores.csv, report.html, README.md

    `datasets.load_dataset("imagefolder", data_dir=<unzipped>)` (or data_files=<zip>) reads the
    images with the metadata columns and ignores the other files; `import_zip` puts the runs,
    images (checked against their sha256), VQA answers and embeddings into another store, so
    the run reopens identical.
(c) a one-page HTML report: self-contained (charts as Vega-Lite specs drawn by the inlined
    vega runtime, images as base64 JPEG thumbnails, no network), printable.
"""
from __future__ import annotations

import base64
import csv
import io
import json
import os
import time
import zipfile
from pathlib import Path

from engine import __version__
from engine.common import access
from engine.common.encoding import json_default
from engine.common.errors import InputError
from engine.runs.imports import FORMAT, FORMAT_VERSION, replace_strings
from engine.common.names import safe_stem, short_label
from engine.methods.validate import validate_run
from engine.runs.history import compare_runs, get_run, headline, run_prompt, run_records, scores, short_model
from engine.store.store import Store, is_key

from . import Markup, charts, clip, macro, render, static
from .runs import compare_html, results_html, run_header_html, thumbnails_html

CSV_COLUMNS = ["run_id", "method", "status", "prompt", "generator", "group", "metric", "value", "ci_low", "ci_high"]
METADATA_COLUMNS = ["file_name", "run_id", "method", "label", "position", "prompt", "negative_prompt", "seed",
                    "generator", "steps", "guidance", "width", "height", "scheduler", "nsfw", "image_key",
                    "sha256", "vqa", "labels"]


def _runs(store: Store, run_ids) -> list[dict]:
    ids = [r for r in dict.fromkeys(x.strip() for x in run_ids if x and x.strip())]
    if not ids:
        raise InputError("pick at least one run to export")
    return [get_run(store, r) for r in ids]


# -- (a) scores ------------------------------------------------------------------------------
def scores_json(store: Store, run_ids) -> dict:
    out = []
    for run in _runs(store, run_ids):
        out.append({k: run[k] for k in ("id", "method", "status", "request", "summary", "version",
                                         "error", "created", "updated")}
                   | {"prompt": run_prompt(run), "headline": headline(run)[0],
                      "models": {k: short_label(v) for k, v in (run.get("models") or {}).items()},
                      "scores": [s.to_json() for s in scores(run)], "results": _relative(run["results"], store)}
                   | _validation(store, run["id"]))
    return {"format": "gaplens-scores", "gaplens_version": __version__, "exported": time.time(), "runs": out}


def _validation(store: Store, run_id: str) -> dict:
    """{"validation": the evaluator checked against the run's spot-check} when it has one (issue 16)."""
    checked = validate_run(store, run_id)
    return {"validation": checked} if any(a.get("n_checked") for a in checked["axes"].values()) else {}


def scores_csv(store: Store, run_ids) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for run in _runs(store, run_ids):
        generator = short_model((run.get("models") or {}).get("generator", ""))
        for s in scores(run):
            writer.writerow([run["id"], run["method"], run["status"], run_prompt(run), generator, s.group, s.metric,
                             _csv_number(s.value), _csv_number(s.low), _csv_number(s.high)])
    return buf.getvalue()


def _relative(obj, store: Store):
    """`obj` with every path into the store's image folder made relative to the data folder."""
    prefix = str(store.image_dir) + os.sep
    if isinstance(obj, str):
        return "images/" + obj[len(prefix):].replace(os.sep, "/") if obj.startswith(prefix) else obj
    if isinstance(obj, dict):
        return {k: _relative(v, store) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_relative(v, store) for v in obj]
    return obj


def _csv_number(x) -> str:
    return "" if x is None else repr(float(x))


# -- (c) HTML report -------------------------------------------------------------------------
def page(title: str, body: Markup) -> Markup:
    """A standalone HTML document (no external resource; the chart runtime inlined, so the charts
    are the tab's, offline) around `body` (Markup from this package; a plain string is escaped,
    i.e. shown as text)."""
    return render("report.html", title=title, body=body, css=Markup(static("report.css")),
                  runtime=charts.runtime_head(), version=__version__, date=time.strftime("%Y-%m-%d %H:%M"))


def report_html(store: Store, run_ids, thumbnail_size: int = 128, max_images: int = 48) -> Markup:
    """One self-contained page: each run's header, its results as its tab shows them (charts
    included), its images as thumbnails, and a comparison when several runs are given."""
    runs = _runs(store, run_ids)
    sections = [{"run": run, "prompt": run_prompt(run), "header": run_header_html(run),
                 "results": results_html(run["method"], run.get("results") or {}),
                 "images": thumbnails_html(run_records(store, run), thumbnail_size, max_images)} for run in runs]
    comparison = compare_html(compare_runs(store, [r["id"] for r in runs]), store) if len(runs) > 1 else ""
    body = macro("report.html", "runs")(sections=sections, comparison=comparison,
                                        date=time.strftime("%Y-%m-%d %H:%M"))
    return page("GapLens report: " + ", ".join(f"{r['method']} {clip(run_prompt(r), 40)}" for r in runs[:3]), body)


# -- (b) dataset / store zip -----------------------------------------------------------------
def _jsonl(rows) -> str:
    return "".join(json.dumps(r, default=json_default, ensure_ascii=False) + "\n" for r in rows)


def _strings(obj, out: set) -> set:
    if isinstance(obj, str):
        if len(obj) < 2000:
            out.add(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            _strings(v, out)
    elif isinstance(obj, list):
        for v in obj:
            _strings(v, out)
    return out


def _embedded_texts(store: Store, runs: list[dict]) -> list[str]:
    """The texts whose embeddings an export carries: the strings of the runs' results that are not
    store keys (image embeddings follow the images the runs hold). For a visitor of a public
    GapLens, imported runs are left out: their results are an archive's words and could name
    another visitor's texts (an untrusted import keeps no text embedding of its own anyway)."""
    if not access.visitor_for(store.public).host:
        imported = store.imported_run_ids([r["id"] for r in runs])
        runs = [r for r in runs if r["id"] not in imported]
    texts: set[str] = set()
    for run in runs:
        _strings(run.get("results") or {}, texts)
    return sorted(t for t in texts if not is_key(t))


def export_zip(store: Store, run_ids, path: str | os.PathLike) -> dict:
    """Write the imagefolder + store zip (module docstring). Returns its manifest."""
    runs = _runs(store, run_ids)
    ids = [r["id"] for r in runs]
    run_image_rows = store.run_image_rows(ids)
    keys = list(dict.fromkeys(r["image_key"] for r in run_image_rows))
    image_rows = {r["key"]: r for r in store.image_rows(keys)}
    present = store.get_images(keys, verify=True)
    missing = [k for k in keys if k not in present or k not in image_rows]
    answers = store.answer_rows([k for k in keys if k in present])
    embeddings = store.embedding_rows([k for k in keys if k in present] + _embedded_texts(store, runs))
    by_image: dict[str, list] = {}
    for a in answers:
        by_image.setdefault(a["image_key"], []).append(
            {"question": a["question"], "answer": a["answer"], "evaluator": a["evaluator"]})
    method_of = {r["id"]: r["method"] for r in runs}
    labels = [row for i in ids for row in store.label_rows(i)]  # issue 16: the runs' spot-checks
    labels_of: dict[tuple[str, str], list] = {}
    for row in labels:
        labels_of.setdefault((row["run_id"], row["image_key"]), []).append(
            {k: row[k] for k in ("axis", "label", "who", "created")})

    metadata = []
    for link in run_image_rows:
        key = link["image_key"]
        if key in missing:
            continue
        row = image_rows[key]
        metadata.append({
            "file_name": f"images/{key}.png", "run_id": link["run_id"], "method": method_of[link["run_id"]],
            "label": link["label"], "position": link["position"], "prompt": row["prompt"],
            "negative_prompt": row["negative_prompt"], "seed": row["seed"], "generator": short_label(row["generator"]),
            "steps": row["steps"], "guidance": row["guidance"], "width": row["width"], "height": row["height"],
            "scheduler": row["scheduler"], "nsfw": bool(row["nsfw"]), "image_key": key, "sha256": row["sha256"],
            "vqa": by_image.get(key, []), "labels": labels_of.get((link["run_id"], key), [])})
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "gaplens_version": __version__,
        "exported": time.time(),
        "runs": [{"id": r["id"], "method": r["method"], "status": r["status"], "prompt": run_prompt(r)} for r in runs],
        "counts": {"runs": len(runs), "images": len(keys) - len(missing), "answers": len(answers),
                   "embeddings": len(embeddings), "metadata_rows": len(metadata), "labels": len(labels)},
        "missing_images": missing,
    }
    # host paths stay home: image files are named as in the archive, model paths by their last part
    local = {str(present[k].path): f"images/{k}.png" for k in keys if k not in missing}
    local.update({row["path"]: f"images/{k}.png" for k, row in image_rows.items()})
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for key in keys:
            if key not in missing:  # PNG is already compressed: store it as is
                zf.write(present[key].path, f"images/{key}.png", compress_type=zipfile.ZIP_STORED)
        zf.writestr("metadata.jsonl", _jsonl(metadata))
        zf.writestr("gaplens/manifest.json", json.dumps(manifest, indent=1, default=json_default))
        zf.writestr("gaplens/runs.jsonl", _jsonl(_portable_run(r, local) for r in store.run_rows(ids)))
        zf.writestr("gaplens/run_images.jsonl", _jsonl(run_image_rows))
        zf.writestr("gaplens/images.jsonl", _jsonl(
            {**_portable_image(image_rows[k]), "path": f"images/{k}.png", "file": f"images/{k}.png"}
            for k in keys if k not in missing))
        zf.writestr("gaplens/answers.jsonl", _jsonl(answers))
        zf.writestr("gaplens/labels.jsonl", _jsonl(labels))
        zf.writestr("gaplens/embeddings.jsonl", _jsonl(
            {**{k: v for k, v in e.items() if k != "vector"},
             "vector_b64": base64.b64encode(bytes(e["vector"])).decode("ascii")} for e in embeddings))
        zf.writestr("scores.json", json.dumps(scores_json(store, ids), indent=1, default=json_default,
                                              ensure_ascii=False))
        zf.writestr("scores.csv", scores_csv(store, ids))
        zf.writestr("report.html", report_html(store, ids))
        zf.writestr("README.md", _dataset_readme(manifest))
    os.replace(tmp, path)
    return manifest


def _portable_run(row: dict, local_paths: dict) -> dict:
    """A `runs` row without host paths: image paths in the results become archive names,
    model labels lose their directories, the owner and process columns are left out."""
    row = {k: v for k, v in row.items() if k not in ("owner", "published", "pid", "host", "cost")}
    results = json.loads(row["results"])
    portable = replace_strings(results, local_paths)
    if portable != results:
        row["results"] = json.dumps(portable, default=json_default)
    row["models"] = json.dumps({k: short_label(v) for k, v in json.loads(row["models"]).items()})
    return row


def _portable_image(row: dict) -> dict:
    return {k: (short_label(v) if k == "generator" else v) for k, v in row.items()
            if k not in ("provenance", "used", "bytes")}


def _dataset_readme(manifest: dict) -> str:
    runs = "\n".join(f"- `{r['id']}` ({r['method']}, {r['status']}): {r['prompt']}" for r in manifest["runs"])
    return f"""# GapLens export

{manifest['counts']['images']} image(s) from {manifest['counts']['runs']} run(s), exported by GapLens
{manifest['gaplens_version']}.

{runs}

- As a Hugging Face dataset: `datasets.load_dataset("imagefolder", data_dir="<this folder>")`
  (or `data_files="<this zip>"`). `metadata.jsonl` has one row per (run, image): `file_name`,
  `run_id`, `method`, `label` (the image set within the run), `position`, `prompt`,
  `negative_prompt`, `seed`, `generator`, `steps`, `guidance`, `width`, `height`, `scheduler`,
  `nsfw` (flagged by the safety checker), `image_key`, `sha256` and `vqa` (every stored VQA answer
  and caption of the image: question, answer, evaluator) and `labels` (a person's spot-check answers
  of the image in that run: axis, label, who, created).
- Scores: `scores.csv` (one row per score, with its 95% interval where there is one) and
  `scores.json` (each run's request, summary, results and scores).
- `report.html`: a self-contained one-page report (open it in any browser, offline; printable).
- Back into GapLens: `python -m engine runs import <this zip>` or the Runs tab's import.
"""


# -- one entry point for the CLI and the tab -------------------------------------------------
def export_files(store: Store, run_ids, fmt: str, out: str | os.PathLike) -> list[str]:
    """Write `fmt` (json, csv, zip, html or all) for the runs; `out` is the file (a directory
    for `all`). Returns the paths written."""
    runs = _runs(store, run_ids)
    ids = [r["id"] for r in runs]
    out = Path(out)
    if fmt == "all":
        out.mkdir(parents=True, exist_ok=True)
        stem = safe_stem(ids[0]) if len(ids) == 1 else f"gaplens-{len(ids)}-runs"
        return [p for f, ext in (("json", "scores.json"), ("csv", "scores.csv"), ("zip", "zip"), ("html", "html"))
                for p in export_files(store, ids, f, out / f"{stem}.{ext}")]
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "json":
        out.write_text(json.dumps(scores_json(store, ids), indent=1, default=json_default, ensure_ascii=False),
                       encoding="utf-8")
    elif fmt == "csv":
        out.write_text(scores_csv(store, ids), encoding="utf-8")
    elif fmt == "zip":
        export_zip(store, ids, out)
    elif fmt == "html":
        out.write_text(report_html(store, ids), encoding="utf-8")
    else:
        raise InputError(f"unknown export format '{fmt}'; choose json, csv, zip, html or all")
    return [str(out)]
