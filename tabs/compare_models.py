"""Compare models tab: pick two or more generators and run the same Single Prompt,
Counterfactuals or Intersectional audit on each in one action; results side by side. Thin:
engine/methods/compare_models.py runs it, engine/report/compare_models.py draws it."""
from __future__ import annotations

from dataclasses import replace

import gradio as gr

from engine.hosting import backend_choices
from engine.methods.axes import known_axes
from engine.common.events import Done, Progress, Table
from engine.common.errors import GapLensError
from engine.methods import compare_models, single_prompt
from engine.models.presets import PRESETS
from engine.runs.history import run_records
from engine.report.compare_models import page

from . import axes_table
from . import single_prompt as single_prompt_tab
from .common import View, checked, gpu, request_check, served_url, streamed

EXAMPLES = ["a photo of a doctor", "a photo of a firefighter", "a photo of a teacher"]
METHODS = [("Single Prompt (distributions, T2I-BiasBench)", "single_prompt"),
           ("Counterfactuals (TIBET: MAD per axis)", "counterfactuals"),
           ("Intersectional Matrix (BiasConnect: IS matrix, BiasGraph)", "intersectional")]


def build(engine) -> list:
    gr.Markdown("Run the same audit on two or more generators and read the results side by side, with the "
                "differences from the first model and their intervals. Only the generator changes (the embedder, "
                "VQA and LLM stay this preset's); the generators load one after another.")
    with gr.Row():
        with gr.Column(scale=2, min_width=340):
            method = gr.Radio(METHODS, value="single_prompt", label="Audit", elem_id="cm-method")
            # public mode: visitors pick from the generators the host offers, never type one
            offered = backend_choices.offered(engine, "generator") if engine.public else PRESETS
            running = [p for p in offered if p == engine.preset.name]   # the generator in use, ticked
            presets = gr.CheckboxGroup(list(offered), value=running, label="Generators" if engine.public else
                                       "Generators: presets", elem_id="cm-presets")
            more = gr.Textbox(label="More generators (BACKEND:MODEL, comma-separated)", elem_id="cm-more",
                              placeholder="diffusers:/models/my-sd, synthetic_generator:/path/world.json",
                              visible=not engine.public)
            editor = axes_table.build(engine, "cm", EXAMPLES)
            with gr.Row():
                n = gr.Slider(2, engine.max_images, value=min(16, engine.max_images), step=1,
                              label="Images per set (N)", elem_id="cm-n")
                seed = gr.Number(0, label="First seed", precision=0, elem_id="cm-seed")
            axes = gr.CheckboxGroup(list(known_axes()), value=list(single_prompt.DEFAULT_AXES),
                                    label="Single Prompt: axes to measure", elem_id="cm-axes")
            go = gr.Button("Run on every generator", variant="primary", elem_id="cm-run")
        with gr.Column(scale=3):
            progress = gr.Markdown("", elem_id="cm-progress")
            view = gr.HTML(elem_id="cm-view")

    def specs_used(presets=None, more=None, **rest):
        """The generators to compare and the engine's other models: what the GPU decision looks at."""
        try:
            generators = [compare_models.generator_spec(engine, g) for g in generators_of(presets, more)]
        except GapLensError:
            generators = []    # the run itself reports the bad name
        return [*generators, engine.preset.embedder, engine.preset.llm, engine.preset.vqa]

    def compare_work(**form):
        """Each generator's audit: its own images, measured by the preset's evaluators."""
        request = compare_request(**form)
        child = compare_models.method_request(request)
        work = (single_prompt_tab.measure_work(engine, child) if request.method == "single_prompt" else
                axes_table.sets_work(engine, request.method, child))
        return [replace(work, generator=compare_models.generator_spec(engine, g)) for g in request.generators]

    @gpu(engine, duration=compare_work, specs=specs_used,
         check=request_check(engine, "compare_models", compare_request))
    def compare(method, presets, more, prompt, fill, rows, n, seed, axes):
        request = compare_request(method, presets, more, prompt, fill, rows, n, seed, axes)
        partial = {"method": method, "generators": list(dict.fromkeys(request.generators)), "runs": [], "results": [],
                   "request": request.request}   # the page grows model by model
        yield from streamed(compare_models.run(request, engine), lambda event, view: render(event, view, engine),
                            OUTPUTS, view=View(kept=partial))

    inputs = [method, presets, more, editor.prompt, editor.fill, editor.table, n, seed, axes]
    checked(go.click, engine, "compare_models", compare_request, inputs=inputs).success(
        compare, inputs, [progress, view, editor.table], api_name="compare_models")
    return []


OUTPUTS = ("progress", "view", "axes")   # a run's outputs, in order


IMAGES_PER_MODEL = 16


def model_images(engine, run_id: str) -> list[dict]:
    """The first IMAGES_PER_MODEL images of a model's run (its initial set for a counterfactual or
    intersectional audit), each {"src", "caption"}, for the side-by-side grid."""
    records = run_records(engine.store, engine.store.get_run(run_id))
    initial = [r for r, label in records if not label or label.endswith("initial")] or [r for r, _ in records]
    return [{"src": served_url(r.path), "caption": f"seed {r.seed}"} for r in initial[:IMAGES_PER_MODEL]]


def render(event, view: View, engine=None) -> dict:
    """{output: value} for one event of a run: the page grows model by model (`view.kept`), each
    model's images side by side."""
    images = view.kept.setdefault("images", [])
    if isinstance(event, Progress):
        return {"progress": view.progress_text(event)}
    if isinstance(event, Table) and event.name == "axes":
        return {"axes": event.rows}
    if isinstance(event, compare_models.ModelDone):
        view.kept["runs"].append(event.run_id)
        view.kept["results"].append(event.results)
        images.append(model_images(engine, event.run_id) if engine else [])
        return {"view": str(page(view.kept, images))}   # page reads the results' keys only
    if isinstance(event, Done):
        return {"progress": f"**Done**: {len(event.results['runs'])} generators compared in "
                            f"{event.summary.get('seconds', 0):.1f} s (run `{event.run_id}`; each model's audit is a "
                            f"run of its own in Runs).", "view": str(page(event.results, images))}
    return {}


def compare_request(method, presets, more, prompt, fill, rows, n, seed, axes) -> compare_models.CompareModelsRequest:
    """The request the form's values make: the chosen presets, then the typed generators."""
    generators = generators_of(presets, more)
    fields = {"prompt": prompt, "n": int(n), "seed": int(seed or 0)}
    if method == "single_prompt":
        fields.update(axes=list(axes or []), n_boot=300)
    else:
        fields.update(axes=axes_table.axes_of(rows) or {}, fill=axes_table.parse_fill(fill), n_boot=300)
    return compare_models.CompareModelsRequest(method, generators, fields)


def generators_of(presets, more) -> list[str]:
    """The chosen presets, then the generators typed in "More generators" (comma-separated)."""
    return list(presets or []) + [g.strip() for g in (more or "").split(",") if g.strip()]
