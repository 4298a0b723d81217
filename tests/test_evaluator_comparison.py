"""Issue 42 items 1-4 and 12 (and issue 43 item 4) below the page: several evaluators compared on the
same images. Three or more give Fleiss' κ on the page; an evaluator is checked against the axes before
any image is made and the comparison keeps the axes every evaluator answers; each image's answers are
credited to their evaluator as the comparison counted them; the names shown load on the command line."""
import json

import pytest

from engine.backends.base import CANT_TELL, ModelSpec
from engine.common.errors import InputError
from engine.common.events import Images, Warning
from engine.core.engine import Engine
from engine.methods import single_prompt, validate
from engine.models.presets import SYNTHETIC_TABLE
from engine.report import charts, trust
from engine.report.single_prompt import axis_html, evaluators_html


def _run(engine, axes, evaluators, n=16, prompt="a photo of a doctor"):
    request = single_prompt.SinglePromptRequest(prompt, n=n, axes=axes, gap=False, n_boot=100, evaluators=evaluators)
    return list(single_prompt.run(request, engine))


def test_three_evaluators_give_fleiss_kappa_on_the_page(data_dir):
    """Item 1 / issue 43 item 4: the run's evaluator and two more rendered to a page (it raised
    jinja2's UndefinedError on 'agreement_matrix'); Fleiss' κ with its interval, and each pair's Cohen's κ."""
    engine = Engine("synthetic", data_dir=data_dir, vqa=ModelSpec("synthetic_vqa", SYNTHETIC_TABLE, {"error": 0.3}))
    done = _run(engine, ["gender", "age"], ["clip_vqa:synthetic", "synthetic_vqa:default"], n=24)[-1]
    compared = done.results["evaluators"]
    gender = compared["axes"]["gender"]
    assert gender["kappa_method"] == "Fleiss" and gender["kappa"] is not None
    assert gender["kappa_ci"][0] <= gender["kappa"] <= gender["kappa_ci"][1]
    assert len(gender["pairs"]) == 3 and "agreement_matrix" not in gender
    page = str(evaluators_html(compared))
    assert "Fleiss' κ over the" in page and f"{gender['kappa']:.3f} [" in page
    assert page.count('class="gl-pairs"') == 2                                    # one table per axis
    # the page of the stored run (Runs, exports) renders too
    from engine.report import page_for
    assert "Fleiss' κ" in str(page_for("single_prompt")(done.results))


def test_the_runs_own_evaluator_listed_again_is_asked_once(data_dir):
    """Listing the run's evaluator among the others (or one twice) added it as a rater "(2)" that agreed
    with itself (κ 1.000), inflating the agreement shown; it is asked once, with a warning naming it."""
    engine = Engine("synthetic", data_dir=data_dir)
    events = _run(engine, ["gender"], ["synthetic_vqa:synthetic_world.json", "synthetic_colour_vqa:synthetic_world.json",
                                       "synthetic_colour_vqa:synthetic_world.json"], n=8)
    compared = events[-1].results["evaluators"]
    assert compared["evaluators"] == ["synthetic_vqa:synthetic_world.json", "synthetic_colour_vqa:synthetic_world.json"]
    warned = [e.message for e in events if isinstance(e, Warning) and e.message.startswith("asked once")]
    assert warned == ["asked once: synthetic_vqa:synthetic_world.json, synthetic_colour_vqa:synthetic_world.json (the "
                      "run's own evaluator, or listed twice: an evaluator always agrees with itself)"]
    alone = _run(engine, ["gender"], ["synthetic_vqa:synthetic_world.json"], n=8)[-1].results
    assert "evaluators" not in alone


def test_an_axis_one_evaluator_cannot_answer_is_left_out_before_any_image(data_dir):
    """Item 2: faces answers gender and age only. With the default axes the run says so before its
    first image and compares on gender and age; with no axis it can answer, nothing is made."""
    engine = Engine("synthetic", data_dir=data_dir)
    events = _run(engine, ["gender", "age", "skin tone"], ["clip_vqa:synthetic", "faces:"])
    first_images = next(i for i, e in enumerate(events) if isinstance(e, Images))
    warnings = [e.message for e in events[:first_images] if isinstance(e, Warning)]
    assert any("left out of the evaluator comparison: skin tone" in w for w in warnings)
    compared = events[-1].results["evaluators"]
    assert list(compared["axes"]) == ["gender", "age"] and list(compared["left_out"]) == ["skin tone"]
    assert "skin tone" in events[-1].results["axes"]                              # the run still measures it
    assert "Left out of the comparison" in str(evaluators_html(compared))

    runs, generated = engine.store.count("runs"), engine.stats.generator_calls
    with pytest.raises(InputError, match="no axis can be compared across these evaluators: the faces evaluator"):
        single_prompt.check(single_prompt.SinglePromptRequest("a photo of a nurse", axes=["skin tone"],
                                                              evaluators=["faces:"]), engine)
    with pytest.raises(InputError, match="no axis can be compared"):
        _run(engine, ["skin tone"], ["faces:"], prompt="a photo of a nurse")
    assert engine.store.count("runs") == runs and engine.stats.generator_calls == generated


def test_compare_evaluators_on_a_run_keeps_the_axes_every_evaluator_answers(data_dir):
    """Item 2: "Compare evaluators" with faces: on a run of gender, age and skin tone (it failed on
    skin tone with no way to limit it)."""
    engine = Engine("synthetic", data_dir=data_dir)
    run_id = _run(engine, ["gender", "age", "skin tone"], [])[-1].run_id
    out = validate.compare_evaluators(engine, run_id, "faces:")
    assert list(out["axes"]) == ["gender", "age"] and list(out["left_out"]) == ["skin tone"]
    assert out["axes"]["gender"]["kappa_undefined"] == "no image answered by both"   # no face in the world
    html = str(trust.comparison_html(out))
    assert "Left out of the comparison: " in html and "faces:bundled 0 of 16" in html


def test_each_image_lists_every_question_once_per_evaluator_as_the_comparison_counted(data_dir):
    """Item 4: the clicked image's answers name their evaluator, say "can't tell" where the threshold
    made it so (CLIP on skin tone), carry their probabilities, and agree with the comparison."""
    engine = Engine("synthetic", data_dir=data_dir)
    done = _run(engine, ["gender", "skin tone"], ["clip_vqa:synthetic"])[-1]
    results = done.results
    key = results["images"][0]["key"]
    details = single_prompt.image_details(engine, key, results, done.run_id)
    assert [q["axis"] for q in details["answers"]] == ["gender", "skin tone"]       # each question once
    names = results["evaluators"]["evaluators"]
    assert names == ["synthetic_vqa:synthetic_world.json", "clip_vqa:synthetic"]
    for q in details["answers"]:
        assert [a["evaluator"] for a in q["answers"]] == names
        compared = results["evaluators"]["axes"][q["axis"]]["answers"][key]
        assert {a["evaluator"]: a["label"] for a in q["answers"]} == compared
        assert all(a["probs"] for a in q["answers"])                              # both score the classes
    clip = details["answers"][1]["answers"][1]
    assert clip["label"] == CANT_TELL and max(clip["probs"].values()) < engine.cant_tell_below
    html = str(trust.image_answers_html(0, key, False, details["answers"], details["caption"]))
    assert html.count('class="gl-question"') == 2 and html.count('class="gl-answer"') == 4
    assert "clip_vqa:synthetic → <b>can&#39;t tell</b>" in html and "light 0.33" in html
    # the disagreement thumbnails carry the probabilities too
    d = results["evaluators"]["axes"]["skin tone"]["disagreements"][0]
    assert set(d["probs"]) == set(names)


def test_a_run_without_other_evaluators_names_its_own():
    results = {"axes": {"gender": {"question": "What is the gender?"}, "hair": {"question": "What hair?"}},
               "answers": {"k": {"gender": "male", "hair": "long"}},
               "answer_probs": {"k": {"gender": {"male": 0.9, "female": 0.1}}}}
    rows = single_prompt.image_answers(results, "k", "synthetic_vqa:synthetic_world.json")
    assert rows == [{"axis": "gender", "question": "What is the gender?", "answers": [
                        {"evaluator": "synthetic_vqa:synthetic_world.json", "label": "male",
                         "probs": {"male": 0.9, "female": 0.1}}]},
                    {"axis": "hair", "question": "What hair?", "answers": [
                        {"evaluator": "synthetic_vqa:synthetic_world.json", "label": "long", "probs": None}]}]


def test_the_evaluator_names_shown_load_on_the_command_line(data_dir, tmp_path, monkeypatch, capsys):
    """Item 12: the page names the preset's evaluator 'synthetic_vqa:synthetic_world.json'; the CLI, run
    from any directory, loads that name (it raised FileNotFoundError: it wanted assets/...)."""
    from engine.cli import main

    engine = Engine("synthetic", data_dir=data_dir)
    names = _run(engine, ["gender"], ["synthetic_colour_vqa:synthetic_world.json"])[-1].results["evaluators"]["evaluators"]
    assert names == ["synthetic_vqa:synthetic_world.json", "synthetic_colour_vqa:synthetic_world.json"]
    monkeypatch.chdir(tmp_path)
    assert main(["single-prompt", "--preset", "synthetic", "--vqa", names[0], "--vqa", names[1], "--prompt",
                 "a photo of a nurse", "-n", "4", "--axes", "gender", "--no-gap", "--data-dir", data_dir,
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["evaluators"]["evaluators"] == names


def test_the_cant_tell_bar_has_an_interval_and_an_axis_nothing_answered_says_so(data_dir):
    """Item 12: the "can't tell" bar gets its Jeffreys interval; an axis with no answer within its
    classes (CLIP on the synthetic skin tones) reads one sentence rather than "n/a [n/a, n/a]"."""
    engine = Engine("synthetic", data_dir=data_dir, vqa="clip_vqa:synthetic")
    axes = _run(engine, ["gender", "skin tone"], [])[-1].results["axes"]
    tone = axes["skin tone"]
    assert tone["n"] == 0 and tone["cant_tell"] == 16 and tone["cant_tell_ci"][0] > 0.75
    html = str(axis_html("skin tone", tone))
    assert "n/a [n/a, n/a]" not in html and 'class="gl-nothing-answered"' in html
    assert "No image was answered within the classes (16 \"can't tell\")" in html
    rows = json.loads(_spec(html))["data"]["values"]
    bar = next(r for r in rows if r["label"] == CANT_TELL)
    assert bar["low"] == pytest.approx(tone["cant_tell_ci"][0]) and bar["high"] == 1.0
    gender = str(axis_html("gender", axes["gender"]))
    assert 'class="gl-nothing-answered"' not in gender and "Composite Bias Score" in gender


def _spec(html: str) -> str:
    import html as markup

    return markup.unescape(html.split('data-spec="')[1].split('"')[0])


def test_the_heatmap_leaves_its_long_row_labels_room_for_the_axis_title():
    """Item 11: Vega caps an axis' label room at 200 px by default, so the y title of the gap heatmap
    (labels up to 320 px) was drawn over them; the browser test measures it on the page."""
    spec = json.loads(_spec(str(charts.heatmap([[0.1]], ["a" * 60], ["seed 0"], row_title="LLM text variation"))))
    y = spec["layer"][0]["encoding"]["y"]["axis"]
    assert y["maxExtent"] >= y["labelLimit"]
