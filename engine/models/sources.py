"""What the engine knows about its image source beyond a seeded model (issue 15): an images API
(not seedable; calls counted, announced and budgeted per run) or a folder/dataset of existing
images (it cannot make images of new prompts). Functions of an Engine, kept out of core.py.
"""
from __future__ import annotations

from ..backends.base import ModelSpec
from ..common.errors import InputError
from ..common.events import Warning
from ..store.store import image_key

API_BACKENDS = ("openai_images", "hf_inference")
SOURCE_BACKENDS = ("folder", "hf_dataset")


def kind_by_name(spec: ModelSpec) -> str:
    """Returns "api", "source" or "model" from the backend name alone (nothing is loaded)."""
    return "api" if spec.backend in API_BACKENDS else "source" if spec.backend in SOURCE_BACKENDS else "model"


def _generator(engine):
    spec, context = engine._spec_and_context("generator")
    return engine.models.peek(spec, **context)


def source_kind(engine) -> str:
    """Returns what the generator is: "model" (seeded images), "api" (an images API: not
    seedable, calls counted and budgeted) or "source" (a folder or dataset of existing images)."""
    return getattr(_generator(engine), "source_kind", "model")


def source_prompts(engine) -> dict[str, int]:
    """Returns {prompt: number of images} of a folder or dataset generator; {} for a model or an API."""
    table = getattr(_generator(engine), "table", None)
    return {p: len(rows) for p, rows in table.by_prompt.items()} if table is not None else {}


def require_new_images(engine, method: str) -> None:
    """InputError in one sentence when the generator cannot make images of new prompts (a
    folder or dataset), naming the prompts it holds and what can be scored instead."""
    if source_kind(engine) != "source":
        return
    prompts = source_prompts(engine)
    shown = "; ".join(f"'{p}' ({n})" for p, n in list(prompts.items())[:5])
    more = f" and {len(prompts) - 5} more" if len(prompts) > 5 else ""
    raise InputError(f"{method} needs images of prompts it writes itself, but the generator "
                     f"{engine.generator_spec.label} only holds existing images, of {len(prompts)} prompt(s): "
                     f"{shown}{more}. Score those instead (Single Prompt, or Counterfactuals/Intersectional with "
                     "counterfactual prompts the source holds), or pick a model or an images API as generator")


def api_calls_needed(engine, sets) -> int:
    """Returns how many image API calls the (prompt, seeds, settings) sets would make now (the
    images neither stored nor recorded as refused); 0 unless the generator is an API."""
    if source_kind(engine) != "api":
        return 0
    gen_id = engine.model_id("generator")
    total = 0
    for prompt, seeds, settings in sets:
        keys = [image_key(gen_id, prompt, s, settings or engine.default_settings()) for s in seeds]
        have = set(engine.store.get_images(keys)) | set(engine.store.get_refusals(keys))
        total += sum(k not in have for k in set(keys))
    return total


def announce_api_calls(engine, sets):
    """Before a run's image sets (`(prompt, seeds, settings, ...)`) are made by an images API:
    yield one Warning with the total number of API calls they need and check it against the
    run's budget (InputError before any call). Nothing for a model or a folder (use `yield from`)."""
    sets = [tuple(s[:3]) for s in sets]
    calls = api_calls_needed(engine, sets)
    if not calls:
        return
    used = engine.run.api_calls if engine.run else 0   # the run's own count (Engine.for_run)
    if used + calls > engine.max_api_calls:
        raise InputError(f"this run needs {calls} image API calls but the budget allows "
                         f"{max(0, engine.max_api_calls - used)} more (at most {engine.max_api_calls} "
                         "per run); lower N or raise the budget (--max-api-calls)")
    if engine.run:
        engine.run.api_calls_announced = used + calls
    yield Warning(f"{calls} image API call(s) to {engine.model_id('generator')} for {len(sets)} prompt(s); API "
                  "images are not seedable, so regenerating them would not reproduce them: they are kept in the store")


def use_model(engine, role: str, model: str = "", options: dict | str | None = None) -> ModelSpec:
    """Replace one role's model (BACKEND:MODEL, read as the role means it; empty keeps the
    current one) and its options (a dict, or KEY=VALUE lines; replacing the old ones; secrets
    refused). Host only in public mode, refused before anything is read. The old model is
    unloaded, the store kept. Returns the new spec."""
    from dataclasses import replace

    from ..common import access
    from .presets import check_options, parse_model_override, parse_options

    access.require_host(getattr(engine, "public", False), "changing a model")  # it changes it for every visitor
    if isinstance(options, str):
        options = parse_options(options, role)
    if role not in engine.preset.specs():
        raise InputError(f"unknown role '{role}'; roles: {', '.join(engine.preset.specs())}")
    old = engine.preset.specs()[role]
    base = parse_model_override(model, role) if (model or "").strip() else old
    spec = ModelSpec(base.backend, base.model, check_options(dict(options or {}), role))
    if spec != old:
        engine.models.unload_unpinned(old)   # a preloaded model stays (ModelManager.unload_unpinned)
        name = engine.preset.name if engine.preset.name.endswith("+custom") else f"{engine.preset.name}+custom"
        engine.preset = replace(engine.preset, name=name, **{role: spec})
        engine.preset_reason += f"; {role} set to {spec.full_label}"
    return spec
