"""Issue 43's tree attacks re-run: a looped archive, a loop already in a store, a 1,000-node chain.

    python bench/explore_tree_attacks.py [--chain 1000]

- loop_self_refused, loop_pair_refused: 1 when importing an archive whose node is its own parent (or whose
  two nodes are each other's) is refused with one sentence and nothing is imported;
- stored_loop_link_s, stored_loop_link_peak_mib: opening `?tab=explore&tree=A` (the tab's `open_link`) on
  a store that already holds A → B → A (written directly, as an import before the check could);
- chain_import_s: importing the chain's archive; chain_link_peak_mib: traced memory at the peak while the
  link to its deepest node opens; rss_growth_mib: the process' resident memory after minus before;
- chain_link_s (headline, last): opening `?tab=explore&tree=<root>&run=<deepest node>`.
"""
from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
import tracemalloc
from pathlib import Path

from _common import report


def rss_mib() -> float:
    """The process' peak resident memory so far, MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def timed(call, *args) -> tuple[object, float]:
    """(result, seconds) of one call."""
    start = time.perf_counter()
    out = call(*args)
    return out, time.perf_counter() - start


def traced(call, *args) -> float:
    """The peak of traced memory during one call, MiB (a second call: tracing slows it, so it is not timed)."""
    tracemalloc.start()
    try:
        call(*args)
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chain", type=int, default=1000)
    args = ap.parse_args()

    from engine.common.errors import InputError
    from engine.core.engine import Engine
    from engine.runs.imports import import_zip
    from explore_archives import chain, node_id, tree_archive
    from tabs import explore as tab

    tmp = Path(tempfile.mkdtemp(prefix="explore-attacks-"))
    source = Engine("synthetic", data_dir=str(tmp / "source"))
    refused = {}
    for name, parents in (("self", {node_id(0): node_id(0)}),
                          ("pair", {node_id(0): node_id(1), node_id(1): node_id(0)})):
        target = Engine("synthetic", data_dir=str(tmp / name))
        try:
            import_zip(target.store, tree_archive(source, tmp / f"{name}.zip", parents))
            refused[name] = 0
        except InputError:
            refused[name] = int(target.store.count_runs() == 0)
    looped = Engine("synthetic", data_dir=str(tmp / "looped"))
    a, b = node_id(0), node_id(1)
    import_zip(looped.store, tree_archive(source, tmp / "pair-tree.zip", {a: "", b: a}))
    with looped.store._write() as db:   # noqa: SLF001 - a store written before the check
        row = db.execute("SELECT request FROM runs WHERE id=?", (a,)).fetchone()
        db.execute("UPDATE runs SET request=? WHERE id=?", (json.dumps({**json.loads(row[0]), "parent": b}), a))
    _, loop_s = timed(tab.open_link, looped, {"tab": "explore", "tree": a})
    loop_mib = traced(tab.open_link, looped, {"tab": "explore", "tree": a})
    deep = Engine("synthetic", data_dir=str(tmp / "chain"))
    archive = tree_archive(source, tmp / "chain.zip", chain(args.chain))
    _, import_s = timed(import_zip, deep.store, archive)
    link = {"tab": "explore", "tree": a, "run": node_id(args.chain - 1)}
    before = rss_mib()
    view, link_s = timed(tab.open_link, deep, link)
    assert view[4]["node"] == node_id(args.chain - 1)
    link_mib = traced(tab.open_link, deep, link)
    report(loop_self_refused=refused["self"], loop_pair_refused=refused["pair"], stored_loop_link_s=loop_s,
           stored_loop_link_peak_mib=loop_mib, chain_nodes=args.chain, chain_import_s=import_s,
           chain_link_peak_mib=link_mib, rss_growth_mib=rss_mib() - before, chain_link_s=link_s)


if __name__ == "__main__":
    main()
