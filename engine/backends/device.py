"""Device, dtype, memory and model-identity helpers shared by the torch backends.

torch is imported inside the functions: the synthetic world and the metrics import the
engine without ever paying for torch.
"""
from __future__ import annotations

import gc
import hashlib
import os
import re
import warnings
from pathlib import Path

_DTYPE_NAMES = {
    "fp16": "float16", "float16": "float16", "half": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "fp32": "float32", "float32": "float32", "float": "float32",
}


def pick_device(preferred: str | None = None) -> str:
    """Returns a torch device string: `preferred` if given and usable, else "cuda", "mps" or "cpu"
    in that order of preference. `preferred` may be None, "auto", "cpu", "mps", "cuda" or "cuda:N".

    Raises ValueError when an explicitly requested accelerator is not available."""
    import torch

    if preferred in (None, "", "auto"):
        if torch.cuda.is_available():
            return "cuda"
        if torch.backends.mps.is_available():
            return "mps"
        return "cpu"
    kind = preferred.split(":")[0]
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"device '{preferred}' requested but CUDA is not available")
        index = int(preferred.split(":")[1]) if ":" in preferred else 0
        if index >= torch.cuda.device_count():
            raise ValueError(f"device '{preferred}' requested but only {torch.cuda.device_count()} "
                             f"CUDA device(s) exist")
        return preferred
    if kind == "mps":
        if not torch.backends.mps.is_available():
            raise ValueError("device 'mps' requested but MPS is not available")
        return "mps"
    if kind == "cpu":
        return "cpu"
    raise ValueError(f"unknown device '{preferred}'; use auto, cpu, mps, cuda or cuda:N")


def is_accelerator(device: str) -> bool:
    """True for GPU-like devices (cuda, mps), where half precision is the norm."""
    return str(device).split(":")[0] in ("cuda", "mps")


def parse_dtype(name):
    """Returns the torch dtype named by "fp16"/"float16"/"half", "bf16"/"bfloat16" or
    "fp32"/"float32" (a torch.dtype passes through). Raises ValueError otherwise."""
    import torch

    if isinstance(name, torch.dtype):
        return name
    key = _DTYPE_NAMES.get(str(name).lower().removeprefix("torch."))
    if key is None:
        raise ValueError(f"unknown dtype '{name}'; use fp16, bf16 or fp32")
    return getattr(torch, key)


def default_dtype(device: str, *, prefer_bf16: bool = False, override=None):
    """Returns the dtype to run a model in: `override` if given ("auto" counts as not given);
    float32 on CPU; on GPU bfloat16 when `prefer_bf16` and the device supports it, else float16."""
    import torch

    if override not in (None, "", "auto"):
        return parse_dtype(override)
    if not is_accelerator(device):
        return torch.float32
    if prefer_bf16 and _supports_bf16(device):
        return torch.bfloat16
    return torch.float16


# Models whose fp16 forward pass overflows into garbage (transformers issue #33294: Qwen2-VL in fp16
# "results in errors or gibberish output"): on a GPU without native bf16 (T4, V100) they run in fp32.
FP16_UNSTABLE_MODEL_TYPES = frozenset({"qwen2_vl", "qwen2_5_vl"})


def stores_fp8(options: dict) -> bool:
    """True when a diffusers generator's options ask for fp8 storage of its denoiser (storage_dtype=fp8)."""
    return str(options.get("storage_dtype", "")).lower() in ("fp8", "float8", "float8_e4m3fn")


def vlm_dtype(model_type: str, device: str, override=None):
    """Returns the dtype an image-text-to-text model of `model_type` runs in on `device`: as
    default_dtype (bf16 where native), except fp32 instead of fp16 for FP16_UNSTABLE_MODEL_TYPES."""
    import torch

    dtype = default_dtype(device, prefer_bf16=True, override=override)
    if dtype == torch.float16 and override in (None, "", "auto") and model_type in FP16_UNSTABLE_MODEL_TYPES:
        return torch.float32
    return dtype


def _supports_bf16(device: str) -> bool:
    """True when the device computes in bfloat16 natively (CUDA compute capability >= 8.0, Ampere on;
    MPS from macOS 14). torch.cuda.is_bf16_supported() also says True for emulated bf16 on older
    GPUs, which runs far slower than fp16: that is why it is called with including_emulation=False."""
    import torch

    if str(device).startswith("cuda"):
        if on_zero_gpu():
            return True  # ZeroGPU hands out A100/H200 (Ampere and later); no CUDA call in the main process
        index = torch.device(device).index
        if index is None:   # "cuda": the current device, the one is_bf16_supported asks about
            try:
                return bool(torch.cuda.is_bf16_supported(including_emulation=False))
            except TypeError:  # torch < 2.3 has no including_emulation
                index = 0
        # "cuda:N" (a job's rank): that GPU, whichever is current; native bf16 from Ampere (8.0) on
        return bool(torch.version.hip) or torch.cuda.get_device_capability(index)[0] >= 8
    # MPS has bfloat16 from macOS 14 on; torch reports it by allowing the allocation.
    try:
        torch.zeros(1, dtype=torch.bfloat16, device=device)
        return True
    except (RuntimeError, TypeError):
        return False


def hub_offline() -> bool:
    """Whether HF_HUB_OFFLINE forbids the hub (set, and not 0/false)."""
    return os.environ.get("HF_HUB_OFFLINE", "") not in ("", "0", "false", "False")


def on_zero_gpu() -> bool:
    """True on a Hugging Face ZeroGPU Space (SPACES_ZERO_GPU=true), where the main process must never
    initialise CUDA: a GPU is attached only inside @spaces.GPU functions."""
    return os.environ.get("SPACES_ZERO_GPU", "").lower() in ("1", "t", "true")


# ZeroGPU attaches a slice of an H200, an "H200 MIG 3g.71gb": 74,625,056,768 bytes = 69.5 GiB and 60 SMs
# (the `spaces` package's device defaults; the docs round it to "70GB per workload"). spaces 0.51 knows a
# second profile, an RTX PRO 6000 Blackwell (95 GiB, 188 SMs, its durations × 1.5, and above 45 GB of
# weights the "xlarge" size that counts twice against the quota): `zero_gpu_profile` reads the one in use.
ZERO_GPU_MEMORY_GB = 69.5
H200_PROFILE = {"model": "NVIDIA H200", "memory": 74625056768, "sm_major": 9, "sm_minor": 0, "sm_count": 60,
                "xlarge_threshold": None, "duration_factor": 1.0}


def zero_gpu_profile() -> dict:
    """Returns the ZeroGPU hardware profile the `spaces` package reports for this machine
    (spaces.zero.config.get_config: "model", "memory" bytes, "sm_count", "xlarge_threshold" bytes or
    None, "duration_factor"), read from the NVIDIA driver's files without initialising CUDA; the H200
    slice (H200_PROFILE) off ZeroGPU and where the package or its profiles are missing."""
    if not on_zero_gpu():   # elsewhere the package would look for the driver's files and warn
        return dict(H200_PROFILE)
    try:
        from spaces.zero.config import get_config
    except Exception:  # noqa: BLE001 - no spaces package, or an older one without profiles
        return dict(H200_PROFILE)
    try:
        with warnings.catch_warnings():   # unreadable driver files: the package warns and gives its default
            warnings.simplefilter("ignore")
            return {**H200_PROFILE, **get_config()}
    except Exception:  # noqa: BLE001 - a profile file it cannot read: the H200 slice
        return dict(H200_PROFILE)


def zero_gpu_memory_gb() -> float:
    """Returns the memory of the ZeroGPU profile in use, in GiB (69.5 on the H200 slice)."""
    return zero_gpu_profile()["memory"] / 2**30
# Kept free on a CUDA device for the CUDA context, cuBLAS/cuDNN workspaces and fragmentation.
CUDA_RESERVE_BYTES = int(1.5 * 2**30)
# Host RAM left free when evicted models are parked there (the OS, Python, images, the next load).
HOST_RESERVE_BYTES = 4 * 2**30


class DeviceMemory:
    """Reports a device's total memory and empties its cache. The model manager and the memory plan
    take one as a parameter, so tests inject a fake CUDA reporter instead of patching torch."""

    def total_bytes(self, device: str) -> int | None:
        """Returns the device's total memory in bytes (CUDA: the card; MPS: Metal's recommended maximum;
        CPU: physical RAM), or None when unknown."""
        kind = str(device).split(":")[0]
        if kind == "cuda":
            if on_zero_gpu():
                return int(zero_gpu_profile()["memory"])
            import torch

            index = torch.device(device).index or 0
            return int(torch.cuda.get_device_properties(index).total_memory)
        if kind == "mps":
            import torch

            return int(torch.mps.recommended_max_memory())
        try:
            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
        except (ValueError, OSError, AttributeError):
            return None

    def available_bytes(self, device: str = "cpu") -> int | None:
        """Returns the host RAM free for new allocations (Linux MemAvailable, else the free pages), or
        None when unknown; for a GPU device its free memory when CUDA reports it."""
        if str(device).split(":")[0] == "cuda" and not on_zero_gpu():
            info = memory_info(device)
            return int(info["free"]) if info else None
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES"))
        except (ValueError, OSError, AttributeError):
            return None

    def native_bf16(self, device: str) -> bool:
        """True when `device` computes bf16 natively (see _supports_bf16); False on the CPU."""
        return is_accelerator(device) and _supports_bf16(device)

    def empty_cache(self, device: str) -> None:
        """Collects garbage and returns cached blocks to the driver, so the next load can use them."""
        gc.collect()
        kind = str(device).split(":")[0]
        if kind in ("cuda", "mps") and not on_zero_gpu():
            import torch

            if kind == "cuda" and torch.cuda.is_available():
                torch.cuda.empty_cache()
            elif kind == "mps":
                torch.mps.empty_cache()


def default_budget_bytes(device: str, memory: DeviceMemory | None = None) -> int | None:
    """Returns the bytes of weights and activations the model manager may keep on `device`:
    CUDA total minus CUDA_RESERVE_BYTES; MPS its recommended maximum; CPU physical RAM minus a
    quarter (the OS, Python and the store's images need the rest). None when unknown."""
    total = (memory or DeviceMemory()).total_bytes(device)
    if not total:
        return None
    kind = str(device).split(":")[0]
    if kind == "cuda":
        return max(total - CUDA_RESERVE_BYTES, total // 2)
    if kind == "mps":
        return total
    return int(total * 0.75)


def memory_info(device: str) -> dict | None:
    """Returns {"total", "free", "allocated", "reserved"} in bytes for a CUDA device,
    {"allocated"} for MPS, and None for the CPU (host memory is not budgeted here)."""
    import torch

    if str(device).startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        free, total = torch.cuda.mem_get_info(index)
        return {"total": total, "free": free, "allocated": torch.cuda.memory_allocated(index),
                "reserved": torch.cuda.memory_reserved(index)}
    if str(device) == "mps" and torch.backends.mps.is_available():
        return {"allocated": torch.mps.current_allocated_memory()}
    return None


_OOM_MESSAGE = re.compile(r"out of memory|MPS backend out of memory|CUBLAS_STATUS_ALLOC_FAILED|"
                          r"CUDNN_STATUS_NOT_ENOUGH_WORKSPACE", re.IGNORECASE)


def is_oom(exc: BaseException) -> bool:
    """True if `exc` is a device out-of-memory error (CUDA, MPS, or a cuBLAS/cuDNN allocation failure)."""
    import torch

    oom_type = getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError
    if isinstance(exc, oom_type):
        return True
    return isinstance(exc, RuntimeError) and bool(_OOM_MESSAGE.search(str(exc)))


def free_memory(device: str | None = None) -> None:
    """Drops Python garbage and returns cached accelerator memory to the driver (after an OOM or an eviction)."""
    import torch

    gc.collect()
    if torch.cuda.is_available() and (device is None or str(device).startswith("cuda")):
        torch.cuda.empty_cache()
    if torch.backends.mps.is_available() and (device is None or str(device) == "mps"):
        torch.mps.empty_cache()


def weights_device(module):
    """Returns the torch device of `module`'s first parameter, where its inputs must go. On ZeroGPU that is
    the GPU `spaces` moved the weights to in its worker, whatever device string the model was loaded with."""
    return next(module.parameters()).device


def module_bytes(*modules) -> int:
    """Returns the bytes held by the parameters and buffers of torch modules (None entries are skipped);
    the model manager budgets memory with it."""
    seen, total = set(), 0
    for module in modules:
        if module is None:
            continue
        for tensor in list(module.parameters()) + list(module.buffers()):
            if id(tensor) not in seen:  # tied weights count once
                seen.add(id(tensor))
                total += tensor.numel() * tensor.element_size()
    return total


def format_bytes(n: int) -> str:
    """Returns n bytes as a short human string, e.g. "3.2 GB"."""
    for unit in ("B", "KB", "MB", "GB"):
        if abs(n) < 1024:
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return f"{n:.1f} TB"


_COMMIT = re.compile(r"[0-9a-f]{40}")


def model_identity(model: str, *, revision: str | None = None, commit: str | None = None) -> str:
    """Returns "model@version" for cache keys, so that two different weights never share a cached artefact.

    - A local directory or file: version is "local-" + a hash of its JSON configs' contents and
      every file's relative path, size and modification time (a retrained or edited local
      model gets a new id).
    - A hub id: version is the resolved commit hash when known, else the requested revision,
      else "main"."""
    path = Path(model).expanduser()
    if path.exists():
        return f"{model}@local-{fingerprint_path(path)}"
    if commit and _COMMIT.fullmatch(commit):
        return f"{model}@{commit}"
    return f"{model}@{revision or 'main'}"


def require_complete_weights(model: str, loading_info: dict, what: str) -> None:
    """Raises ModelLoadError when transformers' `output_loading_info` reports missing or mis-shaped
    weights: transformers would otherwise initialise them randomly and the model would answer
    nonsense without any error (e.g. a BLIP captioner loaded as a BLIP VQA model)."""
    from ..common.errors import ModelLoadError

    bad = sorted(loading_info.get("missing_keys") or []) + sorted(
        str(k[0] if isinstance(k, tuple) else k) for k in loading_info.get("mismatched_keys") or [])
    if bad:
        raise ModelLoadError(f"'{model}' is not a complete {what} checkpoint: {len(bad)} weight(s) missing or "
                             f"mis-shaped (e.g. {', '.join(bad[:3])}); is it the right kind of model?")


def looks_like_local_path(model: str) -> bool:
    """True when `model` is written as a filesystem path (absolute, ./, ../, ~, or a Windows drive)
    rather than a hub id such as "org/name", so a missing path gets a "no such path" message."""
    return (model.startswith(("/", "./", "../", "~", ".\\")) or bool(re.match(r"^[A-Za-z]:[\\/]", model))
            or model.count("/") > 1)


def fingerprint_path(path: str | Path) -> str:
    """Returns a 12-hex-digit hash of a file or directory tree: names, sizes, mtimes, and the full
    contents of small JSON files (configs such as model_index.json)."""
    path = Path(path).expanduser()
    digest = hashlib.sha1()
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for file in files:
        if any(part.startswith(".") for part in file.relative_to(path).parts):
            continue  # .cache/.git metadata changes without the weights changing
        stat = file.stat()
        rel = file.name if file == path else file.relative_to(path).as_posix()
        digest.update(f"{rel}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
        if file.suffix == ".json" and stat.st_size <= 1 << 20:
            digest.update(file.read_bytes())
    return digest.hexdigest()[:12]


def hub_commit(model: str, *, revision: str | None = None, cache_dir: str | None = None,
               filename: str = "config.json") -> str | None:
    """Returns the commit of the hub snapshot `from_pretrained` read `model` from: the cache folder
    that `filename` (at `revision`, default main) resolves to. None for a local path or a file
    that is not in the cache. transformers 5 no longer sets `config._commit_hash`, so this asks
    huggingface_hub's cache (`try_to_load_from_cache`) instead."""
    if Path(model).expanduser().exists():
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        path = try_to_load_from_cache(model, filename, cache_dir=cache_dir, revision=revision)
    except Exception:  # noqa: BLE001 - an id that is not a valid repo id: no commit
        return None
    return hub_commit_from_path(path) if isinstance(path, str) else None


def cached_snapshot(model: str) -> Path | None:
    """Returns the local hub-cache snapshot folder of `model` (the one refs/main points to), found by its
    model_index.json or config.json, or None when it is not cached (or not a repo id)."""
    try:
        from huggingface_hub import try_to_load_from_cache

        for name in ("model_index.json", "config.json"):
            path = try_to_load_from_cache(model, name)
            if isinstance(path, str):
                return Path(path).parent
    except Exception:  # noqa: BLE001 - not a repo id
        return None
    return None


def hub_commit_from_path(path: str | os.PathLike) -> str | None:
    """Returns the commit hash of a hub cache snapshot folder (".../snapshots/<commit>/..."), or None."""
    parts = Path(path).parts
    for i, part in enumerate(parts[:-1]):
        if part == "snapshots" and _COMMIT.fullmatch(parts[i + 1]):
            return parts[i + 1]
    return None
