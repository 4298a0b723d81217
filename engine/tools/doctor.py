"""`python -m engine doctor`: is this machine ready for a real preset? One row per check, each with a
verdict and what to do:

torch/device, memory against the plan (engine.models.plan), hub reachability and token, the preset's
weights in the local Hugging Face cache, WordNet; and, only where every weight is cached, a short
self-test on a real photo shipped with scikit-image (the astronaut, Eileen Collins): the VQA model
must answer that the person is a woman, the embedder must rank "a photo of an astronaut" first among
unrelated captions, and the generator must make one non-blank image.

Nothing here raises: each check catches its own failure and reports it as a row.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from ..backends import uses_device
from ..backends.device import hub_offline
from ..backends.base import ModelSpec
from ..models.presets import REAL_PRESET_ORDER, Preset, hub_files, is_cached, resolve_preset

CLIP_CAPTIONS = ["a photo of an astronaut", "a photo of a cat", "a photo of a city street at night",
                 "a bowl of fruit", "a page of printed text"]


@dataclass
class Check:
    name: str
    status: str            # "pass" | "warn" | "fail" | "skip"
    detail: str
    fix: str = ""


def diagnose(preset: str | Preset = "auto", *, gpu_memory_gb: float | None = None, self_test: bool = True,
             device: str | None = None, **overrides) -> list[Check]:
    """Returns the checks for `preset` (a name or a Preset; "auto" means the smallest real preset,
    sd-turbo) in order. A preset without device models (the synthetic worlds, APIs, folders) needs no
    GPU, weights or hub: it is ready on any machine."""
    checks: list[Check] = []
    if isinstance(preset, str):
        preset, _ = resolve_preset(REAL_PRESET_ORDER[0] if preset == "auto" else preset, **overrides)
    if not any(uses_device(s) for s in preset.specs().values()):
        wordnet = _guard("wordnet", _check_wordnet)
        wordnet.status = "warn" if wordnet.status == "fail" else wordnet.status   # synonyms only, not readiness
        return [Check("models", "pass", f"preset {preset.name} loads no model onto a device: it needs no GPU, "
                      "no weights and no hub, so it runs on any machine"), wordnet]
    device_check, device = _check_torch(device)
    checks.append(device_check)
    checks.append(_guard("memory", lambda: _check_memory(preset, device, gpu_memory_gb)))
    missing = _missing_weights(preset)
    hub_check, token_check, reachable = _check_hub(preset, cached=not missing)
    checks += [hub_check, token_check]
    weights_check, all_cached = _check_weights(preset, missing, reachable)
    checks.append(weights_check)
    checks.append(_guard("wordnet", _check_wordnet))
    if not self_test:
        checks.append(Check("self-test", "skip", "skipped (--no-self-test)"))
    elif not all_cached:
        checks.append(Check("self-test", "skip", "weights not in the local cache, so no model was run",
                            "download the weights (see 'weights'), then run doctor again"))
    else:
        checks += run_self_test(preset, device)
    return checks


def format_table(checks: list[Check]) -> str:
    """Returns the checks as a plain-text table with a verdict line."""
    width = max(len(c.name) for c in checks)
    lines = [f"{'check':<{width}}  result  detail", f"{'-' * width}  ------  ------"]
    for c in checks:
        lines.append(f"{c.name:<{width}}  {c.status.upper():<6}  {c.detail}")
        if c.fix and c.status in ("fail", "warn", "skip"):
            first, *more = c.fix.splitlines()
            lines.append(f"{'':<{width}}          what to do: {first}")
            lines += [f"{'':<{width}}            {line}" for line in more]   # e.g. one download command a line
    failed = [c.name for c in checks if c.status == "fail"]
    lines.append("")
    lines.append("verdict: " + ("ready" if not failed else f"not ready ({', '.join(failed)} failed)"))
    return "\n".join(lines)


def _guard(name: str, fn) -> Check:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a check that breaks is a failed check, never a traceback
        return Check(name, "fail", f"the check itself failed: {type(exc).__name__}: {exc}")


def _check_torch(device: str | None) -> tuple[Check, str]:
    try:
        import torch

        from ..backends.device import _supports_bf16, pick_device

        device = pick_device(device)
    except Exception as exc:  # noqa: BLE001
        return Check("torch/device", "fail", f"{type(exc).__name__}: {exc}",
                     "pip install -r requirements.txt (torch and torchvision as a matching pair)"), "cpu"
    if device.startswith("cuda"):
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        bf16 = "native bf16" if _supports_bf16(device) else "no native bf16 (fp16 is used)"
        return Check("torch/device", "pass", f"torch {torch.__version__}, CUDA {torch.version.cuda}: "
                     f"{props.name}, {props.total_memory / 2**30:.1f} GB, {bf16}"), device
    if device == "mps":
        return Check("torch/device", "pass", f"torch {torch.__version__}, Apple MPS"), device
    return Check("torch/device", "warn", f"torch {torch.__version__}, no GPU (CPU only)",
                 "real presets run very slowly on a CPU: use a CUDA or Apple GPU, or the synthetic preset"), device


def _check_memory(preset: Preset, device: str, gpu_memory_gb: float | None) -> Check:
    from ..backends.device import DeviceMemory, default_budget_bytes
    from ..models.plan import plan

    if gpu_memory_gb:
        result = plan(preset, gpu_memory_gb)
        where = f"a {gpu_memory_gb:g} GB GPU"
    else:
        total = DeviceMemory().total_bytes(device)
        result = plan(preset, round(total / 2**30, 1) if total else None,
                      budget_bytes=default_budget_bytes(device), device=device,
                      bf16=DeviceMemory().native_bf16(device))
        where = f"{device} ({result.gpu_memory_gb} GB)" if total else device
    detail = (f"preset {preset.name} on {where}: strategy {result.strategy}, peak {result.peak_gb:.1f} GB "
              f"of a {result.budget_gb} GB budget")
    if result.fits:
        return Check("memory", "pass", detail)
    return Check("memory", "fail", detail + f"; it needs at least {result.needs_gb['offload']:.1f} GB",
                 result.verdict + " (python -m engine plan --preset NAME --gpu-memory GB)")


def _check_hub(preset: Preset, cached: bool) -> tuple[Check, Check, bool]:
    """Returns (reachability, token, reachable?); offline (HF_HUB_OFFLINE=1) passes when every weight
    is `cached`."""
    try:
        from huggingface_hub import get_token
    except ImportError:
        missing = Check("hub", "fail", "huggingface_hub is not installed", "pip install -r requirements.txt")
        return missing, Check("token", "skip", "huggingface_hub is not installed"), False
    token = get_token()
    token_check = Check("token", "pass" if token else "warn",
                        "a Hugging Face token is set" if token else "no Hugging Face token (HF_TOKEN) is set",
                        "" if token else "needed only for gated models such as FLUX.1-schnell: accept the licence "
                        "on the model page, then set HF_TOKEN")
    if hub_offline() and cached:
        return (Check("hub", "pass", "the hub is switched off (HF_HUB_OFFLINE=1) and every weight is in the local "
                      "cache, so none is needed"), token_check, False)
    if hub_offline():
        return (Check("hub", "fail", "the hub is switched off (HF_HUB_OFFLINE=1): only cached weights can be used",
                      "unset HF_HUB_OFFLINE on a machine with internet access, or copy the weights into the cache"),
                token_check, False)
    repo = hub_files(preset.generator)[0] if hub_files(preset.generator) else preset.generator.model
    try:
        from huggingface_hub import HfApi

        HfApi().model_info(repo, timeout=5, token=token)
    except Exception as exc:  # noqa: BLE001
        from ..backends import hub_access_problem

        gated = hub_access_problem(exc, repo)
        if gated:
            token_check = Check("token", "fail", gated, "accept the licence, then set HF_TOKEN")
            return Check("hub", "pass", "the hub answered (the generator is gated)"), token_check, True
        return (Check("hub", "fail", f"the hub is not reachable ({type(exc).__name__})",
                      "check the network or proxy (HF_ENDPOINT), or pre-download the weights and set HF_HUB_OFFLINE=1"),
                token_check, False)
    return Check("hub", "pass", f"the hub is reachable ({repo} answered)"), token_check, True


def _preset_weights(preset: Preset) -> list[ModelSpec]:
    """The preset's device models, its BLIP captioner included."""
    specs = [s for s in preset.specs().values() if uses_device(s)]
    captioner = preset.vqa.options.get("caption_model") if preset.vqa.backend == "blip_vqa" else None
    if captioner:
        specs.append(ModelSpec("blip_vqa", str(captioner)))
    return [s for s in specs if hub_files(s) is not None]   # API, synthetic and bundled models need no download


def _missing_weights(preset: Preset) -> list[ModelSpec]:
    return [s for s in _preset_weights(preset) if not is_cached(s)]


def _check_weights(preset: Preset, missing: list[ModelSpec], reachable: bool) -> tuple[Check, bool]:
    from ..models.plan import model_size

    if not missing:
        return Check("weights", "pass", f"all {len(_preset_weights(preset))} hub models of {preset.name} are in "
                     "the local cache"), True
    gb = sum(model_size(s).bytes for s in missing) / 2**30  # what loads: fp16 files, open_clip's fp32 ones
    names = ", ".join(hub_files(s)[0] for s in missing)  # open_clip: the repo holding its weights
    commands = "\n".join(download_command(s, *_listing(s) if reachable else (None, None)) for s in missing)
    if reachable:
        return Check("weights", "warn", f"not in the local cache: {names} (about {gb:.0f} GB to download)",
                     f"they download on first use; to fetch only the files that load, now:\n{commands}"), False
    return Check("weights", "fail", f"not in the local cache and the hub is not reachable: {names}",
                 "on a connected machine, fetch the files that load, then copy ~/.cache/huggingface/hub here "
                 f"(with the hub reachable, doctor lists them exactly):\n{commands}"), False


def _listing(spec: ModelSpec) -> tuple[list[str] | None, dict | None]:
    """Returns (the repository's file names, its model_index.json or None) from the hub; (None, None)
    when they cannot be read."""
    import json
    from pathlib import Path

    repo = hub_files(spec)[0]
    try:
        from huggingface_hub import HfApi, hf_hub_download

        files = HfApi().list_repo_files(repo)
        index = json.loads(Path(hf_hub_download(repo, "model_index.json")).read_text()) \
            if "model_index.json" in files else None
        return files, index
    except Exception:  # noqa: BLE001 - unreachable or gated: the generic patterns below
        return None, None


# Small files a load reads beside the weights: configs, tokenizer vocabularies and merges, sentencepiece models.
CONFIG_PATTERNS = ("*.json", "*.txt", "*.model")


def download_command(spec: ModelSpec, files: list[str] | None = None, model_index: dict | None = None) -> str:
    """Returns the `hf download` command that fetches only the files loading `spec` reads, from the
    repository's file list and model_index.json when known: for a diffusers pipeline the folders
    model_index.json names (never the single-file checkpoints at the root), one weights variant each
    (fp16 where the folder has it); for a transformers model its root configs and safetensors; for
    open_clip its one weights file (a repository without safetensors: its PyTorch .bin weights).
    Without a file list, patterns that still skip root checkpoints and other formats (.bin, .onnx,
    .msgpack, .h5), at the cost of both weight variants."""
    from ..models.plan import loaded_weight_files, pipeline_folders

    repo, names = hub_files(spec)
    if spec.backend == "open_clip":
        return f"hf download {repo} " + next((n for n in names if files is None or n in files), names[0])
    includes, excludes = [], []
    if spec.backend == "diffusers" and files is not None and model_index is not None:
        weights = loaded_weight_files(files, model_index)
        includes.append("model_index.json")
        for folder in pipeline_folders(model_index):
            includes += [f"{folder}/{p}" for p in CONFIG_PATTERNS]
            chosen = [w for w in weights if w.startswith(folder + "/")]
            if chosen:
                includes.append(f"{folder}/*.fp16*.safetensors" if all(".fp16" in w for w in chosen)
                                else f"{folder}/*.safetensors")
    elif spec.backend == "diffusers":
        includes = ["model_index.json"] + [f"*/{p}" for p in CONFIG_PATTERNS + ("*.safetensors",)]
    else:
        weights = (loaded_weight_files(files) or ["pytorch_model*.bin"]) if files is not None else ["*.safetensors"]
        includes = list(CONFIG_PATTERNS) + weights
        excludes = ["*/*"]   # root files only: fnmatch's * crosses folders
    return " ".join([f"hf download {repo}"] + [f'--include "{p}"' for p in includes]
                    + [f'--exclude "{p}"' for p in excludes])


def _check_wordnet() -> Check:
    from ..metrics.wordnet import DEFAULT_WORDNET_DIR, load_wordnet

    if load_wordnet() is None:
        return Check("wordnet", "fail", f"no WordNet database in {DEFAULT_WORDNET_DIR} (TIBET merges synonyms with it)",
                     "apt-get install wordnet-base (on a Space: packages.txt lists it)")
    return Check("wordnet", "pass", f"WordNet found in {DEFAULT_WORDNET_DIR}")


def run_self_test(preset: Preset, device: str) -> list[Check]:
    """Runs the preset's models on the scikit-image astronaut photo; one row per model."""
    try:
        from PIL import Image
        from skimage import data as skdata

        photo = Image.fromarray(skdata.astronaut())
    except ImportError:
        return [Check("self-test", "skip", "scikit-image is not installed", "pip install scikit-image")]
    from ..models.manager import ModelManager

    manager = ModelManager(device)
    rows = []

    def timed(name, fn):
        start = time.perf_counter()
        try:
            status, detail = fn()
        except Exception as exc:  # noqa: BLE001 - a model that fails to load or run is a failed row
            status, detail = "fail", f"{type(exc).__name__}: {exc}"
        rows.append(Check(name, status, f"{detail} ({time.perf_counter() - start:.1f} s)",
                          "" if status == "pass" else "see the detail; `python -m engine status` shows the models"))

    def vqa():
        with manager.use(preset.vqa, **_vqa_context(manager, preset)) as model:
            answer = model.answer([photo], "what is the gender of the person?", ["man", "woman"])[0]
        return ("pass" if answer == "woman" else "fail"), f"VQA on the astronaut photo answered '{answer}' (expected woman)"

    def clip():
        import numpy as np

        with manager.use(preset.embedder) as model:
            scores = model.embed_texts(CLIP_CAPTIONS) @ model.embed_images([photo])[0]
        best = CLIP_CAPTIONS[int(np.argmax(scores))]
        return ("pass" if best == CLIP_CAPTIONS[0] else "fail"), f"the embedder ranked '{best}' first"

    def generation():
        import numpy as np

        with manager.use(preset.generator) as model:
            settings = model.defaults().replace(steps=min(4, model.defaults().steps))  # a smoke test, not art
            image = model.generate("a photo of an astronaut", [0], settings)[0].image
        spread = float(np.asarray(image.convert("L"), np.float32).std())
        return ("pass" if spread > 2 else "fail"), (f"one {settings.width}x{settings.height} image in {settings.steps} "
                                                    f"step(s), pixel spread {spread:.1f}")

    timed("self-test vqa", vqa)
    manager.unload()
    timed("self-test clip", clip)
    manager.unload()
    timed("self-test generation", generation)
    manager.unload()
    return rows


def _vqa_context(manager, preset: Preset) -> dict:
    return {"embedder": manager.get(preset.embedder)} if preset.vqa.backend == "clip_vqa" else {}

