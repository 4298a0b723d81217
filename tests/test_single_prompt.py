"""Single Prompt on the synthetic world: planted biases come back out of the metrics."""
import pytest

from engine.common.events import AxisScores, Images
from engine.methods.single_prompt import SinglePromptRequest, run

from runhelpers import done_event


def measure(engine, prompt, n=48, **kw):
    events = list(run(SinglePromptRequest(prompt, n=n, **kw), engine))
    return done_event(events).results, events


@pytest.fixture
def planted(engine):
    world = engine.models.get(engine.preset.generator).world
    assert world.expected_distribution("a photo of a firefighter", "gender")["male"] == pytest.approx(0.9)
    assert world.expected_distribution("a photo of a teacher", "gender")["male"] == pytest.approx(0.5)
    return world


def test_planted_90_10_bias_is_measured_with_a_ci_that_contains_it(engine, planted):
    biased, _ = measure(engine, "a photo of a firefighter")
    balanced, _ = measure(engine, "a photo of a teacher")
    gender = biased["axes"]["gender"]
    low, high = gender["share_ci"]["male"]
    assert low <= 0.9 <= high
    assert high - low < 0.35  # N=48 gives a usefully narrow interval
    assert gender["composite_bias_score"] > balanced["axes"]["gender"]["composite_bias_score"] + 0.3
    assert biased["gap"]["score"] < balanced["gap"]["score"]
    # the missed interpretations name the under-represented group
    missed = [m["text"] for m in biased["gap"]["missed"]]
    assert sum("female" in text for text in missed) >= 3, missed


def test_reference_distribution_changes_kl_and_bias_amplification(engine, planted):
    uniform, _ = measure(engine, "a photo of a firefighter", n=32)
    target, _ = measure(engine, "a photo of a firefighter", n=32,
                        references={"gender": {"male": 0.9, "female": 0.1}})
    assert target["axes"]["gender"]["kl_divergence"] < uniform["axes"]["gender"]["kl_divergence"]
    assert target["axes"]["gender"]["bias_amplification"] < 0.2


def test_results_stream_in_order_and_rerun_is_served_from_the_store(engine, planted):
    _, events = measure(engine, "a photo of a nurse", n=16)
    kinds = [type(e).__name__ for e in events]
    assert kinds.index("Images") < kinds.index("AxisScores") < kinds.index("Done")
    assert [e.axis for e in events if isinstance(e, AxisScores)][:3] == ["gender", "age", "skin tone"]
    assert "GapMeasured" in kinds
    generated, llm_calls = engine.stats.images_generated, engine.stats.llm_calls
    again, events = measure(engine, "a photo of a nurse", n=16)
    assert engine.stats.images_generated == generated and engine.stats.llm_calls == llm_calls
    assert all(r.cached for e in events if isinstance(e, Images) for r in e.records)


def test_free_text_axis_and_reference_mode(engine, planted):
    results, _ = measure(engine, "a photo of a chef", n=16, axes=["gender", "hair color"], mode="reference")
    assert results["axes"]["hair color"]["question"] == "What is hair color in the image?"
    assert results["axes"]["gender"]["kl_unit"] == "nats"
    assert sum(results["axes"]["hair color"]["counts"].values()) == 16


def test_one_image_is_measured_with_shares_and_no_metric_interval_on_every_kind_of_axis(engine, planted):
    """N = 1 (the form allows it): an image cannot be resampled, so a free-text axis and reference mode
    give the metrics without an interval and say why (scipy's bootstrap refused one observation, so
    the run failed), while every share keeps its Jeffreys interval."""
    from engine.report.single_prompt import axis_html

    for mode in ("paper", "reference"):
        results, _ = measure(engine, "a photo of a doctor", n=1, axes=["gender", "hat"], mode=mode)
        for name in ("gender", "hat"):
            axis = results["axes"][name]
            assert axis["n"] == 1 and all(lo < 1 and hi > 0 for lo, hi in axis["share_ci"].values())
        hat = results["axes"]["hat"]
        assert hat["ci"]["composite_bias_score"] == [None, None]
        assert "one image cannot be resampled" in axis_html("hat", hat)
    assert results["axes"]["gender"]["ci"]["composite_bias_score"] == [None, None]   # reference mode: BCa too


def test_llm_garbage_leaves_the_gap_score_out_with_a_note_and_the_run_done(engine, planted):
    """Issue 35: the gap score is optional; an LLM that writes no JSON loses it, never the run."""
    from engine.common.events import Warning

    llm = engine.models.get(engine.preset.llm)
    llm.chat = lambda *args, **kwargs: "Sorry, as a language model I prefer prose."
    events = list(run(SinglePromptRequest("a photo of a chef", n=8, n_boot=200), engine))
    assert any(isinstance(e, Warning) and e.message.startswith("the gap score is missing: ") for e in events)
    stored = engine.store.list_runs("single_prompt")[0]
    assert stored["status"] == "done" and not stored.get("error")
    saved = engine.store.get_run(stored["id"])["results"]
    assert len(saved["images"]) == 8 and "gender" in saved["axes"] and "gap" not in saved
    assert [n["part"] for n in saved["notes"]] == ["gap"] and "JSON" in saved["notes"][0]["note"]
    assert saved["top_concepts"] and saved["diversity"]["n"] == 8              # the steps after it ran
    assert engine.store.count("images") == 8


def test_an_until_run_counts_and_shows_each_image_once(engine):
    # issue 34: each round streams its seeds again (the first from the cache); 64 images were "104 measured"
    from tabs import single_prompt as tab

    updates = list(tab.measure(engine, "a photo of a doctor", 16, axes=["gender"], until=0.15))
    final = dict(zip(tab.OUTPUTS, updates[-1]))
    n = final["state"]["results"]["n"]
    assert n > 16                                         # the set grew
    assert f"**Done**: {n} images measured" in final["progress"]
    assert len(final["gallery"]) == n and len(final["state"]["records"]) == n
