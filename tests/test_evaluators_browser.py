"""Several evaluators in headless Chromium (issue 35; issue 42 items 1-4, 11, 12). Single Prompt with
other evaluators typed in the tab: their agreement and κ under the distributions (each with its "can't
tell" bar), the images where they disagree with every answer, each clicked image's answers credited to
their evaluator, and the axes an evaluator cannot answer left out before any image is made."""
import pytest

from apphelpers import browser_page, chart_rows, drawn, running_app, screenshot
from engine.backends.base import ModelSpec
from engine.core.engine import Engine
from engine.models.presets import SYNTHETIC_TABLE

pytestmark = pytest.mark.browser


def _generate(page, n: int, evaluators: str, axes: tuple = ("gender", "age", "skin tone"), prompt="a photo of a doctor"):
    """Fill the Single Prompt form (`axes` ticked, the others not) and click Generate."""
    page.fill("#sp-prompt textarea", prompt)
    page.locator("#sp-n input[type='number']").fill(str(n))
    page.locator("#sp-n input[type='number']").press("Enter")
    boxes = page.locator("#sp-axes-pick label")
    for i in range(boxes.count()):
        box = boxes.nth(i).locator("input")
        if box.is_checked() != (boxes.nth(i).inner_text().strip() in axes):
            box.click()
    page.fill("#sp-evaluators-pick textarea", evaluators)
    page.click("#sp-generate")


def _done(page, timeout=120_000):
    page.wait_for_function("document.querySelector('#sp-progress').innerText.includes('Done')", timeout=timeout)


def _answers_inside_their_figures(page, axis: str) -> None:
    """Item 11: under the disagreement thumbnails of `axis`, every evaluator's name, answer and
    probabilities stay inside their own figure, and no figure lies over another."""
    figures = page.locator(f"{axis} .gl-disagreement").all()
    boxes = [f.bounding_box() for f in figures]
    assert figures
    for figure, box in zip(figures, boxes):
        for part in figure.locator(".gl-answer, .gl-probs").all():
            for rect in part.evaluate("e => [...e.getClientRects()].map(r => [r.left, r.right])"):
                assert box["x"] - 1 <= rect[0] and rect[1] <= box["x"] + box["width"] + 1, (rect, box)
    for a, b in zip(boxes, boxes[1:]):
        assert a["x"] + a["width"] <= b["x"] or b["y"] >= a["y"] + a["height"]


def _last_run(engine):
    return engine.store.get_run(engine.store.list_runs("single_prompt")[0]["id"])


def test_two_evaluators_in_the_single_prompt_tab(data_dir):
    engine = Engine("synthetic", data_dir=data_dir, vqa=ModelSpec("synthetic_vqa", SYNTHETIC_TABLE, {"error": 0.3}))
    with running_app(engine) as url, browser_page() as page:
        page.goto(url, wait_until="load")
        _generate(page, 24, "clip_vqa:synthetic")
        _done(page, 90_000)
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
        _answers_inside_their_figures(page, gender)
        # every distribution has its "can't tell" bar, apart from the classes
        chart = "#sp-axes .gl-vega[data-chart='axis-gender'] svg"
        page.wait_for_selector(chart, timeout=30_000)                   # drawn by the Vega runtime
        assert "can't tell" in page.locator(chart).text_content()
        screenshot(page, "two_evaluators")

        compared = _last_run(engine)["results"]["evaluators"]["axes"]["gender"]
        assert len(compared["disagreements"]) == figures.count() and compared["kappa_method"] == "Cohen"
        assert f"{compared['kappa']:.3f}" == kappa


def test_three_evaluators_show_fleiss_kappa_and_each_image_credits_its_answers(data_dir):
    """Item 1: gender + age with `clip_vqa:synthetic, faces:` (red "Error" badges and a blank gallery
    before: jinja2's UndefinedError on 'agreement_matrix'). Item 4: a clicked image lists each question
    once, every evaluator's answer under its name with its probabilities, as the comparison counted
    it. Item 11: the evaluator names under the disagreement thumbnails stay inside their figure."""
    engine = Engine("synthetic", data_dir=data_dir)
    with running_app(engine) as url, browser_page(1440, 900) as page:
        page.goto(url, wait_until="load")
        _generate(page, 16, "clip_vqa:synthetic, faces:", axes=("gender", "age"))
        _done(page)
        comparison = "#sp-axes #sp-evaluators"
        page.wait_for_selector(f"{comparison} .gl-trust-axis[data-axis='age']", timeout=30_000)
        assert page.locator(".toast-body").count() == 0 and page.locator("#sp-gallery img").count() == 16
        names = ["synthetic_vqa:synthetic_world.json", "clip_vqa:synthetic", "faces:bundled"]
        assert page.inner_text(f"{comparison} h4") == "Evaluator comparison: " + " vs ".join(names)
        for axis in ("gender", "age"):
            block = f"{comparison} .gl-trust-axis[data-axis='{axis}']"
            text = page.inner_text(block)
            assert "Fleiss' κ over the 0 image(s) all 3 answered" in text   # faces finds no face in this world
            assert page.inner_text(f"{block} > p [data-metric='kappa']") == "undefined: no image answered by all 3"
            assert "faces:bundled 0 of 16" in text
            assert page.inner_text(f"{block} .gl-silent") == (   # not read as the others' disagreement
                "faces:bundled answered none within the classes, so every image counts as a disagreement here; "
                "the pairs below compare the evaluators that did answer.")
            pair = page.locator(f"{block} .gl-pairs tr[data-pair='{names[0]} | {names[1]}'] [data-metric='kappa']")
            assert pair.inner_text().startswith("1.000")                    # the two that answer agree
        _answers_inside_their_figures(page, f"{comparison} .gl-trust-axis[data-axis='gender']")
        screenshot(page, "three_evaluators")

        # item 4: the first image's answers, credited
        page.locator("#sp-gallery .thumbnail-item").first.click()
        page.wait_for_selector("#sp-details .gl-question", timeout=30_000)
        questions = page.locator("#sp-details .gl-question")
        assert questions.count() == 2                                       # each question once
        results = _last_run(engine)["results"]
        key = results["images"][0]["key"]
        for q in questions.all():
            axis = q.get_attribute("data-axis")
            shown = {a.get_attribute("data-evaluator"): a.inner_text().split(" → ")[1].split(" (")[0]
                     for a in q.locator(".gl-answer").all()}
            assert shown == results["evaluators"]["axes"][axis]["answers"][key]   # as the comparison counted
            assert list(shown) == names
            assert q.locator(".gl-answer[data-evaluator='clip_vqa:synthetic'] .gl-probs").count() == 1
        screenshot(page, "three_evaluators_image")


def test_an_axis_an_evaluator_cannot_answer_is_left_out_before_any_image(data_dir):
    """Item 2: faces answers gender and age only. With the default axes (placeholder evaluators) the run
    says skin tone is left out from its first update and compares on gender and age; with skin tone
    alone nothing is made and one sentence says why; "Compare evaluators" with faces: is limited alike."""
    engine = Engine("synthetic", data_dir=data_dir)
    with running_app(engine) as url, browser_page(1440, 900) as page:
        page.goto(url, wait_until="load")
        assert page.get_attribute("#sp-evaluators-pick textarea", "placeholder") == "clip_vqa:synthetic, faces:"
        _generate(page, 16, "clip_vqa:synthetic, faces:")
        page.wait_for_function("document.querySelector('#sp-progress').innerText.includes("
                               "'left out of the evaluator comparison: skin tone')", timeout=60_000)
        _done(page)
        comparison = "#sp-axes #sp-evaluators"
        page.wait_for_selector(f"{comparison} .gl-left-out", timeout=30_000)
        assert page.locator(".toast-body.error").count() == 0
        assert [a.get_attribute("data-axis") for a in page.locator(f"{comparison} .gl-trust-axis").all()] == \
            ["gender", "age"]
        assert page.locator(f"{comparison} .gl-left-out [data-axis='skin tone']").count() == 1
        assert "faces evaluator answers only gender and age" in page.inner_text(f"{comparison} .gl-left-out")
        assert page.locator("#sp-axes .gl-axis[data-axis='skin tone']").count() == 1   # still measured

        # "Compare evaluators" on the finished run, with faces: alone
        page.locator("#sp-spot-panel").get_by_text("Check the labels (spot-check").click()
        page.fill("#sp-spot-other textarea", "faces:")
        page.click("#sp-spot-compare")
        page.wait_for_selector("#sp-spot-comparison .gl-left-out", timeout=60_000)
        assert [a.get_attribute("data-axis") for a in
                page.locator("#sp-spot-comparison .gl-trust-axis").all()] == ["gender", "age"]

        # nothing it can answer: refused before any image, in one sentence
        runs, generated = engine.store.count("runs"), engine.stats.generator_calls
        _generate(page, 16, "faces:", axes=("skin tone",), prompt="a photo of a nurse")
        page.wait_for_selector(".toast-body.error", timeout=30_000)
        assert "no axis can be compared across these evaluators: the faces evaluator answers only gender and age" \
            in page.inner_text(".toast-body.error")
        assert engine.store.count("runs") == runs and engine.stats.generator_calls == generated


def test_no_image_answered_by_both_and_an_axis_nothing_answered(data_dir):
    """Item 3: CLIP (the run's evaluator) says "can't tell" on every skin tone: κ is undefined, not
    0.000 [0.000, 0.000], and each evaluator's count shows. Item 12: that axis reads one sentence, not
    "n/a [n/a, n/a]"; the "can't tell" bar has its interval. Item 11: the gap heatmap's y title clears
    its row labels."""
    engine = Engine("synthetic", data_dir=data_dir, vqa="clip_vqa:synthetic")
    with running_app(engine) as url, browser_page(1440, 900) as page:
        page.goto(url, wait_until="load")
        _generate(page, 16, "synthetic_vqa:synthetic_world.json", axes=("gender", "skin tone"))
        _done(page)
        tone = "#sp-axes #sp-evaluators .gl-trust-axis[data-axis='skin tone']"
        page.wait_for_selector(tone, timeout=30_000)
        assert page.inner_text(f"{tone} [data-metric='kappa']") == "undefined: no image answered by both"
        assert "0.000 [0.000, 0.000]" not in page.inner_text(tone)
        counts = {a.get_attribute("data-evaluator"): a.get_attribute("data-answered")
                  for a in page.locator(f"{tone} .gl-answered").all()}
        assert counts == {"clip_vqa:synthetic": "0", "synthetic_vqa:synthetic_world.json": "16"}

        axis = "#sp-axes .gl-axis[data-axis='skin tone']"
        assert "n/a [n/a" not in page.inner_text(axis)
        assert page.inner_text(f"{axis} .gl-nothing-answered").startswith(
            "No image was answered within the classes (16 \"can't tell\")")
        page.wait_for_selector(f"#sp-axes {drawn('axis-skin tone')}", timeout=30_000)
        bar = next(r for r in chart_rows(page, "axis-skin tone") if r["label"] == "can't tell")
        assert bar["value"] == 1.0 and 0.75 < bar["low"] < 1.0 and bar["ci"].startswith("[0.")

        page.wait_for_selector(drawn("gap-heatmap"), timeout=60_000)
        title, labels = page.evaluate("""() => {
          const svg = document.querySelector(".gl-vega[data-chart='gap-heatmap'] svg");
          const title = [...svg.querySelectorAll('.role-axis-title text')]
            .find(t => t.textContent === 'LLM text variation').getBoundingClientRect();
          const left = Math.min(...[...svg.querySelectorAll('.role-axis-label text')]
            .map(t => t.getBoundingClientRect()).filter(r => r.width > r.height * 4)
            .map(r => r.left));
          return [title.right, left];
        }""")
        assert title <= labels, (title, labels)
        screenshot(page, "no_image_answered_by_both")
