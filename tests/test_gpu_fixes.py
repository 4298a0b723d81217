"""Fixes found walking the real code paths under the real hub ids (issue 14): all-flagged sets, resolved
commits in model ids, auto's open_clip cache check, gated repositories, native bf16 only, fp16 weight
variants, overrides that survive preset switches, preset defaults."""
import shutil
from pathlib import Path

import pytest

from engine.backends import device as devices
from engine.backends import load_backend
from engine.backends.base import ModelSpec
from engine.backends.diffusers_generator import pick_variant
from engine.core.engine import Engine
from engine.common.errors import ModelLoadError
from engine.common.events import Done, Warning
from engine.methods.single_prompt import SinglePromptRequest, run as single_prompt
from engine.models.presets import PRESETS, is_cached, resolve_preset
from tests import tiny_models

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(cache: Path, repo: str, folder: Path | None = None, files=()) -> Path:
    """Lays out `folder` (or empty `files`) as the hub cache's snapshot of `repo` at COMMIT, with
    refs/main pointing at it: what huggingface_hub leaves behind after a download."""
    root = cache / ("models--" + repo.replace("/", "--"))
    snapshot = root / "snapshots" / COMMIT
    if folder is not None:
        shutil.copytree(folder, snapshot)
    for name in files:
        (snapshot / name).parent.mkdir(parents=True, exist_ok=True)
        (snapshot / name).write_bytes(b"")
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(COMMIT)
    return snapshot


@pytest.fixture(scope="module")
def tiny(tiny_root):
    root = tiny_root
    return root, {"nsfw": tiny_models.build_tiny_sd(root, name="tiny-sd-nsfw", flag_everything=True),
                  "chat": tiny_models.build_tiny_chat_llm(root), "clip": tiny_models.build_tiny_clip_hf(root)}


@pytest.mark.real_model
def test_a_set_where_every_image_is_flagged_gives_one_clear_result(tiny, data_dir):
    engine = Engine("synthetic", data_dir=data_dir, generator=tiny[1]["nsfw"])
    events = list(single_prompt(SinglePromptRequest("a photo of a doctor", n=3, steps=1), engine))
    done = events[-1]
    assert isinstance(done, Done) and done.results["all_flagged"]
    assert "every image was flagged by the safety checker" in done.results["message"]
    assert any(isinstance(e, Warning) and "every image was flagged" in e.message for e in events)
    assert engine.store.list_runs()[0]["status"] == "done" and engine.store.count("images") == 3


@pytest.mark.real_model
def test_hub_models_record_the_commit_of_the_files_loaded_not_main(tiny, tmp_path):
    root, specs = tiny
    cache = tmp_path / "hub"
    hub_cache(cache, "gaplens-test/tiny-chat", Path(specs["chat"].model))
    hub_cache(cache, "gaplens-test/tiny-clip", Path(specs["clip"].model))
    llm = load_backend(ModelSpec("hf_chat", "gaplens-test/tiny-chat", {"cache_dir": str(cache)}))
    clip = load_backend(ModelSpec("hf_clip", "gaplens-test/tiny-clip", {"cache_dir": str(cache)}))
    assert llm.id == f"hf_chat:gaplens-test/tiny-chat@{COMMIT}"
    assert clip.id == f"hf_clip:gaplens-test/tiny-clip@{COMMIT}"
    assert devices.hub_commit("gaplens-test/not-cached", cache_dir=str(cache)) is None


def test_auto_finds_open_clip_weights_in_the_hub_cache(tmp_path, monkeypatch):
    import huggingface_hub.constants
    import torch

    spec = PRESETS["sd-turbo"].embedder
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path))
    assert not is_cached(spec)
    hub_cache(tmp_path, "laion/CLIP-ViT-B-32-laion2B-s34B-b79K", files=["open_clip_model.safetensors"])
    assert is_cached(spec)
    # With every model of sd-turbo cached and a GPU, auto picks it offline.
    for role, s in PRESETS["sd-turbo"].specs().items():
        if role != "embedder":
            hub_cache(tmp_path, s.model, files=["model_index.json" if role == "generator" else "config.json"])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    preset, reason = resolve_preset("auto")
    assert preset.name == "sd-turbo" and "cache" in reason


def test_a_gated_repository_says_to_accept_the_licence_and_set_hf_token(monkeypatch):
    from huggingface_hub.utils import _http, hf_raise_for_status

    from engine.backends import diffusers_generator

    httpx = getattr(_http, "httpx2", None) or _http.httpx   # the HTTP client huggingface_hub speaks through (1.x: httpx)

    url = "https://huggingface.co/black-forest-labs/FLUX.1-schnell/resolve/main/model_index.json"
    response = httpx.Response(403, headers={"X-Error-Code": "GatedRepo", "X-Error-Message": "Access restricted"},
                              request=httpx.Request("GET", url))

    def resolve(model, options):
        try:
            hf_raise_for_status(response)   # how huggingface_hub reads the hub's reply
        except Exception as exc:
            raise OSError(f"You are trying to access a gated repo: {model}") from exc  # as diffusers wraps it

    monkeypatch.setattr(diffusers_generator, "_resolve_folder", resolve)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    with pytest.raises(ModelLoadError) as err:
        load_backend(PRESETS["flux-schnell"].generator, "cpu")
    message = str(err.value)
    assert "gated" in message and "https://huggingface.co/black-forest-labs/FLUX.1-schnell" in message
    assert "accept its licence" in message and "HF_TOKEN" in message and "Traceback" not in message


def test_bf16_only_where_the_gpu_has_it_natively(monkeypatch):
    import torch

    # An older GPU: bf16 only by emulation, which torch counts as "supported" by default.
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    assert devices.default_dtype("cuda", prefer_bf16=True) == torch.float16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert devices.default_dtype("cuda", prefer_bf16=True) == torch.bfloat16

    def no_cuda_calls(including_emulation=True):
        raise AssertionError("CUDA queried in the main process")

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", no_cuda_calls)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    assert devices.default_dtype("cuda", prefer_bf16=True) == torch.bfloat16


@pytest.mark.real_model
def test_fp16_weight_variant_is_requested_where_the_repo_has_it(tmp_path):
    both = ["model_index.json", "unet/diffusion_pytorch_model.safetensors",
            "unet/diffusion_pytorch_model.fp16.safetensors"]
    assert pick_variant(both, "float16") == "fp16" and pick_variant(both, "bfloat16") == "fp16"
    assert pick_variant(both, "float32") is None
    assert pick_variant(both[:2], "float16") is None
    # A pipeline saved only as the fp16 variant loads (and generates) through the real from_pretrained.
    from diffusers import StableDiffusionPipeline

    plain = Path(tiny_models.build_tiny_sd(tmp_path).model)
    StableDiffusionPipeline.from_pretrained(plain).save_pretrained(tmp_path / "fp16-only", variant="fp16")
    gen = load_backend(ModelSpec("diffusers", str(tmp_path / "fp16-only")), "cpu")
    assert gen.variant == "fp16"
    assert len(gen.generate("a cat", [1], gen.defaults().replace(steps=1))) == 1


def test_command_line_overrides_survive_a_preset_switch(data_dir):
    engine = Engine("synthetic", data_dir=data_dir, llm="hf_chat:/models/my-llm")
    engine.set_preset("colour")
    assert engine.preset.llm.model == "/models/my-llm" and engine.preset.name == "colour+custom"
    assert engine.preset.generator == PRESETS["colour"].generator
    engine.set_preset("synthetic", vqa="clip_vqa:/models/clip")
    assert engine.preset.llm.model == "/models/my-llm" and engine.preset.vqa.model == "/models/clip"


def test_presets_have_a_json_capable_llm_and_a_captioner():
    assert PRESETS["sd-turbo"].llm.model == "Qwen/Qwen2.5-1.5B-Instruct"
    for preset in PRESETS.values():
        if preset.vqa.backend == "blip_vqa":
            assert preset.vqa.options["caption_model"].startswith("Salesforce/blip-image-captioning")
