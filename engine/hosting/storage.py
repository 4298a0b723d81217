"""The store of a public GapLens, shared fairly (issue 27).

Everything a visitor adds counts: their runs' rows and results, the images their runs link
(generated or imported) and those images' answers and embeddings (`Store.visitor_usage`). Each
visitor has a share (`Budget.storage_mb`): a request that could take them past it is refused
before it starts, naming what to delete, so one visitor filling their share never fails
another's run. The whole store has a quota (`--quota-gb`, images and database together): past it,
images no run needs go first (least recently used), then the runs of visitors idle for an hour
(never the host's, a published or a running one), least recently updated first; only a store
that holds nothing else to remove refuses new work. A run's results and an import's size have
public caps (`store.MAX_PUBLIC_RESULTS_BYTES`, `import_limits`).
"""
from __future__ import annotations

import time

from ..common import access
from ..common.errors import StoreError
from .limits import over_budget

IMAGE_ROWS_BYTES = 16 * 2**10   # an image's run link, VQA answers, caption and embedding (a few KiB)
IDLE_S = 3600                   # a visitor's run untouched this long may be removed when the store is full
MIB = 2**20
EXPORT_BYTES_PER_IMAGE = MIB    # an exported image with its rows (a generated 512² PNG is 0.3-0.8 MB)


def image_bytes(width: int, height: int) -> int:
    """The most one stored image of this size takes: an 8-bit RGB PNG never exceeds its raw
    pixels by much (noise does not compress), plus its rows."""
    return int(width) * int(height) * 3 + IMAGE_ROWS_BYTES


def check_share(store, visitor: access.Visitor, adding: int, what: str = "this request") -> int:
    """The bytes `visitor` holds; OverBudgetError when `adding` more would pass their share."""
    used = store.visitor_usage(visitor.id)
    share = store.share_bytes
    if share and used + adding > share:
        raise over_budget(f"each visitor's runs may hold {share / MIB:.0f} MiB of this GapLens' store; yours hold "
                          f"{used / MIB:.0f} MiB and {what} may add up to {adding / MIB:.0f} MiB (delete some of your "
                          "runs in the Runs tab to make room)")
    return used


def make_room(store) -> int:
    """Bring the store within `store.quota_bytes` (acting for the host): images no run needs
    first, then visitors' runs idle for IDLE_S, least recently updated first. Returns the bytes
    it is still over (0 when it fits or has no quota)."""
    quota = store.quota_bytes
    if not quota:
        return 0
    usage = store.usage()
    if usage["total_bytes"] <= quota:
        return 0
    with access.acting_as(access.HOST):
        store.gc(max(0, quota - usage["database_used_bytes"]))
        over = store.usage()["total_bytes"] - quota
        for run_id in store.idle_visitor_runs(time.time() - IDLE_S) if over > 0 else ():
            store.delete_run(run_id)
            over = store.usage()["total_bytes"] - quota
            if over <= 0:
                break
    return max(0, over)


def require_room(store) -> None:
    """StoreError when the store stays over its quota after `make_room`."""
    if make_room(store):
        raise StoreError("this GapLens' store is full (its runs need all of its space); try again later")


def upload_limit(budget) -> int:
    """The largest file a public GapLens accepts (Gradio's max_file_size): an export of an hour of a
    visitor's images, `hourly_images` × EXPORT_BYTES_PER_IMAGE, never more than their share of
    the store (a study pack or answers file is far smaller)."""
    return min(budget.hourly_images * EXPORT_BYTES_PER_IMAGE, budget.storage_mb * MIB)


def import_room(store) -> int | None:
    """The most bytes an import may unpack to for the current visitor of a public store: what is
    left of their share (None for the host and in local mode)."""
    visitor = access.visitor_for(store.public)
    if visitor.host or not store.share_bytes:
        return None
    return max(0, store.share_bytes - store.visitor_usage(visitor.id))
