"""The Engine: one store, one model manager, one preset, shared by every tab, CLI and script.

Methods ask the engine for images, embeddings, VQA answers and LLM replies; the engine
serves each from the store when it can and computes (and stores) it otherwise.
"""
from __future__ import annotations

import copy
import os
from dataclasses import replace

from .. import __version__
from ..backends.base import GenerationSettings, ModelSpec, with_options
from ..common import access
from ..common.errors import InputError
from ..common.names import short_label
from ..hosting import backend_choices, limits, spending
from ..models import sources
from ..models.manager import ModelManager
from ..models.presets import resolve_preset
from ..store.store import Store
from .evaluators import CachedLLM, Evaluation
from .images import ImageMaking
from .run import EngineStats, Run, RunLifecycle, recorded, stream_image_set

# what methods and scripts import from here besides the Engine (the run lifecycle: engine/core/run.py)
__all__ = ["Engine", "EngineStats", "Run", "recorded", "stream_image_set", "CachedLLM", "DEFAULT_MAX_IMAGES",
           "DEFAULT_MAX_API_CALLS", "default_data_dir"]

DEFAULT_DATA_DIR = "~/.cache/gaplens"
DEFAULT_MAX_IMAGES = 128
DEFAULT_MAX_API_CALLS = 200   # image API calls one run may make (--max-api-calls)
MAX_PROMPT_CHARS = 1000


def default_data_dir() -> str:
    return os.environ.get("GAPLENS_DATA_DIR") or DEFAULT_DATA_DIR


class Engine(ImageMaking, Evaluation, RunLifecycle):
    """The engine (a view of it: `with_generator`, `for_run`). Its parts: models and request checks
    here, images (engine/core/images.py), evaluator caches (evaluators.py), runs (run.py)."""

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
        self.hardware_note: str | None = None   # a Space without a GPU: why visitors get no device model
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
        """The role's spec and what its loader needs (`_context_for`)."""
        spec = self.preset.specs()[role]
        return spec, self._context_for(spec)

    def _context_for(self, spec: ModelSpec) -> dict:
        """What the loader of `spec` needs: CLIP zero-shot VQA answers through the preset's embedder, so it
        gets the loaded one instead of loading a second copy; the distilled evaluator gets its loaded teacher
        (its own manager entry, shared with the teacher's view) and the embedder its probes read."""
        if spec.backend in ("openai_images", "openai_vqa"):   # remembers a server's listed model here
            return {"data_dir": str(self.store.data_dir)}
        if spec.backend == "clip_vqa":
            return {"embedder": self.models.get(self.preset.embedder)}
        if spec.backend == "distilled":
            from .distilled import teacher_spec

            teacher = teacher_spec(spec)
            return {"teacher": self.models.get(teacher, **self._context_for(teacher)), "teacher_spec": teacher,
                    "embedder": self.models.get(self.preset.embedder)}
        return {}

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
            "data_dir": str(self.store.data_dir.resolve()) if not self.public else "(hidden in public mode)",
            # a visitor sees their own runs only: the store-wide count would tell them everyone's activity
            "stored_images": self.store.count("images") if not self.public or access.visitor_for(True).host else None,
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

    def with_only_generator(self, spec: ModelSpec, compared, label: str = "") -> "Engine":
        """`with_generator(spec, label)` once every other generator of `compared` (and the preset's) is unloaded:
        a comparison holds one generator in memory at a time (a preloaded one stays)."""
        for other in {self.preset.generator, *compared} - {spec}:
            self.models.unload_unpinned(other)
        return self.with_generator(spec, label)

    def unload_generators(self, compared) -> None:
        """Unloads the generators of a finished comparison (`compared`), all but the preset's own."""
        for spec in set(compared) - {self.preset.generator}:
            self.models.unload_unpinned(spec)

    def for_parts(self) -> "Engine":
        """Returns a view of this engine whose runs are parts of one request charged up front (the
        languages method's run per language): they are not charged again."""
        view = copy.copy(self)
        view.prepaid = True
        return view

    def with_vqa(self, spec: ModelSpec) -> "Engine":
        """Returns a view of this engine whose preset has `spec` as its VQA evaluator (several evaluators
        on the same images): the store, model manager, other models and stats are shared; its answers
        are cached under their own evaluator id."""
        view = copy.copy(self)
        view.preset = replace(self.preset, vqa=spec)
        return view

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


def _memory_summary(device: str | None) -> str:
    """Returns one line on device memory. Touches CUDA only once a model has chosen a CUDA device, and
    never on ZeroGPU, where the main process must not initialise CUDA."""
    import sys

    from ..backends.device import on_zero_gpu

    torch = sys.modules.get("torch")
    if (torch is not None and device and str(device).startswith("cuda") and not on_zero_gpu()
            and torch.cuda.is_available()):
        index = torch.device(device).index or 0   # this process's GPU (a job's rank: cuda:LOCAL_RANK)
        free, total = torch.cuda.mem_get_info(index)
        return (f"GPU {index} {torch.cuda.get_device_name(index)}: {(total - free) / 2**30:.1f} of "
                f"{total / 2**30:.1f} GiB in use")
    if on_zero_gpu():
        return "ZeroGPU (a GPU is attached for each request)"
    try:
        import resource

        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
        return f"CPU; this process peaked at {rss:.1f} GiB of RAM"
    except Exception:  # noqa: BLE001
        return "CPU"
