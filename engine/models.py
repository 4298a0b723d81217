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
    def __init__(self, device: str | None = None, budget_bytes: int | None = None):
        self._device = device
        self.budget_bytes = budget_bytes
        self._models: "OrderedDict[ModelSpec, LoadedModel]" = OrderedDict()
        self._load_lock = threading.RLock()

    @property
    def device(self) -> str:
        if self._device is None:
            from .device import pick_device  # imports torch: only when a real model loads

            self._device = pick_device()
        return self._device

    def get(self, spec: ModelSpec, **context) -> object:
        """The loaded backend for `spec`, loading it (once) if needed."""
        with self._load_lock:
            entry = self._models.get(spec)
            if entry is None:
                device = "cpu" if spec.backend.startswith("synthetic") else self.device
                start = time.perf_counter()
                backend = load_backend(spec, device, **context)
                entry = LoadedModel(spec, backend, _memory_bytes(backend), time.perf_counter() - start)
                self._models[spec] = entry
                self._evict_over_budget(keep=spec)
            self._models.move_to_end(spec)
            entry.last_used = time.time()
            return entry.backend

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
        return gone

    def loaded(self) -> list[dict]:
        return [{"model": s.label, "bytes": m.bytes, "load_seconds": round(m.load_seconds, 2)}
                for s, m in self._models.items()]


def _release(backend) -> None:
    close = getattr(backend, "close", None)
    if callable(close):
        close()
    del backend
    gc.collect()
    try:
        import sys

        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            torch.cuda.empty_cache()
    except Exception:  # noqa: BLE001
        pass
