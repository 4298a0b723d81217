"""Export archives of Explore trees whose parent links are whatever a test (or a bench) says: a loop, a
chain of a thousand nodes (issue 43). One real Explore run is exported; its row is copied once per node."""
from __future__ import annotations

import json
import zipfile
from pathlib import Path

from engine.methods import explore
from engine.methods.explore import ExploreRequest
from engine.report.export import export_zip
from runhelpers import done_event


def node_id(i: int) -> str:
    """The archive id of node i (a valid run id)."""
    return f"20990101-{i:06d}-tree{i % 10}"


def tree_archive(engine, path: Path, parents: dict[str, str]) -> Path:
    """An export zip at `path` of one Explore node per key of `parents` (node id -> its parent's id, '' for a
    root), each holding the same image, its request's and results' "parent" set as given and its "tree" the
    first node."""
    base = done_event(explore.run(ExploreRequest("a photo of a doctor", n=1), engine)).run_id
    source = path.with_suffix(".source.zip")
    export_zip(engine.store, [base], source)
    with zipfile.ZipFile(source) as zf:
        members = {name: zf.read(name) for name in zf.namelist()}
    run = json.loads(members["gaplens/runs.jsonl"].decode().splitlines()[0])
    link = json.loads(members["gaplens/run_images.jsonl"].decode().splitlines()[0])
    first = next(iter(parents))
    runs, links = [], []
    for i, (node, parent) in enumerate(parents.items()):
        request, results = json.loads(run["request"]), json.loads(run["results"])
        request["parent"], results["parent"], results["tree"] = parent, parent, first
        runs.append(json.dumps({**run, "id": node, "request": json.dumps(request), "results": json.dumps(results),
                                "created": run["created"] + i}))
        links.append(json.dumps({**link, "run_id": node}))
    members["gaplens/runs.jsonl"] = ("\n".join(runs) + "\n").encode()
    members["gaplens/run_images.jsonl"] = ("\n".join(links) + "\n").encode()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return path


def chain(n: int) -> dict[str, str]:
    """A chain of n nodes: node 0 the root, node i the child of node i - 1."""
    return {node_id(i): node_id(i - 1) if i else "" for i in range(n)}
