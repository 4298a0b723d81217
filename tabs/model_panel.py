"""The model panel shared by all tabs: preset picker, what is loaded, device, memory, unload."""
from __future__ import annotations

import gradio as gr

from engine.models import sources
from engine.models.presets import PRESETS

from .common import status_markdown, user_errors


def build(engine) -> gr.Markdown:
    """Lay out the panel; returns its status, which changes whenever a model does."""
    with gr.Accordion("Models", open=False, elem_id="model-panel") as panel:
        status = gr.Markdown(status_markdown(engine.status()), elem_id="engine-status")
        with gr.Row():
            preset = gr.Dropdown(["auto", *PRESETS], value=engine.preset.name.split("+")[0],
                                 label="Preset", scale=3, elem_id="preset-picker")
            switch = gr.Button("Use preset", scale=1)
            refresh = gr.Button("Refresh", scale=1)
            unload = gr.Button("Unload models", variant="stop", scale=1, elem_id="unload")
        with gr.Row(visible=not engine.public):   # changing a model is the host's (by API, with the host token)
            role = gr.Dropdown(["generator", "embedder", "llm", "vqa"], value="generator", label="Role", scale=1,
                               elem_id="model-role")
            model = gr.Textbox(label="Model (BACKEND:MODEL; empty keeps the current one)", scale=3,
                               placeholder="openai:http://127.0.0.1:8000/v1 · hf-inference:MODEL_ID · folder:/path · "
                                           "hf-dataset:REPO · labels:/path", elem_id="model-name")
            options = gr.Textbox(label="Options (KEY=VALUE, one per line; never secrets: keys come from the "
                                       "environment)", lines=2, scale=3, elem_id="model-options")
            budget = gr.Number(value=engine.max_api_calls, precision=0, minimum=1, scale=1,
                               label="API call budget per run", elem_id="api-budget")
            use = gr.Button("Use model", scale=1, elem_id="use-model")

    @user_errors
    def use_preset(name):
        engine.set_preset(name)
        return status_markdown(engine.status())

    @user_errors
    def use_model(role, model, options, budget):
        spec = sources.use_model(engine, role, model or "", options or "")
        if budget:
            engine.max_api_calls = max(1, int(budget))
        gr.Info(f"{role}: {spec.full_label}")
        return status_markdown(engine.status())

    def unload_all():
        gone = engine.unload()
        gr.Info(f"unloaded {len(gone)} model(s)")
        return status_markdown(engine.status())

    switch.click(use_preset, [preset], [status], api_name="use_preset")
    refresh.click(lambda: status_markdown(engine.status()), None, [status], api_name="status")
    panel.expand(lambda: status_markdown(engine.status()), None, [status], api_name=False)  # what the runs since loaded
    unload.click(unload_all, None, [status], api_name="unload")
    use.click(use_model, [role, model, options, budget], [status], api_name="use_model")
    return status
