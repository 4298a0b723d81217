"""Issue 35 in headless Chromium: Single Prompt with a second evaluator typed in the tab. The run's
evaluator (the synthetic VQA with 30% planted errors) and CLIP zero-shot over the synthetic embedder
answer every axis; under the distributions (each with its "can't tell" bar) their agreement and
Cohen's κ, the distribution where they agree, and the images where they disagree with both answers."""
import pytest

from apphelpers import browser_page, running_app, screenshot
from engine.backends.base import ModelSpec
from engine.core.engine import Engine
from engine.models.presets import SYNTHETIC_TABLE

pytestmark = pytest.mark.browser


def test_two_evaluators_in_the_single_prompt_tab(data_dir):
    engine = Engine("synthetic", data_dir=data_dir, vqa=ModelSpec("synthetic_vqa", SYNTHETIC_TABLE, {"error": 0.3}))
    with running_app(engine) as url, browser_page() as page:
        page.goto(url, wait_until="load")
        page.fill("#sp-prompt textarea", "a photo of a doctor")
        page.locator("#sp-n input[type='number']").fill("24")
        page.locator("#sp-n input[type='number']").press("Enter")
        page.fill("#sp-evaluators-pick textarea", "clip_vqa:synthetic")
        page.click("#sp-generate")
        page.wait_for_function("document.querySelector('#sp-progress').innerText.includes('Done')", timeout=90_000)
        gender = "#sp-axes #sp-evaluators .gl-trust-axis[data-axis='gender']"
        page.wait_for_selector(gender, timeout=30_000)
        text = page.inner_text(gender)
        assert "N = 24 images" in text and "Cohen's κ" in text and "Where they agree" in text
        kappa = page.inner_text(f"{gender} [data-metric='kappa']").split()[0]
        assert -1 <= float(kappa) < 0.95                                # the planted errors: far from 1
        figures = page.locator(f"{gender} .gl-disagreement")
        assert figures.count() >= 1
        first = figures.nth(0)
        assert first.locator("img").count() == 1                        # the image itself
        answers = first.locator(".gl-answer")
        assert answers.count() == 2 and "clip_vqa:synthetic:" in answers.nth(1).inner_text()
        assert answers.nth(0).inner_text().split(": ")[-1] != answers.nth(1).inner_text().split(": ")[-1]
        # every distribution has its "can't tell" bar, apart from the classes
        chart = "#sp-axes .gl-vega[data-chart='axis-gender'] svg"
        page.wait_for_selector(chart, timeout=30_000)                   # drawn by the Vega runtime
        assert "can't tell" in page.locator(chart).text_content()
        screenshot(page, "two_evaluators")

        run = engine.store.list_runs("single_prompt")[0]
        compared = engine.store.get_run(run["id"])["results"]["evaluators"]["axes"]["gender"]
        assert len(compared["disagreements"]) == figures.count() and compared["kappa_method"] == "Cohen"
        assert f"{compared['kappa']:.3f}" == kappa
