"""Compare models tab: pick two or more generators and run the same Single Prompt,
Counterfactuals or Intersectional audit on each in one action; results side by side. Thin:
engine/methods/compare_models.py runs it, engine/report/compare_models.py draws it."""
from __future__ import annotations

import functools
import json
import re
from dataclasses import replace

import gradio as gr

from engine.hosting import backend_choices
from engine.methods.axes import known_axes
from engine.common.events import Done, Progress, Table
from engine.common.errors import GapLensError, InputError
from engine.methods import check, compare_models, single_prompt
from engine.models.presets import PRESETS, parse_model_override
from engine.runs.history import run_records
from engine.report.compare_models import page

from . import axes_table
from . import single_prompt as single_prompt_tab
from .common import View, checked, export_dir, gpu, request_check, served_url, streamed, user_errors

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
            # a fine-tune beside the presets: a LoRA on the first generator, or a checkpoint file, added to
            # "More generators" as its spec (a public GapLens offers the host's LoRAs among the generators)
            with gr.Row(visible=not engine.public, elem_id="cm-lora-row"):
                lora = gr.Textbox(label="LoRA / checkpoint", elem_id="cm-lora", scale=3,
                                  placeholder="user/my-lora@0.8 (several: a@0.8+lora=b@0.5; ,weight_name=FILE) "
                                              "or /path/model.safetensors")
                lora_kind = gr.Radio([("LoRA on the first generator", "lora"), ("checkpoint file", "checkpoint")],
                                     value="lora", show_label=False, elem_id="cm-lora-kind", scale=2)
                add = gr.Button("Add", size="sm", elem_id="cm-lora-add", scale=0, min_width=60)
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
            suite = gr.File(label="This comparison as a bias-check suite (python -m engine check SUITE --base A "
                                  "--candidate B)", interactive=False, elem_id="cm-suite", height=90)

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
        compare, inputs, [progress, view, editor.table, suite], api_name="compare_models")
    add.click(user_errors(functools.partial(add_finetune, engine)), [lora, lora_kind, presets, more], [more],
              api_name=False)
    return []


OUTPUTS = ("progress", "view", "axes", "suite")   # a run's outputs, in order


def add_finetune(engine, text: str, kind: str, presets, more) -> str:
    """"More generators" with a fine-tune added: `text` as LoRAs on the first generator chosen (a
    diffusers model; 'REPO@0.8', several joined by '+lora='), or as a checkpoint file of its own."""
    text = (text or "").strip().removeprefix("+").removeprefix("lora=").strip()
    if not text:
        raise InputError("type a LoRA (a hub repository or a file, @SCALE) or a checkpoint file first")
    if kind == "checkpoint":
        generator = f"diffusers:{text}"
    else:
        chosen = generators_of(presets, more)
        if not chosen:
            raise InputError("pick the generator the LoRA goes on first (a preset or a diffusers model)")
        base = compare_models.generator_spec(engine, chosen[0])
        if base.backend != "diffusers":
            raise InputError(f"a LoRA goes on a diffusers model; the first generator, {chosen[0]}, is {base.backend}")
        generator = f"{base.label}+lora={text}"
    parse_model_override(generator, "generator")   # a malformed one is refused here, in one sentence
    return ", ".join([*(g.strip() for g in split_generators(more)), generator])


def suite_file(results: dict, run_id: str) -> str | None:
    """The Single Prompt comparison's prompt, N, seed and axes (with their reference shares) as a bias-check
    suite file (engine/methods/check.py), which `python -m engine check` reads; None for other audits."""
    if results.get("method") != "single_prompt":
        return None
    request = results.get("request") or {}
    references = request.get("references") or {}
    axes = {a: references.get(a) for a in request.get("axes") or []} if references else list(request.get("axes") or [])
    suite = check.suite_of(check.CheckRequest(prompts=[request.get("prompt", "")], n=int(request.get("n", 16)),
                                              seed=int(request.get("seed", 0)), axes=axes))
    path = export_dir() / f"{run_id}.suite.json"
    path.write_text(json.dumps(suite, indent=2, ensure_ascii=False), encoding="utf-8")
    return str(path)


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
        paired = " Paired by seed: the models ran on the same seeds." if (
            event.results.get("comparison") or {}).get("paired") else ""
        return {"progress": f"**Done**: {len(event.results['runs'])} generators compared in "
                            f"{view.waited():.1f} s (run `{event.run_id}`; each model's audit is a "
                            f"run of its own in Runs).{paired}", "view": str(page(event.results, images)),
                "suite": suite_file(event.results, event.run_id)}
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
    return list(presets or []) + [g.strip() for g in split_generators(more) if g.strip()]


def split_generators(text) -> list[str]:
    """The generators of a comma-separated text: a comma starts a new one only before 'BACKEND:' or a
    preset's name, so an adapter's ',weight_name=FILE' stays with its generator."""
    presets = "|".join(re.escape(p) for p in sorted(PRESETS, key=len, reverse=True))
    return [g for g in re.split(rf",\s*(?=[\w-]+:|(?:{presets})\s*(?:,|$))|\n", text or "") if g.strip()]
