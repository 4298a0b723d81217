"""The model panel shared by all tabs: preset picker, what is loaded, device, memory, unload."""
from __future__ import annotations

import gradio as gr

from engine.presets import PRESETS

from .common import status_markdown, user_errors


def build(engine) -> None:
    with gr.Accordion("Models", open=False, elem_id="model-panel"):
        status = gr.Markdown(status_markdown(engine.status()), elem_id="engine-status")
        with gr.Row():
            preset = gr.Dropdown(["auto", *PRESETS], value=engine.preset.name.split("+")[0],
                                 label="Preset", scale=3, elem_id="preset-picker")
            switch = gr.Button("Use preset", scale=1)
            refresh = gr.Button("Refresh", scale=1)
            unload = gr.Button("Unload models", variant="stop", scale=1, elem_id="unload")

    @user_errors
    def use_preset(name):
        engine.set_preset(name)
        return status_markdown(engine.status())

    def unload_all():
        gone = engine.unload()
        gr.Info(f"unloaded {len(gone)} model(s)")
        return status_markdown(engine.status())

    switch.click(use_preset, [preset], [status], api_name="use_preset")
    refresh.click(lambda: status_markdown(engine.status()), None, [status], api_name="status")
    unload.click(unload_all, None, [status], api_name="unload")
