"""The run lifecycle: a request is checked and admitted (budgets charged in public mode), its run
record created (or a stored one reopened), the method's events streamed while the run stores
what it makes, and the run marked done, failed or stopped. What one run uses (its stats, its
image API calls) is counted on its `Run`, never on the engine that visitors share."""
from __future__ import annotations

import copy
import functools
import logging
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .. import __version__
from ..backends.base import GenerationSettings
from ..common import access
from ..common.errors import GapLensError, InputError
from ..common.events import Done, Images, Progress, Warning
from ..hosting import backend_choices, limits, spending, storage
from ..models import sources
from ..store.store import ImageRecord

logger = logging.getLogger(__name__)


class RunLifecycle:
    """Engine's admission, charges and runs (a part of `Engine`)."""

    def admit(self, method: str, request, estimate: Callable[..., limits.Estimate]) -> int:
        """Check a request of `method` before any work starts or anything is stored: ranges always
        (limits.check); in public mode also the backends and files it names
        (backend_choices.check), the per-request budget, the store's room and the
        visitor's share of it (engine/hosting/storage.py), and the hourly budgets, which it is charged
        to (engine/hosting/spending.py). `estimate(request, until_cap, proposed)`: what it can spend
        (its method's, engine.methods.METHODS). Returns the most images it can generate.
        InputError / OverBudgetError / StoreError."""
        limits.check(request, self.preset.name)
        backend_choices.check(self, request)   # public mode: no backend, server or file but the host's
        visitor = access.visitor_for(self.public)
        charged = self.public and not visitor.host and not self.prepaid
        cost = estimate(request, until_cap=self.max_set_images(), proposed=self.budget.images if charged else None)
        if not self.public:
            return cost.images
        if charged:
            limits.check_budget(request, self.budget, cost)
        storage.require_room(self.store)
        if charged:
            settings, fields = self.default_settings(), _as_dict(request)
            storage.check_share(self.store, visitor, cost.images * storage.image_bytes(
                fields.get("width") or settings.width, fields.get("height") or settings.height))
            spending.charge(self.store, self.budget, visitor, {"images": cost.images},
                            {"llm_calls": cost.llm_calls}, what=method)
        return cost.images

    def afford(self, what: str, **needed: int) -> None:
        """OverBudgetError unless the current visitor's hourly budgets still hold `needed` ({kind: amount},
        `spending.KINDS`): the most that work charged as it is made (an LLM call at a time) can spend,
        checked before any of it, as admission checks a run's estimate. Nothing in local mode, for the host
        or in a view whose work was charged up front (compare models)."""
        visitor = access.visitor_for(self.public)
        if self.public and not visitor.host and not self.prepaid:
            spending.charge(self.store, self.budget, visitor, {}, needed, what=what)

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

    def fit_proposed_axes(self, estimate: Callable, request, axes: dict, share: int = 1) -> tuple[dict, list[str]]:
        """The LLM-proposed `axes` a visitor's request keeps: those whose sets fit what it was
        charged (one request's images, divided among `share` runs; `estimate`: its method's), in
        the LLM's order, and the axes left out. Everything in local mode and for the host."""
        if not self.public or access.visitor_for(True).host:
            return axes, []
        return limits.fit_axes(estimate, request, axes, self.budget.images // max(1, share))

    def start_run(self, method: str, request: dict, cost: int = 0) -> "Run":
        models = {role: spec.full_label for role, spec in self.preset.specs().items()}
        return Run(self, self.store.create_run(method, request, models, __version__, cost=cost), method, request)

    def reopen_run(self, run_id: str, method: str, request: dict) -> "Run":
        """The stored run `run_id` in status 'running' again, to be continued under its own id
        (a resumed search); InputError when there is no such run of that method."""
        record = self.store.get_run(run_id)
        if record is None or record["method"] != method or not self.store.run_writable(run_id):
            raise InputError(f"no {method} run '{run_id}' of yours in the store")
        self.store.update_run(run_id, status="running", ended=False)
        return Run(self, run_id, method, request)

    def for_run(self, run: Run):
        """Returns a view of this engine working for `run` (what `recorded` hands a method): the
        store, models, preset and engine-wide stats are shared; what one run uses (its image API
        calls, its own stats) is counted on the run, so visitors' runs at once never mix them."""
        view = copy.copy(self)
        view.run = run
        threshold = (run.request or {}).get("cant_tell_below")
        if threshold is not None:   # the request's "can't tell" threshold (engine.methods.options)
            view.cant_tell_below = float(threshold)
        return view

    def count(self, **counts: int) -> None:
        """Adds to the engine-wide stats and, in a run's view, to the run's own."""
        self.stats.add(**counts)
        if self.run is not None:
            self.run.stats.add(**counts)


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


PROMPT_NOTES_NAMED = 3   # a run over many prompts (the occupation study) names this many, then says there are more


@dataclass
class Run:
    """A run record being written: images linked as they arrive, results at the end; and what
    this run used: its own stats and image API calls (made, and announced ahead by
    `announce_api_calls`), never another run's."""

    engine: Any   # the Engine (engine/core/engine.py) whose store keeps the run
    id: str
    method: str
    request: dict
    started: float = field(default_factory=time.perf_counter)
    stats: EngineStats = field(default_factory=EngineStats)
    api_calls: int = 0
    api_calls_announced: int = 0
    noted_prompts: set = field(default_factory=set)   # prompts whose generator note (prompt_note) was given

    def add_images(self, records: Sequence[ImageRecord], label: str = "") -> None:
        self.engine.store.add_run_images(self.id, [r.key for r in records], label)

    def save(self, results: dict, summary: dict | None = None) -> None:
        """Store partial results (kept even if the run fails later)."""
        self.engine.store.update_run(self.id, results=results, summary=summary)

    def optional(self, results: dict, part: str, what: str, compute: Callable[[], Any]):
        """Runs an optional step (the gap score, captions, Top-K concepts) so that its failure never
        loses the run (use `yield from`): returns `compute()`, or None when it raised; then
        `results["notes"]` gets {"part": part, "note": ...} saying what is missing and why (the
        results omit `part`), the run is saved and a Warning with the note is yielded."""
        try:
            return compute()
        except Exception as exc:  # noqa: BLE001 - an optional step's failure is reported, never fatal
            if not isinstance(exc, GapLensError):
                logger.exception("optional step %s failed", part)
            reason = str(exc).strip() or type(exc).__name__
            note = f"{what} is missing: {reason}; the rest of the run was measured"
            results.setdefault("notes", []).append({"part": part, "note": note})
            results.pop(part, None)
            self.save(results)
            yield Warning(note)
            return None

    def finish(self, results: dict, summary: dict | None = None) -> Done:
        summary = dict(summary or {})
        summary.setdefault("seconds", round(time.perf_counter() - self.started, 2))
        self.engine.store.update_run(self.id, status="done", results=results, summary=summary, ended=True)
        return Done(self.id, results, summary)


def recorded(method: str, check: Callable, estimate: Callable[..., limits.Estimate], *,
             continues: Callable | None = None, priced: Callable | None = None):
    """Decorator for a method generator `fn(request, engine, run_record)`: creates its run record and
    marks it failed (with the message) or stopped when the consumer closes the stream early.
    Whatever the method stored before the failure stays in the store.

    `check(request, engine)` runs first and raises InputError for a request that cannot run
    (an empty prompt), so bad input never leaves a failed run behind. `estimate(request,
    until_cap=None, proposed=None) -> limits.Estimate` is what the request can spend, which
    admission bounds and charges (Engine.admit). `continues(request)` returns the id of a
    stored run the request continues (a resume), which is reopened under its own id instead of
    creating a new one. `priced(request, engine)` returns the request as
    it will run, which admission checks and charges (a resume: the stored run's settings).

    The decorated function has `method`, `check` and `estimate` (engine.methods.METHODS reads
    them) and `preflight(request, engine)`: the checks and the ranges of `limits.check`,
    starting nothing (a tab checks a request before its run streams)."""

    def preflight(request, engine) -> None:
        limits.check_request_texts(request)   # first: a method's check may look a text up in the store
        check(request, engine)
        limits.check(request, engine.preset.name)
        backend_choices.check(engine, request)

    def wrap(fn):
        @functools.wraps(fn)
        def run_method(request, engine):
            limits.check_request_texts(request)
            check(request, engine)
            # nothing stored if refused
            cost = engine.admit(method, priced(request, engine) if priced else request, estimate)
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
                    engine.store.update_run(run.id, status="stopped", ended=True)
                raise
            except GapLensError as exc:
                engine.store.update_run(run.id, status="failed", error=str(exc), ended=True)
                raise
            except Exception as exc:
                engine.store.update_run(run.id, status="failed", ended=True,
                                        error="".join(traceback.format_exception_only(type(exc), exc)).strip())
                raise
        run_method.method = method
        run_method.check, run_method.estimate, run_method.preflight = check, estimate, preflight
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


def stream_image_set(engine, run: Run, prompt: str, seeds: Sequence[int],
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
    note = engine.prompt_note(prompt) if prompt not in run.noted_prompts else None
    if note:   # e.g. a subject the synthetic world does not know: its default figure, not what was asked
        run.noted_prompts.add(prompt)
        if len(run.noted_prompts) <= PROMPT_NOTES_NAMED:
            yield Warning(note)
        elif len(run.noted_prompts) == PROMPT_NOTES_NAMED + 1:
            yield Warning(f"more than {PROMPT_NOTES_NAMED} of this run's prompts get such a note (the next is "
                          f"'{prompt}'); the others are not named one by one")
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
