"""Mitigate (InterMit): prompt products and allocation by hand, the preview on a hand-built
matrix, and on the synthetic world's planted doctor bias (gender | age): priorities [0.7, 0.3]
reach τ < ε in fewer steps than mitigating every axis, a 30/40/30 age target is met, the
preview's first axis is the run's, a planted trade-off (librarian clothing → age) is
flagged; the CLI prints steps, τ and w̄."""
import itertools
import json
import math

import numpy as np
import pytest

from engine.common.errors import InputError
from engine.common.events import Warning
from engine.metrics import biasconnect as bc
from engine.methods import mitigate as mt
from engine.report import page_for
from engine.report.mitigate import page as mitigate_page
from engine.report.runs import results_html

from runhelpers import done_event

DOCTOR = {"gender": ["a photo of a male doctor", "a photo of a female doctor"],
          "age": ["a photo of a young doctor", "a photo of a middle-aged doctor", "a photo of an old doctor"]}


def run(engine, **fields):
    events = list(mt.run(mt.MitigateRequest(**{"prompt": "a photo of a doctor", "axes": DOCTOR, "n": 24,
                                               "seed": 1, "n_boot": 100, **fields}), engine))
    return done_event(events).results, events


# -- by hand ------------------------------------------------------------------------------------------

def test_compose_applies_every_one_concept_edit_and_fixes_articles():
    base = "a photo of a doctor"
    assert mt.compose(base, ["a photo of an old doctor"]) == ("a photo of an old doctor", True)   # verbatim
    assert mt.compose(base, ["a photo of a male doctor", "a photo of an old doctor"]) == (
        "a photo of a male old doctor", True)
    assert mt.compose(base, ["a photo of an average-build doctor", "a photo of a doctor in formal attire"])[0] == \
        "a photo of an average-build doctor in formal attire"
    assert mt.compose("an image of an engineer", ["an image of a male engineer", "an image of an old engineer"])[0] \
        == "an image of a male old engineer"
    assert mt.compose("A photo of a doctor.", ["A photo of a female doctor.", "A photo of a doctor who is sad."])[0] \
        == "A photo of a female doctor who is sad."
    prompt, clean = mt.compose(base, ["a photo of a nurse", "a photo of a surgeon"])   # both replace 'doctor'
    assert not clean and prompt == "a photo of a nurse, surgeon"


def test_allocate_meets_every_marginal_within_about_one_image():
    assert mt.allocate([0.3, 0.4, 0.3], 20) == [6, 8, 6]
    assert mt.allocate([1, 0, 1], 5)[1] == 0
    gender, age = [("g", "m"), ("g", "f")], [("a", "y"), ("a", "m"), ("a", "o")]
    combos = list(itertools.product(range(2), range(3)))
    counts = mt.allocate([0.5 * [0.3, 0.4, 0.3][j] for _, j in combos], 20, [(gender[i], age[j]) for i, j in combos])
    assert [sum(c for c, (i, _) in zip(counts, combos) if i == k) for k in range(2)] == [10, 10]
    assert [sum(c for c, (_, j) in zip(counts, combos) if j == k) for k in range(3)] == [6, 8, 6]
    rng = np.random.default_rng(0)
    for _ in range(100):   # random targets on up to three axes: no value more than ~1 image from N·D*
        dims = rng.integers(2, 4, size=rng.integers(1, 4))
        targets = [rng.dirichlet(np.ones(d)) + 0.01 for d in dims]
        targets = [t / t.sum() for t in targets]
        combos = list(itertools.product(*(range(d) for d in dims)))
        n = int(rng.integers(4, 40))
        counts = mt.allocate([math.prod(targets[a][v] for a, v in enumerate(c)) for c in combos], n,
                             [tuple(enumerate(c)) for c in combos])
        assert sum(counts) == n
        for a, t in enumerate(targets):
            for v in range(len(t)):
                assert abs(sum(k for k, c in zip(counts, combos) if c[a] == v) - n * t[v]) < 1.1


def _matrix(axes, w_init, w_mixed):
    w_init, w_mixed = np.array(w_init, float), np.array(w_mixed, float)
    return bc.SensitivityMatrix(axes, w_init[None, :] - w_mixed, w_init, w_mixed)


def test_preview_is_greedy_on_the_matrix_and_may_pick_an_axis_outside_b_star():
    # ethnicity is not in B*, but mitigating it fixes age and gender at once (thesis Fig 7.3a)
    axes = ["gender", "age", "ethnicity"]
    s = _matrix(axes, [0.6, 0.5, 0.7], [[0.0, 0.5, 0.7], [0.6, 0.0, 0.7], [0.2, 0.2, 0.0]])
    p = mt.normalise_priorities(["gender", "age"], {"gender": 1, "age": 1})
    out = mt.preview(s, p, 0.35)
    assert out["tau0"] == pytest.approx(0.55)
    assert [st["axis"] for st in out["steps"]] == ["ethnicity"] and out["stop"] == "threshold_reached"
    assert out["steps"][0]["tau"] == pytest.approx(0.2)
    assert mt.choose(bc.priority_alignment(s, p), axes) == "ethnicity"
    # with ethnicity used already, gender then age; the second step composes additively
    out = mt.preview(s, p, 0.01, mitigated=["ethnicity"])
    assert [st["axis"] for st in out["steps"]] == ["gender", "age"]
    assert out["steps"][0]["w_bar"]["age"] == pytest.approx(0.5) and out["steps"][-1]["tau"] == 0
    # nothing helps: every γ ≤ 0
    s = _matrix(["gender", "age"], [0.6, 0.5], [[0.7, 0.6], [0.9, 0.6]])
    assert mt.preview(s, {"gender": 0.5, "age": 0.5}, 0.35)["stop"] == "no_gain"
    assert mt.preview(s, {"gender": 0.5, "age": 0.5}, 0.9)["stop"] == "below_threshold"
    assert mt.choose({"gender": 0.0, "age": float("nan")}, ["gender", "age"]) is None


def test_weighted_mix_and_parsers():
    table = np.array([[8, 2], [1, 9]])
    assert mt._weighted_mix(table, [1, 1]) == pytest.approx(bc.mixed_distribution(table))
    assert mt._weighted_mix(table, [0.3, 0.7]) == pytest.approx(0.3 * np.array([0.8, 0.2]) + 0.7 * np.array([0.1, 0.9]))
    assert mt.parse_priorities("gender=0.7, skin tone=0.3") == {"gender": 0.7, "skin tone": 0.3}
    assert mt.parse_target("age=young:30,middle-aged:40,old:30%") == ("age", {"young": 30, "middle-aged": 40, "old": 30})
    for bad in ("gender", "gender=x"):
        with pytest.raises(InputError):
            mt.parse_priorities(bad)
    with pytest.raises(InputError):
        mt.parse_target("age:young=0.3")
    drop = mt.quality_warnings({"quality": {"value": 0.8, "low": 0.7, "high": 0.9}},
                               {"quality": {"value": 0.6, "low": 0.5, "high": 0.7}}, 0.05)
    assert len(drop) == 1 and "quality" in drop[0]


# -- on the synthetic world -----------------------------------------------------------------------------

@pytest.mark.slow
def test_priorities_reach_epsilon_in_fewer_steps_than_mitigating_every_axis(engine):
    world = engine.models.get(engine.preset.generator).world
    exact = lambda prompt, axis: list(world.expected_distribution(prompt, axis).values())  # noqa: E731
    p = {"gender": 0.7, "age": 0.3}
    tau0 = bc.weighted_bias({"gender": bc.w_bar(exact("a photo of a doctor", "gender")),
                             "age": bc.w_bar(exact("a photo of a doctor", "age"))}, p)
    tau1 = bc.weighted_bias({"gender": 0.0, "age": bc.w_bar(exact("a photo of a male doctor", "age"))}, p)
    assert tau0 == pytest.approx(0.48) and tau1 == pytest.approx(0.06)     # the planted truth: one step suffices

    r, events = run(engine, priorities=p)
    assert r["states"][0]["tau"] > 0.35 and r["stop"]["reason"] == "threshold_reached" and r["stop"]["reached"]
    assert [s["axis"] for s in r["steps"]] == ["gender"] and r["final"]["tau"] < 0.35
    assert r["mit_steps"] == 0.5 and r["steps"][0]["predicted_w_bar"]["gender"] == 0   # the diagonal fixes itself
    gender = r["report"]["gender"]["final"]
    assert gender["low"][0] <= 0.5 <= gender["high"][0] and gender["counts"] == [12, 12]
    assert r["preview"]["steps"][0]["axis"] == "gender"
    assert r["quality"]["final"]["is_person"]["value"] == 1 and not r["quality"]["warnings"]
    assert r["prompt_set"]["prompts"] == [{"prompt": "a photo of a male doctor", "weight": 0.5, "values": {"gender": "male"}},
                                          {"prompt": "a photo of a female doctor", "weight": 0.5,
                                           "values": {"gender": "female"}}]
    assert [e.record["axis"] for e in events if isinstance(e, mt.StepDone)] == [s["axis"] for s in r["steps"]]
    steps_shown = {e.step for e in events if isinstance(e, mt.PromptSetImages)}
    assert steps_shown == set(range(len(r["steps"]) + 1))   # the base prompt's set and every step's

    everything, _ = run(engine, priorities=p, strategy="all")
    assert [s["axis"] for s in everything["steps"]] == ["gender", "age"] and everything["mit_steps"] == 1
    assert len(r["steps"]) < len(everything["steps"])
    assert len(everything["prompt_set"]["prompts"]) == 6

    html = results_html("mitigate", r)
    assert page_for("mitigate") is mitigate_page and 'data-chart="mitigate-step-1"' in html
    assert 'data-chart="mitigate-tau"' in html and 'data-chart="mitigate-final-age"' in html
    # τ, one before/after chart per step (no separate "initial" chart: step 1 shows it), one per axis at the end
    assert html.count("w̄ on the initial images") == 0
    assert html.count('class="gl-vega"') == 1 + len(r["steps"]) + len(r["report"])


@pytest.mark.slow
def test_a_30_40_30_age_target_is_met_within_sampling_error(engine):
    r, _ = run(engine, n=20, priorities={"gender": 0.5, "age": 0.5}, epsilon=0.01,
               ideals={"age": {"young": 30, "middle-aged": 40, "old": 30}})
    assert sorted(s["axis"] for s in r["steps"]) == ["age", "gender"]
    assert r["ideals"]["age"] == pytest.approx({"young": 0.3, "middle-aged": 0.4, "old": 0.3})
    assert r["sampling_weights"]["age"] == pytest.approx({c: w for c, w in zip(DOCTOR["age"], [0.3, 0.4, 0.3])})
    age = r["report"]["age"]["final"]
    for share, low, high, target in zip(age["shares"], age["low"], age["high"], [0.3, 0.4, 0.3]):
        assert abs(share - target) <= 1 / 20 and low - 1e-9 <= target <= high + 1e-9
    assert r["report"]["gender"]["final"]["counts"] == [10, 10]
    assert r["final"]["w_bar"]["age"] < 0.1 < r["states"][0]["w_bar"]["age"]


@pytest.mark.slow
def test_the_preview_predicts_the_first_axis_the_run_picks(engine):
    # age-heavy priorities: mitigating age first (it also helps gender a little)
    fields = {"priorities": {"gender": 0.2, "age": 0.8}, "epsilon": 0.1}
    preview, _ = run(engine, preview_only=True, **fields)
    assert preview["stop"]["reason"] == "preview" and not preview["steps"]
    labels = {row["label"] for row in engine.store.get_run(
        next(r["id"] for r in engine.store.list_runs("mitigate")))["images"]}
    assert labels and all(label.startswith("step=0|") for label in labels)   # no mitigated image generated
    r, _ = run(engine, **fields)
    assert r["steps"][0]["axis"] == preview["preview"]["steps"][0]["axis"] == "age"
    assert r["steps"][0]["gamma"] == preview["preview"]["steps"][0]["gamma"]
    # issue 17: the preview's status line and its panel agree (a forecast, never "succeeded")
    status = mt.outcome(preview)
    assert status.startswith("Preview done (nothing mitigated yet)") and "not reached" not in status
    assert preview["preview"]["message"] in status and "succeeded" not in preview["preview"]["message"]
    assert mt.outcome(r).startswith("Done, ε reached" if r["stop"]["reached"] else "Done, ε not reached")


@pytest.mark.slow
def test_a_step_that_hurts_another_axis_raises_a_trade_off_alert(engine):
    # librarian: age depends on clothing; a formal-only dress code makes the librarians old
    axes = {"clothing": ["a photo of a librarian in formal attire", "a photo of a librarian in informal attire"],
            "age": ["a photo of a young librarian", "a photo of a middle-aged librarian", "a photo of an old librarian"]}
    r, events = run(engine, prompt="a photo of a librarian", axes=axes, priorities={"clothing": 0.9, "age": 0.1},
                    ideals={"clothing": {"formal attire": 100}}, epsilon=0.2)
    assert [s["axis"] for s in r["steps"]] == ["clothing"]
    assert [p["prompt"] for p in r["prompt_set"]["prompts"]] == ["a photo of a librarian in formal attire"]
    alert = r["steps"][0]["tradeoffs"][0]
    assert alert["axis"] == "age" and alert["after"] > alert["before"] and len(alert["change_ci"]) == 2
    assert any(isinstance(e, Warning) and "trade-off at step 1" in e.message and "age" in e.message for e in events)


def test_bad_requests_name_the_problem(engine):
    with pytest.raises(InputError, match="not among the axes"):
        run(engine, mitigate=["skin tone"])
    with pytest.raises(InputError, match="ideal distribution"):
        run(engine, ideals={"age": {"ancient": 1}})
    with pytest.raises(InputError, match="ε"):
        run(engine, epsilon=0)


def test_an_axis_to_mitigate_nothing_answers_says_to_leave_it_out(engine):
    """The Table 6.1 preset ticks every axis; the synthetic world draws no disability, so nothing answers it
    within its choices: the refusal names the axis and what to do, and without it the same request runs."""
    from engine.methods import cfsets

    preset = cfsets.load_preset("occupations")
    request = dict(prompt=preset["prompt"], axes=preset["axes"], fill=["doctor"], n=4, preview_only=True)
    with pytest.raises(InputError, match=r"^no VQA answer about disability fell within its choices on the images of "
                                         r"step 0: τ cannot be measured; leave it out of the axes to mitigate \(B\*\)"):
        run(engine, **request)
    kept = [axis for axis in preset["axes"] if axis != "disability"]
    results, _ = run(engine, **request, mitigate=kept)
    assert results["preview"]["steps"]


@pytest.mark.slow
def test_cli_prints_each_steps_axis_tau_and_w_bar(tmp_path, capsys):
    from engine.__main__ import main   # in-process: the same parser and printing as `python -m engine`

    export = tmp_path / "prompts.json"
    common = ["mitigate", "--preset", "synthetic", "--data-dir", str(tmp_path), "--prompt", "a photo of a doctor",
              "-n", "8", "--json", "--quiet", "--axes", "gender,age", "--n-boot", "100"]
    assert main(common + ["--priorities", "gender=0.7,age=0.3", "--target", "age=young:0.3,middle-aged:0.4,old:0.3",
                          "--epsilon", "0.05", "--export", str(export)]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["run_id"] and result["targets"] == ["gender", "age"] and result["steps"]
    for step in result["steps"]:
        assert step["axis"] in ("gender", "age") and isinstance(step["tau"], float)
        assert set(step["w_bar"]) == {"gender", "age"}
    assert result["ideals"]["age"] == {"young": 0.3, "middle-aged": 0.4, "old": 0.3}
    assert json.loads(export.read_text())["prompts"] == result["prompt_set"]["prompts"]
    assert main(common + ["--epsilon", "0.05", "--preview-only"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["stop"]["reason"] == "preview" and result["preview"]["steps"][0]["axis"] in ("gender", "age")
    assert main(common + ["--priorities", "gender"]) == 2 and "error: priority" in capsys.readouterr().err
