"""Explore's words and labels (issues 41, 42): a lean is claimed only when its interval excludes the even
share 1/k, everywhere a lean is said (the CLI, the tab's status, the tree, the page, the Runs headline and
the exports, through `engine.methods.explore.lean_claim`); `explore` without --json says it in a sentence;
tree labels say what a node holds and a scored run's name starts with its prompt; inverse queries are
compared side by side; identity clusters give two runs of one prompt and model labels of their own."""
import json

import pytest

from engine.cli import main
from engine.core.engine import Engine
from engine.methods import explore
from engine.methods.explore import ExploreRequest, claim_of, lean_claim, lean_of
from engine.report import explore as report
from engine.report.export import report_html, scores_json
from engine.runs.history import headline, run_prompt
from runhelpers import done_event

MAN, WOMAN = "a photo of a man", "a photo of a woman"


def spec(html: str, chart_id: str) -> dict:
    """The Vega-Lite spec of the chart `chart_id` in a page's HTML."""
    from html import unescape

    return json.loads(unescape(str(html).split(f'data-chart="{chart_id}" data-spec="')[1].split('"')[0]))


def lean(counts: dict) -> dict:
    """A lean with these counts (each share with its Jeffreys interval)."""
    n = sum(counts.values())
    return {c: explore.share_of(k, n) for c, k in counts.items()}


def test_a_lean_is_claimed_only_when_its_interval_excludes_the_even_share():
    tie = lean({"a photo of a young person": 16, "a photo of an old person": 16})
    assert not lean_claim(tie)["clear"]
    assert explore.lean_text(tie) == ("no clear lean: 'a photo of a young person' 0.50 [0.33, 0.67] includes the "
                                      "even share 0.50")
    surgeon = lean({MAN: 18, WOMAN: 14})     # the walk's surgeon: 0.56 [0.39, 0.72]
    assert explore.lean_sentence(surgeon) == ("This set has no clear lean: 'a photo of a man' 0.56 [0.39, 0.72] "
                                              "includes the even share 0.50 (N = 32)")
    doctor = lean({MAN: 26, WOMAN: 6})
    assert explore.lean_sentence(doctor) == "This set leans 'a photo of a man' 0.81 [0.65, 0.92] (N = 32)"
    three = lean({"a": 8, "b": 4, "c": 4})   # k = 3: the even share is 1/3; 0.50 [0.28, 0.72] does not exclude it
    assert lean_claim(three)["even"] == pytest.approx(1 / 3) and not lean_claim(three)["clear"]
    assert lean_claim(lean({"a": 14, "b": 1, "c": 1}))["clear"]
    assert claim_of("a", 0.6, [None, None], 0.5)["clear"] is False   # no interval: nothing is claimed
    assert explore.lean_text({}) == "" and explore.lean_sentence(lean_of([], [MAN, WOMAN])) == ""


def test_the_surgeon_has_no_clear_lean_in_the_cli_the_tree_the_page_runs_and_exports(tmp_path, capsys):
    data = str(tmp_path / "store")
    assert main(["explore", "--preset", "synthetic", "--data-dir", data, "--quiet", "--prompt", "a photo of a surgeon",
                 "-n", "32"]) == 0
    out = capsys.readouterr().out    # no --json: sentences, not a dict
    assert "has no clear lean: 'a photo of a man' 0.56 [0.39, 0.72] includes the even share 0.50 (N = 32)" in out
    assert "{" not in out and " leans " not in out
    engine = Engine("synthetic", data_dir=data)
    run = engine.store.list_runs("explore")[0]
    assert headline(run)[0].startswith("no clear lean: 'a photo of a man' 0.56")
    assert run["summary"]["lean_clear"] is False and run["summary"]["even_share"] == 0.5
    record = engine.store.get_run(run["id"])
    assert "This set has no clear lean" in str(report.page(record["results"]))
    assert "no clear lean: &#39;a photo of a man&#39; 0.56" in str(report.tree_html(explore.tree_nodes(engine, run["id"])))
    exported = scores_json(engine.store, [run["id"]])["runs"][0]
    assert exported["headline"].startswith("no clear lean") and "This set has no clear lean" in str(
        report_html(engine.store, [run["id"]]))
    # a clear lean still says so, with its second axis and inverse queries in sentences too
    assert main(["explore", "--preset", "synthetic", "--data-dir", data, "--quiet", "--prompt", "a photo of a nurse",
                 "-n", "48", "--versus", "a photo of a young person", "a photo of an old person", "--inverse",
                 "an old doctor", "-m", "16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].startswith("The set of 'a photo of a nurse' leans 'a photo of a woman' 0.85")
    assert lines[2].startswith("On the second axis, the set ") and lines[3].startswith("The set of 'an old doctor' ")
    # a run stored before the rule (its summary without lean_clear) is judged by the same rule
    old = {"request": {"concepts": [MAN, WOMAN]}, "summary": {"leans_to": MAN, "lean_share": 0.56, "lean_low": 0.39,
                                                               "lean_high": 0.72}}
    assert explore.headline(old)[0] == "no clear lean: 'a photo of a man' 0.56 [0.39, 0.72] includes the even share 0.50"
    assert explore.headline({**old, "summary": {**old["summary"], "lean_low": 0.51}})[0].startswith("leans")


def test_tree_labels_say_what_a_node_holds_and_a_scored_run_starts_with_its_prompt(tmp_path):
    engine = Engine("synthetic", data_dir=str(tmp_path))
    root = done_event(explore.run(ExploreRequest("a photo of a doctor", n=8), engine)).run_id
    second = done_event(explore.run(ExploreRequest("a photo of a doctor", n=8, parent=root, versus=[
        "a photo of a young person", "a photo of an old person"]), engine)).run_id
    scored = done_event(explore.run(ExploreRequest(run=root, parent=root, inverse=["smiling"], m=4), engine)).run_id
    nodes = {n["id"]: n for n in explore.tree_nodes(engine, root)}
    assert explore.node_holds(nodes[root]) == "man / woman · N = 8, seeds 0–7"
    assert explore.node_holds(nodes[second]) == "man / woman × a young person / an old person · N = 8, seeds 0–7"
    assert explore.node_holds(nodes[scored]) == f"man / woman · inverse: smiling · N = 8, scored from run {root}"
    tree = str(report.tree_html(list(nodes.values()), second))
    assert tree.count('class="gl-node-holds"') == 3 and "man / woman × a young person / an old person" in tree
    row = next(r for r in engine.store.list_runs("explore") if r["id"] == scored)
    assert run_prompt(row) == f"a photo of a doctor (scores of run {root})"
    from tabs import explore as tab   # the node picker: number, prompt and what the node adds, whole
    labels = [tab.node_choice(i, n) for i, n in enumerate(nodes.values())]
    assert labels == ["1. a photo of a doctor", "2. a photo of a doctor · 2 axes", "3. a photo of a doctor · inverse, scored"]


def test_inverse_queries_are_compared_side_by_side_with_the_node_as_reference(tmp_path):
    engine = Engine("synthetic", data_dir=str(tmp_path))
    done = done_event(explore.run(ExploreRequest("a photo of a doctor", n=8, inverse=["an old doctor", "a young doctor"],
                                                 m=8), engine))
    page = str(report.page(done.results))
    compared = spec(page, "explore-inverse-compared")
    rows = compared["layer"][1]["data"]["values"]
    assert {r["set"] for r in rows} == {"this node: 'a photo of a doctor'", "inverse: 'an old doctor'",
                                        "inverse: 'a young doctor'"}
    old = next(r for r in rows if r["set"] == "inverse: 'an old doctor'" and r["concept"] == MAN)
    assert old["share"] == done.results["inverse"]["an old doctor"][MAN]["share"] and old["lo"] is not None
    assert compared["layer"][0]["data"]["values"] == [{"even": 0.5}]      # the even share, dashed
    assert page.count('id="explore-inverse-table"') == 1


def test_clusters_label_two_runs_of_one_prompt_and_model_apart(tmp_path):
    """Issue 41: two runs of the same prompt and model were merged under one label (one's shares overwrote the
    other's). Labels are the prompt, then the model, then the seed range or the run id."""
    engine = Engine("synthetic", data_dir=str(tmp_path))
    first = done_event(explore.run(ExploreRequest("a photo of a doctor", n=8), engine)).run_id
    second = done_event(explore.run(ExploreRequest("a photo of a doctor", n=8, seed=100), engine)).run_id
    again = done_event(explore.run(ExploreRequest(run=first), engine)).run_id    # the same images as `first`
    nurse = done_event(explore.run(ExploreRequest("a photo of a nurse", n=8), engine)).run_id
    clusters = explore.identity_clusters(engine, [first, second, again, nurse], k=2)
    labels = [g["label"] for g in clusters["groups"]]
    assert len(set(labels)) == 4 and labels[3] == "a photo of a nurse"
    assert labels[1] == "a photo of a doctor · synthetic_generator:synthetic_world.json · seeds 100–107"
    assert labels[0].endswith(f"seeds 0–7 · {first}") and labels[2].endswith(f"seeds 0–7 · {again}")
    for c in clusters["clusters"]:
        assert list(c["shares"]) == labels        # every group keeps its own shares
    assert sum(c["shares"][labels[1]]["count"] for c in clusters["clusters"]) == 8
    heat = spec(report.clusters_html(clusters), "explore-clusters")   # groups in the order picked, not sorted
    assert heat["title"] == "the share of each group's images in each cluster (a row sums to 1)"
    assert heat["encoding"]["y"]["sort"] == labels
