"""The model manager: loads on first use, keeps models warm, evicts the least recently
used under a memory budget, and serialises access to each model.

A model's footprint is its weights plus, while it runs, its working memory (engine.models.plan:
activations, KV cache, the VAE decode): before a load or a call that would not fit, the least
recently used idle models leave the device. On a CUDA device an evicted model is parked in host
RAM (its weights moved to the CPU, `move_to`) when the host has room, so the next run moves it back
in a second instead of reading it from disk again; otherwise it is unloaded. A diffusers generator
whose weights and working memory exceed the whole budget runs with model CPU offload, and one that
would not fit even so is refused before loading, with the plan's sentence and the options that fit.

Gradio serves requests concurrently; a diffusers pipeline or a transformers model is not
safe to call from two threads at once, so every use of a backend goes through `use()`,
which holds that model's lock for the duration of one call.
"""
from __future__ import annotations

import gc
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field

from ..backends import load_backend
from ..backends.base import ModelSpec
from ..common.errors import ModelLoadError


@dataclass
class LoadedModel:
    spec: ModelSpec
    backend: object
    bytes: int
    load_seconds: float
    lock: threading.RLock = field(default_factory=threading.RLock)
    last_used: float = field(default_factory=time.time)
    users: int = 0  # calls in progress (or waiting for the lock): never evicted while > 0
    parked: bool = False  # evicted to host RAM: loaded, but not on the device


def _memory_bytes(backend) -> int:
    """The backend's own estimate when it has one, else 0 (synthetic backends)."""
    estimate = getattr(backend, "memory_bytes", None)
    try:
        return int(estimate() if callable(estimate) else (estimate or 0))
    except Exception:  # noqa: BLE001 - an estimate must never break a load
        return 0


class ModelManager:
    """Loads, keeps and evicts models. `budget_bytes` None means the device's default budget
    (engine.backends.device.default_budget_bytes), chosen with the first real load; 0 means no budget.
    `memory` reports device memory (engine.backends.device.DeviceMemory; tests pass a fake one)."""

    def __init__(self, device: str | None = None, budget_bytes: int | None = None, memory=None):
        self._device = device
        self._budget_bytes = budget_bytes
        self._memory = memory
        self._models: "OrderedDict[ModelSpec, LoadedModel]" = OrderedDict()
        self._load_lock = threading.RLock()
        self._pinned: set[ModelSpec] = set()

    def pin(self, spec: ModelSpec) -> None:
        """Keeps `spec` loaded across preset switches (`unload_except`) and comparisons
        (`unload_unpinned`); eviction may still take it."""
        self._pinned.add(spec)

    def holds(self, spec: ModelSpec) -> bool:
        """Whether `spec` is loaded or pinned (preloaded) here."""
        return spec in self._models or spec in self._pinned

    def unload_unpinned(self, spec: ModelSpec) -> list[str]:
        """Unloads `spec` unless it is pinned: a preloaded model stays (on ZeroGPU `spaces` removed its
        cached files when it packed its weights, so it could not be loaded again without the hub)."""
        return [] if spec in self._pinned else self.unload(spec)

    def unload_except(self, keep) -> list[str]:
        """Unloads every model that is neither in `keep` nor pinned. Returns the labels unloaded."""
        keep = set(keep) | self._pinned
        with self._load_lock:
            gone = [label for s in list(self._models) if s not in keep for label in self.unload(s)]
        return gone

    @property
    def device(self) -> str:
        if self._device is None:
            from ..backends.device import pick_device  # imports torch: only when a real model loads

            self._device = pick_device()
        return self._device

    @property
    def memory(self):
        if self._memory is None:
            from ..backends.device import DeviceMemory

            self._memory = DeviceMemory()
        return self._memory

    @property
    def budget_bytes(self) -> int | None:
        """Bytes the loaded models may take on the device; None while no real model has chosen the device."""
        if self._budget_bytes is None and self._device is not None:
            from ..backends.device import default_budget_bytes

            self._budget_bytes = default_budget_bytes(self._device, self.memory) or 0
        return self._budget_bytes or None

    @budget_bytes.setter
    def budget_bytes(self, value: int | None) -> None:
        self._budget_bytes = value

    def resident_bytes(self) -> int:
        """Returns the bytes of the models on the device (parked ones are in host RAM)."""
        return sum(m.bytes for m in self._models.values() if not m.parked)

    def size_bytes(self, spec: ModelSpec, device: str) -> int:
        """Returns the bytes `spec` takes on `device`: measured on the loaded model when it is loaded,
        else the memory plan's estimate (engine.models.plan.estimate_bytes)."""
        entry = self._models.get(spec)
        if entry is not None and entry.bytes:
            return entry.bytes
        from .plan import estimate_bytes

        return estimate_bytes(spec, device)

    def get(self, spec: ModelSpec, **context) -> object:
        """The loaded backend for `spec`, loading it (once) if needed, or moving it back from host RAM.
        Before a load that would not fit the budget (weights plus working memory), the least recently
        used idle models leave the device and its cache is emptied, so their memory is free when the new
        weights arrive; a diffusers pipeline larger than the whole budget is loaded with model CPU
        offload, or refused (ModelLoadError with the plan's sentence) when even that would not fit."""
        with self._load_lock:
            entry = self._models.get(spec)
            if entry is None:
                synthetic = spec.backend.startswith("synthetic")
                device = "cpu" if synthetic else self.device
                if not synthetic:
                    context = self._make_room(spec, device, context)
                start = time.perf_counter()
                backend = load_backend(spec, device, **context)
                entry = LoadedModel(spec, backend, _memory_bytes(backend), time.perf_counter() - start)
                self._models[spec] = entry
                self._free(0, keep=spec)
            elif entry.parked:
                self._free(entry.bytes + self._working(spec), keep=spec)
                entry.backend.move_to(self.device)
                entry.parked = False
            self._models.move_to_end(spec)
            entry.last_used = time.time()
            return entry.backend

    def peek(self, spec: ModelSpec, **context) -> object:
        """The backend for `spec` to read (its id, batch size, defaults), loading it if needed but
        leaving a parked model in host RAM: only `use()` brings it back onto the device."""
        with self._load_lock:
            entry = self._models.get(spec)
            return entry.backend if entry is not None else self.get(spec, **context)

    def _working(self, spec: ModelSpec) -> int:
        if spec.backend.startswith("synthetic"):
            return 0
        from .plan import working_bytes

        return working_bytes(spec)

    def _make_room(self, spec: ModelSpec, device: str, context: dict) -> dict:
        """Moves idle models off the device before loading `spec` when its weights and working memory
        would push the total over budget; returns the loader context (with enable_cpu_offload for a
        pipeline over the whole budget). ModelLoadError when even offload would not fit."""
        budget = self.budget_bytes
        if not budget:
            return context
        from .plan import GB, SEQUENTIAL_LAYER_GB, model_size, offload_problem

        size = model_size(spec, device=device, bf16=self._bf16(device))
        if not size.bytes:
            return context
        working = self._working(spec)
        footprint = size.bytes + working
        offload = str(spec.options.get("enable_cpu_offload", "auto")).lower() if spec.backend == "diffusers" else ""
        if offload == "auto" and footprint > budget:
            problem = offload_problem(spec, budget, device, host_bytes=self.memory.total_bytes("cpu"),
                                      bf16=self._bf16(device))
            if problem:
                raise ModelLoadError(problem)
            context, offload = {**context, "enable_cpu_offload": True}, "true"
        if offload == "sequential":
            footprint = int(SEQUENTIAL_LAYER_GB * GB) + working          # one layer on the device at a time
        elif offload in ("true", "1", "yes", "model"):
            footprint = size.largest_component + working               # one component at a time
        self._free(min(footprint, budget), keep=None)
        return context

    def _bf16(self, device: str) -> bool:
        native = getattr(self.memory, "native_bf16", None)
        try:
            return bool(native(device)) if callable(native) else True
        except Exception:  # noqa: BLE001 - unknown: count as modern (bf16) hardware
            return True

    def _free(self, extra: int, keep: ModelSpec | None) -> None:
        """Moves the least recently used idle models (not `keep`) off the device until the models
        on it plus `extra` bytes fit the budget: parked in host RAM when possible, else unloaded."""
        budget = self.budget_bytes
        if not budget:
            return
        freed = False
        while self.resident_bytes() + extra > budget:
            victim = next((s for s, m in self._models.items() if s != keep and m.users == 0 and not m.parked), None)
            if victim is None:
                break  # everything else is busy: go over budget rather than pull a model away mid-call
            entry = self._models[victim]
            if not self._park(entry):
                _release(self._models.pop(victim).backend)
            freed = True
        if freed:
            self.memory.empty_cache(self.device)

    def _park(self, entry: LoadedModel) -> bool:
        """Moves an idle model's weights to host RAM when the device is a CUDA GPU (not ZeroGPU), the
        backend can move, and the host keeps device.HOST_RESERVE_BYTES free beside it. True if parked."""
        from ..backends.device import HOST_RESERVE_BYTES, on_zero_gpu

        if not str(self.device).startswith("cuda") or on_zero_gpu() or not callable(
                getattr(entry.backend, "move_to", None)):
            return False
        available = getattr(self.memory, "available_bytes", lambda device: None)("cpu")
        if available is None or available - HOST_RESERVE_BYTES < entry.bytes:
            return False
        try:
            moved = entry.backend.move_to("cpu")
        except Exception:  # noqa: BLE001 - a backend that cannot move (offloaded, sharded) is unloaded
            return False
        entry.parked = moved is not False
        return entry.parked

    @contextmanager
    def use(self, spec: ModelSpec, **context):
        """Yield the backend with its lock held: one call at a time per model (calls overlap for a
        backend that says it is `thread_safe`: an HTTP client). Idle models leave the device first when
        the call's working memory would not fit beside the others."""
        with self._load_lock:
            backend = self.get(spec, **context)
            entry = self._models[spec]
            entry.users += 1
            if not spec.backend.startswith("synthetic"):
                self._free(self._working(spec), keep=spec)
        try:
            with nullcontext() if getattr(backend, "thread_safe", False) else entry.lock:
                yield backend
        finally:
            with self._load_lock:
                entry.users -= 1

    def unload(self, spec: ModelSpec | None = None) -> list[str]:
        """Unload one model (or all), parked ones included. Returns the labels unloaded."""
        with self._load_lock:
            specs = [spec] if spec is not None else list(self._models)
            gone = []
            for s in specs:
                entry = self._models.pop(s, None)
                if entry is not None:
                    with entry.lock:
                        _release(entry.backend)
                    gone.append(s.label)
            if gone and self._device is not None:
                self.memory.empty_cache(self._device)  # no CUDA call on ZeroGPU (DeviceMemory knows)
        return gone

    def loaded(self) -> list[dict]:
        return [{"model": s.label, "bytes": m.bytes, "load_seconds": round(m.load_seconds, 2),
                 **({"parked": True} if m.parked else {})} for s, m in self._models.items()]

    def summary(self) -> str:
        """Returns "resident: label (size), ...; [parked in host RAM: ...;] budget N GB" for the status panel."""
        from ..backends.device import format_bytes

        def listed(parked: bool) -> str:
            return ", ".join(f"{s.label} ({format_bytes(m.bytes)})" for s, m in self._models.items() if m.parked == parked)

        parked = listed(True)
        budget = self.budget_bytes
        return (f"resident: {listed(False) or 'none'}; " + (f"parked in host RAM: {parked}; " if parked else "")
                + f"budget {format_bytes(budget) if budget else 'not set'}")


def _release(backend) -> None:
    """Closes a backend and drops it; the caller empties the device cache (ModelManager.memory)."""
    close = getattr(backend, "close", None)
    if callable(close):
        close()
    del backend
    gc.collect()
