"""The Explore tab in headless Chromium, on one public GapLens (issue 33): the host builds a 3-node
tree, hovers a dot (its thumbnail appears), clicks it (the image opens), copies the view's link and
opens it in a new page (the same view, no image generated); another visitor's page opening that link
reads exactly as a missing id; the tree's HTML export opens offline with its charts."""
import os

import pytest

from apphelpers import browser_page, running_app, screenshot
from engine.common import access
from engine.core.engine import Engine
from engine.hosting.limits import Budget
from engine.report.explore import tree_document

pytestmark = pytest.mark.browser

HOST_TOKEN = "test-host-token-explore-0123456789"
PARENTS = "els => els.map(e => (e.parentElement.closest('li[data-node]') || {dataset: {}}).dataset.node || '')"
DOT = "#ex-strips .gl-vega[data-chart='explore-strips'][data-rendered] svg g.mark-symbol.role-mark path"


@pytest.fixture(scope="module")
def app(tmp_path_factory):
    """A public GapLens in this process (the host is whoever sends the host token header)."""
    previous = os.environ.get("GAPLENS_HOST_TOKEN")
    os.environ["GAPLENS_HOST_TOKEN"] = HOST_TOKEN
    engine = Engine("synthetic", data_dir=str(tmp_path_factory.mktemp("explore-app")), public=True, max_images=32,
                    budget=Budget())
    try:
        with running_app(engine) as url:
            yield engine, url
    finally:
        if previous is None:
            os.environ.pop("GAPLENS_HOST_TOKEN", None)
        else:
            os.environ["GAPLENS_HOST_TOKEN"] = previous


def step(page, prompt: str, nodes: int) -> str:
    """Type a prompt, Generate, and wait until the tree shows `nodes` nodes; returns the new node's id."""
    page.fill("#ex-prompt textarea", prompt)
    page.click("#ex-go")
    page.wait_for_function(f"document.querySelectorAll('#ex-tree-view li[data-node]').length === {nodes} && "
                           f"document.querySelector('#ex-progress').innerText.includes('Done')", timeout=60_000)
    return page.eval_on_selector("#ex-tree-view li.gl-selected", "e => e.dataset.node")


def test_a_tree_its_dots_and_its_link(app, tmp_path):
    engine, url = app
    with browser_page() as page:
        page.context.set_extra_http_headers({"x-gaplens-host-token": HOST_TOKEN})
        page.goto(url + "?tab=explore", wait_until="load")             # the link names the tab
        page.wait_for_selector("#ex-prompt textarea", state="visible", timeout=60_000)
        page.fill("#ex-n input[type=number]", "8")
        page.press("#ex-n input[type=number]", "Enter")
        root = step(page, "a photo of a doctor", 1)
        child = step(page, "a photo of an old doctor", 2)               # a child of the selected node
        leaf = step(page, "a photo of an old female doctor", 3)
        parents = page.eval_on_selector_all("#ex-tree-view li[data-node]", PARENTS)
        assert parents == ["", root, child]
        assert page.inner_text("#ex-strips h3") == "Explore: a photo of an old female doctor"
        assert page.inner_text("#explore-lean-text").startswith("This set leans 'a photo of a woman' 1.00")
        # hover a dot: its thumbnail; click it: the image opens with its seed and caption
        page.wait_for_selector(DOT, timeout=30_000)
        page.locator(DOT).first.scroll_into_view_if_needed()
        box = page.locator(DOT).first.bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_function("(() => { const i = document.querySelector('#vg-tooltip-element img'); "
                               "return i && i.complete && i.naturalWidth > 0; })()", timeout=20_000)
        screenshot(page, "explore_hover")
        page.mouse.click(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.wait_for_function("(() => { const i = document.querySelector('#ex-image img'); "
                               "return i && i.complete && i.naturalWidth > 0; })()", timeout=30_000)
        assert "Seed" in page.inner_text("#ex-details") and "Caption" in page.inner_text("#ex-details")
        screenshot(page, "explore_tree")
        link = page.eval_on_selector("#ex-link textarea", "e => e.value")
        assert link.startswith(url) and f"tree={root}" in link and f"run={leaf}" in link
        images = engine.store.count("images")
        # the link in a new page: the same tab, tree, node and strips, from the store
        other = page.context.browser.new_context(viewport={"width": 1400, "height": 1000}, extra_http_headers={
            "x-gaplens-host-token": HOST_TOKEN}).new_page()
        other.goto(link, wait_until="load")
        other.wait_for_function("document.querySelectorAll('#ex-tree-view li[data-node]').length === 3",
                                timeout=60_000)
        assert other.eval_on_selector("#ex-tree-view li.gl-selected", "e => e.dataset.node") == leaf
        assert other.inner_text("#explore-lean-text") == page.inner_text("#explore-lean-text")
        other.wait_for_selector(DOT, timeout=30_000)
        assert other.is_visible("#ex-strips")
        screenshot(other, "explore_link")
        assert engine.store.count("images") == images
        # another visitor (no host token): the host's unpublished tree reads as a missing id
        visitor = page.context.browser.new_page(viewport={"width": 1400, "height": 1000})
        visitor.goto(link, wait_until="load")
        visitor.wait_for_function("(document.querySelector('#ex-progress') || {innerText: ''})"
                                  ".innerText.includes('Link')", timeout=60_000)
        text = visitor.inner_text("#ex-progress")
        assert text == f"Link: no tree '{root}' in the store."
        assert visitor.locator("#ex-tree-view li").count() == 0 and "old doctor" not in visitor.inner_text("body")
        screenshot(visitor, "explore_link_other_visitor")
        assert engine.store.count("images") == images
        # the tree's HTML export opens offline with its charts drawn
        with access.acting_as(access.HOST):
            path = tmp_path / "tree.html"
            path.write_text(str(tree_document(engine, root)), encoding="utf-8")
        requests = []
        other.on("request", lambda r: requests.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
        other.goto(path.as_uri(), wait_until="load")
        other.wait_for_function("document.querySelectorAll('.gl-vega[data-rendered]').length === 3", timeout=30_000)
        assert other.locator(".gl-tree li[data-node]").count() == 3 and requests == []
