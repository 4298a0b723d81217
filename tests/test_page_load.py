"""Issue 42.14: a fresh page, as a visitor waits for it. The chart runtime (0.9 MB) is a file the
browser fetches once and keeps, not text inlined in every page; the start-up sends two load events
(what the page shows, then the generator's defaults), not one per part of the page. How long it
takes is measured by bench/page_load.py, never by a test."""
from __future__ import annotations

import gradio as gr
import pytest

from engine.report import charts
from tabs.common import LoadHook, together


def _load_events(demo) -> list:
    return [fn for fn in demo.fns.values() if any(event == "load" for _, event in fn.targets)]


def test_a_fresh_page_sends_two_load_events_the_second_for_what_may_load_a_model(engine):
    import app

    demo = app.build_app(engine)
    shows, defaults = _load_events(demo)
    ids = lambda fn: {getattr(o, "elem_id", None) for o in fn.outputs}   # noqa: E731
    # the first: the runs lists, a link's Explore view, and every optional number set empty (not 0)
    assert {"runs-table", "mine-runs", "ex-tree", "ex-strips", "sp-steps", "ic-p-threshold"} <= ids(shows)
    # the second: the generator's defaults as placeholders (it may load the generator)
    assert {"sp-steps", "cf-steps", "ic-steps", "mt-steps", "ex-steps"} <= ids(defaults)
    assert not {"runs-table", "ex-tree"} & ids(defaults)
    # after a model change, the placeholders again, in one event
    changed = [fn for fn in demo.fns.values() if any(event == "change" for _, event in fn.targets)
               and {o.elem_id for o in fn.outputs if getattr(o, "elem_id", None)} == ids(defaults) - {None}]
    assert len(changed) == 1


def test_together_runs_every_hook_in_one_call_and_one_failing_leaves_the_others(monkeypatch):
    with gr.Blocks():
        a, b, c, d = gr.Textbox(), gr.Textbox(), gr.Textbox(), gr.Textbox()
    warned = []
    monkeypatch.setattr(gr, "Warning", warned.append)

    def broken():
        raise gr.Error("the runs could not be listed")

    seen = []
    hooks = [LoadHook(lambda: "one", [a]),                                    # one output: its value
             LoadHook(lambda request: (seen.append(request), ("x", "y"))[1], [b, c], lambda: ("X", "Y")),
             LoadHook(broken, [d])]
    hook = together(hooks)
    assert hook.outputs == [a, b, c, d] and not hook.loads_models
    values = hook.fn("the page's request")
    assert values[:3] == ("one", "x", "y") and values[3] == gr.skip() and seen == ["the page's request"]
    assert warned == ["part of the page could not be filled in: the runs could not be listed"]
    assert hook.after_model_change() == (gr.skip(), "X", "Y", gr.skip())
    assert together([LoadHook(lambda: None, [a], loads_models=True)]).loads_models


def test_the_page_links_the_chart_runtime_as_a_file_browsers_keep_and_exports_still_inline_it(engine):
    from apphelpers import http_get, running_app

    runtime = charts.runtime_js()
    with running_app(engine) as url:
        status, page = http_get(url)
        assert status == 200 and len(page) < len(runtime)          # it was 1.7 MB with the runtime inlined twice
        assert runtime[:2000].encode() not in page
        address = page.decode().split('gradio_api/file=', 1)[1].split('\\"', 1)[0]
        assert address.rsplit("/", 1)[-1].startswith("gaplens-charts-") and address.endswith(".js")
        import urllib.request

        with urllib.request.urlopen(f"{url}gradio_api/file={address}", timeout=30) as response:
            assert response.read().decode() == runtime
            assert response.headers["cache-control"] == "public, max-age=31536000, immutable"
        # nothing else in its folder is served, and no other file is kept for good
        other = charts.runtime_file(f"{address.rsplit('/', 1)[0]}").with_name("other.js")
        other.write_text("x")
        try:
            assert http_get(f"{url}gradio_api/file={other}")[0] == 403
        finally:
            other.unlink()
    assert runtime in str(charts.runtime_head())   # an exported report opens with the network off


@pytest.mark.parametrize("public", [False, True])
def test_the_runtime_is_served_in_public_mode_too_and_nothing_else_with_it(tmp_path, public):
    import app
    from engine.core.engine import Engine
    from engine.hosting.limits import Budget

    engine = Engine("synthetic", data_dir=str(tmp_path / "store"), public=public,
                    budget=Budget() if public else None)
    demo = app.build_app(engine)
    options = app.launch_options(engine, demo)
    middleware = [m.cls.__name__ for m in options["app_kwargs"]["middleware"]]
    assert middleware == ["CacheForever", "FairQueueMiddleware"] if public else middleware == ["CacheForever"]
    assert "gaplens-charts-" in options["head"] and options["allowed_paths"] == ([] if public else
                                                                                  [str(engine.store.image_dir)])


def test_a_runs_done_line_counts_from_the_click_not_from_its_run_record(engine):
    """Single Prompt said "measured in 3 s" after a 10 s wait: the run's record starts after the
    check, the queue and the models; the line now counts from the click's check (`clicked`)."""
    import time
    from types import SimpleNamespace

    from gradio.context import LocalContext

    from tabs import common, single_prompt
    from tabs.common import View

    token = LocalContext.request.set(SimpleNamespace(session_hash="visitor-session"))
    try:
        common.clicked()
        at = common._CLICKS["visitor-session"]
        assert View().started == at and "visitor-session" not in common._CLICKS   # the click, used up
        common.clicked()
        common._CLICKS["visitor-session"] -= 30.0   # the click was 30 s before the run began
        *_, last = single_prompt.measure(engine, "a photo of a doctor", 4, axes=["gender"])
    finally:
        LocalContext.request.reset(token)
    progress = last[single_prompt.OUTPUTS.index("progress")]
    state = last[single_prompt.OUTPUTS.index("state")]
    seconds = float(progress.split(" measured in ", 1)[1].split(" s", 1)[0])
    assert seconds >= 30.0 > engine.store.get_run(state["run_id"])["summary"]["seconds"]
    assert View().started <= time.perf_counter()   # no click known (an API call): from now


@pytest.mark.browser
def test_a_links_charts_draw_in_a_fresh_browser_from_the_runtime_file_which_a_second_visit_does_not_fetch(engine):
    from apphelpers import browser_page, running_app

    from engine.methods import explore

    tree = next(e for e in explore.run(explore.ExploreRequest(prompt="a photo of a doctor", n=8), engine)
                if type(e).__name__ == "Done").run_id
    chart = ".gl-vega[data-rendered] svg"
    runtime = "performance.getEntriesByType('resource').filter(e => e.name.includes('gaplens-charts-'))" \
              ".map(e => e.transferSize)"
    with running_app(engine) as url, browser_page() as page:
        responses, joins = [], []
        page.on("response", lambda r: responses.append(r))
        page.on("request", lambda r: joins.append(r.url) if r.method == "POST" and "/queue/join" in r.url else None)
        page.goto(f"{url}?tab=explore&tree={tree}", wait_until="load")
        page.wait_for_selector(chart, timeout=120_000)
        document = next(r for r in responses if r.request.resource_type == "document")
        assert len(document.body()) < 1_000_000                              # 1.7 MB with the runtime inlined
        file = next(r for r in responses if "gaplens-charts-" in r.url)
        assert file.status == 200 and file.headers["cache-control"] == "public, max-age=31536000, immutable"
        assert page.evaluate(runtime)[0] > 0 and len(joins) == 2            # fetched once; two load events
        page.goto(f"{url}?tab=explore&tree={tree}", wait_until="load")      # a second visit: from the cache
        page.wait_for_selector(chart, timeout=120_000)
        assert page.evaluate(runtime) == [0]
