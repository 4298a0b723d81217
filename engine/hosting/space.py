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

import math
import os
from dataclasses import dataclass

from ..backends import uses_device
from ..backends.base import ModelSpec
from ..backends.device import H200_PROFILE, on_zero_gpu, zero_gpu_memory_gb, zero_gpu_profile
from ..backends.gpu_costs import CAPTION_SECONDS, EMBED_SECONDS, image_seconds, question_seconds
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
# ZeroGPU's slice is an H200 MIG 3g.71gb: 60 of the H200's 132 SMs and 69.5 GiB (the `spaces` package's
# device defaults). Denoising is compute-bound, so its seconds on a full H200 (engine/backends/gpu_costs.py)
# are scaled by the slice's share of SMs. VQA, captions, embeddings and LLM replies are short generations
# dominated by per-call overhead, so their seconds are taken as they are on the slice.
SLICE_SMS, H200_SMS = H200_PROFILE["sm_count"], 132
# Throughput of each ZeroGPU profile relative to the H200 slice (work done per second; the slice: 1), for
# every kind of call. SMs are not comparable across architectures, so they are not counted. The RTX PRO 6000
# Blackwell Server Edition: 1/1.5, as documented by `spaces` 0.51.3 itself (spaces/zero/configs.json:
# "duration_factor": 1.5, by which spaces/zero/client.py `get_duration_seconds` multiplies every duration
# written for the slice); its memory bandwidth agrees (1.79 TB/s of GDDR7 against the slice's 4 of 8 memory
# slices of the H200's 4.8 TB/s, 2.4 TB/s: 0.75, for the memory-bound VQA, caption and LLM decoding), and
# 1/1.5 is the more cautious of the two. A profile not listed here counts as 1/duration_factor, never as
# faster than the slice (`throughput`).
PROFILE_THROUGHPUT = {"NVIDIA H200": 1.0, "NVIDIA RTX PRO 6000 Blackwell Server Edition": 1 / 1.5}
LLM_REPLY_SECONDS = 6.0        # one LLM reply (a few hundred tokens at transformers' per-token overhead)
START_SECONDS = 10             # CUDA start-up and moving the preloaded weights onto the GPU
MARGIN = 1.5                   # ZeroGPU may abort a call that overruns; a visitor is charged what it used
GPU_MIN_SECONDS, GPU_MAX_SECONDS = 20, 300   # 300 s: the most ZeroGPU grants one call


@dataclass(frozen=True)
class GpuWork:
    """What one request makes a GPU do, in calls' units: `images` generated at `steps` (None: the generator's
    default) by `generator` (None: the preset's), VQA `answers` (one question about one image) and `captions`
    by `vqa` (None: the preset's), image `embeddings` and `llm_calls` (replies). A request that uses several
    generators or evaluators (Compare models, Compare evaluators) is a list of GpuWork, one per model; parts
    of the same models add up with `+`."""

    images: int = 0
    steps: int | None = None
    answers: int = 0
    captions: int = 0
    embeddings: int = 0
    llm_calls: int = 0
    generator: ModelSpec | None = None
    vqa: ModelSpec | None = None

    @classmethod
    def of_images(cls, images: int, steps=None, *, questions: int = 0, llm_calls: int = 0,
                  generator: ModelSpec | None = None) -> "GpuWork":
        """`images` generated, each measured as a run measures it: `questions` answers, a caption and an
        embedding; plus `llm_calls` replies. A blank or unreadable `steps` is the generator's default."""
        images = max(0, _whole(images))
        steps = _whole(steps) if steps not in (None, "") and _whole(steps) > 0 else None
        return cls(images, steps, images * max(0, _whole(questions)), images, images, max(0, _whole(llm_calls)),
                   generator)

    def __add__(self, other: "GpuWork") -> "GpuWork":
        return GpuWork(self.images + other.images, self.steps if self.images else other.steps,
                       self.answers + other.answers, self.captions + other.captions,
                       self.embeddings + other.embeddings, self.llm_calls + other.llm_calls,
                       self.generator or other.generator, self.vqa or other.vqa)


def throughput(profile: dict) -> float:
    """The profile's throughput relative to the H200 slice (PROFILE_THROUGHPUT by its "model"); a profile
    not listed: 1/duration_factor, at most 1 (never counted faster than the slice)."""
    known = PROFILE_THROUGHPUT.get(str(profile.get("model", "")))
    if known is not None:
        return known
    return min(1.0, 1.0 / max(1e-9, float(profile.get("duration_factor") or 1.0)))


def work_seconds(preset: Preset, work, profile: dict | None = None) -> float:
    """The seconds `work` (a GpuWork or a list of them) takes on the hardware `profile` (default the one
    `spaces` reports: device.zero_gpu_profile) with `preset`'s device models (engine.backends.uses_device:
    the synthetic world, images APIs and label tables take none): each image at its generator's seconds
    for its steps (gpu_costs.image_seconds on a full H200, × H200_SMS / SLICE_SMS on the slice), each answer,
    caption, embedding and LLM reply at the tables' seconds; all divided by the profile's `throughput`."""
    profile = profile or zero_gpu_profile()
    total = 0.0
    for part in ([work] if isinstance(work, GpuWork) else work):
        generator, vqa = part.generator or preset.generator, part.vqa or preset.vqa
        if part.images and uses_device(generator) and generator.backend == "diffusers":
            from ..backends.diffusers_generator import default_steps, family_of

            steps = part.steps or default_steps(generator)
            total += part.images * image_seconds(family_of(generator), steps) * H200_SMS / SLICE_SMS
        if uses_device(vqa):
            can_caption = vqa.backend == "vlm" or bool(vqa.options.get("caption_model"))
            total += part.answers * question_seconds(vqa.backend)
            total += part.captions * (CAPTION_SECONDS.get(vqa.backend, 1.0) if can_caption else 0.0)
        if uses_device(preset.embedder):
            total += part.embeddings * EMBED_SECONDS
        if uses_device(preset.llm):
            total += part.llm_calls * LLM_REPLY_SECONDS
    return total / throughput(profile)


def granted_seconds(preset: Preset, work, profile: dict | None = None) -> int:
    """The seconds a GPU call doing `work` needs on the hardware `profile`: START_SECONDS + work_seconds ×
    MARGIN, within [GPU_MIN_SECONDS, GPU_MAX_SECONDS] (what ZeroGPU should grant; `gpu_seconds` asks for it)."""
    return math.ceil(min(GPU_MAX_SECONDS, max(GPU_MIN_SECONDS, START_SECONDS + work_seconds(preset, work, profile)
                                              * MARGIN)))


def gpu_seconds(preset: Preset, work=None, *, images: int = 0, steps=None, questions: int = 0,
                llm_calls: int = 0, profile: dict | None = None) -> int:
    """Returns the seconds to ask ZeroGPU for a call of `preset` doing `work` (a GpuWork or a list of them;
    without it, `images` made at `steps` and measured with `questions` answers each, plus `llm_calls`:
    GpuWork.of_images), so that what `spaces` grants is `granted_seconds`: `spaces` multiplies the duration
    asked by the profile's duration_factor, except for the "xlarge" size (spaces/zero/client.py
    `get_duration_seconds`), so the duration asked is the time needed divided by that factor, rounded up
    (and never above what GPU_MAX_SECONDS allows once multiplied)."""
    profile = profile or zero_gpu_profile()
    if work is None:
        work = GpuWork.of_images(images, steps, questions=questions, llm_calls=llm_calls)
    needed = granted_seconds(preset, work, profile)
    factor = 1.0 if xlarge(preset, profile) else float(profile.get("duration_factor") or 1.0)
    return max(1, min(math.floor(GPU_MAX_SECONDS / factor), math.ceil(needed / factor - 1e-9)))


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
