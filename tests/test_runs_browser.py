"""The exported HTML report and the study form in headless Chromium (file://, no network), and
the Runs tab of the real app (a run made by the CLI is listed and opens)."""
import contextlib
import csv
import io
import zipfile

import pytest

from apphelpers import browser_page, open_in_runs_tab, running_app, screenshot
from engine.tools import study
from engine.report import export
from engine.report.study import form_page
from engine.methods import single_prompt
from runhelpers import done_event

pytestmark = pytest.mark.browser

ALL_IMAGES_LOADED = "(sel) => [...document.querySelectorAll(sel)].every(i => i.complete && i.naturalWidth > 0)"


def _single(engine, prompt, n=8):
    request = single_prompt.SinglePromptRequest(prompt, n=n, n_boot=100)
    return done_event(single_prompt.run(request, engine)).run_id


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium page for the module (starting Chromium is the slow part)."""
    with browser_page() as page:
        yield page


@contextlib.contextmanager
def offline(page):
    """Abort (and record) every request that would leave the machine."""
    attempts = []

    def handle(route):
        url = route.request.url
        if url.startswith(("file:", "data:", "blob:")):
            route.continue_()
        else:
            attempts.append(url)
            route.abort()

    page.route("**/*", handle)
    try:
        yield attempts
    finally:
        page.unroute("**/*")


def test_report_opens_offline_with_its_charts_and_images(engine, tmp_path, browser):
    ids = [_single(engine, "a photo of a doctor"), _single(engine, "a photo of a nurse")]
    path = tmp_path / "report.html"
    path.write_text(export.report_html(engine.store, ids), encoding="utf-8")
    page = browser
    with offline(page) as attempts:
        page.goto(path.as_uri(), wait_until="load")
        page.wait_for_function(f"({ALL_IMAGES_LOADED})('img')", timeout=20_000)
        assert page.locator("section.gl-run").count() == 3  # two runs and their comparison
        # each run's three axis charts, and the comparison's two per axis
        # drawn offline by the inlined runtime, as in the tab
        page.wait_for_function("document.querySelectorAll('.gl-vega[data-rendered] svg').length == 14", timeout=20_000)
        assert page.locator(".gl-vega[data-chart='axis-gender']").count() == 4
        assert page.locator("#gap-heatmap .mark-rect.role-mark path").count() > 0
        assert page.locator("section#run-%s .gl-thumb img" % ids[0]).count() == 8
        sizes = page.eval_on_selector_all(".gl-thumb img", "els => els.map(e => e.naturalWidth)")
        assert len(sizes) >= 16 and min(sizes) > 0
        assert "a photo of a nurse" in page.inner_text("body")
        screenshot(page, "runs_report")
        page.emulate_media(media="print")  # printable: no table of contents, collapsed details hidden
        assert not page.is_visible(".gl-toc")
        assert page.locator(".gl-vega svg").first.is_visible()
        page.emulate_media(media="screen")
    assert attempts == []


def test_study_form_works_offline_and_its_csv_imports(engine, tmp_path, browser):
    ids = [_single(engine, p) for p in ("a photo of a doctor", "a photo of a nurse", "a photo of a teacher")]
    pack = study.build_pack(engine, ids, question="pair", axis="gender", images_per_set=4, seed=2, n_attention=1)
    key = pack["key"]
    with zipfile.ZipFile(study.write_pack(pack, tmp_path / "pack.zip", form_page(pack))) as zf:
        zf.extract("participant/study.html", tmp_path)
    form = key["forms"][1]
    page = browser
    with offline(page) as attempts:
        page.goto((tmp_path / "participant" / "study.html").as_uri() + "#form=2", wait_until="load")
        assert page.input_value("#form-number") == "2"
        page.click("#start")
        assert "participant ID" in page.inner_text("#start-error")
        page.fill("#participant", "P 7")
        page.click("#start")
        for n, item in enumerate(form["items"]):
            page.wait_for_function(f"document.querySelector('#progress').innerText.startsWith('Item {n + 1} ')")
            page.wait_for_function(f"({ALL_IMAGES_LOADED})('#sets img')", timeout=10_000)
            assert page.locator("#sets img").count() == 8  # two sets of four
            assert page.locator("#sets .set h3").all_inner_texts() == ["Left set", "Right set"]
            if n == 0:
                screenshot(page, "study_form")
            assert page.is_disabled("#next")
            answer = item["expected"] if item["kind"] == "attention" else "left"
            if item["kind"] == "attention":
                assert "Attention check" in page.inner_text("#question")
            else:
                assert page.inner_text("#question") == key["question"]
            page.check(f"#options input[value='{answer}']")
            page.click("#next")
        with page.expect_download() as download:
            page.click("#download")
        saved = tmp_path / "answers.csv"
        download.value.save_as(saved)
        assert download.value.suggested_filename == "answers-P_7-form2.csv"
    assert attempts == []
    text = saved.read_text()
    rows = list(csv.DictReader(io.StringIO(text)))
    assert [r["item"] for r in rows] == [i["item"] for i in form["items"]]
    assert all(r["participant"] == "P 7" and r["form"] == "2" and int(r["rt_ms"]) >= 0 for r in rows)
    analysis = study.analyse(key, [text])
    assert analysis["participants"] == 1 and analysis["failed_attention"] == []
    assert analysis["answers"] == key["design"]["trials_per_form"]
    assert analysis["self_consistency"] == 0.0  # "always left" never picks the same set both ways round


def test_runs_tab_lists_a_cli_run_and_opens_it(engine, tmp_path, browser):
    from gradio_client import Client

    from engine.__main__ import main

    data = str(engine.store.data_dir)
    assert main(["generate", "--preset", "synthetic", "--data-dir", data, "--prompt", "a photo of a farmer",
                 "-n", "6", "--quiet"]) == 0
    run_id = engine.store.list_runs()[0]["id"]
    other = _single(engine, "a photo of a chef", n=6)
    with running_app(engine) as url:
        client = Client(url, verbose=False)
        table, _, _, message = client.predict("farmer", "all", "all", "newest", [], api_name="/runs_list")
        assert [row[0] for row in table["data"]] == [run_id] and "1 run(s) shown" in message
        assert table["data"][0][1:3] == ["generate", "a photo of a farmer"]
        view, gallery = client.predict([run_id], api_name="/runs_open")
        assert "a photo of a farmer" in view and "generate-count" in view and len(gallery) == 6
        files, _ = client.predict([run_id, other], api_name="/runs_export_html")
        assert len(files) == 1 and open(files[0], encoding="utf-8").read().rsplit("</head>", 1)[1].count("<img") == 24  # runs + comparison

        page = browser
        page.goto(url, wait_until="load")
        open_in_runs_tab(page, "farmer", "a photo of a chef", "#runs-view .gl-vega[data-chart='axis-gender']")
        page.locator("#runs-table").get_by_text("a photo of a farmer").filter(visible=True).first.click()
        page.wait_for_selector("#runs-view #generate-count", timeout=30_000)
        page.wait_for_function("document.querySelectorAll('#runs-gallery img').length >= 6", timeout=30_000)
        page.wait_for_function(f"({ALL_IMAGES_LOADED})('#runs-gallery img')", timeout=30_000)
        page.click("#runs-compare-btn")
        page.wait_for_selector("#runs-comparison .gl-compare-table", timeout=30_000)
        assert "different methods" in page.inner_text("#runs-comparison")
        screenshot(page, "runs_tab")


def test_the_runs_tab_lists_runs_made_after_the_page_opened_and_keeps_its_filters(engine, browser):
    _single(engine, "a photo of a baker", n=4)
    search = "#runs-search textarea, #runs-search input"
    with running_app(engine) as url:
        page = browser
        page.goto(url, wait_until="load")
        page.get_by_role("tab", name="Runs").click()
        page.wait_for_function("document.querySelector('#runs-table').innerText.includes('a photo of a baker')",
                               timeout=30_000)
        page.fill(search, "tailor")
        page.press(search, "Enter")
        page.wait_for_function("!document.querySelector('#runs-table').innerText.includes('a photo of a baker')",
                               timeout=30_000)
        page.get_by_role("tab", name="Single Prompt").click()
        _single(engine, "a photo of a tailor", n=4)     # made after the page opened (another tab, the CLI)
        open_in_runs_tab(page, "a photo of a tailor", "a photo of a tailor", "#runs-view")
        assert page.input_value(search) == "tailor"
        assert "a photo of a baker" not in page.inner_text("#runs-table")   # the search still applies


def test_compare_right_after_clicking_two_rows_compares_the_two_runs_the_selection_shows(engine, browser):
    """Issue 42: two rows clicked, then Compare at once (no wait between the clicks): the selection holds
    both runs, as the page shows, and Compare compares them (it once answered "pick at least two runs")."""
    first, second = _single(engine, "a photo of a potter", n=4), _single(engine, "a photo of a weaver", n=4)
    with running_app(engine) as url:
        page = browser
        page.goto(url, wait_until="load")
        page.get_by_role("tab", name="Runs").click()
        page.wait_for_function("['a photo of a potter', 'a photo of a weaver'].every(p => "
                               "document.querySelector('#runs-table').innerText.includes(p))", timeout=30_000)
        for prompt in ("a photo of a potter", "a photo of a weaver"):
            page.locator("#runs-table").get_by_text(prompt).filter(visible=True).first.click()
        page.click("#runs-compare-btn")
        page.wait_for_selector("#runs-comparison .gl-compare-table", timeout=60_000)
        compared = page.inner_text("#runs-comparison")
        assert first in compared and second in compared
        page.wait_for_function("ids => ids.every(i => document.querySelector('#runs-selected').innerText.includes(i))",
                               arg=[first, second], timeout=30_000)
        assert page.locator(".toast-body").count() == 0
