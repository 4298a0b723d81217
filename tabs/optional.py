"""Optional numbers: a setting a form may leave empty, which then sends "not set" (None: the
request field's default, exactly as when the command line leaves the option out). The field's
placeholder names what empty means ("empty: 30, the model's default"), so the screen shows what
runs, whether its panel is open or closed.

Gradio leaves a None value out of the page config and its number field then shows and sends 0;
the page's start-up update sets the empty value instead (`emptied`), which the field keeps.
"""
from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from engine.backends.device import on_zero_gpu
from engine.common.errors import GapLensError

from .common import LoadHook

# The generator settings a form may set (engine.methods.options.GenerationOptions), with
# their labels; guidance is the one that is not a whole number.
GENERATION_LABELS = {"steps": "Steps", "guidance": "Guidance", "width": "Width (pixels)", "height": "Height (pixels)"}
MODEL_DEFAULT = "the model's default"


EMPTY_ON_LOAD = "gaplens_empty_on_load"   # set on every number `optional_number` makes


def placeholder(default: str) -> str:
    """What an empty optional number shows: 'empty: <what it means>'."""
    return f"empty: {default}"


def optional_number(label: str, default: str, *, integer: bool = False, elem_id: str | None = None) -> gr.Number:
    """A number field that may stay empty; empty sends None, and its placeholder says what that
    means (`default`, e.g. "30, the model's default"). `integer`: whole numbers only."""
    number = gr.Number(None, label=label, placeholder=placeholder(default), precision=0 if integer else None,
                       elem_id=elem_id)
    setattr(number, EMPTY_ON_LOAD, True)
    return number


def emptied(blocks: gr.Blocks) -> LoadHook:
    """Every optional number of `blocks` set empty (None) when a page opens, not Gradio's 0: one
    update of the page's start-up (a number whose value is a function would send an event each)."""
    numbers = [block for block in blocks.blocks.values() if getattr(block, EMPTY_ON_LOAD, False)]
    return LoadHook(lambda: None if len(numbers) == 1 else (None,) * len(numbers), numbers)


def number_or_none(value, kind=float):
    """None for an empty field, else `kind(value)` (int or float)."""
    return None if value in (None, "") else kind(value)


def generation_defaults(engine, load: bool = True) -> dict[str, str]:
    """{setting: what an empty field uses} for the generator's settings, from the generator's
    own defaults (what `settings_for` fills in for a request that leaves them out). Without
    `load`, or on ZeroGPU's main process, a generator not loaded yet is not loaded: the
    texts then say "the model's default" without its number."""
    if not engine.generator_loaded() and (not load or on_zero_gpu()):
        return dict.fromkeys(GENERATION_LABELS, MODEL_DEFAULT)
    defaults = engine.default_settings()
    if defaults.scheduler == "api":
        return dict.fromkeys(GENERATION_LABELS, "the API's own")
    if defaults.scheduler == "source":
        return dict.fromkeys(GENERATION_LABELS, "not used (the images exist already)")
    return {name: f"{getattr(defaults, name):g}, {MODEL_DEFAULT}" for name in GENERATION_LABELS}


@dataclass
class GenerationFields:
    """A form's optional generator settings (a field per setting it offers), built by
    `generation_fields` inside the tab's settings panel."""

    fields: dict[str, gr.Number]

    def __getitem__(self, name: str) -> gr.Number:
        return self.fields[name]

    def placeholders(self, engine, load: bool = True) -> list:
        """Updates naming each field's current default (`generation_defaults`); values untouched.
        A generator that fails to load leaves the number out (its run will say why)."""
        try:
            texts = generation_defaults(engine, load)
        except GapLensError:
            texts = dict.fromkeys(GENERATION_LABELS, MODEL_DEFAULT)
        return [gr.update(placeholder=placeholder(texts[name])) for name in self.fields]

    def hook(self, engine) -> LoadHook:
        """Name the defaults when a page opens (loading the generator, as a run would, except on
        ZeroGPU) and again, without loading anything, after the Models panel changes a model."""
        return LoadHook(lambda: self.placeholders(engine), list(self.fields.values()),
                        lambda: self.placeholders(engine, load=False), loads_models=True)


def generation_fields(prefix: str, names=("steps", "guidance")) -> GenerationFields:
    """Optional number fields for the generator settings `names`, elem_id `<prefix>-<name>`;
    their placeholders name the model's defaults once `GenerationFields.placeholders` ran
    (a page-load hook that also follows the Models panel)."""
    return GenerationFields({name: optional_number(GENERATION_LABELS[name], MODEL_DEFAULT, integer=name != "guidance",
                                                   elem_id=f"{prefix}-{name}") for name in names})
