"""The store's size and its clean-up: usage per visitor and per run, least-recently-used image
removal under a quota, idle visitors' runs."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

from ..common import access
from .schema import in_chunks


class Maintenance:
    """Store's size and clean-up (a part of `Store`)."""

    def count(self, table: str) -> int:
        if table not in {"images", "embeddings", "answers", "llm_replies", "runs", "run_images"}:
            raise ValueError(table)
        return self._read(f"SELECT COUNT(*) FROM {table}")[0][0]

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
                for marks, chunk in in_chunks([k for k, _ in victims]):
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
