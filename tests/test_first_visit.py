"""Issue 17 (a first visit without contradictions): the engine-side fixes, one test each."""
from __future__ import annotations

import pytest

from engine.core.engine import Engine
from engine.common.errors import InputError
from engine.common.events import Done
from engine.methods import counterfactuals, generate, single_prompt


@pytest.fixture
def engine(tmp_path):
    return Engine("synthetic", data_dir=str(tmp_path / "store"))


def finish(events):
    for event in events:
        if isinstance(event, Done):
            return event
    raise AssertionError("no Done event")


def test_bad_input_creates_no_run(engine):
    for method, request in [(single_prompt.run, single_prompt.SinglePromptRequest(prompt="  ")),
                            (single_prompt.run, single_prompt.SinglePromptRequest(prompt="a cat", n=0)),
                            (generate.run, generate.GenerateRequest(prompt="")),
                            (counterfactuals.run, counterfactuals.CounterfactualsRequest(prompt=""))]:
        with pytest.raises(InputError):
            list(method(request, engine))
    assert engine.store.count("runs") == 0


def test_a_consumer_closing_after_done_leaves_the_run_done(engine):
    events = single_prompt.run(single_prompt.SinglePromptRequest(prompt="a photo of a doctor", n=4, n_boot=100,
                                                                 gap=False), engine)
    done = finish(events)
    events.close()
    assert engine.store.get_run(done.run_id)["status"] == "done"


def test_regenerate_after_the_image_was_deleted_says_missing(engine):
    done = finish(generate.run(generate.GenerateRequest(prompt="a photo of a nurse", n=2), engine))
    record = engine.store.get_run(done.run_id)
    settings = engine.default_settings()
    from engine.store.store import image_key
    key = image_key(engine.model_id("generator"), "a photo of a nurse", 1, settings)
    assert engine.regenerate_check("a photo of a nurse", 1, settings, key) == (True, 0)
    calls = engine.stats.generator_calls
    engine.store.delete_run(record["id"])
    assert engine.regenerate_check("a photo of a nurse", 1, settings, key) == (False, None)
    assert engine.stats.generator_calls == calls      # nothing generated for a comparison that cannot be made


def test_readable_names_in_headlines():
    from engine.common.names import readable
    from engine.runs.history import headline

    assert readable("tau_initial") == "τ before" and readable("mad_environment") == "MAD (environment)"
    assert readable("composite_bias_score") == "Composite Bias Score" and readable("cbs_skin tone").endswith("(skin tone)")
    assert readable("prompts_scored") == "prompts scored" and readable("kl_divergence").startswith("KL divergence")
    text, value = headline({"method": "mitigate", "summary": {"axes": 2, "tau_initial": 0.385, "tau_final": 0.1}})
    assert "τ 0.385" in text and "tau_" not in text
    text, _ = headline({"method": "counterfactuals", "summary": {"prompts": 1, "mad_environment": 0.322}})
    assert "MAD 0.322 (environment)" in text and "mad_" not in text
    text, _ = headline({"method": "something_new", "summary": {"prompts_scored": 12, "tau_initial": 0.5}})
    assert text == "prompts scored 12 · τ before 0.5"          # no method headline: readable keys


def test_gap_score_labels_agree_with_the_numbers():
    from engine.report.single_prompt import gap_html, gap_reading

    gap = {"score": -0.0952, "coverage_term": 0.7074, "alignment_term": 0.8027, "combine": "diff", "alpha": 25,
           "least_aligned": [{"seed": 1, "alignment": 1.0, "key": "k"}], "missed": [], "variations": ["a"],
           "coverage": [0.7], "similarity": [[0.7]], "image_seeds": [1]}
    reading = gap_reading(gap)
    assert "−0.0952" in reading["score"] or "-0.0952" in reading["score"]
    assert "a sign of bias" in reading["score"] and "Even these match" in reading["least"]
    page = str(gap_html(gap))
    assert "best match 1.000" in page and "1 = a perfect match" in page
    assert "no sign" in gap_reading({**gap, "score": 0.01})["score"]


def test_missed_interpretations_are_listed_once():
    from engine.methods.measure import missed_readings

    missed = missed_readings(["green rose outdoors", "red rose", "green rose outdoors", "white rose", "a rose"],
                             [0.2, 0.9, 0.2, 0.5, 0.8], k=3)
    assert [m["text"] for m in missed] == ["green rose outdoors", "white rose", "a rose"]
    assert missed[0]["times"] == 2 and missed[1]["times"] == 1


def test_chart_axis_does_not_magnify_a_tiny_change():
    from engine.report.charts import value_range

    lo, hi = value_range([-0.676, -0.675], min_span=0.05)
    assert hi - lo == pytest.approx(0.05) and lo < -0.676 and hi > -0.675
    assert value_range([0.0, 1.0], 0.05) == (0.0, 1.0) and value_range([2.0, 2.0]) == (1.5, 2.5)
    from engine.report.mine import mine_chart

    from engine.report.charts import spec_in

    spec = spec_in(mine_chart({"best_per_iteration": [-0.675, -0.676], "best_so_far": [-0.675, -0.676]}))
    low, high = spec["encoding"]["y"]["scale"]["domain"]
    assert high - low == pytest.approx(0.05, abs=0.002)   # not −0.675 … −0.676


def test_missing_wordnet_is_said_beside_the_option(tmp_path):
    from engine.metrics.wordnet import DEFAULT_WORDNET_DIR, missing_note

    note = missing_note(str(tmp_path))
    assert "WordNet is not installed" in note and "wordnet-base" in note
    assert missing_note(DEFAULT_WORDNET_DIR) == ""        # CI installs wordnet-base


def test_readme_set_up_is_two_commands_and_the_second_is_what_ci_runs():
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    readme = (root / "README.md").read_text()
    block = re.search(r"## Set up, run, test\s+```sh\n(.*?)```", readme, re.S).group(1)
    commands = [line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]
    assert len(commands) == 2 and commands[1] == "bash .ci/run"       # one installs and starts, one tests
    assert commands[0].startswith("pip install -r requirements.txt") and commands[0].endswith("&& python app.py")
    assert "wordnet-base" in readme.split("## Presets")[0]
    script = (root / ".ci" / "run").read_text()
    assert "requirements-test.txt" in script and "chromium" in script and "wordnet-base" in script
    assert 'python -m pytest "${pytest_args[@]}" "$@"' in script and "pytest_args=(-q -n " in script


def test_mine_status_line_says_why_a_search_ended_early():
    from engine.report.mine import progress_text as _progress_text

    results = {"params": {"T": 30}, "iterations": [{}] * 13, "archive": [],
               "end_reason": "the LLM gave no new prompt at iteration 14 of 30"}
    line = str(_progress_text(results, "run-1", "Done"))
    assert "13</span> of 30" in line and "Ended early: the LLM gave no new prompt at iteration 14 of 30" in line
    assert "Ended early" not in str(_progress_text({**results, "end_reason": None}, "run-1", "Done"))


def test_sample_captions_say_which_prompt_not_a_photo_of():
    from types import SimpleNamespace as R

    from tabs.common import distinct_captions

    shown = [R(prompt="a photo of a female doctor", seed=1), R(prompt="a photo of an old male doctor", seed=2)]
    assert distinct_captions(shown) == ["seed 1: a female doctor", "seed 2: an old male doctor"]
    assert distinct_captions([R(prompt="a photo of a doctor", seed=3)] * 2) == ["seed 3", "seed 3"]


@pytest.mark.slow
def test_a_search_that_runs_out_of_prompts_records_why(engine):
    from engine.methods import mine

    r = mine.search(mine.MineRequest(iterations=30, population=8, select=2, mutations=3, n=4, n_variations=4), engine)
    assert len(r["iterations"]) < 30
    assert r["end_reason"] == f"the LLM gave no new prompt at iteration {len(r['iterations']) + 1} of 30"


def test_bad_intersectional_settings_create_no_run(engine):
    from engine.methods import intersectional

    axes = {"gender": ["a photo of a male doctor", "a photo of a female doctor"]}
    for bad in ({"other_policy": "guess"}, {"level": "galaxy"}):
        with pytest.raises(InputError):
            list(intersectional.run(intersectional.IntersectionalRequest("a photo of a doctor", axes=axes, **bad),
                                    engine))
    assert engine.store.count("runs") == 0


def test_an_empty_mitigate_prompt_creates_no_run(engine):
    from engine.methods import mitigate

    with pytest.raises(InputError, match="empty"):
        list(mitigate.run(mitigate.MitigateRequest(prompt=" "), engine))
    assert engine.store.count("runs") == 0
