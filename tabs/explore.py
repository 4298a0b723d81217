"""Explore tab: follow a hunch through a tree of prompts. Each step places a prompt's images (or a
stored run's) on concept strips with the lean; a step's parent is the selected node, so the tree
is the prompting interface. A dot's tooltip shows its thumbnail; a click opens the image. Every
view has a link (`?tab=explore&tree=<id>&run=<node id>`) that reopens it from the store.
Identity clusters group stored runs' images without labels."""
from __future__ import annotations

import functools
import json
import time
from urllib.parse import urlencode

import gradio as gr

from engine.common.errors import InputError
from engine.common.events import Done, Progress
from engine.hosting.space import GpuWork
from engine.methods import explore
from engine.methods.axes import known_axes
from engine.methods.explore import ExploreRequest, StripsMeasured
from engine.report import explore as report
from engine.report.explore import tree_document
from engine.runs.history import run_prompt, short_model

from .common import View, calls_gpu, checked, default, export_dir, gpu, request_check, served, served_url, streamed
from .common import LoadHook, user_errors
from .optional import generation_fields, number_or_none

TAB = "explore"
NO_IMAGE = "Click a dot to open its image."
NEW_TREE = "(a new tree)"


def build(engine) -> list:
    """Lay out the tab; returns its page-load hooks."""
    Request = ExploreRequest   # noqa: N806 - the widgets start at its defaults
    with gr.Row():
        with gr.Column(scale=2, min_width=320):
            tree_pick = gr.Dropdown([(NEW_TREE, "")], value="", label="Tree", elem_id="ex-tree",
                                    info="a tree's nodes are Explore runs; pick one to continue it")
            node_pick = gr.Dropdown([], value=None, label="Selected node: the next step is its child",
                                    elem_id="ex-node", allow_custom_value=True)
            prompt = gr.Textbox(label="Prompt", placeholder="a photo of a doctor", elem_id="ex-prompt")
            concepts = gr.Textbox("\n".join(default(Request, "concepts")), lines=3, elem_id="ex-concepts",
                                  label="Concepts (one per line): each image is placed between them")
            versus = gr.Textbox(lines=2, elem_id="ex-versus", label="A second axis' concepts (may be empty; one per "
                                "line): a 2-D scatter of the first concept of each axis",
                                placeholder="a photo of a young person\na photo of an old person")
            with gr.Row():
                n = gr.Slider(1, engine.max_images, value=min(default(Request, "n"), engine.max_images), step=1,
                              label="Images (N)", elem_id="ex-n")
                seed = gr.Number(default(Request, "seed"), label="First seed", precision=0, elem_id="ex-seed")
            stored = gr.Textbox(label="Or score a stored run (its id): nothing is generated", elem_id="ex-run")
            axes = gr.CheckboxGroup(list(known_axes()), value=default(Request, "axes"), elem_id="ex-axes",
                                    label="Also measure attributes with VQA (optional; cached answers reused): "
                                          "the node shows their distributions")
            with gr.Accordion("Inverse queries: which concept do images of a test concept lean to?",
                              open=False) as inverse_panel:
                inverse = gr.Textbox(lines=2, label="Test concepts (one per line)", elem_id="ex-inverse",
                                     placeholder="smiling\nan old doctor")
                carrier = gr.Textbox(label="Carrier prompt ({} is the test concept)", elem_id="ex-carrier",
                                     placeholder="empty: 'a photo of a person who is {}', or 'a photo of {}' for "
                                                 "'a …' / 'an …' / 'the …'")
                m = gr.Slider(1, engine.max_images, value=min(default(Request, "m"), engine.max_images), step=1,
                              label="Images per test concept (m)", elem_id="ex-m")
            with gr.Accordion("Generation settings (empty: the model's defaults)", open=False):
                negative = gr.Textbox(label="Negative prompt", elem_id="ex-negative")
                generation = generation_fields("ex", ("steps", "guidance", "width", "height"))
            go = gr.Button("Generate and place (a child of the selected node)", variant="primary", elem_id="ex-go")
        with gr.Column(scale=4):
            progress = gr.Markdown("", elem_id="ex-progress")
            link = gr.Textbox(label="Link to this view (reopens it from the store)", buttons=["copy"],
                              interactive=False, elem_id="ex-link")
            query = gr.Textbox(visible="hidden", elem_id="ex-query")
            tree_view = gr.HTML(elem_id="ex-tree-view", js_on_load=NODE_JS)
            scale = gr.Radio(list(report.SCALES), value="probability", elem_id="ex-scale", label="Strips' axis",
                             info="log-odds, ln(s / (1 − s)), spreads scores near 0 and 1")
            with gr.Row(equal_height=False):
                with gr.Column(scale=5, min_width=420):
                    strips = gr.HTML(elem_id="ex-strips", js_on_load=CLICK_JS)
                with gr.Column(scale=2, min_width=240, elem_id="ex-viewer"):   # beside the charts (CSS: sticky)
                    image = gr.Image(label="Image", interactive=False, height=256, elem_id="ex-image")
                    details = gr.HTML(NO_IMAGE, elem_id="ex-details")
            with gr.Row():
                export_json = gr.Button("Export tree (JSON)", size="sm", elem_id="ex-export-json")
                export_html = gr.Button("Export tree (HTML page)", size="sm", elem_id="ex-export-html")
                export_zip = gr.Button("Export tree (zip: import it in Runs)", size="sm", elem_id="ex-export-zip")
            files = gr.File(label="Export", file_count="multiple", height=80, elem_id="ex-files")
    with gr.Accordion("Identity clusters, label-free: cluster stored runs' images (e.g. occupations, or models)",
                      open=False) as clusters_panel:
        with gr.Row():
            cluster_runs = gr.Dropdown([], value=[], multiselect=True, label="Runs", elem_id="ex-cluster-runs",
                                       allow_custom_value=True)
            k = gr.Slider(2, 12, value=4, step=1, label="Clusters (k)", elem_id="ex-k")
            cluster_go = gr.Button("Cluster", elem_id="ex-cluster-go")
        clusters_out = gr.HTML(elem_id="ex-clusters")
    state = gr.State({})

    with_engine = functools.partial
    form = dict(prompt=prompt, concepts=concepts, versus=versus, n=n, seed=seed, run_id=stored, inverse=inverse,
                carrier=carrier, m=m, parent=node_pick, negative_prompt=negative, **generation.fields, axes=axes)
    # a view: the tree, the node, its page, and the form as the node was made (issue 42: N, seeds, concepts, axes)
    view_outputs = [tree_pick, node_pick, tree_view, strips, state, query, progress, prompt, concepts, versus, axes,
                    n, seed, stored, inverse, carrier, m, negative, inverse_panel]
    run = gpu(engine, duration=with_engine(step_work, engine), check=request_check(engine, "explore", explore_request))(
        with_engine(step, engine))
    checked(go.click, engine, "explore", explore_request, inputs_kwargs=form).success(
        run, inputs_kwargs=form, outputs=[progress, state], api_name="explore").then(
        user_errors(with_engine(after_step, engine)), [state, scale], view_outputs, api_name=False)
    tree_pick.input(user_errors(with_engine(open_tree, engine)), [tree_pick, scale], view_outputs, api_name=False)
    # the trees again when the picker opens (one imported in Runs meanwhile)
    tree_pick.focus(user_errors(with_engine(trees_update, engine)), [tree_pick], [tree_pick], api_name=False)
    node_pick.input(user_errors(with_engine(open_node, engine)), [state, node_pick, scale], view_outputs,
                    api_name=False)

    def node_clicked(state, scale, evt: gr.EventData):   # a click on a node of the tree selects it
        return open_node(engine, state, (getattr(evt, "_data", None) or {}).get("node"), scale)

    tree_view.select(user_errors(node_clicked), [state, scale], view_outputs, api_name=False)
    scale.input(user_errors(with_engine(rescale, engine)), [state, scale], [strips, query], api_name=False)
    query.change(None, [query], [link], js=LINK_JS, api_name=False)
    open_image = gpu(engine, duration=lambda state, data: GpuWork(captions=1),   # the image's caption
                     specs=lambda state, data: [engine.preset.vqa])(with_engine(show_image, engine))

    def clicked(state, evt: gr.EventData):   # Gradio passes the event data by this annotation
        data = getattr(evt, "_data", None) or {}
        if str(data.get("key") or "") not in set((state or {}).get("keys") or []):
            return gr.skip(), NO_IMAGE    # not an image of the open node: no GPU asked for
        return open_image(state, data)

    calls_gpu(clicked, open_image)

    strips.select(clicked, [state], [image, details], api_name=False).then(None, js=SHOW_IMAGE_JS, api_name=False)
    for fmt, button in (("json", export_json), ("html", export_html), ("zip", export_zip)):
        button.click(user_errors(with_engine(export_tree, engine, fmt)), [state], [files], api_name=False)
    cluster_work = with_engine(explore.cluster_work, engine)   # the runs' missing embeddings; checks them first
    clustered = gpu(engine, duration=cluster_work, specs=lambda run_ids, k: [engine.preset.embedder],
                    check=cluster_work)(with_engine(cluster, engine))
    cluster_go.click(clustered, [cluster_runs, k], [clusters_out], api_name="explore_clusters")

    clusters_panel.expand(user_errors(with_engine(run_choices, engine)), None, [cluster_runs], api_name=False)

    def linked(request: gr.Request):   # Gradio passes the page's request (its ?query) by this annotation
        params = dict(getattr(request, "query_params", {}) or {})
        shown = params.get("scale") if params.get("scale") in report.SCALES else "probability"
        return (*open_link(engine, params), shown)

    return [LoadHook(linked, view_outputs + [scale]), generation.hook(engine)]


# Strips: a click on a dot (static/vega_runtime.js: gl-vega-click) selects its image.
CLICK_JS = """
element.addEventListener('gl-vega-click', (e) => {
  const d = (e.detail || {}).datum || {};
  if (d.key) trigger('select', {key: d.key, chart: (e.detail || {}).chart_id || ''});
});
"""
# The tree: a click on a node selects it.
NODE_JS = """
element.addEventListener('click', (e) => {
  const li = e.target.closest && e.target.closest('li[data-node]');
  if (li) { e.stopPropagation(); trigger('select', {node: li.dataset.node}); }
});
"""
# The link: this page's address with the view's query.
LINK_JS = "(q) => q ? window.location.origin + window.location.pathname + q : ''"
# An opened image: beside the charts (#ex-viewer sticks to the top while they scroll); where the columns
# stack (a narrow window), scroll it into view.
SHOW_IMAGE_JS = """() => {
  const viewer = document.getElementById('ex-viewer');
  if (!viewer) return;
  const box = viewer.getBoundingClientRect();
  if (box.top < 0 || box.top > window.innerHeight - 120) viewer.scrollIntoView({block: 'nearest'});
}"""


# -- handlers: (engine, the inputs' values) -> the outputs' values --------------------------------------------
def explore_request(prompt="", concepts="", versus="", n=16, seed=0, run_id="", inverse="", carrier="", m=8, parent="",
                    negative_prompt="", steps=None, guidance=None, width=None, height=None, axes=()) -> ExploreRequest:
    """The request the form's values make (concepts and test concepts one per line)."""
    return ExploreRequest(prompt=prompt or "", concepts=_lines(concepts), versus=_lines(versus), n=int(n),
                          seed=int(seed or 0),
                          run=(run_id or "").strip(), inverse=_lines(inverse), carrier=(carrier or "").strip(),
                          m=int(m), parent=(parent or "").strip(), negative_prompt=negative_prompt or "",
                          steps=number_or_none(steps, int), guidance=number_or_none(guidance),
                          width=number_or_none(width, int), height=number_or_none(height, int),
                          axes=list(axes or []))


def _lines(text) -> list[str]:
    return [t.strip() for t in (text or "").splitlines() if t.strip()]


def step_work(engine, **form) -> GpuWork:
    """The GPU work of a step (called with `step`'s arguments): engine.methods.explore.gpu_work, from what
    the step will do (a stored run's size and the embeddings and answers it lacks)."""
    return explore.gpu_work(explore_request(**form), engine)


OUTPUTS = ("progress", "state")   # the strips follow from the stored node (after_step)


def step(engine, prompt="", concepts="", versus="", n=16, seed=0, run_id="", inverse="", carrier="", m=8, parent="",
         negative_prompt="", steps=None, guidance=None, width=None, height=None, axes=()):
    """Yields (progress, state) as a step's events arrive; the state names its tree and node at Done."""
    request = explore_request(prompt, concepts, versus, n, seed, run_id, inverse, carrier, m, parent, negative_prompt,
                              steps, guidance, width, height, axes)
    view = View(shown={"progress": "", "state": {}})
    yield from streamed(explore.run(request, engine), render, OUTPUTS, view=view)


def render(event, view: View) -> dict:
    """{output: value} for one event of a step."""
    if isinstance(event, Progress):
        return {"progress": view.progress_text(event)}
    if isinstance(event, StripsMeasured):
        return {"progress": "**Placed**: " + report.lean_text(event.lean)}
    if isinstance(event, Done):
        return {"progress": f"**Done**: {explore.lean_sentence(event.results.get('lean') or {})} "
                            f"(node `{event.run_id}`).",
                "state": {"tree": event.results.get("tree", event.run_id), "node": event.run_id}}
    return {}


def after_step(engine, state, scale="probability"):
    """The view of the node a step just made (its tree, the node selected)."""
    if not (state or {}).get("node"):
        return (gr.skip(),) * VIEW
    return view_of(engine, state["tree"], state["node"], keep_progress=True, scale=scale)


def open_tree(engine, tree_id, scale="probability"):
    """The view of a tree's root ('' : a new tree, nothing selected)."""
    if not tree_id:
        return (trees_update(engine, ""), gr.Dropdown(choices=[], value=None), "", "", {}, "", "") + \
            (gr.skip(),) * (VIEW - 7)
    return view_of(engine, tree_id, tree_id, scale=scale)


def open_node(engine, state, node_id, scale="probability"):
    """The view of another node of the open tree."""
    if not node_id or not (state or {}).get("tree"):
        return (gr.skip(),) * VIEW
    return view_of(engine, state["tree"], node_id, scale=scale)


VIEW = 19   # the outputs of a view: build's view_outputs


def view_of(engine, tree_id: str, node_id: str, keep_progress: bool = False, scale: str = "probability") -> tuple:
    """(tree picker, node picker, tree, strips, state, link query, status, then the form as the node was made:
    prompt, concepts, second axis, VQA axes, N, first seed, stored run, test concepts, carrier, m, negative
    prompt, and the inverse queries' panel opened when it has some) of one node of a tree, read from the store (nothing is generated): a child made next starts from
    the node's own settings (issue 42). InputError, reading like a missing id, for a tree or node the visitor
    may not see."""
    nodes = explore.tree_nodes(engine, tree_id)
    if node_id not in {n["id"] for n in nodes}:
        raise InputError(f"no node '{str(node_id)[:80]}' in tree '{str(tree_id)[:80]}'")
    record = engine.store.get_run(node_id)
    results, request = record.get("results") or {}, record.get("request") or {}
    choices = [(node_choice(i, n), n["id"]) for i, n in enumerate(nodes)]
    state = {"tree": tree_id, "node": node_id, "keys": [i["key"] for i in explore.node_images(results)]}
    query = link_query(tree_id, node_id, scale)
    form = (results.get("prompt", "") if not request.get("run") else "", "\n".join(results.get("concepts") or []),
            "\n".join(results.get("versus") or []), [a for a in results.get("axes") or {} if a in known_axes()],
            min(int(request.get("n") or 0), engine.max_images) or gr.skip(), int(request.get("seed") or 0),
            request.get("run") or "", "\n".join(request.get("inverse") or []), request.get("carrier") or "",
            min(int(request.get("m") or 0), engine.max_images) or gr.skip(), request.get("negative_prompt") or "",
            gr.Accordion(open=True) if request.get("inverse") else gr.skip())   # a child would repeat them: shown
    holds = next(f"{i + 1}. {explore.node_holds(n)}" for i, n in enumerate(nodes) if n["id"] == node_id)
    return (trees_update(engine, tree_id), gr.Dropdown(choices=choices, value=node_id, info=holds),
            report.tree_html(nodes, node_id), report.page(results, thumbnails(engine, results), scale), state, query,
            gr.skip() if keep_progress else f"Opened node `{node_id}` of tree `{tree_id}` from the store.", *form)


def link_query(tree_id: str, node_id: str, scale: str = "probability") -> str:
    """The view's query: `?tab=explore&tree=<id>&run=<node>` (and `&scale=log-odds` when so drawn)."""
    params = {"tab": TAB, "tree": tree_id, "run": node_id}
    if scale != "probability" and scale in report.SCALES:
        params["scale"] = scale
    return "?" + urlencode(params)


def rescale(engine, state, scale):
    """(strips, link query) of the open node drawn on another axis (from the store: nothing is computed)."""
    if not (state or {}).get("node"):
        return gr.skip(), gr.skip()
    engine.store.require_run(state["tree"], "explore", what="tree")   # still the visitor's to see (as tree_nodes)
    results = (engine.store.require_run(state["node"], "explore", what="node").get("results")) or {}
    return report.page(results, thumbnails(engine, results), scale), link_query(state["tree"], state["node"], scale)


def node_choice(i: int, node: dict) -> str:
    """The node picker's label, short enough to read whole in the picker (issue 42): its number, its prompt and
    what it adds ("3. a photo of an old doctor · 2 axes, inverse"); the picker's info line and the tree view
    say all it holds (`engine.methods.explore.node_holds`)."""
    adds = [what for what, has in (("2 axes", node.get("versus")), ("inverse", node.get("inverse")),
                                   ("VQA", node.get("axes")), ("scored", node.get("source_run"))) if has]
    return f"{i + 1}. {clip(str(node.get('prompt') or ''), 26)}" + (f" · {', '.join(adds)}" if adds else "")


def clip(text: str, limit: int) -> str:
    """`text`, or its first `limit` - 1 characters and "…"."""
    return text if len(text) <= limit else text[:limit - 1] + "…"


def trees_update(engine, selected: str):
    """The tree picker listing the trees the visitor may see: each root's prompt first (a scored run's
    says so after it), its size and its id."""
    trees = explore.list_trees(engine)
    choices = [(NEW_TREE, "")] + [(f"{clip(t['prompt'], 26)} · {t['nodes']} node(s) · …{t['id'][-6:]}", t["id"])
                                  for t in trees]
    if selected and selected not in {c[1] for c in choices}:
        choices.append((selected, selected))
    return gr.Dropdown(choices=choices, value=selected)


def thumbnails(engine, results: dict) -> dict:
    """image key -> the address of its served copy (the dots' tooltips)."""
    urls = {i["key"]: served_url(i.get("path")) for i in explore.node_images(results)}
    return {k: url for k, url in urls.items() if url}


def open_link(engine, params: dict) -> tuple:
    """The view a link names (`?tree=<id>&run=<node>`; `?run=<id>` alone: that node in its tree),
    from the store; a missing id, or one the visitor may not see, reads the same in the status line."""
    tree_id, node_id = (params.get("tree") or "").strip(), (params.get("run") or "").strip()
    if params.get("tab", TAB) != TAB or not (tree_id or node_id):
        return (trees_update(engine, ""),) + (gr.skip(),) * (VIEW - 1)
    try:
        if not tree_id:
            record = engine.store.require_run(node_id, "explore", what="Explore run")
            tree_id = (record.get("results") or {}).get("tree") or node_id
        return view_of(engine, tree_id, node_id or tree_id, scale=params.get("scale") or "probability")
    except InputError as exc:
        return (trees_update(engine, ""), gr.skip(), "", "", {}, "", f"**Link**: {exc}.") + (gr.skip(),) * (VIEW - 7)


def show_image(engine, state, data: dict):
    """(image, details) of a clicked dot: the image, its seed, prompt and scores, its caption and its stored
    VQA answers, each credited to its evaluator with its probabilities ("can't tell" below the engine's
    threshold, issue 42). Only the open node's images can be opened."""
    key = str((data or {}).get("key") or "")
    if not key or key not in set((state or {}).get("keys") or []):
        return gr.skip(), NO_IMAGE
    record = engine.store.get_images([key], verify=False).get(key)
    if record is None:
        return None, "This image is no longer in the store."
    caption = engine.caption([record])[0]
    answers = [a for a in engine.store.answers_for_image(key) if a["question"] != "<caption>"]
    results = (engine.store.get_run(state["node"]) or {}).get("results") or {}
    item = next((i for i in explore.node_images(results) if i["key"] == key), {})
    return served(record.path), report.image_panel(record, key, item.get("scores") or {}, caption, answers,
                                                   engine.cant_tell_below, explore.evaluator_labels(engine))


def export_tree(engine, fmt: str, state):
    """The open tree as JSON, as one offline HTML page, or as an export zip of its runs (imported like runs)."""
    tree_id = (state or {}).get("tree")
    if not tree_id:
        raise InputError("open or grow a tree first")
    nodes = explore.tree_nodes(engine, tree_id)
    ids = [n["id"] for n in nodes]
    engine.charge(what=f"export tree {fmt}", export_bytes=engine.store.runs_usage(ids))   # public: bytes an hour
    out = export_dir() / f"explore-tree-{tree_id}.{fmt}"
    if fmt == "json":
        out.write_text(json.dumps(explore.tree_json(engine, tree_id), indent=1, ensure_ascii=False), encoding="utf-8")
    elif fmt == "html":
        out.write_text(tree_document(engine, tree_id), encoding="utf-8")
    else:
        from engine.report import export

        export.export_zip(engine.store, ids, out)
    return [str(out)]


def run_choices(engine):
    """The cluster picker listing the runs the visitor may see (with images), each by what tells it from the
    others (issue 42): prompt, model, N, seeds, date, method and id."""
    return gr.Dropdown(choices=[(run_label(r), r["id"]) for r in engine.store.list_runs(limit=500)])


def run_label(row: dict) -> str:
    """"a photo of a doctor · synthetic_generator:synthetic_world.json · N = 16, seeds 0–15 · 2026-05-01 12:00 ·
    single_prompt · <id>" of a row of `Store.list_runs`."""
    request, summary = row.get("request") or {}, row.get("summary") or {}
    n, seed = request.get("n") or summary.get("n"), request.get("seed")
    images = f"N = {n}" + (f", seeds {seed}–{seed + n - 1}" if isinstance(seed, int) and isinstance(n, int)
                           and n > 0 and not request.get("run") else "") if n else ""
    model = short_model((row.get("models") or {}).get("generator", ""))
    created = time.strftime("%Y-%m-%d %H:%M", time.localtime(row["created"])) if row.get("created") else ""
    parts = [str(run_prompt(row))[:60], model, images, created, row.get("method", ""), row["id"]]
    return " · ".join(p for p in parts if p)


def cluster(engine, run_ids, k):
    """Identity clusters of the picked runs' images."""
    clusters = explore.identity_clusters(engine, list(run_ids or []), int(k))
    thumbs = {img["key"]: served_url(img["path"]) for c in clusters["clusters"] for img in c["central"]}
    return report.clusters_html(clusters, thumbs)
