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
from typing import Callable, Iterator, Sequence

import numpy as np

from .. import __version__
from ..backends.base import GenerationSettings, ModelSpec, PartialBatch, with_options
from ..common import access
from ..common.errors import GapLensError, InputError, OutOfMemoryError
from ..common.events import Done, Images, Progress, Warning
from ..common.names import short_label
from ..hosting import backend_choices, limits, spending, storage
from ..models import sources
from ..models.manager import ModelManager
from ..models.presets import resolve_preset
from ..store.store import ImageRecord, Store, content_key, image_key

DEFAULT_DATA_DIR = "~/.cache/gaplens"
DEFAULT_MAX_IMAGES = 128
DEFAULT_MAX_API_CALLS = 200   # image API calls one run may make (--max-api-calls)
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

    def add(self, **counts: int) -> None:
        for name, k in counts.items():
            setattr(self, name, getattr(self, name) + k)


class Engine:
    def __init__(self, preset: str = "synthetic", data_dir: str | None = None,
                 max_images: int = DEFAULT_MAX_IMAGES, device: str | None = None,
                 memory_budget_gb: float | None = None, public: bool = False,
                 budget: "limits.Budget | None" = None, quota_gb: float | None = None,
                 options: dict | None = None, max_api_calls: int = DEFAULT_MAX_API_CALLS,
                 public_generators=None, public_evaluators=None,
                 **model_overrides: str | ModelSpec | None):
        """`public`: serve visitors (engine/common/access.py): each sees only their own runs, host-only
        actions refuse them, requests must fit `budget` (default `limits.Budget()`; per request,
        per hour, and each visitor's share of the store), and the store is cleaned automatically
        when it exceeds `quota_gb` (engine/hosting/storage.py). `options`: backend options by role
        (`--ROLE-option KEY=VALUE`); `max_api_calls`: image API calls per run.
        `public_generators` / `public_evaluators`: what visitors may pick beyond the presets' models
        and this engine's own in Compare models / Compare evaluators ('[LABEL=]backend:model',
        comma-separated or a list; engine/hosting/backend_choices.py)."""
        self.preset, self.preset_reason = resolve_preset(preset, options, **model_overrides)
        self.started_with = self.preset.specs()
        self.public_choices = {"generator": backend_choices.parse_allow_list(public_generators, "generator"),
                               "vqa": backend_choices.parse_allow_list(public_evaluators, "vqa")}
        self.public = bool(public)
        self.budget = (budget or limits.Budget()) if public else budget
        self.store = Store(data_dir or default_data_dir(), public=self.public)
        self.store.quota_bytes = int(quota_gb * 2**30) if quota_gb else None
        self.store.share_bytes = self.budget.storage_mb * 2**20 if self.public else None
        self.prepaid = False   # a view whose runs are parts of one charged up front (compare models)
        # CLI/app overrides (--generator etc.) and options apply to every preset picked later, too
        self.model_overrides = {k: v for k, v in model_overrides.items() if v}
        self.model_options = dict(options or {})
        self.max_api_calls = int(max_api_calls)
        self.max_images = int(max_images)
        budget = int(memory_budget_gb * 2**30) if memory_budget_gb else None
        self.models = ModelManager(device, budget)
        self._overlap: bool | None = None
        self.stats = EngineStats()
        self.run: Run | None = None   # the run a view of this engine works for (`for_run`)

    # -- models --------------------------------------------------------------------------------
    @property
    def generator_spec(self) -> ModelSpec:
        return self.preset.generator

    def _spec_and_context(self, role: str) -> tuple[ModelSpec, dict]:
        """The role's spec and what its loader needs: CLIP zero-shot VQA answers through the
        preset's embedder, so it gets the loaded one instead of loading a second copy."""
        spec = self.preset.specs()[role]
        if spec.backend in ("openai_images", "openai_vqa"):   # remembers a server's listed model here
            return spec, {"data_dir": str(self.store.data_dir)}
        return spec, ({"embedder": self.models.get(self.preset.embedder)} if spec.backend == "clip_vqa" else {})

    def _backend(self, role: str):
        spec, context = self._spec_and_context(role)
        return self.models.use(spec, **context)

    def model_id(self, role: str) -> str:
        """The loaded backend's id (part of cache keys); loads the model if needed."""
        spec, context = self._spec_and_context(role)
        backend = self.models.peek(spec, **context)
        return backend.id if getattr(backend, "options_in_id", False) else with_options(backend.id, spec.options)

    @property
    def overlap_evaluation(self) -> bool:
        """Whether evaluation may run beside generation (stream_image_set's `evaluate`): set it to force
        a choice. By default True on a GPU when the generator, embedder and VQA fit the memory budget
        together, each with its working memory (else the manager would have to evict a model in use);
        False on a CPU, where both threads would fight for the same cores (bench/end_to_end.py
        measured it slower there), and for the synthetic world."""
        if self._overlap is not None:
            return self._overlap
        specs = [self.preset.specs()[r] for r in ("generator", "embedder", "vqa")]
        if all(s.backend.startswith("synthetic") for s in specs):
            return False
        from ..backends.device import is_accelerator
        from ..models.plan import working_bytes

        device = self.models.device
        if not is_accelerator(device):
            return False
        budget = self.models.budget_bytes
        return not budget or sum(self.models.size_bytes(s, device) + working_bytes(s) for s in specs) <= budget

    @overlap_evaluation.setter
    def overlap_evaluation(self, value: bool | None) -> None:
        self._overlap = value

    def generator_loaded(self) -> bool:
        """True when the generator is already loaded (asking for its defaults then loads nothing)."""
        return self.generator_spec in self.models._models

    def default_settings(self) -> GenerationSettings:
        with self._backend("generator") as gen:
            return gen.defaults()

    def settings(self, **changes) -> GenerationSettings:
        """The generator's family defaults with the given fields replaced (None = keep)."""
        return self.default_settings().replace(**changes)

    def status(self) -> dict:
        """What the model panel shows: preset, why, device, loaded models, store; for a visitor
        of a public GapLens also what they may still spend this hour ("left": images, LLM calls)."""
        visitor = access.current()
        left = spending.left(self.store, self.budget, visitor) if self.public and visitor and not visitor.host else None
        return {
            "preset": self.preset.name,
            "reason": short_label(self.preset_reason),
            "models": {role: short_label(spec.full_label) for role, spec in self.preset.specs().items()},
            "loaded": [{**m, "model": short_label(str(m.get("model", "")))} for m in self.models.loaded()],
            "device": self.models._device or "not chosen yet (no real model loaded)",
            "memory": _memory_summary(self.models._device),
            "resident": self.models.summary(),
            "data_dir": short_label(str(self.store.data_dir)) if not self.public else "(hidden in public mode)",
            "stored_images": self.store.count("images"),
            "runs": self.store.count_runs() if self.public else self.store.count("runs"),
            "max_images": self.max_images,
            "max_api_calls": self.max_api_calls,
            "generator_kind": sources.kind_by_name(self.generator_spec),
            "version": __version__,
            "left": left,
        }

    def unload(self) -> list[str]:
        """Unload every model (host only in public mode). Returns what was unloaded."""
        access.require_host(self.public, "unloading the models")
        return self.models.unload()

    def with_generator(self, spec: ModelSpec, label: str = "") -> "Engine":
        """Returns a view of this engine whose preset has `spec` as its generator (compare
        models): the store, the model manager (one memory budget), the other models and the
        stats are shared, so only the generator differs. Its runs are not charged again: the
        comparison was charged for all of them."""
        view = copy.copy(self)
        view.prepaid = True   # its runs are the parts of a comparison, charged as one request
        view.preset = replace(self.preset, name=f"{self.preset.name}+{label or spec.label}", generator=spec)
        view.preset_reason = f"{self.preset_reason}; generator replaced by {spec.label} to compare models"
        return view

    def for_run(self, run: "Run") -> "Engine":
        """Returns a view of this engine working for `run` (what `recorded` hands a method): the
        store, models, preset and engine-wide stats are shared; what one run uses (its image API
        calls, its own stats) is counted on the run, so visitors' runs at once never mix them."""
        view = copy.copy(self)
        view.run = run
        return view

    def count(self, **counts: int) -> None:
        """Adds to the engine-wide stats and, in a run's view, to the run's own."""
        self.stats.add(**counts)
        if self.run is not None:
            self.run.stats.add(**counts)

    def set_preset(self, name: str, options: dict | None = None, **model_overrides) -> None:
        """Switch to another preset: models of the old one are unloaded, the store is kept. The engine's
        model overrides and options (from the command line, or given here, which add to them) replace
        the preset's. Host only in public mode."""
        access.require_host(self.public, "switching the preset")
        overrides = {**self.model_overrides, **{k: v for k, v in model_overrides.items() if v}}
        options = self.model_options if options is None else options
        preset, reason = resolve_preset(name, options, **overrides)
        self.model_overrides, self.model_options = overrides, dict(options or {})
        self.models.unload_except(preset.specs().values())  # shared and pinned (preloaded) models stay
        self.preset, self.preset_reason = preset, reason

    def model_config(self) -> dict:
        """What decides the models a run uses: the preset (with its reason), the overrides and options
        later presets keep, and the API-call budget. Plain data: on ZeroGPU it is pickled into the
        GPU worker, a process forked earlier that `adopt`s it before each run."""
        return {"preset": self.preset, "preset_reason": self.preset_reason, "model_overrides": self.model_overrides,
                "model_options": self.model_options, "max_api_calls": self.max_api_calls}

    def adopt(self, config: dict) -> None:
        """Take on `config` (from `model_config`), unloading the models a changed preset no longer uses."""
        if config["preset"] != self.preset:
            self.models.unload_except(config["preset"].specs().values())
        for name, value in config.items():
            setattr(self, name, value)

    # -- validation ----------------------------------------------------------------------------
    def check_questions(self, questions) -> None:
        """InputError before a run when the VQA evaluator cannot answer one of `questions` (the faces
        evaluator answers gender and age only)."""
        from ..backends import question_problem

        problem = question_problem(self.preset.vqa, questions)
        if problem:
            raise InputError(problem)

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
        """`n` as an int; InputError when it is not a whole number from 1 to `max_images`. The one
        check of an image count (and of the text variations): each method's `check` calls it, so a
        request's N is checked once, before its run exists."""
        if isinstance(n, bool) or (isinstance(n, float) and not n.is_integer()):
            raise InputError(f"the {what} must be a whole number, not {n!r}")
        try:
            n = int(n)
        except (TypeError, ValueError, OverflowError):
            raise InputError(f"the {what} must be a whole number, not {str(n)[:40]!r}") from None
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
        cached-first; every record carries its seed.

        For an images API (not seedable) a seed is the image's index: the key is prompt +
        index + settings + model, a refusal is recorded like an image and never asked again,
        and the calls a run makes are bounded by `max_api_calls`. A folder or dataset source
        serves image i of the prompt for seed i and says how many it has when asked for more."""
        settings = settings or self.default_settings()
        gen_id = self.model_id("generator")
        generator = self.models.peek(self.generator_spec)   # loaded by model_id above
        if seeds and hasattr(generator, "check_available"):
            generator.check_available(prompt, max(seeds) + 1)   # before any image: one clear sentence
        keys = [image_key(gen_id, prompt, s, settings) for s in seeds]
        # Imported images are not cache hits: an archive's bytes are not proof of what this
        # generator makes for this key (an archive can swap images and rewrite its checksums).
        found = self.store.get_images(keys, local_only=True)
        found.update({k: r for k, r in self.store.get_refusals([k for k in keys if k not in found]).items()})
        cached = [found[k] for k in keys if k in found]
        if cached:
            self.count(image_cache_hits=len(cached))
            self.store.touch([r.key for r in cached])
            yield cached
        missing = [(s, k) for s, k in zip(seeds, keys) if k not in found]
        if missing and getattr(generator, "source_kind", "model") == "api":
            used = self.run.api_calls if self.run else 0   # outside a run: each call on its own budget
            if used + len(missing) > self.max_api_calls:
                raise InputError(f"this needs {len(missing)} more image API call(s) but the budget allows "
                                 f"{max(0, self.max_api_calls - used)} more in this run (at most "
                                 f"{self.max_api_calls}); lower N or raise the budget (--max-api-calls)")
            if self.run:
                self.run.api_calls += len(missing)
        batch_size = max(1, int(getattr(generator, "batch_size", 4)))
        start, retried = 0, False
        while start < len(missing):
            batch = missing[start:start + batch_size]
            failure = None
            try:
                with self._backend("generator") as gen:
                    try:
                        outputs = gen.generate(prompt, [s for s, _ in batch], settings)
                    except PartialBatch as partial:   # keep what was made (and paid for) before the failure
                        outputs, failure = partial.outputs, partial.error
            except OutOfMemoryError:
                if retried or batch_size == 1:
                    raise  # its message says what to change
                # One retry with half the batch; the generator keeps the smaller size from now on.
                # Each image depends only on its own seed, so the images do not change.
                retried, batch_size = True, max(1, batch_size // 2)
                generator.batch_size = batch_size
                self.models.memory.empty_cache(self.models.device)
                continue
            self.count(generator_calls=1, images_generated=sum(out.refused is None for out in outputs))
            start += len(batch)
            key_of = dict(batch)
            records = [self.store.put_refusal(key_of[out.seed], gen_id, prompt, out.seed, out.refused)
                       if out.refused is not None else
                       self.store.put_image(key_of[out.seed], gen_id, prompt, out.seed, settings, out.image, out.nsfw)
                       for out in outputs]
            if records:
                yield records
            if failure is not None:
                raise failure

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
        kind = sources.source_kind(self)
        if kind != "model":
            raise InputError("images from an API are not seedable: regenerating one gives a different image, "
                             "so there is nothing to check" if kind == "api" else
                             "these images come from a folder or dataset, not from a model: there is nothing to regenerate")
        stored = self.store.get_images([key]).get(key)
        if stored is None:
            return False, None
        self.charge(images=1, what="regenerate")
        with self._backend("generator") as gen:
            fresh = gen.generate(prompt, [int(seed)], settings)[0].image.convert("RGB")
        self.count(generator_calls=1)
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
            self.count(embeddings_computed=len(todo))
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
            self.count(answers_computed=len(todo))
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
            self.count(answers_computed=len(todo))
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
        from ..backends.llm_json import ask_json

        return ask_json(self.llm, messages, validate=validate, retries=retries,
                        temperature=temperature, seed=seed, max_tokens=max_tokens)

    # -- runs ----------------------------------------------------------------------------------
    def admit(self, method: str, request) -> int:
        """Check a request before any work starts or anything is stored: ranges always
        (limits.check_request); in public mode also the backends and files it names
        (backend_choices.check_request), the per-request budget, the store's room and the
        visitor's share of it (engine/hosting/storage.py), and the hourly budgets, which it is charged
        to (engine/hosting/spending.py). Returns the most images it can generate.
        InputError / OverBudgetError / StoreError."""
        limits.check_request(method, request, self.preset.name)
        backend_choices.check_request(self, request)   # public mode: no backend, server or file but the host's
        visitor = access.visitor_for(self.public)
        charged = self.public and not visitor.host and not self.prepaid
        cost = limits.estimate_images(method, request, until_cap=self.max_set_images(),
                                      proposed=self.budget.images if charged else None)
        if not self.public:
            return cost
        if charged:
            limits.check_budget(method, request, self.budget, cost)
        storage.require_room(self.store)
        if charged:
            settings, fields = self.default_settings(), _as_dict(request)
            storage.check_share(self.store, visitor, cost * storage.image_bytes(
                fields.get("width") or settings.width, fields.get("height") or settings.height))
            spending.charge(self.store, self.budget, visitor, {"images": cost},
                            {"llm_calls": limits.estimate_llm_calls(method, request)}, what=method)
        return cost

    def charge(self, what: str = "", **spend: int) -> None:
        """Charge work done outside a run's admission (an LLM call, a regenerated image, an export's
        bytes: `spending.KINDS`) to the current visitor of a public GapLens; OverBudgetError when
        it does not fit. Nothing in local mode or for the host."""
        visitor = access.visitor_for(self.public)
        if self.public and not visitor.host:
            spending.charge(self.store, self.budget, visitor, spend, what=what)

    def max_set_images(self) -> int:
        """The largest N of an image set the current user may grow one to (Single Prompt's
        `until_half_width`): the server's maximum, and for a visitor of a public GapLens no more
        than one request may generate."""
        if self.public and not access.visitor_for(True).host:
            return min(self.max_images, self.budget.images)
        return self.max_images

    def fit_proposed_axes(self, method: str, request, axes: dict, share: int = 1) -> tuple[dict, list[str]]:
        """The LLM-proposed `axes` a visitor's request keeps: those whose sets fit what it was
        charged (one request's images, divided among `share` runs), in the LLM's order, and the
        axes left out. Everything in local mode and for the host."""
        if not self.public or access.visitor_for(True).host:
            return axes, []
        return limits.fit_axes(method, request, axes, self.budget.images // max(1, share))

    def start_run(self, method: str, request: dict, cost: int = 0) -> "Run":
        models = {role: spec.full_label for role, spec in self.preset.specs().items()}
        return Run(self, self.store.create_run(method, request, models, __version__, cost=cost), method, request)

    def reopen_run(self, run_id: str, method: str, request: dict) -> "Run":
        """The stored run `run_id` in status 'running' again, to be continued under its own id
        (a resumed search); InputError when there is no such run of that method."""
        record = self.store.get_run(run_id)
        if record is None or record["method"] != method or not self.store.run_writable(run_id):
            raise InputError(f"no {method} run '{run_id}' of yours in the store")
        self.store.update_run(run_id, status="running")
        return Run(self, run_id, method, request)


class CachedLLM:
    """A TextGenerator that answers from the store when the exact request was seen before."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.id = engine.model_id("llm")
        self._settings = getattr(engine.models.peek(engine.preset.llm), "generation_settings", None)

    def chat(self, messages, *, temperature: float = 1.0, max_tokens: int = 1024, seed: int = 0) -> str:
        """Returns the reply to `messages`, from the store when this exact request was answered before.
        The request recorded with the reply (its provenance, and part of its key) carries the backend's
        effective decoding settings (`generation_settings`), not only the temperature asked for."""
        request = {"messages": list(messages), "temperature": temperature, "max_tokens": max_tokens,
                   "seed": seed}
        if callable(self._settings):
            request["decoding"] = self._settings(temperature)
        key = content_key("llm", self.id, request)
        reply = self.engine.store.get_llm_reply(key)
        if reply is not None:
            self.engine.count(llm_cache_hits=1)
            return reply
        with self.engine._backend("llm") as llm:
            self.engine.charge(llm_calls=1, what="llm")   # every call a visitor's work makes, any backend
            reply = llm.chat(messages, temperature=temperature, max_tokens=max_tokens, seed=seed)
        self.engine.count(llm_calls=1)
        self.engine.store.put_llm_reply(key, self.id, request, reply)
        return reply


@dataclass
class Run:
    """A run record being written: images linked as they arrive, results at the end; and what
    this run used: its own stats and image API calls (made, and announced ahead by
    `announce_api_calls`), never another run's."""

    engine: Engine
    id: str
    method: str
    request: dict
    started: float = field(default_factory=time.perf_counter)
    stats: EngineStats = field(default_factory=EngineStats)
    api_calls: int = 0
    api_calls_announced: int = 0

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


def recorded(method: str, check: Callable | None = None, continues: Callable | None = None,
             priced: Callable | None = None):
    """Decorator for a method generator `fn(request, engine, run_record)`: creates its run record and
    marks it failed (with the message) or stopped when the consumer closes the stream early.
    Whatever the method stored before the failure stays in the store.

    `check(request, engine)` runs first and raises InputError for a request that cannot run
    (an empty prompt), so bad input never leaves a failed run behind. `continues(request)`
    returns the id of a stored run the request continues (a resume), which is reopened under
    its own id instead of creating a new one. `priced(request, engine)` returns the request as
    it will run, which admission checks and charges (a resume: the stored run's settings).

    The decorated function has `method`, `check` and `preflight(request, engine)`: those checks and the ranges of
    `limits.check_request`, starting nothing (a tab checks a request before its run streams)."""

    def preflight(request, engine: Engine) -> None:
        if check is not None:
            check(request, engine)
        limits.check_request(method, request, engine.preset.name)
        backend_choices.check_request(engine, request)

    def wrap(fn):
        @functools.wraps(fn)
        def run_method(request, engine: Engine):
            if check is not None:
                check(request, engine)
            cost = engine.admit(method, priced(request, engine) if priced else request)  # nothing stored if refused
            previous = continues(request) if continues is not None else None
            run = (engine.reopen_run(previous, method, _as_dict(request)) if previous
                   else engine.start_run(method, _as_dict(request), cost))
            finished, events = False, fn(request, engine.for_run(run), run)
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
        run_method.check = check
        run_method.preflight = preflight
        return run_method

    return wrap


def _as_dict(request) -> dict:
    if hasattr(request, "__dataclass_fields__"):
        from dataclasses import asdict

        return asdict(request)
    return dict(request)


class _Overlap:
    """Runs `evaluate(batch)` on one worker thread while the caller goes on generating: the VQA/CLIP of
    batch k overlaps the generation of batch k+1. `evaluate` only warms the store's caches (same keys
    as the method's own calls later), so a failure here is ignored: the method's call redoes the work
    and reports the error where it belongs."""

    def __init__(self, evaluate: Callable):
        from concurrent.futures import ThreadPoolExecutor

        self.evaluate = evaluate
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="gaplens-eval")
        self.futures = []

    def submit(self, batch) -> None:
        self.futures.append(self.pool.submit(self._quietly, list(batch)))

    def _quietly(self, batch) -> None:
        try:
            self.evaluate(batch)
        except Exception:  # noqa: BLE001 - see the class docstring
            pass

    def close(self, wait: bool) -> None:
        self.pool.shutdown(wait=wait, cancel_futures=not wait)


def stream_image_set(engine: Engine, run: Run, prompt: str, seeds: Sequence[int],
                     settings: GenerationSettings, label: str = "",
                     progress_offset: int = 0, progress_total: int | None = None,
                     evaluate: Callable | None = None):
    """Generate one image set, yielding Images and Progress events (with an ETA measured from
    the batches generated so far); returns the records in seed order (use `yield from`).

    `evaluate(batch)`, when given and the engine's models fit side by side
    (Engine.overlap_evaluation), runs on another thread for each batch as soon as it is stored,
    while the next batch generates; the set is returned once every evaluation has finished."""
    total = progress_total or len(seeds)
    by_seed: dict[int, ImageRecord] = {}
    calls = sources.api_calls_needed(engine, [(prompt, seeds, settings)])
    if calls and run.api_calls + calls > run.api_calls_announced:
        yield Warning(f"{calls} image API call(s) to {engine.model_id('generator')} for '{prompt}' (budget "
                      f"{engine.max_api_calls - run.api_calls} left in this run); API images are not seedable, "
                      "so regenerating them would not reproduce them: they are kept in the store")
    overlap = _Overlap(evaluate) if evaluate is not None and engine.overlap_evaluation else None
    finished = False
    try:
        yield from _stream_batches(engine, run, prompt, seeds, settings, label, progress_offset, total,
                                   by_seed, time.perf_counter(), overlap)
        finished = True
    finally:
        if overlap is not None:  # a stopped stream does not wait for evaluations nobody will read
            overlap.close(wait=finished)
    refused = [by_seed[s] for s in seeds if by_seed[s].refused]
    if refused:
        yield Warning(f"the API refused {len(refused)} of {len(seeds)} image(s) of '{prompt}' "
                      f"({refused[0].refused}); they are recorded as refused, not retried, and excluded "
                      "from every metric")
    return [by_seed[s] for s in seeds]


def _stream_batches(engine, run, prompt, seeds, settings, label, progress_offset, total, by_seed, start, overlap):
    generated = 0
    for batch in engine.images(prompt, seeds, settings):
        by_seed.update({r.seed: r for r in batch})
        run.add_images(batch, label)
        if overlap is not None:
            overlap.submit(batch)
        fresh = sum(not r.cached for r in batch)
        generated += fresh
        done = progress_offset + len(by_seed)
        eta = None
        if generated:
            per_image = (time.perf_counter() - start) / generated
            eta = per_image * max(0, total - done)
        yield Images(batch, label, done, total)
        yield Progress(done, total, "images", f"{done}/{total} images" + (f" ({label})" if label else ""), eta)


def _memory_summary(device: str | None) -> str:
    """Returns one line on device memory. Touches CUDA only once a model has chosen a CUDA device, and
    never on ZeroGPU, where the main process must not initialise CUDA."""
    import sys

    from ..backends.device import on_zero_gpu

    torch = sys.modules.get("torch")
    if (torch is not None and device and str(device).startswith("cuda") and not on_zero_gpu()
            and torch.cuda.is_available()):
        free, total = torch.cuda.mem_get_info()
        return f"GPU {torch.cuda.get_device_name(0)}: {(total - free) / 2**30:.1f} of {total / 2**30:.1f} GiB in use"
    if on_zero_gpu():
        return "ZeroGPU (a GPU is attached for each request)"
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        return f"CPU; this process peaked at {rss:.1f} GiB of RAM"
    except Exception:  # noqa: BLE001
        return "CPU"
