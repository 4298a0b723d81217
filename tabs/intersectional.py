"""Intersectional Matrix tab (BiasConnect): which bias axes move which when one is made
diverse — the signed sensitivity matrix, the χ²-tested causal graph, one pair up close."""
from __future__ import annotations

import functools

import gradio as gr

from engine.methods.axes import parse_targets
from engine.common.errors import InputError
from engine.common.events import Done, Progress, Table
from engine.methods import cfsets, intersectional
from engine.report import intersectional as report

from . import axes_table
from .common import View, checked, default, options, streamed, user_errors
from .optional import generation_fields, number_or_none, optional_number, placeholder

EXAMPLES = ["a photo of a doctor", "a photo of a librarian", "a photo of a firefighter"]
POLICY_LABELS = {"drop": "drop them (renormalise over the choices)",
                 "other_bin": "count them as 'other', which the target gives 0"}


def reference_text(ideals: dict) -> str:
    """{axis: {value: share}} in the targets box syntax."""
    return "; ".join(f"{axis}: " + ", ".join(f"{v}={s:g}" for v, s in shares.items()) for axis, shares in ideals.items())


NO_EDGE = ("<p id='ic-no-edge'>No edge was kept: no ordered pair passed the χ² test at this level, so the "
           "BiasGraph has nothing to draw. The matrix still shows every IS, faded where it is not a kept "
           "edge; a looser level or more images per set may keep some.</p>")
NO_PAIR = ("<p id='ic-no-pair'>No pair is kept, so there is no interaction to show up close. Pick a pair "
           "above to see its (pruned, not significant) numbers anyway.</p>")


def threshold_defaults(level: str) -> tuple[str, str]:
    """What an empty p threshold and an empty minimum |IS| mean under `level`, in words."""
    levels = intersectional.default_thresholds(level)
    if level != "auto":
        p, min_is = levels[level]
        return f"{p:g}, the {level} level's", f"{min_is:g}, the {level} level's"
    one, several = levels["prompt"], levels["aggregated"]
    return (f"{one[0]:g} for one prompt, {several[0]:g} with fill values",
            f"{one[1]:g} for one prompt, {several[1]:g} with fill values")


def threshold_placeholders(level: str) -> list:
    """Updates naming the level's thresholds in the two threshold fields (their values untouched)."""
    return [gr.update(placeholder=placeholder(text)) for text in threshold_defaults(level)]


def edge_rows(results: dict) -> list[list]:
    s = results["sensitivity"]
    rows = []
    for e in sorted(results["edges"], key=lambda e: (not e["kept"], e["p_value"])):
        i, j = s["axes"].index(e["source"]), s["axes"].index(e["target"])
        ci = f" [{s['ci_low'][i][j]:+.2f}, {s['ci_high'][i][j]:+.2f}]" if s.get("ci_low") and s["ci_low"][i][j] is not None else ""
        value = "n/a" if e["is"] is None or e["is"] != e["is"] else f"{e['is']:+.3f}"
        rows.append([e["source"], e["target"], value + ci, f"{e['p_value']:.1e}", "kept" if e["kept"] else "pruned"])
    return rows


def build(engine) -> list:
    Request = intersectional.IntersectionalRequest   # noqa: N806 - the widgets start at its defaults
    with gr.Row():
        with gr.Column(scale=2, min_width=340):
            editor = axes_table.build(engine, "ic", EXAMPLES)
            from_cf = gr.Button("Use the prompt and axes of the latest Counterfactuals run", size="sm",
                                elem_id="ic-from-cf")
            with gr.Row():
                n = gr.Slider(2, engine.max_images, value=min(default(Request, "n"), engine.max_images), step=1,
                              label="Images per set (N; the thesis uses 48)", elem_id="ic-n")
                seed = gr.Number(default(Request, "seed"), label="First seed (the same in every set)", precision=0,
                                 elem_id="ic-seed")
            targets = gr.Textbox(label="Target distribution D* per axis (uniform when empty)", elem_id="ic-targets",
                                 placeholder="gender: male=50, female=50; age: young=30, middle-aged=40, old=30")
            reference = gr.File(label="…or a real-world reference CSV (columns axis, value, share)",
                                file_types=[".csv"], elem_id="ic-reference", height=130)
            policy = gr.Radio(options(Request, "other_policy", POLICY_LABELS),
                              value=default(Request, "other_policy"), label="VQA answers outside an axis' choices",
                              elem_id="ic-policy")
            with gr.Accordion("Edges, importance, uncertainty", open=False):
                levels = intersectional.default_thresholds("auto")
                (p_one, _), (p_several, is_several) = levels["prompt"], levels["aggregated"]
                level = gr.Radio(options(Request, "level"), value=default(Request, "level"), label="χ² thresholds",
                                 info=f"prompt: p < {p_one:g}; aggregated: p < {p_several:g} and |IS| ≥ "
                                      f"{is_several:g}; auto: aggregated when several prompts are filled in")
                p_default, is_default = threshold_defaults(level.value)
                p_threshold = optional_number("p threshold", p_default, elem_id="ic-p-threshold")
                min_abs_is = optional_number("minimum |IS| for an edge", is_default, elem_id="ic-min-is")
                importance = gr.Radio(options(Request, "importance", {"count": "number of kept edges",
                                                                      "abs_is": "sum of |IS| over them"}),
                                      value=default(Request, "importance"), label="MaxImp / MaxInf measured by")
                n_boot = gr.Slider(0, 1000, value=default(Request, "n_boot"), step=100,
                                   label="Bootstrap resamples for the IS intervals")
            with gr.Accordion("Generation settings (empty: the model's defaults)", open=False):
                negative = gr.Textbox(label="Negative prompt")
                generation = generation_fields("ic")
            go = gr.Button("Generate and connect", variant="primary", elem_id="ic-run")
        with gr.Column(scale=3):
            progress = gr.Markdown("", elem_id="ic-progress")
            summary = gr.HTML(elem_id="ic-summary-box")
            matrix = gr.HTML(elem_id="ic-matrix")
            graph = gr.HTML(elem_id="ic-graph")
    with gr.Row():
        edges = gr.Dataframe(headers=["made diverse", "affected", "IS [95% CI]", "χ² p", "edge"], interactive=False,
                             label="Every ordered pair", elem_id="ic-edges", max_height=320)
        questions = gr.Dataframe(headers=["axis", "question", "choices", "source"], interactive=False,
                                 label="Multiple-choice VQA questions", elem_id="ic-questions", wrap=True)
    pair = gr.Dropdown([], label="One pair up close: made diverse → affected", elem_id="ic-pair-pick")
    pair_view = gr.HTML(elem_id="ic-pair")
    state = gr.State({})

    @user_errors
    def load_reference(path):
        return reference_text(intersectional.load_reference_csv(path)) if path else gr.skip()

    @user_errors
    def latest_counterfactuals():
        run = next((r for r in engine.store.list_runs("counterfactuals") if r["status"] == "done"), None)
        if run is None:
            raise InputError("no finished Counterfactuals run in the store yet")
        full = engine.store.get_run(run["id"])
        request = full["request"]
        return (request["prompt"], ", ".join(request.get("fill") or []),
                cfsets.rows_from_axes(full["results"]["axes"]), request["n"], request["seed"])

    outputs = [progress, summary, matrix, graph, edges, questions, editor.table, pair, state]

    connect = axes_table.sets_gpu(engine, "intersectional", connect_request)(functools.partial(connect_run, engine))

    def show_pair(view, value):
        results = (view or {}).get("results")
        if results and not value and not results.get("kept_edges"):
            return NO_PAIR
        if not results or not value:
            return ""
        x, y = value.split("|")
        return report.pair_html(results, x, y)

    reference.upload(load_reference, [reference], [targets], api_name=False)
    from_cf.click(latest_counterfactuals, None, [editor.prompt, editor.fill, editor.table, n, seed], api_name=False)
    form = dict(prompt=editor.prompt, table=editor.table, n=n, fill=editor.fill, seed=seed, targets=targets,
                other_policy=policy, level=level, p_threshold=p_threshold, min_abs_is=min_abs_is,
                importance=importance, n_boot=n_boot, negative_prompt=negative, **generation.fields)
    checked(go.click, engine, "intersectional", connect_request, inputs_kwargs=form).success(
        connect, inputs_kwargs=form, outputs=outputs, api_name="intersectional")
    level.change(threshold_placeholders, [level], [p_threshold, min_abs_is], api_name=False, queue=False)
    pair.change(show_pair, [state, pair], [pair_view], api_name=False)
    return [generation.hook(engine)]


OUTPUTS = ("progress", "summary", "matrix", "graph", "edges", "questions", "axes", "pair", "state")  # in order


def connect_run(engine, prompt, table, n, fill=None, seed=0, targets=None, other_policy="drop", level="auto",
                p_threshold=None, min_abs_is=None, importance="count", n_boot=300, negative_prompt=None, steps=None,
                guidance=None):
    """Yields the outputs of a run (OUTPUTS order) as its events arrive; the last names every output
    of the run (the axes table, an input, only when the LLM proposed it)."""
    request = connect_request(prompt, table, n, fill, seed, targets, other_policy, level, p_threshold, min_abs_is,
                              importance, n_boot, negative_prompt, steps, guidance)
    yield from streamed(intersectional.run(request, engine), render, OUTPUTS)


def render(event, view: View) -> dict:
    """{output: value} for one event of a run: the LLM's axes and questions as they come, all at the end."""
    if isinstance(event, Progress):
        return {"progress": view.progress_text(event)}
    if isinstance(event, Table) and event.name == "axes":
        return {"axes": event.rows}
    if isinstance(event, Table) and event.name == "questions":
        return {"questions": event.rows}
    if isinstance(event, Done):
        r = event.results
        axes = r["sensitivity"]["axes"]
        pairs = [(f"{x} → {y}", f"{x}|{y}") for x in axes for y in axes if x != y]
        best = intersectional.default_pair(r)     # a kept edge, never a pruned pair
        text = (f"**Done**: {len(axes)} axes, {len(r['prompts'])} prompt(s), N = {r['n']} per set, in "
                f"{view.waited():.1f} s (run `{event.run_id}`).")
        graph_view = report.graph_frame(r, elem_id="ic-graph-frame") if r["kept_edges"] else NO_EDGE
        return {"progress": text, "summary": report.summary_html(r), "matrix": report.matrix_html(r),
                "graph": graph_view, "edges": edge_rows(r),
                "pair": gr.update(choices=pairs, value="|".join(best) if best else None),
                "state": {"results": r, "run_id": event.run_id}}
    return {}


def connect_request(prompt, table, n, fill=None, seed=0, targets=None, other_policy="drop", level="auto",
                    p_threshold=None, min_abs_is=None, importance="count", n_boot=300, negative_prompt=None, steps=None,
                    guidance=None) -> intersectional.IntersectionalRequest:
    """The request the form's values make (empty optional numbers: None, the method's defaults)."""
    return intersectional.IntersectionalRequest(
        prompt=prompt, axes=axes_table.axes_of(table), fill=axes_table.parse_fill(fill), n=int(n),
        seed=int(seed or 0), ideals=parse_targets(targets or ""), other_policy=other_policy, level=level,
        p_threshold=number_or_none(p_threshold), min_abs_is=number_or_none(min_abs_is), importance=importance,
        n_boot=int(n_boot), negative_prompt=negative_prompt or "", steps=number_or_none(steps, int),
        guidance=number_or_none(guidance))
