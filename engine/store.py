"""The store: one SQLite database (WAL) plus image files under a data directory.

Every artefact is keyed by everything that determines it (DESIGN.md, "The store"):

- image: generator id, scheduler, steps, guidance, size, prompt, negative prompt, seed
- embedding / VQA answer: image key (or text) + evaluator id (+ question and choices)
- LLM reply: model id, messages, sampling parameters, seed

An identical request is therefore a cache hit, an interrupted run resumes where it stopped,
and every number can be traced back to the images and answers behind it.

Concurrency: one connection per thread, WAL journal, writes in short IMMEDIATE
transactions with a generous busy timeout; image files are written to a temporary name and
renamed, so a reader never sees half a file. A file whose bytes no longer match the
recorded sha256 (or that vanished) is reported missing, and the engine regenerates it.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import sqlite3
import threading
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np
from PIL import Image

from .errors import StoreError

SCHEMA = """
CREATE TABLE IF NOT EXISTS images (
    key TEXT PRIMARY KEY,
    generator TEXT NOT NULL, prompt TEXT NOT NULL, negative_prompt TEXT NOT NULL,
    seed INTEGER NOT NULL, steps INTEGER NOT NULL, guidance REAL NOT NULL,
    width INTEGER NOT NULL, height INTEGER NOT NULL, scheduler TEXT NOT NULL,
    path TEXT NOT NULL, sha256 TEXT NOT NULL, nsfw INTEGER NOT NULL DEFAULT 0,
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS embeddings (
    key TEXT PRIMARY KEY, subject TEXT NOT NULL, evaluator TEXT NOT NULL,
    dim INTEGER NOT NULL, vector BLOB NOT NULL, created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS answers (
    key TEXT PRIMARY KEY, image_key TEXT NOT NULL, evaluator TEXT NOT NULL,
    question TEXT NOT NULL, choices TEXT NOT NULL, answer TEXT NOT NULL, created REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS answers_by_image ON answers(image_key);
CREATE TABLE IF NOT EXISTS llm_replies (
    key TEXT PRIMARY KEY, model TEXT NOT NULL, request TEXT NOT NULL,
    reply TEXT NOT NULL, created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS runs (
    id TEXT PRIMARY KEY, method TEXT NOT NULL, status TEXT NOT NULL,
    request TEXT NOT NULL, results TEXT NOT NULL DEFAULT '{}', summary TEXT NOT NULL DEFAULT '{}',
    models TEXT NOT NULL DEFAULT '{}', version TEXT NOT NULL, error TEXT,
    created REAL NOT NULL, updated REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS run_images (
    run_id TEXT NOT NULL, image_key TEXT NOT NULL, label TEXT NOT NULL DEFAULT '',
    position INTEGER NOT NULL,
    PRIMARY KEY (run_id, image_key, label)
);
"""
# spot-check labels (issue 16): a person's label of one image on one axis, kept with the run it
# was checked in; looked up by image key too, so a later run over the same images reuses them
SCHEMA += """
CREATE TABLE IF NOT EXISTS labels (
    run_id TEXT NOT NULL, image_key TEXT NOT NULL, axis TEXT NOT NULL, label TEXT NOT NULL,
    who TEXT NOT NULL, created REAL NOT NULL,
    PRIMARY KEY (run_id, image_key, axis, who)
);
CREATE INDEX IF NOT EXISTS labels_by_image ON labels(image_key);
"""


def content_key(*parts) -> str:
    """sha256 over a canonical JSON rendering of `parts`: the store's one key function."""
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


def image_key(generator_id: str, prompt: str, seed: int, settings) -> str:
    """Key of one image: everything that determines its pixels (DESIGN.md)."""
    return content_key("image", generator_id, settings.scheduler, int(settings.steps),
                       float(settings.guidance), int(settings.width), int(settings.height),
                       prompt, settings.negative_prompt, int(seed))


@dataclass
class ImageRecord:
    """One stored image, as methods and tabs see it. `image` is loaded on demand."""

    key: str
    prompt: str
    seed: int
    path: str
    nsfw: bool = False
    cached: bool = False
    _image: Image.Image | None = None

    @property
    def image(self) -> Image.Image:
        if self._image is None:
            with Image.open(self.path) as im:
                self._image = im.convert("RGB")
        return self._image

    def to_json(self) -> dict:
        return {"key": self.key, "prompt": self.prompt, "seed": self.seed, "path": self.path,
                "nsfw": self.nsfw, "cached": self.cached}


class Store:
    """SQLite + files under `data_dir`. Safe to share across threads."""

    def __init__(self, data_dir: str | os.PathLike):
        self.data_dir = Path(data_dir).expanduser()
        self.image_dir = self.data_dir / "images"
        try:
            self.image_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the data directory {self.data_dir}: {exc}") from exc
        self.db_path = self.data_dir / "gaplens.sqlite"
        self._local = threading.local()
        self._conn().executescript(SCHEMA)  # executescript manages its own transaction

    # -- connections ---------------------------------------------------------------------------
    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.db_path, timeout=60, isolation_level=None,
                                       check_same_thread=False)
            except sqlite3.Error as exc:
                raise StoreError(f"cannot open the store at {self.db_path}: {exc}") from exc
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.row_factory = sqlite3.Row
            self._local.conn = conn
        return conn

    @contextmanager
    def _write(self):
        conn = self._conn()
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        else:
            conn.execute("COMMIT")

    def _read(self, sql: str, args: Sequence = ()) -> list[sqlite3.Row]:
        return self._conn().execute(sql, args).fetchall()

    def _read_in(self, select: str, column: str, values: Sequence, order: str = "") -> list[sqlite3.Row]:
        """Rows of `select ... WHERE column IN (values)`, queried in chunks that stay under
        SQLite's limit on bound variables (each chunk sorted by `order`)."""
        rows: list[sqlite3.Row] = []
        for chunk in _chunks(list(values), 500):
            marks = ",".join("?" * len(chunk))
            rows += self._read(f"{select} WHERE {column} IN ({marks})" + (f" ORDER BY {order}" if order else ""),
                               chunk)
        return rows

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None

    # -- images --------------------------------------------------------------------------------
    def _image_path(self, key: str) -> Path:
        return self.image_dir / key[:2] / f"{key}.png"

    def put_image(self, key: str, generator_id: str, prompt: str, seed: int, settings,
                  image: Image.Image, nsfw: bool = False) -> ImageRecord:
        """Write the PNG atomically, then its row. Returns the record (with the image attached)."""
        path = self._image_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        buf = io.BytesIO()
        image.save(buf, format="PNG", compress_level=1)
        data = buf.getvalue()
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        with self._write() as db:
            db.execute(
                "INSERT OR REPLACE INTO images VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (key, generator_id, prompt, settings.negative_prompt, int(seed), int(settings.steps),
                 float(settings.guidance), int(settings.width), int(settings.height), settings.scheduler,
                 str(path), hashlib.sha256(data).hexdigest(), int(bool(nsfw)), time.time()))
        return ImageRecord(key, prompt, int(seed), str(path), bool(nsfw), False, image.convert("RGB"))

    def get_images(self, keys: Sequence[str], verify: bool = True) -> dict[str, ImageRecord]:
        """The stored images among `keys` whose files exist and (with `verify`) match their hash."""
        found: dict[str, ImageRecord] = {}
        for row in self._read_in("SELECT key, prompt, seed, path, sha256, nsfw FROM images", "key", keys):
            path = Path(row["path"])
            if not path.is_absolute() or not path.exists():
                path = self._image_path(row["key"])  # data dir moved or imported elsewhere
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if verify and hashlib.sha256(data).hexdigest() != row["sha256"]:
                continue
            found[row["key"]] = ImageRecord(row["key"], row["prompt"], row["seed"], str(path),
                                            bool(row["nsfw"]), True)
        return found

    def image_rows(self, keys: Sequence[str]) -> list[dict]:
        return [dict(r) for r in self._read_in("SELECT * FROM images", "key", keys)]

    def count(self, table: str) -> int:
        if table not in {"images", "embeddings", "answers", "llm_replies", "runs", "run_images"}:
            raise ValueError(table)
        return self._read(f"SELECT COUNT(*) FROM {table}")[0][0]

    # -- embeddings ----------------------------------------------------------------------------
    def get_embeddings(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        return {row["key"]: np.frombuffer(row["vector"], dtype=np.float32).copy()
                for row in self._read_in("SELECT key, vector FROM embeddings", "key", keys)}

    def put_embeddings(self, rows: Iterable[tuple[str, str, str, np.ndarray]]) -> None:
        """rows: (key, subject, evaluator, vector)."""
        now = time.time()
        data = [(k, s, e, int(v.shape[-1]), np.asarray(v, np.float32).tobytes(), now) for k, s, e, v in rows]
        if data:
            with self._write() as db:
                db.executemany("INSERT OR REPLACE INTO embeddings VALUES (?,?,?,?,?,?)", data)

    # -- VQA answers ---------------------------------------------------------------------------
    def get_answers(self, keys: Sequence[str]) -> dict[str, str]:
        return {row["key"]: row["answer"] for row in self._read_in("SELECT key, answer FROM answers", "key", keys)}

    def put_answers(self, rows: Iterable[tuple[str, str, str, str, str, str]]) -> None:
        """rows: (key, image_key, evaluator, question, choices_json, answer)."""
        now = time.time()
        data = [(*r, now) for r in rows]
        if data:
            with self._write() as db:
                db.executemany("INSERT OR REPLACE INTO answers VALUES (?,?,?,?,?,?,?)", data)

    def answers_for_image(self, image_key: str) -> list[dict]:
        return [dict(r) for r in self._read(
            "SELECT evaluator, question, choices, answer FROM answers WHERE image_key=? ORDER BY created",
            (image_key,))]

    # -- LLM replies ---------------------------------------------------------------------------
    def get_llm_reply(self, key: str) -> str | None:
        rows = self._read("SELECT reply FROM llm_replies WHERE key=?", (key,))
        return rows[0]["reply"] if rows else None

    def put_llm_reply(self, key: str, model: str, request: dict, reply: str) -> None:
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO llm_replies VALUES (?,?,?,?,?)",
                       (key, model, json.dumps(request, sort_keys=True, default=str), reply, time.time()))

    # -- spot-check labels (issue 16) ---------------------------------------------------------
    def put_labels(self, rows: Iterable[tuple[str, str, str, str, str]]) -> int:
        """Store (run_id, image_key, axis, label, who) rows, stamped now; a person's new answer for
        the same image and axis in the same run replaces the old one. Returns how many were written."""
        rows = [(str(r), str(k), str(a).strip().lower(), str(lab).strip().lower(), str(w), time.time())
                for r, k, a, lab, w in rows]
        with self._write() as db:
            db.executemany("INSERT OR REPLACE INTO labels VALUES (?,?,?,?,?,?)", rows)
        return len(rows)

    def label_rows(self, run_id: str | None = None, image_keys: Sequence[str] = ()) -> list[dict]:
        """Stored labels of a run (with `run_id`) or of some images in any run (`image_keys`), oldest first."""
        if run_id is not None:
            return [dict(r) for r in self._read("SELECT * FROM labels WHERE run_id=? ORDER BY created", (run_id,))]
        return [dict(r) for r in self._read_in("SELECT * FROM labels", "image_key", image_keys, "created")]

    def import_labels(self, rows: Sequence[dict]) -> None:
        """Insert exported label rows verbatim (a run imported with its spot-check)."""
        with self._write() as db:
            db.executemany("INSERT OR REPLACE INTO labels VALUES (?,?,?,?,?,?)",
                           [(str(r["run_id"]), str(r["image_key"]), str(r["axis"]), str(r["label"]), str(r["who"]),
                             float(r["created"])) for r in rows])

    # -- runs ----------------------------------------------------------------------------------
    def create_run(self, method: str, request: dict, models: dict, version: str,
                   run_id: str | None = None) -> str:
        """A new run in status 'running'. Returns its id."""
        run_id = run_id or time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]
        now = time.time()
        with self._write() as db:
            db.execute("INSERT INTO runs (id, method, status, request, models, version, created, updated) "
                       "VALUES (?,?,?,?,?,?,?,?)",
                       (run_id, method, "running", json.dumps(request, default=str),
                        json.dumps(models, default=str), version, now, now))
        return run_id

    def update_run(self, run_id: str, *, status: str | None = None, results: dict | None = None,
                   summary: dict | None = None, error: str | None = None) -> None:
        sets, args = ["updated=?"], [time.time()]
        for column, value in (("status", status), ("error", error)):
            if value is not None:
                sets.append(f"{column}=?")
                args.append(value)
        for column, value in (("results", results), ("summary", summary)):
            if value is not None:
                sets.append(f"{column}=?")
                args.append(json.dumps(value, default=_json_default))
        with self._write() as db:
            db.execute(f"UPDATE runs SET {', '.join(sets)} WHERE id=?", (*args, run_id))

    def add_run_images(self, run_id: str, keys: Sequence[str], label: str = "") -> None:
        with self._write() as db:
            start = db.execute("SELECT COALESCE(MAX(position)+1, 0) FROM run_images WHERE run_id=?",
                               (run_id,)).fetchone()[0]
            db.executemany("INSERT OR IGNORE INTO run_images VALUES (?,?,?,?)",
                           [(run_id, k, label, start + i) for i, k in enumerate(keys)])

    def get_run(self, run_id: str) -> dict | None:
        rows = self._read("SELECT * FROM runs WHERE id=?", (run_id,))
        if not rows:
            return None
        run = dict(rows[0])
        for column in ("request", "results", "summary", "models"):
            run[column] = json.loads(run[column])
        run["images"] = [dict(r) for r in self._read(
            "SELECT image_key, label, position FROM run_images WHERE run_id=? ORDER BY position", (run_id,))]
        return run

    def list_runs(self, method: str | None = None) -> list[dict]:
        sql = "SELECT id, method, status, request, summary, models, version, error, created, updated FROM runs"
        rows = self._read(sql + (" WHERE method=?" if method else "") + " ORDER BY created DESC",
                          (method,) if method else ())
        out = []
        for r in rows:
            d = dict(r)
            for column in ("request", "summary", "models"):
                d[column] = json.loads(d[column])
            out.append(d)
        return out

    def image_path_for(self, key: str) -> Path:
        """Where this store keeps (or would keep) the PNG of image `key`."""
        return self._image_path(key)

    def run_rows(self, run_ids: Sequence[str]) -> list[dict]:
        """The raw `runs` rows (JSON columns left as text), in the order of `run_ids`."""
        by_id = {r["id"]: dict(r) for r in self._read_in("SELECT * FROM runs", "id", run_ids)}
        return [by_id[i] for i in run_ids if i in by_id]

    def run_image_rows(self, run_ids: Sequence[str]) -> list[dict]:
        return [dict(r) for r in self._read_in("SELECT * FROM run_images", "run_id", run_ids, "run_id, position")]

    def answer_rows(self, image_keys: Sequence[str]) -> list[dict]:
        """Every stored VQA answer / caption row of these images."""
        return [dict(r) for r in self._read_in("SELECT * FROM answers", "image_key", image_keys, "created, key")]

    def embedding_rows(self, subjects: Sequence[str]) -> list[dict]:
        """Every stored embedding whose subject (an image key or a text) is among `subjects`."""
        return [dict(r) for r in self._read_in("SELECT * FROM embeddings", "subject", subjects, "key")]

    def delete_run(self, run_id: str, keep_images: bool = False) -> dict:
        """Delete a run and its image links; unless `keep_images`, also the images no other run
        links to (rows, files, and their VQA answers and embeddings). Returns what was removed."""
        with self._write() as db:
            if db.execute("SELECT COUNT(*) FROM runs WHERE id=?", (run_id,)).fetchone()[0] == 0:
                return {"runs": 0, "images": 0, "answers": 0, "embeddings": 0}
            keys = [r[0] for r in db.execute("SELECT DISTINCT image_key FROM run_images WHERE run_id=?", (run_id,))]
            db.execute("DELETE FROM run_images WHERE run_id=?", (run_id,))
            db.execute("DELETE FROM labels WHERE run_id=?", (run_id,))
            db.execute("DELETE FROM runs WHERE id=?", (run_id,))
            orphans = [] if keep_images else [
                k for k in keys
                if db.execute("SELECT 1 FROM run_images WHERE image_key=? LIMIT 1", (k,)).fetchone() is None]
            files, answers, embeddings = [], 0, 0
            for chunk in _chunks(orphans, 500):
                marks = ",".join("?" * len(chunk))
                files += [(r[0], r[1]) for r in db.execute(f"SELECT key, path FROM images WHERE key IN ({marks})", chunk)]
                db.execute(f"DELETE FROM images WHERE key IN ({marks})", chunk)
                answers += db.execute(f"DELETE FROM answers WHERE image_key IN ({marks})", chunk).rowcount
                embeddings += db.execute(f"DELETE FROM embeddings WHERE subject IN ({marks})", chunk).rowcount
        for key, path in files:  # the recorded path and the canonical one differ after a move
            for candidate in {Path(path), self._image_path(key)}:
                if candidate.is_relative_to(self.image_dir):
                    candidate.unlink(missing_ok=True)
        return {"runs": 1, "images": len(files), "answers": answers, "embeddings": embeddings}

    def import_image(self, row: dict, data: bytes) -> bool:
        """Add an image (its `images` row and PNG bytes) from an export. The file goes to this
        store's canonical place; an image already stored intact is kept. True when it was added."""
        key = str(row["key"])
        if len(key) != 64 or any(c not in "0123456789abcdef" for c in key):  # keys name files: no paths
            raise StoreError(f"'{key[:80]}' is not an image key")
        if hashlib.sha256(data).hexdigest() != row["sha256"]:
            raise StoreError(f"image {key[:12]}… does not match its recorded sha256")
        if key in self.get_images([key]):
            return False
        path = self._image_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        values = {**row, "path": str(path)}
        columns = ("key", "generator", "prompt", "negative_prompt", "seed", "steps", "guidance", "width",
                   "height", "scheduler", "path", "sha256", "nsfw", "created")
        with self._write() as db:
            db.execute(f"INSERT OR REPLACE INTO images ({','.join(columns)}) VALUES ({','.join('?' * len(columns))})",
                       [values[c] for c in columns])
        return True

    # -- distributed jobs (engine/distributed.py) ----------------------------------------------
    def present_image_keys(self, keys: Sequence[str]) -> set[str]:
        """The keys among `keys` that have a row and a file (a stat, no hashing): a cheap check
        for planning work. `get_images` still verifies every file before it is used."""
        return {row["key"] for row in self._read_in("SELECT key, path FROM images", "key", list(dict.fromkeys(keys)))
                if Path(row["path"]).is_file() or self._image_path(row["key"]).is_file()}

    def adopt_images(self, rows: Iterable[dict]) -> int:
        """Add the `images` rows of PNGs another process already wrote to this store's canonical
        place (a shard of a distributed job). A row is added only when its file's bytes match its
        sha256; a key already stored with that sha256 is left alone; a stored row whose sha256
        differs is replaced (its file was rewritten). Returns how many rows were added."""
        rows = list(rows)
        known = {r["key"]: r["sha256"] for r in self._read_in(
            "SELECT key, sha256 FROM images", "key", list(dict.fromkeys(r["key"] for r in rows)))}
        columns = ("key", "generator", "prompt", "negative_prompt", "seed", "steps", "guidance", "width",
                   "height", "scheduler", "path", "sha256", "nsfw", "created")
        add = []
        for row in rows:
            key = str(row["key"])
            if known.get(key) == row["sha256"] or len(key) != 64 or any(c not in "0123456789abcdef" for c in key):
                continue  # already stored, or not an image key (keys name files: no paths)
            path = self._image_path(key)
            try:
                data = path.read_bytes()
            except OSError:
                continue
            if hashlib.sha256(data).hexdigest() != row["sha256"]:
                continue
            add.append([{**row, "path": str(path)}[c] for c in columns])
            known[key] = row["sha256"]
        if add:
            with self._write() as db:
                db.executemany(f"INSERT OR REPLACE INTO images ({','.join(columns)}) "
                               f"VALUES ({','.join('?' * len(columns))})", add)
        return len(add)

    def import_rows(self, *, runs: Sequence[dict] = (), run_images: Sequence[dict] = (),
                    answers: Sequence[dict] = (), embeddings: Sequence[dict] = ()) -> None:
        """Insert exported rows verbatim (runs and run_images replace, caches are kept if present)."""
        def insert(db, table, rows, verb):
            known = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
            for row in rows:
                cols = [c for c in row if c in known]
                db.execute(f"{verb} INTO {table} ({','.join(cols)}) VALUES ({','.join('?' * len(cols))})",
                           [row[c] for c in cols])

        with self._write() as db:
            insert(db, "runs", runs, "INSERT OR REPLACE")
            insert(db, "run_images", run_images, "INSERT OR REPLACE")
            insert(db, "answers", answers, "INSERT OR IGNORE")
            insert(db, "embeddings", embeddings, "INSERT OR IGNORE")


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _json_default(obj):
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (np.floating, np.integer, np.bool_)):
        return obj.item()
    if hasattr(obj, "to_json"):
        return obj.to_json()
    if hasattr(obj, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(obj)
    return str(obj)

