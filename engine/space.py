"""Running on a Hugging Face Space: which presets to offer, and ZeroGPU start-up.

On a Space (SPACE_ID set) the app starts with the synthetic world and offers one real preset: the
largest one whose memory plan fits the hardware (ZeroGPU: 70 GB; a dedicated GPU: its memory), skipping
gated generators unless HF_TOKEN is set. On ZeroGPU the real preset's models are loaded at start-up:
from_pretrained runs on the CPU, and the `.to("cuda")` of the main process is recorded by the `spaces`
package, which moves the weights to the GPU it attaches for each @spaces.GPU call; the main
process itself never initialises CUDA.
"""
from __future__ import annotations

import os

from .device import ZERO_GPU_MEMORY_GB, on_zero_gpu
from .plan import plan
from .presets import PRESETS, REAL_PRESET_ORDER

GATED = {"black-forest-labs/FLUX.1-schnell"}


def on_space() -> bool:
    return bool(os.environ.get("SPACE_ID"))


def space_gpu_memory_gb() -> float | None:
    """Returns the GPU memory of this Space's hardware in GB, None without a GPU. Only a dedicated
    GPU is asked (CUDA may be initialised there); ZeroGPU is known."""
    if on_zero_gpu():
        return ZERO_GPU_MEMORY_GB
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


def preload(engine, preset_name: str) -> list[str]:
    """Loads `preset_name`'s models into the engine's manager and pins them, so switching to that preset
    later loads nothing. Returns the labels loaded."""
    loaded = []
    for spec in PRESETS[preset_name].specs().values():
        engine.models.get(spec)
        engine.models.pin(spec)
        loaded.append(spec.label)
    return loaded
