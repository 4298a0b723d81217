"""Single Prompt tab: generate N images, stream them, then the scores as they are ready."""
from __future__ import annotations

import functools

import gradio as gr

from engine.methods.axes import known_axes, parse_targets
from engine.common.errors import InputError
from engine.hosting.space import GpuWork
from engine.common.events import AxisScores, Done, Headline, Images, Progress, Table
from engine.methods import single_prompt, validate
from engine.methods.options import settings_for
from engine.report import trust

from engine.report.single_prompt import axes_html, axis_html, diversity_text, evaluators_html, gap_html

from . import spotcheck
from .common import (View, checked, default, gallery_items, gpu, options, request_check, request_work, streamed,
                     user_errors)
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
            evaluators = gr.Textbox(label="Also ask other evaluators (backend:model, comma-separated)",
                                    placeholder="clip_vqa:synthetic, faces:", elem_id="sp-evaluators-pick",
                                    info="each answers every axis too: their agreement, κ and the images where "
                                         "they disagree appear under the distributions")
            go = gr.Button("Generate and measure", variant="primary", elem_id="sp-generate")
        with gr.Column(scale=3):
            progress = gr.Markdown("", elem_id="sp-progress")
            gallery = gr.Gallery(label="Images", columns=8, height=300, elem_id="sp-gallery",
                                 allow_preview=True, object_fit="contain")
            with gr.Row():
                details = gr.HTML(trust.image_message_html(NO_DETAILS), elem_id="sp-details")
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

    outputs = [gallery, progress, axes_out, diversity, gap_out, topk, state]   # OUTPUTS' order

    with_engine = functools.partial   # every handler takes the engine first
    run = gpu(engine, duration=lambda **form: measure_work(engine, measure_request(**form)),
              check=request_check(engine, "single_prompt", measure_request))(with_engine(measure, engine))

    def select_image(view, evt: gr.SelectData):   # Gradio passes the event data by this annotation
        return show_image(engine, view, evt)

    regenerate_on_gpu = gpu(engine, duration=lambda view: GpuWork(images=1, steps=regenerate_request(engine, view).steps),
                            specs=lambda view: [engine.preset.generator],
                            check=with_engine(regenerate_request, engine))(with_engine(regenerate_alone, engine))

    @user_errors
    @functools.wraps(regenerate_on_gpu)
    def regenerate_run(view):   # an image no longer stored (its run deleted, or not the visitor's): no GPU asked for
        regenerate_request(engine, view)
        return regenerate_on_gpu(view) if still_stored(engine, view) else missing_text(view["selected"])
    no_details = functools.partial(trust.image_message_html, NO_DETAILS)
    form = dict(prompt=prompt, n=n, seed=seed, negative_prompt=negative, **generation.fields, axes=axes,
                extra_axes=extra_axes, references=references, mode=mode, alpha=alpha, combine=combine, until=until,
                evaluators=evaluators)
    redraw = dict(fn=user_errors(with_engine(show_distribution, engine)), inputs=[state, distribution],
                  outputs=[axes_out, spot["result"]], api_name=False)
    checked(go.click, engine, "single_prompt", measure_request, inputs_kwargs=form).success(
        run, inputs_kwargs=form, outputs=outputs, api_name="single_prompt").then(**redraw)
    checked(prompt.submit, engine, "single_prompt", measure_request, inputs_kwargs=form).success(
        run, inputs_kwargs=form, outputs=outputs, api_name=False).then(**redraw)
    distribution.change(**redraw)
    for trigger in (go.click, prompt.submit):   # a new run clears the previous image's details
        trigger(no_details, None, [details], api_name=False, queue=False)
    gallery.select(select_image, [state], [details, state], api_name=False)
    regenerate.click(regenerate_run, [state], [details], api_name="regenerate")
    return [generation.hook(engine)]


# -- handlers: (engine, the inputs' values) -> the outputs' values --------------------------------------------
OUTPUTS = ("gallery", "progress", "axes", "diversity", "gap", "topk", "state")   # a run's outputs, in order


def measure_work(engine, request: single_prompt.SinglePromptRequest):
    """The GPU work of a run: its images (an `until` run's: up to the largest set the visitor may make),
    each asked every axis' question by the run's evaluator and by each other one, and the gap score's LLM
    call (the method's estimate: request_work)."""
    return request_work(engine, "single_prompt", request, questions=len(request.axes) * (1 + len(request.evaluators)))


def measure(engine, prompt, n, seed=0, negative_prompt=None, steps=None, guidance=None, width=None, height=None,
            axes=(), extra_axes=None, references=None, mode="paper", alpha=25, combine="diff", until=0,
            evaluators=None):
    """Yields the outputs of a run (OUTPUTS order) as its events arrive; the last names them all."""
    request = measure_request(prompt, n, seed, negative_prompt, steps, guidance, width, height, axes, extra_axes,
                              references, mode, alpha, combine, until, evaluators)
    view = View(shown={"gallery": [], "progress": "", "axes": "", "diversity": "", "gap": "", "topk": [],
                       "state": {"records": {}, "request": request.__dict__}},
                kept={"records": [], "axes": {}})
    yield from streamed(single_prompt.run(request, engine), render, OUTPUTS, view=view)


def render(event, view: View) -> dict:
    """{output: value} for one event of a run (the state keeps the images, and the results at the end)."""
    kept, state = view.kept, view.shown["state"]
    if isinstance(event, Images):
        # an `until` run streams every round's seeds again (the first ones from the cache): one record per seed
        by_seed = {r.seed: r for r in kept["records"] + event.records}
        kept["records"] = [by_seed[seed] for seed in sorted(by_seed)]
        return {"gallery": gallery_items(kept["records"])}
    if isinstance(event, Progress):
        return {"progress": view.progress_text(event)}
    if isinstance(event, AxisScores):
        kept["axes"][event.axis] = axis_html(event.axis, event.metrics)
        return {"axes": axes_html(kept["axes"].values())}
    if isinstance(event, Headline):  # issue 16: how sure the headline is
        kept["headline"] = trust.headline_html(event.claim)
        return {"axes": kept["headline"] + axes_html(kept["axes"].values())}
    if isinstance(event, single_prompt.EvaluatorsCompared):   # issue 35: under the distributions
        return {"axes": kept.get("headline", "") + axes_html(kept["axes"].values())
                + evaluators_html(event.comparison)}
    if isinstance(event, single_prompt.DiversityMeasured):
        return {"diversity": diversity_text(event.diversity)}
    if isinstance(event, single_prompt.GapMeasured):
        return {"gap": gap_html(event.gap)}
    if isinstance(event, Table):
        return {"topk": event.rows}
    if isinstance(event, Done):
        state.update(run_id=event.run_id, results=event.results,
                     records={r.seed: r.to_json() for r in kept["records"]})
        if event.results.get("all_flagged"):
            return {"progress": f"**Nothing measured**: {event.results['message']} (run `{event.run_id}`)."}
        return {"progress": f"**Done**: {len(kept['records'])} images measured in "
                            f"{view.waited():.1f} s (run `{event.run_id}`)."}
    return {}


def show_image(engine, view, evt: gr.SelectData):
    """(details, state) of the clicked image: its seed, key and every evaluator's answer to each
    question, named, as the run counted them (engine.methods.single_prompt.image_details)."""
    records = sorted(view.get("records", {}).values(), key=lambda r: r["seed"])
    if not records or evt.index is None or evt.index >= len(records):
        return trust.image_message_html(NO_DETAILS), view
    record = records[evt.index]
    view["selected"] = record
    info = single_prompt.image_details(engine, record["key"], view.get("results"), view.get("run_id"))
    return trust.image_answers_html(record["seed"], record["key"], bool(record.get("nsfw")), info["answers"],
                                    info["caption"]), view


def regenerate_request(engine, view) -> single_prompt.SinglePromptRequest:
    """The request of the run whose selected image `view` names, checked (`preflight`): InputError when no
    image of a finished run is selected."""
    record, request = (view or {}).get("selected"), (view or {}).get("request")
    if not isinstance(record, dict) or not isinstance(request, dict) or not (view or {}).get("run_id"):
        raise InputError("click an image of a finished run first")
    try:
        made = single_prompt.SinglePromptRequest(**request)
    except TypeError:
        raise InputError("click an image of a finished run first") from None
    request_check(engine, "single_prompt", lambda: made)()
    return made


def still_stored(engine, view) -> bool:
    """Whether the image `view` selected is still in the store, in a run the visitor may see (a deleted
    run's, or another visitor's, reads as missing)."""
    run, key = engine.store.get_run(str(view["run_id"])), view["selected"].get("key")
    return bool(run) and key in {link["image_key"] for link in run["images"]} and bool(engine.store.get_images([key]))


def missing_text(record: dict) -> str:
    return trust.image_message_html(
        f"Seed {record.get('seed')}: the stored image is missing (deleted with another run, or its file is gone), "
        "so there is nothing to compare it with. Run the prompt again to regenerate it.")


def regenerate_alone(engine, view) -> str:
    """Whether the selected image, generated again alone, is the stored one."""
    record, request = view.get("selected"), view.get("request")
    settings = settings_for(regenerate_request(engine, view), engine)
    same, diff = engine.regenerate_check(request["prompt"], record["seed"], settings, record["key"])
    if diff is None:
        return missing_text(record)
    verdict = "identical to the stored image" if same else f"differs from the stored image by up to {diff} grey levels"
    return trust.image_message_html(f"Seed {record['seed']} regenerated alone: {verdict}.")


def show_distribution(engine, view, which):
    """The axes again, on the raw or the corrected distribution, and the spot-check so far."""
    results = (view or {}).get("results")
    if not results:
        return gr.skip(), gr.skip()
    validation = validate.validate_run(engine.store, view["run_id"])
    shown = validate.corrected_axes(results["axes"], validation) if which == "corrected" else results["axes"]
    checked = any(a.get("n_checked") for a in validation["axes"].values())
    if which == "corrected" and not checked:
        gr.Warning("no labels checked yet for this run's images: use 'Check the labels' first")
    return (trust.headline_html(results.get("headline")) + axes_html(axis_html(a, m) for a, m in shown.items())
            + evaluators_html(results.get("evaluators")), trust.validation_html(validation) if checked else "")


def measure_request(prompt, n, seed=0, negative_prompt=None, steps=None, guidance=None, width=None, height=None,
                    axes=(), extra_axes=None, references=None, mode="paper", alpha=25, combine="diff", until=0,
                    evaluators=None):
    """The request the form's values make (empty optional numbers: None, the method's defaults)."""
    return single_prompt.SinglePromptRequest(
        prompt=prompt, n=int(n), seed=int(seed or 0), negative_prompt=negative_prompt or "",
        steps=number_or_none(steps, int), guidance=number_or_none(guidance), width=number_or_none(width, int),
        height=number_or_none(height, int),
        axes=list(axes or []) + [a.strip() for a in (extra_axes or "").split(",") if a.strip()],
        references=parse_targets(references or ""), mode=mode, alpha=float(alpha), combine=combine,
        until_half_width=float(until) if until else None, evaluators=spotcheck.names_typed(evaluators))
