"""Issue 28 below the browser: an optional setting left empty is "not set" and says what that
means; the checks a run makes can be made before it starts (a tab's check step); settings that
change the analysis unexpectedly are said with the result, beside the number."""
from __future__ import annotations

import subprocess
import sys

import pytest

import tiny_models
from engine.core.engine import Engine
from engine.common.errors import InputError
from engine.common.events import Warning
from engine.methods import intersectional, single_prompt
from engine.methods.generate import GenerateRequest, run as generate
from engine.report import intersectional as report
from runhelpers import done_event

AXES = {"gender": ["a photo of a male doctor", "a photo of a female doctor"],
        "age": ["a photo of a young doctor", "a photo of an old doctor"]}


def test_a_request_is_checked_before_its_run_starts_and_nothing_is_stored(engine):
    preflight = single_prompt.run.preflight
    with pytest.raises(InputError, match=r"steps must be between 1 and 150 for the preset 'synthetic'; got 0"):
        preflight(single_prompt.SinglePromptRequest("a photo of a doctor", steps=0), engine)
    with pytest.raises(InputError, match="the prompt is empty"):
        preflight(single_prompt.SinglePromptRequest("  "), engine)
    with pytest.raises(InputError, match=r"the p threshold must be between 0 and 1; got 2"):
        intersectional.run.preflight(intersectional.IntersectionalRequest("a photo of a doctor", axes=AXES,
                                                                          p_threshold=2), engine)
    preflight(single_prompt.SinglePromptRequest("a photo of a doctor", steps=None, guidance=None), engine)
    assert engine.store.count("runs") == 0 and engine.store.count("images") == 0


def notes_of(events) -> list[str]:
    return [e.message for e in events if isinstance(e, Warning)]


@pytest.mark.real_model
def test_few_steps_or_no_guidance_on_a_model_made_for_more_is_said_with_the_result(tiny_root, data_dir):
    engine = Engine("synthetic", data_dir=data_dir, generator=tiny_models.build_tiny_sd(tiny_root))
    defaults = engine.default_settings()           # Stable Diffusion 1.x: 30 steps, guidance 7.5
    assert (defaults.steps, defaults.guidance) == (30, 7.5)
    few = notes_of(generate(GenerateRequest("a photo of a doctor", n=1, steps=1, guidance=0.0), engine))
    assert any(n.startswith("steps = 1, at most a quarter of this model's default of 30") for n in few), few
    assert any(n.startswith("guidance = 0 turns classifier-free guidance off") for n in few), few
    enough = notes_of(generate(GenerateRequest("a photo of a doctor", n=1, steps=8, guidance=2.0), engine))
    assert not any(n.startswith(("steps =", "guidance =")) for n in enough), enough


def test_the_synthetic_worlds_own_one_step_is_no_surprise(engine):
    notes = notes_of(generate(GenerateRequest("a photo of a doctor", n=2), engine))
    assert not any(n.startswith(("steps =", "guidance =")) for n in notes)


def test_a_p_threshold_of_zero_keeps_no_edge_and_the_summary_says_so_beside_it(engine):
    request = intersectional.IntersectionalRequest("a photo of a doctor", axes=AXES, n=8, n_boot=0, p_threshold=0)
    results = done_event(list(intersectional.run(request, engine))).results
    assert results["p_threshold"] == 0 and results["kept_edges"] == []
    summary = str(report.summary_html(results))
    note = "Note: p &lt; 0 keeps no edge: no p-value is below it (the prompt level&#39;s threshold is 0.0001)."
    assert f"χ² p &lt; 0).{' '}<b class=\"gl-threshold-note\" id=\"ic-threshold-note\">{note}</b>" in summary
    loose = dict(results, p_threshold=1.0)
    assert "the χ² test prunes nothing" in str(report.summary_html(loose))
    assert "ic-threshold-note" not in str(report.summary_html(dict(results, p_threshold=1e-4)))


@pytest.mark.slow
def test_the_thresholds_an_empty_field_means_come_from_the_method_as_in_the_cli():
    from tabs.intersectional import threshold_defaults

    assert intersectional.default_thresholds("aggregated") == {"aggregated": (5e-5, 0.03)}
    assert threshold_defaults("prompt") == ("0.0001, the prompt level's", "0, the prompt level's")
    assert threshold_defaults("auto") == ("0.0001 for one prompt, 5e-05 with fill values",
                                          "0 for one prompt, 0.03 with fill values")
    help_text = subprocess.run([sys.executable, "-m", "engine", "intersectional", "--help"], capture_output=True,
                               text=True, check=True).stdout
    assert "(default: 0.0001 per prompt, 5e-05 aggregated)" in " ".join(help_text.split())


def test_the_placeholders_follow_the_model_without_loading_one(engine):
    import gradio as gr

    from tabs.optional import generation_fields

    with gr.Blocks():
        hook = generation_fields("t", ("steps", "guidance", "width")).hook(engine)
    assert [u["placeholder"] for u in hook.after_model_change()] == ["empty: the model's default"] * 3
    assert not engine.generator_loaded()              # a model change loads nothing for a placeholder
    assert [u["placeholder"] for u in hook.fn()] == ["empty: 1, the model's default", "empty: 0, the model's default",
                                                     "empty: 128, the model's default"]
    assert all("value" not in u for u in hook.fn())   # a value typed meanwhile is kept
