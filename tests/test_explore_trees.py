"""Trees whatever the store holds (issue 43): an archive whose parent links loop is refused in one sentence
and nothing is imported; a loop already in a store (imported before that check) and a 1,000-node chain
open through their link (`?tab=explore&tree=<id>`) in bounded memory, each node once, the levels below
SHOWN_DEPTH folded with a sentence saying so (the recursive template raised RecursionError)."""
import json
import threading
import tracemalloc

import pytest

from engine.common.errors import InputError
from engine.core.engine import Engine
from engine.methods import explore
from engine.report import explore as report
from engine.runs.imports import import_zip
from explore_archives import chain, node_id, tree_archive

A, B, C = node_id(0), node_id(1), node_id(2)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """The engine whose one Explore run the archives copy."""
    return Engine("synthetic", data_dir=str(tmp_path_factory.mktemp("source")))


def bounded(call, *args, memory_mib: float = 200):
    """`call(*args)` in a thread that must end (a loop never would: the wait is a guard, not a timing) with a
    peak of traced memory below `memory_mib`; returns (its result, the peak in MiB)."""
    out = {}

    def run():
        try:
            out["value"] = call(*args)
        except BaseException as exc:   # noqa: BLE001 - handed back to the test
            out["error"] = exc

    tracemalloc.start()
    try:
        worker = threading.Thread(target=run, daemon=True)
        worker.start()
        worker.join(timeout=300)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()
    assert not worker.is_alive(), "the walk did not end"
    if "error" in out:
        raise out["error"]
    assert peak < memory_mib, peak
    return out["value"], peak


@pytest.mark.parametrize("parents", [{A: A}, {A: B, B: A}, {A: "", B: C, C: B}], ids=["self", "two", "beside-a-root"])
def test_an_archive_whose_parent_links_loop_is_refused_and_nothing_is_imported(source, tmp_path, parents):
    engine = Engine("synthetic", data_dir=str(tmp_path / "store"))
    path = tree_archive(source, tmp_path / "loop.zip", parents)
    with pytest.raises(InputError) as caught:
        import_zip(engine.store, path)
    message = str(caught.value)
    assert message.startswith("loop.zip: the parent links of its runs form a loop (") and message.count(".") <= 1
    assert message.endswith("so they are not a tree; nothing was imported")
    assert engine.store.count_runs() == 0 and engine.store.count("images") == 0


def test_a_loop_through_the_store_is_refused_and_a_chain_into_it_is_not(source, tmp_path):
    engine = Engine("synthetic", data_dir=str(tmp_path / "store"))
    import_zip(engine.store, tree_archive(source, tmp_path / "tree.zip", {A: "", B: A}))
    # the same ids again, A now a child of B: with --replace the store's B (child of A) would close a loop
    with pytest.raises(InputError, match="form a loop"):
        import_zip(engine.store, tree_archive(source, tmp_path / "again.zip", {A: B}), replace=True)
    # a new child of B in the store is a tree
    assert import_zip(engine.store, tree_archive(source, tmp_path / "child.zip", {C: B}))["imported"] == [C]
    assert [n["id"] for n in explore.tree_nodes(engine, A)] == [A, B, C]


def store_loop(engine, source, tmp_path) -> None:
    """A and B in the store with A → B → A, as an import before the check could leave them."""
    import_zip(engine.store, tree_archive(source, tmp_path / "pair.zip", {A: "", B: A}))
    with engine.store._write() as db:   # noqa: SLF001 - a store written by an older GapLens
        row = db.execute("SELECT request FROM runs WHERE id=?", (A,)).fetchone()
        db.execute("UPDATE runs SET request=? WHERE id=?", (json.dumps({**json.loads(row[0]), "parent": B}), A))


def test_a_loop_already_in_the_store_opens_through_its_link_each_node_once(source, tmp_path):
    from tabs import explore as tab

    engine = Engine("synthetic", data_dir=str(tmp_path / "store"))
    store_loop(engine, source, tmp_path)
    for tree, run in ((A, B), (B, A), (A, A)):
        view, _ = bounded(tab.open_link, engine, {"tab": "explore", "tree": tree, "run": run})
        assert view[4] == {"tree": tree, "node": run, "keys": view[4]["keys"]}
        assert sorted(view[2].count(f'data-node="{i}"') for i in (A, B)) == [1, 1]
    nodes, _ = bounded(explore.tree_nodes, engine, A)
    assert [n["id"] for n in nodes] == [A, B] and [n["depth"] for n in nodes] == [0, 1]
    assert nodes[0]["cut"].startswith(f"the parent links loop (node {A} is also below itself")
    assert nodes[0]["cut"] in str(report.tree_html(nodes))
    assert len(explore.tree_json(engine, A)["nodes"]) == 2


def test_a_thousand_node_chain_imports_and_its_link_opens_with_the_deep_levels_folded(source, tmp_path):
    from tabs import explore as tab

    engine = Engine("synthetic", data_dir=str(tmp_path / "store"))
    parents = chain(1000)
    assert len(import_zip(engine.store, tree_archive(source, tmp_path / "chain.zip", parents))["imported"]) == 1000
    leaf = node_id(999)
    view, peak = bounded(tab.open_link, engine, {"tab": "explore", "tree": A, "run": leaf})
    tree = str(view[2])
    assert tree.count("data-node=") == report.SHOWN_DEPTH and tree.count("<ul") == report.SHOWN_DEPTH
    assert (f"{1000 - report.SHOWN_DEPTH} node(s) more than {report.SHOWN_DEPTH} levels deep are folded here; pick "
            "them in the node picker (the selected node is one of them).") in tree
    assert len(view[1].choices) == 1000 and view[4]["node"] == leaf and "Explore:" in str(view[3])
    # the walk itself is bounded too: a longer chain stops at MAX_TREE_NODES, and says so
    nodes = explore.tree_nodes(engine, A)
    assert len(nodes) == 1000 and nodes[-1]["depth"] == 999 and "cut" not in nodes[0]
    more = Engine("synthetic", data_dir=str(tmp_path / "more"))
    import_zip(more.store, tree_archive(source, tmp_path / "longer.zip", chain(explore.MAX_TREE_NODES + 5)))
    nodes, _ = bounded(explore.tree_nodes, more, A)
    assert len(nodes) == explore.MAX_TREE_NODES
    assert nodes[0]["cut"] == f"this tree has more than {explore.MAX_TREE_NODES} nodes; the first " \
                              f"{explore.MAX_TREE_NODES} are shown"
    assert nodes[0]["cut"] in str(report.tree_html(nodes))
