"""The model manager: loads on first use, keeps models warm, evicts the least recently
used under a memory budget, and serialises access to each model.

Gradio serves requests concurrently; a diffusers pipeline or a transformers model is not
safe to call from two threads at once, so every use of a backend goes through `use()`,
which holds that model's lock for the duration of one call.
"""
from __future__ import annotations

import gc
import threading
import time
from collections import OrderedDict
from contextlib import contextmanager
from dataclasses import dataclass, field

from .backends import load_backend
from .backends.base import ModelSpec


@dataclass
class LoadedModel:
    spec: ModelSpec
    backend: object
    bytes: int
    load_seconds: float
    lock: threading.RLock = field(default_factory=threading.RLock)
    last_used: float = field(default_factory=time.time)
    users: int = 0  # calls in progress (or waiting for the lock): never evicted while > 0


def _memory_bytes(backend) -> int:
    """The backend's own estimate when it has one, else 0 (synthetic backends)."""
    estimate = getattr(backend, "memory_bytes", None)
    try:
        return int(estimate() if callable(estimate) else (estimate or 0))
    except Exception:  # noqa: BLE001 - an estimate must never break a load
        return 0


class ModelManager:
    """Loads, keeps and evicts models. `budget_bytes` None means the device's default budget
    (engine.device.default_budget_bytes), chosen with the first real load; 0 means no budget.
    `memory` reports device memory (engine.device.DeviceMemory; tests pass a fake one)."""

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
            from .device import pick_device  # imports torch: only when a real model loads

            self._device = pick_device()
        return self._device

    @property
    def memory(self):
        if self._memory is None:
            from .device import DeviceMemory

            self._memory = DeviceMemory()
        return self._memory

    @property
    def budget_bytes(self) -> int | None:
        """Bytes the loaded models may take on the device; None while no real model has chosen the device."""
        if self._budget_bytes is None and self._device is not None:
            from .device import default_budget_bytes

            self._budget_bytes = default_budget_bytes(self._device, self.memory) or 0
        return self._budget_bytes or None

    @budget_bytes.setter
    def budget_bytes(self, value: int | None) -> None:
        self._budget_bytes = value

    def resident_bytes(self) -> int:
        return sum(m.bytes for m in self._models.values())

    def size_bytes(self, spec: ModelSpec, device: str) -> int:
        """Returns the bytes `spec` takes on `device`: measured on the loaded model when it is loaded,
        else the memory plan's estimate (engine.plan.estimate_bytes)."""
        entry = self._models.get(spec)
        if entry is not None and entry.bytes:
            return entry.bytes
        from .plan import estimate_bytes

        return estimate_bytes(spec, device)

    def get(self, spec: ModelSpec, **context) -> object:
        """The loaded backend for `spec`, loading it (once) if needed. Before a load that would not fit
        the budget, the least recently used idle models are unloaded and the device cache emptied,
        so their memory is free when the new weights arrive; a diffusers pipeline larger than the
        whole budget is loaded with model CPU offload."""
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
                self._evict_over_budget(keep=spec)
            self._models.move_to_end(spec)
            entry.last_used = time.time()
            return entry.backend

    def _make_room(self, spec: ModelSpec, device: str, context: dict) -> dict:
        """Evicts before loading `spec` when its estimated size would push the total over budget;
        returns the loader context (with enable_cpu_offload for a pipeline over the whole budget)."""
        budget = self.budget_bytes
        if not budget:
            return context
        from .plan import estimate_bytes

        needed = estimate_bytes(spec, device)
        if needed and self.resident_bytes() + needed > budget:
            freed = False
            while self.resident_bytes() + needed > budget:
                victim = next((s for s, m in self._models.items() if m.users == 0), None)
                if victim is None:
                    break
                _release(self._models.pop(victim).backend)
                freed = True
            if freed:
                self.memory.empty_cache(device)
        if spec.backend == "diffusers" and needed > budget and "enable_cpu_offload" not in spec.options:
            context = {**context, "enable_cpu_offload": True}
        return context

    @contextmanager
    def use(self, spec: ModelSpec, **context):
        """Yield the backend with its lock held: one call at a time per model."""
        with self._load_lock:
            backend = self.get(spec, **context)
            entry = self._models[spec]
            entry.users += 1
        try:
            with entry.lock:
                yield backend
        finally:
            with self._load_lock:
                entry.users -= 1

    def _evict_over_budget(self, keep: ModelSpec) -> None:
        if not self.budget_bytes:
            return
        while sum(m.bytes for m in self._models.values()) > self.budget_bytes:
            victim = next((s for s, m in self._models.items() if s != keep and m.users == 0), None)
            if victim is None:
                return  # everything else is busy: go over budget rather than pull a model away mid-call
            _release(self._models.pop(victim).backend)
            self.memory.empty_cache(self.device)

    def unload(self, spec: ModelSpec | None = None) -> list[str]:
        """Unload one model (or all). Returns the labels unloaded."""
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
        return [{"model": s.label, "bytes": m.bytes, "load_seconds": round(m.load_seconds, 2)}
                for s, m in self._models.items()]

    def summary(self) -> str:
        """Returns "resident: label (size), ...; budget N GB" for the status panel."""
        from .device import format_bytes

        resident = ", ".join(f"{s.label} ({format_bytes(m.bytes)})" for s, m in self._models.items()) or "none"
        budget = self.budget_bytes
        return f"resident: {resident}; budget {format_bytes(budget) if budget else 'not set'}"


def _release(backend) -> None:
    """Closes a backend and drops it; the caller empties the device cache (ModelManager.memory)."""
    close = getattr(backend, "close", None)
    if callable(close):
        close()
    del backend
    gc.collect()
