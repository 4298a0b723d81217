"""Issue 21 in-process: what a ZeroGPU Space's packing of weights leaves behind (dangling hub-cache
files) is never fatal; a worker forked earlier adopts the app's models; `doctor` on the synthetic world
and offline with cached weights."""
import os

import pytest

from engine.backends.base import ModelSpec
from engine.cli import main
from engine.core.engine import Engine
from engine.tools.doctor import diagnose
from engine.models.plan import model_size
from engine.models.presets import PRESETS, resolve_preset
from tests import tiny_models
from tests.zerogpu import hub_cache

pytestmark = pytest.mark.real_model


def test_weights_pruned_from_the_hub_cache_are_never_fatal(tmp_path, monkeypatch, data_dir):
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    tiny_models.build_tiny_clip_hf(tmp_path / "built")
    hub_cache(cache, "gaplens-test/tiny-clip", tmp_path / "built" / "tiny-clip-hf")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    hub = ModelSpec("hf_clip", "gaplens-test/tiny-clip")
    assert model_size(hub).source == "safetensors header (cache)"
    engine = Engine("synthetic", data_dir=data_dir, embedder=hub, device="cpu")
    engine.models.get(hub)                        # loaded, as at a Space's start-up
    for link in list(cache.rglob("snapshots/*/*.safetensors")):   # what `spaces` does after packing
        link.resolve().unlink()
    assert [p for p in cache.rglob("snapshots/*/*.safetensors") if not p.exists()]   # dangling links
    assert model_size(hub).source == "unknown"    # no header readable, no table entry: 0, no exception
    loaded = engine.models.size_bytes(hub, "cpu")
    assert loaded == engine.models._models[hub].bytes > 0    # a loaded model's size is measured on it
    engine.overlap_evaluation                      # reads sizes: no FileNotFoundError


def test_a_gpu_worker_forked_earlier_adopts_the_apps_preset(data_dir):
    main_process = Engine("synthetic", data_dir=data_dir)
    worker = Engine("synthetic", data_dir=data_dir)   # as forked before the host switched the preset
    main_process.set_preset("colour", llm=f"synthetic_llm:{PRESETS['synthetic'].llm.model}")
    main_process.max_api_calls = 7
    worker.models.get(worker.preset.generator)
    worker.adopt(main_process.model_config())
    assert worker.preset == main_process.preset and worker.max_api_calls == 7
    assert worker.preset_reason == main_process.preset_reason
    assert worker.models.loaded() == []             # the old preset's generator was unloaded
    worker.set_preset("synthetic")                  # and later switches keep the adopted overrides
    assert worker.preset.llm.model == PRESETS["synthetic"].llm.model and worker.preset.name == "synthetic+custom"


def test_doctor_on_the_synthetic_world_is_ready_anywhere(capsys, monkeypatch, tmp_path):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    for name in ("synthetic", "colour"):
        assert main(["doctor", "--preset", name]) == 0
        out = capsys.readouterr().out
        assert "sd-turbo" not in out and "verdict: ready" in out and "needs no GPU" in out


def test_doctor_offline_with_every_weight_cached_is_ready(tmp_path, monkeypatch):
    import huggingface_hub.constants

    cache = tmp_path / "hub"
    built = {"generator": tiny_models.build_tiny_sd(tmp_path), "embedder": tiny_models.build_tiny_clip_hf(tmp_path),
             "llm": tiny_models.build_tiny_chat_llm(tmp_path), "vqa": tiny_models.build_tiny_blip_vqa(tmp_path)}
    overrides = {}
    for role, spec in built.items():
        repo = f"gaplens-test/{os.path.basename(spec.model)}"
        hub_cache(cache, repo, tmp_path / os.path.basename(spec.model))
        overrides[role] = ModelSpec(spec.backend, repo)
    hub_cache(cache, "gaplens-test/tiny-blip-vqa-caption", tmp_path / "tiny-blip-vqa-caption")
    overrides["vqa"] = ModelSpec("blip_vqa", overrides["vqa"].model,
                                 {"caption_model": "gaplens-test/tiny-blip-vqa-caption"})
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    preset = resolve_preset("sd-turbo", **overrides)[0]
    checks = {c.name: c for c in diagnose(preset, self_test=False, device="cpu")}
    assert checks["hub"].status == "pass" and "HF_HUB_OFFLINE=1" in checks["hub"].detail
    assert checks["weights"].status == "pass"
    # ...and with one weight missing, offline is not ready, saying which
    for blob in (cache / "models--gaplens-test--tiny-sd").rglob("snapshots/*/model_index.json"):
        blob.unlink()
    checks = {c.name: c for c in diagnose(preset, self_test=False, device="cpu")}
    assert checks["hub"].status == "fail" and checks["weights"].status == "fail"
    assert "gaplens-test/tiny-sd" in checks["weights"].detail
