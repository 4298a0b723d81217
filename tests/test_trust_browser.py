"""The spot-check flow in headless Chromium (issue 16): open a run in the Runs tab, "Check the
labels", answer image by image with a button and with the keys 1–9 / 0, and see the answers
stored with the run (who) and the evaluator check with the corrected distribution."""
import pytest

from apphelpers import browser_page, open_in_runs_tab, running_app, screenshot
from engine.backends.base import ModelSpec
from engine.core.engine import Engine
from engine.common.events import Done
from engine.methods import single_prompt
from engine.models.presets import SYNTHETIC_TABLE

pytestmark = pytest.mark.browser


def test_spot_check_flow_with_buttons_and_keys(data_dir):
    # an evaluator with a planted 30% error, so the check has something to find
    engine = Engine("synthetic", data_dir=data_dir, vqa=ModelSpec("synthetic_vqa", SYNTHETIC_TABLE, {"error": 0.3}))
    request = single_prompt.SinglePromptRequest("a photo of a firefighter", n=24, axes=["gender", "age"], gap=False,
                                                n_boot=100, cant_tell_below=0)   # the check measures every answer
    run_id = [e for e in single_prompt.run(request, engine) if isinstance(e, Done)][0].run_id
    with running_app(engine) as url, browser_page() as page:
        page.goto(url, wait_until="load")
        open_in_runs_tab(page, "firefighter", "a photo of a firefighter", "#runs-view .gl-vega[data-chart='axis-gender']")
        # the view states the N and how many images a ±0.1 interval needs, and how sure its headline is
        assert page.locator("#runs-view .gl-trust-n [data-need='width']").count() == 2
        assert page.locator("#runs-view .gl-headline").count() == 1

        page.locator("#runs-spot-panel").get_by_text("Check the labels (spot-check").click()
        page.fill("#runs-spot-who textarea", "Ada <b>")
        page.locator("#runs-spot-size input[type='number']").fill("5")
        page.locator("#runs-spot-size input[type='number']").press("Enter")
        page.click("#runs-spot-start")
        page.wait_for_selector("#runs-spot-item[data-position='1']", timeout=30_000)
        assert "What is the gender" in page.inner_text("#runs-spot-question")
        assert page.locator("#runs-spot-image img").count() == 1
        assert page.locator("#runs-spot-answer-1").inner_text().strip() == "1 · male"
        assert not page.locator("#runs-spot-answer-3").is_visible()
        shown = page.get_attribute("#runs-spot-item", "data-key")

        page.click("#runs-spot-answer-1")                  # a button: male
        page.wait_for_selector("#runs-spot-item[data-position='2']", timeout=30_000)
        # typing a digit in a text box is text, not an answer
        page.locator("#runs-spot-who textarea").press("2")
        assert page.get_attribute("#runs-spot-item", "data-position") == "2"
        page.locator("#runs-spot-image").click()            # focus away from the text box
        for position, key in ((3, "2"), (4, "1"), (5, "0")):
            page.keyboard.press(key)
            page.wait_for_selector(f"#runs-spot-item[data-position='{position}']", timeout=30_000)
        page.keyboard.press("1")
        page.wait_for_selector("#runs-spot-item[data-done='1']", timeout=30_000)
        page.wait_for_selector("#runs-spot-validation .gl-trust-axis[data-axis='gender'] .gl-corrected",
                               timeout=30_000)
        check = page.inner_text("#runs-spot-validation")
        assert "Cohen's κ" in check and "4 of 24 images checked" in check and "1 \"can't tell\"" in check
        assert page.locator("#runs-spot-validation [data-metric='corrected']").count() == 2
        screenshot(page, "spot_check")

        rows = engine.store.label_rows(run_id)
        assert len(rows) == 5 and {r["who"] for r in rows} == {"Ada <b>"}  # who is taken when the check starts
        by_key = {r["image_key"]: r["label"] for r in rows}
        assert by_key[shown] == "male"
        assert sorted(by_key.values()) == ["can't tell", "female", "male", "male", "male"]

        # reopening the run shows the corrected distribution beside the raw one
        page.click("#runs-open")
        page.wait_for_selector("#runs-view #trust-validation [data-metric='corrected']", timeout=30_000)
        assert "<b>" not in page.inner_text("#runs-view")  # nothing the researcher typed is markup

        # Single Prompt over the same (cached) images reuses the labels: "corrected" redraws the axes
        page.get_by_role("tab", name="Single Prompt").click()
        page.fill("#sp-prompt textarea", "a photo of a firefighter")
        page.locator("#sp-n input[type='number']").fill("24")
        page.locator("#sp-n input[type='number']").press("Enter")
        page.locator("#sp-spot-panel").get_by_text("Check the labels (spot-check").click()
        page.click("#sp-generate")
        page.wait_for_function("document.querySelector('#sp-progress').innerText.includes('Done')", timeout=60_000)
        page.wait_for_selector("#sp-axes .gl-headline", timeout=30_000)
        page.wait_for_selector("#sp-spot-validation #trust-validation", timeout=30_000)
        page.locator("#sp-distribution").get_by_text("corrected", exact=True).click()
        page.wait_for_function("document.querySelector('#sp-axes').innerText.includes('corrected for the "
                               "evaluator')", timeout=30_000)
        assert page.locator("#sp-axes .gl-vega[data-chart='axis-gender']").count() == 1
