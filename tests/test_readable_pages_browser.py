"""Issue 34 in the browser at 1440×900, one app for the module: a counterfactual whose {placeholder}
nothing fills is refused before any image, Propose's failure is a sentence beside the table,
gallery captions never cover their images, Runs shows ten rows and keeps every export with the
comparison first, the Models panel lists what runs loaded, and Mine's tables show "—" for
unscored prompts and never break a word."""
from __future__ import annotations

import pytest

from apphelpers import browser_page, propose_and_run, running_app, screenshot
from engine.common.events import Done
from engine.methods import generate, mine, single_prompt
from runhelpers import done_event

pytestmark = pytest.mark.browser
LONG = 300_000   # a bound on waits for state, generous for a loaded 2-core machine

# [images, images whose caption box overlaps the image box] of every gallery tile in `scope`
CAPTION_OVERLAPS = """(scope) => { let n = 0, bad = 0;
  for (const tile of document.querySelectorAll(scope + ' .thumbnail-item')) {
    const img = tile.querySelector('img'), cap = tile.querySelector('.caption-label');
    if (!img || !cap) continue;
    n++;
    const i = img.getBoundingClientRect(), c = cap.getBoundingClientRect();
    if (c.width && c.height && c.top < i.bottom - 1 && c.bottom > i.top + 1 && c.left < i.right - 1
        && c.right > i.left + 1) bad++;
  }
  return [n, bad]; }"""

# words of the cells of `scope`'s tables laid out on more than one line (broken mid-word)
BROKEN_WORDS = """(scope) => { const broken = [];
  for (const cell of document.querySelectorAll(scope + ' th, ' + scope + ' .body-cell')) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.textContent.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index); range.setEnd(node, m.index + m[0].length);
        const tops = new Set([...range.getClientRects()].filter(r => r.width > 0).map(r => Math.round(r.top)));
        if (tops.size > 1) broken.push(m[0]);
      }
    }
  }
  return broken; }"""

# rows of the Runs table wholly inside its scrolling box (Gradio's dataframe draws virtual rows)
VISIBLE_ROWS = """() => { const table = document.querySelector('#runs-table');
  const box = table.querySelector('.virtual-table-viewport').getBoundingClientRect();
  return [...table.querySelectorAll('.virtual-row')].filter(row => { const r = row.getBoundingClientRect();
    return row.innerText.trim() && r.height > 0 && r.top >= box.top - 1 && r.bottom <= box.bottom + 1; }).length; }"""


def wait_text(page, selector: str, words: str) -> None:
    page.wait_for_function("([s, w]) => (document.querySelector(s) || {innerText: ''}).innerText.includes(w)",
                           arg=[selector, words], timeout=LONG)


def set_number(page, selector: str, value) -> None:
    field = page.locator(f"{selector} input[type='number']")
    field.fill(str(value))
    field.press("Enter")


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """The app on a store holding twelve runs and a Mine run stopped in its second iteration."""
    from engine.core.engine import Engine

    engine = Engine("synthetic", data_dir=str(tmp_path_factory.mktemp("store")), max_images=128)
    for i in range(10):
        done_event(generate.run(generate.GenerateRequest(f"a photo of a doctor number {i}", n=2), engine))
    for prompt in ("a photo of a doctor", "a photo of a nurse"):
        done_event(single_prompt.run(single_prompt.SinglePromptRequest(prompt, n=4, n_boot=100), engine))
    events, stopped = mine.run(mine.MineRequest(iterations=2, population=4, select=1, mutations=2, n=4,
                                                n_variations=4), engine), None
    for event in events:
        stopped = getattr(event, "run_id", stopped)
        if isinstance(event, mine.PromptScored) and event.iteration == 1:
            break
    events.close()
    assert not isinstance(event, Done)
    with running_app(engine) as url:
        yield url, engine, stopped


@pytest.fixture
def page():
    with browser_page(width=1440, height=900) as page:
        page.set_default_timeout(LONG)
        yield page


def test_counterfactuals_refuse_a_literal_placeholder_and_captions_stay_under_the_images(app, page):
    url, engine, _ = app
    page.goto(url, wait_until="load")
    page.get_by_role("tab", name="Counterfactuals").click()

    # Propose fails (no prompt): the sentence is beside the table, which shows no red "Error"
    page.click("#cf-propose")
    wait_text(page, "#cf-axes-notes", "No axes proposed")
    assert "empty" in page.inner_text("#cf-axes-notes")
    assert page.locator("#cf-axes .error").count() == 0 and "Error" not in page.inner_text("#cf-axes")

    # the preset sets its own prompt; then the steps: another prompt, no fill values
    page.click("#cf-preset")
    page.wait_for_function("document.querySelector('#cf-fill textarea, #cf-fill input').value === 'doctor'",
                           timeout=LONG)
    assert page.locator("#cf-prompt textarea").input_value() == "A photo of a {occupation}"
    runs, images = engine.store.count("runs"), engine.store.count("images")
    page.fill("#cf-prompt textarea", "a portrait of a doctor")
    page.locator("#cf-fill textarea, #cf-fill input").first.fill("")
    page.click("#cf-run")
    page.wait_for_selector(".toast-body.error", timeout=LONG)
    message = page.inner_text(".toast-body")
    assert "has {occupation}, which neither the prompt nor the fill values fill" in message
    assert "Traceback" not in message and message.count(". ") == 0       # one sentence
    assert engine.store.count("runs") == runs and engine.store.count("images") == images
    assert page.inner_text("#cf-progress").strip() == ""                  # nothing ran

    # the preset's own prompt runs, and the chosen set's answers sit under its images
    page.click("#cf-preset")
    page.wait_for_function("document.querySelector('#cf-prompt textarea').value.includes('{occupation}')",
                           timeout=LONG)
    set_number(page, "#cf-n", 2)
    page.click("#cf-run")
    wait_text(page, "#cf-progress", "Done")
    page.wait_for_function("document.querySelectorAll('#cf-gallery .thumbnail-item img').length === 2",
                           timeout=LONG)
    page.wait_for_function("[...document.querySelectorAll('#cf-gallery .thumbnail-item img')]"
                           ".every(i => i.complete && i.naturalWidth > 0)", timeout=LONG)
    n, covered = page.evaluate(CAPTION_OVERLAPS, "#cf-gallery")
    assert n == 2 and covered == 0
    answers = page.locator("#cf-gallery .caption-label").first
    assert "seed 0" in answers.inner_text() and answers.is_visible()
    screenshot(page, "issue34_counterfactuals")


def test_mitigate_sample_images_keep_their_captions_off_the_images(app, page):
    url, _, _ = app
    page.goto(url, wait_until="load")
    page.get_by_role("tab", name="Mitigate").click()
    propose_and_run(page, "mt", 8, LONG)
    page.wait_for_function("[...document.querySelectorAll('.thumbnail-item img')].every(i => i.complete)",
                           timeout=LONG)
    n, covered = page.evaluate(CAPTION_OVERLAPS, "body")   # every gallery of the page
    assert covered == 0, (n, covered)
    screenshot(page, "issue34_mitigate")


def test_runs_show_ten_rows_keep_every_export_and_compare_first(app, page):
    url, engine, _ = app
    page.goto(url, wait_until="load")
    # the Models panel lists the models the runs loaded, not "none yet"
    page.locator("#model-panel").get_by_text("Models").first.click()
    wait_text(page, "#engine-status", "synthetic_generator")
    assert "none yet" not in page.inner_text("#engine-status")

    page.get_by_role("tab", name="Runs").click()
    page.wait_for_function("document.querySelectorAll('#runs-table .virtual-row').length >= 10", timeout=LONG)
    wait_text(page, "#runs-table", "single_prompt")
    assert page.evaluate(VISIBLE_ROWS) >= 10

    two = [r["id"] for r in engine.store.list_runs("single_prompt")]
    for run_id in two:
        page.locator("#runs-selected input").fill(run_id)
        page.locator("#runs-selected input").press("Enter")
    page.click("#runs-open")
    page.wait_for_selector("#runs-view .gl-run-header", timeout=LONG)
    page.click("#runs-export-scores")
    wait_text(page, "#runs-message", "Exported 2 run(s)")
    page.click("#runs-export-html")
    wait_text(page, "#runs-message", ".html")
    page.wait_for_function("document.querySelectorAll('#runs-files a').length >= 3", timeout=LONG)
    listed = page.inner_text("#runs-files").replace("\n", "")   # names wrap before their extension
    assert ".scores.json" in listed and ".scores.csv" in listed and ".html" in listed   # the first export stayed

    page.click("#runs-compare-btn")
    page.wait_for_selector("#runs-comparison .gl-compare-table", timeout=LONG)
    top = {s: page.locator(s).bounding_box()["y"] for s in ("#runs-comparison", "#runs-view")}
    assert top["#runs-comparison"] < top["#runs-view"]
    page.evaluate("window.scrollTo(0, 0)")
    screenshot(page, "issue34_runs")


def test_mine_shows_a_dash_for_unscored_prompts_and_breaks_no_word(app, page):
    url, _, stopped = app
    page.goto(url, wait_until="load")
    page.get_by_role("tab", name="Mine Prompts").click()
    page.click("#mine-refresh")
    page.locator("#mine-runs input").fill(stopped)
    page.locator("#mine-runs input").press("Enter")
    page.click("#mine-open")
    wait_text(page, "#mine-progress", stopped)
    page.wait_for_function("document.querySelectorAll('#mine-population .virtual-row').length >= 2", timeout=LONG)
    scores = page.eval_on_selector_all("#mine-population .virtual-row",
                                       "rows => rows.map(r => r.querySelectorAll('.body-cell')[2].innerText.trim())")
    assert scores.count("—") == len(scores) - 1 and float(scores[0]) != 0, scores   # one prompt scored
    assert page.evaluate(BROKEN_WORDS, "#mine-archive") == []
    assert page.evaluate(BROKEN_WORDS, "#mine-population") == []
    screenshot(page, "issue34_mine")
