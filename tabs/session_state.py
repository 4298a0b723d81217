"""Keeps each Gradio session's state the size of the page, however many requests the session sends.

Gradio 6.31 stores a handler's property update (`gr.HTML(visible=...)`, `gr.update(choices=...)`) as
a new, unrendered component with a new `_id` under the original component's key. The next time that
key is an input or gets a value (`Blocks.preprocess_data`/`postprocess_data`: `block =
state[block._id]` ... `if block._id not in state: state[block._id] = block`), the replacement is
stored a second time under its own new id, with a config copy holding the value. No function and no
layout refers to that id, and nothing removes it: every Single Prompt run added its outputs' configs
(~0.1–0.3 MB) to its session for good, so a public GapLens grew with every request
(bench/public_soak.py) and a local one with every run.
"""
from __future__ import annotations

import functools

import gradio as gr


def install(demo: gr.Blocks) -> None:
    """After every event's outputs are stored, drop the copies above from its session's state."""
    original = demo.postprocess_data

    @functools.wraps(original)
    async def postprocess_data(block_fn, predictions, state):
        try:
            return await original(block_fn, predictions, state)
        finally:
            if state is not None:
                drop_stray_copies(state, demo.default_config.blocks)
    demo.postprocess_data = postprocess_data


def drop_stray_copies(state, layout: dict) -> int:
    """Removes from a SessionState the components stored under their own id that are neither in the
    page's `layout` (block id -> block) nor rendered (a `gr.render` block is); returns how many."""
    blocks = state.blocks_config.blocks
    stray = [key for key, block in blocks.items() if key not in layout and not block.is_rendered]
    for key in stray:
        del blocks[key]
        state.config_values.pop(key, None)
    return len(stray)
