"""The editable table of bias axes and counterfactual prompts that the Counterfactuals and
Intersectional Matrix tabs share: proposed by the LLM (TIBET's meta-prompt), loaded from the
Table 6.1 occupation preset, or typed by hand; plus the prompt and its fill values."""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass

import gradio as gr

from engine.common.errors import GapLensError
from engine.hosting.space import GpuWork
from engine.methods import cfsets

from .common import gpu, request_check, request_work

HEADERS = ["axis", "counterfactual"]


@dataclass
class AxesEditor:
    prompt: gr.Textbox
    fill: gr.Textbox
    table: gr.Dataframe
    notes: gr.Markdown | None = None   # what the LLM's proposal left out (beside the table, not a toast)


def parse_fill(text: str) -> list[str]:
    return [v.strip() for v in re.split(r"[,\n;]", text or "") if v.strip()]


def build(engine, prefix: str, examples: list[str], example_axes: bool = False) -> AxesEditor:
    """The prompt, fill values, buttons and the axes table, wired; returns the components. With
    `example_axes` an example fills the table too (cfsets.example_axes: gender and age)."""
    prompt = gr.Textbox(label="Prompt", placeholder="a photo of a doctor", elem_id=f"{prefix}-prompt",
                        info="may hold one {placeholder}, e.g. 'A photo of a {occupation}', filled from the values below")
    table = gr.Dataframe(headers=HEADERS, datatype=["str", "str"], type="array", interactive=True,
                         column_count=2, label="Bias axes and counterfactual prompts (edit freely; an empty "
                         "axis cell continues the axis above)", elem_id=f"{prefix}-axes", max_height=360, wrap=True,
                         render=False)   # drawn below the buttons; an example may fill it
    if example_axes:
        gr.Examples(examples, [prompt], outputs=[table], fn=lambda p: cfsets.rows_from_axes(cfsets.example_axes(p)),
                    run_on_click=True, cache_examples=False, api_name=False)
    else:
        gr.Examples(examples, [prompt])
    fill = gr.Textbox(label="Fill values (aggregate mode)", elem_id=f"{prefix}-fill", lines=1,
                      placeholder="doctor, nurse, firefighter",
                      info="comma-separated values for the prompt's {placeholder}; several values = aggregate mode")
    with gr.Row():
        propose = gr.Button("Propose axes (LLM)", size="sm", elem_id=f"{prefix}-propose")
        preset = gr.Button("Table 6.1 occupation axes", size="sm", elem_id=f"{prefix}-preset")
        all_occupations = gr.Button("Fill all 26 occupations", size="sm", elem_id=f"{prefix}-all")
    table.render()
    notes = gr.Markdown("", elem_id=f"{prefix}-axes-notes")

    # TIBET's meta-prompt: three LLM turns, the last re-asked while its output is unusable (PROPOSE_CALLS at most)
    @gpu(engine, duration=lambda **form: GpuWork(llm_calls=cfsets.PROPOSE_CALLS),
         specs=lambda **form: [engine.preset.llm])
    def propose_on_gpu(prompt_text, fill_text):
        try:
            axes, problems = cfsets.propose_for(engine, engine.check_prompt(prompt_text), parse_fill(fill_text))
        except GapLensError as exc:   # said beside the table it failed to fill, which keeps its rows
            return gr.skip(), f"**No axes proposed**: {exc}"
        dropped = "\n".join(f"- the LLM's counterfactual {problem}" for problem in problems)
        return cfsets.rows_from_axes(axes), (f"**Left out of the proposal ({len(problems)})**\n\n{dropped}"
                                             if problems else "")

    @functools.wraps(propose_on_gpu)
    def propose_axes(prompt_text, fill_text):
        try:   # a prompt the proposal refuses, or a visitor's spent hour, is said without asking for a GPU
            engine.check_prompt(prompt_text)
            engine.afford("propose axes", llm_calls=cfsets.PROPOSE_CALLS)
        except GapLensError as exc:
            return gr.skip(), f"**No axes proposed**: {exc}"
        return propose_on_gpu(prompt_text, fill_text)

    def load_preset():
        data = cfsets.load_preset("occupations")
        return data["prompt"], "doctor", cfsets.rows_from_axes(data["axes"])

    propose.click(propose_axes, [prompt, fill], [table, notes], api_name=f"{prefix}_propose_axes")
    preset.click(load_preset, None, [prompt, fill, table], api_name=False)
    all_occupations.click(lambda: ", ".join(cfsets.load_preset("occupations")["occupations"]), None, [fill],
                          api_name=False)
    return AxesEditor(prompt, fill, table, notes)


def sets_work(engine, method: str, request) -> GpuWork:
    """The GPU work of a request of counterfactual image sets (`method`'s estimate: every set of every fill
    value, the LLM's questions, request_work), each image asked one question per axis; axes the LLM will
    propose count as three."""
    return request_work(engine, method, request, questions=len(request.axes or {}) or 3)


def sets_gpu(engine, method: str, make_request):
    """`gpu` for a handler whose form makes a request of counterfactual image sets (`make_request(**form)`):
    its duration the request's `sets_work`, its check the method's own (request_check)."""
    return gpu(engine, duration=lambda **form: sets_work(engine, method, make_request(**form)),
               check=request_check(engine, method, make_request))


def axes_of(rows) -> dict | None:
    """The table's axes for a request; None (ask the LLM) when it is empty."""
    return cfsets.axes_from_rows(rows) or None
