"""Counterfactuals (TIBET): axes and counterfactual checks, CAS/MAD by hand, bad LLM output,
and the planted biases of the synthetic world coming back out of CAS and MAD."""
import numpy as np
import pytest

from engine.common.errors import InputError, LLMOutputError
from engine.common.events import AxisScores, Headline, Images, Table
from engine.methods import cfsets
from engine.methods.cfsets import SetSpec
from engine.methods.measure import resample_weights
from engine.methods.counterfactuals import (CounterfactualsRequest, InitialMeasured, axis_scores, cas_rows, compare,
                                            concept_set, run, tibet_question)
from engine.metrics import tibet

from runhelpers import done_event


def axes_for(subject):
    return {"gender": [f"a photo of a male {subject}", f"a photo of a female {subject}"],
            "age": [f"a photo of a young {subject}", f"a photo of a middle-aged {subject}", f"a photo of an old {subject}"]}


def measure(engine, prompt, **kw):
    events = list(run(CounterfactualsRequest(prompt, **kw), engine))
    return done_event(events).results, events


# -- axes tables and counterfactual checks ---------------------------------------------------------

def test_counterfactual_checks_and_values():
    prompt = "A photo of a {occupation}"
    assert cfsets.check_counterfactual(prompt, "A photo of an old {occupation}") is None  # a -> an is not a change
    assert "2 places" in cfsets.check_counterfactual(prompt, "A photo of a sad {occupation} who is sad")
    assert cfsets.check_counterfactual(prompt, "a photo of a {occupation}") == cfsets.IDENTICAL
    assert "longer" in cfsets.check_counterfactual("a doctor", "a doctor who is very very happy and smiling a lot")
    values = {cf: cfsets.counterfactual_value(prompt, cf) for cf in
              ["A photo of an old {occupation}", "A photo of a {occupation} in formal attire",
               "A photo of a {occupation} working outdoors", "A photo of a sad {occupation} who is sad",
               "A photo of a {occupation} with a hearing aid"]}
    assert list(values.values()) == ["old", "formal attire", "working outdoors", "sad", "hearing aid"]


def test_user_tables_are_cleaned_but_kept_and_llm_output_is_filtered():
    axes = {"Skin_Tone": ["a photo of a dark-skinned doctor", " ", "a photo of a doctor",
                          "a photo of a dark-skinned doctor", "a photo of a sad doctor who is sad"]}
    kept, problems = cfsets.clean_axes("a photo of a doctor", axes)
    assert kept == {"skin tone": ["a photo of a dark-skinned doctor", "a photo of a sad doctor who is sad"]}
    assert any("(kept)" in p for p in problems) and any("prompt itself (dropped)" in p for p in problems)
    strict, _ = cfsets.clean_axes("a photo of a doctor", axes, strict=True)
    assert strict == {"skin tone": ["a photo of a dark-skinned doctor"]}
    rows = [["gender", "a male doctor"], ["", "a female doctor"], ["Age", ""], [None, None]]
    assert cfsets.axes_from_rows(rows) == {"gender": ["a male doctor", "a female doctor"]}
    assert cfsets.rows_from_axes({"gender": ["a", "b"]}) == [["gender", "a"], ["gender", "b"]]


def test_preset_is_table_6_1_verbatim_and_placeholders_expand():
    preset = cfsets.load_preset("occupations")
    assert len(preset["occupations"]) == 26 and sum(map(len, preset["axes"].values())) == 26
    assert preset["axes"]["bodytype"][0] == "A photo of a obese {occupation}"  # the thesis's typo, kept
    assert cfsets.expand("A photo of a {occupation}", ["nurse", " chef "]) == ["A photo of a nurse", "A photo of a chef"]
    with pytest.raises(InputError, match="placeholder"):
        cfsets.expand("A photo of a {occupation}", [])
    with pytest.raises(InputError, match="placeholder"):
        cfsets.expand("a photo of a nurse", ["chef"])


def test_a_counterfactual_placeholder_nothing_fills_is_refused_before_any_image(engine):
    from engine.methods import METHODS
    from engine.methods.intersectional import IntersectionalRequest

    template = {"gender": ["A photo of a male {occupation}", "A photo of a female {occupation}"]}
    for prompt, axes in [("a portrait of a doctor", template),                     # issue 34: nothing to fill it
                         ("A photo of a {job}", template),                         # the prompt fills another one
                         ("a photo of a doctor", {"age": ["a photo of an old {occupation} doctor"]})]:
        with pytest.raises(InputError, match=r"has \{occupation\}, which neither the prompt nor the fill values fill"):
            cfsets.check_placeholders(prompt, axes)
    cfsets.check_placeholders("A photo of a {occupation}", template)             # the fill values fill it
    cfsets.check_placeholders("a portrait of a doctor", {"gender": ["a portrait of a female doctor"]})
    runs = engine.store.count("runs")
    for method, request in [("counterfactuals", CounterfactualsRequest("a portrait of a doctor", axes=template, n=2)),
                            ("intersectional", IntersectionalRequest("a portrait of a doctor", axes=template, n=2))]:
        with pytest.raises(InputError, match="generated literally"):
            list(METHODS[method].run(request, engine))
    assert engine.stats.images_generated == 0 and engine.store.count("runs") == runs


def test_question_bank_table_5_2_and_template():
    assert tibet_question("gender") == "What is the gender (male, female, other) of the person in the image?"
    assert tibet_question("racial_bias") == "What is the ethnicity of the person in the image?"
    assert tibet_question("cultural bias") == "What is the culture depicted in the image?"
    assert tibet_question("clothing") == "What is the person wearing?"
    assert tibet_question("skin tone") == "What is skin tone in the image?"


# -- CAS and MAD, by hand -------------------------------------------------------------------------------

def _set(answers, n_boot=0, seed=0):
    n = len(answers)
    return concept_set(SetSpec("x", "p", 0), [None] * n, [[a[q] for a in answers] for q in range(len(answers[0]))],
                       [], np.eye(n, 4), resample_weights(n, n_boot, seed, 0))


def test_cas_of_hand_made_sets():
    initial = _set([["A man.", "young"], ["a man", "old"]])         # man 1, young .5, old .5 per image
    cf = _set([["a woman", "young"], ["a man", "Young!"]])          # woman .5, man .5, young 1
    assert initial.histogram(0.01) == tibet.concept_histogram([["A man.", "young"], ["a man", "old"]])
    request = CounterfactualsRequest("p", synonyms=False)
    # rescaled to sum 1: [.5 .25 .25 0] vs [.25 0 .5 .25] (man, old, young, woman): 0.5 / 1.5
    assert compare(initial, cf, request)["cas"] == pytest.approx(1 / 3)
    assert compare(initial, initial, request)["cas"] == pytest.approx(1.0)


def test_batched_cas_equals_tibet_cas_row_by_row():
    rng = np.random.default_rng(0)
    a, b = rng.random((20, 6)) * (rng.random((20, 6)) > 0.3), rng.random((20, 6)) * (rng.random((20, 6)) > 0.3)
    a[3] = 0
    for renormalise in (True, False):
        rows = cas_rows(a, b, renormalise)
        for i in range(20):
            expected = tibet.cas({str(j): v for j, v in enumerate(a[i])}, {str(j): v for j, v in enumerate(b[i])},
                                 renormalise)
            assert rows[i] == pytest.approx(expected)


def test_resamples_with_every_image_once_reproduce_the_value():
    initial = _set([["a man", "young"], ["a woman", "old"], ["a man", "old"]], n_boot=4)
    cf = _set([["a woman", "young"], ["a man", "young"], ["a man", "old"]], n_boot=4, seed=1)
    for s in (initial, cf):
        s.weights[:] = 1.0
    out = compare(initial, cf, CounterfactualsRequest("p", synonyms=False))
    assert out["_cas"] == pytest.approx([out["cas"]] * 4)
    assert out["_cas_clip"] == pytest.approx([out["cas_clip"]] * 4)


@pytest.mark.parametrize("cas, mad", [([0.5, 0.6, 0.4], 0.316), ([0.56, 0.44], 0.346),   # thesis worked examples
                                      ([0.3, 0.3, 0.3, 0.3], 0.0), ([0.7, 0, 0, 0, 0, 0], 1.0),  # extremes
                                      ([0.6, 0.0], 1.0)])                                    # K = 2 vs K = 6
def test_mad_per_axis_with_unequal_k(cas, mad):
    cfs = [{"cas": c, "cas_clip": c, "_cas": np.full(5, c), "_cas_clip": np.full(5, c)} for c in cas]
    scores = axis_scores(cfs, sum_normalise=True)
    assert scores["mad"] == pytest.approx(mad, abs=1e-3)
    assert scores["mad_ci"] == pytest.approx([mad, mad], abs=1e-3)
    assert cfs[0]["cas_ci"] == pytest.approx([cas[0], cas[0]])


# -- the LLM ------------------------------------------------------------------------------------------

@pytest.fixture
def canned_llm(engine, monkeypatch):
    """The synthetic LLM, except that TIBET's third turn gets the replies in `replies`."""
    llm = engine.models.get(engine.preset.llm)
    original, replies = llm.chat, []

    def chat(messages, **kw):
        last = messages[-1]["content"]
        if messages[-1]["role"] == "user" and not last.startswith(("For the image", "Generate many")):
            return replies.pop(0)
        return original(messages, **kw)

    monkeypatch.setattr(llm, "chat", chat)
    return replies


def test_malformed_llm_output_is_repaired_or_asked_again(engine, canned_llm):
    canned_llm += ["Sure! Here are some biases to consider.",                        # prose, no JSON
                   '["a photo of a male doctor", "a photo of a female doctor"]',     # wrong shape
                   "```json\n{'Gender': ['a photo of a male doctor', 'a photo of a female doctor',\n"
                   "'a photo of a female doctor in a park at night'],}\n```"]          # fixable, one bad CF
    axes, problems = cfsets.propose_axes(engine, "a photo of a doctor")
    assert axes == {"gender": ["a photo of a male doctor", "a photo of a female doctor"]}
    assert len(problems) == 1 and "park at night" in problems[0] and "dropped" in problems[0]
    canned_llm += ["gender:\n- a photo of a male doctor\n- a photo of a female doctor"]  # a prose list
    axes, _ = cfsets.propose_axes(engine, "a photo of a doctor", seed=5)
    assert axes == {"gender": ["a photo of a male doctor", "a photo of a female doctor"]}


def test_unusable_llm_output_is_reported_and_the_table_can_be_filled_by_hand(engine, canned_llm):
    canned_llm += ["I cannot help with that.", "{}", '{"gender": []}']
    with pytest.raises(LLMOutputError, match="by hand"):
        list(run(CounterfactualsRequest("a photo of a doctor", n=4), engine))
    assert engine.store.list_runs("counterfactuals")[0]["status"] == "failed"
    results, _ = measure(engine, "a photo of a doctor", n=4, axes=axes_for("doctor"), n_boot=0)
    assert set(results["mad"]) == {"gender", "age"}


# -- the method on the synthetic world ---------------------------------------------------------------------

@pytest.mark.slow
def test_planted_gender_bias_gives_higher_mad_and_favours_the_male_counterfactual(engine):
    world = engine.models.get(engine.preset.generator).world
    assert world.expected_distribution("a photo of a firefighter", "gender") == pytest.approx({"male": 0.9, "female": 0.1})
    for subject in ("firefighter", "teacher"):
        assert world.expected_distribution(f"a photo of a {subject}", "age") == pytest.approx(
            {"young": 1 / 3, "middle-aged": 1 / 3, "old": 1 / 3})
    assert world.expected_distribution("a photo of a teacher", "gender") == pytest.approx({"male": 0.5, "female": 0.5})

    biased, events = measure(engine, "a photo of a firefighter", n=32, axes=axes_for("firefighter"), n_boot=200)
    balanced, _ = measure(engine, "a photo of a teacher", n=32, axes=axes_for("teacher"), n_boot=200)
    cas = biased["cas"]["gender"]
    assert cas["a photo of a male firefighter"] > cas["a photo of a female firefighter"]
    assert biased["mad"]["gender"] > biased["mad"]["age"] + 0.1
    assert biased["mad_order"][0] == "gender"
    assert max(balanced["mad"].values()) < 0.25 < biased["mad"]["gender"]
    low, high = biased["mad_ci"]["gender"]
    assert low < high and all(len(c["cas_ci"]) == 2 for c in biased["counterfactuals"])
    # sets stream one by one with the same seeds; the initial set carries its Top-K concepts
    labels = list(dict.fromkeys(e.label for e in events if isinstance(e, Images)))
    assert labels[0] == "initial" and labels[1] == "axis=gender|cf=a photo of a male firefighter"
    assert {im["seed"] for im in biased["sets"]["axis=age|cf=a photo of an old firefighter"]["images"]} == set(range(32))
    assert "man" in [w for w, _ in biased["sets"]["initial"]["axis_top_k"]["gender"]]
    measured = [e for e in events if isinstance(e, (InitialMeasured, AxisScores, Headline))]
    assert [type(e) for e in measured] == [InitialMeasured, AxisScores, AxisScores, Headline]
    assert [e.axis for e in measured[1:3]] == ["gender", "age"] and measured[0].label == "initial"


@pytest.mark.slow
def test_llm_axes_aggregate_mode_and_the_store(engine):
    results, events = measure(engine, "a photo of a doctor", n=4, n_boot=100)
    assert any(isinstance(e, Table) and e.name == "axes" for e in events)
    assert {"gender", "age", "skin tone"} <= set(results["axes"])
    assert results["questions"]["gender"].startswith("What is the gender")
    generated = engine.stats.images_generated
    measure(engine, "a photo of a doctor", n=4, n_boot=100)
    assert engine.stats.images_generated == generated  # every set came from the store

    axes = {"gender": ["a photo of a male {occupation}", "a photo of a female {occupation}"]}
    agg, _ = measure(engine, "a photo of a {occupation}", fill=["nurse", "firefighter"], axes=axes, n=8, n_boot=100)
    assert agg["aggregate"] and list(agg["per_prompt"]) == ["a photo of a nurse", "a photo of a firefighter"]
    male = "a photo of a male {occupation}"
    assert agg["cas"]["gender"][male] == pytest.approx(np.mean([p["cas"]["gender"][male] for p in agg["per_prompt"].values()]))
    assert "prompt=a photo of a nurse|axis=gender|cf=" + male in agg["sets"]


@pytest.mark.slow
def test_cli_prints_axes_cas_and_mad_as_json(tmp_path):
    import json

    from test_cli import cli

    out = cli("counterfactuals", "--preset", "synthetic", "--prompt", "a photo of a doctor", "-n", "8", "--n-boot",
              "100", "--json", data_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert {"run_id", "axes", "counterfactuals", "cas", "mad"} <= set(result)
    assert set(result["cas"]) == set(result["mad"]) == set(result["axes"])
    assert all(0 <= m <= 1 for m in result["mad"].values())
    bad = cli("counterfactuals", "--preset", "synthetic", "--prompt", "a photo of a doctor", "--fill", "nurse",
              data_dir=tmp_path)
    assert bad.returncode == 2 and "placeholder" in bad.stderr and "Traceback" not in bad.stderr


def test_the_drill_down_opens_every_set_the_picker_lists_the_initial_ones_included(engine):
    """Issue 42: picking "initial prompt" raised KeyError 'initialinitial'; the initial set is shown alone,
    a counterfactual beside its prompt's initial set, in aggregate mode too."""
    from engine.report import counterfactuals as page
    from tabs.counterfactuals import set_choices

    axes = {"gender": ["a photo of a male {occupation}", "a photo of a female {occupation}"]}
    for fill in ([], ["nurse", "firefighter"]):
        prompt = "a photo of a {occupation}" if fill else "a photo of a nurse"
        results, _ = measure(engine, prompt, fill=fill, n=2, n_boot=0,
                             axes=axes if fill else {"gender": ["a photo of a male nurse", "a photo of a female nurse"]})
        for _, label in set_choices(results):
            drill = str(page.drill_html(results, label))
            sides = drill.count('class="gl-drill"')
            if results["sets"][label]["axis"] is None:
                assert sides == 1 and 'data-side="initial"' in drill
            else:
                assert sides == 2 and 'data-side="counterfactual"' in drill
            assert results["sets"][page.initial_label(label)]["prompt"] in drill
