"""Issue 34 in headless Chromium at 1440×900 on the synthetic world (one app for the module): the
charts are drawn by the Vega runtime (SVG marks, a tooltip on hover), Single Prompt at N = 32 fits
in 4,500 px, every metric says what it means, the "CAS and MAD as in" switch rescores the shown
run without a new run, Compare models starts with the running preset ticked, and Mitigate's
example fills the axes and a priority typed above its maximum is clamped with a note."""
from __future__ import annotations

import re

import pytest

from apphelpers import browser_page, chart_rows, drawn, running_app, screenshot

pytestmark = pytest.mark.browser
# every wait is on state; the bound only ends a hung test, and a loaded 2-core CI machine needs minutes
LONG = 180_000
WIDTH, HEIGHT = 1440, 900


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    from engine.core.engine import Engine

    engine = Engine("synthetic", data_dir=str(tmp_path_factory.mktemp("store")), max_images=256)
    with running_app(engine) as url:
        yield url, engine


def set_number(page, selector: str, value) -> None:
    field = page.locator(f"{selector} input[type='number']")
    field.fill(str(value))
    field.press("Enter")


def wait_text(page, selector: str, words: str, timeout: int = LONG) -> None:
    page.wait_for_function("([s, w]) => (document.querySelector(s) || {innerText: ''}).innerText.includes(w)",
                           arg=[selector, words], timeout=timeout)


def run_id(page, selector: str) -> str:
    return re.search(r"run (\d{8}-\d{6}-[0-9a-f]+)", page.inner_text(selector)).group(1)


def test_single_prompt_at_n32_fits_and_its_charts_draw_with_hover_and_meanings(app):
    url, engine = app
    with browser_page(WIDTH, HEIGHT) as page:
        page.goto(url, wait_until="load")
        page.fill("#sp-prompt textarea", "a photo of a doctor")
        set_number(page, "#sp-n", 32)
        page.click("#sp-generate")
        wait_text(page, "#sp-progress", "Done")
        page.wait_for_selector(drawn("gap-heatmap"), timeout=LONG)
        for axis in ("gender", "age", "skin tone"):
            page.wait_for_selector(drawn(f"axis-{axis}"), timeout=LONG)
            assert page.locator(f".gl-vega[data-chart='axis-{axis}'] .mark-rect.role-mark path").count() >= 2
        cells = page.locator("#gap-heatmap .mark-rect.role-mark path")
        variations = len({r["row"] for r in chart_rows(page, "gap-heatmap")})
        assert cells.count() == variations * 32                          # every variation × every image
        heat = page.locator("#gap-heatmap svg").bounding_box()
        assert heat["height"] < HEIGHT and heat["width"] < WIDTH            # the 32-image heatmap fits one screen
        assert page.locator("#gap-heatmap .role-legend").count() == 1      # with its colour scale
        cells.nth(40).hover(force=True)
        page.wait_for_selector("#vg-tooltip-element.visible", timeout=10_000)
        assert "similarity" in page.inner_text("#vg-tooltip-element")
        # every metric shown says what it measures, its direction and range
        meanings = page.inner_text("#sp-meanings")
        for name in ("Composite Bias Score", "Parity difference", "Normalised entropy", "KL from reference",
                     "Bias amplification"):
            assert name in meanings
        assert "Higher = FAIRER" in meanings and "range 0 (one class only) to 1" in meanings
        assert page.locator("#gap-panel [data-metric='gap_score']").count() == 1
        assert "effective number of distinct images" in page.inner_text("#sp-diversity")
        height = page.evaluate("document.documentElement.scrollHeight")
        screenshot(page, "after_single_prompt_n32")
        assert height < 4500, height


def test_the_mode_switch_rescores_the_shown_run_without_a_new_run(app):
    url, engine = app
    with browser_page(WIDTH, HEIGHT) as page:
        page.goto(url, wait_until="load")
        page.get_by_role("tab", name="Counterfactuals").click()
        page.fill("#cf-prompt textarea", "a photo of a firefighter")
        page.click("#cf-propose")
        page.wait_for_function("document.querySelector('#cf-axes').innerText.includes('gender')", timeout=LONG)
        set_number(page, "#cf-n", 8)
        mode = page.locator("#cf-mode")
        assert mode.is_visible()                                            # beside the results, not in an accordion
        page.click("#cf-run")
        wait_text(page, "#cf-progress", "Done", timeout=120_000)
        page.wait_for_selector(drawn("mad"), timeout=LONG)
        shown = run_id(page, "#cf-progress")
        runs = engine.store.list_runs("counterfactuals")
        stored = engine.store.get_run(shown)["results"]
        assert [r["value"] for r in chart_rows(page, "mad")] == [stored["mad"][a] for a in stored["mad_order"]]

        mode.get_by_text("reference", exact=True).click()
        page.wait_for_selector("#cf-rescored", timeout=LONG)
        page.wait_for_selector(drawn("mad"), timeout=LONG)
        reference = stored["modes"]["reference"]
        assert [(r["label"], r["value"]) for r in chart_rows(page, "mad")] == [
            (a, reference["mad"][a]) for a in reference["mad_order"]]
        assert "reference mode" in page.inner_text("#cf-mad")
        assert engine.store.list_runs("counterfactuals") == runs and run_id(page, "#cf-progress") == shown
        assert "MAD" in page.inner_text("#cf-meanings") and "CAS" in page.inner_text("#cf-meanings")
        screenshot(page, "after_counterfactuals_reference_mode")

        mode.get_by_text("paper", exact=True).click()                        # and back
        page.wait_for_function("!document.querySelector('#cf-rescored')", timeout=LONG)
        page.wait_for_selector(drawn("mad"), timeout=LONG)
        assert [r["value"] for r in chart_rows(page, "mad")] == [stored["mad"][a] for a in stored["mad_order"]]


def test_compare_models_ticks_the_running_preset_and_mitigate_says_when_it_clamps(app):
    url, engine = app
    with browser_page(WIDTH, HEIGHT) as page:
        page.goto(url, wait_until="load")
        page.get_by_role("tab", name="Compare models").click()
        ticked = page.locator("#cm-presets input:checked")
        page.wait_for_function("document.querySelectorAll('#cm-presets input:checked').length == 1", timeout=LONG)
        assert ticked.locator("xpath=..").inner_text().strip() == engine.preset.name

        page.get_by_role("tab", name="Mitigate").click()
        page.get_by_text("a photo of a librarian", exact=True).first.click()   # an example fills the axes too
        page.wait_for_function("document.querySelector('#mt-axes').innerText.includes('female librarian')",
                               timeout=LONG)
        wait_text(page, "#mt-weights", "age")
        page.get_by_text("Priority and target D* of each axis").click()
        page.wait_for_selector("#mt-axis-1", state="visible", timeout=LONG)
        set_number(page, "#mt-priority-0", 5)
        wait_text(page, "#mt-clamped", "gender's priority 5 is above its maximum 1, so 1 is used")
        page.wait_for_function("document.querySelector('#mt-priority-0 input[type=number]').value == '1'", timeout=LONG)
        wait_text(page, "#mt-weights", "gender 0.67 · age 0.33")            # 1 and 0.5, normalised
        assert "Error" not in page.inner_text("#mt-weights") and "so 1 is used" in page.inner_text("#mt-clamped")
