"""Explore (issue 33) on the synthetic world: its planted truths through the CLI (doctor 80% male and
firefighter 90% lean to 'a man', nurse 90% female to 'a woman'; 'an old doctor' leans male more
than 'a young doctor', the world's rule), `--run` generating nothing, the hypothesis tree built,
exported, imported and reopened, a visitor's tree hidden from another visitor, and label-free
clusters that separate the planted attributes."""
import json
import zipfile

import numpy as np
import pytest

from engine.backends.synthetic.scene import read_scene
from engine.cli import main
from engine.common import access
from engine.common.errors import InputError
from engine.core.engine import Engine
from engine.methods import explore
from engine.methods.explore import ExploreRequest, concept_scores, lean_of
from engine.report import explore as report
from engine.report.export import export_zip
from engine.runs.history import run_prompt
from engine.runs.imports import import_zip
from runhelpers import done_event

MAN, WOMAN = "a photo of a man", "a photo of a woman"


def cli_json(engine, capsys, *argv) -> dict:
    assert main(["explore", "--preset", "synthetic", "--data-dir", str(engine.store.data_dir), "--json", "--quiet",
                 *argv]) == 0
    return json.loads(capsys.readouterr().out)


def planted(engine, prompt: str) -> float:
    """The world's exact share of male images for `prompt`."""
    return engine.models.get(engine.preset.generator).world.expected_distribution(prompt, "gender")["male"]


def test_scores_are_a_softmax_at_clips_logit_scale_and_the_lean_is_the_nearest_share():
    # two images, two concepts; cosines 0.30/0.28 and 0.20/0.25: softmax of 100·cos
    cosines = np.array([[0.30, 0.28], [0.20, 0.25]])   # rows: images, columns: concepts
    scores = concept_scores(np.eye(2), cosines.T)     # unit image vectors: image · text = the cosines
    assert scores[0, 0] == pytest.approx(1 / (1 + np.exp(-2.0)))      # e^30 / (e^30 + e^28)
    assert scores[1, 1] == pytest.approx(1 / (1 + np.exp(-5.0)))      # e^25 / (e^20 + e^25)
    lean = lean_of(np.array([[0.9, 0.1]] * 7 + [[0.2, 0.8]]), ["a", "b"])
    assert lean["a"]["share"] == 0.875 and lean["a"]["count"] == 7 and set(lean) == {"a", "b"}
    assert lean["a"]["ci"] == pytest.approx([0.55, 0.99], abs=0.01)   # Jeffreys, 7 of 8 (intervals.py)


def test_the_planted_truths_through_the_cli(engine, capsys):
    leans = {}
    ages = ["a photo of a young person", "a photo of a middle-aged person", "a photo of an old person"]
    for job in ("doctor", "firefighter", "nurse"):
        printed = cli_json(engine, capsys, "--prompt", f"a photo of a {job}", "--concepts", MAN, WOMAN, "-n", "48",
                           *(["--versus", *ages] if job == "doctor" else []))
        if job == "doctor":   # a second axis: doctor's planted ages .2 / .4 / .4, and the 2-D scatter's scores
            for concept, p in zip(ages, (0.2, 0.4, 0.4)):
                assert printed["versus_lean"][concept]["ci"][0] <= p <= printed["versus_lean"][concept]["ci"][1]
            assert set(printed["images"][0]["versus_scores"]) == set(ages)
        assert len(printed["images"]) == 48
        assert set(printed["images"][0]) >= {"key", "seed", "scores"} and set(printed["lean"]) == {MAN, WOMAN}
        assert sum(printed["images"][0]["scores"].values()) == pytest.approx(1, abs=1e-5)
        leans[job] = printed["lean"]
        male = planted(engine, f"a photo of a {job}")
        lo, hi = printed["lean"][MAN]["ci"]
        assert lo <= male <= hi, (job, male, printed["lean"][MAN])    # the planted share is in its interval
    assert leans["doctor"][MAN]["ci"][0] > 0.5 and leans["firefighter"][MAN]["ci"][0] > 0.5
    assert leans["nurse"][WOMAN]["ci"][0] > 0.5
    assert leans["firefighter"][MAN]["share"] > leans["doctor"][MAN]["share"]   # 90% vs 80%
    # inverse queries: images of 'an old doctor' lean male more than those of 'a young doctor' (90% vs 60%)
    printed = cli_json(engine, capsys, "--prompt", "a photo of a doctor", "-n", "4", "--inverse", "an old doctor",
                       "a young doctor", "-m", "48")
    old, young = printed["inverse"]["an old doctor"][MAN], printed["inverse"]["a young doctor"][MAN]
    assert set(old) >= {"share", "ci"} and old["share"] > young["share"] and old["ci"][0] > young["share"]
    assert old["ci"][0] <= planted(engine, "a photo of an old doctor") <= old["ci"][1]
    assert young["ci"][0] <= planted(engine, "a photo of a young doctor") <= young["ci"][1]


def test_run_scores_a_stored_run_from_cached_embeddings_and_generates_nothing(engine, capsys):
    first = cli_json(engine, capsys, "--prompt", "a photo of a nurse", "-n", "12")
    images, embeddings = engine.store.count("images"), engine.store.count("embeddings")
    again = cli_json(engine, capsys, "--run", first["run_id"], "--concepts", MAN, WOMAN)
    assert engine.store.count("images") == images and engine.store.count("embeddings") == embeddings
    assert again["run_id"] != first["run_id"] and again["source_run"] == first["run_id"]
    assert [i["key"] for i in again["images"]] == [i["key"] for i in first["images"]]
    assert again["lean"] == first["lean"]
    assert engine.store.get_run(again["run_id"])["method"] == "explore"
    assert main(["explore", "--preset", "synthetic", "--data-dir", str(engine.store.data_dir), "--quiet",
                 "--run", "no-such-run"]) == 2
    assert "no run 'no-such-run'" in capsys.readouterr().err


def test_a_node_measures_its_attribute_distribution_with_vqa_from_cached_answers(engine, capsys):
    printed = cli_json(engine, capsys, "--prompt", "a photo of a doctor", "-n", "48", "--axes", "gender")
    gender = printed["axes"]["gender"]          # the key and shape of Single Prompt's JSON
    assert gender["n"] == 48 and sum(gender["counts"].values()) == 48
    lo, hi = gender["share_ci"]["male"]
    assert lo <= planted(engine, "a photo of a doctor") <= hi and lo > 0.5    # planted 80% male
    assert "composite_bias_score" in gender["ci"]
    summary = engine.store.get_run(printed["run_id"])["summary"]
    assert summary["axes"]["gender"] == {"top": "male", "share": gender["representation_parity"]["male"], "ci": [lo, hi]}
    assert summary["leans_to"] == MAN and summary["lean_share"] == printed["lean"][MAN]["share"]
    answers = engine.store.count("answers")
    assert answers >= 48
    # the same images scored again with VQA: every answer comes from the cache
    again = cli_json(engine, capsys, "--run", printed["run_id"], "--axes", "gender", "--parent", printed["run_id"])
    assert engine.store.count("answers") == answers and again["axes"]["gender"]["counts"] == gender["counts"]
    # the tree lists the distribution beside the lean; the node's page draws Single Prompt's chart
    nodes = explore.tree_nodes(engine, printed["run_id"])
    assert nodes[1]["axes"]["gender"]["male"] == {"share": gender["representation_parity"]["male"],
                                                   "ci": [lo, hi], "count": gender["counts"]["male"]}
    tree = str(report.tree_html(nodes))
    assert f"gender: &#39;male&#39; {gender['representation_parity']['male']:.2f} [{lo:.2f}, {hi:.2f}]" in tree
    page = str(report.page(again))
    assert 'id="explore-axes"' in page and "axis-gender" in page
    assert "explore-axes" not in str(report.page(cli_json(engine, capsys, "--run", printed["run_id"])))  # off: no VQA
    # a scored run's prompt in the Runs table (list_runs carries no results): the prompt first, so a cut
    # label still names it (issue 42)
    row = next(r for r in engine.store.list_runs("explore") if r["id"] == again["run_id"])
    assert run_prompt(row) == f"a photo of a doctor (scores of run {printed['run_id']})"


def grow_tree(engine) -> list[str]:
    """Root 'a photo of a doctor', its child 'an old doctor' (with an inverse query), and that child's
    child scoring the root's stored images against three concepts."""
    root = done_event(explore.run(ExploreRequest("a photo of a doctor", n=8), engine)).run_id
    child = done_event(explore.run(ExploreRequest("a photo of an old doctor", n=8, parent=root,
                                                  inverse=["smiling"], m=4), engine)).run_id
    grandchild = done_event(explore.run(ExploreRequest(run=root, parent=child, concepts=[
        MAN, WOMAN, "a photo of a <b>child</b>"]), engine)).run_id
    return [root, child, grandchild]


def test_a_three_node_tree_is_stored_exported_imported_and_reopened(engine, tmp_path):
    ids = grow_tree(engine)
    nodes = explore.tree_nodes(engine, ids[0])
    assert [n["id"] for n in nodes] == ids and [n["parent"] for n in nodes] == ["", ids[0], ids[1]]
    assert {engine.store.get_run(i)["results"]["tree"] for i in ids} == {ids[0]}
    assert [t["id"] for t in explore.list_trees(engine)] == [ids[0]] and explore.list_trees(engine)[0]["nodes"] == 3
    # JSON and the offline HTML page
    tree = json.loads(json.dumps(explore.tree_json(engine, ids[0])))
    assert tree["tree"] == ids[0] and len(tree["nodes"]) == 3 and len(tree["nodes"][0]["images"]) == 8
    assert sum(v["count"] for v in tree["nodes"][1]["inverse"]["smiling"].values()) == 4
    html = str(report.tree_document(engine, ids[0]))
    assert html.count('class="gl-run gl-node"') == 3 and "a photo of an old doctor" in html
    assert "<b>child</b>" not in html and "&lt;b&gt;child&lt;/b&gt;" in html
    assert html.count("data:image/jpeg;base64,") >= 8 and 'src="http' not in html   # nothing to fetch
    # the zip of its runs, imported into another store: the same tree
    path = tmp_path / "tree.zip"
    export_zip(engine.store, ids, path)
    other = Engine("synthetic", data_dir=str(tmp_path / "other"))
    assert import_zip(other.store, path)["imported"] == ids
    assert explore.tree_nodes(other, ids[0]) == nodes
    # and into a public store as a visitor: fresh ids, the parents follow them
    public = Engine("synthetic", data_dir=str(tmp_path / "public"), public=True)
    with access.acting_as(access.Visitor("session:importer")):
        report_ = import_zip(public.store, path)
        renamed = report_["renamed"]
        assert set(renamed) == set(ids)
        reopened = explore.tree_nodes(public, renamed[ids[0]])
        assert [n["id"] for n in reopened] == [renamed[i] for i in ids]
        assert [n["parent"] for n in reopened] == ["", renamed[ids[0]], renamed[ids[1]]]
        assert public.store.get_run(renamed[ids[2]])["results"]["tree"] == renamed[ids[0]]
        from tabs import explore as tab   # the imported tree reopens through its link
        view = tab.open_link(public, {"tab": "explore", "tree": renamed[ids[0]]})
        assert view[2].count("data-node=") == 3 and view[4]["node"] == view[4]["tree"] == renamed[ids[0]]
    with zipfile.ZipFile(path) as zf:
        assert sum(1 for line in zf.read("gaplens/runs.jsonl").splitlines() if line.strip()) == 3


def test_a_visitors_tree_reads_as_missing_to_another_visitor(tmp_path):
    from tabs import explore as tab

    engine = Engine("synthetic", data_dir=str(tmp_path / "public"), public=True)
    alice, bob = access.Visitor("session:alice"), access.Visitor("session:bob")
    with access.acting_as(alice):
        ids = grow_tree(engine)
        assert len(tab.open_link(engine, {"tab": "explore", "tree": ids[0], "run": ids[1]})[2]) > 0
    with access.acting_as(bob):
        with pytest.raises(InputError, match=f"no tree '{ids[0]}' in the store$"):
            explore.tree_nodes(engine, ids[0])
        with pytest.raises(InputError, match="no tree node"):   # nor grow it
            done_event(explore.run(ExploreRequest("a photo of a doctor", n=2, parent=ids[0]), engine))
        theirs = tab.open_link(engine, {"tab": "explore", "tree": ids[0], "run": ids[1]})[6]
        missing = tab.open_link(engine, {"tab": "explore", "tree": "20990101-000000-abcdef", "run": ids[1]})[6]
        assert theirs.replace(ids[0], "X") == missing.replace("20990101-000000-abcdef", "X")
        assert explore.list_trees(engine) == []
    with access.acting_as(access.HOST):   # the host publishes the tree: now every visitor may open it
        engine.store.set_published(ids)
    with access.acting_as(bob):
        assert [n["id"] for n in explore.tree_nodes(engine, ids[0])] == ids


def test_identity_clusters_separate_the_planted_attributes(engine):
    runs = {job: done_event(explore.run(ExploreRequest(f"a photo of a {job}", n=24), engine)).run_id
            for job in ("doctor", "nurse", "firefighter", "teacher")}
    clusters = explore.identity_clusters(engine, list(runs.values()), k=2)
    world = engine.models.get(engine.preset.generator).world
    # with no label, each cluster is one gender (the embedding's heaviest person attribute)
    assert sum(c["size"] for c in clusters["clusters"]) == 96
    assert all(len(c["central"]) == 4 for c in clusters["clusters"])
    by_key = {}
    for r in runs.values():
        records = engine.store.get_images([i["key"] for i in engine.store.get_run(r)["results"]["images"]])
        by_key.update({k: read_scene(world, rec.image)["gender"] for k, rec in records.items()})
    genders = [{by_key[i["key"]] for i in c["central"]} for c in clusters["clusters"]]
    assert sorted(map(sorted, genders)) == [["female"], ["male"]]
    male = next(c for c, g in zip(clusters["clusters"], genders) if g == {"male"})
    share = {label.split("a photo of a ")[-1]: v for label, v in male["shares"].items()}
    for job, p in (("doctor", 0.8), ("nurse", 0.1), ("firefighter", 0.9), ("teacher", 0.5)):
        assert share[job]["ci"][0] <= p <= share[job]["ci"][1], (job, share[job])
    assert share["firefighter"]["share"] > share["teacher"]["share"] > share["nurse"]["share"]
    with pytest.raises(InputError, match="k must be between 2"):
        explore.identity_clusters(engine, list(runs.values()), k=1)
