"""Issue 44 in the browser: Compare models offers "LoRA / checkpoint" beside the presets (a LoRA on a
generator that is not a diffusers model is one toast), compares a fine-tune of the synthetic world with its
base seed by seed (the page says so and gives each axis its paired verdict) and offers the comparison as a
suite file that `python -m engine check` reads and runs."""
from __future__ import annotations

import json

import pytest

from apphelpers import browser_page, running_app, screenshot
from engine.cli import main

pytestmark = pytest.mark.browser
LONG = 120_000


def test_compare_models_pairs_a_fine_tune_by_seed_and_exports_its_suite(engine, tmp_path, capsys):
    with running_app(engine) as url, browser_page() as page:
        page.goto(url, wait_until="load")
        page.get_by_role("tab", name="Compare models").wait_for(timeout=LONG)
        page.get_by_role("tab", name="Compare models").click()
        # a LoRA goes on a diffusers model: the synthetic world is none
        page.fill("#cm-lora textarea", "user/doctor-lora@0.8")
        page.click("#cm-lora-add")
        page.wait_for_selector(".toast-body.error", timeout=30_000)
        assert "goes on a diffusers model" in page.locator(".toast-body.error").first.inner_text()
        assert page.locator("#cm-more textarea").input_value() == ""

        page.fill("#cm-more textarea", "synthetic_generator:doctor-male-95")
        page.fill("#cm-prompt textarea", "a photo of a doctor")
        field = page.locator("#cm-n input[type='number']")
        field.fill("96")
        field.press("Enter")
        page.click("#cm-run")
        page.wait_for_function("document.querySelector('#cm-progress').innerText.includes('Done')", timeout=LONG)
        assert "Paired by seed" in page.locator("#cm-progress").inner_text()
        note = page.locator("#cm-paired-note").inner_text()
        assert "same seeds (0–95)" in note and "narrower than the unpaired ones" in note
        verdicts = dict(zip(page.locator("#cm-paired-1 tr[data-axis]").evaluate_all("rs => rs.map(r => r.dataset.axis)"),
                            page.locator("#cm-paired-1 tr[data-axis]").evaluate_all("rs => rs.map(r => r.dataset.verdict)")))
        assert verdicts["gender"] == "more biased" and verdicts["age"] == "equivalent"
        page.wait_for_selector("#cm-suite a[download], #cm-suite a[href]", timeout=30_000)
        with page.expect_download() as download:
            page.locator("#cm-suite a").first.click()
        suite = tmp_path / "suite.json"
        download.value.save_as(suite)
        screenshot(page, "compare_models_paired")

    assert json.loads(suite.read_text())["prompts"] == ["a photo of a doctor"]
    capsys.readouterr()   # the app's "Closing server" line
    code = main(["check", str(suite), "--base", "synthetic", "--candidate", "synthetic_generator:doctor-male-95",
                 "--preset", "synthetic", "--data-dir", str(engine.store.data_dir), "--json", "--quiet"])
    printed = capsys.readouterr()
    assert printed.out.strip(), printed.err
    rows = json.loads(printed.out)["rows"]
    assert code == 1 and [r["axis"] for r in rows if r["verdict"] == "more biased"] == ["gender"]
