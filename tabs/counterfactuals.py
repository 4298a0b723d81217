"""Counterfactuals tab (TIBET): edit the axes table, generate every set, read MAD per axis,
CAS per counterfactual, and drill into any counterfactual's images, answers and concepts."""
from __future__ import annotations

import functools

import gradio as gr

from engine.common.events import AxisScores, Done, Images, Progress, Table
from engine.methods import counterfactuals
from engine.report import counterfactuals as report
from engine.report import fmt

from . import axes_table, spotcheck
from .common import View, checked, default, options, served, served_url, streamed
from .optional import generation_fields, number_or_none

EXAMPLES = ["a photo of a doctor", "a photo of a firefighter", "a photo of a teacher", "a photo of a librarian"]


def drilldown(results: dict, label: str):
    """Initial vs the chosen set side by side (concepts, Top-K) and the chosen set's images with their answers."""
    if not results or label not in results.get("sets", {}):
        return "", []
    images = results["sets"][label]["images"]
    # short captions (a gallery shows one line): the answers' values; the drill-down names the questions
    items = [(path, f"seed {im['seed']}: " + " · ".join(str(v) for v in im["answers"].values()))
             for im in images if (path := served(im["path"]))]
    return report.drill_html(results, label), items


def set_choices(results: dict) -> list[tuple[str, str]]:
    aggregate = results["aggregate"]
    return [(label if aggregate else "initial prompt", label) if s["axis"] is None
            else (f"{s['axis']}: {s['cf']}" + (f" ({s['prompt']})" if aggregate else ""), label)
            for label, s in results["sets"].items()]


def build(engine) -> list:
    Request = counterfactuals.CounterfactualsRequest   # noqa: N806 - the widgets start at its defaults
    with gr.Row():
        with gr.Column(scale=2, min_width=340):
            editor = axes_table.build(engine, "cf", EXAMPLES)
            with gr.Row():
                n = gr.Slider(2, engine.max_images, value=min(default(Request, "n"), engine.max_images), step=1,
                              label="Images per set (N; the thesis uses 48)", elem_id="cf-n")
                seed = gr.Number(default(Request, "seed"), label="First seed (the same seeds in every set)",
                                 precision=0, elem_id="cf-seed")
            with gr.Accordion("Generation settings (empty: the model's defaults)", open=False):
                negative = gr.Textbox(label="Negative prompt")
                generation = generation_fields("cf")
            with gr.Accordion("TIBET options (choices the thesis leaves open)", open=False):
                caption = gr.Checkbox(default(Request, "caption"),
                                      label="Add each image's caption to its concepts (thesis; the released "
                                      "code leaves it out)")
                missing = counterfactuals.synonyms_note()   # said beside the option, not only in the server log
                synonyms = gr.Checkbox(default(Request, "synonyms"), label="Merge WordNet synonyms before comparing",
                                       elem_id="cf-synonyms", info=missing or None)
                renormalise = gr.Checkbox(default(Request, "renormalise"),
                                          label="HistIoU on histograms rescaled to sum 1 (released code)")
                sum_normalise = gr.Checkbox(default(Request, "sum_normalise"),
                                            label="Divide an axis' CAS by their sum before MAD (MAD in [0, 1])")
                min_frequency = gr.Number(default(Request, "min_frequency"),
                                          label="Drop concepts rarer than this per image")
                n_boot = gr.Slider(0, 2000, value=default(Request, "n_boot"), step=100,
                                   label="Bootstrap resamples (0 = no intervals)")
                top_k = gr.Slider(1, 20, value=default(Request, "top_k"), step=1, label="Top-K concepts")
            go = gr.Button("Generate and compare", variant="primary", elem_id="cf-run")
        with gr.Column(scale=3):
            # a view switch as much as an option: every run stores both modes, so switching rescores
            # the shown run at once (nothing generated); the next run is scored in this mode first
            mode = gr.Radio(options(Request, "mode"), value=default(Request, "mode"), elem_id="cf-mode",
                            label="CAS and MAD as in", info="paper: the thesis's TIBET with the TIBET options; "
                            "reference: the authors' released code, number for number. Switching rescores the run "
                            "shown from its stored answers")
            progress = gr.Markdown("", elem_id="cf-progress")
            mad = gr.HTML(elem_id="cf-mad")
            cas = gr.HTML(elem_id="cf-cas")
    table = gr.Dataframe(headers=["axis", "counterfactual", "CAS [95% CI]", "CAS CLIP [95% CI]"], interactive=False,
                         label="Every counterfactual", elem_id="cf-table", wrap=True)
    sets = gr.HTML(elem_id="cf-sets")
    gr.Markdown("### Drill down: the initial images vs one counterfactual")
    pick = gr.Dropdown([], label="Counterfactual", elem_id="cf-pick", interactive=True)
    drill = gr.HTML(elem_id="cf-drill")
    gallery = gr.Gallery(label="Images of the chosen set with their VQA answers", columns=8, height=420,
                         elem_id="cf-gallery", object_fit="contain")
    state = gr.State({})
    spot = spotcheck.build(engine, lambda view: (view or {}).get("run_id"), state, "cf-spot")

    with_engine = functools.partial   # every handler takes the engine first
    run = axes_table.sets_gpu(engine, "counterfactuals", compare_request)(with_engine(compare, engine))
    inputs = [editor.prompt, editor.fill, editor.table, n, seed, negative, generation["steps"], generation["guidance"],
              caption, synonyms, renormalise, sum_normalise, min_frequency, n_boot, top_k, mode]
    checked(go.click, engine, "counterfactuals", compare_request, inputs=inputs).success(
        run, inputs, [progress, mad, cas, table, sets, editor.table, pick, state], api_name="counterfactuals").then(
        lambda view: spotcheck.checked_html(engine.store, view["run_id"]) if (view or {}).get("run_id") else "",
        [state], [spot["result"]], api_name=False)  # labels of these images checked before: raw beside corrected
    pick.change(show_set, [state, pick], [drill, gallery], api_name=False)
    mode.change(rescore, [state, mode], [mad, cas, table], api_name=False)
    return [generation.hook(engine)]


# -- handlers: (engine, the inputs' values) -> the outputs' values --------------------------------------------
OUTPUTS = ("progress", "mad", "cas", "table", "sets", "axes", "pick", "state")   # a run's outputs, in order


def compare(engine, prompt, fill, rows, n, seed, negative, steps, guidance, caption, synonyms, renormalise,
            sum_normalise, min_frequency, n_boot, top_k, mode):
    """Yields the outputs of a run (OUTPUTS order) as its events arrive; the last names them all."""
    request = compare_request(prompt, fill, rows, n, seed, negative, steps, guidance, caption, synonyms,
                              renormalise, sum_normalise, min_frequency, n_boot, top_k, mode)
    yield from streamed(counterfactuals.run(request, engine), render, OUTPUTS, view=View(kept={"sets": {}, "axes": {}}))


def render(event, view: View) -> dict:
    """{output: value} for one event of a run: the sets as their images arrive, CAS per axis, all at the end."""
    kept = view.kept
    if isinstance(event, Images):
        if event.label.endswith("initial"):
            kept["sets"].clear()       # aggregate mode: show the current prompt's sets only
        kept["sets"].setdefault(event.label, []).extend(event.records)
        return {"sets": report.sets_html(kept["sets"], served_url)}
    if isinstance(event, Progress):
        return {"progress": view.progress_text(event)}
    if isinstance(event, Table) and event.name == "axes":
        return {"axes": event.rows}
    if isinstance(event, AxisScores):
        kept["axes"][event.axis] = event.metrics
        return {"cas": report.cas_html(kept["axes"])}
    if isinstance(event, Done):
        r = event.results
        choices = set_choices(r)
        first_cf = next((label for label, cf in r["sets"].items() if cf["axis"] is not None), None)
        claim = (r.get("headline") or {}).get("text") or (  # issue 16: the claim states how sure it is
            f"Most biased axis: {r['mad_order'][0]} (MAD {fmt(r['mad'][r['mad_order'][0]], 2)})")
        text = (f"**Done**: {len(r['sets'])} sets of {r['n']} images, {len(r['prompts'])} prompt(s), in "
                f"{view.waited():.1f} s (run `{event.run_id}`). {claim[0].upper()}{claim[1:]}.")
        return {"progress": text, "mad": report.mad_html(r), "cas": report.cas_html(report.by_axis(r)),
                "table": report.counterfactual_rows(r), "pick": gr.update(choices=choices, value=first_cf),
                "state": {"results": r, "run_id": event.run_id}}
    return {}


def rescore(view, mode):
    """(MAD, CAS, table) of the shown run as `mode` scores it (counterfactuals.in_mode: from its
    stored answers, nothing generated); no change when no run is shown."""
    results = (view or {}).get("results")
    if not results:
        return gr.update(), gr.update(), gr.update()
    r = counterfactuals.in_mode(results, mode)
    return report.mad_html(r), report.cas_html(report.by_axis(r)), report.counterfactual_rows(r)


def show_set(view, label):
    """(drill-down, gallery) of the set `label` of the shown run."""
    return drilldown((view or {}).get("results"), label)


def compare_request(prompt, fill, rows, n, seed, negative, steps, guidance, caption, synonyms, renormalise,
                    sum_normalise, min_frequency, n_boot, top_k, mode=None) -> counterfactuals.CounterfactualsRequest:
    """The request the form's values make (empty optional numbers: None, the method's defaults)."""
    return counterfactuals.CounterfactualsRequest(
        prompt=prompt, axes=axes_table.axes_of(rows), fill=axes_table.parse_fill(fill), n=int(n),
        seed=int(seed or 0), negative_prompt=negative or "", steps=number_or_none(steps, int),
        guidance=number_or_none(guidance), caption=bool(caption), synonyms=bool(synonyms),
        renormalise=bool(renormalise), sum_normalise=bool(sum_normalise), min_frequency=float(min_frequency or 0),
        n_boot=int(n_boot), top_k=int(top_k), mode=mode or counterfactuals.DEFAULT_MODE)
