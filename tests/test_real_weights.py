"""What a line-by-line review of the real-weights path found (issue 22), each fixed and checked through
tiny models or fake caches: the plan counts only the folders model_index.json names and the doctor
downloads only what loads; LLM and VQA decoding inherit nothing from a checkpoint's generation_config
and the cached reply records the settings used; a generator that cannot fit even with CPU offload is
refused before loading with the plan's sentence and what would fit; evicted models wait in host RAM;
open_clip and BLIP sizes; Qwen2-VL in fp32 where fp16 breaks it; BLIP's "arafed" is never a concept."""
import json
import shlex
import sqlite3
import struct

import numpy as np
import pytest
import torch

from engine.backends import device as devices
from engine.models import manager as models_module
from engine.backends import load_backend
from engine.backends.base import ModelSpec
from engine.core.engine import Engine
from engine.tools.doctor import download_command
from engine.common.errors import ModelLoadError, OutOfMemoryError
from engine.models.manager import ModelManager
from engine.models.plan import GB, KNOWN_PARAMS, RUN_ORDER, bytes_per_param, model_size, plan
from engine.models.presets import PRESETS
from tests import tiny_models

COMMIT = "0123456789abcdef0123456789abcdef01234567"
FLUX = PRESETS["flux-schnell"].generator
SDXL = PRESETS["sdxl-turbo"]
# parameters per component of sdxl-turbo, as the safetensors headers of its folders hold them
SDXL_PARAMS = {"unet": 2_567_463_684, "text_encoder": 123_060_480, "text_encoder_2": 694_659_840,
               "vae": 83_653_863}
SDXL_INDEX = {"_class_name": "StableDiffusionXLPipeline", "_diffusers_version": "0.24.0.dev0", "force_zeros_for_empty_prompt": True,
              "scheduler": ["diffusers", "EulerAncestralDiscreteScheduler"],
              "text_encoder": ["transformers", "CLIPTextModel"], "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
              "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "CLIPTokenizer"],
              "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"]}
TOKENIZER_FILES = ("merges.txt", "special_tokens_map.json", "tokenizer_config.json", "vocab.json")
# the repository as the hub lists it: component folders in both weight variants, and beside them the
# single-file checkpoints `hf download <id>` also fetches
SDXL_FILES = (["model_index.json", "README.md", "sd_xl_turbo_1.0.safetensors", "sd_xl_turbo_1.0_fp16.safetensors",
               "scheduler/scheduler_config.json"]
              + [f"{t}/{f}" for t in ("tokenizer", "tokenizer_2") for f in TOKENIZER_FILES]
              + [f"{c}/config.json" for c in SDXL_PARAMS]
              + [f"{c}/{w}{v}.safetensors" for c, w in (("text_encoder", "model"), ("text_encoder_2", "model"),
                                                         ("unet", "diffusion_pytorch_model"),
                                                         ("vae", "diffusion_pytorch_model")) for v in ("", ".fp16")])


class FakeMemory:
    """A CUDA card of `gpu_gb` and a host with `host_gb` free; logs empty_cache calls."""

    def __init__(self, gpu_gb, host_gb=64.0):
        self.gpu, self.host, self.emptied = int(gpu_gb * GB), int(host_gb * GB), []

    def total_bytes(self, device):
        return self.gpu if str(device).startswith("cuda") else self.host

    def available_bytes(self, device="cpu"):
        return self.host

    def native_bf16(self, device):
        return True

    def empty_cache(self, device):
        self.emptied.append(device)


class FakeBackend:
    """A loaded model of the plan's size that can move between devices (as the real backends do)."""

    def __init__(self, spec, device, context):
        self.spec, self.device, self.context, self.closed, self.moves = spec, device, context, False, []

    def memory_bytes(self):
        return model_size(self.spec, device="cuda").bytes

    def move_to(self, device):
        self.moves.append(device)
        self.device = device
        return True

    def close(self):
        self.closed = True


@pytest.fixture
def fake_loads(monkeypatch):
    """Replaces the loader the model manager calls; returns the list of specs loaded."""
    calls = []

    def fake_load(spec, device="cpu", **context):
        calls.append(spec)
        return FakeBackend(spec, device, context)

    monkeypatch.setattr(models_module, "load_backend", fake_load)
    return calls


def header_only(path, params: int, dtype="F16") -> None:
    """A safetensors file holding only a header: one tensor of `params` values, no weights."""
    header = json.dumps({"w": {"dtype": dtype, "shape": [params], "data_offsets": [0, 2 * params]}}).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(struct.pack("<Q", len(header)) + header)


@pytest.fixture
def sdxl_cache(tmp_path, monkeypatch):
    """sdxl-turbo as `hf download stabilityai/sdxl-turbo` leaves it in the hub cache (headers only)."""
    import huggingface_hub.constants

    root = tmp_path / "hub" / "models--stabilityai--sdxl-turbo"
    snapshot = root / "snapshots" / COMMIT
    for name in SDXL_FILES:
        path = snapshot / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if name.endswith(".safetensors"):
            component = name.split("/")[0]
            header_only(path, SDXL_PARAMS.get(component, sum(SDXL_PARAMS.values())))
        else:
            path.write_text(json.dumps(SDXL_INDEX) if name == "model_index.json" else "{}")
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    return snapshot


# -- 1. the plan counts what loads; the doctor downloads what loads ---------------------------------

def test_single_file_checkpoints_beside_the_pipeline_are_not_counted(sdxl_cache, fake_loads):
    size = model_size(SDXL.generator, "generator", "cuda")
    assert size.source == "safetensors header (cache)"
    assert size.components == {c: 2 * n for c, n in SDXL_PARAMS.items()}       # not the root checkpoints
    assert 6.4 < size.bytes / GB < 6.5                                           # 19.4 GB before the fix
    assert plan(SDXL, 24).strategy == "resident"                                 # was "evict"
    on16 = plan(SDXL, 16)
    assert on16.strategy == "evict" and on16.fits                                # was "does not fit"
    manager = ModelManager("cuda", memory=FakeMemory(16))
    generator = manager.get(SDXL.generator)
    assert "enable_cpu_offload" not in generator.context                         # no forced CPU offload


def selected(command: str, files: list[str]) -> set[str]:
    """The files `hf download` fetches for `command`, through huggingface_hub's own pattern filter."""
    from huggingface_hub.utils import filter_repo_objects

    words = shlex.split(command)
    if "--include" not in words:
        return set(words[3:]) & set(files)
    include = [words[i + 1] for i, w in enumerate(words) if w == "--include"]
    exclude = [words[i + 1] for i, w in enumerate(words) if w == "--exclude"]
    return set(filter_repo_objects(files, allow_patterns=include, ignore_patterns=exclude or None))


@pytest.mark.slow
def test_the_doctor_advises_downloading_only_the_files_that_load():
    command = download_command(SDXL.generator, SDXL_FILES, SDXL_INDEX)
    assert command.startswith("hf download stabilityai/sdxl-turbo --include ")
    expected = {f for f in SDXL_FILES if "/" in f and (not f.endswith(".safetensors") or ".fp16." in f)}
    assert selected(command, SDXL_FILES) == expected | {"model_index.json"}
    # FLUX: no fp16 variant (plain bf16 shards), a sentencepiece tokenizer, and its own root checkpoints
    flux_index = {"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"],
                  "text_encoder_2": ["transformers", "T5EncoderModel"], "tokenizer_2": ["transformers", "T5TokenizerFast"],
                  "vae": ["diffusers", "AutoencoderKL"]}
    flux_files = ["model_index.json", "flux1-schnell.safetensors", "ae.safetensors",
                  "transformer/config.json", "transformer/diffusion_pytorch_model.safetensors.index.json",
                  "transformer/diffusion_pytorch_model-00001-of-00003.safetensors",
                  "transformer/diffusion_pytorch_model-00002-of-00003.safetensors",
                  "transformer/diffusion_pytorch_model-00003-of-00003.safetensors",
                  "text_encoder_2/config.json", "text_encoder_2/model-00001-of-00002.safetensors",
                  "text_encoder_2/model-00002-of-00002.safetensors", "text_encoder_2/model.safetensors.index.json",
                  "tokenizer_2/spiece.model", "tokenizer_2/tokenizer_config.json", "vae/config.json",
                  "vae/diffusion_pytorch_model.safetensors", "schnell_grid.jpeg"]
    assert selected(download_command(FLUX, flux_files, flux_index), flux_files) == {
        f for f in flux_files if "/" in f} | {"model_index.json"}
    # a transformers model: its root configs and safetensors, not other formats or folders
    qwen_files = ["config.json", "generation_config.json", "merges.txt", "model.safetensors", "tokenizer.json",
                  "tokenizer_config.json", "vocab.json", "LICENSE", "README.md", "pytorch_model.bin",
                  "onnx/model.onnx", "onnx/config.json", "original/model.safetensors"]
    llm = ModelSpec("hf_chat", "Qwen/Qwen2.5-1.5B-Instruct")
    assert selected(download_command(llm, qwen_files), qwen_files) == {
        "config.json", "generation_config.json", "merges.txt", "model.safetensors", "tokenizer.json",
        "tokenizer_config.json", "vocab.json"}
    open_clip = PRESETS["sd-turbo"].embedder
    assert download_command(open_clip) == "hf download laion/CLIP-ViT-B-32-laion2B-s34B-b79K open_clip_model.safetensors"
    # without a file list (no hub): still never the root checkpoints
    generic = selected(download_command(SDXL.generator), SDXL_FILES)
    assert "sd_xl_turbo_1.0.safetensors" not in generic and expected <= generic


def test_doctor_prints_the_download_commands_without_a_hub(tmp_path, monkeypatch, capsys):
    import huggingface_hub.constants

    from engine.cli import main

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["doctor", "--preset", "sdxl-turbo", "--gpu-memory", "24", "--no-self-test"]) == 1
    out = capsys.readouterr().out
    assert 'hf download stabilityai/sdxl-turbo --include "model_index.json"' in out
    assert 'hf download Qwen/Qwen2-VL-2B-Instruct --include "*.json"' in out and "hf download <id>" not in out


# -- 2. decoding settings are all explicit, and recorded --------------------------------------------

MESSAGES = [{"role": "user", "content": "List the bias axes of: a photo of a doctor"}]


@pytest.fixture(scope="module")
def llm_with_defaults(tmp_path_factory):
    """The tiny chat LLM saved with a generation_config like Qwen2.5's, exaggerated to be visible."""
    from transformers import GenerationConfig

    spec = tiny_models.build_tiny_chat_llm(tmp_path_factory.mktemp("llm"))
    GenerationConfig(do_sample=True, temperature=0.05, top_k=1, top_p=0.5, repetition_penalty=5.0,
                     bos_token_id=0, eos_token_id=0).save_pretrained(spec.model)
    return spec


def _generate(spec, llm, **settings) -> str:
    """Decodes MESSAGES with a fresh copy of the checkpoint (its generation_config as saved) and `settings`."""
    from transformers import AutoModelForCausalLM

    raw = AutoModelForCausalLM.from_pretrained(spec.model)
    inputs = llm.tokenizer(llm.format(MESSAGES), return_tensors="pt", add_special_tokens=False)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        out = raw.generate(**inputs, max_new_tokens=12, pad_token_id=llm.tokenizer.eos_token_id, **settings)
    return llm.tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True).strip()


@pytest.mark.real_model
def test_llm_decoding_inherits_nothing_from_the_checkpoints_generation_config(llm_with_defaults):
    llm = load_backend(llm_with_defaults)
    assert llm.model.generation_config.top_k is None and llm.model.generation_config.repetition_penalty is None
    # greedy: the saved repetition penalty would change the reply; GapLens' reply is the plain greedy one
    inherited = _generate(llm_with_defaults, llm, do_sample=False)
    plain = _generate(llm_with_defaults, llm, do_sample=False, repetition_penalty=1.0)
    assert inherited != plain
    assert llm.chat(MESSAGES, temperature=0, max_tokens=12, seed=3) == plain
    # "temperature 1": plain sampling, not the saved top_k=1 / top_p / temperature
    inherited = _generate(llm_with_defaults, llm, do_sample=True, temperature=1.0)
    plain = _generate(llm_with_defaults, llm, do_sample=True, temperature=1.0, top_p=1.0, top_k=0, repetition_penalty=1.0)
    assert inherited != plain
    assert llm.chat(MESSAGES, temperature=1.0, max_tokens=12, seed=3) == plain


@pytest.mark.real_model
def test_the_cached_reply_records_the_decoding_settings_used(llm_with_defaults, data_dir):
    engine = Engine("synthetic", data_dir=data_dir, llm=llm_with_defaults)
    engine.llm.chat(MESSAGES, temperature=1.0, max_tokens=8, seed=1)
    engine.llm.chat(MESSAGES, temperature=0, max_tokens=8, seed=1)
    with sqlite3.connect(engine.store.db_path) as db:
        requests = [json.loads(r[0]) for r in db.execute("SELECT request FROM llm_replies ORDER BY created")]
    assert requests[0]["decoding"] == {"do_sample": True, "temperature": 1.0, "top_p": 1.0, "top_k": 0,
                                       "typical_p": 1.0, "num_beams": 1, "repetition_penalty": 1.0,
                                       "no_repeat_ngram_size": 0}
    assert requests[1]["decoding"] == {"do_sample": False, "num_beams": 1, "repetition_penalty": 1.0,
                                       "no_repeat_ngram_size": 0}
    engine.llm.chat(MESSAGES, temperature=1.0, max_tokens=8, seed=1)
    assert engine.stats.llm_cache_hits == 1 and engine.stats.llm_calls == 2


@pytest.mark.real_model
def test_vqa_decoding_inherits_nothing_either(tmp_path):
    import numpy as np
    from PIL import Image
    from transformers import GenerationConfig

    spec = tiny_models.build_tiny_vlm(tmp_path)
    rng = np.random.RandomState(0)
    pictures = [Image.fromarray((rng.rand(64, 64, 3) * 255).astype("uint8")) for _ in range(3)]
    before = load_backend(spec).answer(pictures, "What is in the image?")
    GenerationConfig(repetition_penalty=5.0, num_beams=3, do_sample=True, top_k=1, bos_token_id=0,
                     eos_token_id=0).save_pretrained(spec.model)
    vlm = load_backend(spec)
    assert vlm.model.generation_config.num_beams is None and vlm.model.generation_config.repetition_penalty is None
    assert vlm.answer(pictures, "What is in the image?") == before


# -- 3. a generator that cannot fit is refused before loading, with what would fit -------------------

@pytest.mark.slow
def test_flux_on_24gb_is_refused_before_loading_with_the_plans_sentence(fake_loads):
    manager = ModelManager("cuda", memory=FakeMemory(24, host_gb=24))
    with pytest.raises(ModelLoadError) as err:
        manager.get(FLUX)
    message = str(err.value)
    assert not fake_loads                                                        # nothing was loaded
    verdict = plan(PRESETS["flux-schnell"], 24, host_memory_gb=24).verdict
    assert message.split(": even with", 1)[1] == verdict.split(": even with", 1)[1]   # the plan's own sentence
    assert "needs 28.1 GB" in message and "enable_cpu_offload=sequential (generation peak 6.5 GB" in message
    assert "storage_dtype=fp8 (generation peak 17.1 GB" in message
    assert "31.4 GB of weights in host RAM (this machine has 24.0 GB: not enough)" in message
    # each remedy loads: fp8 storage halves the transformer and fits with model offload
    fp8 = manager.get(ModelSpec(FLUX.backend, FLUX.model, {"storage_dtype": "fp8"}))
    assert fp8.context == {"enable_cpu_offload": True}
    manager.unload()
    sequential = manager.get(ModelSpec(FLUX.backend, FLUX.model, {"enable_cpu_offload": "sequential"}))
    assert sequential.context == {}                                              # the option itself decides


@pytest.mark.real_model
def test_fp8_storage_and_the_out_of_memory_advice_on_the_real_loader(tiny_root, data_dir):
    tiny = tiny_models.build_tiny_sd(tiny_root)
    fp8 = ModelSpec("diffusers", tiny.model, {"storage_dtype": "fp8"})
    generator = load_backend(fp8)
    assert torch.float8_e4m3fn in {p.dtype for p in generator.pipe.unet.parameters()}
    assert generator.memory_bytes() < load_backend(tiny).memory_bytes()
    image = generator.generate("a photo of a doctor", [1], generator.defaults().replace(steps=2))[0].image
    assert np.asarray(image.convert("L"), np.float32).std() > 2                 # an image, not a blank
    assert Engine("synthetic", data_dir=data_dir, generator=fp8).model_id("generator") != \
        Engine("synthetic", data_dir=data_dir, generator=tiny).model_id("generator")   # never the same cache

    def out_of_memory(**kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    generator.pipe, generator.offload = out_of_memory, "model"
    with pytest.raises(OutOfMemoryError) as err:
        generator.generate("a photo", [1], generator.defaults())
    assert "enable_cpu_offload=sequential or storage_dtype=fp8" in str(err.value)
    assert "enable_cpu_offload=True" not in str(err.value)                       # it is on already


# -- 4. evicted models wait in host RAM; the plan says what a run moves ----------------------------

def _run_twice(manager):
    """Uses the preset's models in a Single Prompt run's order, twice; returns the bytes moved onto the
    device in the second run and the number of loads it made."""
    specs = SDXL.specs()
    moved = loads = 0
    for run in range(2):
        for stage in RUN_ORDER:
            for role in stage:
                entry = manager._models.get(specs[role])
                before = entry is None or entry.parked
                with manager.use(specs[role]):
                    pass
                if run and before:
                    moved += manager._models[specs[role]].bytes
                    loads += entry is None
    return moved, loads


def test_evicted_models_are_parked_in_host_ram_and_the_plan_counts_what_moves(fake_loads):
    manager = ModelManager("cuda", memory=FakeMemory(16, host_gb=64))
    moved, loads = _run_twice(manager)
    per_run = plan(SDXL, 16, host_memory_gb=64).per_run["evict"]
    assert per_run.startswith(f"{moved / GB:.2f} GB of models move back onto the GPU each run, from host RAM")
    assert 10 < moved / GB < 10.3 and loads == 0                                 # SDXL, CLIP and Qwen, none from disk
    # parked for the LLM, back for the next run's images, parked again: never reloaded
    assert manager._models[SDXL.generator].backend.moves == ["cpu", "cuda", "cpu"]
    assert manager.peek(SDXL.generator).moves == ["cpu", "cuda", "cpu"]          # reading its id moves nothing
    assert [m for m in manager.loaded() if m.get("parked")] and "parked in host RAM: " in manager.summary()


@pytest.mark.slow
def test_without_room_in_host_ram_evicted_models_are_unloaded_and_reloaded(fake_loads):
    manager = ModelManager("cuda", memory=FakeMemory(16, host_gb=2))
    moved, loads = _run_twice(manager)
    assert loads == 3 and not any(m.get("parked") for m in manager.loaded())
    assert "from disk" in plan(SDXL, 16, host_memory_gb=2).per_run["evict"]


def _parameters(backend):
    modules = [getattr(backend, a, None) for a in ("model", "captioner", "_safety_checker")]
    pipe = getattr(backend, "pipe", None)
    if pipe is not None:
        modules += [c for c in pipe.components.values() if isinstance(c, torch.nn.Module)]
    return [p for m in modules if m is not None for p in m.parameters()]


@pytest.mark.real_model
def test_every_real_backend_moves_all_of_its_weights(tiny_root):
    specs = [tiny_models.build_tiny_sd(tiny_root, name="tiny-sd-nsfw", flag_everything=True),
             tiny_models.build_tiny_chat_llm(tiny_root), tiny_models.build_tiny_blip_vqa(tiny_root),
             tiny_models.build_tiny_clip_hf(tiny_root), tiny_models.build_tiny_open_clip(tiny_root),
             tiny_models.build_tiny_vlm(tiny_root)]
    for spec in specs:
        backend = load_backend(spec)
        assert backend.move_to("meta")      # "meta" proves every weight followed, without copying any
        assert {p.device.type for p in _parameters(backend)} == {"meta"}, spec.backend


# -- 5. sizes ---------------------------------------------------------------------------------------

@pytest.mark.slow
def test_open_clip_counts_fp32_and_blip_sizes_are_those_in_memory():
    import open_clip
    from transformers import BlipConfig, BlipForConditionalGeneration, BlipForQuestionAnswering

    b32 = PRESETS["sd-turbo"].embedder
    assert model_size(b32, device="cuda").bytes == int(0.151e9) * 4               # open_clip loads fp32
    assert model_size(ModelSpec("open_clip", "ViT-B-32", {"precision": "fp16"}), device="cuda").bytes == int(0.151e9) * 2
    assert model_size(PRESETS["sd15"].vqa, device="cuda").components == {
        "model": int(0.588e9) * 2, "captioner": int(0.446e9) * 2}                 # capfilt-large is 0.59 B, not 0.47 B

    def count(model) -> int:
        return sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())

    large = dict(hidden_size=1024, num_hidden_layers=24, intermediate_size=4096, num_attention_heads=16, image_size=384)
    base = dict(hidden_size=768, num_hidden_layers=12, intermediate_size=3072, num_attention_heads=12, image_size=384)
    with torch.device("meta"):   # the released configs, built without weights
        built = {"Salesforce/blip-vqa-capfilt-large": BlipForQuestionAnswering(BlipConfig(vision_config=large, text_config={"encoder_hidden_size": 1024})),
                 "Salesforce/blip-vqa-base": BlipForQuestionAnswering(BlipConfig(vision_config=base, text_config={"encoder_hidden_size": 768})),
                 "Salesforce/blip-image-captioning-large": BlipForConditionalGeneration(BlipConfig(vision_config=large, text_config={"encoder_hidden_size": 1024})),
                 "Salesforce/blip-image-captioning-base": BlipForConditionalGeneration(BlipConfig(vision_config=base, text_config={"encoder_hidden_size": 768})),
                 "open_clip:ViT-B-32": open_clip.create_model("ViT-B-32", pretrained=None, device="meta")}
    for key, model in built.items():
        assert count(model) == pytest.approx(KNOWN_PARAMS[key]["model"] * 1e9, rel=0.005), key


# -- 6. evaluator quirks ------------------------------------------------------------------------------

def test_qwen2_vl_runs_in_fp32_on_a_gpu_without_native_bf16(monkeypatch, tmp_path):
    from transformers import Qwen2VLConfig

    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)  # a T4
    assert devices.vlm_dtype("qwen2_vl", "cuda") == torch.float32
    assert devices.vlm_dtype("qwen2_5_vl", "cuda") == torch.float32
    assert devices.vlm_dtype("llava", "cuda") == torch.float16                  # others keep fp16
    assert devices.vlm_dtype("qwen2_vl", "cuda", "fp16") == torch.float16        # the dtype option decides
    Qwen2VLConfig().save_pretrained(tmp_path / "qwen-vl")                        # a local checkpoint's config
    assert bytes_per_param(ModelSpec("vlm", str(tmp_path / "qwen-vl")), "cuda", bf16=False) == 4
    t4 = plan(SDXL, 16, bf16=False)
    assert next(m for m in t4.models if m["role"] == "vqa")["gb"] == round(KNOWN_PARAMS["Qwen/Qwen2-VL-2B-Instruct"]["model"] * 1e9 * 4 / GB, 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)   # an A100
    assert devices.vlm_dtype("qwen2_vl", "cuda") == torch.bfloat16


def test_the_blip_artefact_word_is_never_a_concept(tmp_path, data_dir):
    from engine.methods import single_prompt
    from engine.methods.counterfactuals import CounterfactualsRequest, run as counterfactuals
    from engine.metrics import tibet
    from engine.metrics.concepts import top_phrases
    from tests.test_image_sources import synthetic_folder

    captions = ["arafed man in a white coat", "araffe woman in a lab coat", "arafed doctor"]
    assert all("araf" not in c for c, _ in top_phrases([["arafed man"], ["woman"], ["man"]], captions, 10))
    assert not any(w.startswith("araf") for w in tibet.concept_histogram([[c] for c in captions]))

    maker = Engine("synthetic", data_dir=str(tmp_path / "maker"))
    prompts = {"a photo of a doctor": 4, "a photo of a male doctor": 4, "a photo of a female doctor": 4}
    root, _ = synthetic_folder(tmp_path, maker, prompts, fmt="jsonl", labels=lambda prompt, i: {
        "gender": ["male", "female"][i % 2], "caption": f"arafed {['man', 'woman'][i % 2]} in a white coat"})
    engine = Engine("synthetic", data_dir=data_dir, generator=f"folder:{root}", vqa=f"labels:{root}")
    done = list(single_prompt.run(single_prompt.SinglePromptRequest(
        "a photo of a doctor", n=4, axes=["gender"], gap=False, n_boot=100), engine))[-1]
    assert done.results["captions"][0].startswith("arafed")                      # the captioner said it...
    assert done.results["top_concepts"] and not any("araf" in c for c, _ in done.results["top_concepts"])
    axes = {"gender": ["a photo of a male doctor", "a photo of a female doctor"]}
    done = list(counterfactuals(CounterfactualsRequest("a photo of a doctor", axes=axes, n=4, n_boot=100), engine))[-1]
    for label, s in done.results["sets"].items():                                # ...CAS never sees it
        assert s["histogram"] and not any(w.startswith("araf") for w in s["histogram"]), label
        assert not any("araf" in c for c, _ in s["top_k"]), label
