"""Issue 28 in the browser: what the screen shows is what runs. On every method tab the same
minimal form runs twice, with every settings panel closed and then with every panel found on the
page opened (found in the DOM, so a panel added later is covered too); both runs must succeed and
store identical requests. A typed out-of-range value is one toast naming the field, and the
result on the page stays as it was."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pytest

from apphelpers import browser_page, running_app, screenshot
from waiting import wait_until
from engine.models.presets import SYNTHETIC_TABLE

pytestmark = pytest.mark.browser
LONG = 120_000
PROMPT = "a photo of a doctor"



def set_number(page, selector: str, value) -> None:
    field_ = page.locator(f"{selector} input[type='number']")
    field_.fill(str(value))
    field_.press("Enter")


def propose(prefix: str):
    """Type the prompt and press Propose axes (the LLM fills the table)."""
    def fill(page):
        page.fill(f"#{prefix}-prompt textarea", PROMPT)
        page.click(f"#{prefix}-propose")
        page.wait_for_function(f"document.querySelector('#{prefix}-axes').innerText.includes('gender')", timeout=LONG)
    return fill


@dataclass
class Form:
    """One method tab: how to fill its minimum and which button runs it."""

    tab: str
    method: str
    run: str                                     # the run button's elem_id
    fill: Callable
    numbers: dict = field(default_factory=dict)  # elem_id -> value: the smallest run the synthetic world allows


def compare_models_form(world: str) -> Form:
    def fill(page):
        page.locator("#cm-presets label", has_text="synthetic").first.locator("input").check()   # ticked by default
        page.fill("#cm-more textarea", f"synthetic_generator:{world}")
        page.fill("#cm-prompt textarea", PROMPT)
    return Form("Compare models", "compare_models", "cm-run", fill, {"cm-n": 2})


def forms(world: str) -> list[Form]:
    return [
        Form("Single Prompt", "single_prompt", "sp-generate", lambda page: page.fill("#sp-prompt textarea", PROMPT),
             {"sp-n": 2}),
        Form("Counterfactuals", "counterfactuals", "cf-run", propose("cf"), {"cf-n": 2}),
        Form("Intersectional Matrix", "intersectional", "ic-run", propose("ic"), {"ic-n": 2}),
        Form("Mine Prompts", "mine", "mine-start", lambda page: None,
             {"mine-T": 1, "mine-b": 3, "mine-s": 1, "mine-m": 1, "mine-n": 2, "mine-nvar": 2}),
        Form("Mitigate", "mitigate", "mt-run", propose("mt"), {"mt-n": 2}),
        compare_models_form(world),
        Form("Languages", "languages", "lang-run", lambda page: page.fill("#lang-prompt textarea", PROMPT), {"lang-n": 2}),
    ]


@pytest.fixture
def second_world(tmp_path) -> str:
    """The synthetic world with doctors mostly women: a second generator to compare with."""
    table = json.loads(Path(SYNTHETIC_TABLE).read_text())
    table["subjects"]["doctor"]["dist"]["gender"] = {"male": 0.2, "female": 0.8}
    path = tmp_path / "second.json"
    path.write_text(json.dumps(table))
    return str(path)


def toggle_every_panel(page, selector: str) -> list[str]:
    """Click every accordion header shown that matches `selector` (again after each: panels
    inside panels appear); returns their titles."""
    clicked = []
    while (headers := page.locator(selector).filter(visible=True)).count():
        header = headers.first.element_handle()
        clicked.append(header.inner_text().strip().splitlines()[0])
        was_open = "open" in (header.get_attribute("class") or "").split()
        header.click()
        page.wait_for_function("([e, was]) => e.classList.contains('open') !== was", arg=[header, was_open])
        assert len(clicked) < 50, clicked
    return clicked


def open_every_panel(page) -> list[str]:
    return toggle_every_panel(page, ".label-wrap:not(.open)")


def close_every_panel(page) -> list[str]:
    return toggle_every_panel(page, ".label-wrap.open")


def run_and_wait(page, engine, form_: Form) -> dict:
    """Press the run button; returns the stored run once it finished and the page showed it."""
    before = {r["id"] for r in engine.store.list_runs(form_.method)}
    page.click(f"#{form_.run}")

    def finished():
        errors = page.locator(".toast-body.error")
        assert errors.count() == 0, f"{form_.tab}: {errors.first.inner_text()}"
        return [r for r in engine.store.list_runs(form_.method) if r["id"] not in before and r["status"] != "running"]

    new = wait_until(finished, LONG / 1000, f"a finished {form_.tab} run", poll=0.2)
    run = engine.store.get_run(new[0]["id"])
    page.wait_for_function("id => document.body.innerText.includes(id)", arg=run["id"], timeout=LONG)
    return run


def test_opening_every_settings_panel_changes_no_request(engine, second_world):
    with running_app(engine) as url, browser_page(width=1366, height=900) as page:
        page.goto(url, wait_until="load")
        page.wait_for_selector("#sp-prompt textarea", timeout=30_000)
        for form_ in forms(second_world):
            page.get_by_role("tab", name=form_.tab).click()
            page.wait_for_selector(f"#{form_.run}", state="visible", timeout=30_000)
            form_.fill(page)
            for elem_id, value in form_.numbers.items():
                set_number(page, f"#{elem_id}", value)
            close_every_panel(page)     # e.g. the Models panel opened on the tab before, Mine's stored runs
            closed = run_and_wait(page, engine, form_)
            opened_titles = open_every_panel(page)
            assert opened_titles, f"{form_.tab}: no settings panel found on the page"
            blank = page.eval_on_selector_all("input[type='number']", "es => es.filter(e => e.offsetParent !== null "
                                              "&& e.value === '').map(e => e.placeholder)")
            assert all(p.startswith("empty: ") for p in blank), (form_.tab, blank)   # empty says what it means
            opened = run_and_wait(page, engine, form_)
            assert (closed["status"], opened["status"]) == ("done", "done"), (form_.tab, closed.get("error"),
                                                                              opened.get("error"))
            assert opened["request"] == closed["request"], (form_.tab, opened_titles)
            assert page.locator(".toast-body.error").count() == 0, form_.tab
        screenshot(page, "settings_panels_all_open")
        # the optional numbers said what empty means; nothing was sent for them
        request = engine.store.get_run(engine.store.list_runs("counterfactuals")[0]["id"])["request"]
        assert request["steps"] is None and request["guidance"] is None


def error_badges(page) -> int:
    """Outputs Gradio marks as failed (the red "Error" status of a component)."""
    return page.locator("[data-testid='status-tracker'] .error").filter(visible=True).count()


def test_an_out_of_range_steps_value_is_one_toast_and_the_result_stays(engine):
    with running_app(engine) as url, browser_page(width=1366, height=900) as page:
        page.goto(url, wait_until="load")
        page.wait_for_selector("#sp-prompt textarea", timeout=30_000)
        page.get_by_role("tab", name="Counterfactuals").click()
        propose("cf")(page)
        set_number(page, "#cf-n", 2)
        page.click("#cf-run")
        page.wait_for_function("document.querySelector('#cf-progress').innerText.includes('Done')", timeout=LONG)
        shown = {k: page.inner_text(f"#cf-{k}") for k in ("progress", "mad", "table")}
        runs = engine.store.count("runs")

        page.get_by_text("Generation settings", exact=False).filter(visible=True).first.click()
        steps = page.locator("#cf-steps input[type='number']")
        assert steps.input_value() == "" and steps.get_attribute("placeholder") == "empty: 1, the model's default"
        steps.fill("1000")
        page.click("#cf-run")
        page.wait_for_selector(".toast-body", timeout=30_000)
        page.wait_for_timeout(1_000)                      # anything else that would arrive has arrived
        toasts = [t.inner_text() for t in page.locator(".toast-body").all()]
        assert len(toasts) == 1 and "steps must be between 1 and 150" in toasts[0] and "got 1000" in toasts[0], toasts
        assert error_badges(page) == 0
        assert {k: page.inner_text(f"#cf-{k}") for k in shown} == shown     # the previous result, untouched
        assert engine.store.count("runs") == runs                              # nothing started
        screenshot(page, "settings_out_of_range_steps")
