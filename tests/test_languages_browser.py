"""Issue 45 in headless Chromium: the Languages tab proposes translations with their back-translations,
takes an edited prompt (a mistranslation: a nurse for a doctor), runs every language on the same seeds
and draws each language's shares side by side, the paired differences and MAGBIG's metrics; a prompt
set draws the language x occupation heatmap."""
import pytest

from apphelpers import browser_page, chart_rows, drawn, running_app, screenshot
from engine.core.engine import Engine

pytestmark = pytest.mark.browser


def wait_text(page, selector: str, text: str, timeout: int = 90_000) -> None:
    page.wait_for_function("([s, t]) => (document.querySelector(s) || {innerText: ''}).innerText.includes(t)",
                           arg=[selector, text], timeout=timeout)


def test_the_languages_tab_shows_a_mistranslation_and_each_languages_shares(data_dir):
    engine = Engine("synthetic", data_dir=data_dir)
    with running_app(engine) as url, browser_page() as page:
        page.goto(url, wait_until="load")
        page.get_by_role("tab", name="Languages").click()
        page.fill("#lang-prompt textarea", "a photo of a doctor")
        page.locator("#lang-n input[type='number']").fill("32")
        page.locator("#lang-n input[type='number']").press("Enter")
        page.click("#lang-propose")                         # en (reference), de, de-f: the tab's defaults
        wait_text(page, "#lang-table", "a photo of a female doctor")
        assert "Ein Foto von einem Arzt" in page.inner_text("#lang-table")
        # a mistranslation typed over the LLM's German prompt
        page.locator("#lang-table .body-cell").nth(1).dblclick()
        editor = page.locator("#lang-table textarea, #lang-table input[type='text']").first
        editor.fill("ein Foto von einer Krankenschwester")
        editor.press("Enter")
        wait_text(page, "#lang-table", "ein Foto von einer Krankenschwester")
        page.click("#lang-run")
        wait_text(page, "#lang-progress", "Done")
        row = page.locator("#languages-prompts tr[data-code='de']")
        assert "a photo of a female nurse" in row.inner_text() and "edited" in row.inner_text()
        assert "ein Foto von einer Krankenschwester" in page.inner_text("#lang-table")   # what a next run sends
        page.wait_for_selector(drawn("languages-bars-gender"), timeout=30_000)
        run = engine.store.list_runs("languages")[0]
        results = engine.store.get_run(run["id"])["results"]
        bars = {(r["group"], r["label"]): r["value"] for r in chart_rows(page, "languages-bars-gender")}
        for code, name in (("en", "English"), ("de", "German"), ("de-f", "German (feminine forms)")):
            for cls in ("male", "female"):
                assert bars[(f"{code}: {name}", cls)] == pytest.approx(
                    results["languages"][code]["shares"]["gender"][cls]["share"])
        # the nurse moves the German result: its female share's difference from English excludes 0
        female = page.locator("#languages-differences-gender tr[data-code='de'][data-class='female']")
        assert female.locator(".gl-diff[data-significant='true']").count() == 1
        assert results["differences"]["de"]["gender"]["female"]["ci"][0] > 0
        assert page.locator("#languages-magbig-gender tr[data-code='de-f']").count() == 1
        screenshot(page, "languages_mistranslation")

        # MAGBIG's direct set over three occupations: the language x occupation heatmap
        page.locator("#lang-mode label", has_text="a MAGBIG prompt set").click()
        page.wait_for_selector("#lang-occupations", state="visible")
        page.locator("#lang-n input[type='number']").fill("8")
        page.locator("#lang-n input[type='number']").press("Enter")
        for _ in range(16):   # the thesis's 19 occupations by default: keep three
            removable = page.locator("#lang-occupations .token .token-remove")
            if removable.count() <= 3:
                break
            removable.last.click()
        page.click("#lang-run")
        wait_text(page, "#lang-progress", "9 Single Prompt runs")
        page.wait_for_selector(drawn("languages-heatmap-gender"), timeout=30_000)
        cells = chart_rows(page, "languages-heatmap-gender")
        assert {c["row"] for c in cells} == {"en", "de", "de-f"} and len({c["col"] for c in cells}) == 3
        assert "interaction" in page.inner_text("#languages-page").lower()
        screenshot(page, "languages_prompt_set")
