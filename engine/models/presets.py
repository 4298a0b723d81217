"""Presets: a named full set of models (generator + embedder + LLM + VQA).

`auto` picks the first real preset whose models the local Hugging Face cache (or a reachable
hub) can serve, on a machine with a GPU, and the synthetic world otherwise, and says why.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from ..backends import adapters
from ..backends.base import ModelSpec
from ..backends.device import hub_offline
from ..common.errors import InputError

ASSETS = Path(__file__).resolve().parents[2] / "assets"
SYNTHETIC_TABLE = str(ASSETS / "synthetic_world.json")


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    generator: ModelSpec
    embedder: ModelSpec
    llm: ModelSpec
    vqa: ModelSpec

    def specs(self) -> dict[str, ModelSpec]:
        return {"generator": self.generator, "embedder": self.embedder, "llm": self.llm, "vqa": self.vqa}


CLIP_L14 = ModelSpec("hf_clip", "openai/clip-vit-large-patch14")

PRESETS: dict[str, Preset] = {p.name: p for p in [
    Preset("synthetic", "Offline synthetic world with planted, known biases (CPU, instant).",
           ModelSpec("synthetic_generator", SYNTHETIC_TABLE),
           ModelSpec("synthetic_embedder", SYNTHETIC_TABLE),
           ModelSpec("synthetic_llm", SYNTHETIC_TABLE),
           ModelSpec("synthetic_vqa", SYNTHETIC_TABLE)),
    Preset("colour", "MineTheGap's colour sanity task (spec A.6): solid-colour images of 30 objects with "
           "planted colour shares (CPU, instant).",
           ModelSpec("synthetic_colour_generator", SYNTHETIC_TABLE),
           ModelSpec("synthetic_colour_embedder", SYNTHETIC_TABLE),
           ModelSpec("synthetic_colour_llm", SYNTHETIC_TABLE),
           ModelSpec("synthetic_colour_vqa", SYNTHETIC_TABLE)),
    Preset("sd-turbo", "SD-Turbo, 1 step at 512x512: the small real set (runs on a CPU, slowly).",
           ModelSpec("diffusers", "stabilityai/sd-turbo"),
           ModelSpec("open_clip", "ViT-B-32", {"pretrained": "laion2b_s34b_b79k"}),
           # 1.5B, not 0.5B: the 0.5B model often breaks TIBET's JSON (issue 14); BLIP's VQA model
           # cannot caption, so Top-K gets BLIP's captioner.
           ModelSpec("hf_chat", "Qwen/Qwen2.5-1.5B-Instruct"),
           ModelSpec("blip_vqa", "Salesforce/blip-vqa-base",
                     {"caption_model": "Salesforce/blip-image-captioning-base"})),
    Preset("sd15", "Stable Diffusion 1.5, the family of the TIBET/BiasConnect papers.",
           ModelSpec("diffusers", "stable-diffusion-v1-5/stable-diffusion-v1-5"),
           CLIP_L14,
           ModelSpec("hf_chat", "Qwen/Qwen2.5-1.5B-Instruct"),
           ModelSpec("blip_vqa", "Salesforce/blip-vqa-capfilt-large",
                     {"caption_model": "Salesforce/blip-image-captioning-large"})),
    Preset("sdxl-turbo", "SDXL-Turbo, 1 step at 512x512, with a small VLM for VQA.",
           ModelSpec("diffusers", "stabilityai/sdxl-turbo"),
           CLIP_L14,
           ModelSpec("hf_chat", "Qwen/Qwen2.5-1.5B-Instruct"),
           ModelSpec("vlm", "Qwen/Qwen2-VL-2B-Instruct")),
    Preset("flux-schnell", "FLUX.1-schnell, 4 steps at 1024x1024 (MineTheGap's main model).",
           ModelSpec("diffusers", "black-forest-labs/FLUX.1-schnell"),
           CLIP_L14,
           ModelSpec("hf_chat", "Qwen/Qwen2.5-3B-Instruct"),
           ModelSpec("vlm", "Qwen/Qwen2.5-VL-3B-Instruct")),
    # issue 45: a generator that reads Chinese as well as English (engine/models/languages.py); its LLM
    # (Qwen2.5, 29 languages) translates prompts for the languages method; questions stay in English
    Preset("hunyuan-dit", "Hunyuan-DiT v1.2, 50 steps at 1024x1024: reads Chinese and English prompts (audits "
           "across languages).",
           ModelSpec("diffusers", "Tencent-Hunyuan/HunyuanDiT-v1.2-Diffusers"),
           CLIP_L14,
           ModelSpec("hf_chat", "Qwen/Qwen2.5-3B-Instruct"),
           ModelSpec("vlm", "Qwen/Qwen2-VL-2B-Instruct")),
]}

REAL_PRESET_ORDER = ["sd-turbo", "sd15", "sdxl-turbo", "flux-schnell"]
HUB_FILES = {"diffusers": "model_index.json", "open_clip": None, "hf_clip": "config.json",
             "hf_chat": "config.json", "blip_vqa": "config.json", "vlm": "config.json"}


def parse_model_override(text: str, role: str | None = None) -> ModelSpec:
    """'backend:model' (e.g. 'diffusers:/models/tiny-sd' or 'hf_chat:Qwen/Qwen2.5-0.5B-Instruct'; a
    backend of backends.DEFAULT_MODELS may leave the model out: 'faces:', 'distilled'; a diffusers generator may
    add LoRAs and embeddings: 'diffusers:BASE+lora=REPO@0.8,weight_name=FILE+ti=PATH', engine.backends.adapters).
    With `role`, the backend name is read as that role means it ('openai' is an images
    endpoint for the generator, a vision chat model for VQA; engine.backends.ROLE_ALIASES)."""
    from ..backends import DEFAULT_MODELS, backend_for_role
    from ..common.errors import ModelLoadError

    backend, sep, model = text.partition(":")
    default = DEFAULT_MODELS.get(backend.strip().replace("-", "_"))
    if not (sep or default) or not (model.strip() or default):
        raise InputError(f"model override '{text}' must look like 'backend:model-id-or-path'")
    try:
        backend = backend_for_role(backend, role)
    except ModelLoadError as exc:
        raise InputError(str(exc)) from None
    if adapters.has_adapters(model):   # 'diffusers:BASE+lora=REPO@0.8+ti=PATH' (engine/backends/adapters.py)
        if backend != "diffusers":
            raise InputError(f"'{text}': LoRAs and embeddings ('+lora=', '+ti=') load into diffusers generators only")
        base, options = adapters.parse_model(model)
        return ModelSpec(backend, base, options)
    return ModelSpec(backend, model.strip() or default)


# Option keys that would carry a credential: secrets come from the environment, never from
# options (options are part of the model's identity, stored with every run and artefact).
SECRET_WORDS = ("key", "token", "secret", "password", "authorization", "credential", "cookie")


def check_options(options: dict, role: str = "model") -> dict:
    """Returns `options` unchanged; InputError naming the key when one looks like a secret."""
    for key in options:
        if any(word in str(key).lower() for word in SECRET_WORDS):
            raise InputError(f"option '{key}' of the {role} looks like a secret; secrets are never options "
                             "(they would be stored with every run). Set it in the environment instead: "
                             "OPENAI_API_KEY / GAPLENS_GENERATOR_API_KEY / GAPLENS_VQA_API_KEY for OpenAI-compatible "
                             "servers, HF_TOKEN for Hugging Face")
    return options


def parse_options(items, role: str = "model") -> dict:
    """KEY=VALUE strings (or one text, a KEY=VALUE per line) -> {key: value}; a value that
    parses as JSON (numbers, true/false, lists) is read as JSON, anything else stays a string."""
    import json

    if isinstance(items, str):
        items = items.splitlines()
    options = {}
    for item in items or []:
        item = str(item).strip()
        if not item:
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise InputError(f"{role} option '{item}' must look like KEY=VALUE")
        try:
            options[key.strip()] = json.loads(value.strip())
        except ValueError:
            options[key.strip()] = value.strip()
    return check_options(options, role)


def resolve_preset(name: str = "auto", options: dict | None = None,
                   **overrides: str | ModelSpec | None) -> tuple[Preset, str]:
    """The preset to use and a sentence saying why. `overrides` replace single models (read
    as their role means them); `options` ({role: {key: value}}) are merged into each role's
    spec options (secrets refused, see check_options)."""
    if name == "auto":
        preset, reason = _auto_preset()
    elif name in PRESETS:
        preset, reason = PRESETS[name], f"preset '{name}' was requested"
    else:
        raise InputError(f"unknown preset '{name}'; choose one of: auto, {', '.join(PRESETS)}")
    changes = {k: (parse_model_override(v, k) if isinstance(v, str) else v)
               for k, v in overrides.items() if v}
    for role, extra in (options or {}).items():
        if extra:
            base = changes.get(role) or preset.specs()[role]
            changes[role] = ModelSpec(base.backend, base.model, {**base.options, **check_options(extra, role)})
    if changes:
        preset = replace(preset, name=f"{preset.name}+custom", **changes)
        reason += f"; overridden: {', '.join(f'{k}={v.label}' for k, v in changes.items())}"
    return preset, reason


def _auto_preset() -> tuple[Preset, str]:
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        has_gpu = False
    if not has_gpu:
        return PRESETS["synthetic"], "auto: no GPU found, so the synthetic world was picked"
    offline = hub_offline()
    for name in REAL_PRESET_ORDER:
        missing = [s.model for s in PRESETS[name].specs().values() if not _servable(s, offline)]
        if not missing:
            where = "the local Hugging Face cache" if offline else "the local cache or the hub"
            return PRESETS[name], f"auto: GPU found and {where} can serve every model of '{name}'"
    return PRESETS["synthetic"], ("auto: GPU found, but no real preset's models are in the local "
                                  "Hugging Face cache and the hub is not reachable; using the synthetic world")


def hub_files(spec: ModelSpec) -> tuple[str, list[str]] | None:
    """Returns (hub repo id, files any one of which shows the weights are cached) for a spec, or None
    when its weights do not come from the hub. open_clip keeps pretrained weights in the HF hub cache
    too, under the repo its pretrained config names (e.g. laion/CLIP-ViT-B-32-laion2B-s34B-b79K),
    as open_clip_model.safetensors or open_clip_pytorch_model.bin."""
    if spec.backend == "open_clip":
        if spec.model.startswith("hf-hub:"):
            return spec.model.removeprefix("hf-hub:"), ["open_clip_config.json"]
        try:
            import open_clip

            cfg = open_clip.get_pretrained_cfg(spec.model, spec.options.get("pretrained") or "")
        except Exception:  # noqa: BLE001 - open_clip missing or an unknown model: not servable from the hub
            return None
        repo = (cfg or {}).get("hf_hub", "").strip("/")
        if not repo:
            return None
        return repo, ["open_clip_model.safetensors", "open_clip_pytorch_model.bin"]
    filename = HUB_FILES.get(spec.backend)
    return (spec.model, [filename]) if filename else None


def is_cached(spec: ModelSpec) -> bool:
    """True when the local Hugging Face cache holds `spec`'s weights (or it is a local path)."""
    if Path(spec.model).expanduser().exists():
        return True
    found = hub_files(spec)
    if found is None:
        return False
    try:
        from huggingface_hub import try_to_load_from_cache

        return any(isinstance(try_to_load_from_cache(found[0], name), str) for name in found[1])
    except Exception:  # noqa: BLE001 - an id that is not a repo id
        return False


def _servable(spec: ModelSpec, offline: bool) -> bool:
    if is_cached(spec):
        return True
    found = hub_files(spec)
    if offline or found is None:
        return False
    try:
        from huggingface_hub import HfApi

        HfApi().model_info(found[0], timeout=3)
        return True
    except Exception:  # noqa: BLE001 - unreachable hub, gated repo, no package: not servable
        return False
