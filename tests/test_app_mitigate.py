"""The Mitigate tab as users drive it: gradio_client for the API (preview, then a run served
from the store, the JSON export), headless Chromium for the page (a priority slider moves the
normalised weights live; a run on the synthetic preset draws the step bars)."""
import json
from pathlib import Path

import pytest

from apphelpers import browser_page, drawn, running_app, screenshot

AXES = {"gender": ["a photo of a male doctor", "a photo of a female doctor"],
        "age": ["a photo of a young doctor", "a photo of a middle-aged doctor", "a photo of an old doctor"]}
ROWS = [[axis, cf] for axis, cfs in AXES.items() for cf in cfs]


def form(n=24, epsilon=0.35):
    """The endpoint's inputs by name; the slots (priority_i, mode_i, shares_i) follow the table's axes."""
    return dict(prompt="a photo of a doctor", table={"headers": ["axis", "counterfactual"], "data": ROWS},
                axes_to_mitigate=["gender", "age"], n=n, seed=1, epsilon=epsilon, n_boot=100, priority_0=0.7, priority_1=0.3,
                mode_1="typed percentages", shares_1="young=30, middle-aged=40, old=30")


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """One app for the module (building and launching it is the slow part)."""
    from engine.core.engine import Engine

    engine = Engine("synthetic", data_dir=str(tmp_path_factory.mktemp("store")), max_images=256)
    with running_app(engine) as url:
        yield url, engine


@pytest.mark.slow
def test_api_previews_then_mitigates_from_the_store_and_exports_the_prompt_set(app):
    from gradio_client import Client

    app_url, engine = app
    client = Client(app_url, verbose=False, download_files=False)
    progress, preview, view, *_ = client.predict(**form(), api_name="/mitigate_preview")
    assert "Preview done (nothing mitigated yet)" in progress and "mt-preview" in preview
    assert 'gl-mit-step' not in view  # no step was taken
    assert "<td>gender</td>" in preview                        # predicted first step
    generated = engine.stats.images_generated
    progress, preview, view, gallery, export, _ = client.predict(**form(), api_name="/mitigate")
    assert engine.stats.images_generated == generated          # step 0 and the gender sets came from the store
    assert "Done" in progress and "reached" in progress
    assert 'data-chart="mitigate-step-1-after"' in view and "mt-report" in view and gallery
    prompt_set = json.loads(Path(export["path"] if isinstance(export, dict) else export).read_text())
    assert [p["values"] for p in prompt_set["prompts"]] == [{"gender": "male"}, {"gender": "female"}]
    assert prompt_set["ideals"]["age"] == pytest.approx({"young": 0.3, "middle-aged": 0.4, "old": 0.3})


@pytest.mark.browser
def test_mitigate_page_priorities_normalise_live_and_a_run_draws_step_bars(app):
    from engine.methods import intersectional

    app_url, engine = app
    list(intersectional.run(intersectional.IntersectionalRequest(
        "a photo of a doctor", axes=AXES, n=8, seed=1, n_boot=0, ideals={"age": {"young": 30, "middle-aged": 40, "old": 30}}),
        engine))
    with browser_page() as page:
        page.goto(app_url, wait_until="load")
        page.get_by_role("tab", name="Mitigate").click()
        page.click("#mt-from-ic")                           # prompt, axes and targets of that run
        page.wait_for_function("document.querySelector('#mt-weights').innerText.includes('age')", timeout=60_000)
        page.get_by_text("Priority and target D* of each axis").click()   # the per-axis group opens
        page.wait_for_selector("#mt-axis-1", state="visible", timeout=60_000)
        assert not page.locator("#mt-axis-2").is_visible()
        assert "young=30" in page.locator("#mt-shares-1 textarea, #mt-shares-1 input").first.input_value()
        weights = page.locator("#mt-weights")
        page.wait_for_function("document.querySelector('#mt-weights').innerText.includes('gender 0.50')",
                               timeout=30_000)
        page.locator("#mt-priority-0 input[type=range]").fill("0.7")
        page.locator("#mt-priority-1 input[type=range]").fill("0.3")
        page.wait_for_function("document.querySelector('#mt-weights').innerText.includes('gender 0.70')",
                               timeout=30_000)
        assert "age 0.30" in weights.inner_text()
        page.click("#mt-preview-btn")
        page.wait_for_selector("#mt-preview tr[data-axis]", timeout=120_000)
        page.click("#mt-run")
        page.wait_for_selector(drawn("mitigate-step-1-after"), timeout=120_000)
        page.wait_for_function("document.querySelector('#mt-progress').innerText.includes('Done')", timeout=120_000)
        first = page.locator("#mt-view .gl-mit-step").first.get_attribute("data-axis")
        assert first == page.locator("#mt-preview tr[data-axis]").first.get_attribute("data-axis")
        assert page.locator("#mt-report .gl-mit-axis").count() == 2
        assert page.locator("#mt-export a").count() >= 1
        screenshot(page, "mitigate")
