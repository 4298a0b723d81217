"""A published export opened read-only as a gallery (zip, folder, HF dataset in the export's layout);
the Space set-up: which real preset the hardware allows, ZeroGPU durations from the request."""
import shutil
import zipfile

import pytest

from engine.core.engine import Engine
from engine.common.errors import InputError, StoreError
from engine.common.events import Done
from engine.report.export import export_zip
from engine.runs.gallery import open_gallery
from engine.methods.generate import GenerateRequest, run as generate
from engine.hosting.space import real_preset_for

COMMIT = "89abcdef0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def published(tmp_path_factory):
    root = tmp_path_factory.mktemp("published")
    engine = Engine("synthetic", data_dir=str(root / "store"))
    done = [e for e in generate(GenerateRequest("a photo of a doctor", n=4), engine) if isinstance(e, Done)][0]
    export_zip(engine.store, [done.run_id], root / "audit.zip")
    return root / "audit.zip", done.run_id


def test_an_export_zip_opens_read_only_with_its_runs_and_images(published, tmp_path):
    path, run_id = published
    store = open_gallery(str(path), tmp_path / "cache")
    run = store.get_run(run_id)
    assert run is not None and run["status"] == "done"
    keys = [r["image_key"] for r in store.run_image_rows([run_id])]
    assert len(keys) == 4 and len(store.get_images(keys)) == 4
    with pytest.raises(StoreError, match="read-only gallery"):
        store.update_run(run_id, status="failed")
    with pytest.raises(StoreError, match="read-only gallery"):
        store.create_run("generate", {}, {}, "x")
    again = open_gallery(str(path), tmp_path / "cache")      # reopening imports nothing new
    assert again.data_dir == store.data_dir and again.count("runs") == 1


def test_a_dataset_in_the_export_layout_opens_from_the_hub_cache(published, tmp_path, monkeypatch):
    import huggingface_hub.constants

    path, run_id = published
    snapshot = tmp_path / "hub" / "datasets--gaplens--audits" / "snapshots" / COMMIT
    snapshot.mkdir(parents=True)
    with zipfile.ZipFile(path) as zf:
        zf.extractall(snapshot)                                # the zip's tree, as a dataset repo holds it
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text(COMMIT)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    store = open_gallery("gaplens/audits", tmp_path / "cache")
    assert store.get_run(run_id)["status"] == "done"
    folder = tmp_path / "folder"
    shutil.copytree(snapshot, folder)
    assert open_gallery(str(folder), tmp_path / "cache").get_run(run_id) is not None
    with pytest.raises(InputError, match="could not fetch the gallery dataset 'gaplens/nothing'"):
        open_gallery("gaplens/nothing", tmp_path / "cache")
    with pytest.raises(InputError, match="neither an export zip"):
        open_gallery("./no/such/file.zip", tmp_path / "cache")


def test_the_space_offers_the_largest_real_preset_its_hardware_holds():
    assert real_preset_for(None) is None                        # CPU Space: the synthetic world only
    assert real_preset_for(69.5, has_token=True) == "flux-schnell"  # ZeroGPU's H200 slice
    assert real_preset_for(69.5, has_token=False) == "sdxl-turbo"   # FLUX is gated: needs HF_TOKEN
    assert real_preset_for(16, has_token=True) == "sd15"
    assert real_preset_for(4, has_token=True) is None


def test_on_zero_gpu_the_main_process_never_touches_cuda(data_dir, monkeypatch):
    import gradio as gr
    import torch

    from tabs import single_prompt as tab

    def no_cuda(*args, **kwargs):
        raise AssertionError("CUDA touched in ZeroGPU's main process")

    for name in ("is_available", "mem_get_info", "get_device_properties", "is_bf16_supported", "empty_cache"):
        monkeypatch.setattr(torch.cuda, name, no_cuda)
    engine = Engine("synthetic", data_dir=data_dir, device="cuda")   # as app.py builds it on ZeroGPU
    with gr.Blocks():   # built before ZeroGPU is on: in this process `spaces` must not patch torch
        name_defaults = tab.build(engine)[0].fn
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    status = engine.status()
    assert "ZeroGPU" in status["memory"] and "budget 68.0 GB" in status["resident"]
    assert not engine.generator_loaded()
    # a page view loads nothing: the settings say "the model's default" without its number, and stay empty
    assert [u["placeholder"] for u in name_defaults()] == ["empty: the model's default"] * 4
    assert all("value" not in u for u in name_defaults())
    assert not engine.generator_loaded()


@pytest.mark.real_model
def test_preloaded_models_survive_preset_switches(data_dir, tiny_root):
    from engine.models.presets import resolve_preset
    from engine.hosting.space import preload
    from tests import tiny_models

    engine = Engine("synthetic", data_dir=data_dir)
    preset = resolve_preset("synthetic", embedder=tiny_models.build_tiny_clip_hf(tiny_root))[0]
    loaded = preload(engine, preset)   # the device models only: the synthetic ones load on first use
    assert loaded == [preset.embedder.label]
    engine.set_preset("colour")
    engine.set_preset("synthetic")
    assert {m["model"] for m in engine.models.loaded()} >= set(loaded)   # pinned: still loaded, nothing reloads
