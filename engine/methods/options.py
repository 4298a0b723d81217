"""What every method's request shares: the generator options it may override and how they settle
into the generator's settings (with a warning for settings a researcher may not expect)."""
from __future__ import annotations

from dataclasses import MISSING, Field, dataclass, field

from ..backends.base import DEFAULT_CANT_TELL_BELOW
from ..common.events import Warning
from ..core.engine import Engine


def field_default(spec: Field):
    """The default of a request's field (its factory's value for a list), None for a required one:
    where the CLI's option, a tab's widget and the API start."""
    if spec.default is not MISSING:
        return spec.default
    if spec.default_factory is not MISSING:
        return spec.default_factory()
    return None


@dataclass(kw_only=True)
class GenerationOptions:
    """The generator settings every request may override (None: the model family's default,
    `settings_for`), and the probability below which an answer is "can't tell" (Engine.ask). A base of every method's request; keyword-only, so a request's own fields
    keep their positions."""

    negative_prompt: str = field(default="", metadata={"help": "what the images should not show"})
    steps: int | None = field(default=None, metadata={"help": "denoising steps (default: the model family's)"})
    guidance: float | None = field(default=None, metadata={"help": "guidance scale (default: the model family's)"})
    width: int | None = field(default=None, metadata={"help": "image width in pixels (default: the model family's)"})
    height: int | None = field(default=None, metadata={"help": "image height in pixels (default: the model family's)"})
    cant_tell_below: float = field(default=DEFAULT_CANT_TELL_BELOW, metadata={
        "help": "an evaluator's answer whose probability is below this is \"can't tell\" (0: never)"})


def settings_for(request, engine: Engine):
    """The generator's family defaults with the request's explicit fields applied."""
    return engine.settings(steps=request.steps, guidance=request.guidance, width=request.width,
                           height=request.height, negative_prompt=request.negative_prompt or "")


# A model whose default is more than this many steps is not distilled for few steps.
FEW_STEP_DEFAULT = 8


def settings_notes(settings, defaults) -> list[str]:
    """Sentences on the generator settings a researcher may not expect, each naming the number:
    steps at most a quarter of the model's default on a model that is not distilled for few steps
    (default > FEW_STEP_DEFAULT: the images are unfinished), and guidance ≤ 1 where the model's
    default is above 1 (classifier-free guidance off). Defaults of 0 (an API's own, existing
    images) give none. `settings` and `defaults` are GenerationSettings."""
    notes = []
    if defaults.steps > FEW_STEP_DEFAULT and settings.steps <= defaults.steps // 4:
        notes.append(f"steps = {settings.steps}, at most a quarter of this model's default of {defaults.steps}: it "
                     "is not distilled for so few steps, so its images are likely unfinished (blurred or noisy) "
                     "and every number here is measured on them")
    if defaults.guidance > 1 and settings.guidance <= 1:
        notes.append(f"guidance = {settings.guidance:g} turns classifier-free guidance off for this model (its "
                     f"default is {defaults.guidance:g}): the images follow the prompt only loosely")
    return notes


def settle_settings(request, engine: Engine):
    """`settings_for(request, engine)` after a Warning for each of its `settings_notes` (use
    `yield from`); returns the settings."""
    settings = settings_for(request, engine)
    for note in settings_notes(settings, engine.default_settings()):
        yield Warning(note)
    return settings
