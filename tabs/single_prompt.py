"""Single Prompt tab: generate N images, stream them, then the scores as they are ready."""
from __future__ import annotations

import time

import gradio as gr

from engine.methods.axes import known_axes, parse_targets
from engine.common.errors import InputError
from engine.common.events import Done, Images, Progress, Scores, Table, Warning
from engine.methods import single_prompt, validate
from engine.report import trust

from engine.report.single_prompt import axes_html, axis_html, diversity_text, gap_html

from . import spotcheck
from .common import (checked, default, gallery_items, gpu, gpu_seconds_for, in_order, options, user_errors,
                     with_notes)
from .optional import generation_fields, number_or_none

NO_DETAILS = "Click an image to see its seed and VQA answers."
EXAMPLES = ["a photo of a doctor", "a photo of a firefighter", "a photo of a teacher",
            "a photo of a ceo", "a red balloon"]


def build(engine) -> list:
    """Lay out the tab; returns its page-load hooks as (fn, outputs) pairs."""
    axis_names = list(known_axes())
    Request = single_prompt.SinglePromptRequest   # noqa: N806 - the widgets start at its defaults
    with gr.Row():
        with gr.Column(scale=2, min_width=320):
            prompt = gr.Textbox(label="Prompt", placeholder="a photo of a doctor", elem_id="sp-prompt")
            gr.Examples(EXAMPLES, [prompt])
            negative = gr.Textbox(label="Negative prompt", elem_id="sp-negative")
            with gr.Row():
                n = gr.Slider(1, engine.max_images, value=min(default(Request, "n"), engine.max_images), step=1,
                              label="Images (N)", elem_id="sp-n")
                seed = gr.Number(default(Request, "seed"), label="First seed", precision=0, elem_id="sp-seed")
            with gr.Accordion("Generation settings (empty: the model's defaults)", open=False):
                generation = generation_fields("sp", ("steps", "guidance", "width", "height"))
            axes = gr.CheckboxGroup(axis_names, value=default(Request, "axes"), label="Axes to measure",
                                    elem_id="sp-axes-pick")
            extra_axes = gr.Textbox(label="More axes (free text, comma-separated)", placeholder="hair color, setting",
                                    elem_id="sp-extra-axes")
            with gr.Accordion("Reference distribution and metric options", open=False):
                references = gr.Textbox(label="Targets (uniform when empty)",
                                        placeholder="gender: male=50, female=50; age: young=30, middle-aged=40, old=30")
                mode = gr.Radio(options(Request, "mode"), value=default(Request, "mode"), label="T2I-BiasBench mode",
                                info="paper: the paper's equations; reference: bit-exact with the authors' code")
                alpha = gr.Slider(5, 50, value=default(Request, "alpha"), step=5, label="Gap score α (percentile)")
                combine = gr.Radio(options(Request, "combine"), value=default(Request, "combine"),
                                   label="Gap score combination")
                until = gr.Number(0, label="Add images until every share's interval is within ± (0 = off)",
                                  info="e.g. 0.1: more seeds are generated (the first ones come from the cache) "
                                  "up to the server's maximum", minimum=0, maximum=0.49, step=0.01,
                                  elem_id="sp-until")
            go = gr.Button("Generate and measure", variant="primary", elem_id="sp-generate")
        with gr.Column(scale=3):
            progress = gr.Markdown("", elem_id="sp-progress")
            gallery = gr.Gallery(label="Images", columns=8, height=300, elem_id="sp-gallery",
                                 allow_preview=True, object_fit="contain")
            with gr.Row():
                details = gr.Markdown(NO_DETAILS, elem_id="sp-details")
                regenerate = gr.Button("Regenerate this image alone", size="sm", elem_id="sp-regenerate")
    with gr.Row():  # issue 16: the metrics on the raw or the spot-check-corrected distribution
        distribution = gr.Radio(["raw", "corrected"], value="raw", label="Distribution the metrics use",
                                info="corrected: adjusted by the evaluator's errors measured in 'Check the labels'",
                                elem_id="sp-distribution")
    axes_out = gr.HTML(elem_id="sp-axes")
    with gr.Row():
        diversity = gr.Markdown(elem_id="sp-diversity")
        topk = gr.Dataframe(headers=["concept", "share of images"], label="Top-K concepts",
                            elem_id="sp-topk", interactive=False)
    gap_out = gr.HTML(elem_id="sp-gap")
    state = gr.State({})
    spot = spotcheck.build(engine, lambda view: (view or {}).get("run_id"), state, "sp-spot")

    outputs = [gallery, progress, axes_out, diversity, gap_out, topk, state]

    def measure_seconds(n=16, steps=None, axes=(), extra_axes=None, until=0, **rest):
        # ZeroGPU calls it with measure's own arguments; `until` may grow N up to the server's maximum
        questions = len(axes or ()) + len([a for a in (extra_axes or "").split(",") if a.strip()])
        return gpu_seconds_for(engine, engine.max_images if until else n, steps, questions=questions, llm_calls=1)

    @gpu(engine, duration=measure_seconds)
    def measure(prompt, n, seed=0, negative_prompt=None, steps=None, guidance=None, width=None, height=None,
                axes=(), extra_axes=None, references=None, mode="paper", alpha=25, combine="diff", until=0):
        request = measure_request(prompt, n, seed, negative_prompt, steps, guidance, width, height, axes, extra_axes,
                                  references, mode, alpha, combine, until)
        records, axis_blocks, started, notes = [], {}, time.perf_counter(), []
        view = {"records": {}}
        # each event updates the outputs it names, yielded in output order (`in_order`); the last
        # yield names them all (an API client's result)
        shown = {gallery: [], progress: "", axes_out: "", diversity: "", gap_out: "", topk: [], state: view}
        for event in single_prompt.run(request, engine):
            if isinstance(event, Images):
                records += event.records
                records.sort(key=lambda r: r.seed)
                view["records"] = {r.seed: r.to_json() for r in records}
                update = {gallery: gallery_items(records)}
            elif isinstance(event, Progress):
                eta = f", about {event.eta_s:.0f} s left" if event.eta_s else ""
                update = {progress: with_notes(f"**{event.message or event.stage}**{eta} "
                                               f"({time.perf_counter() - started:.1f} s)", notes)}
            elif isinstance(event, Warning):    # shown with this result, not as a toast over it
                notes.append(event.message)
                update = {progress: with_notes(shown[progress].split("\n\n**Notes")[0], notes)}
            elif isinstance(event, Scores) and event.name.startswith("axis:"):
                axis_blocks[event.name[5:]] = axis_html(event.name[5:], event.values)
                update = {axes_out: axes_html(axis_blocks.values())}
            elif isinstance(event, Scores) and event.name == "headline":  # issue 16: how sure the headline is
                update = {axes_out: trust.headline_html(event.values) + axes_html(axis_blocks.values())}
            elif isinstance(event, Scores) and event.name == "diversity":
                update = {diversity: diversity_text(event.values)}
            elif isinstance(event, Scores) and event.name == "gap":
                update = {gap_out: gap_html(event.values)}
            elif isinstance(event, Table):
                update = {topk: event.rows}
            elif isinstance(event, Done):
                view.update(run_id=event.run_id, results=event.results, request=request.__dict__)
                shown[progress] = with_notes(f"**Done**: {len(records)} images measured in "
                                             f"{event.summary.get('seconds', 0):.1f} s (run `{event.run_id}`)."
                                             if not event.results.get("all_flagged") else
                                             f"**Nothing measured**: {event.results['message']} (run `{event.run_id}`).",
                                             notes)
                yield in_order(outputs, shown)
                continue
            else:
                continue
            shown.update(update)
            yield in_order(outputs, update)

    def show_image(view, evt: gr.SelectData):
        records = sorted(view.get("records", {}).values(), key=lambda r: r["seed"])
        if not records or evt.index is None or evt.index >= len(records):
            return NO_DETAILS, view
        record = records[evt.index]
        view["selected"] = record
        info = single_prompt.image_details(engine, record["key"])
        asked = [a for a in info["answers"] if a["question"] and a["question"] != "<caption>"]
        captions = [a["answer"] for a in info["answers"] if a["question"] == "<caption>" and a["answer"]]
        answers = "\n".join(f"- *{a['question']}* → **{a['answer']}**" for a in asked) or "- (no answers yet)"
        if captions:
            answers += f"\n\nCaption: *{captions[0]}*"
        flag = " **flagged by the safety checker**" if record.get("nsfw") else ""
        return f"**Seed {record['seed']}**{flag}, key `{record['key'][:12]}…`\n\n{answers}", view

    @gpu(engine, duration=lambda view: gpu_seconds_for(engine, 1), specs=lambda view: [engine.preset.generator])
    def regenerate_alone(view):
        record, request = view.get("selected"), view.get("request")
        if not record or not request:
            raise InputError("click an image of a finished run first")
        same, diff = engine.regenerate_check(request["prompt"], record["seed"],
                                             single_prompt.settings_for(single_prompt.SinglePromptRequest(**request), engine),
                                             record["key"])
        if diff is None:
            return (f"Seed {record['seed']}: the stored image is missing (deleted with another run, or its file "
                    "is gone), so there is nothing to compare it with. Run the prompt again to regenerate it.")
        verdict = "identical to the stored image" if same else f"differs from the stored image by up to {diff} grey levels"
        return f"Seed {record['seed']} regenerated alone: {verdict}."

    @user_errors
    def show_distribution(view, which):
        """The axes again, on the raw or the corrected distribution, and the spot-check so far."""
        results = (view or {}).get("results")
        if not results:
            return gr.skip(), gr.skip()
        validation = validate.validate_run(engine.store, view["run_id"])
        shown = validate.corrected_axes(results["axes"], validation) if which == "corrected" else results["axes"]
        checked = any(a.get("n_checked") for a in validation["axes"].values())
        if which == "corrected" and not checked:
            gr.Warning("no labels checked yet for this run's images: use 'Check the labels' first")
        return (trust.headline_html(results.get("headline")) + axes_html(axis_html(a, m) for a, m in shown.items()),
                trust.validation_html(validation) if checked else "")

    form = dict(prompt=prompt, n=n, seed=seed, negative_prompt=negative, **generation.fields, axes=axes,
                extra_axes=extra_axes, references=references, mode=mode, alpha=alpha, combine=combine, until=until)
    redraw = dict(fn=show_distribution, inputs=[state, distribution], outputs=[axes_out, spot["result"]],
                  api_name=False)
    checked(go.click, engine, "single_prompt", measure_request, inputs_kwargs=form).success(
        measure, inputs_kwargs=form, outputs=outputs, api_name="single_prompt").then(**redraw)
    checked(prompt.submit, engine, "single_prompt", measure_request, inputs_kwargs=form).success(
        measure, inputs_kwargs=form, outputs=outputs, api_name=False).then(**redraw)
    distribution.change(**redraw)
    for trigger in (go.click, prompt.submit):   # a new run clears the previous image's details
        trigger(lambda: NO_DETAILS, None, [details], api_name=False, queue=False)
    gallery.select(show_image, [state], [details, state], api_name=False)
    regenerate.click(regenerate_alone, [state], [details], api_name="regenerate")
    return [generation.hook(engine)]


def measure_request(prompt, n, seed=0, negative_prompt=None, steps=None, guidance=None, width=None, height=None,
                    axes=(), extra_axes=None, references=None, mode="paper", alpha=25, combine="diff", until=0):
    """The request the form's values make (empty optional numbers: None, the method's defaults)."""
    return single_prompt.SinglePromptRequest(
        prompt=prompt, n=int(n), seed=int(seed or 0), negative_prompt=negative_prompt or "",
        steps=number_or_none(steps, int), guidance=number_or_none(guidance), width=number_or_none(width, int),
        height=number_or_none(height, int),
        axes=list(axes or []) + [a.strip() for a in (extra_axes or "").split(",") if a.strip()],
        references=parse_targets(references or ""), mode=mode, alpha=float(alpha), combine=combine,
        until_half_width=float(until) if until else None)
