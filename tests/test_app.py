"""The app as users drive it: gradio_client for the API, headless Chromium for the page."""

import pytest

from apphelpers import browser_page, running_app, screenshot

AXES = ["gender", "age", "skin tone"]   # the endpoint's other inputs keep their defaults


@pytest.fixture
def app_url(engine):
    engine.models.get(engine.preset.generator).batch_size = 4  # 16 images arrive in 4 batches
    with running_app(engine) as url:
        yield url


@pytest.mark.slow
def test_gallery_streams_batch_by_batch_through_gradio_client(app_url, engine):
    from gradio_client import Client

    client = Client(app_url, verbose=False)
    job = client.submit(prompt="a photo of a firefighter", n=16, axes=AXES, api_name="/single_prompt")
    sizes = []
    for output in job:
        gallery = output[0]
        if isinstance(gallery, list):
            sizes.append(len(gallery))
    final = job.result()
    assert len(final[0]) == 16
    assert sizes and sizes[0] < 16, sizes  # the first images arrived before the last batch existed
    assert sizes == sorted(sizes)
    assert engine.stats.generator_calls == 4
    assert "gap-score" in final[4] and "Done" in final[1]


@pytest.mark.slow
def test_bad_input_is_an_error_through_the_api(app_url):
    from gradio_client import Client

    client = Client(app_url, verbose=False)
    with pytest.raises(Exception, match="empty"):
        client.predict(prompt="", n=4, api_name="/single_prompt")
    with pytest.raises(Exception, match="maximum"):
        client.predict(prompt="a photo of a doctor", n=10_000, api_name="/single_prompt")


@pytest.mark.browser
def test_single_prompt_page_shows_images_scores_and_missed_interpretations(app_url):
    with browser_page() as page:
        page.goto(app_url, wait_until="load")
        page.wait_for_selector("#sp-prompt textarea", timeout=30_000)
        # bad input first: an empty prompt shows an error naming the problem
        page.click("#sp-generate")
        page.wait_for_selector(".toast-body", timeout=30_000)
        assert "empty" in page.inner_text(".toast-body").lower()

        page.fill("#sp-prompt textarea", "a photo of a firefighter")
        page.click("#sp-generate")
        page.wait_for_function("document.querySelectorAll('#sp-gallery img').length >= 16", timeout=60_000)
        page.wait_for_selector("#gap-score", timeout=60_000)
        page.wait_for_function("document.querySelector('#sp-progress').innerText.includes('Done')", timeout=60_000)
        assert page.locator("#sp-gallery img").count() == 16
        assert page.locator(".gl-vega[data-chart='axis-gender']").count() == 1
        gender_text = page.inner_text("[data-axis='gender']")
        assert "male" in gender_text and "Composite Bias Score" in gender_text
        gap = float(page.inner_text("#gap-score").split()[0])
        assert gap < 0
        missed = page.inner_text("#missed").lower()
        assert missed.count("female") >= 3
        screenshot(page, "single_prompt")

        # click an image: its seed and VQA answers appear
        page.locator("#sp-gallery .thumbnail-item").nth(2).click()
        page.wait_for_function("document.querySelector('#sp-details').innerText.includes('Seed')", timeout=30_000)
        assert "male" in page.inner_text("#sp-details").lower()
        page.keyboard.press("Escape")
        page.click("#sp-regenerate")
        page.wait_for_function("document.querySelector('#sp-details').innerText.includes('regenerated alone')",
                               timeout=30_000)
        assert "identical" in page.inner_text("#sp-details")
