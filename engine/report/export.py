"""Export runs and import them back.

Three forms (DESIGN.md "The store"; issue 8):

(a) scores: `scores.json` (each run's record and every score) and `scores.csv` (one row per
    score: run, group, metric, value and its 95% interval).
(b) a zip that is at once a Hugging Face `imagefolder` dataset and a GapLens store extract:

        metadata.jsonl          one row per (run, image): file_name + provenance + VQA answers
        images/<key>.png        every image once, named by its content key (the original bytes)
        gaplens/manifest.json   format, version, runs, counts
        gaplens/runs.jsonl      the runs rows verbatim (request, results, summary, models, ...)
        gaplens/run_images.jsonl, images.jsonl, answers.jsonl, embeddings.jsonl
        scores.json, scores.csv, report.html, README.md

    `datasets.load_dataset("imagefolder", data_dir=<unzipped>)` (or data_files=<zip>) reads the
    images with the metadata columns and ignores the other files; `import_zip` puts the runs,
    images (checked against their sha256), VQA answers and embeddings into another store, so
    the run reopens identical.
(c) a one-page HTML report: self-contained (charts as inline SVG, images as base64 JPEG
    thumbnails, no script, no network), printable.
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

import numpy as np

from engine import __version__
from engine.errors import InputError
from engine.runs import compare_runs, get_run, headline, run_prompt, run_records, scores, short_model
from engine.store import Store, _json_default

from . import Markup, clip, macro, render, static
from .runs import compare_html, results_html, run_header_html, thumbnails_html

FORMAT = "gaplens-export"
FORMAT_VERSION = 1
CSV_COLUMNS = ["run_id", "method", "status", "prompt", "generator", "group", "metric", "value", "ci_low", "ci_high"]
METADATA_COLUMNS = ["file_name", "run_id", "method", "label", "position", "prompt", "negative_prompt", "seed",
                    "generator", "steps", "guidance", "width", "height", "scheduler", "nsfw", "image_key",
                    "sha256", "vqa"]


def _runs(store: Store, run_ids) -> list[dict]:
    ids = [r for r in dict.fromkeys(x.strip() for x in run_ids if x and x.strip())]
    if not ids:
        raise InputError("pick at least one run to export")
    return [get_run(store, r) for r in ids]


# -- (a) scores ------------------------------------------------------------------------------
def scores_json(store: Store, run_ids) -> dict:
    out = []
    for run in _runs(store, run_ids):
        out.append({k: run[k] for k in ("id", "method", "status", "request", "summary", "models", "version",
                                         "error", "created", "updated")}
                   | {"prompt": run_prompt(run), "headline": headline(run)[0],
                      "scores": [s.to_json() for s in scores(run)], "results": run["results"]})
    return {"format": "gaplens-scores", "gaplens_version": __version__, "exported": time.time(), "runs": out}


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


def _csv_number(x) -> str:
    return "" if x is None else repr(float(x))


# -- (c) HTML report -------------------------------------------------------------------------
def page(title: str, body: Markup) -> Markup:
    """A standalone HTML document (no script, no external resource) around `body` (Markup from
    this package; a plain string is escaped, i.e. shown as text)."""
    return render("report.html", title=title, body=body, css=Markup(static("report.css")),
                  version=__version__, date=time.strftime("%Y-%m-%d %H:%M"))


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
    return "".join(json.dumps(r, default=_json_default, ensure_ascii=False) + "\n" for r in rows)


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
    texts = set()
    for run in runs:
        _strings(run.get("results") or {}, texts)
    embeddings = store.embedding_rows([k for k in keys if k in present] + sorted(texts))
    by_image: dict[str, list] = {}
    for a in answers:
        by_image.setdefault(a["image_key"], []).append(
            {"question": a["question"], "answer": a["answer"], "evaluator": a["evaluator"]})
    method_of = {r["id"]: r["method"] for r in runs}

    metadata = []
    for link in run_image_rows:
        key = link["image_key"]
        if key in missing:
            continue
        row = image_rows[key]
        metadata.append({
            "file_name": f"images/{key}.png", "run_id": link["run_id"], "method": method_of[link["run_id"]],
            "label": link["label"], "position": link["position"], "prompt": row["prompt"],
            "negative_prompt": row["negative_prompt"], "seed": row["seed"], "generator": row["generator"],
            "steps": row["steps"], "guidance": row["guidance"], "width": row["width"], "height": row["height"],
            "scheduler": row["scheduler"], "nsfw": bool(row["nsfw"]), "image_key": key, "sha256": row["sha256"],
            "vqa": by_image.get(key, [])})
    manifest = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "gaplens_version": __version__,
        "exported": time.time(), "source_data_dir": str(store.data_dir),
        "runs": [{"id": r["id"], "method": r["method"], "status": r["status"], "prompt": run_prompt(r)} for r in runs],
        "counts": {"runs": len(runs), "images": len(keys) - len(missing), "answers": len(answers),
                   "embeddings": len(embeddings), "metadata_rows": len(metadata)},
        "missing_images": missing,
    }
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as zf:
        for key in keys:
            if key not in missing:  # PNG is already compressed: store it as is
                zf.write(present[key].path, f"images/{key}.png", compress_type=zipfile.ZIP_STORED)
        zf.writestr("metadata.jsonl", _jsonl(metadata))
        zf.writestr("gaplens/manifest.json", json.dumps(manifest, indent=1, default=_json_default))
        zf.writestr("gaplens/runs.jsonl", _jsonl(store.run_rows(ids)))
        zf.writestr("gaplens/run_images.jsonl", _jsonl(run_image_rows))
        zf.writestr("gaplens/images.jsonl", _jsonl(
            {**image_rows[k], "file": f"images/{k}.png"} for k in keys if k not in missing))
        zf.writestr("gaplens/answers.jsonl", _jsonl(answers))
        zf.writestr("gaplens/embeddings.jsonl", _jsonl(
            {**{k: v for k, v in e.items() if k != "vector"},
             "vector_b64": base64.b64encode(bytes(e["vector"])).decode("ascii")} for e in embeddings))
        zf.writestr("scores.json", json.dumps(scores_json(store, ids), indent=1, default=_json_default,
                                              ensure_ascii=False))
        zf.writestr("scores.csv", scores_csv(store, ids))
        zf.writestr("report.html", report_html(store, ids))
        zf.writestr("README.md", _dataset_readme(manifest))
    os.replace(tmp, path)
    return manifest


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
  and caption of the image: question, answer, evaluator).
- Scores: `scores.csv` (one row per score, with its 95% interval where there is one) and
  `scores.json` (each run's request, summary, results and scores).
- `report.html`: a self-contained one-page report (open it in any browser, offline; printable).
- Back into GapLens: `python -m engine runs import <this zip>` or the Runs tab's import.
"""


def import_zip(store: Store, path: str | os.PathLike, replace: bool = False) -> dict:
    """Import the runs of an export zip into `store`: images (verified against their sha256),
    VQA answers, embeddings, run rows and image links. Runs already in the store are skipped
    unless `replace`. Image paths inside the results are rewritten to this store's files."""
    try:
        return _import_zip(store, path, replace)
    except (KeyError, ValueError, TypeError, UnicodeDecodeError, zipfile.BadZipFile) as exc:
        raise InputError(f"{Path(path).name} is a damaged GapLens export ({type(exc).__name__}: {exc})") from None


def _import_zip(store: Store, path, replace: bool) -> dict:
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise InputError(f"{Path(path).name} is not a readable zip file ({exc})") from None
    with zf:
        names = set(zf.namelist())
        if "gaplens/manifest.json" not in names:
            raise InputError(f"{Path(path).name} is not a GapLens export (it has no gaplens/manifest.json)")
        manifest = json.loads(zf.read("gaplens/manifest.json"))
        if manifest.get("format") != FORMAT or int(manifest.get("format_version", 0)) > FORMAT_VERSION:
            raise InputError(f"{Path(path).name}: unsupported export format {manifest.get('format')} "
                             f"v{manifest.get('format_version')}")

        def rows(name):
            if name not in names:
                return []
            return [json.loads(line) for line in zf.read(name).decode("utf-8").splitlines() if line.strip()]

        run_rows = rows("gaplens/runs.jsonl")
        existing = {r["id"] for r in run_rows if store.get_run(r["id"]) is not None}
        todo = [r for r in run_rows if replace or r["id"] not in existing]
        todo_ids = {r["id"] for r in todo}
        links = [r for r in rows("gaplens/run_images.jsonl") if r["run_id"] in todo_ids]
        wanted = {r["image_key"] for r in links}
        added = present = 0
        moved: dict[str, str] = {}
        for row in rows("gaplens/images.jsonl"):
            key = row["key"]
            if key not in wanted:
                continue
            member = row.pop("file", f"images/{key}.png")
            if member not in names:
                raise InputError(f"{Path(path).name} lacks the image file {member}")
            old_path = row["path"]
            if store.import_image(row, zf.read(member)):
                added += 1
            else:
                present += 1
            new_path = str(store.get_images([key], verify=False)[key].path)
            if new_path != old_path:
                moved[old_path] = new_path
        answers = [a for a in rows("gaplens/answers.jsonl") if a["image_key"] in wanted]
        embeddings = []
        for e in rows("gaplens/embeddings.jsonl"):
            vector = base64.b64decode(e.pop("vector_b64"))
            if len(vector) != 4 * int(e["dim"]):
                raise InputError(f"{Path(path).name}: embedding {e['key'][:12]}… has the wrong size")
            embeddings.append({**e, "vector": np.frombuffer(vector, np.float32).tobytes()})
        for run in todo:  # results name image files by path: point them at this store's copies
            if moved:
                results = json.loads(run["results"])
                rewritten = _replace_strings(results, moved)
                if json.dumps(rewritten, default=_json_default) != json.dumps(results, default=_json_default):
                    run["results"] = json.dumps(rewritten, default=_json_default)
        store.import_rows(runs=todo, run_images=links, answers=answers, embeddings=embeddings)
    return {"imported": [r["id"] for r in todo], "skipped": sorted(existing - todo_ids),
            "images_added": added, "images_present": present, "answers": len(answers),
            "embeddings": len(embeddings), "paths_rewritten": len(moved)}


def _replace_strings(obj, mapping: dict):
    if isinstance(obj, str):
        return mapping.get(obj, obj)
    if isinstance(obj, dict):
        return {k: _replace_strings(v, mapping) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_replace_strings(v, mapping) for v in obj]
    return obj


# -- one entry point for the CLI and the tab -------------------------------------------------
def export_files(store: Store, run_ids, fmt: str, out: str | os.PathLike) -> list[str]:
    """Write `fmt` (json, csv, zip, html or all) for the runs; `out` is the file (a directory
    for `all`). Returns the paths written."""
    runs = _runs(store, run_ids)
    ids = [r["id"] for r in runs]
    out = Path(out)
    if fmt == "all":
        out.mkdir(parents=True, exist_ok=True)
        stem = ids[0] if len(ids) == 1 else f"gaplens-{len(ids)}-runs"
        return [p for f, ext in (("json", "scores.json"), ("csv", "scores.csv"), ("zip", "zip"), ("html", "html"))
                for p in export_files(store, ids, f, out / f"{stem}.{ext}")]
    out.parent.mkdir(parents=True, exist_ok=True)
    if fmt == "json":
        out.write_text(json.dumps(scores_json(store, ids), indent=1, default=_json_default, ensure_ascii=False),
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
