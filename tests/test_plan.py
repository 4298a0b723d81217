"""The memory plan and the model manager under a budget, with a fake CUDA memory reporter: sizes known
before loading, eviction and empty_cache before a load that would not fit, CPU offload for a pipeline
over the budget, one retry after out-of-memory with a smaller batch, `python -m engine plan`."""
import json
import struct

import pytest

from engine.models import manager as models_module
from engine.backends.base import ModelSpec
from engine.core.engine import Engine
from engine.backends.device import CUDA_RESERVE_BYTES, default_budget_bytes
from engine.common.errors import OutOfMemoryError
from engine.models.manager import ModelManager
from engine.models.plan import GB, KNOWN_PARAMS, estimate_bytes, model_size, plan
from engine.models.presets import PRESETS

FLUX = ModelSpec("diffusers", "black-forest-labs/FLUX.1-schnell")
SD15 = ModelSpec("diffusers", "stable-diffusion-v1-5/stable-diffusion-v1-5")
QWEN3B = ModelSpec("hf_chat", "Qwen/Qwen2.5-3B-Instruct")
VLM3B = ModelSpec("vlm", "Qwen/Qwen2.5-VL-3B-Instruct")


def write_header(path, header: bytes) -> None:
    """A safetensors file holding only its header: shapes to read, no weights."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(header)) + header)


class FakeCuda:
    """A CUDA memory reporter: a card of `total_gb`, and a log of empty_cache calls."""

    def __init__(self, total_gb):
        self.total, self.emptied = int(total_gb * GB), []

    def total_bytes(self, device):
        return self.total

    def empty_cache(self, device):
        self.emptied.append(device)


class FakeBackend:
    def __init__(self, spec, device, context):
        self.spec, self.device, self.context = spec, device, context
        self.closed = False

    def memory_bytes(self):
        return estimate_bytes(self.spec, self.device)

    def close(self):
        self.closed = True


@pytest.fixture
def loads(monkeypatch):
    """Replaces the loader in engine.models.manager only (monkeypatch undoes it): records what was resident
    and how often the cache had been emptied at the moment each load began."""
    calls = []

    def fake_load(spec, device="cpu", **context):
        manager = calls_manager[0]
        calls.append({"model": spec.model, "resident": [m["model"] for m in manager.loaded()],
                      "emptied": len(manager.memory.emptied), "context": context})
        return FakeBackend(spec, device, context)

    calls_manager = []
    monkeypatch.setattr(models_module, "load_backend", fake_load)
    return calls, calls_manager


def test_sizes_are_known_before_loading_from_the_table_and_from_safetensors_headers(tmp_path):
    flux = model_size(FLUX, device="cuda")
    assert flux.source == "table"
    assert flux.bytes == pytest.approx(sum(KNOWN_PARAMS[FLUX.model].values()) * 1e9 * 2, rel=1e-6)
    assert model_size(FLUX, device="cpu").bytes == 2 * flux.bytes       # fp32 on the CPU
    # A local diffusers folder: the header's shapes are read, fp16 variant counted once, and only the
    # folders model_index.json names (a single-file checkpoint at the root and a stray folder are not loaded).
    header = json.dumps({"w": {"dtype": "F32", "shape": [1000, 1000], "data_offsets": [0, 4_000_000]},
                         "b": {"dtype": "F32", "shape": [1000], "data_offsets": [4_000_000, 4_004_000]}}).encode()
    for name in ("unet/diffusion_pytorch_model.safetensors", "unet/diffusion_pytorch_model.fp16.safetensors",
                 "vae/diffusion_pytorch_model.safetensors", "whole_model.safetensors",
                 "whole_model_fp16.safetensors", "controlnet/diffusion_pytorch_model.safetensors"):
        write_header(tmp_path / name, header)
    (tmp_path / "model_index.json").write_text(json.dumps(
        {"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
         "vae": ["diffusers", "AutoencoderKL"], "safety_checker": [None, None]}))
    size = model_size(ModelSpec("diffusers", str(tmp_path)), device="cuda")
    assert size.source == "safetensors header (local)"
    assert size.components == {"unet": 1_001_000 * 2, "vae": 1_001_000 * 2}


def test_default_budget_comes_from_the_device():
    assert default_budget_bytes("cuda", FakeCuda(24)) == 24 * GB - CUDA_RESERVE_BYTES
    assert default_budget_bytes("cuda", FakeCuda(2)) == 1 * GB     # never less than half a small card
    assert default_budget_bytes("cpu") > 0                         # physical RAM
    manager = ModelManager("cuda", memory=FakeCuda(16))
    assert manager.budget_bytes == 16 * GB - CUDA_RESERVE_BYTES


def test_flux_set_does_not_fit_24gb_resident_and_the_plan_says_how_it_runs():
    flux = plan(PRESETS["flux-schnell"], 24)
    assert flux.strategy == "offload" and not flux.fits            # the transformer alone is ~22 GB in bf16
    assert flux.needs_gb["resident"] > 45
    big = plan(PRESETS["flux-schnell"], 80)
    assert big.strategy == "resident" and big.fits and big.peak_gb == big.needs_gb["resident"]
    sdxl = plan(PRESETS["sdxl-turbo"], 16)
    assert sdxl.strategy == "evict" and sdxl.fits                  # not all at once, one stage at a time
    assert plan(PRESETS["sd-turbo"], 12).strategy == "resident"
    placements = {m["role"]: m["placement"] for m in flux.models}
    assert placements["generator"].startswith("CPU offload") and placements["llm"].startswith("evicted")


@pytest.mark.slow
def test_eviction_and_empty_cache_happen_before_a_load_that_would_not_fit(loads):
    calls, holder = loads
    cuda = FakeCuda(32)
    manager = ModelManager("cuda", memory=cuda)
    holder.append(manager)
    manager.get(QWEN3B)
    manager.get(VLM3B)
    assert calls[-1]["resident"] == ["hf_chat:Qwen/Qwen2.5-3B-Instruct"] and not cuda.emptied
    sd15 = manager.get(SD15)       # fits next to both: nothing evicted
    assert len(manager.loaded()) == 3 and calls[-1]["emptied"] == 0 and not sd15.context
    flux = manager.get(FLUX)       # 31 GB + 6 GB to generate > budget: everything idle goes first, then CPU offload
    assert calls[-1]["resident"] == [] and calls[-1]["emptied"] == 1
    assert flux.context == {"enable_cpu_offload": True}
    assert [m["model"] for m in manager.loaded()] == [FLUX.label]
    summary = manager.summary()
    assert summary.startswith("resident: diffusers:black-forest-labs/FLUX.1-schnell (") and "budget 30.5 GB" in summary


def test_a_model_in_use_is_not_evicted_to_make_room(loads):
    calls, holder = loads
    manager = ModelManager("cuda", memory=FakeCuda(8))
    holder.append(manager)
    with manager.use(QWEN3B):
        manager.get(VLM3B)         # does not fit next to the LLM, but the LLM is busy
        assert calls[-1]["resident"] == ["hf_chat:Qwen/Qwen2.5-3B-Instruct"]


@pytest.mark.slow
def test_out_of_memory_is_retried_once_with_half_the_batch(engine):
    gen = engine.models.get(engine.generator_spec)
    gen.batch_size = 4
    real_generate, sizes = gen.generate, []

    def generate(prompt, seeds, settings):
        sizes.append(len(seeds))
        if len(seeds) > 2:
            raise OutOfMemoryError("cuda ran out of memory")
        return real_generate(prompt, seeds, settings)

    gen.generate = generate        # this instance only
    records = engine.image_set("a photo of a doctor", list(range(8)))
    assert [r.seed for r in records] == list(range(8))
    assert sizes == [4, 2, 2, 2, 2] and gen.batch_size == 2

    def always_oom(prompt, seeds, settings):
        sizes.append(len(seeds))
        raise OutOfMemoryError("cuda ran out of memory")

    gen.generate, sizes[:] = always_oom, []
    with pytest.raises(OutOfMemoryError):
        engine.image_set("a photo of a nurse", list(range(4)))
    assert sizes == [2, 1]         # one retry, then the clear error


def test_status_shows_resident_models_and_budget(data_dir):
    engine = Engine("synthetic", data_dir=data_dir)
    assert engine.status()["resident"].startswith("resident: none")
    engine.models.get(engine.generator_spec)
    assert "synthetic_generator" in engine.status()["resident"]


def test_plan_command_prints_json_for_each_real_preset(capsys):
    from engine.cli import main

    for name in ("sd-turbo", "sd15", "sdxl-turbo", "flux-schnell"):
        assert main(["plan", "--preset", name, "--gpu-memory", "24", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert {"preset", "gpu_memory_gb", "peak_gb", "fits", "strategy", "models"} <= set(doc)
        assert doc["preset"] == name and doc["gpu_memory_gb"] == 24
        assert doc["strategy"] in ("resident", "evict", "offload") and len(doc["models"]) == 4
    assert main(["plan", "--preset", "sd15", "--gpu-memory", "12"]) == 0
    assert "preset sd15 on 12 GB" in capsys.readouterr().out
    assert main(["plan", "--preset", "nope"]) == 2
    assert "unknown preset" in capsys.readouterr().err


@pytest.mark.slow
def test_readme_front_matter_and_hardware_column_match_the_presets_and_the_plan():
    import re
    from pathlib import Path

    from engine.models.presets import hub_files

    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    front = text.split("---")[1]
    assert re.search(r'^python_version: "3\.10\.13"$', front, re.M) and "suggested_hardware: zero-a10g" in front
    listed = set(re.findall(r"^  - (\S+)$", front, re.M))
    for name in ("sd-turbo", "sd15", "sdxl-turbo", "flux-schnell", "hunyuan-dit"):
        for spec in PRESETS[name].specs().values() if name != "hunyuan-dit" else ():   # not preloaded on the Space
            assert hub_files(spec)[0] in listed, spec.label
        row = next(line for line in text.splitlines() if line.startswith(f"| `{name}` |"))
        p = plan(PRESETS[name])
        assert f"{p.needs_gb['resident']:.1f} GB all resident" in row and f"{p.needs_gb['evict']:.1f} GB with eviction" in row


def test_sizes_of_cached_hub_models_come_from_their_headers(tmp_path, monkeypatch):
    import huggingface_hub.constants

    commit = "a" * 40
    snapshot = tmp_path / "models--gaplens-test--llm" / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot.parent.parent / "refs").mkdir()
    (snapshot.parent.parent / "refs" / "main").write_text(commit)
    (snapshot / "config.json").write_text("{}")
    header = json.dumps({"embed": {"dtype": "BF16", "shape": [5000, 64], "data_offsets": [0, 640000]}}).encode()
    for shard in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        (snapshot / shard).write_bytes(struct.pack("<Q", len(header)) + header)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    size = model_size(ModelSpec("hf_chat", "gaplens-test/llm"), device="cuda")
    assert size.source == "safetensors header (cache)" and size.bytes == 2 * 5000 * 64 * 2


def test_evaluation_overlaps_generation_by_default_only_on_a_gpu_where_the_models_fit(data_dir):
    engine = Engine("sd15", data_dir=data_dir, device="cuda")
    engine.models = ModelManager("cuda", memory=FakeCuda(24))   # generator + CLIP + VQA: 5.1 GB, fits
    assert engine.overlap_evaluation
    engine.models = ModelManager("cuda", memory=FakeCuda(4))    # 2 GB budget: they would evict each other
    assert not engine.overlap_evaluation
    assert not Engine("sd15", data_dir=data_dir, device="cpu").overlap_evaluation
