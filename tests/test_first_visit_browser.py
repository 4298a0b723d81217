"""Issue 17 in the browser: one app start, every tab clicked through as a new user would, each
contradiction / clipped label / stray toast of the issue checked where a user meets it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from apphelpers import browser_page, running_app, screenshot
from waiting import wait_until
from engine.common.events import Done
from engine.methods import mine
from engine.models.presets import SYNTHETIC_TABLE

pytestmark = pytest.mark.browser
LONG = 60_000


def set_number(page, selector: str, value) -> None:
    field = page.locator(f"{selector} input[type='number']")
    field.fill(str(value))
    field.press("Enter")


def text(page, selector: str) -> str:
    return page.inner_text(selector)


def wait_text(page, selector: str, words: str, timeout: int = LONG) -> None:
    page.wait_for_function("([s, w]) => (document.querySelector(s) || {innerText: ''}).innerText.includes(w)",
                           arg=[selector, words], timeout=timeout)


def no_toast(page) -> bool:
    return page.locator(".toast-body").count() == 0


@pytest.fixture
def flipped_world(tmp_path) -> str:
    table = json.loads(Path(SYNTHETIC_TABLE).read_text())
    table["subjects"]["doctor"]["dist"]["gender"] = {"male": 0.2, "female": 0.8}
    table["rules"] = [r for r in table["rules"] if not (r["subject"] == "doctor" and "gender" in r["then"])]
    path = tmp_path / "flipped.json"
    path.write_text(json.dumps(table))
    return str(path)


def test_a_first_visit_without_contradictions(engine, flipped_world, monkeypatch):
    from engine.methods import counterfactuals
    from engine.metrics.wordnet import missing_note

    # a machine where only `pip install -r requirements.txt` ran: no WordNet database
    monkeypatch.setattr(counterfactuals, "synonyms_note", lambda: missing_note("/nonexistent-wordnet"))
    stored = next(e for e in mine.run(mine.MineRequest(iterations=1, population=6, select=1, mutations=3, n=4,
                                                       n_variations=4), engine) if isinstance(e, Done))
    with running_app(engine) as url, browser_page(width=1400, height=1000) as page:
        page.goto(url, wait_until="load")
        page.wait_for_selector("#sp-prompt textarea", timeout=30_000)

        # -- Single Prompt: an empty prompt is an error of that action only, and no run is recorded
        runs_before = engine.store.count("runs")
        page.click("#sp-generate")
        page.wait_for_selector(".toast-body.error", timeout=30_000)
        assert "empty" in text(page, ".toast-body").lower() and engine.store.count("runs") == runs_before
        page.fill("#sp-prompt textarea", "a photo of a doctor")
        page.fill("#sp-extra-axes textarea", "hair color")
        page.click("#sp-generate")
        page.wait_for_function("document.querySelectorAll('.toast-body').length === 0", timeout=10_000)
        wait_text(page, "#sp-progress", "Done")
        assert no_toast(page)                                    # the old error is gone
        assert "not modelled in the synthetic world" in text(page, "[data-axis='hair color']")
        # the 8th gallery column is inside the gallery
        box = page.locator("#sp-gallery").bounding_box()
        right = max(b["x"] + b["width"] for b in (i.bounding_box() for i in page.locator("#sp-gallery img").all()[:8]))
        assert right <= box["x"] + box["width"] + 1
        # gap score: the sign is read in words that agree with it
        reading = text(page, "#gap-reading")
        score = float(text(page, "#gap-score").replace("−", "-").split()[0])
        assert ("a sign of bias" in reading) == (score < 0)
        # Top-K concepts: whole phrases, no fragments or duplicates
        topk = text(page, "#sp-topk").lower()
        assert "attire" not in topk.replace("formal attire", "").replace("informal attire", "")
        assert "light-skinned" not in topk
        # image details: answers and the caption, no stray bullet
        page.locator("#sp-gallery img").first.click()
        wait_text(page, "#sp-details", "Seed")
        details = text(page, "#sp-details")
        assert "Caption:" in details and "<caption>" not in details
        assert page.locator("#sp-details li").count() == 4 and all(
            "→" in li.inner_text() for li in page.locator("#sp-details li").all())
        page.keyboard.press("Escape")
        page.click("#sp-regenerate")
        wait_text(page, "#sp-details", "regenerated alone: identical")
        sp_run = engine.store.list_runs("single_prompt")[0]["id"]
        page.fill("#sp-extra-axes textarea", "")
        page.click("#sp-generate")                                  # the regenerate message does not outlive its run
        wait_text(page, "#sp-details", "Click an image")
        # this run's "Done" (the previous one's is on the page until the new run streams): a click
        # before it would be forgotten when the run's last update replaces the tab's state
        second = wait_until(lambda: [r["id"] for r in engine.store.list_runs("single_prompt")
                                     if r["id"] != sp_run and r["status"] == "done"], LONG / 1000, "the second run")
        wait_text(page, "#sp-progress", second[0])
        page.locator("#sp-gallery img").first.click()              # selected again, for the end of the walk
        wait_text(page, "#sp-details", "Seed")
        page.keyboard.press("Escape")
        failed = [r for r in engine.store.list_runs() if r["status"] == "failed"]
        assert failed == []
        shot_single = screenshot(page, "first_visit_single_prompt")

        # -- Counterfactuals: WordNet missing is said beside the option; warnings are notes of the
        #    result (Table 6.1 keeps one typo'd counterfactual with a warning), not a toast over it
        page.get_by_role("tab", name="Counterfactuals").click()
        page.get_by_text("TIBET options", exact=False).first.click()
        page.wait_for_selector("#cf-synonyms", state="visible", timeout=LONG)
        assert "WordNet is not installed" in page.inner_text("#cf-synonyms")
        page.click("#cf-preset")
        page.wait_for_function("document.querySelector('#cf-fill textarea, #cf-fill input').value === 'doctor'",
                               timeout=LONG)                       # the preset fills prompt, values and table at once
        set_number(page, "#cf-n", 2)
        page.click("#cf-run")
        wait_text(page, "#cf-progress", "Done")
        assert no_toast(page)
        progress = text(page, "#cf-progress")
        assert "Notes (1)" in progress and "changes the prompt in 2 places" in progress
        assert page.eval_on_selector(".gl-set figcaption", "e => getComputedStyle(e).whiteSpace") == "normal"

        # -- Intersectional: the pair view opens on a kept pair or says none is kept
        page.get_by_role("tab", name="Intersectional Matrix").click()
        page.fill("#ic-prompt textarea", "a photo of a doctor")
        page.click("#ic-propose")
        page.wait_for_function("document.querySelector('#ic-axes').innerText.includes('gender')", timeout=LONG)
        set_number(page, "#ic-n", 8)
        page.click("#ic-run")
        wait_text(page, "#ic-progress", "Done")
        assert no_toast(page)
        ic = engine.store.get_run(engine.store.list_runs("intersectional")[0]["id"])["results"]
        if ic["kept_edges"]:
            page.wait_for_selector("#ic-pair-panel[data-kept='true']", timeout=LONG)
        else:
            page.wait_for_selector("#ic-no-pair", timeout=LONG)
            assert page.locator("#ic-no-edge").count() == 1 and page.locator("#ic-graph-frame").count() == 0
        pruned = len(ic["edges"]) - len(ic["kept_edges"])
        page.wait_for_selector("#is-matrix[data-rendered] svg", timeout=LONG)
        assert page.locator("#is-matrix .mark-rect.role-mark path[opacity='0.3']").count() >= min(pruned, 1)
        upload = page.locator("#ic-reference").bounding_box()
        assert upload["height"] >= 110                             # "Click to Upload" has room

        # -- Mitigate: the preview's status and panel agree; the left column stays compact
        page.get_by_role("tab", name="Mitigate").click()
        page.click("#mt-from-ic")
        page.wait_for_function("document.querySelector('#mt-weights').innerText.includes('gender')", timeout=LONG)
        page.click("#mt-preview-btn")
        wait_text(page, "#mt-progress", "Preview done")
        status = text(page, "#mt-progress")
        assert "not reached" not in status and "succeeded" not in text(page, "#mt-preview-box")
        column = page.eval_on_selector("#mt-run", "e => e.closest('.column').getBoundingClientRect().height")
        assert column < 2200, column                                # was ~3,500 px with eight axes

        # -- Mine Prompts: Open restores every setting; Stop on a finished run changes nothing
        page.get_by_role("tab", name="Mine Prompts").click()
        page.click("#mine-refresh")
        page.locator("#mine-runs input").fill(stored.run_id)
        page.locator("#mine-runs input").press("Enter")
        page.click("#mine-open")
        wait_text(page, "#mine-progress", stored.run_id)
        values = {k: page.locator(f"#mine-{k} input[type='number']").input_value() for k in ("T", "b", "s", "m", "n")}
        assert values == {"T": "1", "b": "6", "s": "1", "m": "3", "n": "4"}
        page.click("#mine-stop")
        wait_text(page, "#mine-progress", "Nothing is running")
        assert "is done" in text(page, "#mine-progress") and engine.store.get_run(stored.run_id)["status"] == "done"

        # -- Compare models: two generators, one action, side by side
        page.get_by_role("tab", name="Compare models").click()
        # the running preset is ticked already (issue 34)
        assert page.locator("#cm-presets label", has_text="synthetic").first.locator("input").is_checked()
        page.fill("#cm-more textarea", f"synthetic_generator:{flipped_world}")
        page.fill("#cm-prompt textarea", "a photo of a doctor")
        set_number(page, "#cm-n", 16)
        page.click("#cm-run")
        wait_text(page, "#cm-progress", "Done")          # the page grows model by model until then
        assert page.locator("#cm-page .gl-side").count() >= 2 * 3 and page.locator("#cm-table tr").count() > 5
        # each model's images side by side
        page.wait_for_function("[...document.querySelectorAll('#cm-images .gl-side')].map(s => "
                               "[...s.querySelectorAll('img')].filter(i => i.naturalWidth).length).join() == '16,16'",
                               timeout=LONG)
        screenshot(page, "first_visit_compare_models")

        # -- Runs: readable names; "Deleted" stays after the list refreshes
        page.get_by_role("tab", name="Runs").click()
        page.click("#runs-refresh")
        wait_text(page, "#runs-table", "Composite Bias Score")
        listing = text(page, "#runs-table")
        assert "tau_initial" not in listing and "mad_" not in listing and "prompts_scored" not in listing
        # compare: the two models' runs, image grids side by side (the app's stylesheet), grouped by model
        for run_id in engine.store.get_run(engine.store.list_runs("compare_models")[0]["id"])["results"]["runs"]:
            page.locator("#runs-selected input").fill(run_id)
            page.locator("#runs-selected input").press("Enter")
        page.click("#runs-compare-btn")
        page.wait_for_selector("#runs-comparison .gl-thumbs", timeout=LONG)
        assert page.eval_on_selector("#runs-comparison .gl-thumbs", "e => getComputedStyle(e).display") == "flex"
        assert "By model:" in text(page, "#runs-comparison")
        assert "composite_bias_score" not in text(page, "#runs-comparison")
        page.click("text=Clear selection")
        doctor_runs = [r["id"] for r in engine.store.list_runs()]   # every run (several use the doctor images)
        for run_id in doctor_runs:
            page.locator("#runs-selected input").fill(run_id)
            page.locator("#runs-selected input").press("Enter")
        page.check("#runs-confirm input")
        page.click("#runs-delete")
        wait_text(page, "#runs-message", f"Deleted {len(doctor_runs)} run(s)")
        page.wait_for_function("id => !document.querySelector('#runs-table').innerText.includes(id)", arg=sp_run,
                               timeout=LONG)                       # the list refreshed ...
        assert f"Deleted {len(doctor_runs)} run(s)" in text(page, "#runs-message")   # ... and the message stayed

        # -- back in Single Prompt: regenerating an image whose stored copy is gone says so
        page.get_by_role("tab", name="Single Prompt").click()
        page.click("#sp-regenerate")
        wait_text(page, "#sp-details", "the stored image is missing")
        assert "grey levels" not in text(page, "#sp-details")
    assert shot_single.exists()
