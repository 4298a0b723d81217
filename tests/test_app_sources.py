"""The model panel's options field in the page, and Single Prompt over a folder of existing images:
one app start serving every check."""
import pytest

from apphelpers import browser_page, running_app
from test_image_sources import synthetic_folder

from engine.core.engine import Engine


@pytest.mark.browser
def test_model_panel_sets_a_folder_source_with_options_and_single_prompt_scores_it(tmp_path, engine):
    maker = Engine("synthetic", data_dir=str(tmp_path / "maker"))
    root, _ = synthetic_folder(tmp_path, maker, {"a photo of a nurse": 3})
    with running_app(engine) as url, browser_page() as page:
        page.goto(url, wait_until="load")
        page.click("#model-panel button")          # open the Models accordion
        page.wait_for_selector("#model-name textarea", timeout=30_000)
        page.fill("#model-name textarea", f"folder:{root}")
        page.fill("#model-options textarea", "api_key=sk-do-not-store")
        page.click("#use-model")
        page.wait_for_selector(".toast-body", timeout=30_000)
        assert "secret" in page.inner_text(".toast-body")
        assert engine.preset.generator.backend == "synthetic_generator"     # nothing changed
        page.fill("#model-options textarea", "prompt_column=prompt")
        page.click("#use-model")
        page.wait_for_function("document.querySelector('#engine-status').innerText.includes('Existing images')",
                               timeout=30_000)
        status = page.inner_text("#engine-status")
        assert "folder:" in status and "prompt_column=prompt" in status

        from gradio_client import Client

        client = Client(url, verbose=False)
        final = client.predict(prompt="a photo of a nurse", n=3, axes=["gender"], api_name="/single_prompt")
        assert len(final[0]) == 3 and engine.stats.images_generated == 3
        with pytest.raises(Exception, match="has 3 image"):
            client.predict(prompt="a photo of a nurse", n=4, axes=["gender"], api_name="/single_prompt")
