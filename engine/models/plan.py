"""The memory plan: how much device memory a preset's models need, known before loading any weights,
and how the model manager fits them in a budget (all resident, evicted between stages, or the
generator offloaded to the CPU component by component).

Sizes come from the safetensors headers of the weights a load reads (huggingface_hub's
`parse_safetensors_file_metadata` online, the header of the cached file offline: tensor shapes, no
weights are read; for a diffusers pipeline only the folders its model_index.json names, never the
single-file checkpoints beside them), else from `KNOWN_PARAMS`, the parameter counts of the presets'
models. Weights are counted at the dtype their loader uses (`bytes_per_param`): 2 bytes per parameter
on an accelerator (fp16/bf16), 4 on the CPU, 4 for open_clip (fp32 weights under autocast).

A run has three stages that never need their models at the same time: generation (the generator),
evaluation (embedder + VQA) and the LLM. The peak of a strategy is the largest stage it keeps on
the device plus that stage's working memory (activations, KV cache, VAE decode):

- resident: every model stays loaded; peak = all weights + the largest working memory.
- evict:    the manager moves the least recently used models off the device before a load that
            would not fit (parked in host RAM when it has room, else unloaded); peak = the largest stage.
- offload:  as evict, and the generator runs with diffusers' model CPU offload (one component on
            the device at a time); peak = its largest component + generation working memory.

When even offload does not fit, the plan lists the generator options that would (`remedies`:
sequential CPU offload, fp8 storage of the denoiser) and the model manager refuses to load the
generator with the same sentence (`offload_problem`) instead of running out of memory. `per_run`
says what each strategy moves onto the GPU per run.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..backends.adapters import adapters_of, safetensors_shapes
from ..backends.adapters import weight_bytes as adapter_weight_bytes
from ..backends.base import ModelSpec
from ..backends.device import HOST_RESERVE_BYTES, stores_fp8

GB = 2**30

# Parameters (billions) per component of the presets' models, as loaded in memory (a tied LM head
# counted once; built on the meta device from the released configs with the installed transformers,
# diffusers and open_clip). Keys are hub ids; open_clip models use "open_clip:NAME". Only used when no
# safetensors header is readable.
KNOWN_PARAMS: dict[str, dict[str, float]] = {
    "stabilityai/sd-turbo": {"unet": 0.866, "text_encoder": 0.340, "vae": 0.084},
    "stable-diffusion-v1-5/stable-diffusion-v1-5": {"unet": 0.860, "text_encoder": 0.123, "vae": 0.084,
                                                    "safety_checker": 0.304},
    "stabilityai/sdxl-turbo": {"unet": 2.567, "text_encoder": 0.123, "text_encoder_2": 0.695, "vae": 0.084},
    "black-forest-labs/FLUX.1-schnell": {"transformer": 11.891, "text_encoder_2": 4.762, "text_encoder": 0.123,
                                         "vae": 0.084},
    # Hunyuan-DiT v1.2 (built on the meta device from its configs; the repository's 14.4 GB of fp32 weights agree)
    "Tencent-Hunyuan/HunyuanDiT-v1.2-Diffusers": {"transformer": 1.500, "text_encoder": 0.351, "text_encoder_2": 1.670,
                                                  "vae": 0.084},
    "open_clip:ViT-B-32": {"model": 0.151},
    "openai/clip-vit-large-patch14": {"model": 0.428},
    "Qwen/Qwen2.5-0.5B-Instruct": {"model": 0.494},
    "Qwen/Qwen2.5-1.5B-Instruct": {"model": 1.544},
    "Qwen/Qwen2.5-3B-Instruct": {"model": 3.086},
    "Salesforce/blip-vqa-base": {"model": 0.361},
    "Salesforce/blip-vqa-capfilt-large": {"model": 0.588},
    "Salesforce/blip-image-captioning-base": {"model": 0.224},
    "Salesforce/blip-image-captioning-large": {"model": 0.446},
    "Qwen/Qwen2-VL-2B-Instruct": {"model": 2.209},
    "Qwen/Qwen2.5-VL-3B-Instruct": {"model": 3.755},
}

# Working memory (GB) of one generator call at the family's default size and GPU batch (latents,
# attention, the VAE decode of the batch), by a substring of the hub id; the LLM and VQA stages
# get EVAL_WORKING_GB (KV cache and vision tokens of one batch).
GENERATION_WORKING_GB = {"flux": 6.0, "sdxl": 2.5, "stable-diffusion-v1-5": 2.5, "sd-turbo": 1.5}
DEFAULT_GENERATION_WORKING_GB = 2.5
EVAL_WORKING_GB = 0.75          # a local LLM's (no images)
# A VQA model's working memory grows with its batch and the visual tokens of each image (issue 35):
# EVAL_BASE_GB plus batch x image tokens x TOKEN_WORKING_BYTES. A VLM gets one token per VISION_TOKEN_PX pixels
# (Qwen2-VL: 14-px patches merged 2x2, so about 1,340 tokens for a 1024² image); BLIP resizes every image to
# 384 px (24² patches + [CLS]). Per token: a 2-3B decoder's live activations (~50 KiB at width 1536-2048), its KV
# cache over every layer (~30 KiB) and four vision patches' activations (~80 KiB), rounded up for the
# allocator's fragmentation: 256 KiB; BLIP (width 768) a quarter of that.
EVAL_BASE_GB = 0.25
VISION_TOKEN_PX = 28 * 28
BLIP_IMAGE_TOKENS = 577
TOKEN_WORKING_BYTES = {"vlm": 256 * 2**10, "blip_vqa": 64 * 2**10}
DEFAULT_EVAL_BATCH = {"vlm": 8, "blip_vqa": 16}    # the backends' default batch_size (engine/backends/vqa.py)
DEFAULT_EVAL_IMAGE_PX = 1024 * 1024                # when the images' size is not known: the largest family default
# Sequential CPU offload keeps one layer on the device at a time: the largest single layer of the
# presets' models is T5-XXL's token embedding, 0.25 GB in bf16.
SEQUENTIAL_LAYER_GB = 0.5
DENOISERS = ("unet", "transformer")

STAGES = {"generation": ("generator",), "evaluation": ("embedder", "vqa"), "llm": ("llm",)}
# The order a Single Prompt run uses its models in (images, VQA + CLIP, the gap score's LLM,
# captions): what `per_run` replays to count what eviction reloads.
RUN_ORDER = (("generator",), ("vqa", "embedder"), ("llm",), ("vqa",))


@dataclass
class ModelSize:
    role: str
    label: str
    components: dict[str, int]            # component -> bytes at the run dtype
    source: str                           # "safetensors header (cache)", "... (hub)", "table", "unknown"

    @property
    def bytes(self) -> int:
        return sum(self.components.values())

    @property
    def largest_component(self) -> int:
        return max(self.components.values(), default=0)

    @property
    def largest_name(self) -> str:
        return max(self.components, key=self.components.get, default="")


@dataclass
class Plan:
    """What `python -m engine plan` prints; `as_json()` is its --json document."""

    preset: str
    gpu_memory_gb: float | None
    budget_gb: float | None
    strategy: str                         # "resident" | "evict" | "offload"
    peak_gb: float
    fits: bool
    needs_gb: dict[str, float]            # strategy -> peak: the smallest budget each strategy needs
    models: list[dict] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)
    verdict: str = ""                     # one sentence: fits or not, and what would fit
    remedies: list[dict] = field(default_factory=list)   # generator options that lower the peak
    offload_host_gb: float = 0.0          # host RAM CPU offload keeps the generator's weights in
    host_memory_gb: float | None = None   # this machine's RAM
    per_run: dict[str, str] = field(default_factory=dict)  # strategy -> what moves onto the GPU per run

    def as_json(self) -> dict:
        return asdict(self)


def bytes_per_param(spec: ModelSpec | None = None, device: str = "cuda", *, bf16: bool = True) -> int:
    """Returns the bytes a parameter of `spec` takes on `device`, as its loader keeps it: the `dtype`
    option when set; 4 on the CPU; open_clip's `precision` option (fp32 unless set: open_clip loads
    fp32 weights and runs them under autocast); 4 for a VLM that must not run in fp16 on a GPU without
    native bf16 (device.FP16_UNSTABLE_MODEL_TYPES); else 2 (fp16/bf16)."""
    options = spec.options if spec is not None else {}
    if options.get("dtype") not in (None, "", "auto"):
        return 4 if str(options["dtype"]).lower().removeprefix("torch.") in ("fp32", "float32", "float") else 2
    if str(device).split(":")[0] == "cpu":
        return 4
    if spec is not None and spec.backend == "open_clip":
        return 2 if "16" in str(options.get("precision", "fp32")) else 4
    if spec is not None and spec.backend == "vlm" and not bf16:
        from ..backends.device import FP16_UNSTABLE_MODEL_TYPES

        if _model_type(spec.model) in FP16_UNSTABLE_MODEL_TYPES:
            return 4
    return 2


def spec_key(spec: ModelSpec) -> str:
    return f"open_clip:{spec.model}" if spec.backend == "open_clip" else spec.model


def model_size(spec: ModelSpec, role: str = "", device: str = "cuda", *, online: bool = False,
               bf16: bool = True) -> ModelSize:
    """Returns the size of `spec`'s weights on `device` without loading them: from the safetensors
    headers in the local hub cache, from the hub's headers when `online`, else from KNOWN_PARAMS
    (a BLIP VQA model's `caption_model` option adds its captioner; a diffusers `storage_dtype=fp8`
    option stores the denoiser at 1 byte a parameter; each LoRA or embedding of a diffusers generator adds
    its weights, `_adapter_sizes`). Synthetic backends take 0 bytes."""
    per = bytes_per_param(spec, device, bf16=bf16)
    if spec.backend.startswith("synthetic") or spec.backend in ("openai", "faces"):
        return ModelSize(role, spec.label, {}, "no device memory")
    params, source = _header_params(spec.model, online=online)
    if params is None:
        table = KNOWN_PARAMS.get(spec_key(spec))
        params, source = ({k: int(v * 1e9) for k, v in table.items()}, "table") if table else ({}, "unknown")
    fp8 = spec.backend == "diffusers" and stores_fp8(spec.options)
    components = {k: n * (1 if fp8 and k in DENOISERS else per) for k, n in params.items()}
    if spec.backend == "diffusers":
        source += _adapter_sizes(spec, per, components)
    captioner = spec.options.get("caption_model") if spec.backend == "blip_vqa" else None
    if captioner:
        extra = model_size(ModelSpec("blip_vqa", str(captioner), {k: v for k, v in spec.options.items()
                                                                 if k == "dtype"}), role, device, online=online)
        components["captioner"] = extra.bytes
    return ModelSize(role, spec.label, components, source)


def _adapter_sizes(spec: ModelSpec, per: int, components: dict[str, int]) -> str:
    """Adds to `components` the weights of each adapter of a diffusers generator at `per` bytes a parameter
    (diffusers loads a LoRA in the base's dtype), "lora: NAME" or "embedding: NAME", read from its
    safetensors header (a local file or the hub cache).
    They are on the device while the LoRAs load: a fused LoRA's own weights are then dropped, but the plan
    keeps that peak. Returns a note for the plan's source when an adapter's size is unknown (not cached)."""
    unknown = []
    for adapter in adapters_of(spec.options):
        size = adapter_weight_bytes(adapter, per)
        name = ("lora: " if adapter.kind == "lora" else "embedding: ") + adapter.source.rstrip("/").rsplit("/", 1)[-1]
        if size is None:
            unknown.append(adapter.source)
        else:
            components[name] = components.get(name, 0) + size
    return f"; size of {', '.join(unknown)} unknown until downloaded" if unknown else ""


def estimate_bytes(spec: ModelSpec, device: str, *, bf16: bool = True) -> int:
    """Returns the bytes `spec` will take on `device` (0 when unknown); what the model manager
    checks against its budget before loading."""
    return model_size(spec, device=device, bf16=bf16).bytes


def generation_working_bytes(spec: ModelSpec) -> int:
    lowered = spec.model.lower()
    gb = next((v for k, v in GENERATION_WORKING_GB.items() if k in lowered), DEFAULT_GENERATION_WORKING_GB)
    return int(gb * GB) if spec.backend == "diffusers" else 0


def working_bytes(spec: ModelSpec, image_px: int | None = None) -> int:
    """Returns the device memory `spec` needs beside its weights while it runs: a diffusers
    generator's GENERATION_WORKING_GB, EVAL_WORKING_GB for a local LLM, a VQA model's from its batch and
    the images' size (`eval_working_bytes`), else 0 (embedders batch a few small tensors; API backends
    use no device memory)."""
    if spec.backend == "diffusers":
        return generation_working_bytes(spec)
    if spec.backend in TOKEN_WORKING_BYTES:
        return eval_working_bytes(spec, image_px)
    return int(EVAL_WORKING_GB * GB) if spec.backend == "hf_chat" else 0


def eval_working_bytes(spec: ModelSpec, image_px: int | None = None) -> int:
    """Returns a BLIP or VLM evaluator's working memory: EVAL_BASE_GB + its batch (option batch_size, else
    the backend's default) × the visual tokens of one image (`image_px` pixels, default
    DEFAULT_EVAL_IMAGE_PX; BLIP: BLIP_IMAGE_TOKENS at any size) × TOKEN_WORKING_BYTES."""
    try:
        batch = max(1, int(spec.options.get("batch_size", DEFAULT_EVAL_BATCH[spec.backend])))
    except (TypeError, ValueError):
        batch = DEFAULT_EVAL_BATCH[spec.backend]
    tokens = (BLIP_IMAGE_TOKENS if spec.backend == "blip_vqa"
              else -(-int(image_px or DEFAULT_EVAL_IMAGE_PX) // VISION_TOKEN_PX))
    return int(EVAL_BASE_GB * GB + batch * tokens * TOKEN_WORKING_BYTES[spec.backend])


def image_pixels(generator: ModelSpec) -> int | None:
    """Returns the pixels of the generator's images at its family's default size (diffusers), else None."""
    if generator.backend != "diffusers":
        return None
    from ..backends.diffusers_generator import FAMILY_DEFAULTS, family_of

    side = FAMILY_DEFAULTS[family_of(generator)].size
    return side * side


def offload_problem(spec: ModelSpec, budget_bytes: int, device: str = "cuda", *, host_bytes: int | None = None,
                    online: bool = False, bf16: bool = True) -> str | None:
    """Returns the sentence saying why the diffusers generator `spec` does not fit `budget_bytes` even
    with model CPU offload (its largest component plus the generation's working memory), with the
    generator options that would fit and the host RAM offload needs; None when it fits."""
    size = model_size(spec, "generator", device, online=online, bf16=bf16)
    work = generation_working_bytes(spec)
    if spec.backend != "diffusers" or size.largest_component + work <= budget_bytes:
        return None
    fitting = [(r["option"], r["generation_peak_bytes"], r["note"])
               for r in generator_remedies(spec, size, work, device, online=online, bf16=bf16)
               if r["generation_peak_bytes"] <= budget_bytes]
    return _offload_sentence(f"{spec.label} does not fit this device's {_gb(budget_bytes):.1f} GB budget",
                             size, work, fitting, host_bytes)


def generator_remedies(spec: ModelSpec, size: ModelSize, work: int, device: str = "cuda", *,
                       online: bool = False, bf16: bool = True) -> list[dict]:
    """Returns the generator options that lower a diffusers generator's peak, each with the peak of
    its generation stage: sequential CPU offload (one layer on the device at a time) and, where the
    denoiser is not already stored in fp8, fp8 storage of the denoiser (diffusers' layerwise casting,
    with model CPU offload)."""
    remedies = [{"option": "enable_cpu_offload=sequential",
                 "generation_peak_bytes": int(SEQUENTIAL_LAYER_GB * GB) + work,
                 "note": "one layer on the GPU at a time, several times slower"}]
    denoiser = next((c for c in DENOISERS if c in size.components), None)
    if denoiser and not stores_fp8(spec.options):
        fp8 = model_size(ModelSpec(spec.backend, spec.model, {**spec.options, "storage_dtype": "fp8"}), "generator",
                         device, online=online, bf16=bf16)
        remedies.append({"option": "storage_dtype=fp8", "generation_peak_bytes": fp8.largest_component + work,
                         "note": f"the {denoiser} stored in float8 and computed in 16 bits, a small loss of quality"})
    return remedies


def _offload_sentence(subject: str, size: ModelSize, work: int, fitting: list[tuple[str, int, str]],
                      host_bytes: int | None) -> str:
    """`subject` + why model CPU offload is not enough + `fitting` ((option, peak bytes, note) of each
    generator option that would fit) + the host RAM offload needs."""
    text = (f"{subject}: even with model CPU offload its largest component ({size.largest_name}, "
            f"{_gb(size.largest_component):.1f} GB) plus {_gb(work):.1f} GB to generate needs "
            f"{_gb(size.largest_component + work):.1f} GB")
    if fitting:
        text += "; what would fit: the generator option " + " or ".join(
            f"{option} (generation peak {_gb(peak):.1f} GB; {note})" for option, peak, note in fitting)
    else:
        text += "; no generator option makes it fit: use a larger GPU or a smaller preset"
    text += f". Offload keeps the generator's {_gb(size.bytes):.1f} GB of weights in host RAM"
    if host_bytes:
        enough = "enough" if host_bytes >= size.bytes + HOST_RESERVE_BYTES else "not enough"
        text += f" (this machine has {_gb(host_bytes):.1f} GB: {enough})"
    return text + "."


def plan(preset, gpu_memory_gb: float | None = None, *, budget_bytes: int | None = None,
         device: str = "cuda", online: bool = False, bf16: bool = True,
         host_memory_gb: float | None = None) -> Plan:
    """Returns the memory plan of `preset` (a Preset) on a device with `gpu_memory_gb` of memory
    (budget = that minus device.CUDA_RESERVE_BYTES), or with an explicit `budget_bytes`; `bf16`:
    whether the GPU computes bf16 natively; `host_memory_gb`: the host's RAM (default: this machine's).

    The strategy is the first of resident, evict, offload whose peak fits the budget (offload when
    none does, with fits=False; `remedies` then lists the generator options that would fit). Without
    any budget the plan says what each strategy needs."""
    from ..backends.device import CUDA_RESERVE_BYTES, DeviceMemory

    if budget_bytes is None and gpu_memory_gb:
        budget_bytes = max(int(gpu_memory_gb * GB) - CUDA_RESERVE_BYTES, int(gpu_memory_gb * GB) // 2)
    if host_memory_gb is None:
        host = DeviceMemory().total_bytes("cpu")
        host_memory_gb = round(host / GB, 1) if host else None
    specs = preset.specs()
    sizes = {role: model_size(spec, role, device, online=online, bf16=bf16) for role, spec in specs.items()}
    pixels = image_pixels(specs["generator"])
    work = {stage: max(working_bytes(specs[r], pixels) for r in roles) for stage, roles in STAGES.items()}
    stage_bytes = {stage: sum(sizes[r].bytes for r in roles) + work[stage] for stage, roles in STAGES.items()}
    everything = sum(s.bytes for s in sizes.values())
    offload_generation = sizes["generator"].largest_component + work["generation"]
    peaks = {
        "resident": everything + max(work.values()),
        "evict": max(stage_bytes.values()),
        "offload": max(offload_generation, stage_bytes["evaluation"], stage_bytes["llm"]),
    }
    if budget_bytes is None:
        strategy = "resident"
    else:
        strategy = next((s for s in ("resident", "evict", "offload") if peaks[s] <= budget_bytes), "offload")
    fits = budget_bytes is None or peaks[strategy] <= budget_bytes
    models = []
    for role, size in sizes.items():
        where = "resident"
        if strategy == "evict" or (strategy == "offload" and role != "generator"):
            where = "evicted between stages"
        if strategy == "offload" and role == "generator":
            where = "CPU offload (one component on the device at a time)"
        models.append({"role": role, "model": size.label, "gb": _gb(size.bytes), "placement": where,
                       "size_from": size.source,
                       "components": {k: _gb(v) for k, v in size.components.items()}})
    remedies = []
    if not fits and preset.generator.backend == "diffusers":
        others = max(stage_bytes["evaluation"], stage_bytes["llm"])
        for r in generator_remedies(preset.generator, sizes["generator"], work["generation"], device,
                                    online=online, bf16=bf16):
            generation = r.pop("generation_peak_bytes")
            peak = max(generation, others)
            remedies.append({**r, "peak_gb": _gb(peak), "generation_peak_gb": _gb(generation),
                             "fits": peak <= budget_bytes})
    host_bytes = int(host_memory_gb * GB) if host_memory_gb else None
    result = Plan(preset=preset.name, gpu_memory_gb=gpu_memory_gb,
                  budget_gb=None if budget_bytes is None else _gb(budget_bytes),
                  strategy=strategy, peak_gb=_gb(peaks[strategy]), fits=fits,
                  needs_gb={k: _gb(v) for k, v in peaks.items()}, models=models,
                  stages={k: _gb(v) for k, v in stage_bytes.items()}, remedies=remedies,
                  offload_host_gb=_gb(sizes["generator"].bytes), host_memory_gb=host_memory_gb,
                  per_run=per_run(sizes, {r: working_bytes(s, pixels) for r, s in specs.items()}, budget_bytes,
                                  host_bytes))
    result.verdict = _verdict(result, preset, sizes, work, budget_bytes, host_bytes)
    return result


def per_run(sizes: dict[str, ModelSize], working: dict[str, int], budget_bytes: int | None,
            host_bytes: int | None) -> dict[str, str]:
    """Returns, per strategy, what moves onto the GPU in each run once the models are loaded: the
    model manager's eviction rule (engine.models: before a model loads or runs, the least recently
    used idle ones leave until its weights and `working` memory fit) replayed over the models a run
    uses (RUN_ORDER), twice, counting the second run. Evicted models come back from host RAM when it
    can hold them all (the manager parks them there), else from disk."""
    reloaded = sum(_replay_evictions(sizes, working, budget_bytes).values())
    # under offload the generator takes its largest component, and its traffic is per call, not per run
    offloaded = {**sizes, "generator": ModelSize("generator", "", {"largest": sizes["generator"].largest_component}, "")}
    besides = sum(v for r, v in _replay_evictions(offloaded, working, budget_bytes).items() if r != "generator")
    parked = sum(s.bytes for s in sizes.values())
    source = ("host RAM (the manager parks evicted models there)" if host_bytes and host_bytes >= parked + HOST_RESERVE_BYTES
              else "disk (the host has too little RAM to park them)")
    return {"resident": "nothing: every model stays on the GPU",
            "evict": (f"{_gb(reloaded):g} GB of models move back onto the GPU each run, from {source}" if reloaded
                      else "nothing at this budget: the models fit side by side"),
            "offload": (f"the generator's {_gb(sizes['generator'].bytes):g} GB cross to the GPU on every generator "
                        f"call (model CPU offload)" + (f", and {_gb(besides):g} GB of evicted models each run, from "
                                                       f"{source}" if besides else ""))}


def _replay_evictions(sizes: dict[str, ModelSize], working: dict[str, int], budget: int | None) -> dict[str, int]:
    """Returns {role: bytes moved onto the device} in the second of two runs (RUN_ORDER) under the
    model manager's rule at `budget`."""
    resident: dict[str, int] = {}
    moved = {role: 0 for role in sizes}
    if not budget:
        return moved
    for run in range(2):
        for stage in RUN_ORDER:
            for role in stage:
                need = sizes[role].bytes
                if not need:
                    continue
                extra = working.get(role, 0) + (0 if role in resident else need)
                while sum(resident.values()) + extra > budget:
                    victim = next((r for r in resident if r != role), None)
                    if victim is None:
                        break
                    resident.pop(victim)
                if role not in resident:
                    moved[role] += need if run else 0
                resident[role] = resident.pop(role, need)      # most recently used last
    return moved


def _verdict(p: Plan, preset, sizes: dict[str, ModelSize], work: dict, budget: int | None,
             host_bytes: int | None) -> str:
    """Returns the plan's one sentence."""
    memory = f"a {p.gpu_memory_gb:g} GB GPU" if p.gpu_memory_gb else "this device"
    if p.fits:
        return (f"{preset.name} fits {memory}: strategy {p.strategy}, peak {p.peak_gb:g} GB"
                + (f" of a {p.budget_gb:g} GB budget." if p.budget_gb is not None else "."))
    generator = preset.generator
    if generator.backend == "diffusers" and sizes["generator"].largest_component + work["generation"] > budget:
        fitting = [(r["option"], int(r["generation_peak_gb"] * GB), r["note"]) for r in p.remedies if r["fits"]]
        return _offload_sentence(f"{preset.name} does not fit {memory} (budget {p.budget_gb:.1f} GB)",
                                 sizes["generator"], work["generation"], fitting, host_bytes)
    worst = max(p.stages, key=p.stages.get)
    return (f"{preset.name} does not fit {memory}: its {worst} stage alone needs {p.stages[worst]:g} GB of a "
            f"{p.budget_gb:g} GB budget; use a larger GPU or a smaller preset.")


def format_plan(p: Plan) -> str:
    """Returns the plan as the text `python -m engine plan` prints."""
    memory = f"{p.gpu_memory_gb:g} GB" if p.gpu_memory_gb else "this device"
    budget = f"budget {p.budget_gb:.1f} GB" if p.budget_gb is not None else "no budget"
    lines = [f"preset {p.preset} on {memory} ({budget}): strategy {p.strategy}, peak {p.peak_gb:.1f} GB, "
             + ("fits" if p.fits else "DOES NOT FIT")]
    for m in p.models:
        lines.append(f"  {m['role']:<9} {m['model']:<58} {m['gb']:6.2f} GB  {m['placement']}  [{m['size_from']}]")
    lines.append("  stages: " + ", ".join(f"{k} {v:.1f} GB" for k, v in p.stages.items()))
    lines.append("  needs:  " + ", ".join(f"{k} {v:.1f} GB" for k, v in p.needs_gb.items()))
    lines.append(f"  per run ({p.strategy}): {p.per_run.get(p.strategy, '')}")
    for r in p.remedies:
        lines.append(f"  option {r['option']}: peak {r['peak_gb']:.1f} GB, " + ("fits" if r["fits"] else "does not fit")
                     + f" ({r['note']})")
    lines.append(p.verdict)
    return "\n".join(lines)


def _gb(n: int) -> float:
    return round(n / GB, 2)


def _model_type(model: str) -> str:
    """Returns the `model_type` of a local or cached config.json ("" when unknown), else a guess from
    the id ("qwen2_vl" / "qwen2_5_vl" for Qwen2-VL / Qwen2.5-VL ids)."""
    folder = Path(model).expanduser()
    if not folder.is_dir():
        from ..backends.device import cached_snapshot

        folder = cached_snapshot(model)
    config = folder / "config.json" if folder is not None else None
    if config is not None and config.is_file():
        try:
            return str(json.loads(config.read_text()).get("model_type", ""))
        except (OSError, ValueError):
            return ""
    lowered = model.lower()
    return "qwen2_5_vl" if "qwen2.5-vl" in lowered else "qwen2_vl" if "qwen2-vl" in lowered else ""


# -- safetensors headers ---------------------------------------------------------------------------
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _header_params(model: str, *, online: bool) -> tuple[dict[str, int] | None, str]:
    """Returns ({component: parameter count}, source) read from safetensors headers, or (None, "")."""
    local = Path(model).expanduser()
    if local.is_dir():
        params = _params_in_folder(local)
        return (params, "safetensors header (local)") if params else (None, "")
    if local.is_file() and local.suffix == ".safetensors":   # a single-file checkpoint
        params = _params_in_checkpoint(local)
        return (params, "safetensors header (local file)") if params else (None, "")
    from ..backends.device import cached_snapshot

    folder = cached_snapshot(model)
    if folder is not None:
        params = _params_in_folder(folder)
        if params:
            return params, "safetensors header (cache)"
    if online:
        try:
            return _params_on_hub(model), "safetensors header (hub)"
        except Exception:  # noqa: BLE001 - unreachable hub, gated repo, no safetensors: use the table
            return None, ""
    return None, ""


def pipeline_folders(model_index: dict) -> list[str]:
    """Returns the component folders a diffusers `model_index.json` names (entries with a library and
    class, e.g. unet, vae, tokenizer; not `_class_name` or components set to null): the only folders
    a pipeline loads. Root files beside them, such as single-file checkpoints, are never loaded."""
    return sorted(name for name, value in model_index.items() if not name.startswith("_")
                  and isinstance(value, (list, tuple)) and len(value) == 2 and value[0] and value[1])


def loaded_weight_files(names: list[str], model_index: dict | None = None) -> list[str]:
    """Returns, of a repository's file names, the safetensors files a load reads: for a diffusers
    pipeline (`model_index` given) those in the folders it names, else those at the root; one weights
    variant per folder: the fp16 variant when a folder has it (same tensors, half the bytes to read),
    never both."""
    folders = set(pipeline_folders(model_index)) if model_index is not None else {""}
    by_folder: dict[str, list[str]] = {}
    for name in names:
        folder = os.path.dirname(name)
        if name.endswith(".safetensors") and folder in folders:
            by_folder.setdefault(folder, []).append(name)
    chosen = []
    for files in by_folder.values():
        plain = [f for f in files if os.path.basename(f).count(".") == 1]
        fp16 = [f for f in files if ".fp16" in os.path.basename(f)]
        chosen += fp16 or plain or files
    return chosen


def _component(name: str) -> str:
    folder = os.path.dirname(name)
    return folder.split("/")[0] if folder else "model"


def _params_in_folder(folder: Path) -> dict[str, int]:
    """{component: parameters} from the headers of the weights a load reads (the folders model_index.json
    names); {} when any header cannot be read (on ZeroGPU `spaces` removes the weights it packed from the
    hub cache, leaving dangling links)."""
    index = folder / "model_index.json"
    try:
        model_index = json.loads(index.read_text()) if index.is_file() else None
    except (OSError, ValueError):
        return {}
    names = [p.relative_to(folder).as_posix() for p in folder.rglob("*.safetensors")]
    params: dict[str, int] = {}
    for name in loaded_weight_files(names, model_index):
        try:
            shapes = safetensors_shapes(folder / name)
        except (OSError, ValueError, struct.error):
            return {}
        count = sum(_numel(shape) for shape in shapes.values())
        params[_component(name)] = params.get(_component(name), 0) + count
    return params


# The components of an original (single-file) SD/SDXL checkpoint, by the prefix of its keys.
CHECKPOINT_PREFIXES = (("model.diffusion_model.", "unet"), ("first_stage_model.", "vae"),
                       ("cond_stage_model.", "text_encoder"), ("conditioner.embedders.0.", "text_encoder"),
                       ("conditioner.embedders.1.", "text_encoder_2"))


def _params_in_checkpoint(path: Path) -> dict[str, int]:
    """{component: parameters} of a single-file checkpoint from its header ({} when unreadable); keys
    without a known prefix (FLUX, SD3 transformer files) count as "transformer"."""
    try:
        shapes = safetensors_shapes(path)
    except (OSError, ValueError, struct.error):
        return {}
    params: dict[str, int] = {}
    for key, shape in shapes.items():
        component = next((c for prefix, c in CHECKPOINT_PREFIXES if key.startswith(prefix)), "transformer")
        params[component] = params.get(component, 0) + _numel(shape)
    return params


def _params_on_hub(model: str) -> dict[str, int]:
    from huggingface_hub import HfApi, hf_hub_download

    api = HfApi()
    names = api.list_repo_files(model)
    model_index = json.loads(Path(hf_hub_download(model, "model_index.json")).read_text()) \
        if "model_index.json" in names else None
    files = loaded_weight_files(names, model_index)
    if files and model_index is None:  # a transformers repo: one call reads every shard's header
        return {"model": sum(api.get_safetensors_metadata(model).parameter_count.values())}
    params: dict[str, int] = {}
    for name in files:
        meta = api.parse_safetensors_file_metadata(model, name)
        count = sum(meta.parameter_count.values())
        params[_component(name)] = params.get(_component(name), 0) + count
    if not params:
        raise ValueError(f"{model} has no safetensors weights")
    return params


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n
