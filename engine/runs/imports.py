"""Import runs from a GapLens export zip (engine/export.py writes them). The archive is untrusted.

Before anything is written (issue 13):

1. the archive is bounded: number of entries, total and per-entry uncompressed bytes, and the
   compression ratio of every large entry (a zip bomb is refused before it is inflated); a
   visitor of a public GapLens may import at most what is left of their share of the store
   (engine/hosting/storage.py), in entries of at most 64 MiB, with results of at most 8 MiB a run;
2. every row of `gaplens/*.jsonl` is checked against `SCHEMAS` (types, lengths, allowed
   values, key formats); run ids that could not be file names get a fresh id;
3. every image is decoded: PNG or JPEG, at most `MAX_PIXELS` pixels (and Pillow's
   decompression-bomb guard), bytes matching the row's sha256.

Then everything is written in one transaction. By default imported images belong to the imported
runs only: each is stored under a key of its own (`imported_key`, provenance 'imported'), so a
new generation never receives an archive's image as a cache hit, and the archive's VQA answers
and embeddings follow their images to those keys (text embeddings, which would answer future
lookups, are left out). The checksums only prove that an archive agrees with itself, so this is
the safe default; `trust=True` (`runs import --trust`) keeps the archive's keys and makes its
images and caches serve new generations, as for an archive the user made themselves.
"""
from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import io
import json
import math
import os
import warnings
import zipfile
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from ..common.encoding import MAX_JSON_DEPTH, json_default, parse_json
from ..common.errors import InputError
from ..common.texts import check_texts, needs_readable, text_problem
from ..hosting.storage import import_room
from ..store.store import MAX_PUBLIC_RESULTS_BYTES, Store, content_key, is_key, is_run_id

FORMAT = "gaplens-export"
FORMAT_VERSION = 1

MAX_ENTRIES = 100_000
MAX_TOTAL_BYTES = 4 * 2**30         # uncompressed, whole archive
MAX_ENTRY_BYTES = 512 * 2**20       # uncompressed, one entry
MAX_RATIO = 100                     # uncompressed / compressed, for entries above RATIO_FLOOR
RATIO_FLOOR = 1 * 2**20
MAX_PIXELS = 4096 * 4096
PUBLIC_ENTRY_BYTES = 64 * 2**20     # one entry of a visitor's import (a 4096² PNG is at most 48 MiB)
IMAGE_FORMATS = {"PNG", "JPEG"}
STATUSES = {"done", "running", "stopped", "failed", "interrupted"}


# -- row schemas -------------------------------------------------------------------------------
def _text(limit: int, allowed: set | None = None, optional: bool = False) -> Callable:
    def check(v):
        if v is None and optional:
            return None
        if not isinstance(v, str):
            raise ValueError(f"expected text of at most {limit} characters")
        problem = text_problem(v, limit)   # what the app checks before it stores a text, too
        if problem:
            raise ValueError(f"the text {problem}")
        if allowed is not None and v not in allowed:
            raise ValueError(f"expected one of {', '.join(sorted(allowed))}")
        return v
    return check


def _integer(low: int, high: int) -> Callable:
    def check(v):
        if isinstance(v, bool) or not isinstance(v, int) or not low <= v <= high:
            raise ValueError(f"expected a whole number between {low} and {high}")
        return v
    return check


def _number(v):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError("expected a finite number")
    return float(v)


def _flag(v):
    if v not in (0, 1, True, False):
        raise ValueError("expected 0 or 1")
    return int(v)


def _key(v):
    if not is_key(v):
        raise ValueError("expected a key (64 hexadecimal digits)")
    return v


def _method(v):
    if not isinstance(v, str) or not v.isidentifier() or len(v) > 40:
        raise ValueError("expected a method name")
    return v


def _json_text(limit: int, kind: type) -> Callable:
    def check(v):
        if not isinstance(v, str) or len(v) > limit:
            raise ValueError(f"expected JSON text of at most {limit} characters")
        value = parse_json(v, "the value")
        if not isinstance(value, kind):
            raise ValueError(f"expected a JSON {kind.__name__}")
        if needs_readable(v):   # a text in it may not be stored (a NUL, an unpaired surrogate)
            try:
                check_texts(value, "a text in it", limit=None, items=len(v), depth=MAX_JSON_DEPTH)
            except InputError as exc:
                raise ValueError(str(exc)) from None
        return v
    return check


def _class_probs(v):
    """'' or the JSON of {class: probability} (issue 35)."""
    if v == "":
        return v
    _json_text(64 * 1024, dict)(v)
    if not all(isinstance(k, str) and isinstance(p, (int, float)) and 0 <= p <= 1 for k, p in parse_json(v, "class probabilities").items()):
        raise ValueError("expected {class: probability}")
    return v


def _models(v):
    _json_text(20_000, dict)(v)
    if not all(isinstance(k, str) and isinstance(x, str) and len(x) < 2000 for k, x in parse_json(v, "models").items()):
        raise ValueError("expected {role: model label}")
    return v


SEED_RANGE = _integer(0, 2**63 - 1)
SCHEMA_RESULTS_BYTES = 64 * 2**20       # a run's results (the schema's limit)
LINE_OVERHEAD_BYTES = 2 * 2**20         # the rest of a run's row: request (64 KiB), summary (1 MiB), ...
# column -> check (returns the value to store); every column listed is required
SCHEMAS: dict[str, dict[str, Callable]] = {
    "runs": {"id": _text(200), "method": _method, "status": _text(20, STATUSES), "request": _json_text(64 * 1024, dict),
             "results": _json_text(SCHEMA_RESULTS_BYTES, dict), "summary": _json_text(2**20, dict), "models": _models,
             "version": _text(40), "error": _text(20_000, optional=True), "created": _number, "updated": _number},
    "run_images": {"run_id": _text(200), "image_key": _key, "label": _text(1000), "position": _integer(0, 10**7)},
    "images": {"key": _key, "generator": _text(2000), "prompt": _text(10_000), "negative_prompt": _text(10_000),
               "seed": SEED_RANGE, "steps": _integer(0, 10_000), "guidance": _number, "width": _integer(1, 16384),
               "height": _integer(1, 16384), "scheduler": _text(200), "path": _text(4096), "sha256": _key,
               "nsfw": _flag, "created": _number},
    "answers": {"key": _key, "image_key": _key, "evaluator": _text(2000), "question": _text(10_000),
                "choices": _json_text(64 * 1024, list), "answer": _text(20_000), "created": _number,
                "probs": _class_probs, "text": _text(20_000)},
    "labels": {"run_id": _text(200), "image_key": _key, "axis": _text(200), "label": _text(200), "who": _text(200),
               "created": _number},
    "embeddings": {"key": _key, "subject": _text(10_000), "evaluator": _text(2000), "dim": _integer(1, 65_536),
                   "vector_b64": _text(400_000), "created": _number},
}


# columns an older archive's rows may lack, and what they then hold
OPTIONAL_COLUMNS = {("answers", "probs"): "", ("answers", "text"): ""}


def _checked(table: str, row, where: str) -> dict:
    """The row reduced to its schema's columns, each checked; ValueError naming what is wrong."""
    if not isinstance(row, dict):
        raise ValueError(f"{where}: expected a JSON object")
    out = {}
    for column, check in SCHEMAS[table].items():
        if column not in row and (table, column) not in OPTIONAL_COLUMNS:
            raise ValueError(f"{where}: '{column}' is missing")
        try:
            out[column] = check(row.get(column, OPTIONAL_COLUMNS.get((table, column))))
        except (ValueError, TypeError) as exc:
            raise ValueError(f"{where}: '{column}' is not valid ({exc})") from None
    return out


# -- the archive --------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class ArchiveLimits:
    """What an archive may hold, checked from its directory before anything is inflated."""

    entries: int = MAX_ENTRIES
    total_bytes: int = MAX_TOTAL_BYTES     # uncompressed, whole archive
    entry_bytes: int = MAX_ENTRY_BYTES     # uncompressed, one entry
    ratio: int = MAX_RATIO                 # uncompressed / compressed, for entries above RATIO_FLOOR
    total_note: str = ""                   # why total_bytes is what it is, for the refusal


ARCHIVE_LIMITS = ArchiveLimits()


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def check_archive(zf: zipfile.ZipFile, name: str, limits: ArchiveLimits = ARCHIVE_LIMITS) -> None:
    """InputError when the archive's entries, sizes or compression ratios exceed `limits`. The
    sizes are the archive's own; reading an entry never yields more than its stated size."""
    infos = zf.infolist()
    if len(infos) > limits.entries:
        raise InputError(f"{name} has {len(infos)} entries; at most {limits.entries} are accepted")
    total = 0
    for info in infos:
        total += info.file_size
        if info.file_size > limits.entry_bytes:
            raise InputError(f"{name}: the entry {info.filename[:80]} unpacks to {_size(info.file_size)}; "
                             f"at most {_size(limits.entry_bytes)} per entry are accepted")
        if info.file_size > RATIO_FLOOR and info.file_size > limits.ratio * max(1, info.compress_size):
            raise InputError(f"{name}: the entry {info.filename[:80]} is compressed "
                             f"{info.file_size / max(1, info.compress_size):.0f}:1; at most {limits.ratio}:1 is "
                             f"accepted (this looks like a zip bomb)")
    if total > limits.total_bytes:
        raise InputError(f"{name} unpacks to {_size(total)}; at most {_size(limits.total_bytes)} are accepted"
                         + (f" ({limits.total_note})" if limits.total_note else ""))


def import_limits(store: Store) -> ArchiveLimits:
    """The bounds of an import into `store`: ARCHIVE_LIMITS, and for a visitor of a public
    GapLens entries of at most PUBLIC_ENTRY_BYTES and in all what is left of their share."""
    room = import_room(store)
    if room is None:
        return ARCHIVE_LIMITS
    return dataclasses.replace(ARCHIVE_LIMITS, entry_bytes=PUBLIC_ENTRY_BYTES, total_bytes=room,
                               total_note="what is left of your share of this GapLens' store; delete runs to make room")


def check_image(data: bytes, where: str) -> tuple[int, int]:
    """(width, height) of an image after decoding it fully; ValueError unless it is a PNG or
    JPEG of at most MAX_PIXELS pixels (Pillow's decompression-bomb guard as a second check)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", Image.DecompressionBombWarning)
        try:
            with Image.open(io.BytesIO(data)) as im:
                if im.format not in IMAGE_FORMATS:
                    raise ValueError(f"{where} is a {im.format} image; only PNG and JPEG are accepted")
                if im.width * im.height > MAX_PIXELS:
                    raise ValueError(f"{where} is {im.width}×{im.height} pixels; at most {MAX_PIXELS} pixels "
                                     f"(4096×4096) are accepted")
                im.load()
                return im.size
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
            raise ValueError(f"{where} is too large to decode safely ({exc})") from None
        except (OSError, SyntaxError) as exc:
            raise ValueError(f"{where} is not a readable image ({exc})") from None


def imported_key(key: str, sha256: str) -> str:
    """The store key of an untrusted archive's image: its own namespace, so no lookup of a
    generation (keyed by generator, prompt, seed and settings) can ever find it."""
    return content_key("imported", key, sha256)


def import_zip(store: Store, path: str | os.PathLike, replace: bool = False, trust: bool = False) -> dict:
    """Import the runs of an export zip into `store` after checking all of it (module
    docstring). Runs already in the store are skipped unless `replace`. Returns
    {"imported": run ids, "skipped", "renamed": {archive id: new id}, "images_added",
    "images_present", "answers", "embeddings", "paths_rewritten", "trusted"}."""
    name = Path(path).name
    try:
        zf = zipfile.ZipFile(path)
    except (OSError, zipfile.BadZipFile) as exc:
        raise InputError(f"{name} is not a readable zip file ({exc})") from None
    limits = import_limits(store)
    results_limit = MAX_PUBLIC_RESULTS_BYTES if limits is not ARCHIVE_LIMITS else None
    with zf:
        check_archive(zf, name, limits)
        try:
            plan = _read(zf, name, store, replace, trust, results_limit)
        except (KeyError, ValueError, TypeError, UnicodeDecodeError, zipfile.BadZipFile, binascii.Error) as exc:
            raise InputError(f"{name} is not a valid GapLens export: {exc}") from None
        check_parent_links(store, plan["runs"], plan["renamed"], name)
        return _write(store, plan, trust, zf)


def _read(zf: zipfile.ZipFile, name: str, store: Store, replace: bool, trust: bool,
          results_limit: int | None = None) -> dict:
    """Everything to write, checked: rows, image members, key and id maps. Writes nothing
    (images are read and decoded here, and read again when written, so memory holds one). A
    line of the archive's tables is read only when its size fits (`results_limit`: the most
    bytes of a run's results, a public GapLens' cap) and parsed only when its nesting does."""
    names = set(zf.namelist())
    if "gaplens/manifest.json" not in names:
        raise InputError(f"{name} is not a GapLens export (it has no gaplens/manifest.json)")
    if zf.getinfo("gaplens/manifest.json").file_size > 2**20:
        raise ValueError("gaplens/manifest.json is larger than 1 MiB")
    manifest = parse_json(zf.read("gaplens/manifest.json"), "gaplens/manifest.json")
    line_limit = (results_limit or SCHEMA_RESULTS_BYTES) + LINE_OVERHEAD_BYTES
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or \
            not isinstance(manifest.get("format_version"), int) or manifest["format_version"] > FORMAT_VERSION:
        raise InputError(f"{name}: unsupported export format (GapLens reads '{FORMAT}' up to v{FORMAT_VERSION})")

    def rows(table: str) -> list[dict]:
        member = f"gaplens/{table}.jsonl"
        if member not in names:
            return []
        out = []
        with zf.open(member) as f:
            for i, line in enumerate(iter(lambda: f.readline(line_limit + 1), b"")):
                where = f"{member} line {i + 1}"
                if len(line) > line_limit:
                    raise InputError(f"{name}: {where} is longer than {_size(line_limit)}"
                                     + (f" (a public GapLens keeps at most {_size(results_limit)} of results per run)"
                                        if results_limit else ""))
                if line.strip():
                    row = parse_json(line, where)
                    if results_limit and isinstance(row, dict) and len(str(row.get("results", ""))) > results_limit:
                        raise InputError(f"{name}: the results of run {str(row.get('id'))[:80]} are "
                                         f"{_size(len(str(row['results'])))}; a public GapLens keeps at most "
                                         f"{_size(results_limit)} per run")
                    out.append(_checked(table, row, where))
        return out

    run_rows = rows("runs")
    if len({r["id"] for r in run_rows}) != len(run_rows):
        raise ValueError("gaplens/runs.jsonl lists a run twice")
    visitor_owner = store.owner()
    todo, skipped, renamed = [], [], {}
    for run in run_rows:
        old = run["id"]
        if is_run_id(old) and store.run_writable(old):
            if not replace:
                skipped.append(old)
                continue
        elif not is_run_id(old) or store.run_exists(old) or visitor_owner:
            # ids become file names (a path-like id gets a fresh one); someone else's run is never
            # overwritten; and a visitor's import always gets fresh ids, as whether an id was kept
            # would tell whether another visitor's run has it
            run["id"] = store.new_run_id()
        if run["id"] != old:
            renamed[old] = run["id"]
        run.update(owner=visitor_owner, published=0, pid=None, host=None, cost=0)
        if run["status"] == "running":
            run["status"] = "interrupted"
        todo.append(run)
    old_of = {v: k for k, v in renamed.items()}
    wanted_runs = {old_of.get(r["id"], r["id"]) for r in todo}
    links = [{**link, "run_id": renamed.get(link["run_id"], link["run_id"])}
             for link in rows("run_images") if link["run_id"] in wanted_runs]
    wanted = {link["image_key"] for link in links}

    images, keymap = [], {}
    for row in rows("images"):
        key = row["key"]
        if key not in wanted or key in keymap:
            continue
        member = f"images/{key}.png"
        if member not in names:
            raise InputError(f"{name} lacks the image file {member}")
        data = zf.read(member)
        if hashlib.sha256(data).hexdigest() != row["sha256"]:
            raise InputError(f"{name}: {member} does not match its recorded sha256")
        try:
            check_image(data, member)
        except ValueError as exc:
            raise InputError(f"{name}: {exc}") from None
        keymap[key] = key if trust else imported_key(key, row["sha256"])
        images.append((row, member))
    links = [link for link in links if link["image_key"] in keymap]  # images the exporter no longer had

    answers, dropped = [], 0
    for a in rows("answers"):
        if a["image_key"] not in keymap:
            continue
        if not trust:  # follow the image to its imported key, if the answer's key is what GapLens computes
            expected = content_key("answer", a["evaluator"], a["image_key"], a["question"], a["choices"])
            if a["key"] != expected:
                dropped += 1
                continue
            new = keymap[a["image_key"]]
            a = {**a, "image_key": new, "key": content_key("answer", a["evaluator"], new, a["question"], a["choices"])}
        answers.append(a)
    embeddings = []
    for e in rows("embeddings"):
        vector = base64.b64decode(e.pop("vector_b64"), validate=True)
        if len(vector) != 4 * e["dim"] or not np.isfinite(np.frombuffer(vector, np.float32)).all():
            raise ValueError(f"embedding {e['key'][:12]}… has the wrong size or non-finite values")
        if not trust:
            if e["subject"] not in keymap or e["key"] != content_key("embedding", e["evaluator"], e["subject"]):
                dropped += 1  # a text embedding (or an unverifiable one) would answer future lookups
                continue
            new = keymap[e["subject"]]
            e = {**e, "subject": new, "key": content_key("embedding", e["evaluator"], new)}
        embeddings.append({**e, "vector": vector})
    labels = [{**label, "run_id": renamed.get(label["run_id"], label["run_id"]), "image_key": keymap[label["image_key"]]}
              for label in rows("labels") if label["run_id"] in wanted_runs and label["image_key"] in keymap]
    return {"runs": todo, "links": [{**link, "image_key": keymap[link["image_key"]]} for link in links],
            "images": images, "keymap": keymap, "answers": answers, "embeddings": embeddings, "labels": labels,
            "skipped": skipped, "renamed": renamed, "dropped": dropped}


def _write(store: Store, plan: dict, trust: bool, zf: zipfile.ZipFile) -> dict:
    """Write the checked plan: image files first (removed again if the rows fail), then every
    row in one transaction."""
    keymap, written, present, moved, aliases, image_rows = plan["keymap"], [], 0, {}, {}, []
    known = set(store.get_images(list(keymap.values()), verify=True))
    try:
        for row, member in plan["images"]:
            key = keymap[row["key"]]
            new_path = str(store.image_path_for(key))
            if row["path"] != new_path:
                moved[row["path"]] = new_path
            aliases[f"images/{row['key']}.png"] = new_path  # how exports name files (no host path)
            if key in known:
                present += 1
                continue
            data = zf.read(member)
            if hashlib.sha256(data).hexdigest() != row["sha256"]:  # the file changed since it was checked
                raise InputError(f"{member} changed while it was imported")
            store.write_image_file(key, data)
            written.append(key)
            image_rows.append({**row, "key": key, "path": new_path, "bytes": len(data),
                               "provenance": "local" if trust else "imported"})
        # results name images by key and path: point them at this store's copies; a run naming
        # another run of the archive (an Explore tree's parent) follows it to its new id
        renamed = plan["renamed"]
        mappings = {"results": {**aliases, **moved, **{k: v for k, v in keymap.items() if k != v}, **renamed},
                    "request": renamed}
        for run in plan["runs"]:
            for column, mapping in mappings.items():
                if not mapping:   # nothing to point elsewhere (the column's JSON was checked already)
                    continue
                value = parse_json(run[column], f"the {column} of run {run['id'][:80]}")
                rewritten = replace_strings(value, mapping)
                if rewritten != value:
                    run[column] = json.dumps(rewritten, default=json_default)
        store.import_rows(images=image_rows, runs=plan["runs"], run_images=plan["links"], answers=plan["answers"],
                          embeddings=plan["embeddings"], labels=plan["labels"])  # with the spot-check answers
    except BaseException:
        store.remove_image_files(written)
        raise
    return {"imported": [r["id"] for r in plan["runs"]], "skipped": plan["skipped"], "renamed": plan["renamed"],
            "images_added": len(written), "images_present": present, "answers": len(plan["answers"]),
            "embeddings": len(plan["embeddings"]), "paths_rewritten": len(moved), "trusted": bool(trust),
            "left_out": plan["dropped"]}


def replace_strings(obj, mapping: dict):
    """`obj` (JSON-like) with every string that is a key of `mapping` replaced by its value."""
    if isinstance(obj, str):
        return mapping.get(obj, obj)
    if isinstance(obj, dict):
        return {k: replace_strings(v, mapping) for k, v in obj.items()}
    if isinstance(obj, list):
        return [replace_strings(v, mapping) for v in obj]
    return obj


PARENT_COLUMNS = ("request", "results")   # where a run names its parent (an Explore node: "parent")


def check_parent_links(store: Store, runs: list[dict], renamed: dict, name: str = "the archive") -> None:
    """InputError, in one sentence, unless the parent links of the archive's runs form a forest with the
    store's (issue 43): following "parent" (in a run's request, and in its results) from any run of the
    archive must end at a run without one, never come back to a run already passed. Each link is followed
    as it will be after the import (`renamed` archive ids, store runs as the store has them, an archive run
    in place of the store's run of its id); a run already checked is not walked again, so a chain costs
    one step a run."""
    ids = {run["id"] for run in runs}
    links: dict[str, dict[str, str]] = {column: {} for column in PARENT_COLUMNS}
    for run in runs:
        for column in PARENT_COLUMNS:
            value = parse_json(run[column], f"the {column} of run {run['id'][:80]}")
            parent = value.get("parent") if isinstance(value, dict) else None
            if isinstance(parent, str) and parent:
                links[column][run["id"]] = renamed.get(parent, parent)

    def parent_of(column: str, run_id: str) -> str:
        if run_id in ids:
            return links[column].get(run_id, "")
        rows = store.run_rows([run_id])   # a store run (or none: the link ends there)
        value = parse_json(rows[0][column], "a stored run") if rows and rows[0].get(column) else None
        parent = value.get("parent") if isinstance(value, dict) else None
        return parent if isinstance(parent, str) else ""

    for column, own in links.items():
        ended: set[str] = set()   # runs whose parent links are known to end
        for start in own:
            path, on_path, node = [], set(), start
            while node and node not in ended:
                if node in on_path:
                    loop = path[path.index(node):] + [node]
                    if ids & set(loop):
                        shown = " → ".join(loop if len(loop) <= 6 else loop[:3] + ["…"] + loop[-2:])
                        raise InputError(f"{name}: the parent links of its runs form a loop ({shown}), so they are "
                                         f"not a tree; nothing was imported")
                    break   # a loop the store held already: not this archive's, and every walk of it is bounded
                path.append(node)
                on_path.add(node)
                node = parent_of(column, node)
            ended |= on_path
