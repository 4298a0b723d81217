"""Hostile strings in every text field that reaches a page render as text, never as markup.

Each method runs on the synthetic world (small N); then every string of its results (values,
and the dict keys that are data: axis names, class values, set labels, concepts, ...) is
rewritten to carry a payload, as an imported or LLM-written run could. Every method page, the
tabs' fragments, the Runs view and comparison, the exported report, the study form and its
analysis are rendered and loaded in headless Chromium with a tripwire: no payload may run
(`window.__pwned` stays undefined, no dialog), no element may carry an event-handler attribute
or a `javascript:` URL, no script may appear that the page did not ship, and the payloads must
read as visible text. Then the real app: a hostile prompt and a hostile free-text axis typed
into Single Prompt, and the resulting run opened in the Runs tab."""
import csv
import io

import pytest

from apphelpers import browser_page, running_app, screenshot
from engine.runs import history as runs
from engine.tools import study
from engine.core.engine import Engine
from engine.common.events import Done
from engine.methods import counterfactuals, generate, intersectional, mine, mitigate, single_prompt
from engine.report import page_for
from engine.report import counterfactuals as cf_page
from engine.report import export
from engine.report import intersectional as ic_page
from engine.report import mine as mine_page
from engine.report import mitigate as mt_page
from engine.report import single_prompt as sp_page
from engine.report.runs import compare_html, open_run
from engine.report.study import analysis_html, form_page
from runhelpers import done_event

pytestmark = pytest.mark.browser

PAYLOADS = ['<img src=x onerror="window.__pwned=1">', "'\"><script>window.__pwned=1</script>",
            "gender' onmouseover='window.__pwned=1' x='", "</script><script>window.__pwned=1</script>",
            "javascript:window.__pwned=1", '<svg onload="window.__pwned=1;alert(1)">']
SCHEMA = {"prompt"}  # a key of the results that is also a value ("level": "prompt")
AXES = {"gender": ["a photo of a male doctor", "a photo of a female doctor"],
        "age": ["a photo of a young doctor", "a photo of a middle-aged doctor", "a photo of an old doctor"]}

# Everything a page may not contain: event-handler attributes and javascript: URLs anywhere.
INSPECT = """(root) => {
  const bad = [];
  const scope = root ? document.querySelector(root) : document;
  for (const el of scope.querySelectorAll('*')) {
    for (const a of el.attributes) {
      if (a.name.toLowerCase().startsWith('on')) bad.push(el.tagName + '[' + a.name + ']');
      if (/^\\s*javascript:/i.test(a.value) && /^(href|src|action|formaction|xlink:href|data|srcdoc)$/i.test(a.name))
        bad.push(el.tagName + '[' + a.name + '=javascript:]');
    }
  }
  return {pwned: typeof window.__pwned, bad: bad, scripts: scope.querySelectorAll('script').length,
          text: root ? scope.innerText : (document.body ? document.body.innerText : '')};
}"""


class Hostile:
    """Rewrites strings to carry one payload (in front, so a label's prefix stays a prefix)."""

    def __init__(self, payload: str):
        self.payload = payload

    def __call__(self, value: str) -> str:
        return self.payload + value

    def poison(self, obj, context=None, data: set | None = None):
        """`obj` with every string value made hostile, and every dict key that is also a value
        somewhere in `obj` or `context` (e.g. the run's request): axis names, classes, labels,
        concepts are data; keys that are the results' schema are kept."""
        if data is None:
            data = (strings(obj, set()) | strings(context, set())) - SCHEMA
        if isinstance(obj, str):
            return self(obj)
        if isinstance(obj, dict):
            return {(self(k) if isinstance(k, str) and k in data else k): self.poison(v, data=data)
                    for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.poison(v, data=data) for v in obj]
        return obj


def strings(obj, out: set) -> set:
    if isinstance(obj, str):
        out.add(obj)
    elif isinstance(obj, dict):
        for v in obj.values():
            strings(v, out)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            strings(v, out)
    return out


def real_runs(engine) -> dict[str, Done]:
    """One small real run of every method on the synthetic world."""
    prompt = "a photo of a doctor"
    return {
        "single_prompt": done_event(single_prompt.run(single_prompt.SinglePromptRequest(
            prompt, n=8, n_boot=100, axes=["gender", "age", "hair colour"]), engine)),
        "generate": done_event(generate.run(generate.GenerateRequest(prompt, n=4, negative_prompt="blurry"), engine)),
        "counterfactuals": done_event(counterfactuals.run(counterfactuals.CounterfactualsRequest(
            prompt, axes=AXES, n=8, n_boot=100), engine)),
        "intersectional": done_event(intersectional.run(intersectional.IntersectionalRequest(
            prompt, axes=AXES, n=8, n_boot=100), engine)),
        "mine": done_event(mine.run(mine.MineRequest(iterations=1, population=4, select=1, mutations=1, n=8), engine)),
        "mitigate": done_event(mitigate.run(mitigate.MitigateRequest(prompt=prompt, axes=AXES, n=8, seed=1, n_boot=100),
                                      engine)),
    }


def plant(engine, hostile: Hostile, method: str, source: dict, *, status: str = "done", suffix: str = "imported") -> str:
    """A stored run as an import could bring it: every text field hostile (id, method name
    unless `method` is kept, status, request, models, version, error, results, set labels)."""
    store = engine.store
    run_id = hostile(f"{source['id']}-{suffix}")
    store.create_run(method, hostile.poison(source["request"]), hostile.poison(source["models"]), hostile("0.1"),
                     run_id=run_id)
    store.update_run(run_id, status=status, results=hostile.poison(source["results"], source["request"]),
                     summary=hostile.poison(source["summary"]),
                     error=hostile("the LLM said no"))
    by_label: dict[str, list] = {}
    for link in source["images"]:
        by_label.setdefault(link["label"], []).append(link["image_key"])
    for label, keys in by_label.items():
        store.add_run_images(run_id, keys, hostile(label or "set"))
    return run_id


def answers_csv(key: dict) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(study.ANSWER_COLUMNS)
    for rater in range(2):
        for form in key["forms"]:
            for item in form["items"]:
                writer.writerow([f"P{rater}{form['form']}", form["form"], item["position"], item["item"],
                                 item["sets"][0], (item["sets"] + [""])[1], item["expected"] or "left", 900])
    return out.getvalue()


def pages(engine, made: dict[str, Done], hostile: Hostile) -> dict[str, str]:
    """Every page and tab fragment, built from the real runs `made` made hostile, and from
    hostile stored copies of them."""
    stored = {m: engine.store.get_run(d.run_id) for m, d in made.items()}
    out = {}
    for method, d in made.items():
        results = hostile.poison(d.results, stored[method]["request"])
        out[f"page:{method}"] = page_for(method)(results)
        if method == "counterfactuals":
            cf_label = next(label for label in d.results["sets"] if "axis=" in label)
            initial = cf_page.initial_label(cf_label)  # the drill finds the initial set by the label's prefix
            sets = {**results["sets"], cf_page.initial_label(hostile(cf_label)): results["sets"].get(hostile(initial),
                                                                                    results["sets"].get(initial))}
            out["tab:counterfactuals-drill"] = cf_page.drill_html({**results, "sets": sets}, hostile(cf_label))
            by_label: dict[str, list] = {}
            for record, label in runs.run_records(engine.store, stored[method]):
                by_label.setdefault(hostile(label) + hostile.payload, []).append(record)  # the title is the end
            out["tab:counterfactuals-sets"] = cf_page.sets_html(by_label)
            out["tab:counterfactuals-parts"] = cf_page.mad_html(results) + cf_page.cas_html(cf_page.by_axis(results))
        if method == "intersectional":
            x, y = results["sensitivity"]["axes"][:2]
            out["tab:intersectional"] = (ic_page.summary_html(results) + ic_page.matrix_html(results)
                                         + ic_page.pair_html(results, x, y)
                                         + ic_page.iframe(ic_page.graph_from_results(results), elem_id="ic-graph"))
            out["graph:document"] = ic_page.graph_from_results(results)  # its script data, at top level
        if method == "mine":
            node = d.results["archive"][0]["id"]
            head, gap = mine_page.selected_html(hostile.poison(mine.prompt_details(engine, d.results, node, d.run_id)))
            out["tab:mine"] = (mine_page.progress_text(results, hostile(d.run_id), hostile("Running")) + head + gap
                               + mine_page.mine_chart(results))
        if method == "mitigate":
            out["tab:mitigate"] = mt_page.preview_html(results.get("preview")) + mt_page.page(results, with_preview=False)
        if method == "single_prompt":
            axes = results["axes"]
            out["tab:single_prompt"] = (sp_page.axes_html(sp_page.axis_html(a, m) for a, m in axes.items())
                                        + sp_page.gap_html(results["gap"]))
    planted = {m: plant(engine, hostile, m, stored[m]) for m in made}
    odd = plant(engine, hostile, hostile("some_method"), stored["single_prompt"], status=hostile("done"), suffix="odd")
    twin = plant(engine, hostile, "single_prompt", stored["single_prompt"], suffix="twin")
    for method, run_id in [*planted.items(), ("unknown", odd)]:
        out[f"runs:{method}"] = open_run(engine.store, run_id)["html"]
    out["runs:compare-same"] = compare_html(runs.compare_runs(engine.store, [planted["single_prompt"], twin]),
                                            engine.store)
    out["runs:compare-mixed"] = compare_html(runs.compare_runs(engine.store, [planted["generate"], odd]),
                                             engine.store)
    out["export:report"] = export.report_html(engine.store, [*planted.values(), odd])
    pack = study.build_pack(engine, [planted["single_prompt"], planted["generate"], twin], question="pair",
                            axis=hostile("gender"), images_per_set=2, seed=0, n_attention=1)
    out["study:form"] = form_page(pack)
    out["study:analysis"] = analysis_html(hostile.poison(study.analyse(pack["key"], [answers_csv(pack["key"])])))
    return {name: str(html) for name, html in out.items()}


SCRIPTS = {"study:form": 2, "graph:document": 2, "export:report": 1}   # the pages' own scripts


@pytest.fixture(scope="module")
def browser():
    """One headless Chromium for the module, recording every dialog a page opens."""
    with browser_page() as page:
        page.dialogs = []
        page.on("dialog", lambda dialog: (page.dialogs.append(dialog.message), dialog.dismiss()))
        yield page


def check(page, name: str, scripts: int = 0, root: str = "") -> str:
    """The visible text of the page (or of its element `root`), after asserting that nothing
    ran, no handler or javascript: URL was planted and no script was added."""
    seen = page.evaluate(INSPECT, root)
    assert seen["pwned"] == "undefined", name
    assert seen["bad"] == [], (name, seen["bad"][:5])
    assert seen["scripts"] == scripts, (name, seen["scripts"])
    assert page.dialogs == [], (name, page.dialogs)
    for frame in page.frames[1:]:
        assert frame.evaluate("typeof window.__pwned") == "undefined", name
        assert frame.evaluate(INSPECT, "")["bad"] == [], name
    return seen["text"]


def test_every_page_shows_hostile_strings_as_text(tmp_path, browser):
    engine = Engine("synthetic", data_dir=str(tmp_path / "store"), max_images=256)
    made = real_runs(engine)
    page = browser
    for payload in PAYLOADS:  # every field with every payload: each breaks out of another context
        hostile = Hostile(payload)
        graph_axes = [hostile(a) for a in made["intersectional"].results["sensitivity"]["axes"]]
        for name, html in pages(engine, made, hostile).items():
            page.set_content(html, wait_until="load")
            if "<iframe" in html:  # the BiasGraph document: vis-network drew the hostile axis names
                page.frame_locator("iframe").first.locator("canvas").wait_for(timeout=30_000)
            if name == "graph:document":
                page.locator("canvas").wait_for(timeout=30_000)
            if name == "study:form":  # the question (with the hostile axis) shows once the form starts
                page.fill("#participant", hostile("P1"))
                page.click("#start")
                page.wait_for_selector("#sets img")
            if name == "export:report":  # its one script, the chart runtime, drew every chart from hostile labels
                page.wait_for_function("[...document.querySelectorAll('.gl-vega')].every(e => e.dataset.rendered)",
                                       timeout=30_000)
            text = check(page, f"{name} with {payload}", SCRIPTS.get(name, 0))
            if name == "graph:document":  # drawn on a canvas: the names must reach vis intact, as data
                assert page.evaluate("nodes.get().map(n => n.id)") == graph_axes
                text = page.evaluate("nodes.get().map(n => n.label).join(' ')")
            assert payload in text, (name, payload, text[:300])


def test_the_app_shows_a_hostile_prompt_and_axis_as_text(engine, browser):
    prompt = '<img src=x onerror="window.__pwned=1"> a photo of a doctor'
    axis = "gender' onmouseover='window.__pwned=1' x='"
    page = browser
    with running_app(engine) as url:
        page.goto(url, wait_until="load")
        page.wait_for_selector("#sp-prompt textarea", timeout=30_000)
        page.fill("#sp-prompt textarea", prompt)
        page.fill("#sp-n input[type=number]", "8")
        page.press("#sp-n input[type=number]", "Enter")
        page.get_by_label("More axes (free text, comma-separated)").fill(axis)
        page.click("#sp-generate")
        page.wait_for_function("document.querySelector('#sp-progress').innerText.includes('Done')", timeout=60_000)
        page.wait_for_selector("#sp-axes .gl-axis", timeout=30_000)
        for block in page.locator("#sp-axes [data-axis]").all():
            block.hover()
        assert axis in check(page, "single prompt tab", root="#sp-axes")
        assert [a for a in page.eval_on_selector_all("#sp-axes [data-axis]", "els => els.map(e => e.dataset.axis)")
                if a == axis] == [axis]
        run_id = engine.store.list_runs()[0]["id"]

        page.get_by_role("tab", name="Runs").click()
        page.click("#runs-refresh")  # the run was made after the page loaded
        page.wait_for_function("document.querySelector('#runs-table').innerText.includes('img src=x')",
                               timeout=30_000)
        page.locator("#runs-table").get_by_text(run_id).filter(visible=True).first.click()
        page.wait_for_selector("#runs-view .gl-run-header", timeout=30_000)
        for block in page.locator("#runs-view [data-axis]").all():
            block.hover()
        view = check(page, "runs tab", root="#runs-view")
        assert prompt in view and axis in view, view[:500]
        screenshot(page, "payload_runs_tab")
