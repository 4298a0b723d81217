"""The memory plan: how much device memory a preset's models need, known before loading any weights,
and how the model manager fits them in a budget (all resident, evicted between stages, or the
generator offloaded to the CPU component by component).

Sizes come from the safetensors headers of the weights (huggingface_hub's
`parse_safetensors_file_metadata` online, the header of the cached file offline: tensor shapes, no
weights are read), else from `KNOWN_PARAMS`, the parameter counts of the presets' models.
Weights are counted at 2 bytes per parameter on an accelerator (fp16/bf16) and 4 on the CPU.

A run has three stages that never need their models at the same time: generation (the generator),
evaluation (embedder + VQA) and the LLM. The peak of a strategy is the largest stage it keeps on
the device plus that stage's working memory (activations, KV cache, VAE decode):

- resident: every model stays loaded; peak = all weights + the largest working memory.
- evict:    the manager unloads the least recently used models before a load that would not fit;
            peak = the largest stage.
- offload:  as evict, and the generator runs with diffusers' model CPU offload (one component on
            the device at a time); peak = its largest component + generation working memory.
"""
from __future__ import annotations

import json
import os
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path

from .backends.base import ModelSpec

GB = 2**30

# Parameters (billions) per component of the presets' models (model cards / safetensors headers).
# Keys are hub ids; open_clip models use "open_clip:NAME". Only used when no header is readable.
KNOWN_PARAMS: dict[str, dict[str, float]] = {
    "stabilityai/sd-turbo": {"unet": 0.866, "text_encoder": 0.340, "vae": 0.084},
    "stable-diffusion-v1-5/stable-diffusion-v1-5": {"unet": 0.860, "text_encoder": 0.123, "vae": 0.084,
                                                    "safety_checker": 0.304},
    "stabilityai/sdxl-turbo": {"unet": 2.567, "text_encoder": 0.123, "text_encoder_2": 0.695, "vae": 0.084},
    "black-forest-labs/FLUX.1-schnell": {"transformer": 11.90, "text_encoder_2": 4.762, "text_encoder": 0.123,
                                         "vae": 0.084},
    "open_clip:ViT-B-32": {"model": 0.151},
    "openai/clip-vit-large-patch14": {"model": 0.428},
    "Qwen/Qwen2.5-0.5B-Instruct": {"model": 0.494},
    "Qwen/Qwen2.5-1.5B-Instruct": {"model": 1.544},
    "Qwen/Qwen2.5-3B-Instruct": {"model": 3.086},
    "Salesforce/blip-vqa-base": {"model": 0.385},
    "Salesforce/blip-vqa-capfilt-large": {"model": 0.470},
    "Salesforce/blip-image-captioning-base": {"model": 0.247},
    "Salesforce/blip-image-captioning-large": {"model": 0.470},
    "Qwen/Qwen2-VL-2B-Instruct": {"model": 2.209},
    "Qwen/Qwen2.5-VL-3B-Instruct": {"model": 3.755},
}

# Working memory (GB) of one generator call at the family's default size and GPU batch (latents,
# attention, the VAE decode of the batch), by a substring of the hub id; the LLM and VQA stages
# get EVAL_WORKING_GB (KV cache and vision tokens of one batch).
GENERATION_WORKING_GB = {"flux": 6.0, "sdxl": 2.5, "stable-diffusion-v1-5": 2.5, "sd-turbo": 1.5}
DEFAULT_GENERATION_WORKING_GB = 2.5
EVAL_WORKING_GB = 0.75

STAGES = {"generation": ("generator",), "evaluation": ("embedder", "vqa"), "llm": ("llm",)}


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

    def as_json(self) -> dict:
        return asdict(self)


def bytes_per_param(device: str = "cuda") -> int:
    return 4 if str(device).split(":")[0] == "cpu" else 2


def spec_key(spec: ModelSpec) -> str:
    return f"open_clip:{spec.model}" if spec.backend == "open_clip" else spec.model


def model_size(spec: ModelSpec, role: str = "", device: str = "cuda", *, online: bool = False) -> ModelSize:
    """Returns the size of `spec`'s weights on `device` without loading them: from the safetensors
    headers in the local hub cache, from the hub's headers when `online`, else from KNOWN_PARAMS
    (a BLIP VQA model's `caption_model` option adds its captioner). Synthetic backends take 0 bytes."""
    per = bytes_per_param(device)
    if spec.backend.startswith("synthetic") or spec.backend == "openai":
        return ModelSize(role, spec.label, {}, "no device memory")
    params, source = _header_params(spec.model, online=online)
    if params is None:
        table = KNOWN_PARAMS.get(spec_key(spec))
        params, source = ({k: int(v * 1e9) for k, v in table.items()}, "table") if table else ({}, "unknown")
    components = {k: n * per for k, n in params.items()}
    captioner = spec.options.get("caption_model") if spec.backend == "blip_vqa" else None
    if captioner:
        extra = model_size(ModelSpec("blip_vqa", str(captioner)), role, device, online=online)
        components["captioner"] = extra.bytes
    return ModelSize(role, spec.label, components, source)


def estimate_bytes(spec: ModelSpec, device: str) -> int:
    """Returns the bytes `spec` will take on `device` (0 when unknown); what the model manager
    checks against its budget before loading."""
    return model_size(spec, device=device).bytes


def generation_working_bytes(spec: ModelSpec) -> int:
    lowered = spec.model.lower()
    gb = next((v for k, v in GENERATION_WORKING_GB.items() if k in lowered), DEFAULT_GENERATION_WORKING_GB)
    return int(gb * GB) if spec.backend == "diffusers" else 0


def plan(preset, gpu_memory_gb: float | None = None, *, budget_bytes: int | None = None,
         device: str = "cuda", online: bool = False) -> Plan:
    """Returns the memory plan of `preset` (a Preset) on a device with `gpu_memory_gb` of memory
    (budget = that minus device.CUDA_RESERVE_BYTES), or with an explicit `budget_bytes`.

    The strategy is the first of resident, evict, offload whose peak fits the budget (offload when
    none does, with fits=False). Without any budget the plan says what each strategy needs."""
    from .device import CUDA_RESERVE_BYTES

    if budget_bytes is None and gpu_memory_gb:
        budget_bytes = max(int(gpu_memory_gb * GB) - CUDA_RESERVE_BYTES, int(gpu_memory_gb * GB) // 2)
    sizes = {role: model_size(spec, role, device, online=online) for role, spec in preset.specs().items()}
    work = {"generation": generation_working_bytes(preset.generator),
            "evaluation": int(EVAL_WORKING_GB * GB) if sizes["vqa"].bytes else 0,
            "llm": int(EVAL_WORKING_GB * GB) if sizes["llm"].bytes else 0}
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
    return Plan(preset=preset.name, gpu_memory_gb=gpu_memory_gb,
                budget_gb=None if budget_bytes is None else _gb(budget_bytes),
                strategy=strategy, peak_gb=_gb(peaks[strategy]), fits=fits,
                needs_gb={k: _gb(v) for k, v in peaks.items()}, models=models,
                stages={k: _gb(v) for k, v in stage_bytes.items()})


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
    return "\n".join(lines)


def _gb(n: int) -> float:
    return round(n / GB, 2)


# -- safetensors headers ---------------------------------------------------------------------------
_DTYPE_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1,
                "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


def _header_params(model: str, *, online: bool) -> tuple[dict[str, int] | None, str]:
    """Returns ({component: parameter count}, source) read from safetensors headers, or (None, "")."""
    local = Path(model).expanduser()
    if local.is_dir():
        params = _params_in_folder(local)
        return (params, "safetensors header (local)") if params else (None, "")
    from .device import cached_snapshot

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


def _pick_weight_files(names: list[str]) -> list[str]:
    """One weights variant per folder: the fp16 variant when a folder has it (same tensors, half the
    bytes to read), never both."""
    by_folder: dict[str, list[str]] = {}
    for name in names:
        if name.endswith(".safetensors"):
            by_folder.setdefault(os.path.dirname(name), []).append(name)
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
    """{component: parameters} from the headers of the folder's weights; {} when any header cannot be
    read (on ZeroGPU `spaces` removes the weights it packed from the hub cache, leaving dangling links)."""
    names = [p.relative_to(folder).as_posix() for p in folder.rglob("*.safetensors")]
    params: dict[str, int] = {}
    for name in _pick_weight_files(names):
        try:
            with open(folder / name, "rb") as f:
                length = struct.unpack("<Q", f.read(8))[0]
                header = json.loads(f.read(length))
        except (OSError, ValueError, struct.error):
            return {}
        count = sum(_numel(v["shape"]) for k, v in header.items() if k != "__metadata__")
        params[_component(name)] = params.get(_component(name), 0) + count
    return params


def _params_on_hub(model: str) -> dict[str, int]:
    from huggingface_hub import HfApi

    api = HfApi()
    files = _pick_weight_files(api.list_repo_files(model))
    if files and all("/" not in f for f in files):  # a transformers repo: one call reads every shard's header
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
