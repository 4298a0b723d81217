"""A precomputed gallery: a published GapLens export opened read-only (`python app.py --gallery X`), so
visitors browse real-model audits at once without any GPU time, as the Stable Bias explorers do.

`X` is an export zip (`python -m engine runs export --format zip`), a folder holding one (or the
zip's tree unpacked), or a Hugging Face dataset id ("owner/name") whose repository holds either;
the dataset is fetched with huggingface_hub's `snapshot_download`. The export is imported once into
its own store under the data directory's `galleries/` (keyed by the source's content), then opened
read-only: every write raises StoreError, so nothing a visitor does can change it.
"""
from __future__ import annotations

import hashlib
import shutil
import sqlite3
import tempfile
from contextlib import contextmanager
from pathlib import Path

from ..common.errors import InputError, StoreError
from ..store.store import Store

READ_ONLY_MESSAGE = "this is a read-only gallery of published audits; run GapLens locally to make new runs"


class ReadOnlyStore(Store):
    """A Store whose SQLite connections are query-only and whose writes raise StoreError."""

    def _conn(self) -> sqlite3.Connection:
        fresh = getattr(self._local, "conn", None) is None
        conn = super()._conn()
        if fresh:
            conn.execute("PRAGMA query_only = ON")
        return conn

    @contextmanager
    def _write(self):
        raise StoreError(READ_ONLY_MESSAGE)
        yield  # pragma: no cover - makes this a generator for contextmanager

    def put_image(self, *args, **kwargs):
        raise StoreError(READ_ONLY_MESSAGE)


def open_gallery(source: str, cache_dir: str | Path) -> ReadOnlyStore:
    """Returns the read-only store of the export at `source` (zip, folder, or HF dataset id), imported
    under `cache_dir`/galleries/<hash of the export> with `engine.runs.imports.import_zip` (validated like
    any untrusted archive). Raises InputError when `source` is none of these."""
    from .imports import import_zip

    zip_path, cleanup = _export_zip(source)
    try:
        digest = hashlib.sha256(Path(zip_path).read_bytes()).hexdigest()[:16]
        target = Path(cache_dir).expanduser() / "galleries" / digest
        store = Store(target)
        import_zip(store, zip_path)  # runs already imported are skipped: reopening is cheap
        store.close()
    finally:
        if cleanup:
            shutil.rmtree(cleanup, ignore_errors=True)
    return ReadOnlyStore(target)


def _export_zip(source: str) -> tuple[str, str | None]:
    """Returns (path of an export zip, a temporary folder to delete afterwards or None)."""
    path = Path(source).expanduser()
    if path.is_file():
        return str(path), None
    if not path.exists():
        if path.is_absolute() or source.startswith((".", "~")) or source.count("/") != 1:
            raise InputError(f"gallery '{source}' is neither an export zip, a folder, nor a dataset id owner/name")
        path = _download_dataset(source)
    zips = sorted(path.glob("*.zip"))
    if zips:
        return str(zips[0]), None
    if (path / "gaplens" / "manifest.json").is_file():
        scratch = tempfile.mkdtemp(prefix="gaplens-gallery-")
        return shutil.make_archive(str(Path(scratch) / "export"), "zip", root_dir=path), scratch
    raise InputError(f"gallery '{source}' holds no GapLens export (no .zip and no gaplens/manifest.json)")


def _download_dataset(repo_id: str, cache_dir: str | None = None) -> Path:
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(repo_id, repo_type="dataset", cache_dir=cache_dir))
    except Exception as exc:  # noqa: BLE001 - offline, unknown or gated dataset: one sentence
        raise InputError(f"could not fetch the gallery dataset '{repo_id}' from the Hugging Face hub "
                         f"({type(exc).__name__}); check the id, the network, or HF_TOKEN for a private "
                         f"dataset") from None
