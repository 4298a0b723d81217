"""Runs in the store: each a record of one method's request, models, status and results, the
images it used, and who may see it (engine/common/access.py); imports and deletion."""
from __future__ import annotations

import json
import os
import socket
import sqlite3
import time
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple, Sequence

from ..common import access
from ..common.encoding import json_default
from ..common.errors import InputError, NotAllowedError
from ..common.texts import check_texts, needs_readable, readable
from .schema import MAX_PUBLIC_RESULTS_BYTES, MAX_REQUEST_BYTES, in_chunks


class Runs:
    """Store's runs (a part of `Store`)."""

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

    def create_run(self, method: str, request: dict, models: dict, version: str,
                   run_id: str | None = None, cost: int = 0) -> str:
        """A new run in status 'running', owned by the current visitor and recording this
        process (pid, host). Returns its id. InputError when the request is too large to store."""
        run_id = run_id or self.new_run_id()  # ids from outside are checked where they enter (engine/runs/imports.py)
        check_texts(request, "request", limit=None)   # checked where it entered; never stored unencodable
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
    def ledger(self, write: bool = True):
        """The charges ledger in one write transaction (engine/hosting/spending.py): what a check reads and
        the charge it then adds are atomic across threads and processes. Yields a Ledger; with
        `write=False` one that only reads, without taking the store's write lock."""
        if not write:
            with self._errors():
                yield Ledger(self._conn())
            return
        with self._write() as db:
            yield Ledger(db)

    def set_published(self, run_ids: Sequence[str], published: bool = True) -> int:
        """Publish (or withdraw) runs in the read-only gallery every visitor sees. Host only."""
        access.require_host(self.public, "publishing runs")
        with self._write() as db:
            return sum(db.execute("UPDATE runs SET published=? WHERE id=?", (int(published), i)).rowcount
                       for i in run_ids)

    def update_run(self, run_id: str, *, status: str | None = None, results: dict | None = None,
                   summary: dict | None = None, error: str | None = None, ended: bool | None = None) -> None:
        """Change a run's record; `ended`: True when the process running it ends it (done, failed,
        stopped), False when one runs it again (a resume); None leaves it."""
        sets, args = ["updated=?"], [time.time()]
        if ended is not None:
            sets.append("ended=?")
            args.append(args[0] if ended else None)
        for column, value in (("status", status), ("error", error)):
            if value is not None:
                sets.append(f"{column}=?")
                args.append(readable(value))   # an error may quote a model's reply
        for column, value in (("results", results), ("summary", summary)):
            if value is not None:
                text = _storable_json(value)
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
        run = {k: v for k, v in dict(rows[0]).items() if k not in ("pid", "host", "cost", "ended")}  # bookkeeping only
        for column in ("request", "results", "summary", "models"):
            run[column] = _decoded(run[column])
        run["images"] = [dict(r) for r in self._read(
            "SELECT image_key, label, position FROM run_images WHERE run_id=? ORDER BY position", (run_id,))]
        return run

    def run_status(self, run_id: str) -> "RunStatus | None":
        """(status, updated, ended) of the run, or None as `get_run` gives it: what a loop watching a
        run reads without decoding its results."""
        where, args = self._scope()
        rows = self._read("SELECT status, updated, ended FROM runs WHERE id=?" + (f" AND {where}" if where else ""),
                          (run_id, *args))
        return RunStatus(rows[0]["status"], rows[0]["updated"], rows[0]["ended"] is not None) if rows else None

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
                d[column] = _decoded(d[column])
            out.append(d)
        return out

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
        """The raw `runs` rows (JSON columns left as text, `readable`) the visitor may see, in the order of `run_ids`."""
        where, args = self._scope()
        by_id = {}
        for marks, chunk in in_chunks(run_ids):
            by_id.update({r["id"]: _readable_row(r) for r in self._read(
                f"SELECT * FROM runs WHERE id IN ({marks})" + (f" AND {where}" if where else ""),
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
            for marks, chunk in in_chunks(orphans):
                files += [(r[0], r[1]) for r in db.execute(f"SELECT key, path FROM images WHERE key IN ({marks})", chunk)]
                db.execute(f"DELETE FROM images WHERE key IN ({marks})", chunk)
                answers += db.execute(f"DELETE FROM answers WHERE image_key IN ({marks})", chunk).rowcount
                embeddings += db.execute(f"DELETE FROM embeddings WHERE subject IN ({marks})", chunk).rowcount
        for key, path in files:  # the recorded path and the canonical one differ after a move
            for candidate in {Path(path), self._image_path(key)}:
                if candidate.is_relative_to(self.image_dir):
                    candidate.unlink(missing_ok=True)
        return {"runs": 1, "images": len(files), "answers": answers, "embeddings": embeddings}

    def run_writable(self, run_id: str) -> bool:
        """Whether the current visitor may change or replace this run (the host: any run)."""
        where, args = self._scope(write=True)
        return bool(self._read("SELECT 1 FROM runs WHERE id=?" + (f" AND {where}" if where else ""), (run_id, *args)))

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


class RunStatus(NamedTuple):
    """A run's status, when its record last changed, and whether the process running it has ended it."""

    status: str
    updated: float
    ended: bool


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


JSON_COLUMNS = ("request", "results", "summary", "models")


def _decoded(text: str):
    """A JSON column's value; `readable` when its text escapes a surrogate or a NUL (a store written
    before texts were checked where they enter, engine/common/texts.py, may hold them)."""
    value = json.loads(text)
    return readable(value) if needs_readable(text) else value


def _storable_json(value) -> str:
    """The JSON text a run's results or summary are stored as: `readable` when they quote a text that
    no store or archive may hold (a model's reply; the request's texts were checked where they entered)."""
    text = json.dumps(value, default=json_default)
    return json.dumps(readable(json.loads(text))) if needs_readable(text) else text


def _readable_row(row) -> dict:
    """A raw `runs` row as exports copy it: its JSON columns and error `readable`, so it re-imports."""
    out = dict(row)
    for column in JSON_COLUMNS:
        if isinstance(out.get(column), str) and needs_readable(out[column]):
            out[column] = json.dumps(readable(json.loads(out[column])))
    if isinstance(out.get("error"), str):
        out["error"] = readable(out["error"])
    return out


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
