"""Mitigate tab (InterMit): choose the axes to mitigate (B*), a target distribution D* and a
priority per axis (normalised live), ε; preview the predicted steps from the sensitivity
matrix, then mitigate step by step: w̄ bars before/after, τ against ε, the prompt set in use
with its weights, sample images, trade-off alerts, the final report and the JSON export."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass

import gradio as gr

from engine.methods.axes import known_axes, parse_targets
from engine.common.errors import InputError
from engine.common.events import Done, Progress, Table
from engine.methods import cfsets, intersectional, mitigate
from engine.report import mitigate as report
from engine.report.runs import image_columns

from . import axes_table
from .common import (View, checked, default, distinct_captions, export_dir, gallery_items, options, served_url,
                     streamed, user_errors)
from .intersectional import POLICY_LABELS, reference_text
from .optional import generation_fields, number_or_none

EXAMPLES = ["a photo of a doctor", "a photo of a librarian", "a photo of a ceo"]
MAX_AXES = 8
MODES = ["uniform", "typed percentages", "real-world CSV"]
STRATEGY_LABELS = {"intermit": "InterMit: greedy by the sensitivity matrix, stop below ε",
                   "all": "baseline: mitigate every axis of B* (no matrix, no early stop)"}
DEFAULT_PRIORITY = 0.5


@dataclass
class Slot:
    """The widgets of one axis: its priority, D* mode and shares."""

    group: gr.Group
    title: gr.Markdown
    priority: gr.Slider
    mode: gr.Dropdown
    shares: gr.Textbox


PRIORITY_RANGE = (0.0, 1.0)


def clamp_priority(axis: str, value) -> tuple[float, str]:
    """(the priority used, "" or the sentence saying a typed value outside PRIORITY_RANGE was clamped)."""
    low, high = PRIORITY_RANGE
    value = float(value or 0)
    used = min(max(value, low), high)
    if used == value:
        return used, ""
    return used, (f"{axis}'s priority {value:g} is {'above its maximum' if value > high else 'below its minimum'} "
                  f"{used:g}, so {used:g} is used")


def axes_and_values(prompt: str, rows) -> dict[str, list[str]]:
    """{axis: its values} of the axes table (the choices its counterfactuals name)."""
    axes = cfsets.axes_from_rows(rows)
    return {a: intersectional.choices((prompt or "").strip(), cfs) for a, cfs in axes.items()}


def weights_markdown(axes: list[str], bstar: list[str], priorities: list[float]) -> str:
    """The normalised priorities p over B* (‖p‖₁ = 1), as the sliders stand (a typed value out
    of range clamped, and said so)."""
    clamped = [(a, *clamp_priority(a, p)) for a, p in zip(axes, priorities) if a in (bstar or [])]
    chosen = [(a, p) for a, p, _ in clamped]
    notes = "".join(f"\n\n**Note:** {note}." for _, _, note in clamped if note)
    total = sum(p for _, p in chosen)
    if not chosen:
        return "**Normalised priorities:** tick the axes to mitigate (B*)."
    if total <= 0:
        return "**Normalised priorities:** every priority is 0; raise at least one." + notes
    parts = " · ".join(f"{a} **{p / total:.2f}**" for a, p in chosen)
    return f"**Normalised priorities** p (‖p‖₁ = 1): {parts}" + notes


def slot_updates(axes: dict[str, list[str]], kept: dict[str, tuple]) -> list:
    """Updates of every slot (group, title, priority, mode, shares) for these axes."""
    out = []
    names = list(axes)
    for i in range(MAX_AXES):
        if i < len(names):
            a = names[i]
            priority, mode, shares = kept.get(a, (DEFAULT_PRIORITY, "uniform", ""))
            example = ", ".join(f"{v}={round(100 / len(axes[a]))}" for v in axes[a])
            out += [gr.update(visible=True), f"**{a}**: {', '.join(axes[a])}",
                    gr.update(value=priority, label=f"priority of {a}"), mode,
                    gr.update(value=shares, placeholder=example)]
        else:
            out += [gr.update(visible=False), "", gr.update(), "uniform", ""]
    return out


def request_parts(axes: list[str], bstar: list[str], values: list) -> tuple[dict, dict]:
    """(priorities over B*, ideals) from the slot values (priority, mode, shares per slot)."""
    priorities, ideals = {}, {}
    for i, axis in enumerate(axes[:MAX_AXES]):
        priority, mode, shares = values[3 * i:3 * i + 3]
        if axis in (bstar or []):
            priorities[axis] = clamp_priority(axis, priority)[0]
        if mode != "uniform" and (shares or "").strip():
            ideals.update(parse_targets(f"{axis}: {shares}"))
    return priorities, ideals


def _export_file(results: dict, run_id: str) -> str:
    """The mitigated prompt set with its weights as a JSON file to download (in an `export_dir`)."""
    path = export_dir() / f"{run_id}.prompt-set.json"
    path.write_text(json.dumps(results.get("prompt_set") or mitigate.export_prompt_set(results), indent=2,
                               ensure_ascii=False), encoding="utf-8")
    return str(path)


def build(engine) -> list:
    Request = mitigate.MitigateRequest   # noqa: N806 - the widgets start at its defaults
    with gr.Row():
        with gr.Column(scale=2, min_width=360):
            editor = axes_table.build(engine, "mt", EXAMPLES, example_axes=True)   # an example fills the axes too
            from_ic = gr.Button("Use the prompt, axes and targets of the latest Intersectional run", size="sm",
                                elem_id="mt-from-ic")
            # hidden until the table has axes; the known axes are its choices meanwhile, so API
            # clients (which cannot load a table first) may name them
            bstar = gr.CheckboxGroup(list(known_axes()), value=[], label="Axes to mitigate (B*)", elem_id="mt-bstar",
                                     visible=False,
                                     info="InterMit may still intervene on an axis outside B* when that lowers τ")
            weights = gr.Markdown(weights_markdown([], [], []), elem_id="mt-weights")
            clamped = gr.Markdown("", elem_id="mt-clamped")   # a priority typed out of range, and what is used
            reference = gr.File(label="Real-world D* from a CSV (columns axis, value, share)", file_types=[".csv"],
                                elem_id="mt-reference", height=130)
            slots = []
            # one compact group for every axis' priority and target (eight open rows made the
            # column ~3,500 px tall); the normalised priorities above summarise it when closed
            with gr.Accordion("Priority and target D* of each axis", open=False, elem_id="mt-slots"):
                for i in range(MAX_AXES):
                    with gr.Group(visible=False, elem_id=f"mt-axis-{i}") as group:
                        title = gr.Markdown(elem_id=f"mt-axis-title-{i}")
                        with gr.Row():
                            priority = gr.Slider(*PRIORITY_RANGE, value=DEFAULT_PRIORITY, step=0.05, label="priority",
                                                 elem_id=f"mt-priority-{i}", min_width=140)
                            mode = gr.Dropdown(MODES, value="uniform", label="ideal distribution D*",
                                               elem_id=f"mt-mode-{i}", min_width=140)
                            shares = gr.Textbox("", label="D* shares (value=percent, …)", lines=1, min_width=160,
                                                elem_id=f"mt-shares-{i}")
                    slots.append(Slot(group, title, priority, mode, shares))
            with gr.Row():
                epsilon = gr.Slider(0.01, 1.0, value=default(Request, "epsilon"), step=0.01, label="Threshold ε",
                                    elem_id="mt-epsilon", info="stop once τ = ⟨w̄_B*, p⟩ < ε (thesis: 0.35)")
                n = gr.Slider(2, engine.max_images, value=min(default(Request, "n"), engine.max_images), step=1,
                              label="Images per set (N)", elem_id="mt-n")
                seed = gr.Number(default(Request, "seed"), label="First seed", precision=0, elem_id="mt-seed")
            strategy = gr.Radio(options(Request, "strategy", STRATEGY_LABELS), value=default(Request, "strategy"),
                                label="Strategy", elem_id="mt-strategy")
            with gr.Accordion("Answers, uncertainty, generation settings", open=False):
                policy = gr.Radio(options(Request, "other_policy", POLICY_LABELS),
                                  value=default(Request, "other_policy"), label="VQA answers outside an axis' choices")
                n_boot = gr.Slider(0, 1000, value=default(Request, "n_boot"), step=100,
                                   label="Bootstrap resamples (95% intervals)")
                tolerance = gr.Slider(0, 0.2, value=default(Request, "tradeoff_tolerance"), step=0.01,
                                      label="Trade-off alert when an axis' w̄ rises by more than")
                negative = gr.Textbox(label="Negative prompt")
                generation = generation_fields("mt")
            with gr.Row():
                preview_btn = gr.Button("Preview the steps", elem_id="mt-preview-btn")
                go = gr.Button("Mitigate", variant="primary", elem_id="mt-run")
        with gr.Column(scale=3):
            progress = gr.Markdown("", elem_id="mt-progress")
            preview_box = gr.HTML(elem_id="mt-preview-box")
            gallery = gr.Gallery(label="Sample images of the prompt set in use", columns=8, height=240,
                                 elem_id="mt-gallery", object_fit="contain", allow_preview=True)
            view = gr.HTML(elem_id="mt-view")
            export = gr.File(label="Mitigated prompt set with weights (JSON)", interactive=False, elem_id="mt-export",
                             height=90)
    axes_state = gr.State([])
    slot_components = [c for s in slots for c in (s.group, s.title, s.priority, s.mode, s.shares)]
    # each slot's inputs by name: priority_0, mode_0, shares_0, priority_1, ...
    slot_inputs = {f"{name}_{i}": getattr(s, name) for i, s in enumerate(slots) for name in ("priority", "mode", "shares")}
    priorities = {f"priority_{i}": s.priority for i, s in enumerate(slots)}

    outputs = [progress, preview_box, view, gallery, export, editor.table]

    mitigate_or_preview = axes_table.sets_gpu(engine, "mitigate", mitigate_request)(functools.partial(mitigate_run, engine))

    refresh_outputs = [axes_state, bstar, *slot_components, weights]   # `refresh`'s order
    editor.table.change(refresh, inputs_kwargs=dict(prompt=editor.prompt, rows=editor.table, axes=axes_state,
                                                    chosen=bstar, **slot_inputs),
                        outputs=refresh_outputs, api_name=False)
    for trigger in [bstar, *priorities.values()]:
        # preprocess=False: a value typed above the slider's maximum reaches the handler (Gradio's
        # Slider would fail the event with "Error") to be clamped and said so
        trigger.change(show_weights, inputs_kwargs=dict(axes=axes_state, chosen=bstar, **priorities), outputs=[weights],
                       preprocess=False,
                       api_name=False)
    for i, priority in enumerate(priorities.values()):   # the box shows what is used; the note stays
        priority.input(functools.partial(clamp_typed, i), [axes_state, priority], [priority, clamped],
                       preprocess=False, api_name=False, show_progress="hidden")
    reference.upload(user_errors(load_reference), [reference, axes_state],
                     [s.mode for s in slots] + [s.shares for s in slots], api_name=False)
    from_ic.click(user_errors(functools.partial(latest_intersectional, engine)), None,
                  [editor.prompt, editor.fill, editor.table, n, seed, *refresh_outputs], api_name=False)
    form = dict(prompt=editor.prompt, fill=editor.fill, table=editor.table, axes_to_mitigate=bstar, n=n, seed=seed,
                epsilon=epsilon, strategy=strategy, other_policy=policy, n_boot=n_boot, tradeoff_tolerance=tolerance,
                negative_prompt=negative, **generation.fields, **slot_inputs)
    for button, preview_only, api_name in ((go, False, "mitigate"), (preview_btn, True, "mitigate_preview")):
        checked(button.click, engine, "mitigate", functools.partial(mitigate_request, preview_only),
                inputs_kwargs=form).success(functools.partial(mitigate_or_preview, preview_only), inputs_kwargs=form,
                                            outputs=outputs, api_name=api_name)
    return [generation.hook(engine)]


# -- handlers: (engine, the inputs' values) -> the outputs' values --------------------------------------------
def kept_values(axes, values) -> dict:
    """{axis: (priority, mode, shares)} of the slots as they stand."""
    return {a: tuple(values[3 * i:3 * i + 3]) for i, a in enumerate((axes or [])[:MAX_AXES])}


def refresh(prompt, rows, axes, chosen, **slot_form):
    """The table changed: one slot per axis, settings kept by axis name. Returns (axes, B*, every slot's
    widgets, the normalised priorities)."""
    found = axes_and_values(prompt, rows)
    if len(found) > MAX_AXES:
        gr.Warning(f"only the first {MAX_AXES} axes get a priority and target; the others stay uniform and are "
                   "not mitigated")
    names = list(found)[:MAX_AXES]
    if names == list(axes or []):
        # the same axes (a cell edit, or a button that already filled the slots): keep every
        # setting; the slot values this event carries may predate that button's update
        return gr.skip()
    kept = kept_values(axes, slot_values(slot_form))
    chosen = [a for a in (chosen or []) if a in names] if axes else []
    chosen = chosen or names
    prios = [kept.get(a, (DEFAULT_PRIORITY,))[0] for a in names]
    return (names, gr.update(choices=names, value=chosen, visible=bool(names)),
            *slot_updates({a: found[a] for a in names}, kept), weights_markdown(names, chosen, prios))


def clamp_typed(index: int, axes, value) -> tuple[float, str]:
    """(the slider's value clamped to PRIORITY_RANGE, the note saying so or "") for a typed priority."""
    used, note = clamp_priority(((axes or [])[index:index + 1] or ["this axis"])[0], value)
    return used, f"**Note:** {note}." if note else ""


def show_weights(axes, chosen, **priority_form):
    """The normalised priorities as the sliders stand."""
    return weights_markdown(axes or [], chosen or [], [priority_form[f"priority_{i}"] for i in range(MAX_AXES)])


def load_reference(path, axes):
    """Every slot's (mode, then shares) from a real-world reference CSV; unchanged for axes it does not name."""
    if not path:
        return gr.skip()
    shares = intersectional.load_reference_csv(path)
    missing = set(shares) - set(axes or [])
    if missing:
        gr.Warning(f"the CSV names axes not in the table: {', '.join(sorted(missing))}")
    modes, texts = [gr.skip()] * MAX_AXES, [gr.skip()] * MAX_AXES
    for i, axis in enumerate((axes or [])[:MAX_AXES]):
        if axis in shares:
            modes[i], texts[i] = "real-world CSV", reference_text({axis: shares[axis]}).split(": ", 1)[1]
    return (*modes, *texts) if any(axis in shares for axis in axes or []) else gr.skip()


def latest_intersectional(engine):
    """The prompt, fill, axes table, N and seed of the newest finished Intersectional run, then what
    `refresh` returns for its axes with their targets."""
    run = next((r for r in engine.store.list_runs("intersectional") if r["status"] == "done"), None)
    if run is None:
        raise InputError("no finished Intersectional Matrix run in the store yet")
    full = engine.store.get_run(run["id"])
    request, results = full["request"], full["results"]
    if len(results.get("prompts") or [1]) > 1:
        gr.Warning("that run filled several prompts; mitigation takes one: keep one fill value")
    axes = {a: results["values"][a] for a in results["axes"]}
    names = list(axes)[:MAX_AXES]
    ideals = request.get("ideals") or {}
    kept = {a: (DEFAULT_PRIORITY, "typed percentages", reference_text({a: ideals[a]}).split(": ", 1)[1])
            for a in names if ideals.get(a)}
    return (request["prompt"], ", ".join(request.get("fill") or []), cfsets.rows_from_axes(results["axes"]),
            request["n"], request["seed"], names, gr.update(choices=names, value=names, visible=True),
            *slot_updates({a: axes[a] for a in names}, kept),
            weights_markdown(names, names, [DEFAULT_PRIORITY] * len(names)))


OUTPUTS = ("progress", "preview", "view", "gallery", "export", "axes")   # a run's outputs, in order


def mitigate_run(engine, preview_only: bool, prompt, table, n, axes_to_mitigate=(), fill=None, seed=0,
                 epsilon=mitigate.DEFAULT_EPSILON, strategy="intermit", other_policy="drop", n_boot=200,
                 tradeoff_tolerance=0.02, negative_prompt=None, steps=None, guidance=None, **slot_form):
    """Both endpoints (the inputs by name; the slots' as priority_i, mode_i, shares_i): yields the outputs
    (OUTPUTS order) as the events arrive; the last names them all."""
    request = mitigate_request(preview_only, prompt, table, n, axes_to_mitigate, fill, seed, epsilon, strategy,
                               other_policy, n_boot, tradeoff_tolerance, negative_prompt, steps, guidance, **slot_form)
    view = View(shown={"progress": "", "preview": "", "view": "", "gallery": [], "export": None},
                kept={"request": request, "sample": {}, "stats": engine.stats,
                      "generated_before": engine.stats.images_generated})
    yield from streamed(mitigate.run(request, engine), render, OUTPUTS, view=view)


BEFORE_AFTER = 12   # images in each of the before/after grids


def before_after(sample: dict[int, list]):
    """The base prompt's images (step 0) and those of the latest mitigated prompt set side by
    side, each caption under its image ("" before any image)."""
    if not sample:
        return ""

    def column(key: str, title: str, records: list) -> dict:
        shown = records[:BEFORE_AFTER]
        return {"key": key, "title": title, "more": len(records) - len(shown),
                "images": [{"src": served_url(r.path), "caption": c} for r, c in zip(shown, distinct_captions(shown))]}

    first, last = min(sample), max(sample)
    columns = [column("before", "Before: the initial prompt's images", sample[first])]
    if last != first:
        columns.append(column("after", f"After: the prompt set of step {last}", sample[last]))
    return image_columns(columns, "mt-before-after")   # Markup: the page embeds it as HTML


def render(event, view: View) -> dict:
    """{output: value} for one event of a run: a sample of the prompt set in use, the results after every
    measurement, the preview, the prompt set to download at the end."""
    kept = view.kept
    if isinstance(event, Progress):
        return {"progress": view.progress_text(event)}
    if isinstance(event, mitigate.PromptSetImages):
        sample = kept["sample"]
        sample.setdefault(event.step, []).extend(event.records)
        sampled = sample[max(sample)][:24]
        return {"gallery": gallery_items(sampled, distinct_captions(sampled))}
    if isinstance(event, Table) and event.name == "axes":
        return {"axes": event.rows}
    if isinstance(event, mitigate.PreviewReady):
        return {"preview": report.preview_html(event.preview)}
    if isinstance(event, mitigate.Measured):
        return {"view": report.page(event.results, with_preview=False, images=before_after(kept["sample"]))}
    if isinstance(event, Done):
        r = event.results
        generated = kept["stats"].images_generated - kept["generated_before"]
        text = (f"**{mitigate.outcome(r)}**. {generated} image(s) generated, the rest from the store; "
                f"{view.waited():.1f} s (run `{event.run_id}`).")
        return {"progress": text, "view": report.page(r, with_preview=False, images=before_after(kept["sample"])),
                "preview": report.preview_html(r.get("preview")),
                "export": None if kept["request"].preview_only else _export_file(r, event.run_id)}
    return {}


def slot_values(slot_form: dict) -> list:
    """The slots' values in order (priority, mode, shares per slot) from the inputs by name."""
    return [slot_form.get(f"{name}_{i}") for i in range(MAX_AXES) for name in ("priority", "mode", "shares")]


def mitigate_request(preview_only: bool, prompt, table, n, axes_to_mitigate=(), fill=None, seed=0,
                     epsilon=mitigate.DEFAULT_EPSILON, strategy="intermit", other_policy="drop", n_boot=200,
                     tradeoff_tolerance=0.02, negative_prompt=None, steps=None, guidance=None,
                     **slot_form) -> mitigate.MitigateRequest:
    """The request the form's values make (empty optional numbers: None, the method's defaults)."""
    axes = axes_table.axes_of(table)
    if axes and not axes_to_mitigate:
        raise InputError("tick at least one axis to mitigate (B*)")
    names = list(axes_and_values(prompt, table))   # the slots' order (see refresh)
    prios, ideals = request_parts(names, list(axes_to_mitigate), slot_values(slot_form))
    return mitigate.MitigateRequest(
        prompt=prompt, axes=axes, fill=axes_table.parse_fill(fill), n=int(n), seed=int(seed or 0),
        mitigate=list(axes_to_mitigate) if axes else [], priorities=prios if axes else {}, ideals=ideals,
        epsilon=float(epsilon), strategy="intermit" if preview_only else strategy, other_policy=other_policy,
        n_boot=0 if preview_only else int(n_boot), tradeoff_tolerance=float(tradeoff_tolerance),
        negative_prompt=negative_prompt or "", steps=number_or_none(steps, int), guidance=number_or_none(guidance),
        preview_only=preview_only)
