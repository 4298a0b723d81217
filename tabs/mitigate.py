"""Mitigate tab (InterMit): choose the axes to mitigate (B*), a target distribution D* and a
priority per axis (normalised live), ε; preview the predicted steps from the sensitivity
matrix, then mitigate step by step: w̄ bars before/after, τ against ε, the prompt set in use
with its weights, sample images, trade-off alerts, the final report and the JSON export."""
from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import gradio as gr

from engine.axes import known_axes, parse_targets
from engine.errors import InputError
from engine.events import Done, Images, Progress, Scores, Table, Warning
from engine.methods import cfsets, intersectional, mitigate
from engine.render_mitigate import mitigate_html, preview_html

from . import axes_table
from .common import distinct_captions, gallery_items, gpu, user_errors, with_notes
from .intersectional import reference_text

EXAMPLES = ["a photo of a doctor", "a photo of a librarian", "a photo of a ceo"]
MAX_AXES = 8
MODES = ["uniform", "typed percentages", "real-world CSV"]
POLICIES = [("drop them (renormalise over the choices)", "drop"),
            ("count them as 'other', which the target gives 0", "other_bin")]
STRATEGIES = [("InterMit: greedy by the sensitivity matrix, stop below ε", "intermit"),
              ("baseline: mitigate every axis of B* (no matrix, no early stop)", "all")]
DEFAULT_PRIORITY = 0.5
UPDATE_EVERY = 0.5   # seconds between two progress updates of the page


@dataclass
class Slot:
    """The widgets of one axis: its priority, D* mode and shares."""

    group: gr.Group
    title: gr.Markdown
    priority: gr.Slider
    mode: gr.Dropdown
    shares: gr.Textbox


def axes_and_values(prompt: str, rows) -> dict[str, list[str]]:
    """{axis: its values} of the axes table (the choices its counterfactuals name)."""
    axes = cfsets.axes_from_rows(rows)
    return {a: intersectional.choices((prompt or "").strip(), cfs) for a, cfs in axes.items()}


def weights_markdown(axes: list[str], bstar: list[str], priorities: list[float]) -> str:
    """The normalised priorities p over B* (‖p‖₁ = 1), as the sliders stand."""
    chosen = [(a, float(p or 0)) for a, p in zip(axes, priorities) if a in (bstar or [])]
    total = sum(p for _, p in chosen)
    if not chosen:
        return "**Normalised priorities:** tick the axes to mitigate (B*)."
    if total <= 0:
        return "**Normalised priorities:** every priority is 0; raise at least one."
    parts = " · ".join(f"{a} **{p / total:.2f}**" for a, p in chosen)
    return f"**Normalised priorities** p (‖p‖₁ = 1): {parts}"


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
            priorities[axis] = float(priority or 0)
        if mode != "uniform" and (shares or "").strip():
            ideals.update(parse_targets(f"{axis}: {shares}"))
    return priorities, ideals


def _export_file(results: dict, run_id: str) -> str:
    path = Path(tempfile.mkdtemp(prefix="gaplens-mitigate-")) / f"{run_id}.prompt-set.json"
    path.write_text(json.dumps(results.get("prompt_set") or mitigate.export_prompt_set(results), indent=2,
                               ensure_ascii=False), encoding="utf-8")
    return str(path)


def build(engine) -> list:
    with gr.Row():
        with gr.Column(scale=2, min_width=360):
            editor = axes_table.build(engine, "mt", EXAMPLES)
            from_ic = gr.Button("Use the prompt, axes and targets of the latest Intersectional run", size="sm",
                                elem_id="mt-from-ic")
            # hidden until the table has axes; the known axes are its choices meanwhile, so API
            # clients (which cannot load a table first) may name them
            bstar = gr.CheckboxGroup(list(known_axes()), value=[], label="Axes to mitigate (B*)", elem_id="mt-bstar",
                                     visible=False,
                                     info="InterMit may still intervene on an axis outside B* when that lowers τ")
            weights = gr.Markdown(weights_markdown([], [], []), elem_id="mt-weights")
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
                            priority = gr.Slider(0, 1, value=DEFAULT_PRIORITY, step=0.05, label="priority",
                                                 elem_id=f"mt-priority-{i}", min_width=140)
                            mode = gr.Dropdown(MODES, value="uniform", label="ideal distribution D*",
                                               elem_id=f"mt-mode-{i}", min_width=140)
                            shares = gr.Textbox(label="D* shares (value=percent, …)", lines=1, min_width=160,
                                                elem_id=f"mt-shares-{i}")
                    slots.append(Slot(group, title, priority, mode, shares))
            with gr.Row():
                epsilon = gr.Slider(0.01, 1.0, value=mitigate.DEFAULT_EPSILON, step=0.01, label="Threshold ε",
                                    elem_id="mt-epsilon", info="stop once τ = ⟨w̄_B*, p⟩ < ε (thesis: 0.35)")
                n = gr.Slider(2, engine.max_images, value=min(16, engine.max_images), step=1,
                              label="Images per set (N)", elem_id="mt-n")
                seed = gr.Number(0, label="First seed", precision=0, elem_id="mt-seed")
            strategy = gr.Radio(STRATEGIES, value="intermit", label="Strategy", elem_id="mt-strategy")
            with gr.Accordion("Answers, uncertainty, generation settings", open=False):
                policy = gr.Radio(POLICIES, value="drop", label="VQA answers outside an axis' choices")
                n_boot = gr.Slider(0, 1000, value=200, step=50, label="Bootstrap resamples (95% intervals)")
                tolerance = gr.Slider(0, 0.2, value=0.02, step=0.01, label="Trade-off alert when an axis' w̄ rises by "
                                      "more than")
                negative = gr.Textbox(label="Negative prompt")
                steps = gr.Number(None, label="Steps", precision=0)
                guidance = gr.Number(None, label="Guidance")
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
    slot_values = [c for s in slots for c in (s.priority, s.mode, s.shares)]
    priorities = [s.priority for s in slots]

    def kept_values(axes, values) -> dict:
        return {a: tuple(values[3 * i:3 * i + 3]) for i, a in enumerate((axes or [])[:MAX_AXES])}

    def refresh(prompt, rows, axes, chosen, *values):
        """The table changed: one slot per axis, settings kept by axis name."""
        found = axes_and_values(prompt, rows)
        if len(found) > MAX_AXES:
            gr.Warning(f"only the first {MAX_AXES} axes get a priority and target; the others stay uniform and are "
                       "not mitigated")
        names = list(found)[:MAX_AXES]
        if names == list(axes or []):
            # the same axes (a cell edit, or a button that already filled the slots): keep every
            # setting; the slot values this event carries may predate that button's update
            return (gr.skip(), gr.skip(), *[gr.skip()] * len(slot_components), gr.skip())
        kept = kept_values(axes, values)
        chosen = [a for a in (chosen or []) if a in names] if axes else []
        chosen = chosen or names
        updates = slot_updates({a: found[a] for a in names}, kept)
        prios = [kept.get(a, (DEFAULT_PRIORITY,))[0] for a in names]
        return (names, gr.update(choices=names, value=chosen, visible=bool(names)), *updates,
                weights_markdown(names, chosen, prios))

    def show_weights(axes, chosen, *values):
        return weights_markdown(axes or [], chosen or [], list(values))

    @user_errors
    def load_reference(path, axes, *values):
        if not path:
            return [gr.skip()] * len(slot_values)
        shares = intersectional.load_reference_csv(path)
        out = []
        for i in range(MAX_AXES):
            axis = axes[i] if i < len(axes or []) else None
            if axis in shares:
                out += [gr.skip(), "real-world CSV", reference_text({axis: shares[axis]}).split(": ", 1)[1]]
            else:
                out += [gr.skip()] * 3
        missing = set(shares) - set(axes or [])
        if missing:
            gr.Warning(f"the CSV names axes not in the table: {', '.join(sorted(missing))}")
        return out

    @user_errors
    def latest_intersectional():
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

    def make_request(prompt, fill, rows, chosen, n, seed, eps, strat, pol, boot, tol, neg, steps_, guid,
                     values, preview_only):
        table = axes_table.axes_of(rows)
        axes = list(axes_and_values(prompt, rows))   # the slots' order (see refresh)
        if table and not chosen:
            raise InputError("tick at least one axis to mitigate (B*)")
        prios, ideals = request_parts(axes or [], chosen or [], list(values))
        return mitigate.MitigateRequest(
            prompt=prompt, axes=table, fill=axes_table.parse_fill(fill), n=int(n), seed=int(seed or 0),
            mitigate=list(chosen or []) if table else [], priorities=prios if table else {}, ideals=ideals,
            epsilon=float(eps), strategy=strat, other_policy=pol, n_boot=int(boot), tradeoff_tolerance=float(tol),
            negative_prompt=neg or "", steps=None if steps_ in (None, "") else int(steps_),
            guidance=None if guid in (None, "") else float(guid), preview_only=preview_only)

    def stream(request):
        """Run the method; yields (progress, preview, view, gallery, export, table)."""
        latest = ["", "", "", [], None, gr.skip()]
        started = time.perf_counter()
        sample: dict[int, list] = {}
        notes: list[str] = []
        before = engine.stats.images_generated

        def update(**changes):
            order = ("progress", "preview", "view", "gallery", "export", "table")
            for k, v in changes.items():
                latest[order.index(k)] = v
            return tuple(changes.get(k, gr.skip()) for k in order)

        shown_at = 0.0
        for event in mitigate.run(request, engine):
            if isinstance(event, Progress):
                if time.perf_counter() - shown_at < UPDATE_EVERY:
                    continue
                shown_at = time.perf_counter()
                eta = f", about {event.eta_s:.0f} s left" if event.eta_s else ""
                yield update(progress=with_notes(f"**{event.message or event.stage}**{eta} "
                                                 f"({time.perf_counter() - started:.1f} s)", notes))
            elif isinstance(event, Images) and "|axis=" not in event.label and event.label.startswith("step="):
                step = int(event.label.split("|", 1)[0].split("=", 1)[1])
                sample.setdefault(step, []).extend(event.records)
                shown = sample[max(sample)][:24]
                yield update(gallery=gallery_items(shown, distinct_captions(shown)))
            elif isinstance(event, Warning):    # shown with this result, not as a toast over it
                notes.append(event.message)
                yield update(progress=with_notes(latest[0].split("\n\n**Notes")[0], notes))
            elif isinstance(event, Table) and event.name == "axes":
                yield update(table=event.rows)
            elif isinstance(event, Scores) and event.name == "preview":
                yield update(preview=preview_html(event.values))
            elif isinstance(event, Scores) and event.name == "results":
                yield update(view=mitigate_html(event.values, with_preview=False))
            elif isinstance(event, Done):
                r = event.results
                generated = engine.stats.images_generated - before
                text = (f"**{mitigate.outcome(r)}**. {generated} image(s) generated, the rest from the store; "
                        f"{event.summary.get('seconds', 0):.1f} s (run `{event.run_id}`).")
                update(progress=with_notes(text, notes), view=mitigate_html(r, with_preview=False), preview=preview_html(r.get("preview")),
                       export=_export_file(r, event.run_id) if not request.preview_only else None)
                yield tuple(latest)

    @gpu
    @user_errors
    def run_mitigation(prompt, fill, rows, chosen, n, seed, eps, strat, pol, boot, tol, neg, steps_, guid, *values):
        request = make_request(prompt, fill, rows, chosen, n, seed, eps, strat, pol, boot, tol, neg, steps_, guid,
                               values, False)
        yield from stream(request)

    @gpu
    @user_errors
    def run_preview(prompt, fill, rows, chosen, n, seed, eps, strat, pol, boot, tol, neg, steps_, guid, *values):
        request = make_request(prompt, fill, rows, chosen, n, seed, eps, "intermit", pol, 0, tol, neg, steps_, guid,
                               values, True)
        yield from stream(request)

    refresh_outputs = [axes_state, bstar, *slot_components, weights]
    editor.table.change(refresh, [editor.prompt, editor.table, axes_state, bstar, *slot_values], refresh_outputs,
                        api_name=False)
    for slider in priorities:
        slider.change(show_weights, [axes_state, bstar, *priorities], [weights], api_name=False)
    bstar.change(show_weights, [axes_state, bstar, *priorities], [weights], api_name=False)
    reference.upload(load_reference, [reference, axes_state, *slot_values], slot_values, api_name=False)
    from_ic.click(latest_intersectional, None, [editor.prompt, editor.fill, editor.table, n, seed, *refresh_outputs],
                  api_name=False)
    inputs = [editor.prompt, editor.fill, editor.table, bstar, n, seed, epsilon, strategy, policy, n_boot,
              tolerance, negative, steps, guidance, *slot_values]
    outputs = [progress, preview_box, view, gallery, export, editor.table]
    go.click(run_mitigation, inputs, outputs, api_name="mitigate")
    preview_btn.click(run_preview, inputs, outputs, api_name="mitigate_preview")
    return []
