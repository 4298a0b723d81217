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

import errno
import hashlib
import io
import json
import os
import socket
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

from ..common import access
from ..common.errors import InputError, NotAllowedError, StoreError

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
CREATE TABLE IF NOT EXISTS refusals (
    key TEXT PRIMARY KEY, generator TEXT NOT NULL, prompt TEXT NOT NULL, seed INTEGER NOT NULL,
    message TEXT NOT NULL, created REAL NOT NULL
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
# what public visitors spent (issue 27): images, LLM calls and export bytes charged, by visitor
# and client address; kept apart from the runs, so deleting a run gives nothing back (engine/hosting/spending.py)
SCHEMA += """
CREATE TABLE IF NOT EXISTS charges (
    created REAL NOT NULL, visitor TEXT NOT NULL, address TEXT NOT NULL,
    images INTEGER NOT NULL, llm_calls INTEGER NOT NULL, export_bytes INTEGER NOT NULL, what TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS charges_by_created ON charges(created);
CREATE INDEX IF NOT EXISTS charges_by_visitor ON charges(visitor, created);
CREATE INDEX IF NOT EXISTS charges_by_address ON charges(address, created);
"""

# Columns added after the first release (added to older stores when they are opened):
# images.provenance 'local' (generated here) or 'imported' (from an archive: never a cache hit
# for a new generation), images.used (last use, for LRU clean-up), images.bytes (file size);
# runs.owner (the public-mode visitor, '' = the host), runs.published (shown read-only to every
# visitor), runs.pid/host (the process running it, to spot runs a dead process left
# 'running'), runs.cost (images the request was budgeted for).
COLUMNS = {
    "images": [("provenance", "TEXT NOT NULL DEFAULT 'local'"), ("used", "REAL"), ("bytes", "INTEGER")],
    "runs": [("owner", "TEXT NOT NULL DEFAULT ''"), ("published", "INTEGER NOT NULL DEFAULT 0"),
             ("pid", "INTEGER"), ("host", "TEXT"), ("cost", "INTEGER NOT NULL DEFAULT 0")],
}
INDEXES = """
CREATE INDEX IF NOT EXISTS runs_by_created ON runs(created);
CREATE INDEX IF NOT EXISTS runs_by_owner ON runs(owner, created);
CREATE INDEX IF NOT EXISTS runs_by_status ON runs(status);
CREATE INDEX IF NOT EXISTS run_images_by_image ON run_images(image_key);
CREATE INDEX IF NOT EXISTS images_by_used ON images(used);
CREATE INDEX IF NOT EXISTS embeddings_by_subject ON embeddings(subject);
"""
MAX_REQUEST_BYTES = 64 * 1024   # a run's stored request (validated requests are far smaller)
MAX_PUBLIC_RESULTS_BYTES = 8 * 2**20   # a visitor's run's stored results (a full public request's are < 1 MiB)
RUN_ID_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.")


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
    refused: str | None = None   # an image API refused the prompt (message); nsfw is set too

    @property
    def image(self) -> Image.Image:
        if self._image is None:
            with Image.open(self.path) as im:
                self._image = im.convert("RGB")
        return self._image

    def to_json(self) -> dict:
        out = {"key": self.key, "prompt": self.prompt, "seed": self.seed, "path": self.path,
               "nsfw": self.nsfw, "cached": self.cached}
        if self.refused:
            out["refused"] = self.refused
        return out


class Store:
    """SQLite + files under `data_dir`. Safe to share across threads."""

    def __init__(self, data_dir: str | os.PathLike, public: bool = False):
        self.data_dir = Path(data_dir).expanduser()
        self.image_dir = self.data_dir / "images"
        self.public = public   # public mode: runs are filtered by the current visitor (engine/common/access.py)
        self.quota_bytes: int | None = None   # public mode: everything stored (engine/hosting/storage.py)
        self.share_bytes: int | None = None   # public mode: each visitor's share of it
        try:
            self.image_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise StoreError(f"cannot create the data directory {self.data_dir}: {exc}") from exc
        self.db_path = self.data_dir / "gaplens.sqlite"
        self._local = threading.local()
        with self._errors():
            conn = self._conn()
            conn.executescript(SCHEMA)  # executescript manages its own transaction
            for table, columns in COLUMNS.items():
                have = {r[1] for r in conn.execute(f"PRAGMA table_info({table})")}
                for name, decl in columns:
                    if name not in have:
                        conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")
            conn.executescript(INDEXES)
        self.interrupted = self.mark_interrupted()
        for stale in self.image_dir.glob("*/.*.tmp"):  # a writer died between write and rename
            if time.time() - stale.stat().st_mtime > 3600:
                stale.unlink(missing_ok=True)

    @contextmanager
    def _errors(self):
        """Turn database and disk failures into one StoreError sentence saying what to do."""
        try:
            yield
        except StoreError:
            raise
        except (sqlite3.Error, OSError) as exc:
            raise store_error(exc) from exc

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
        with self._errors():
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
        with self._errors():
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
        self._write_file(path, data)
        now = time.time()
        with self._write() as db:
            db.execute(
                "INSERT OR REPLACE INTO images VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (key, generator_id, prompt, settings.negative_prompt, int(seed), int(settings.steps),
                 float(settings.guidance), int(settings.width), int(settings.height), settings.scheduler,
                 str(path), hashlib.sha256(data).hexdigest(), int(bool(nsfw)), now, "local", now, len(data)))
        return ImageRecord(key, prompt, int(seed), str(path), bool(nsfw), False, image.convert("RGB"))

    def _write_file(self, path: Path, data: bytes) -> None:
        """Write `data` to `path` atomically (temporary name, then rename; no leftover on failure)."""
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            with self._errors():
                tmp.write_bytes(data)
                os.replace(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)

    def get_images(self, keys: Sequence[str], verify: bool = True, local_only: bool = False
                   ) -> dict[str, ImageRecord]:
        """The stored images among `keys` whose files exist and (with `verify`) match their hash;
        with `local_only`, only those generated here (not imported from an untrusted archive)."""
        found: dict[str, ImageRecord] = {}
        select = "SELECT key, prompt, seed, path, sha256, nsfw FROM images"
        if local_only:
            select += " WHERE provenance='local' AND"
            rows = []
            for chunk in _chunks(list(keys), 500):
                rows += self._read(f"{select} key IN ({','.join('?' * len(chunk))})", chunk)
        else:
            rows = self._read_in(select, "key", keys)
        for row in rows:
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

    # -- refusals (an image API declined a prompt: recorded once, never retried) ---------------
    def refusal_placeholder(self) -> Path:
        """A plain grey PNG shown where a refused image would be."""
        path = self.data_dir / "refused.png"
        if not path.exists():
            tmp = path.with_name(f".refused.{uuid.uuid4().hex}.tmp")
            Image.new("RGB", (64, 64), (128, 128, 128)).save(tmp, format="PNG")
            os.replace(tmp, path)
        return path

    def put_refusal(self, key: str, generator_id: str, prompt: str, seed: int, message: str) -> ImageRecord:
        """Record that the generator refused (prompt, seed). Returns a record flagged nsfw and
        refused, pointing at the placeholder (it is not an image: metrics exclude it)."""
        with self._write() as db:
            db.execute("INSERT OR REPLACE INTO refusals VALUES (?,?,?,?,?,?)",
                       (key, generator_id, prompt, int(seed), str(message), time.time()))
        return ImageRecord(key, prompt, int(seed), str(self.refusal_placeholder()), True, False, refused=str(message))

    def get_refusals(self, keys: Sequence[str]) -> dict[str, ImageRecord]:
        """The recorded refusals among `keys`, as refused records."""
        rows = self._read_in("SELECT key, prompt, seed, message FROM refusals", "key", keys)
        placeholder = str(self.refusal_placeholder()) if rows else ""
        return {r["key"]: ImageRecord(r["key"], r["prompt"], r["seed"], placeholder, True, True,
                                      refused=r["message"]) for r in rows}

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

    # -- runs (each visible to whom engine/common/access.py says) -------------------------------------
    def _scope(self, write: bool = False) -> tuple[str, tuple]:
        """An SQL condition on `runs` (and its arguments) limiting rows to what the current
        visitor may see (their own runs and, unless `write`, the published ones); '' for all."""
        visitor = access.visitor_for(self.public)
        if visitor.host:
            return "", ()
        return ("owner=?", (visitor.id,)) if write else ("(owner=? OR published=1)", (visitor.id,))

    def owner(self) -> str:
        """The owner new runs get: the current visitor's id, '' for the host."""
        visitor = access.visitor_for(self.public)
        return "" if visitor.host else visitor.id

    def new_run_id(self) -> str:
        return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]

    # -- spot-check labels (issue 16) ---------------------------------------------------------
    def put_labels(self, rows: Iterable[tuple[str, str, str, str, str]]) -> int:
        """Store (run_id, image_key, axis, label, who) rows, stamped now; a person's new answer for
        the same image and axis in the same run replaces the old one. Returns how many were written."""
        rows = [(str(r), str(k), str(a).strip().lower(), str(lab).strip().lower(), str(w), time.time())
                for r, k, a, lab, w in rows]
        for run_id in {r[0] for r in rows}:  # public mode: a visitor labels only their own runs
            if self.public and not self.run_writable(run_id):
                raise NotAllowedError(f"run '{run_id}' is not yours: visitors may spot-check only their own runs")
        with self._write() as db:
            db.executemany("INSERT OR REPLACE INTO labels VALUES (?,?,?,?,?,?)", rows)
        return len(rows)

    def label_rows(self, run_id: str | None = None, image_keys: Sequence[str] = ()) -> list[dict]:
        """Stored labels of a run (with `run_id`) or of some images in any run (`image_keys`), oldest first."""
        where, args = self._scope()  # public mode: labels of the runs the visitor may see only
        visible = f" AND run_id IN (SELECT id FROM runs WHERE {where})" if where else ""
        if run_id is not None:
            return [dict(r) for r in self._read(f"SELECT * FROM labels WHERE run_id=?{visible} ORDER BY created",
                                                (run_id, *args))]
        rows = []
        for chunk in _chunks(list(image_keys), 400):
            rows += self._read(f"SELECT * FROM labels WHERE image_key IN ({','.join('?' * len(chunk))}){visible}",
                               (*chunk, *args))
        return [dict(r) for r in sorted(rows, key=lambda r: r["created"])]

    # -- runs ----------------------------------------------------------------------------------
    def create_run(self, method: str, request: dict, models: dict, version: str,
                   run_id: str | None = None, cost: int = 0) -> str:
        """A new run in status 'running', owned by the current visitor and recording this
        process (pid, host). Returns its id. InputError when the request is too large to store."""
        run_id = run_id or self.new_run_id()  # ids from outside are checked where they enter (engine/runs/imports.py)
        request_json = json.dumps(request, default=str)
        if len(request_json) > MAX_REQUEST_BYTES:
            raise InputError(f"the request is {len(request_json) // 1024} KiB; at most {MAX_REQUEST_BYTES // 1024} "
                             f"KiB are accepted (shorter prompts, fewer entries)")
        now = time.time()
        with self._write() as db:
            db.execute("INSERT INTO runs (id, method, status, request, models, version, created, updated, owner, "
                       "pid, host, cost) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
                       (run_id, method, "running", request_json, json.dumps(models, default=str), version, now,
                        now, self.owner(), os.getpid(), socket.gethostname(), int(cost)))
        return run_id

    def mark_interrupted(self) -> list[str]:
        """Mark 'interrupted' the runs left 'running' by a process of this host that is gone
        (killed, crashed, power cut). Returns their ids. Runs of other hosts are left alone,
        except in public mode: a public server owns its store, and a restarted Space comes
        back on a new host name, so every run not of a live process here was interrupted."""
        here = socket.gethostname()
        dead = [r["id"] for r in self._read("SELECT id, pid, host FROM runs WHERE status='running'")
                if (self.public or r["host"] in (None, here))
                and not (r["host"] == here and _alive(r["pid"]))]
        if dead:
            with self._write() as db:
                db.executemany("UPDATE runs SET status='interrupted', error=?, updated=? WHERE id=? AND status='running'",
                               [("the process running it stopped (killed or crashed); run it again to resume from "
                                 "the store", time.time(), i) for i in dead])
        return dead

    @contextmanager
    def ledger(self):
        """The charges ledger in one write transaction (engine/hosting/spending.py): what a check reads and
        the charge it then adds are atomic across threads and processes. Yields a Ledger."""
        with self._write() as db:
            yield Ledger(db)

    def set_published(self, run_ids: Sequence[str], published: bool = True) -> int:
        """Publish (or withdraw) runs in the read-only gallery every visitor sees. Host only."""
        access.require_host(self.public, "publishing runs")
        with self._write() as db:
            return sum(db.execute("UPDATE runs SET published=? WHERE id=?", (int(published), i)).rowcount
                       for i in run_ids)

    def update_run(self, run_id: str, *, status: str | None = None, results: dict | None = None,
                   summary: dict | None = None, error: str | None = None) -> None:
        sets, args = ["updated=?"], [time.time()]
        for column, value in (("status", status), ("error", error)):
            if value is not None:
                sets.append(f"{column}=?")
                args.append(value)
        for column, value in (("results", results), ("summary", summary)):
            if value is not None:
                text = json.dumps(value, default=_json_default)
                if self.public and len(text) > MAX_PUBLIC_RESULTS_BYTES and not access.visitor_for(True).host:
                    raise InputError(f"this run's {column} are {len(text) / 2**20:.0f} MiB; a public GapLens keeps at "
                                     f"most {MAX_PUBLIC_RESULTS_BYTES // 2**20} MiB per run (ask for fewer images or sets)")
                sets.append(f"{column}=?")
                args.append(text)
        with self._write() as db:
            db.execute(f"UPDATE runs SET {', '.join(sets)} WHERE id=?", (*args, run_id))

    def add_run_images(self, run_id: str, keys: Sequence[str], label: str = "") -> None:
        with self._write() as db:
            start = db.execute("SELECT COALESCE(MAX(position)+1, 0) FROM run_images WHERE run_id=?",
                               (run_id,)).fetchone()[0]
            db.executemany("INSERT OR IGNORE INTO run_images VALUES (?,?,?,?)",
                           [(run_id, k, label, start + i) for i, k in enumerate(keys)])

    def get_run(self, run_id: str) -> dict | None:
        """The run with its JSON columns decoded and its image links, or None when there is no
        such run or the current visitor may not see it."""
        where, args = self._scope()
        rows = self._read("SELECT * FROM runs WHERE id=?" + (f" AND {where}" if where else ""), (run_id, *args))
        if not rows:
            return None
        run = {k: v for k, v in dict(rows[0]).items() if k not in ("pid", "host", "cost")}  # bookkeeping only
        for column in ("request", "results", "summary", "models"):
            run[column] = json.loads(run[column])
        run["images"] = [dict(r) for r in self._read(
            "SELECT image_key, label, position FROM run_images WHERE run_id=? ORDER BY position", (run_id,))]
        return run

    def require_run(self, run_id: str, method: str | None = None, what: str = "run", hint: str = "") -> dict:
        """The run (`get_run`) when the current visitor may see it and it is of `method` (any when
        None); else InputError in one sentence that reads the same for another visitor's run as for
        a missing one, and names the data directory only in local mode."""
        run = self.get_run(str(run_id or "").strip())
        if run is None or (method and run["method"] != method):
            where = "" if self.public else f" at {self.data_dir}"  # no host paths for visitors
            raise InputError(f"no {what} '{str(run_id)[:80]}' in the store{where}{hint}")
        return run

    def list_runs(self, method: str | None = None, limit: int | None = None, offset: int = 0,
                  oldest_first: bool = False) -> list[dict]:
        """The runs the current visitor may see, newest first (`limit` of them from `offset`)."""
        sql = ("SELECT id, method, status, request, summary, models, version, error, created, updated, owner, "
               "published FROM runs")
        where, args = self._scope()
        conditions = ([where] if where else []) + (["method=?"] if method else [])
        args = (*args, *((method,) if method else ()))
        sql += (" WHERE " + " AND ".join(conditions) if conditions else "") + \
            (" ORDER BY created ASC, id ASC" if oldest_first else " ORDER BY created DESC, id DESC")
        if limit is not None:
            sql, args = sql + " LIMIT ? OFFSET ?", (*args, int(limit), int(offset))
        rows = self._read(sql, args)
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

    def run_methods(self) -> list[str]:
        """The methods of the runs the current visitor may see, sorted."""
        where, args = self._scope()
        return [r[0] for r in self._read("SELECT DISTINCT method FROM runs" + (f" WHERE {where}" if where else "")
                                         + " ORDER BY method", args)]

    def count_runs(self) -> int:
        """How many runs the current visitor may see."""
        where, args = self._scope()
        return self._read("SELECT COUNT(*) FROM runs" + (f" WHERE {where}" if where else ""), args)[0][0]

    def run_exists(self, run_id: str) -> bool:
        """Whether any run (visible or not) has this id."""
        return bool(self._read("SELECT 1 FROM runs WHERE id=?", (run_id,)))

    def run_rows(self, run_ids: Sequence[str]) -> list[dict]:
        """The raw `runs` rows (JSON columns left as text) the visitor may see, in the order of `run_ids`."""
        where, args = self._scope()
        by_id = {}
        for chunk in _chunks(list(run_ids), 400):
            by_id.update({r["id"]: dict(r) for r in self._read(
                f"SELECT * FROM runs WHERE id IN ({','.join('?' * len(chunk))})" + (f" AND {where}" if where else ""),
                (*chunk, *args))})
        return [by_id[i] for i in run_ids if i in by_id]

    def imported_run_ids(self, run_ids: Sequence[str]) -> set[str]:
        """The runs among `run_ids` that came from an archive: an import records no process (host)
        that ran them, a run made here always does (`create_run`)."""
        return {r["id"] for r in self.run_rows(run_ids) if not r.get("host")}

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
        links to (rows, files, and their VQA answers and embeddings). Returns what was removed:
        nothing for a run the visitor may not see, as for a missing one (no existence oracle)."""
        where, args = self._scope(write=True)
        seen, seen_args = self._scope()
        with self._write() as db:
            if db.execute("SELECT COUNT(*) FROM runs WHERE id=?" + (f" AND {seen}" if seen else ""),
                          (run_id, *seen_args)).fetchone()[0] == 0:
                return {"runs": 0, "images": 0, "answers": 0, "embeddings": 0}
            if where and db.execute(f"SELECT COUNT(*) FROM runs WHERE id=? AND {where}", (run_id, *args)).fetchone()[0] == 0:
                raise NotAllowedError(f"run '{run_id}' is published, not yours: visitors may delete only their own runs")
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

    def touch(self, keys: Sequence[str]) -> None:
        """Record that these images were just used (least-recently-used clean-up keeps them longest)."""
        if keys:
            with self._write() as db:
                now = time.time()
                for chunk in _chunks(list(keys), 500):
                    db.execute(f"UPDATE images SET used=? WHERE key IN ({','.join('?' * len(chunk))})", (now, *chunk))

    # -- size and clean-up ---------------------------------------------------------------------
    def usage(self) -> dict:
        """{"images": n, "image_bytes": bytes of the image files, "database_bytes": size of the
        database files, "database_used_bytes": bytes of its pages in use (deleted rows free pages
        the file keeps), "total_bytes": image_bytes + database_used_bytes}."""
        rows = self._read("SELECT key, path, bytes FROM images WHERE bytes IS NULL")
        if rows:  # stores from before the `bytes` column: measure once
            sizes = []
            for r in rows:
                try:
                    sizes.append((self._image_path(r["key"]).stat().st_size, r["key"]))
                except OSError:
                    sizes.append((0, r["key"]))
            with self._write() as db:
                db.executemany("UPDATE images SET bytes=? WHERE key=?", sizes)
        n, total = self._read("SELECT COUNT(*), COALESCE(SUM(bytes), 0) FROM images")[0]
        db_bytes = sum(p.stat().st_size for p in self.data_dir.glob("gaplens.sqlite*") if p.exists())
        conn = self._conn()
        used = (conn.execute("PRAGMA page_count").fetchone()[0] - conn.execute("PRAGMA freelist_count").fetchone()[0]) \
            * conn.execute("PRAGMA page_size").fetchone()[0]
        return {"images": n, "image_bytes": int(total), "database_bytes": db_bytes, "database_used_bytes": used,
                "total_bytes": int(total) + used}

    def visitor_usage(self, owner: str) -> int:
        """Bytes `owner`'s runs hold (`runs_usage`)."""
        return self._usage("SELECT id FROM runs WHERE owner=?", owner)

    def runs_usage(self, run_ids: Sequence[str]) -> int:
        """Bytes these runs hold: their rows (request, results, summary, image links, labels), the
        image files they link, and those images' VQA answers and embeddings. An image two
        visitors' runs link counts for both."""
        return self._usage("SELECT value AS id FROM json_each(?)", json.dumps(list(run_ids)))

    def _usage(self, runs: str, arg) -> int:
        return int(self._read(f"""
            WITH mine AS ({runs}),
                 keys AS (SELECT DISTINCT image_key AS key FROM run_images WHERE run_id IN (SELECT id FROM mine))
            SELECT
              (SELECT COALESCE(SUM(length(request) + length(results) + length(summary) + length(models)
                                   + COALESCE(length(error), 0) + 200), 0) FROM runs WHERE id IN (SELECT id FROM mine))
            + (SELECT COUNT(*) * 150 FROM run_images WHERE run_id IN (SELECT id FROM mine))
            + (SELECT COALESCE(SUM(bytes), 0) FROM images WHERE key IN (SELECT key FROM keys))
            + (SELECT COALESCE(SUM(length(vector) + length(subject) + 100), 0) FROM embeddings
               WHERE subject IN (SELECT key FROM keys))
            + (SELECT COALESCE(SUM(length(answer) + length(question) + length(choices) + 200), 0) FROM answers
               WHERE image_key IN (SELECT key FROM keys))
            + (SELECT COALESCE(SUM(length(label) + length(axis) + length(who) + 200), 0) FROM labels
               WHERE run_id IN (SELECT id FROM mine))""", (arg,))[0][0])

    def idle_visitor_runs(self, before: float) -> list[str]:
        """Ids of the visitors' runs (not the host's, not published, not running) last updated
        before `before`, least recently updated first: what a full public store removes first."""
        return [r[0] for r in self._read("SELECT id FROM runs WHERE owner!='' AND published=0 AND status!='running' "
                                         "AND updated<? ORDER BY updated", (before,))]

    def gc(self, quota_bytes: int | None = None) -> dict:
        """Remove images no run needs (no run links them), least recently used first, until the
        image files fit in `quota_bytes` (None: remove every such image), with their VQA answers
        and embeddings; also leftover temporary files. Host only. Returns what was removed and
        the usage after: {"images", "bytes", "answers", "embeddings", "usage", "over_quota"}."""
        access.require_host(self.public, "cleaning the store")
        usage = self.usage()
        excess = None if quota_bytes is None else usage["image_bytes"] - int(quota_bytes)
        removed = {"images": 0, "bytes": 0, "answers": 0, "embeddings": 0}
        if excess is None or excess > 0:
            candidates = self._read(
                "SELECT key, path, COALESCE(bytes, 0) AS bytes FROM images WHERE NOT EXISTS "
                "(SELECT 1 FROM run_images WHERE run_images.image_key = images.key) "
                "ORDER BY COALESCE(used, created) ASC")
            victims, freed = [], 0
            for row in candidates:
                if excess is not None and freed >= excess:
                    break
                victims.append((row["key"], row["path"]))
                freed += row["bytes"]
            with self._write() as db:
                for chunk in _chunks([k for k, _ in victims], 500):
                    marks = ",".join("?" * len(chunk))
                    # re-check under the write lock: a run may have linked one meanwhile
                    gone = [r[0] for r in db.execute(
                        f"SELECT key FROM images WHERE key IN ({marks}) AND NOT EXISTS "
                        f"(SELECT 1 FROM run_images WHERE run_images.image_key = images.key)", chunk)]
                    if not gone:
                        continue
                    marks = ",".join("?" * len(gone))
                    removed["bytes"] += db.execute(f"SELECT COALESCE(SUM(bytes), 0) FROM images WHERE key IN ({marks})",
                                                   gone).fetchone()[0]
                    removed["images"] += db.execute(f"DELETE FROM images WHERE key IN ({marks})", gone).rowcount
                    removed["answers"] += db.execute(f"DELETE FROM answers WHERE image_key IN ({marks})", gone).rowcount
                    removed["embeddings"] += db.execute(f"DELETE FROM embeddings WHERE subject IN ({marks})",
                                                        gone).rowcount
            for key, path in victims:
                if self.get_images([key], verify=False):
                    continue  # re-linked and regenerated meanwhile
                for candidate in {Path(path), self._image_path(key)}:
                    if candidate.is_relative_to(self.image_dir):
                        candidate.unlink(missing_ok=True)
        for stale in self.image_dir.glob("*/.*.tmp"):
            stale.unlink(missing_ok=True)
        after = self.usage()
        over = None if quota_bytes is None else max(0, after["image_bytes"] - int(quota_bytes))
        return {**removed, "usage": after, "over_quota": over}

    # -- distributed jobs (engine/core/distributed.py) ----------------------------------------------
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

    def run_writable(self, run_id: str) -> bool:
        """Whether the current visitor may change or replace this run (the host: any run)."""
        where, args = self._scope(write=True)
        return bool(self._read("SELECT 1 FROM runs WHERE id=?" + (f" AND {where}" if where else ""), (run_id, *args)))

    def write_image_file(self, key: str, data: bytes) -> Path:
        """Write an image file at key's canonical place (atomically). Returns its path."""
        if not is_key(key):
            raise StoreError(f"'{key[:80]}' is not an image key")
        path = self._image_path(key)
        self._write_file(path, data)
        return path

    def remove_image_files(self, keys: Sequence[str]) -> None:
        """Remove the files of these keys (a failed import's files; their rows were never written)."""
        for key in keys:
            if is_key(key):
                self._image_path(key).unlink(missing_ok=True)

    def import_rows(self, *, images: Sequence[dict] = (), runs: Sequence[dict] = (), run_images: Sequence[dict] = (),
                    answers: Sequence[dict] = (), embeddings: Sequence[dict] = (), labels: Sequence[dict] = ()) -> None:
        """Insert checked exported rows in one transaction (images, answers and embeddings
        already stored are kept; runs, run_images and spot-check labels replace)."""
        def insert(db, table, rows, verb):
            known = {r[1] for r in db.execute(f"PRAGMA table_info({table})")}
            for row in rows:
                cols = [c for c in row if c in known]
                db.execute(f"{verb} INTO {table} ({','.join(cols)}) VALUES ({','.join('?' * len(cols))})",
                           [row[c] for c in cols])

        with self._write() as db:
            insert(db, "images", images, "INSERT OR IGNORE")
            insert(db, "runs", runs, "INSERT OR REPLACE")
            insert(db, "run_images", run_images, "INSERT OR REPLACE")
            insert(db, "answers", answers, "INSERT OR IGNORE")
            insert(db, "embeddings", embeddings, "INSERT OR IGNORE")
            insert(db, "labels", labels, "INSERT OR REPLACE")


class Ledger:
    """The `charges` table inside a write transaction (Store.ledger)."""

    KEEP_S = 86400   # charges older than a day are removed (budgets look back one hour)

    def __init__(self, db: sqlite3.Connection):
        self.db = db

    def charges(self, since: float, visitor: str | None = None, address: str | None = None
                ) -> list[tuple[float, int, int, int]]:
        """(created, images, llm_calls, export_bytes) of the charges since `since`, of one visitor or
        client address (None: everyone's), oldest first."""
        where, args = "created>=?", [since]
        for column, value in (("visitor", visitor), ("address", address)):
            if value is not None:
                where, args = f"{where} AND {column}=?", [*args, value]
        return [tuple(r) for r in self.db.execute(
            f"SELECT created, images, llm_calls, export_bytes FROM charges WHERE {where} ORDER BY created", args)]

    def add(self, visitor: str, address: str, spend: dict, what: str) -> None:
        """Charge `spend` ({"images", "llm_calls", "export_bytes"}: amounts) now."""
        now = time.time()
        self.db.execute("INSERT INTO charges VALUES (?,?,?,?,?,?,?)",
                        (now, visitor, address, *(int(spend.get(k, 0)) for k in ("images", "llm_calls", "export_bytes")),
                         what[:200]))
        self.db.execute("DELETE FROM charges WHERE created<?", (now - self.KEEP_S,))


def is_key(text: str) -> bool:
    """Whether `text` is a store key (64 lower-case hex digits): safe as a file name."""
    return isinstance(text, str) and len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def is_run_id(text: str) -> bool:
    """Whether `text` can be a run id: 1-80 letters, digits, '-', '_' or '.', not starting with
    '.' (run ids become export file names, so no path characters)."""
    return (isinstance(text, str) and 0 < len(text) <= 80 and not text.startswith(".")
            and all(c in RUN_ID_CHARS for c in text))


def _alive(pid) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, ValueError):
        return True  # another user's process: assume it is still running
    return True


def store_error(exc: BaseException) -> StoreError:
    """One sentence for a database or disk failure, saying what to do."""
    text = str(exc).lower()
    if getattr(exc, "errno", None) == errno.ENOSPC or "full" in text:
        return StoreError("the disk holding the GapLens store is full: free some space (for example with "
                          "`python -m engine runs gc`, or by deleting runs) and try again")
    if isinstance(exc, sqlite3.DatabaseError) and any(w in text for w in ("not a database", "malformed", "corrupt")):
        return StoreError("the GapLens database (gaplens.sqlite in the data directory) is damaged: move it and its "
                          "-wal/-shm files aside (or restore a backup) and start GapLens again to begin a new store")
    if isinstance(exc, sqlite3.OperationalError) and "locked" in text:
        return StoreError("the GapLens store is busy (another process holds it for too long): try again in a moment")
    if isinstance(exc, PermissionError) or "readonly" in text or "read-only" in text:
        return StoreError("GapLens may not write to its data directory: give it write permission or choose "
                          "another one with --data-dir")
    return StoreError(f"the GapLens store could not be read or written ({type(exc).__name__}: {exc}); check the "
                      "disk and the data directory, then try again")


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

