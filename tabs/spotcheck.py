""""Check the labels": a person answers the axis question for a stratified random sample of a
run's images, one at a time (buttons or keys 1–9, 0 = can't tell); the answers are stored with
the run (who, when) and the evaluator's accuracy, κ and the corrected distribution follow.
Also: the same images scored by a second evaluator. Thin: engine.methods.validate does the work,
engine.report.trust renders it. Used by the Single Prompt, Counterfactuals and Runs tabs."""
from __future__ import annotations

import gradio as gr

from engine.hosting import backend_choices
from engine.common.errors import InputError
from engine.methods import validate
from engine.models.presets import parse_model_override
from engine.report import trust

from engine.hosting.space import GpuWork

from .common import gpu, served, user_errors

MAX_CLASSES = 9
# Keys 1–9 press the answer buttons of the spot-check on screen, 0 or c "can't tell"; typing in a
# text box is left alone. Installed once per page, whichever panel loads first.
KEYS_JS = """
if (!window.__glSpotKeys) {
  window.__glSpotKeys = true;
  document.addEventListener('keydown', (e) => {
    const t = e.target;
    if (e.ctrlKey || e.metaKey || e.altKey) return;
    if (t && (t.tagName === 'INPUT' || t.tagName === 'TEXTAREA' || t.isContentEditable)) return;
    const items = [...document.querySelectorAll('.gl-spot-item[data-key]')].filter(el => el.offsetParent !== null);
    if (!items.length) return;
    let n = null;
    if (e.key >= '1' && e.key <= '9') n = e.key;
    else if (e.key === '0' || e.key === 'c') n = '0';
    if (n === null) return;
    const holder = document.getElementById(items[0].dataset.prefix + '-answer-' + n);
    const button = holder && (holder.tagName === 'BUTTON' ? holder : holder.querySelector('button'));
    if (button && button.offsetParent !== null && !button.disabled) { e.preventDefault(); button.click(); }
  });
}
"""


def checked_html(store, run_id: str):
    """The evaluator check of a run (raw beside corrected, Markup) when any of its images is labelled, else ''."""
    run = store.get_run(run_id)
    if run is None or not validate.checkable_axes(run):
        return ""
    validation = validate.validate_run(store, run_id)
    checked = any(a.get("n_checked") for a in validation["axes"].values())
    return trust.validation_html(validation) if checked else ""


def build(engine, run_id_of, run_input, prefix: str, open_: bool = False) -> dict:
    """Lay out the spot-check panel. `run_input` is the component holding the run; `run_id_of`
    turns its value into a run id (None when there is none). Returns the panel's components."""
    store = engine.store
    with gr.Accordion("Check the labels (spot-check the evaluator against your own eyes)", open=open_,
                      elem_id=f"{prefix}-panel"):
        gr.HTML("", js_on_load=KEYS_JS, elem_id=f"{prefix}-keys", container=False)
        with gr.Row():
            axis = gr.Dropdown([], value=None, allow_custom_value=True, label="Axis (empty = the first)",
                               elem_id=f"{prefix}-axis", scale=2)
            size = gr.Slider(5, 100, value=20, step=1, label="Images to check", elem_id=f"{prefix}-size", scale=2)
            who = gr.Textbox("", label="Your name (stored with each answer)", elem_id=f"{prefix}-who", scale=2)
            start = gr.Button("Check the labels", variant="primary", elem_id=f"{prefix}-start", scale=1)
        with gr.Row():
            image = gr.Image(label="Image", interactive=False, height=320, elem_id=f"{prefix}-image",
                             visible=False, type="filepath", scale=2)
            with gr.Column(scale=3):
                item = gr.HTML("", elem_id=f"{prefix}-question")
                with gr.Row():
                    buttons = [gr.Button(f"{i}", visible=False, elem_id=f"{prefix}-answer-{i}", size="sm")
                               for i in range(1, MAX_CLASSES + 1)]
                cant = gr.Button("0 · can't tell", visible=False, elem_id=f"{prefix}-answer-0", size="sm")
        result = gr.HTML("", elem_id=f"{prefix}-validation")
        with gr.Row():
            if engine.public:  # visitors pick from the evaluators the host offers, never type one
                other = gr.Dropdown(list(backend_choices.offered(engine, "vqa")), value=None,
                                    label="Compare with another evaluator", elem_id=f"{prefix}-other", scale=4)
            else:
                other = gr.Textbox("", label="Compare with another evaluator (backend:model)",
                                   placeholder="faces: (gender and age), clip_vqa:synthetic, blip_vqa:Salesforce/blip-vqa-base, vlm:...",
                                   elem_id=f"{prefix}-other", scale=4)
            compare_btn = gr.Button("Compare evaluators", elem_id=f"{prefix}-compare", scale=1)
        comparison = gr.HTML("", elem_id=f"{prefix}-comparison")
    state = gr.State({})

    def hidden_buttons():
        return [gr.Button(visible=False) for _ in buttons] + [gr.Button(visible=False)]

    def show(s: dict):
        """The updates for the current image of the check, or the end of it."""
        queue, pos = s["queue"], s["pos"]
        if pos >= len(queue):
            more = "Pick another axis or click 'Check the labels' again for more images."
            return ([gr.Image(value=None, visible=False),
                     trust.spot_done_html(prefix, s["run_id"], s["answered"], s["who"], more)]
                    + hidden_buttons() + [trust.validation_html(validate.validate_run(store, s["run_id"]))])
        key = queue[pos]
        path = store.get_images([key]).get(key)
        return ([gr.Image(value=served(path.path) if path else None, visible=True),
                 trust.spot_item_html(prefix, s["run_id"], s["axis"], s["question"], s["classes"], key, pos + 1,
                                      len(queue))]
                + [gr.Button(f"{i + 1} · {s['classes'][i]}", visible=True) if i < len(s["classes"])
                   else gr.Button(visible=False) for i in range(MAX_CLASSES)]
                + [gr.Button(visible=True), gr.skip()])

    @user_errors
    def begin(run_value, axis_name, n, name, request: gr.Request = None):
        run_id = run_id_of(run_value)
        if not run_id:
            raise InputError("open or finish a run first: the check labels that run's images")
        run = store.get_run(run_id)
        if run is None:
            raise InputError(f"no run '{run_id}' in the store")
        items = validate.checkable_axes(run)
        if not items:
            raise InputError(f"a {run['method']} run has no evaluator labels to check; Single Prompt and "
                             "Counterfactuals runs have")
        name_ = (axis_name or "").strip().lower()
        chosen = items.get(name_) or next(iter(items.values()))
        done = {k for (k, a) in validate.latest_labels(store, chosen.keys) if a == chosen.axis}
        queue = validate.spot_check_sample(chosen, int(n), seed=len(done), done=done)
        s = {"run_id": run_id, "axis": chosen.axis, "question": chosen.question, "queue": queue, "pos": 0,
             "classes": chosen.classes[:MAX_CLASSES],
             "who": (name or "").strip()[:80] or getattr(request, "username", None) or "anonymous", "answered": 0}
        if not queue:
            gr.Info(f"every image of '{chosen.axis}' in this run is already checked")
        return [gr.Dropdown(choices=list(items), value=chosen.axis), s] + show(s)

    def answer(index: int):
        @user_errors
        def record(s):
            if not s or s.get("pos", 0) >= len(s.get("queue", [])):
                raise InputError("click 'Check the labels' first")
            label = validate.CANT_TELL if index == 0 else s["classes"][index - 1]
            store.put_labels([(s["run_id"], s["queue"][s["pos"]], s["axis"], label, s["who"])])
            s = {**s, "pos": s["pos"] + 1, "answered": s["answered"] + 1}
            return [s] + show(s)
        return record

    def evaluators(run_value, other_spec):
        """The second evaluator and the preset's (whose embedder a CLIP VQA uses): the GPU decision."""
        other = []
        for name in names_typed(other_spec):
            try:
                other.append(parse_model_override(name))
            except InputError:
                pass    # the comparison itself reports the bad name
        return [*other, engine.preset.embedder, engine.preset.vqa]

    def compared_run(run_value, other_spec) -> dict:
        """The run to compare evaluators on, the visitor's (else the InputError of a missing run), and at least
        one evaluator named: checked before the GPU is asked for."""
        run_id = run_id_of(run_value)
        if not run_id:
            raise InputError("open or finish a run first")
        names = names_typed(other_spec)
        if not names:
            raise InputError("name the second evaluator as backend:model, e.g. clip_vqa:synthetic")
        run = store.require_run(run_id, what="run")
        for name in names:   # a visitor's: one the host offers
            backend_choices.resolve(engine, "vqa", name)
        return run

    def compare_work(run_value, other_spec) -> list[GpuWork]:
        """Every image of each checkable axis of the run asked again, by each evaluator named."""
        items = validate.checkable_axes(compared_run(run_value, other_spec))
        answers = sum(len(item.keys) for item in items.values())
        return [GpuWork(answers=answers, vqa=backend_choices.resolve(engine, "vqa", name))
                for name in names_typed(other_spec)]

    @gpu(engine, duration=compare_work, specs=evaluators, check=compared_run)
    def compare(run_value, other_spec):
        compared_run(run_value, other_spec)
        names = names_typed(other_spec)
        return trust.comparison_html(validate.compare_evaluators(engine, run_id_of(run_value),
                                                                 names if len(names) > 1 else names[0]))

    shown = [image, item] + buttons + [cant, result]
    api = prefix.replace("-", "_")
    start.click(begin, [run_input, axis, size, who], [axis, state] + shown, api_name=f"{api}_start")
    for i, button in enumerate(buttons, start=1):
        button.click(answer(i), [state], [state] + shown, api_name=False)
    cant.click(answer(0), [state], [state] + shown, api_name=False)
    compare_btn.click(compare, [run_input, other], [comparison], api_name=f"{api}_compare")
    return {"result": result, "state": state}


def names_typed(text) -> list[str]:
    """The evaluators typed in the box, comma-separated (several: Fleiss' κ; issue 35)."""
    return [name.strip() for name in str(text or "").split(",") if name.strip()]
