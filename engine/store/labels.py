"""Spot-check labels (issue 16): a person's label of an image on one axis of a run."""
from __future__ import annotations

import time
from typing import Iterable, Sequence

from ..common.errors import NotAllowedError
from .schema import in_chunks


class Labels:
    """Store's spot-check labels (a part of `Store`)."""

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
        for marks, chunk in in_chunks(image_keys):
            rows += self._read(f"SELECT * FROM labels WHERE image_key IN ({marks}){visible}", (*chunk, *args))
        return [dict(r) for r in sorted(rows, key=lambda r: r["created"])]
