"""Presets: every real preset names all four models; auto says what it picked and why."""
import pytest

from engine.common.errors import InputError
from engine.models.presets import PRESETS, resolve_preset


def test_every_preset_names_generator_embedder_llm_and_vqa():
    assert {"synthetic", "sd-turbo", "sd15", "sdxl-turbo", "flux-schnell"} <= set(PRESETS)
    for preset in PRESETS.values():
        assert set(preset.specs()) == {"generator", "embedder", "llm", "vqa"}
    assert PRESETS["sd-turbo"].generator.model == "stabilityai/sd-turbo"
    assert PRESETS["flux-schnell"].generator.model == "black-forest-labs/FLUX.1-schnell"


def test_auto_without_gpu_picks_the_synthetic_world_and_says_why(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    preset, reason = resolve_preset("auto")
    assert preset.name == "synthetic" and "no GPU" in reason


def test_auto_with_gpu_but_nothing_cached_offline_falls_back(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", "/nonexistent-cache")
    preset, reason = resolve_preset("auto")
    assert preset.name == "synthetic" and "cache" in reason


def test_overrides_replace_one_model_and_are_reported():
    preset, reason = resolve_preset("synthetic", generator="diffusers:/models/tiny-sd")
    assert preset.generator.backend == "diffusers" and preset.generator.model == "/models/tiny-sd"
    assert preset.llm == PRESETS["synthetic"].llm and "overridden" in reason
    with pytest.raises(InputError, match="backend:model"):
        resolve_preset("synthetic", llm="no-colon-here")
    with pytest.raises(InputError, match="unknown preset"):
        resolve_preset("sd99")
