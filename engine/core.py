"""The Engine: one store, one model manager, one preset, shared by every tab, CLI and script.

Methods ask the engine for images, embeddings, VQA answers and LLM replies; the engine
serves each from the store when it can and computes (and stores) it otherwise.
"""
from __future__ import annotations

import copy
import functools
import json
import os
import time
import traceback
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from . import __version__
from .backends.base import GenerationSettings, ModelSpec
from .errors import GapLensError, InputError
from .events import Done, Images, Progress
from .models import ModelManager
from .presets import resolve_preset
from .store import ImageRecord, Store, content_key, image_key

DEFAULT_DATA_DIR = "~/.cache/gaplens"
DEFAULT_MAX_IMAGES = 128
MAX_PROMPT_CHARS = 1000


def default_data_dir() -> str:
    return os.environ.get("GAPLENS_DATA_DIR") or DEFAULT_DATA_DIR


@dataclass
class EngineStats:
    """Counters for tests and benchmarks: what was computed vs. served from the store."""

    images_generated: int = 0
    image_cache_hits: int = 0
    generator_calls: int = 0
    embeddings_computed: int = 0
    answers_computed: int = 0
    llm_calls: int = 0
    llm_cache_hits: int = 0


class Engine:
    def __init__(self, preset: str = "synthetic", data_dir: str | None = None,
                 max_images: int = DEFAULT_MAX_IMAGES, device: str | None = None,
                 memory_budget_gb: float | None = None, **model_overrides: str | ModelSpec | None):
        self.preset, self.preset_reason = resolve_preset(preset, **model_overrides)
        self.store = Store(data_dir or default_data_dir())
        self.max_images = int(max_images)
        budget = int(memory_budget_gb * 2**30) if memory_budget_gb else None
        self.models = ModelManager(device, budget)
        self.stats = EngineStats()

    # -- models --------------------------------------------------------------------------------
    @property
    def generator_spec(self) -> ModelSpec:
        return self.preset.generator

    def _spec_and_context(self, role: str) -> tuple[ModelSpec, dict]:
        """The role's spec and what its loader needs: CLIP zero-shot VQA answers through the
        preset's embedder, so it gets the loaded one instead of loading a second copy."""
        spec = self.preset.specs()[role]
        return spec, ({"embedder": self.models.get(self.preset.embedder)} if spec.backend == "clip_vqa" else {})

    def _backend(self, role: str):
        spec, context = self._spec_and_context(role)
        return self.models.use(spec, **context)

    def model_id(self, role: str) -> str:
        """The loaded backend's id (part of cache keys); loads the model if needed."""
        spec, context = self._spec_and_context(role)
        return self.models.get(spec, **context).id

    def default_settings(self) -> GenerationSettings:
        with self._backend("generator") as gen:
            return gen.defaults()

    def settings(self, **changes) -> GenerationSettings:
        """The generator's family defaults with the given fields replaced (None = keep)."""
        return self.default_settings().replace(**changes)

    def status(self) -> dict:
        """What the model panel shows: preset, why, device, loaded models, store."""
        return {
            "preset": self.preset.name,
            "reason": self.preset_reason,
            "models": {role: spec.label for role, spec in self.preset.specs().items()},
            "loaded": self.models.loaded(),
            "device": self.models._device or "not chosen yet (no real model loaded)",
            "memory": _memory_summary(),
            "data_dir": str(self.store.data_dir),
            "stored_images": self.store.count("images"),
            "runs": self.store.count("runs"),
            "max_images": self.max_images,
            "version": __version__,
        }

    def unload(self) -> list[str]:
        return self.models.unload()

    def with_generator(self, spec: ModelSpec, label: str = "") -> "Engine":
        """Returns a view of this engine whose preset has `spec` as its generator (compare
        models): the store, the model manager (one memory budget), the other models and the
        stats are shared, so only the generator differs."""
        view = copy.copy(self)
        view.preset = replace(self.preset, name=f"{self.preset.name}+{label or spec.label}", generator=spec)
        view.preset_reason = f"{self.preset_reason}; generator replaced by {spec.label} to compare models"
        return view

    def set_preset(self, name: str, **model_overrides) -> None:
        """Switch to another preset: models of the old one are unloaded, the store is kept."""
        preset, reason = resolve_preset(name, **model_overrides)
        self.models.unload()
        self.preset, self.preset_reason = preset, reason

    # -- validation ----------------------------------------------------------------------------
    def check_prompt(self, prompt: str, what: str = "prompt") -> str:
        """The stripped prompt; InputError when it is empty or too long."""
        prompt = (prompt or "").strip()
        if not prompt:
            raise InputError(f"the {what} is empty: type what the images should show")
        if len(prompt) > MAX_PROMPT_CHARS:
            raise InputError(f"the {what} is {len(prompt)} characters long; the maximum is "
                             f"{MAX_PROMPT_CHARS}")
        return prompt

    def check_n(self, n: int, what: str = "number of images") -> int:
        try:
            n = int(n)
        except (TypeError, ValueError):
            raise InputError(f"the {what} must be a whole number, not {n!r}") from None
        if n < 1:
            raise InputError(f"the {what} must be at least 1 (got {n})")
        if n > self.max_images:
            raise InputError(f"the {what} is {n}, above this server's maximum of {self.max_images} "
                             f"(start the app with --max-images to change it)")
        return n

    # -- images --------------------------------------------------------------------------------
    def images(self, prompt: str, seeds: Sequence[int], settings: GenerationSettings | None = None
               ) -> Iterator[list[ImageRecord]]:
        """Yield the images for (prompt, seed) pairs batch by batch: stored ones at once, then each
        generated batch as soon as it is finished (and stored). Order within the stream is
        cached-first; every record carries its seed."""
        settings = settings or self.default_settings()
        gen_id = self.model_id("generator")
        keys = [image_key(gen_id, prompt, s, settings) for s in seeds]
        found = self.store.get_images(keys)
        cached = [found[k] for k in keys if k in found]
        if cached:
            self.stats.image_cache_hits += len(cached)
            yield cached
        missing = [(s, k) for s, k in zip(seeds, keys) if k not in found]
        batch_size = max(1, int(getattr(self.models.get(self.generator_spec), "batch_size", 4)))
        for start in range(0, len(missing), batch_size):
            batch = missing[start:start + batch_size]
            with self._backend("generator") as gen:
                outputs = gen.generate(prompt, [s for s, _ in batch], settings)
            self.stats.generator_calls += 1
            self.stats.images_generated += len(outputs)
            yield [self.store.put_image(k, gen_id, prompt, out.seed, settings, out.image, out.nsfw)
                   for (s, k), out in zip(batch, outputs)]

    def image_set(self, prompt: str, seeds: Sequence[int], settings: GenerationSettings | None = None
                  ) -> list[ImageRecord]:
        """All images of a set, in seed order (no streaming)."""
        by_seed = {r.seed: r for batch in self.images(prompt, seeds, settings) for r in batch}
        return [by_seed[s] for s in seeds]

    def regenerate_check(self, prompt: str, seed: int, settings: GenerationSettings, key: str
                         ) -> tuple[bool, int | None]:
        """Generate one image alone (bypassing the store) and compare it with the stored one:
        (pixel-identical?, largest per-channel difference in grey levels). (False, None), without
        generating, when the stored image is gone (deleted with a run, or its file is missing):
        there is nothing to compare, which says nothing about reproducibility."""
        stored = self.store.get_images([key]).get(key)
        if stored is None:
            return False, None
        with self._backend("generator") as gen:
            fresh = gen.generate(prompt, [int(seed)], settings)[0].image.convert("RGB")
        self.stats.generator_calls += 1
        if stored.image.size != fresh.size:
            return False, 255
        diff = int(np.abs(np.asarray(stored.image, np.int16) - np.asarray(fresh, np.int16)).max())
        return diff == 0, diff

    # -- evaluators ----------------------------------------------------------------------------
    def embed_images(self, records: Sequence[ImageRecord]) -> np.ndarray:
        """(n, d) normalised image embeddings, cached per (embedder, image key)."""
        emb_id = self.model_id("embedder")
        keys = [content_key("embedding", emb_id, r.key) for r in records]
        return self._cached_embeddings(keys, records, emb_id, lambda e, items: e.embed_images(
            [r.image for r in items]), subject=lambda r: r.key)

    def embed_texts(self, texts: Sequence[str]) -> np.ndarray:
        """(n, d) normalised text embeddings, cached per (embedder, text)."""
        emb_id = self.model_id("embedder")
        keys = [content_key("text-embedding", emb_id, t) for t in texts]
        return self._cached_embeddings(keys, list(texts), emb_id, lambda e, items: e.embed_texts(items),
                                       subject=lambda t: t)

    def _cached_embeddings(self, keys, items, emb_id, compute: Callable, subject: Callable) -> np.ndarray:
        found = self.store.get_embeddings(keys)
        todo = [i for i, k in enumerate(keys) if k not in found]
        if todo:
            with self._backend("embedder") as embedder:
                vectors = compute(embedder, [items[i] for i in todo])
            self.stats.embeddings_computed += len(todo)
            rows = [(keys[i], subject(items[i]), emb_id, np.asarray(v, np.float32)) for i, v in zip(todo, vectors)]
            self.store.put_embeddings(rows)
            found.update({r[0]: r[3] for r in rows})
        if not keys:
            return np.zeros((0, 0), np.float32)
        return np.stack([found[k] for k in keys]).astype(np.float32)

    def ask(self, records: Sequence[ImageRecord], question: str,
            choices: Sequence[str] | None = None) -> list[str]:
        """One VQA answer per image, cached per (VQA model, image, question, choices)."""
        vqa_id = self.model_id("vqa")
        choices_json = json.dumps(list(choices) if choices else [])
        keys = [content_key("answer", vqa_id, r.key, question, choices_json) for r in records]
        found = self.store.get_answers(keys)
        todo = [i for i, k in enumerate(keys) if k not in found]
        if todo:
            with self._backend("vqa") as vqa:
                answers = vqa.answer([records[i].image for i in todo], question,
                                     list(choices) if choices else None)
            self.stats.answers_computed += len(todo)
            rows = [(keys[i], records[i].key, vqa_id, question, choices_json, a) for i, a in zip(todo, answers)]
            self.store.put_answers(rows)
            found.update({r[0]: r[5] for r in rows})
        return [found[k] for k in keys]

    def caption(self, records: Sequence[ImageRecord]) -> list[str]:
        """One caption per image, cached like answers under the pseudo-question '<caption>'."""
        vqa_id = self.model_id("vqa")
        keys = [content_key("answer", vqa_id, r.key, "<caption>", "[]") for r in records]
        found = self.store.get_answers(keys)
        todo = [i for i, k in enumerate(keys) if k not in found]
        if todo:
            with self._backend("vqa") as vqa:
                captions = vqa.caption([records[i].image for i in todo])
            self.stats.answers_computed += len(todo)
            rows = [(keys[i], records[i].key, vqa_id, "<caption>", "[]", c) for i, c in zip(todo, captions)]
            self.store.put_answers(rows)
            found.update({r[0]: r[5] for r in rows})
        return [found[k] for k in keys]

    # -- language model ------------------------------------------------------------------------
    @property
    def llm(self) -> "CachedLLM":
        """The preset's LLM behind the store's reply cache (same request -> same reply)."""
        return CachedLLM(self)

    def ask_json(self, messages: list[dict], validate: Callable, *, temperature: float = 1.0,
                 seed: int = 0, retries: int = 2, max_tokens: int = 1024):
        """Ask the LLM for JSON, repair and validate it (engine.backends.llm_json)."""
        from .backends.llm_json import ask_json

        return ask_json(self.llm, messages, validate=validate, retries=retries,
                        temperature=temperature, seed=seed, max_tokens=max_tokens)

    # -- runs ----------------------------------------------------------------------------------
    def start_run(self, method: str, request: dict) -> "Run":
        models = {role: spec.label for role, spec in self.preset.specs().items()}
        return Run(self, self.store.create_run(method, request, models, __version__), method, request)

    def reopen_run(self, run_id: str, method: str, request: dict) -> "Run":
        """The stored run `run_id` in status 'running' again, to be continued under its own id
        (a resumed search); InputError when there is no such run of that method."""
        record = self.store.get_run(run_id)
        if record is None or record["method"] != method:
            raise InputError(f"no {method} run '{run_id}' in the store at {self.store.data_dir}")
        self.store.update_run(run_id, status="running")
        return Run(self, run_id, method, request)


class CachedLLM:
    """A TextGenerator that answers from the store when the exact request was seen before."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.id = engine.model_id("llm")

    def chat(self, messages, *, temperature: float = 1.0, max_tokens: int = 1024, seed: int = 0) -> str:
        request = {"messages": list(messages), "temperature": temperature, "max_tokens": max_tokens,
                   "seed": seed}
        key = content_key("llm", self.id, request)
        reply = self.engine.store.get_llm_reply(key)
        if reply is not None:
            self.engine.stats.llm_cache_hits += 1
            return reply
        with self.engine._backend("llm") as llm:
            reply = llm.chat(messages, temperature=temperature, max_tokens=max_tokens, seed=seed)
        self.engine.stats.llm_calls += 1
        self.engine.store.put_llm_reply(key, self.id, request, reply)
        return reply


@dataclass
class Run:
    """A run record being written: images linked as they arrive, results at the end."""

    engine: Engine
    id: str
    method: str
    request: dict
    started: float = field(default_factory=time.perf_counter)

    def add_images(self, records: Sequence[ImageRecord], label: str = "") -> None:
        self.engine.store.add_run_images(self.id, [r.key for r in records], label)

    def save(self, results: dict, summary: dict | None = None) -> None:
        """Store partial results (kept even if the run fails later)."""
        self.engine.store.update_run(self.id, results=results, summary=summary)

    def finish(self, results: dict, summary: dict | None = None) -> Done:
        summary = dict(summary or {})
        summary.setdefault("seconds", round(time.perf_counter() - self.started, 2))
        self.engine.store.update_run(self.id, status="done", results=results, summary=summary)
        return Done(self.id, results, summary)


def recorded(method: str, check: Callable | None = None, continues: Callable | None = None):
    """Decorator for a method generator `fn(request, engine, run_record)`: creates its run record and
    marks it failed (with the message) or stopped when the consumer closes the stream early.
    Whatever the method stored before the failure stays in the store.

    `check(request, engine)` runs first and raises InputError for a request that cannot run
    (an empty prompt), so bad input never leaves a failed run behind. `continues(request)`
    returns the id of a stored run the request continues (a resume), which is reopened under
    its own id instead of creating a new one."""

    def wrap(fn):
        @functools.wraps(fn)
        def run_method(request, engine: Engine):
            if check is not None:
                check(request, engine)
            previous = continues(request) if continues is not None else None
            run = (engine.reopen_run(previous, method, _as_dict(request)) if previous
                   else engine.start_run(method, _as_dict(request)))
            finished, events = False, fn(request, engine, run)
            try:
                for event in events:
                    finished = finished or isinstance(event, Done)
                    yield event
            except GeneratorExit:
                events.close()      # the method saves what it has (e.g. a search's state)
                if not finished:    # a consumer closing the stream after Done did not stop the run
                    engine.store.update_run(run.id, status="stopped")
                raise
            except GapLensError as exc:
                engine.store.update_run(run.id, status="failed", error=str(exc))
                raise
            except Exception as exc:
                engine.store.update_run(run.id, status="failed",
                                        error="".join(traceback.format_exception_only(type(exc), exc)).strip())
                raise
        run_method.method = method
        return run_method

    return wrap


def _as_dict(request) -> dict:
    if hasattr(request, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(request)
    return dict(request)


def stream_image_set(engine: Engine, run: Run, prompt: str, seeds: Sequence[int],
                     settings: GenerationSettings, label: str = "",
                     progress_offset: int = 0, progress_total: int | None = None):
    """Generate one image set, yielding Images and Progress events (with an ETA measured from
    the batches generated so far); returns the records in seed order (use `yield from`)."""
    total = progress_total or len(seeds)
    by_seed: dict[int, ImageRecord] = {}
    start, generated = time.perf_counter(), 0
    for batch in engine.images(prompt, seeds, settings):
        by_seed.update({r.seed: r for r in batch})
        run.add_images(batch, label)
        fresh = sum(not r.cached for r in batch)
        generated += fresh
        done = progress_offset + len(by_seed)
        eta = None
        if generated:
            per_image = (time.perf_counter() - start) / generated
            eta = per_image * max(0, total - done)
        yield Images(batch, label, done, total)
        yield Progress(done, total, "images", f"{done}/{total} images" + (f" ({label})" if label else ""), eta)
    return [by_seed[s] for s in seeds]


def _memory_summary() -> str:
    import sys

    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        return f"GPU {torch.cuda.get_device_name(0)}: {(total - free) / 2**30:.1f} of {total / 2**30:.1f} GiB in use"
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        return f"CPU; this process peaked at {rss:.1f} GiB of RAM"
    except Exception:  # noqa: BLE001
        return "CPU"
