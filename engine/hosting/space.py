"""Running on a Hugging Face Space: which presets to offer, start-up, and what ZeroGPU is asked for.

On a Space (SPACE_ID set) the app starts on $GAPLENS_PRESET (default the synthetic world) and preloads
one real preset: $GAPLENS_PRESET's own models when it names one, else the largest preset whose memory
plan fits the hardware (ZeroGPU: 69.5 GiB; a dedicated GPU: its memory), skipping gated generators
unless HF_TOKEN is set. A preload that fails (weights that cannot be fetched) is never fatal: the app
serves the synthetic world and its status line says why (`start_up`).

On ZeroGPU the preloaded models are loaded on the CPU: their `.to("cuda")` in the main process is
recorded by the `spaces` package, which moves the weights to the GPU it attaches for each @spaces.GPU
call; the main process itself never initialises CUDA. Only work that uses a device model goes through
@spaces.GPU (`needs_gpu`), asking for an honest duration (`gpu_seconds`).
"""
from __future__ import annotations

import os

from ..backends import uses_device
from ..backends.base import ModelSpec
from ..backends.device import H200_PROFILE, on_zero_gpu, zero_gpu_memory_gb, zero_gpu_profile
from ..backends.gpu_costs import CAPTION_SECONDS, EMBED_SECONDS, QUESTION_SECONDS, image_seconds
from ..common import access
from ..common.errors import GapLensError
from ..models.plan import plan
from ..models.presets import PRESETS, REAL_PRESET_ORDER, Preset

GATED = {"black-forest-labs/FLUX.1-schnell"}
NO_GPU = "no GPU on this Space: the synthetic world only"   # the model panel's line; visitors' refusals repeat it


def space_gpu_memory_gb() -> float | None:
    """Returns the GPU memory of this Space's hardware in GiB, None without a GPU. Only a dedicated
    GPU is asked (CUDA may be initialised there); ZeroGPU is known."""
    if on_zero_gpu():
        return zero_gpu_memory_gb()
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_properties(0).total_memory / 2**30
    except Exception:  # noqa: BLE001 - no torch or no driver: no GPU
        return None
    return None


def real_preset_for(gpu_memory_gb: float | None, *, has_token: bool | None = None) -> str | None:
    """Returns the largest real preset (REAL_PRESET_ORDER, last first) that fits `gpu_memory_gb` with
    every model resident, skipping gated generators without HF_TOKEN; None without a GPU or when none fits."""
    if not gpu_memory_gb:
        return None
    has_token = bool(os.environ.get("HF_TOKEN")) if has_token is None else has_token
    for name in reversed(REAL_PRESET_ORDER):
        preset = PRESETS[name]
        if preset.generator.model in GATED and not has_token:
            continue
        if plan(preset, gpu_memory_gb).strategy == "resident":
            return name
    return None


def preload(engine, preset: Preset) -> list[str]:
    """Loads `preset`'s device models into the engine's manager and pins them, so switching to that
    preset later loads nothing. Returns the labels loaded; ModelLoadError when one cannot be loaded."""
    loaded = []
    for spec in preset.specs().values():
        if uses_device(spec):   # a CLIP VQA answers through the preset's embedder, as Engine loads it
            context = {"embedder": engine.models.get(preset.embedder)} if spec.backend == "clip_vqa" else {}
            engine.models.get(spec, **context)
            engine.models.pin(spec)
            loaded.append(spec.label)
    return loaded


def start_up(engine) -> str:
    """On a Space: preloads the engine's preset when it uses device models, else the largest real preset
    the hardware holds; without a GPU, sets `engine.hardware_note`, so visitors are offered only
    models that run here (engine.hosting.backend_choices.offered). When a preload fails, the engine serves the synthetic world and its status line
    (`preset_reason`) says why; nothing raises. Returns the line to print."""
    preset = engine.preset if needs_gpu(engine.preset.specs().values()) else None
    if preset is None:
        name = real_preset_for(space_gpu_memory_gb())
        if name is None:   # visitors are offered only what runs here (backend_choices.offered)
            engine.hardware_note = NO_GPU
            engine.preset_reason = f"{engine.preset_reason}; {NO_GPU}"
            return NO_GPU
        preset = PRESETS[name]
    try:
        loaded = preload(engine, preset)
    except GapLensError as exc:
        problem = f"the models of '{preset.name}' could not be loaded ({exc})"
        if preset is engine.preset:
            with access.acting_as(access.HOST):   # the operator's start-up, not a visitor's switch
                engine.set_preset("synthetic")
            engine.preset_reason = f"{problem}, so this Space serves the synthetic world"
        else:
            engine.preset_reason += f"; {problem}, so only the synthetic world is offered"
        return engine.preset_reason
    # (on ZeroGPU: on the CPU, moved to the GPU inside each @spaces.GPU call)
    return f"preset '{preset.name}' preloaded: {', '.join(loaded)}"


def needs_gpu(specs) -> bool:
    """True when any of `specs` (ModelSpecs) is a device model (engine.backends.uses_device): work with
    the synthetic worlds, images APIs, folders and label tables never asks ZeroGPU for a GPU."""
    return any(uses_device(s) for s in specs if isinstance(s, ModelSpec))


# -- how long to ask ZeroGPU for --------------------------------------------------------------------
# ZeroGPU's slice is an H200 MIG 3g.71gb: 60 of the H200's 132 SMs and 69.5 GiB (the `spaces`
# package's device defaults). Denoising is compute-bound, so its seconds on a full H200
# (engine/backends/gpu_costs.py) are scaled by the slice's share of SMs. VQA, captions, embeddings and
# LLM replies are short generations dominated by per-call overhead, so their seconds are taken as they are.
ZERO_GPU_SMS, H200_SMS = H200_PROFILE["sm_count"], 132   # the slice's SMs; other profiles: zero_gpu_profile
LLM_REPLY_SECONDS = 6.0        # one LLM reply (a few hundred tokens at transformers' per-token overhead)
START_SECONDS = 10             # CUDA start-up and moving the preloaded weights onto the slice
MARGIN = 1.5                   # ZeroGPU may abort a call that overruns; a visitor is charged what it used
GPU_MIN_SECONDS, GPU_MAX_SECONDS = 20, 300   # 300 s: the most ZeroGPU grants one call


def gpu_seconds(preset: Preset, *, images: int, steps=None, questions: int = 0, llm_calls: int = 0,
                profile: dict | None = None) -> int:
    """Returns the seconds to ask ZeroGPU for a run of `preset` that makes `images` images (a blank
    `steps` means the generator's default, engine.backends.diffusers_generator.default_steps) and asks
    `questions` VQA questions, a caption and an embedding per image, plus `llm_calls` LLM replies:
    START_SECONDS + the work (the tables above, device models only; denoising scaled to the SMs of the
    hardware `profile`, default the one `spaces` reports: device.zero_gpu_profile) × MARGIN, within
    [GPU_MIN_SECONDS, GPU_MAX_SECONDS], divided by the profile's duration_factor, which `spaces`
    multiplies the duration by (except for the "xlarge" size), so that the time granted is the estimate."""
    profile = profile or zero_gpu_profile()
    images, questions, llm_calls = (max(0, _whole(v)) for v in (images, questions, llm_calls))
    work = 0.0
    generator = preset.generator
    if uses_device(generator) and generator.backend == "diffusers" and images:
        from ..backends.diffusers_generator import default_steps, family_of

        steps = _whole(steps) if steps not in (None, "") else default_steps(generator)
        work += images * image_seconds(family_of(generator), steps) * H200_SMS / int(profile["sm_count"])
    vqa = preset.vqa
    if uses_device(vqa):
        can_caption = vqa.backend == "vlm" or vqa.options.get("caption_model")
        work += images * (questions * QUESTION_SECONDS.get(vqa.backend, QUESTION_SECONDS["vlm"])
                          + (CAPTION_SECONDS.get(vqa.backend, 1.0) if can_caption else 0))
    if uses_device(preset.embedder):
        work += images * EMBED_SECONDS
    if uses_device(preset.llm):
        work += llm_calls * LLM_REPLY_SECONDS
    seconds = min(GPU_MAX_SECONDS, max(GPU_MIN_SECONDS, START_SECONDS + work * MARGIN))
    return int(seconds / float(profile.get("duration_factor") or 1.0) if not xlarge(preset, profile) else seconds)


def xlarge(preset: Preset, profile: dict | None = None) -> bool:
    """True when `preset`'s weights are above the profile's xlarge threshold (RTX PRO 6000 Blackwell: 45 GB),
    where `spaces` attaches the "xlarge" size: its seconds count twice against a visitor's quota."""
    profile = profile or zero_gpu_profile()
    threshold = profile.get("xlarge_threshold")
    if not threshold:
        return False
    weights = sum(m["gb"] for m in plan(preset, profile["memory"] / 2**30).models)
    return weights * 2**30 > threshold


def _whole(value) -> int:
    try:
        return int(float(value))
    except (TypeError, ValueError):
        return 0
