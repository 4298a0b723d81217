"""ImageGenerator over diffusers text-to-image pipelines (backend "diffusers").

`spec.model` is a hub id, a local directory holding a `model_index.json`, or a single-file checkpoint
(a local .safetensors/.ckpt, or a hub file's URL: `from_single_file`). LoRAs and textual-inversion
embeddings load on top (spec options "lora" and "textual_inversion", typed 'BASE+lora=REPO@0.8+ti=PATH':
engine/backends/adapters.py) and the id names each with its version and scale. The family is read
from the pipeline class named in `model_index.json` and refined from the loaded components and
the id (a "turbo" id, SD 2.x cross-attention width, FLUX guidance embedding):

| family     | pipeline                                | size              | steps | guidance | batch (GPU) |
|------------|-----------------------------------------|-------------------|-------|----------|-------------|
| sd1        | StableDiffusionPipeline                 | 512               | 30    | 7.5      | 4           |
| sd2        | StableDiffusionPipeline                 | 768 (v), 512 base | 30    | 7.5      | 4           |
| sd-turbo   | StableDiffusionPipeline, "turbo" id     | 512               | 1     | 0.0      | 4           |
| sdxl       | StableDiffusionXLPipeline               | 1024              | 30    | 5.0      | 2           |
| sdxl-turbo | StableDiffusionXLPipeline, "turbo" id   | 512               | 1     | 0.0      | 4           |
| sd3        | StableDiffusion3Pipeline                | 1024              | 28    | 7.0      | 2           |
| flux       | FluxPipeline (schnell)                  | 1024              | 4     | 0.0      | 2           |
| flux       | FluxPipeline (dev: guidance-distilled)  | 1024              | 28    | 3.5      | 2           |
| hunyuandit | HunyuanDiTPipeline (Chinese and English) | 1024             | 50    | 5.0      | 2           |

Hunyuan-DiT was trained at 1024², 1280² and the 4:3, 3:4, 16:9 and 9:16 shapes of that area; other
sizes (multiples of 16) are drawn as asked, not snapped to the nearest of those as its pipeline would.

For sd1/sd2 the size is the UNet's native one (sample_size x VAE scale factor), which tells
SD 2.x 768 models from their 512 "base" versions and fits fine-tunes at other resolutions.

Options (`spec.options`):
  dtype                "fp16" | "bf16" | "fp32" | "auto" (default: fp16 on GPU, bf16 for sd3/flux, fp32 on CPU)
  revision             hub branch, tag or commit (default "main"); variant: weights variant, e.g. "fp16"
  batch_size           images per pipeline call (default from the table; on CPU 8 for tiny
                       models, under 50M denoiser parameters, else 1)
  scheduler            default scheduler name: an alias (ddim, pndm, lms, euler, euler_a, heun,
                       dpm++_2m, dpm++_2m_karras, unipc) or a diffusers scheduler class name
  steps, guidance, width, height, size   override the family defaults
  negative_prompt      default negative prompt (used only when guidance > 1; never for flux)
  max_sequence_length  T5 prompt length for sd3/flux (default 256 for schnell/sd3, 512 for dev)
  enable_cpu_offload   True: move each component to the GPU only while it runs (low VRAM);
                       "sequential": one layer at a time (lowest VRAM, several times slower);
                       "auto" (default): model offload only when the weights exceed 85% of free
                       GPU memory (the model manager also turns it on, see engine.models.manager)
  storage_dtype        "fp8": keep the denoiser's (unet/transformer) weights in float8 and compute in
                       the run dtype, layer by layer (diffusers' layerwise casting; half the memory
                       of bf16, a small loss of quality); part of the model's identity
  safety_checker       True (default): if the repository ships a safety checker, flag NSFW
                       images (GeneratedImage.nsfw) without altering them; False: skip the check
  generator_device     where per-image noise is drawn (default "cpu", see below)
  family               force a family from the table when detection is wrong
  token, cache_dir     passed to the hub download
  lora, textual_inversion   adapters (engine/backends/adapters.py); fuse_lora: True (default) fuses the
                       LoRAs into the base weights and drops their layers, False keeps them as PEFT layers
  config               a single-file checkpoint's component configs: a diffusers folder or hub repository
                       of the same architecture (default: the one diffusers infers from the keys; offline,
                       give a local folder)

Seeds: every image has its own torch.Generator, so image i depends only on (prompt, seeds[i],
settings) and can be regenerated alone. Noise is drawn on the CPU by default, which makes a
seed mean the same starting noise on every machine (a CUDA generator gives different noise
than a CPU one for the same seed); `generator_device="cuda"` changes that and the model id.
"""
from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from ..common.errors import InputError, ModelLoadError, OutOfMemoryError
from . import adapters
from . import device as devices
from .base import GeneratedImage, GenerationSettings, ModelSpec

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class FamilyDefaults:
    size: int
    steps: int
    guidance: float
    gpu_batch_size: int
    negative_prompt_ok: bool = True


FAMILY_DEFAULTS: dict[str, FamilyDefaults] = {
    "sd1": FamilyDefaults(512, 30, 7.5, 4),
    "sd2": FamilyDefaults(512, 30, 7.5, 4),
    "sd-turbo": FamilyDefaults(512, 1, 0.0, 4),
    "sdxl": FamilyDefaults(1024, 30, 5.0, 2),
    "sdxl-turbo": FamilyDefaults(512, 1, 0.0, 4),
    "sd3": FamilyDefaults(1024, 28, 7.0, 2),
    "flux": FamilyDefaults(1024, 4, 0.0, 2, negative_prompt_ok=False),   # FLUX.1-schnell
    "flux-dev": FamilyDefaults(1024, 28, 3.5, 2, negative_prompt_ok=False),
    "hunyuandit": FamilyDefaults(1024, 50, 5.0, 2),   # Hunyuan-DiT: bilingual CLIP + mT5 (engine/models/languages.py)
}

SCHEDULER_ALIASES: dict[str, tuple[str, dict]] = {
    "ddim": ("DDIMScheduler", {}),
    "pndm": ("PNDMScheduler", {}),
    "lms": ("LMSDiscreteScheduler", {}),
    "euler": ("EulerDiscreteScheduler", {}),
    "euler_a": ("EulerAncestralDiscreteScheduler", {}),
    "heun": ("HeunDiscreteScheduler", {}),
    "dpm++_2m": ("DPMSolverMultistepScheduler", {}),
    "dpm++_2m_karras": ("DPMSolverMultistepScheduler", {"use_karras_sigmas": True}),
    "unipc": ("UniPCMultistepScheduler", {}),
}

# Denoisers below this size are test/benchmark models; on CPU they batch well.
_TINY_DENOISER_PARAMS = 50_000_000


def family_from_class_name(class_name: str, model: str) -> str:
    """Returns the coarse family for a `model_index.json` `_class_name` and a model id; sd1 vs sd2
    and the flux variant are refined after loading. Raises ModelLoadError for other pipelines."""
    lowered = model.lower()
    turbo = "turbo" in lowered
    if class_name.startswith("StableDiffusion3"):
        return "sd3"
    if class_name.startswith("Flux"):
        return "flux"
    if class_name.startswith("StableDiffusionXL"):
        return "sdxl-turbo" if turbo else "sdxl"
    if class_name.startswith("StableDiffusion"):
        return "sd-turbo" if turbo else "sd1"
    if class_name.startswith("HunyuanDiT"):
        return "hunyuandit"
    raise ModelLoadError(
        f"'{model}' is a {class_name}, which GapLens does not support as a text-to-image generator; "
        f"supported: Stable Diffusion 1.x/2.x, SDXL, SD-Turbo, SDXL-Turbo, SD3, FLUX.1, Hunyuan-DiT "
        f"(set option family=... if the pipeline is compatible with one of them)")


def family_of(spec: ModelSpec) -> str:
    """Returns `spec`'s family without loading it: the `family` option, else from the pipeline class
    its model_index.json names (a local folder or the hub cache), else guessed from the id."""
    if spec.options.get("family") in FAMILY_DEFAULTS:
        return str(spec.options["family"])
    lowered = spec.model.lower()
    class_name = ("FluxPipeline" if "flux" in lowered else "StableDiffusion3Pipeline" if "stable-diffusion-3" in lowered
                  else "HunyuanDiTPipeline" if "hunyuandit" in lowered
                  else "StableDiffusionXLPipeline" if "xl" in lowered else "StableDiffusionPipeline")
    folder = Path(spec.model).expanduser() if Path(spec.model).expanduser().is_dir() else devices.cached_snapshot(spec.model)
    try:
        class_name = json.loads((folder / "model_index.json").read_text())["_class_name"]
    except (TypeError, OSError, ValueError, KeyError):
        pass   # not downloaded yet: the id's guess
    try:
        family = family_from_class_name(class_name, spec.model)
    except ModelLoadError:
        return "sd1"
    return "flux-dev" if family == "flux" and "dev" in lowered else family


def default_steps(spec: ModelSpec) -> int:
    """Returns the denoising steps a blank steps field means for `spec` (its `steps` option, else its
    family's default), without loading it."""
    try:
        return max(1, int(spec.options["steps"]))
    except (KeyError, TypeError, ValueError):
        return FAMILY_DEFAULTS[family_of(spec)].steps


def _load_safety_checker(folder: str, model_index: dict, device: str, dtype):
    """Returns (checker, feature_extractor) when the repository ships both, else (None, None)."""
    entries = [model_index.get("safety_checker"), model_index.get("feature_extractor")]
    if not all(isinstance(e, (list, tuple)) and e and e[0] is not None for e in entries):
        return None, None
    from diffusers.pipelines.stable_diffusion.safety_checker import StableDiffusionSafetyChecker
    from transformers import AutoImageProcessor

    # Its "a black image will be returned instead" warning is wrong here: we only read its verdict.
    logging.getLogger(StableDiffusionSafetyChecker.__module__).setLevel(logging.ERROR)
    variant = {"variant": "fp16"} if any(Path(folder, "safety_checker").glob("*.fp16.*")) else {}
    checker = StableDiffusionSafetyChecker.from_pretrained(folder, subfolder="safety_checker", dtype=dtype, **variant)
    feature_extractor = AutoImageProcessor.from_pretrained(folder, subfolder="feature_extractor")
    return checker.to(device).eval(), feature_extractor


class DiffusersGenerator:
    """A loaded diffusers pipeline behind the ImageGenerator protocol.

    Attributes: `id` (model@commit, or model@local-<hash> for a directory), `family`,
    `batch_size`, `offload` (None, "model", "sequential"), `pipe` (the diffusers pipeline, for
    callers that need more)."""

    def __init__(self, pipe, *, model_id: str, family: str, batch_size: int, device: str,
                 defaults: GenerationSettings, generator_device: str = "cpu",
                 max_sequence_length: int | None = None, safety_checker=None, feature_extractor=None,
                 offload: str | None = None):
        self.pipe = pipe
        self.offload = offload            # None, "model" or "sequential" CPU offload
        self.id = model_id
        self.family = "flux" if family == "flux-dev" else family
        self.batch_size = batch_size
        self.device = device
        self._family_key = family
        self._defaults = defaults
        self._generator_device = generator_device
        self._max_sequence_length = max_sequence_length
        self._safety_checker = safety_checker
        self._feature_extractor = feature_extractor
        self._default_scheduler = pipe.scheduler
        self._schedulers: dict[str, object] = {}

    def defaults(self) -> GenerationSettings:
        """Returns the family's steps, guidance, size and scheduler (after option overrides)."""
        return self._defaults

    @property
    def has_safety_checker(self) -> bool:
        return self._safety_checker is not None

    def memory_bytes(self) -> int:
        """Returns the bytes the weights take on the device: all of them (pipeline components and safety
        checker); with model CPU offload the largest component (one is on the device at a time); with
        sequential offload none between calls."""
        if self.offload == "sequential":
            return 0
        if self.offload == "model":
            return max((devices.module_bytes(m) for m in _pipeline_modules(self.pipe)), default=0)
        return devices.module_bytes(*_pipeline_modules(self.pipe), self._safety_checker)

    def move_to(self, device: str) -> bool:
        """Moves the pipeline (and safety checker) to `device`, e.g. "cpu" to park it in host RAM while
        evicted; False (nothing moved) for an offloaded pipeline, whose weights live on the CPU already."""
        if self.offload:
            return False
        # parking an fp16 pipeline in host RAM is intended: diffusers' "cannot run with cpu device" warning is not for it
        self.pipe.to(device, silence_dtype_warnings=str(device) == "cpu")
        if self._safety_checker is not None:
            self._safety_checker.to(device)
        self.device = device
        return True

    def generate(self, prompt: str, seeds: Sequence[int], settings: GenerationSettings) -> list[GeneratedImage]:
        """Runs one batched pipeline call. Returns one GeneratedImage per seed, in order.

        Raises InputError for an unusable size or scheduler and OutOfMemoryError when the
        device runs out of memory."""
        import torch

        seeds = [int(s) for s in seeds]
        if not seeds:
            return []
        self._check_size(settings)
        self.pipe.scheduler = self._scheduler(settings.scheduler)
        kwargs = dict(
            prompt=prompt, num_images_per_prompt=len(seeds), num_inference_steps=int(settings.steps),
            guidance_scale=float(settings.guidance), height=int(settings.height), width=int(settings.width),
            generator=[torch.Generator(self._generator_device).manual_seed(s) for s in seeds],
            output_type="pil")
        if settings.negative_prompt and settings.guidance > 1 and FAMILY_DEFAULTS[self._family_key].negative_prompt_ok:
            kwargs["negative_prompt"] = settings.negative_prompt
        if self._max_sequence_length and self.family in ("sd3", "flux"):
            kwargs["max_sequence_length"] = self._max_sequence_length
        if self.family == "hunyuandit":   # draw the size asked for (the pipeline would snap it to a trained shape)
            kwargs["use_resolution_binning"] = False
        try:
            with torch.inference_mode():   # the pipeline's own no_grad still tracks tensor versions; this does not
                images = self.pipe(**kwargs).images
            flags = self._flag_nsfw(images)
        except Exception as exc:
            if devices.is_oom(exc):
                devices.free_memory(self.device)
                remedy = {None: "or option enable_cpu_offload=True (one component on the GPU at a time)",
                          "model": "or, as model CPU offload is already on, option enable_cpu_offload=sequential "
                                   "or storage_dtype=fp8 (see `python -m engine plan`)",
                          "sequential": "(sequential CPU offload is already on)"}[self.offload]
                raise OutOfMemoryError(
                    f"{self.device} ran out of memory generating {len(seeds)} image(s) of "
                    f"{settings.width}x{settings.height} with {self.id}. Use a smaller batch size "
                    f"(now {self.batch_size}; option batch_size), a smaller image size, {remedy}.") from exc
            raise
        return [GeneratedImage(image=img, seed=seed, nsfw=flag) for img, seed, flag in zip(images, seeds, flags)]

    def _check_size(self, settings: GenerationSettings) -> None:
        # SD/SDXL pipelines check multiples of 8 whatever the VAE; SD3/FLUX/Hunyuan-DiT patchify latents 2x2.
        multiple = max(8, int(getattr(self.pipe, "vae_scale_factor", 8)))
        if self.family in ("sd3", "flux", "hunyuandit"):
            multiple *= 2
        for name in ("width", "height"):
            value = int(getattr(settings, name))
            if value <= 0 or value % multiple:
                raise InputError(f"{name} {value} is not usable with {self.family} models: "
                                 f"use a positive multiple of {multiple}")

    def _scheduler(self, name: str):
        """Returns the scheduler instance for a settings name ("default" keeps the pipeline's own)."""
        if not name or name == "default":
            return self._default_scheduler
        if name not in self._schedulers:
            import diffusers

            class_name, extra = SCHEDULER_ALIASES.get(name.lower(), (name, {}))
            compatible = {cls.__name__ for cls in self._default_scheduler.compatibles}
            scheduler_class = getattr(diffusers, class_name, None)
            if scheduler_class is None or class_name not in compatible:
                raise InputError(f"scheduler '{name}' does not work with {self.id}; compatible: "
                                 f"{', '.join(sorted(compatible))} (aliases: {', '.join(SCHEDULER_ALIASES)})")
            self._schedulers[name] = scheduler_class.from_config(self._default_scheduler.config, **extra)
        return self._schedulers[name]

    def _flag_nsfw(self, images) -> list[bool]:
        """Returns the safety checker's verdict per image; the images themselves are never changed."""
        if self._safety_checker is None:
            return [False] * len(images)
        import torch

        checker_device = next(self._safety_checker.parameters()).device
        checker_dtype = next(self._safety_checker.parameters()).dtype
        clip_input = self._feature_extractor(images=images, return_tensors="pt").pixel_values
        # The checker blacks out what it flags, in place: hand it a throwaway copy.
        scratch = np.stack([np.asarray(img, dtype=np.float32) / 255.0 for img in images])
        with torch.inference_mode():
            _, flags = self._safety_checker(images=scratch, clip_input=clip_input.to(checker_device, checker_dtype))
        flags = [bool(f) for f in flags]
        if any(flags):
            logger.info("%s: safety checker flagged %d of %d image(s) (kept, marked nsfw)",
                        self.id, sum(flags), len(flags))
        return flags


def _resolve_folder(model: str, options: dict) -> tuple[str, str | None]:
    """Returns (local folder holding model_index.json, hub commit or None), downloading hub models."""
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "model_index.json").is_file():
            raise ModelLoadError(f"'{model}' is a directory without model_index.json; "
                                 f"save the pipeline with save_pretrained() or give a hub id")
        return str(path), None
    if devices.looks_like_local_path(model) and not path.exists():
        raise ModelLoadError(f"no such model directory: '{model}'")
    from diffusers import DiffusionPipeline

    folder = DiffusionPipeline.download(
        model, revision=options.get("revision"), variant=options.get("variant"),
        token=options.get("token"), cache_dir=options.get("cache_dir"))
    return str(folder), devices.hub_commit_from_path(folder)


def _weight_files(model: str, options: dict) -> list[str]:
    """Returns the repository's file names (relative paths) without downloading weights: a local
    folder's files, else the cached snapshot's, else the hub's listing (empty when unreachable)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return [p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()]
    snapshot = devices.cached_snapshot(model)
    if snapshot is not None:
        return [p.relative_to(snapshot).as_posix() for p in snapshot.rglob("*") if p.is_file()]
    if devices.hub_offline():
        return []
    try:
        from huggingface_hub import HfApi

        return HfApi().list_repo_files(model, revision=options.get("revision"), token=options.get("token"))
    except Exception:  # noqa: BLE001 - the download that follows reports the real problem
        return []


def pick_variant(files: list[str], dtype_name: str) -> str | None:
    """Returns "fp16" when the denoiser (unet/ or transformer/) ships fp16 weights and the run is in half
    precision (half the download, same numbers), or when only the fp16 variant exists; else None."""
    denoiser = [f for f in files if f.split("/")[0] in ("unet", "transformer")
                and f.endswith((".safetensors", ".bin"))]
    has_fp16 = any(".fp16" in Path(f).name for f in denoiser)
    has_plain = any(Path(f).name.count(".") == 1 for f in denoiser)
    if has_fp16 and (dtype_name in ("float16", "bfloat16") or not has_plain):
        return "fp16"
    return None


def _refine_family(family: str, pipe, model: str) -> str:
    """Tells sd1 from sd2 (UNet cross-attention width 1024) and FLUX dev from schnell (guidance embedding)."""
    if family == "sd1" and getattr(pipe.unet.config, "cross_attention_dim", 768) == 1024:
        return "sd2"
    if family == "flux":
        lowered = model.lower()
        guidance_distilled = getattr(pipe.transformer.config, "guidance_embeds", False)
        if "schnell" not in lowered and ("dev" in lowered or guidance_distilled):
            return "flux-dev"
    return family


def _pipeline_modules(pipe) -> list:
    import torch

    return [c for c in pipe.components.values() if isinstance(c, torch.nn.Module)]


def _offload_mode(option, pipe, device: str, model: str) -> str | None:
    """Returns "model" (model CPU offload), "sequential" (sequential CPU offload) or None: as the
    option says (True, "sequential", False), or with "auto" (the default) model offload when the
    weights would take more than 85% of the GPU's free memory."""
    if not str(device).startswith("cuda"):
        return None  # accelerate's offload is for CUDA; MPS shares host memory anyway
    if str(option).lower() == "sequential":
        return "sequential"
    if option != "auto":
        return "model" if option and str(option).lower() not in ("false", "0", "no") else None
    if devices.on_zero_gpu():
        return None  # no CUDA call in the main process; the model manager's plan decides instead
    info = devices.memory_info(device)
    needed = devices.module_bytes(*_pipeline_modules(pipe))
    if info and needed > 0.85 * info["free"]:
        logger.warning("%s needs %s of weights but %s has %s free: enabling model CPU offload", model,
                       devices.format_bytes(needed), device, devices.format_bytes(info["free"]))
        return "model"
    return None


def _store_denoiser_in_fp8(pipe, option, compute_dtype) -> None:
    """With option storage_dtype=fp8, keeps the denoiser's weights in float8_e4m3fn and casts each
    layer to `compute_dtype` as it runs (diffusers' enable_layerwise_casting, which skips the
    precision-critical norm and embedding layers)."""
    if not option:
        return
    if not devices.stores_fp8({"storage_dtype": option}):
        raise InputError(f"storage_dtype '{option}' is not supported; use fp8 (or leave it unset)")
    import torch

    denoiser = getattr(pipe, "transformer", None) or getattr(pipe, "unet", None)
    denoiser.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=compute_dtype)


def _default_batch_size(family: str, pipe, device: str) -> int:
    if devices.is_accelerator(device):
        return FAMILY_DEFAULTS[family].gpu_batch_size
    denoiser = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
    n_params = sum(p.numel() for p in denoiser.parameters()) if denoiser is not None else 0
    return 8 if n_params < _TINY_DENOISER_PARAMS else 1


def _default_settings(family: str, pipe, options: dict) -> GenerationSettings:
    table = FAMILY_DEFAULTS[family]
    size = table.size
    if family in ("sd1", "sd2"):
        size = int(pipe.unet.config.sample_size) * int(pipe.vae_scale_factor)
    size = int(options.get("size", size))
    return GenerationSettings(
        steps=int(options.get("steps", table.steps)),
        guidance=float(options.get("guidance", table.guidance)),
        width=int(options.get("width", size)),
        height=int(options.get("height", size)),
        negative_prompt=str(options.get("negative_prompt", "")),
        scheduler=str(options.get("scheduler", "default")))


def load(spec: ModelSpec, device: str, **context) -> DiffusersGenerator:
    """Loads a diffusers text-to-image pipeline onto `device`. Returns a DiffusersGenerator.

    Raises ModelLoadError (naming the model) when the id or path cannot be resolved or the
    pipeline is not a supported family."""
    import torch
    from diffusers import AutoPipelineForText2Image, DiffusionPipeline

    options = dict(spec.options)
    try:   # malformed adapter options fail before any weight loads
        loras = adapters.adapters_of(options)
    except InputError as exc:
        raise ModelLoadError(str(exc)) from None
    if is_single_file(spec.model):
        return _finish(spec, options, *_load_single_file(spec.model, options, device), device, loras, context)
    if "variant" not in options:
        # The family (hence the dtype) is known only after model_index.json: half precision on any
        # accelerator, so decide on the fp16 variant from the device and the dtype option.
        half = devices.is_accelerator(device) and str(options.get("dtype", "auto")) not in ("fp32", "float32")
        options["variant"] = pick_variant(_weight_files(spec.model, options), "float16" if half else
                                          str(options.get("dtype", "float32")).replace("fp16", "float16"))
    folder, commit = _resolve_folder(spec.model, options)
    model_index = DiffusionPipeline.load_config(folder)
    family = options.get("family") or family_from_class_name(model_index.get("_class_name", "?"), spec.model)
    if family not in FAMILY_DEFAULTS:
        raise ModelLoadError(f"unknown family '{family}' for '{spec.model}'; known: {', '.join(FAMILY_DEFAULTS)}")
    dtype = devices.default_dtype(device, prefer_bf16=family.startswith(("sd3", "flux")), override=options.get("dtype"))

    load_kwargs = {"dtype": dtype}
    if options.get("variant"):
        load_kwargs["variant"] = options["variant"]
    if family in ("sd1", "sd2", "sd-turbo"):
        # Never black out images during generation; flagging happens separately below.
        load_kwargs.update(safety_checker=None, requires_safety_checker=False)
    pipe = AutoPipelineForText2Image.from_pretrained(folder, **load_kwargs)
    if not options.get("family"):
        family = _refine_family(family, pipe, spec.model)
    model_id = devices.model_identity(spec.model, revision=options.get("revision"), commit=commit)
    return _finish(spec, options, pipe, family, dtype, folder, model_index, model_id, device, loras, context)


def _finish(spec: ModelSpec, options: dict, pipe, family: str, dtype, folder: str | None, model_index: dict,
            model_id: str, device: str, loras: list, context: dict) -> "DiffusersGenerator":
    """The loaded pipeline `pipe` with its adapters, storage dtype and placement (offload or the device),
    its safety checker, and the DiffusersGenerator around it."""
    import torch

    # Adapters (LoRAs fused by default) load where the fuse is cheap: on the GPU once the pipeline is
    # there; before that (on the CPU, in the run dtype) when it will be stored in fp8 or offloaded, and on
    # ZeroGPU, whose main process never touches CUDA.
    early = not devices.is_accelerator(device) or devices.on_zero_gpu() or bool(options.get("storage_dtype"))
    fuse = str(options.get("fuse_lora", True)).lower() not in ("false", "0", "no")
    if not fuse and options.get("storage_dtype"):
        raise ModelLoadError("LoRAs kept unfused (fuse_lora=false) cannot be stored in fp8 (storage_dtype=fp8); "
                             "leave fuse_lora on")
    load_adapters = functools.partial(adapters.apply, pipe, loras, base=spec.model, family=family, fuse=fuse,
                                      token=options.get("token"), cache_dir=options.get("cache_dir"))
    if early:
        model_id += load_adapters()
    _store_denoiser_in_fp8(pipe, options.get("storage_dtype"), dtype)
    offload = _offload_mode(context.get("enable_cpu_offload", options.get("enable_cpu_offload", "auto")),
                            pipe, device, spec.model)
    if offload and not early:
        model_id, early = model_id + load_adapters(), True
    try:
        if offload == "sequential":
            pipe.enable_sequential_cpu_offload(device=device)
        elif offload == "model":
            pipe.enable_model_cpu_offload(device=device)
        else:
            pipe.to(device)
    except Exception as exc:
        if devices.is_oom(exc):
            devices.free_memory(device)
            size = devices.format_bytes(devices.module_bytes(*_pipeline_modules(pipe)))
            raise ModelLoadError(f"not enough {device} memory to load '{spec.model}' ({size} of weights in "
                                 f"{dtype}); try option enable_cpu_offload=True, enable_cpu_offload=sequential "
                                 f"or storage_dtype=fp8 (`python -m engine plan` says which fit)") from exc
        raise
    pipe.set_progress_bar_config(disable=True)
    if not early:
        model_id += load_adapters()

    checker = feature_extractor = None
    if options.get("safety_checker", True) and folder is not None:
        checker_device = "cpu" if offload else device
        checker_dtype = dtype if checker_device == device else torch.float32
        checker, feature_extractor = _load_safety_checker(folder, model_index, checker_device, checker_dtype)

    generator_device = str(options.get("generator_device", "cpu"))
    if generator_device != "cpu":
        model_id += f"+noise-{generator_device.split(':')[0]}"
    max_sequence_length = options.get("max_sequence_length")
    if max_sequence_length is None and family in ("sd3", "flux", "flux-dev"):
        max_sequence_length = 512 if family == "flux-dev" else 256

    generator = DiffusersGenerator(
        pipe, model_id=model_id, family=family, device=device,
        batch_size=int(options.get("batch_size") or _default_batch_size(family, pipe, device)),
        defaults=_default_settings(family, pipe, options), generator_device=generator_device,
        max_sequence_length=max_sequence_length, safety_checker=checker, feature_extractor=feature_extractor,
        offload=offload)
    generator._scheduler(generator.defaults().scheduler)  # an unknown default scheduler fails at load time
    generator.variant = options.get("variant")
    generator.adapters = [a.as_option() | {"kind": a.kind} for a in loras]
    logger.info("loaded %s as %s on %s (%s, batch %d)", generator.id, family, device, dtype, generator.batch_size)
    return generator


# -- single-file checkpoints (.safetensors / .ckpt) --------------------------------------------------

SINGLE_FILE_SUFFIXES = (".safetensors", ".ckpt")
# The pipeline class of each default config diffusers picks for a single-file checkpoint
# (diffusers.loaders.single_file_utils.DIFFUSERS_DEFAULT_PIPELINE_PATHS), by a word of its repository.
SINGLE_FILE_CLASSES = (("xl", "StableDiffusionXLPipeline"), ("stable-diffusion-3", "StableDiffusion3Pipeline"),
                       ("flux", "FluxPipeline"))


def is_single_file(model: str) -> bool:
    """Whether `model` names one checkpoint file (a local .safetensors/.ckpt, or a hub file's URL)."""
    return str(model).lower().split("?")[0].endswith(SINGLE_FILE_SUFFIXES) and not Path(model).expanduser().is_dir()


def _load_single_file(model: str, options: dict, device: str):
    """Loads a single-file checkpoint with the pipeline class's `from_single_file`: the components'
    configs come from option `config` (a diffusers folder or hub repository of the same architecture:
    offline, a local folder) or else the default diffusers infers from the checkpoint's keys. Returns
    (pipe, family, dtype, None, model_index {}, model id: the file with the sha256 of its bytes, or a hub
    file's commit)."""
    import diffusers
    from diffusers.loaders.single_file_utils import fetch_diffusers_config, load_single_file_checkpoint

    path = Path(model).expanduser()
    if devices.looks_like_local_path(model) and not path.is_file():
        raise ModelLoadError(f"no such checkpoint file: '{model}'")
    config = options.get("config")
    if config:
        folder = Path(str(config)).expanduser()
        index = folder / "model_index.json" if folder.is_dir() else None
        class_name = json.loads(index.read_text())["_class_name"] if index and index.is_file() else \
            diffusers.DiffusionPipeline.load_config(str(config))["_class_name"]
    else:
        checkpoint = load_single_file_checkpoint(model, local_files_only=devices.hub_offline())
        config = fetch_diffusers_config(checkpoint)["pretrained_model_name_or_path"]
        class_name = next((c for word, c in SINGLE_FILE_CLASSES if word in config.lower()), "StableDiffusionPipeline")
        del checkpoint
    family = options.get("family") or family_from_class_name(class_name, model)
    dtype = devices.default_dtype(device, prefer_bf16=family.startswith(("sd3", "flux")), override=options.get("dtype"))
    kwargs = {"safety_checker": None, "requires_safety_checker": False} if family in ("sd1", "sd2", "sd-turbo") else {}
    pipe = getattr(diffusers, class_name).from_single_file(model, config=str(config), dtype=dtype,
                                                          local_files_only=devices.hub_offline(), **kwargs)
    if not options.get("family"):
        family = _refine_family(family, pipe, model)
    if path.is_file():
        model_id = f"{model}@{adapters.file_version(path)}"
    else:
        model_id = devices.model_identity(model, revision=options.get("revision"))
    return pipe, family, dtype, None, {}, model_id
