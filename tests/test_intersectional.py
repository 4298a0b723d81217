"""Intersectional Matrix (BiasConnect): IS by hand from answers, the graph and matrix views,
a planted interaction recovered with its sign and χ² edge, and images reused from the store."""
import json
import math
import re

import numpy as np
import pytest

from engine.common.errors import InputError
from engine.common.events import Graph
from engine.metrics import biasconnect as bc
from engine.methods import cfsets, counterfactuals, intersectional as ic
from engine.methods.cfsets import SetSpec
from engine.models.presets import SYNTHETIC_TABLE
from engine.report import charts
from engine.report import intersectional as biasgraph

from runhelpers import done_event

# -- IS from answers, by hand -----------------------------------------------------------------------


def _answers(counts: dict[str, list[int]], values: dict[str, list[str]], policy="drop"):
    """One-hot answers per axis from counts per value (the last extra count, if any, is 'other')."""
    out = {}
    for axis, per_value in counts.items():
        labels = [v for v, c in zip(values[axis] + ["other"], per_value) for _ in range(c)]
        out[axis] = ic.one_hot(labels, values[axis], policy)
    return out


def _specs(axes):
    specs = [SetSpec("initial", "p", 0)]
    return specs + [SetSpec(f"axis={x}|cf={cf}", cf, 0, x, cf) for x, cfs in axes.items() for cf in cfs]


def test_spec_worked_example_gender_to_age_is_minus_0_075():
    # docs/spec/thesis-tibet-biasconnect-intermit.md §3.4: age init [.70 .25 .05]; male CF [.60 .30 .10]; female
    # CF [.90 .10 0] (20 images per set)
    axes = {"gender": ["a male p", "a female p"], "age": ["a young p", "a middle-aged p", "an old p"]}
    values = {"gender": ["male", "female"], "age": ["young", "middle-aged", "old"]}
    age = {"initial": [14, 5, 1], "axis=gender|cf=a male p": [12, 6, 2], "axis=gender|cf=a female p": [18, 2, 0]}
    answers = {s.label: _answers({"gender": [10, 10], "age": age.get(s.label, [7, 7, 6])}, values) for s in _specs(axes)}
    init, tables = ic.tally(_specs(axes), axes, answers)
    matrix = ic.sensitivity(init, tables, {})
    assert matrix.w_bar_init[1] == pytest.approx(0.55)
    assert matrix.entry("gender", "age") == pytest.approx(-0.075)
    assert matrix.entry("gender", "gender") == pytest.approx(0.0)       # already balanced: nothing to fix
    assert tables["gender"]["age"][0].tolist() == [[12, 6, 2], [18, 2, 0]]


def test_other_answer_policies_by_hand():
    values = {"gender": ["male", "female"]}
    axes = {"gender": ["a male p", "a female p"]}
    counts = {"initial": [6, 2, 2], "axis=gender|cf=a male p": [10, 0, 0], "axis=gender|cf=a female p": [0, 10, 0]}
    results = {}
    for policy in bc.OTHER_POLICIES:
        answers = {s.label: _answers({"gender": counts[s.label]}, values, policy) for s in _specs(axes)}
        init, tables = ic.tally(_specs(axes), axes, answers)
        ideal = {"gender": bc.ideal_distribution(values["gender"], None, policy)}
        results[policy] = ic.sensitivity(init, tables, ideal).w_bar_init[0]
    assert results["drop"] == pytest.approx(0.5)        # [.75 .25]: TV .25 / (1 - 1/2)
    assert results["other_bin"] == pytest.approx(0.3)   # [.6 .2 .2] vs [.5 .5 0]: TV .3 / (1 - 0)


def test_choices_and_reference_csv(tmp_path):
    preset = cfsets.load_preset("occupations")
    assert ic.choices(preset["prompt"], preset["axes"]["emotion"]) == ["happy", "sad", "serious", "tired"]
    path = tmp_path / "real.csv"
    path.write_text("axis,value,share\ngender,male,77\ngender,female,23\nage,young,0.5\n")
    assert ic.load_reference_csv(path) == {"gender": {"male": 77.0, "female": 23.0}, "age": {"young": 0.5}}
    path.write_text("axis;value;share\n")
    with pytest.raises(InputError, match="columns"):
        ic.load_reference_csv(path)


# -- views ------------------------------------------------------------------------------------------------

RESULTS = {
    "prompt": "a photo of a pilot", "level": "prompt", "p_threshold": 1e-4, "min_abs_is": 0.0, "importance": "count",
    "other_policy": "drop", "ideals": {"gender": {"male": 0.5, "female": 0.5}}, "distortion": 0.4,
    "values": {"gender": ["male", "female"], "age": ["young", "old"]},
    "questions": {"gender": "What is the gender?", "age": "How old?"},
    "sensitivity": {"axes": ["gender", "age"], "matrix": [[0.2, 0.01], [-0.4, 0.3]], "w_bar_init": [0.17, 0.6],
                    "w_bar_mixed": [[0.0, 0.59], [0.57, 0.3]], "ci_low": [[0.1, -0.05], [-0.6, 0.2]],
                    "ci_high": [[0.3, 0.08], [-0.2, 0.4]]},
    "edges": [{"source": "age", "target": "gender", "is": -0.4, "p_value": 1e-9, "kept": True},
              {"source": "gender", "target": "age", "is": 0.01, "p_value": 0.5, "kept": False}],
    "max_impact": "age", "max_influenced": "gender",
    "distributions": {"gender": {"values": ["male", "female"], "ideal": [0.5, 0.5], "initial": [0.585, 0.415],
                                 "mixed": {"age": [0.78, 0.22], "gender": [0.5, 0.5]}}},
}
RESULTS["kept_edges"] = [e for e in RESULTS["edges"] if e["kept"]]


def test_matrix_cells_explain_themselves_and_fade_when_the_ci_spans_zero():
    page = biasgraph.matrix_html(RESULTS)
    assert "moves gender 0.40 further from its target" in page
    faded = [(c["row"], c["col"]) for c in charts.spec_in(page)["data"]["values"] if c.get("faded")]
    assert faded == [("gender", "age")]                    # only gender -> age spans 0
    assert biasgraph.cell_text("gender", "gender", 0.2, 0.2, 0.0).startswith("Making gender diverse")
    unanswered = json.loads(json.dumps(RESULTS))       # an axis whose answers all fell outside its choices
    unanswered["sensitivity"]["matrix"][0][1] = unanswered["sensitivity"]["ci_low"][0][1] = None
    assert "no answers among its choices" in biasgraph.matrix_html(unanswered)


def test_graph_is_self_contained_and_marks_maximp_and_maxinf():
    document = biasgraph.graph_from_results(RESULTS)
    assert not re.findall(r"<(?:script|link)[^>]*(?:src|href)=", document)  # vis-network inlined, no CDN
    assert "vis.Network" in document and "MaxImp" in document and "MaxInf" in document
    assert biasgraph.NEGATIVE in document and "+0.01" not in document   # pruned edges are not drawn
    frame = biasgraph.iframe(document)
    assert frame.startswith("<iframe") and frame.count('"') == 10 and "&lt;script" in frame
    assert "Making age diverse" in biasgraph.pair_html(RESULTS, "age", "gender")


# -- the method on the synthetic world ---------------------------------------------------------------

@pytest.fixture
def pilot_engine(tmp_path):
    """The shipped world plus a pilot planted with an age -> gender interaction: young pilots are
    half women, old ones 95% men, and 80% of pilots are young, so the prompt alone is 58.5% male
    but making age diverse pushes gender to 78% male."""
    from engine.core.engine import Engine

    table = json.loads(open(SYNTHETIC_TABLE).read())
    table["subjects"]["pilot"] = {"kind": "person", "phrases": ["pilot"], "badge": "PIL",
                                  "dist": {"gender": {"male": 0.9, "female": 0.1},
                                           "age": {"young": 0.8, "middle-aged": 0.1, "old": 0.1}}}
    table["rules"] += [{"subject": "pilot", "if": {"age": "young"}, "then": {"gender": {"male": 0.5, "female": 0.5}}},
                       {"subject": "pilot", "if": {"age": "old"}, "then": {"gender": {"male": 0.95, "female": 0.05}}}]
    path = tmp_path / "world.json"
    path.write_text(json.dumps(table))
    roles = {role: f"synthetic_{role}:{path}" for role in ("generator", "embedder", "llm", "vqa")}
    return Engine("synthetic", data_dir=str(tmp_path / "store"), max_images=256, **roles)


@pytest.mark.slow
def test_planted_interaction_has_its_sign_and_edge_and_independent_pairs_are_pruned(pilot_engine):
    world = pilot_engine.models.get(pilot_engine.preset.generator).world
    gender = lambda prompt: world.expected_distribution(prompt, "gender")["male"]  # noqa: E731
    assert gender("a photo of a pilot") == pytest.approx(0.585)
    mixed = np.mean([gender(f"a photo of {a} pilot") for a in ("a young", "a middle-aged", "an old")])
    assert mixed == pytest.approx((0.5 + 0.9 + 0.95) / 3)
    expected = bc.w_bar([0.585, 0.415]) - bc.w_bar([mixed, 1 - mixed])          # -0.397: mixing age hurts gender
    assert world.expected_distribution("a photo of a male pilot", "age") == world.expected_distribution(
        "a photo of a pilot", "age")                                            # gender does not move age

    axes = {"gender": ["a photo of a male pilot", "a photo of a female pilot"],
            "age": ["a photo of a young pilot", "a photo of a middle-aged pilot", "a photo of an old pilot"],
            "emotion": ["a photo of a pilot who is happy", "a photo of a pilot who is serious",
                        "a photo of a pilot who is sad"]}
    events = list(ic.run(ic.IntersectionalRequest("a photo of a pilot", axes=axes, n=96, n_boot=200), pilot_engine))
    r = done_event(events).results
    s = r["sensitivity"]
    i, j = s["axes"].index("age"), s["axes"].index("gender")
    assert expected == pytest.approx(-0.397, abs=1e-3)
    assert s["matrix"][i][j] < 0 and abs(s["matrix"][i][j] - expected) < 0.25
    assert s["ci_high"][i][j] < 0                                               # not faded
    kept = {(e["source"], e["target"]) for e in r["kept_edges"]}
    assert ("age", "gender") in kept
    assert ("gender", "age") not in kept
    assert not {pair for pair in kept if "emotion" in pair}                     # emotion is independent
    assert r["max_impact"] == "age" and r["max_influenced"] == "gender"
    assert r["p_values"]["age"]["gender"] < 1e-4 < r["p_values"]["emotion"]["gender"]
    assert r["questions"]["gender"] == "What is the gender (male, female) of the person in the image?"
    graph = next(e for e in events if isinstance(e, Graph))
    assert graph.edges == r["kept_edges"] and not hasattr(graph, "html")  # events carry data; the page draws it


@pytest.mark.slow
def test_a_run_after_counterfactuals_generates_nothing_new(engine):
    axes = {a: cfs for a, cfs in cfsets.propose_axes(engine, "a photo of a doctor")[0].items()
            if a in ("gender", "age", "clothing", "emotion")}
    assert len(axes) == 4
    list(counterfactuals.run(counterfactuals.CounterfactualsRequest("a photo of a doctor", axes=axes, n=8,
                                                                    n_boot=0), engine))
    calls, generated = engine.stats.generator_calls, engine.stats.images_generated
    done = done_event(ic.run(ic.IntersectionalRequest("a photo of a doctor", axes=axes, n=8, n_boot=100,
                                               other_policy="other_bin", level="aggregated"), engine))
    assert engine.stats.generator_calls == calls and engine.stats.images_generated == generated
    r = done.results
    assert r["level"] == "aggregated" and r["min_abs_is"] == 0.03 and r["other_policy"] == "other_bin"
    assert r["distributions"]["gender"]["values"] == ["male", "female", "other"]
    assert len(r["sensitivity"]["matrix"]) == 4 and all(len(row) == 4 for row in r["sensitivity"]["matrix"])
    run = engine.store.get_run(done.run_id)
    assert len(run["images"]) == (1 + 2 + 3 + 2 + 3) * 8


@pytest.mark.slow
def test_cli_prints_the_matrix_p_values_and_kept_edges(tmp_path):
    from test_cli import cli

    out = cli("intersectional", "--preset", "synthetic", "--prompt", "a photo of a doctor", "-n", "8", "--n-boot",
              "100", "--json", data_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert {"run_id", "sensitivity", "p_values", "kept_edges", "max_impact", "max_influenced"} <= set(result)
    axes = result["sensitivity"]["axes"]
    assert len(result["sensitivity"]["matrix"]) == len(axes) >= 3
    assert set(result["p_values"][axes[0]]) == set(axes) - {axes[0]}


def test_when_no_edge_passes_the_page_says_what_was_tested_and_the_n_that_would_pass_the_strongest_cell():
    table = np.array([[10, 6], [6, 10]])                 # two counterfactual sets of 16, a mild dependence
    p, statistic, dof = bc.chi2_test(table)
    assert p > 1e-4
    results = json.loads(json.dumps(RESULTS))
    results.update(n=16, level="prompt", p_threshold=1e-4, min_abs_is=0.0, kept_edges=[], edges=[
        {"source": "age", "target": "gender", "is": -0.4, "p_value": p, "statistic": statistic, "dof": dof, "kept": False},
        {"source": "gender", "target": "age", "is": 0.01, "p_value": 0.9, "statistic": 0.01, "dof": 1, "kept": False}])
    note = ic.no_edge_note(results)
    assert note["tested"] == 2 and note["cells"] == 2 and note["strongest"]["source"] == "age"
    # a run stored before n_to_pass: N·χ²_crit/χ² by hand, χ²_crit = chi2.isf(1e-4, 1) = 15.137
    from scipy.stats import chi2

    assert note["n_needed"] == math.ceil(16 * chi2.isf(1e-4, 1) / statistic)
    # the run's own N: the same shares pass the real test at that N and not one image below
    n_needed = bc.n_to_pass(table, 16, 1e-4)
    assert bc.chi2_test(table * n_needed / 16)[0] < 1e-4 < bc.chi2_test(table * (n_needed - 1) / 16)[0]
    assert bc.n_to_pass(np.array([[8, 8], [8, 8]]), 16, 1e-4) is None            # no dependence: no N
    results["edges"][0]["n_to_pass"] = n_needed
    note = ic.no_edge_note(results)
    assert note["n_needed"] == n_needed
    assert f"about {note['n_needed']} images per set (now 16)" in note["text"] and "all 2 of the 2 ordered pairs" in note["text"]
    html = str(biasgraph.summary_html(results))
    assert 'id="ic-no-edge-note"' in html and f'data-n-needed="{note["n_needed"]}"' in html and 'data-metric="is"' in html
    # an |IS| minimum more images cannot reach is said as such; a kept edge needs no note
    results["min_abs_is"] = 0.5
    assert ic.no_edge_note(results)["n_needed"] is None and "more images do not change" in ic.no_edge_note(results)["text"]
    assert ic.no_edge_note(RESULTS) is None


# -- issue 42.18: the occupation preset on the synthetic world ------------------------------------------------

def _preset_axes(occupation: str, names) -> dict:
    return {a: [c.format(occupation=occupation) for c in cfsets.load_preset("occupations")["axes"][a]] for a in names}


def test_the_synthetic_vqa_answers_an_axis_it_does_not_draw_within_the_choices_as_a_flat_guess(engine):
    records = engine.image_set("a photo of a doctor", range(12))
    vqa = engine.models.get(engine.preset.vqa)
    question = "What is the disability (fit, blind, hearing aid, wheelchair) of the person in the image?"
    choices = ["fit", "blind", "hearing aid", "wheelchair"]
    images = [r.image for r in records]
    answers = vqa.answer(images, question, choices)
    assert set(answers) <= set(choices) and len(set(answers)) > 1          # a choice each, not one default
    assert answers == vqa.answer(images, question, choices)                 # fixed per image and question
    scored = vqa.answer_classes(images, question, choices)
    assert [a.answer for a in scored] == answers
    assert all(a.probs[a.answer] == pytest.approx(0.26) and max(a.probs.values()) == a.probs[a.answer] for a in scored)
    # a drawn axis is read as before; a value no choice names is still "other"
    assert vqa.answer(images[:1], "What is the gender?", ["robot", "alien"]) == ["other"]


def test_the_planted_age_to_gender_rule_of_doctors_is_the_one_kept_edge_and_an_unanswered_axis_is_named(engine):
    import warnings

    axes = _preset_axes("doctor", ("gender", "age", "emotion", "disability"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)   # nothing is averaged over nothing
        events = list(ic.run(ic.IntersectionalRequest("A photo of a doctor", axes=axes, n=48, n_boot=100), engine))
    r = done_event(events).results
    # the world's rules (assets/synthetic_world.json): a doctor's gender depends on age; emotion on nothing
    assert {(e["source"], e["target"]) for e in r["kept_edges"]} == {("age", "gender")}
    assert r["max_impact"] == "age" and r["max_influenced"] == "gender"
    # disability is drawn by nothing: every answer is a guess the evaluator cannot tell, said once
    assert r["unanswered"] == ["disability"] and r["cant_tell"]["disability"]["cant_tell_share"] == 1.0
    said = [e.message for e in events if isinstance(e, ic.Warning) and "disability" in e.message]
    assert said == ["disability: none of about 672 answers was one of its choices (672 \"can't tell\"), so it has no "
                    "distribution: no edge can point to it and it is left out of every share and w̄"]
    j = r["sensitivity"]["axes"].index("disability")
    assert all(row[j] is None for row in r["sensitivity"]["matrix"])
    assert all(row[j] is None for row in r["sensitivity"]["p_positive"])


@pytest.mark.slow
def test_pooled_occupations_keep_no_edge_the_world_did_not_plant_and_say_why_none_passed(engine):
    import warnings

    from markupsafe import escape

    occupations = ["doctor", "librarian", "teacher"]
    axes = {a: [c.replace("doctor", "{occupation}") for c in cfs]
            for a, cfs in _preset_axes("doctor", ("gender", "age", "clothing", "disability")).items()}
    request = ic.IntersectionalRequest("A photo of a {occupation}", axes=axes, fill=occupations, n=48, n_boot=100)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        r = done_event(ic.run(request, engine)).results
    assert r["level"] == "aggregated" and r["unanswered"] == ["disability"]
    planted = {("age", "gender"), ("clothing", "age")}   # doctors: age -> gender; librarians: clothing -> age
    assert {(e["source"], e["target"]) for e in r["kept_edges"]} <= planted
    if not r["kept_edges"]:   # pooled over three occupations the rules may be too weak: the page says why
        note = ic.no_edge_note(r)
        assert note["tested"] == 9 and "3 could not be tested (disability: no answer within the choices)" in note["text"]
        assert "the counts of the 3 prompts are pooled, so a dependence of one prompt alone weighs 1/3" in note["text"]
        assert str(escape(note["text"])) in str(biasgraph.summary_html(r))


@pytest.mark.slow
def test_the_occupation_study_on_the_command_line_names_the_unanswered_axis_and_says_why_no_edge_passed(tmp_path):
    from test_cli import cli

    out = cli("intersectional", "--preset", "synthetic", "--axes-preset", "occupations", "--fill", "doctor", "nurse",
              "-n", "8", "--n-boot", "100", data_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    assert "Mean of empty slice" not in out.stderr and "RuntimeWarning" not in out.stderr
    assert "disability: none of about 432 answers was one of its choices (432 \"can't tell\")" in out.stderr
    assert "answers about disability were outside its choices" not in out.stderr
    summary = json.loads(out.stderr.rsplit(" done: ", 1)[1].splitlines()[0])
    assert summary["kept_edges"] == 0   # pooled over a doctor and a nurse at N = 8: the terminal says why, as the page does
    assert out.stderr.rstrip().splitlines()[-1].startswith("No edge passes: 49 of the 56 ordered pairs")
    assert "7 could not be tested" in out.stderr
