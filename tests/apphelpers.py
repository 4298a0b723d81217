"""Start the real app in-process on a free port, and drive it in headless Debian Chromium."""
from __future__ import annotations

import contextlib
import os
import shutil
import socket
from pathlib import Path

ARTIFACTS = Path(os.environ.get("GAPLENS_TEST_ARTIFACTS", Path(__file__).resolve().parent.parent / "test-artifacts"))
CHROMIUM_ARGS = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def running_app(engine, demo=None):
    """The GapLens app built exactly as `python app.py` builds it (or `demo`, built so by the
    caller), served on 127.0.0.1."""
    import app

    demo = demo or app.build_app(engine)
    port = free_port()
    demo.launch(server_name="127.0.0.1", server_port=port, prevent_thread_lock=True, quiet=True,
                **app.launch_options(engine, demo))
    try:
        yield f"http://127.0.0.1:{port}/"
    finally:
        demo.close()


def chart_rows(page, chart_id: str) -> list[dict]:
    """The rows (one per mark) of the chart `chart_id` on the page: the data of its Vega-Lite spec."""
    import json

    spec = json.loads(page.locator(f".gl-vega[data-chart='{chart_id}']").first.get_attribute("data-spec"))
    return spec["data"]["values"]


def drawn(chart_id: str) -> str:
    """The selector of the chart `chart_id` once the runtime has drawn it (an SVG with its marks)."""
    return f".gl-vega[data-chart='{chart_id}'][data-rendered] svg"


def http_get(url: str) -> tuple[int, bytes]:
    """(status, body) of a plain GET with no session, error statuses included."""
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(url, timeout=30) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@contextlib.contextmanager
def browser_page(width: int = 1400, height: int = 1000):
    import pytest

    path = chromium_path()
    if path is None:
        if os.environ.get("CI"):
            raise RuntimeError("Debian's chromium is required for browser tests in CI (.ci/run installs it)")
        pytest.skip("chromium not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            yield page
        finally:
            browser.close()


def screenshot(page, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def open_in_runs_tab(page, listed: str, row_text: str, view_selector: str) -> None:
    """Go to the Runs tab, wait until the table lists `listed`, click the row showing
    `row_text` and wait for `view_selector` in the opened run's view."""
    page.get_by_role("tab", name="Runs").click()
    page.wait_for_function(f"document.querySelector('#runs-table').innerText.includes({listed!r})", timeout=30_000)
    page.locator("#runs-table").get_by_text(row_text).filter(visible=True).first.click()
    page.wait_for_selector(view_selector, timeout=30_000)


def propose_and_run(page, prefix: str, n: int, timeout: int, prompt: str = "a photo of a doctor") -> None:
    """In the open tab whose ids start `prefix` (ic, mt): type `prompt`, let the LLM propose the axes,
    set N and run; returns when the status line says Done."""
    page.fill(f"#{prefix}-prompt textarea", prompt)
    page.click(f"#{prefix}-propose")
    page.wait_for_function(f"document.querySelector('#{prefix}-axes').innerText.includes('gender')", timeout=timeout)
    field = page.locator(f"#{prefix}-n input[type='number']")
    field.fill(str(n))
    field.press("Enter")
    page.click(f"#{prefix}-run")
    page.wait_for_function(f"document.querySelector('#{prefix}-progress').innerText.includes('Done')", timeout=timeout)
