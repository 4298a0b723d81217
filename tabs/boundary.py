"""What a page or an API client sends is checked where it enters, once for every event (STYLE.md
§11): every value of an event's inputs and its event data (a clicked row's cells), before Gradio
keeps it in the session or a handler sees it, by engine/common/texts.py, the check the CLI and
imports use too. A text longer than `MAX_TEXT_CHARS` (a line of a multi-line box, a cell of a
table), holding a NUL or an unpaired surrogate (a JSON escape such as "\\ud800"), a list longer
than `MAX_ITEMS` or a value nested too deeply is refused with one sentence naming the field, so
no handler, store key, page or results stream meets a string it cannot encode.
"""
from __future__ import annotations

import functools
import inspect

import gradio as gr

from engine.common.errors import InputError
from engine.common.texts import check_texts


def install(demo: gr.Blocks) -> None:
    """Check the inputs of every event of `demo` before anything else handles them."""
    original = demo.process_api
    signature = inspect.signature(original)

    @functools.wraps(original)
    async def process_api(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        if call.arguments.get("iterator") is None:   # a generator's later steps carry no new inputs
            block_fn = call.arguments["block_fn"]
            try:
                check_event(demo.fns[block_fn] if isinstance(block_fn, int) else block_fn,
                            call.arguments.get("inputs") or [], call.arguments.get("event_data"))
            except InputError as exc:
                raise gr.Error(str(exc), title=exc.title) from None
        return await original(*args, **kwargs)
    demo.process_api = process_api


def check_event(block_fn, inputs: list, event_data=None) -> None:
    """InputError naming the field when a value of `inputs` (as sent, in the order of the event's
    input components) or of its event data may not enter. A multi-line box is a list of texts,
    one per line; a stateful input (gr.State) is the server's own, never sent."""
    for component, value in zip(block_fn.inputs, inputs):
        if getattr(component, "stateful", False) or value is None:
            continue
        name = field_name(component)
        if isinstance(value, str) and (getattr(component, "lines", 1) or 1) > 1:
            check_texts(value.split("\n"), name)
        else:
            check_texts(value, name)
    data = getattr(event_data, "_data", None)
    if data is not None:   # cells of a clicked row may be any stored text: no length, but encodable
        check_texts(data, "the clicked item", limit=None)


def field_name(component) -> str:
    """How a refusal names a component: its label, else its id."""
    label = getattr(component, "label", None)
    if isinstance(label, str) and label.strip():
        return f"“{label.strip()}”"
    return f"the field {getattr(component, 'elem_id', None) or component._id}"
