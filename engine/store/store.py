"""The store: one SQLite database (WAL; the rollback journal on a network filesystem) plus image files
under a data directory.

Every artefact is keyed by everything that determines it (DESIGN.md, "The store"):

- image: generator id, scheduler, steps, guidance, size, prompt, negative prompt, seed
- embedding / VQA answer: image key (or text) + evaluator id (+ question and choices)
- LLM reply: model id, messages, sampling parameters, seed

An identical request is therefore a cache hit, an interrupted run resumes where it stopped,
and every number can be traced back to the images and answers behind it.

Concurrency: one connection per thread, WAL journal (on NFS, Lustre, CIFS and other filesystems other
machines share, where WAL's shared memory does not work: `journal_mode=DELETE`, engine/store/filesystem.py),
writes in short IMMEDIATE transactions with a generous busy timeout; image files are written to a temporary name and
renamed, so a reader never sees half a file. A file whose bytes no longer match the
recorded sha256 (or that vanished) is reported missing, and the engine regenerates it.
"""
from __future__ import annotations

import errno
import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Sequence

from ..common.errors import StoreError
from .artefacts import Artefacts
from .filesystem import on_network_filesystem
from .keys import CAPTION, ImageRecord, answer_key, choices_json, content_key, embedding_key, image_key, is_key, is_run_id
from .labels import Labels
from .maintenance import Maintenance
from .runs import Runs
from .schema import COLUMNS, INDEXES, MAX_PUBLIC_RESULTS_BYTES, SCHEMA, in_chunks

# what callers import from here: the store and its keys and records (engine/store/keys.py)
__all__ = ["Store", "ImageRecord", "content_key", "image_key", "answer_key", "embedding_key", "choices_json",
           "CAPTION", "is_key", "is_run_id", "store_error", "MAX_PUBLIC_RESULTS_BYTES"]


class Store(Artefacts, Runs, Labels, Maintenance):
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
        # WAL needs every connection on one host (its index is shared memory): on a network filesystem the
        # rollback journal, which works with the filesystem's locks (engine/store/filesystem.py)
        self.journal_mode = "DELETE" if on_network_filesystem(self.data_dir) else "WAL"
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

    def _conn(self) -> sqlite3.Connection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            try:
                conn = sqlite3.connect(self.db_path, timeout=60, isolation_level=None,
                                       check_same_thread=False)
            except sqlite3.Error as exc:
                raise StoreError(f"cannot open the store at {self.db_path}: {exc}") from exc
            conn.execute(f"PRAGMA journal_mode={self.journal_mode}")
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
            conn = self._conn()
            try:
                return conn.execute(sql, args).fetchall()
            except sqlite3.OperationalError as exc:
                if "could not decode to utf-8" not in str(exc).lower():
                    raise
            # a text another tool wrote that is not UTF-8: read as U+FFFD, rather than one row hiding every other
            conn.text_factory = lambda raw: raw.decode("utf-8", "replace")
            try:
                return conn.execute(sql, args).fetchall()
            finally:
                conn.text_factory = str

    def _read_in(self, select: str, column: str, values: Sequence, order: str = "") -> list[sqlite3.Row]:
        """Rows of `select ... WHERE column IN (values)`, queried in chunks that stay under
        SQLite's limit on bound variables (each chunk sorted by `order`)."""
        rows: list[sqlite3.Row] = []
        for marks, chunk in in_chunks(values):
            rows += self._read(f"{select} WHERE {column} IN ({marks})" + (f" ORDER BY {order}" if order else ""),
                               chunk)
        return rows

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


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
