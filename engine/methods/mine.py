"""Mine Prompts: MineTheGap's genetic search for the prompts a model is most biased on, and a
"random prompts, same budget" baseline. Spec: minethegap-and-biasbench.md A.3-A.5, A.9.

The paper's text and code are not public, so the loop below is a RECONSTRUCTION
(docs/spec/minethegap-and-biasbench.md A.4) that follows the project page's animation: score a population of b
prompts with the gap score (A.3, lower = more biased), archive the s most biased, ask the LLM for m mutations of
each, inject r = b - s*m random LLM prompts, repeat T times. Parents are dropped unless
`keep_parents` (elitism) is set. Prompts are de-duplicated across the run (exactly and after
lower-casing / collapsing spaces) and the LLM is re-asked when a reply repeats one.

Reproducible: a prompt's score depends only on the prompt and the image/variation settings
(images use seeds image_seed..image_seed+n-1, variations the LLM seed image_seed, as in
Single Prompt), and every mutation / random-prompt call uses an LLM seed derived from the GA
seed, the iteration and the parent, so the same seed and cache replay the same run.

The whole GA state is saved in the run record as it goes (`run_record.save`): stop at any time and
resume with `MineRequest(resume=run_id)` (CLI `--resume RUN_ID`); nothing already generated
is generated again.
"""
from __future__ import annotations

import hashlib
import os
import threading
import time
from collections import OrderedDict
from dataclasses import asdict, dataclass, field, replace
from typing import TypedDict

import numpy as np

from ..backends.base import GenerationSettings
from ..backends.llm_json import JSON_ATTEMPTS, as_string_list
from ..common.errors import GapLensError, InputError, LLMOutputError
from ..common.events import Event, Images, Progress, Table, Warning
from ..common.llm_prompts import mutations_prompt, random_prompts_prompt
from ..common.scores import number
from ..core.distributed import distributed_evaluation, distributed_image_sets
from ..core.engine import Engine, EngineStats, Run, recorded
from ..hosting.limits import Estimate
from ..metrics.gap import COMBINATIONS, resampled_gap_scores
from ..metrics.intervals import headline_claim
from ..models import sources
from ..store.store import ImageRecord, image_key
from .measure import gap_for_images
from .options import GenerationOptions, settings_for, settle_settings

DEFAULT_ITERATIONS = 5          # spec A.4: the paper's budget is 30; 5 for interactive use
MAX_ITERATIONS = 200
MAX_POPULATION = 64
STRATEGIES = ("ga", "random", "source")   # "source": rank the prompts a folder/dataset holds

# Specific-bias modes (spec A.4-A.5, project page): what the variations may vary, and what every
# random prompt must contain. Any other text is taken as the axis itself ("hair colour").
BIAS_MODES = {
    "open": (None, None),
    "socio-demographic": ("the people's gender, age, ethnicity and disability", "at least one person"),
    "style": ("the art style and medium", None),
    "objects": ("the objects present and their colours", "an object with a colour"),
}


@dataclass(frozen=True)
class MineStarted(Event):
    """The run `run_id` started (or continues `resumed_from`) with `strategy` and `params`
    (MineResults["params"])."""

    run_id: str
    strategy: str
    params: dict
    resumed_from: str | None = None


@dataclass(frozen=True)
class PromptScored(Event):
    """A prompt of the population of iteration `iteration` got its gap score: `node` is its node
    (id, prompt, score and its terms, origin, parent)."""

    iteration: int
    node: dict


@dataclass(frozen=True)
class IterationDone(Event):
    """Iteration `iteration` finished: `record` (population, selected, best, mean), the best score
    per iteration and the best so far (the chart's two lines), and the archive."""

    iteration: int
    record: dict
    best_per_iteration: list
    best_so_far: list
    archive: list


@dataclass
class MineRequest(GenerationOptions):
    iterations: int | None = field(default=None, metadata={"short": "-T", "help": (
        f"T, iterations (default {DEFAULT_ITERATIONS}; the paper's budget is 30; on --resume: keep the run's)")})
    population: int = field(default=12, metadata={"short": "-b", "help": "b, prompts scored per iteration"})
    select: int = field(default=3, metadata={"short": "-s", "help": "s, most biased prompts kept per iteration"})
    mutations: int = field(default=3, metadata={
        "short": "-m", "help": "m, LLM mutations per selected prompt (r = b - s*m random prompts)"})
    n: int = field(default=16, metadata={"flag": "-n", "help": "images per prompt"})
    n_variations: int | None = field(default=None, metadata={
        "flag": "--variations", "help": "LLM text variations per prompt (default: n)"})
    alpha: float = field(default=25.0, metadata={"help": "gap-score percentile (spec A.3)"})
    combine: str = field(default="diff", metadata={"help": "how the gap score combines its terms",
                                                   "choices": COMBINATIONS})
    keep_parents: bool = field(default=False, metadata={"help": "elitism: keep the selected prompts"})
    bias: str = field(default="open", metadata={
        "help": "open, socio-demographic, style, objects, or an axis in words (specific-bias mode)"})
    strategy: str = field(default="ga", metadata={
        "help": "ga; random: the same budget spent on random LLM prompts (baseline); source: rank the prompts "
                "a folder/dataset generator holds", "choices": STRATEGIES})
    seed: int = field(default=0, metadata={"help": "GA seed (LLM mutation and random-prompt calls)"})
    image_seed: int = field(default=0, metadata={
        "help": "first image seed (images use image_seed..image_seed+n-1; also the variations' LLM seed)"})
    max_requery: int = 3            # extra LLM calls when a reply repeats prompts already seen
    resume: str | None = field(default=None, metadata={
        "metavar": "RUN_ID", "help": "continue a stopped run (its settings; T may grow)"})

    @property
    def random_count(self) -> int:
        """r: random prompts injected per iteration."""
        return self.population if self.strategy == "random" else self.population - self.select * self.mutations

    def seeds(self) -> list[int]:
        return list(range(self.image_seed, self.image_seed + self.n))


def bias_axis(bias: str | None) -> tuple[str | None, str | None]:
    """(axis the variations and mutations are restricted to, what random prompts must include)."""
    key = (bias or "open").strip().lower()
    if key in ("", "open", "open-set", "open set"):
        return None, None
    return BIAS_MODES.get(key, (bias.strip(), None))


def normalise_prompt(prompt: str) -> str:
    """The de-duplication key: lower case, runs of spaces collapsed, outer quotes/punctuation dropped."""
    return " ".join(prompt.lower().split()).strip(" \"'.,;:!")


def _llm_seed(*parts) -> int:
    return int.from_bytes(hashlib.sha256("\x1f".join(map(str, parts)).encode()).digest()[:4], "little") >> 1


# Gap results by everything that determines them (store, models, prompt, seeds, settings, score
# parameters): a GA revisits prompts across iterations, seeds, resumes and baselines.
_SCORE_MEMO: OrderedDict = OrderedDict()
_MEMO_LOCK = threading.Lock()
MEMO_SIZE = 20000

# Measured speeds (seconds per generated image / per LLM call) by model id, for budget ETAs.
SPEEDS: dict[str, float] = {}


def _measure(model_id: str, seconds: float, units: int) -> None:
    if units > 0:
        new = seconds / units
        old = SPEEDS.get(model_id)
        SPEEDS[model_id] = new if old is None else 0.7 * old + 0.3 * new


def effective_request(request: MineRequest, engine: Engine) -> MineRequest:
    """The request as it runs, with defaults filled in; InputError naming the first bad setting."""
    if request.strategy == "source":
        if sources.source_kind(engine) != "source":
            raise InputError("strategy 'source' ranks the prompts of a folder or dataset generator "
                             "(--generator folder:PATH); this generator makes new images: use ga or random")
    else:
        try:
            sources.require_new_images(engine, "Mine Prompts")
        except InputError as exc:
            raise InputError(f"{exc}; or mine with strategy 'source', which ranks the source's prompts by their "
                             "gap score") from None
    iterations = DEFAULT_ITERATIONS if request.iterations in (None, 0) else request.iterations
    request = replace(request, iterations=int(iterations), n_variations=request.n_variations or request.n)
    if request.strategy not in STRATEGIES:
        raise InputError(f"strategy must be one of {', '.join(STRATEGIES)}, not '{request.strategy}'")
    if not 1 <= request.iterations <= MAX_ITERATIONS:
        raise InputError(f"iterations (T) must be between 1 and {MAX_ITERATIONS}, got {request.iterations}")
    if not 2 <= request.population <= MAX_POPULATION:
        raise InputError(f"the population (b) must be between 2 and {MAX_POPULATION}, got {request.population}")
    if not 1 <= request.select <= request.population:
        raise InputError(f"the number selected per iteration (s) must be between 1 and the population "
                         f"({request.population}), got {request.select}")
    if request.strategy == "source":
        have = [p for p, k in sources.source_prompts(engine).items() if k >= request.n]
        if not have:
            raise InputError(f"no prompt of the source has {request.n} images; lower N")
        request = replace(request, iterations=min(request.iterations, -(-len(have) // request.population)))
    if request.strategy == "ga":
        if request.mutations < 1:
            raise InputError(f"mutations per selected prompt (m) must be at least 1, got {request.mutations}")
        if request.random_count < 1:
            raise InputError(f"b - s*m = {request.population} - {request.select}*{request.mutations} = "
                             f"{request.random_count}: the population must leave room for at least one random "
                             "prompt per iteration (raise b or lower s or m)")
    engine.check_n(request.n)
    engine.check_n(request.n_variations, "number of text variations")
    if request.n < 2:
        raise InputError("the gap score needs at least 2 images per prompt")
    if not 0 <= request.alpha <= 100:
        raise InputError(f"alpha is a percentile between 0 and 100, got {request.alpha}")
    if request.combine not in COMBINATIONS:
        raise InputError(f"combine must be one of {', '.join(COMBINATIONS)}, not '{request.combine}'")
    return request


def load_resumable(engine: Engine, run_id: str) -> dict:
    """The stored record of a mine run that can be resumed; InputError otherwise."""
    record = engine.store.require_run(run_id, "mine", "Mine Prompts run")
    if not record["results"].get("nodes"):
        raise InputError(f"run '{run_id}' stopped before it saved any state; start a new run instead")
    return record


def resolve(request: MineRequest, engine: Engine) -> tuple[MineRequest, dict | None]:
    """The effective request and, when resuming, the stored results to continue from."""
    if not request.resume:
        return effective_request(request, engine), None
    record = load_resumable(engine, request.resume)
    stored = {k: v for k, v in record["results"]["request"].items() if k in MineRequest.__dataclass_fields__}
    effective = MineRequest(**{**stored, "resume": request.resume,
                               "iterations": request.iterations or stored["iterations"]})
    done = len(record["results"].get("iterations", []))
    if done >= effective.iterations:
        raise InputError(f"run '{request.resume}' has finished its {done} iterations; raise T above {done} "
                         "to continue it")
    return effective_request(effective, engine), record["results"]


class CacheMiss(GapLensError):
    """A budget preview needed something the store does not hold."""


class _CacheOnlyEngine(Engine):
    """The engine reading only the store: any model call raises CacheMiss (budget previews).
    It shares the store, the models and the preset; its stats count what the store served."""

    def __init__(self, engine: Engine):  # noqa: D107 - deliberately no Engine.__init__
        self.__dict__.update(engine.__dict__)
        self.stats = EngineStats()
        self.run = None   # a preview is no run's work: it counts in its own stats only
        self.real = engine

    def default_settings(self) -> GenerationSettings:
        return self.real.default_settings()

    def _backend(self, role: str):
        raise CacheMiss(f"the store has no cached {role} output for this")


class Miner:
    """The GA (or the random baseline) with its whole state; `steps()` runs it as events."""

    def __init__(self, request: MineRequest, engine: Engine, run_record: Run | None, stored: dict | None = None):
        self.request, self.engine, self.run_record = request, engine, run_record
        self.settings = settings_for(request, engine)
        self.axis, self.needs = bias_axis(request.bias)
        self.model_ids = {role: engine.model_id(role) for role in ("generator", "embedder", "llm")}
        stored = stored or {}
        if stored and stored.get("model_ids") != self.model_ids:
            raise InputError(f"run '{request.resume}' was made with {stored.get('model_ids')}; this engine has "
                             f"{self.model_ids}. Start GapLens with the run's preset to resume it")
        self.nodes: list[dict] = [dict(n) for n in stored.get("nodes", [])]
        self.iterations: list[dict] = [dict(i) for i in stored.get("iterations", [])]
        self.pending: dict | None = stored.get("pending")
        self.details: dict[str, dict] = dict(stored.get("details", {}))
        # runs this search continued from (a resume continues under the same id: not listed again)
        chain = list(stored.get("run_chain", []))
        if request.resume and request.resume not in chain and (run_record is None or run_record.id != request.resume):
            chain.append(request.resume)
        self.run_chain: list[str] = chain
        self.by_id = {n["id"]: n for n in self.nodes}
        self.seen = {normalise_prompt(n["prompt"]) for n in self.nodes}
        self.warnings: list[str] = []
        self.end_reason: str | None = None     # why the search ended before T iterations
        self.scored_here = 0
        self.from_memory = 0      # images served from the in-process score memo
        self.use_memo = not isinstance(engine, _CacheOnlyEngine)   # a budget replay counts store hits
        self.started = time.perf_counter()
        self.last_save = 0.0

    # -- events ---------------------------------------------------------------------------------
    def steps(self):
        """Run the remaining iterations, yielding events; the state is saved as it goes."""
        try:
            yield from self._loop()
        except BaseException:     # stopped (GeneratorExit) or failed: keep the state
            self.save(force=True)
            raise

    def _loop(self):
        T = self.request.iterations
        while len(self.iterations) < T:
            t = len(self.iterations)
            if not self.pending or self.pending["iteration"] != t:
                what = ("the source's next prompts" if self.request.strategy == "source" else
                        "random prompts" if t == 0 or self.request.strategy == "random" else "mutations")
                yield Progress(self.scored_total(), self.total_to_score(), "llm",
                               f"iteration {t + 1}/{T}: asking the LLM for {what}")
                self.pending = {"iteration": t, "population": self._make_population(t)}
                self.save(force=True)
                while self.warnings:
                    yield Warning(self.warnings.pop(0))
            population = [self.by_id[i] for i in self.pending["population"]]
            if not population:
                self.end_reason = f"the LLM gave no new prompt at iteration {t + 1} of {T}"
                yield Warning(f"iteration {t + 1}: the LLM gave no new prompt; the search stops here")
                break
            todo = [n for n in population if n.get("score") is None and not n.get("skipped")]
            sets = [(n["prompt"], self.request.seeds(), self.settings) for n in todo]
            yield from distributed_image_sets(self.engine, sets)  # launched: every process
            yield from distributed_evaluation(self.engine, sets, embed=True)
            for k, node in enumerate(population):
                if node.get("score") is None and not node.get("skipped"):
                    yield from self._score(node, t)
                    self.save()
                yield self._progress(t, k + 1, len(population))
            yield from self._finish_iteration(t, population)

    def _progress(self, t: int, k: int, size: int) -> Progress:
        done, total = self.scored_total(), self.total_to_score()
        elapsed = time.perf_counter() - self.started
        eta = elapsed / self.scored_here * max(0, total - done) if self.scored_here else None
        best = self.best_score()
        return Progress(done, total, "mine", f"iteration {t + 1}/{self.request.iterations}: {k}/{size} prompts "
                        f"scored" + (f", best {best:.3f}" if best is not None else ""), eta)

    def _score(self, node: dict, t: int):
        """Generate (or fetch) the prompt's images and compute its gap score."""
        records, gap, skipped = self._images_and_gap(node["prompt"])
        if self.run_record is not None:
            self.run_record.add_images(records, node["id"])
        yield Images(records, node["prompt"], self.scored_total() + 1, self.total_to_score())
        if skipped:
            node["skipped"] = skipped
            yield Warning(f"'{node['prompt']}' is not scored: {skipped}")
            return
        node.update(score=round(gap["score"], 6), coverage_term=round(gap["coverage_term"], 6),
                    alignment_term=round(gap["alignment_term"], 6), scored_in=t)
        flagged = sum(r.nsfw for r in records)
        if flagged:
            node["flagged"] = flagged
        self.details[node["id"]] = gap
        self.scored_here += 1
        yield PromptScored(t, dict(node))

    def _images_and_gap(self, prompt: str):
        """(image records, compact gap result, reason it was not scored); served from this
        process's memory when the same prompt was scored with the same settings and store."""
        engine, request = self.engine, self.request
        memo_key = (str(engine.store.db_path), tuple(sorted(self.model_ids.items())), prompt, tuple(request.seeds()),
                    tuple(sorted(self.settings.__dict__.items())), request.n_variations, request.alpha,
                    request.combine, request.image_seed, self.axis)
        with _MEMO_LOCK:
            hit = _SCORE_MEMO.get(memo_key) if self.use_memo else None
            if hit is not None:
                _SCORE_MEMO.move_to_end(memo_key)
        if hit is not None and all(os.path.exists(row[3]) for row in hit[0]):   # images not deleted since
            rows, gap, skipped = hit
            self.from_memory += len(rows)
            return [ImageRecord(*row, cached=True) for row in rows], gap, skipped
        made, start = engine.stats.images_generated, time.perf_counter()
        by_seed = {}
        for batch in engine.images(prompt, request.seeds(), self.settings):
            by_seed.update({r.seed: r for r in batch})
        if engine.stats.images_generated > made:
            _measure(self.model_ids["generator"], time.perf_counter() - start, engine.stats.images_generated - made)
        records = [by_seed[s] for s in request.seeds()]
        valid = [r for r in records if not r.nsfw]
        gap, skipped = None, None
        if len(valid) < 2:
            skipped = f"{len(records) - len(valid)} of {len(records)} images flagged by the safety checker"
        else:
            calls, start = engine.stats.llm_calls, time.perf_counter()
            gap = _compact(gap_for_images(engine, prompt, valid, engine.embed_images(valid), request.n_variations,
                                          request.alpha, request.combine, seed=request.image_seed, axis=self.axis))
            if engine.stats.llm_calls > calls:
                _measure(self.model_ids["llm"], time.perf_counter() - start, engine.stats.llm_calls - calls)
        with _MEMO_LOCK:
            _SCORE_MEMO[memo_key] = ([(r.key, r.prompt, r.seed, r.path, r.nsfw) for r in records], gap, skipped)
            while len(_SCORE_MEMO) > MEMO_SIZE:
                _SCORE_MEMO.popitem(last=False)
        return records, gap, skipped

    def _finish_iteration(self, t: int, population: list[dict]):
        scored = sorted((n for n in population if n.get("score") is not None),
                        key=lambda n: (n["score"], self._index(n)))
        selected = [n["id"] for n in scored[:self.request.select]]
        archived = {i for it in self.iterations for i in it["selected"]}
        record = {"iteration": t, "population": [n["id"] for n in population], "selected": selected,
                  "best": scored[0]["score"] if scored else None, "best_id": scored[0]["id"] if scored else None,
                  "mean": float(np.mean([n["score"] for n in scored])) if scored else None}
        self.iterations.append(record)
        for i in selected:
            if i not in archived:
                self.by_id[i]["archived_in"] = t
        keep = archived | set(selected)
        self.details = {i: d for i, d in self.details.items() if i in keep}
        self.pending = None
        self.save(force=True)
        yield IterationDone(t, dict(record), self.best_per_iteration(), self.best_so_far(), self.archive())
        yield Table("population", POPULATION_COLUMNS, population_rows(self.results(), t))
        yield Table("archive", ARCHIVE_COLUMNS, archive_rows(self.archive()))

    # -- populations ----------------------------------------------------------------------------
    def _make_population(self, t: int) -> list[str]:
        """Ids of iteration t's population: new nodes are created here (and only here)."""
        request, b = self.request, self.request.population
        if request.strategy == "source":   # the source's next b prompts with N images, in its order
            fresh = [p for p, k in sources.source_prompts(self.engine).items()
                     if k >= request.n and normalise_prompt(p) not in self.seen][:b]
            return [self._new_node(p, t, "source", None)["id"] for p in fresh]
        kept, children = [], []
        if t > 0 and request.strategy == "ga":
            parents = [self.by_id[i] for i in self.iterations[t - 1]["selected"]]
            if request.keep_parents:
                kept = [p["id"] for p in parents]
            for parent in parents:
                for prompt in self._ask_prompts("mutate", t, request.mutations, parent["prompt"]):
                    children.append(self._new_node(prompt, t, "mutation", parent["id"]))
        n_random = b - len(children)
        randoms = [self._new_node(p, t, "random", None) for p in self._ask_prompts("random", t, n_random)]
        if len(children) + len(randoms) < b:
            self.warnings.append(f"iteration {t + 1}: only {len(children) + len(randoms)} new prompts of {b} "
                                 "after de-duplication; the population is smaller this time")
        return kept + [n["id"] for n in children + randoms]

    def _ask_prompts(self, kind: str, t: int, want: int, parent: str | None = None) -> list[str]:
        """`want` new prompts (not seen in this run) from the mutation or random-prompt
        meta-prompt, re-asking with another LLM seed while replies repeat seen prompts."""
        got: list[str] = []
        for attempt in range(1 + self.request.max_requery):
            need = want - len(got)
            if need <= 0:
                break
            if kind == "mutate":
                message = mutations_prompt(parent, need, self.axis)
                seed, temperature = _llm_seed(self.request.seed, "mutate", t, parent, attempt), 0.8
            else:
                recent = [n["prompt"] for n in self.nodes[-20:]] + got
                message = random_prompts_prompt(need, recent[-20:], self.needs)
                seed, temperature = _llm_seed(self.request.seed, "random", t, attempt), 1.0
            try:
                replies = self.engine.ask_json([{"role": "user", "content": message}],
                                               as_string_list(1, need * 2 + 2, 40),
                                               temperature=temperature, seed=seed)
            except LLMOutputError as exc:
                self.warnings.append(f"iteration {t + 1}: {exc}")
                continue
            for prompt in replies:
                prompt, key = " ".join(prompt.split()), normalise_prompt(prompt)
                if key and len(prompt) <= 300 and key not in self.seen and len(got) < want:
                    self.seen.add(key)
                    got.append(prompt)
        return got

    def _new_node(self, prompt: str, t: int, origin: str, parent: str | None) -> dict:
        node = {"id": f"p{len(self.nodes)}", "prompt": prompt, "origin": origin, "parent": parent, "born": t,
                "score": None}
        self.nodes.append(node)
        self.by_id[node["id"]] = node
        self.seen.add(normalise_prompt(prompt))
        return node

    # -- summaries ------------------------------------------------------------------------------
    def _index(self, node: dict) -> int:
        return int(node["id"][1:])

    def total_to_score(self) -> int:
        return self.request.iterations * self.request.population

    def scored_total(self) -> int:
        return sum(n.get("score") is not None or bool(n.get("skipped")) for n in self.nodes)

    def best_score(self) -> float | None:
        scores = [n["score"] for n in self.nodes if n.get("score") is not None]
        return min(scores) if scores else None

    def best_per_iteration(self) -> list[float | None]:
        return [it["best"] for it in self.iterations]

    def best_so_far(self) -> list[float | None]:
        out, best = [], None
        for value in self.best_per_iteration():
            best = value if best is None or (value is not None and value < best) else best
            out.append(best)
        return out

    def archive(self) -> list[dict]:
        """Every selected prompt once, most biased first, with its lineage."""
        ids = list(dict.fromkeys(i for it in self.iterations for i in it["selected"]))
        nodes = sorted((self.by_id[i] for i in ids), key=lambda n: (n["score"], self._index(n)))
        return [{"rank": k + 1, **n, "lineage": [a["prompt"] for a in ancestry(self.by_id, n["id"])]}
                for k, n in enumerate(nodes)]

    def results(self) -> dict:
        request = self.request
        return {
            "strategy": request.strategy, "bias": request.bias or "open", "axis": self.axis,
            "request": asdict(request),
            "params": {"b": request.population, "s": request.select, "m": request.mutations,
                       "r": request.random_count, "T": request.iterations, "n": request.n,
                       "n_variations": request.n_variations, "alpha": request.alpha, "combine": request.combine,
                       "keep_parents": request.keep_parents, "seed": request.seed, "image_seed": request.image_seed},
            "settings": self.settings.__dict__, "model_ids": self.model_ids, "image_seeds": request.seeds(),
            "archive": self.archive(), "headline": best_prompt_claim(self.archive(), self.details, request),
            "best_per_iteration": self.best_per_iteration(), "best_so_far": self.best_so_far(),
            "iterations": self.iterations, "nodes": self.nodes, "details": self.details, "pending": self.pending,
            "complete": len(self.iterations) >= request.iterations and not self.pending,
            "end_reason": self.end_reason, "run_chain": self.run_chain, "resumed_from": request.resume,
            "reconstructed": "gap score (spec A.3) and GA defaults (A.4) are a reconstruction",
        }

    def save(self, force: bool = False) -> None:
        now = time.perf_counter()
        if self.run_record is not None and (force or now - self.last_save > 1.0):
            self.run_record.save(self.results(), self.summary())
            self.last_save = now

    def summary(self) -> dict:
        archive = self.archive()
        return {"best_score": archive[0]["score"] if archive else None,
                "best_prompt": archive[0]["prompt"] if archive else None,
                "iterations": len(self.iterations), "prompts_scored": self.scored_total(),
                "top": [f"{a['score']:.3f} {a['prompt']}" for a in archive[:3]],
                "strategy": self.request.strategy}


def best_prompt_claim(archive: list[dict], details: dict, request, n_draws: int = 200) -> dict | None:
    """Issue 16 for mining: the most biased archived prompt (lowest gap score) with the bootstrap
    probability that it is the lowest, or "no clear winner" and the N that would settle it.
    Texts and images of every prompt's similarity matrix are resampled with the same indices in
    draw b (resampling lowers every coverage score alike, so the ranking, not the level, is what
    the draws measure). None with fewer than two scored archived prompts."""
    scored = [a for a in archive if a.get("score") is not None and a["id"] in details]
    if len(scored) < 2:
        return None
    rng = np.random.default_rng(request.image_seed)
    values, draws = {}, {}
    shapes = {np.asarray(details[a["id"]]["similarity"]).shape for a in scored}
    rows = {shape: rng.integers(0, shape[0], size=(n_draws, shape[0])) for shape in shapes}
    cols = {shape: rng.integers(0, shape[1], size=(n_draws, shape[1])) for shape in shapes}
    for a in scored:
        sim = np.asarray(details[a["id"]]["similarity"], float)
        r, c = rows[sim.shape], cols[sim.shape]
        values[a["prompt"]] = float(a["score"])
        draws[a["prompt"]] = resampled_gap_scores(sim, r, c, request.alpha, request.combine)
    return headline_claim(values, draws, request.n, largest=False, what="most biased prompt (lowest gap score)",
                          fmt="{:.3f}")


def _compact(gap: dict) -> dict:
    """The gap result with its matrices rounded (it is stored for every archived prompt)."""
    out = dict(gap)
    out["similarity"] = [[round(v, 4) for v in row] for row in gap["similarity"]]
    out["coverage"] = [round(v, 4) for v in gap["coverage"]]
    out["alignment"] = [round(v, 4) for v in gap["alignment"]]
    return out


def ancestry(nodes_by_id: dict, node_id: str) -> list[dict]:
    """The nodes from the oldest ancestor down to this one (parent -> child)."""
    chain: list[dict] = []
    while node_id in nodes_by_id and nodes_by_id[node_id] not in chain:
        chain.append(nodes_by_id[node_id])
        node_id = nodes_by_id[node_id].get("parent")
    return chain[::-1]


POPULATION_COLUMNS = ["id", "prompt", "gap score", "origin", "parent"]
UNSCORED = "—"   # the gap score cell of a prompt not scored yet (not 0, which is a score)
ARCHIVE_COLUMNS = ["rank", "gap score", "prompt", "iteration", "origin", "ancestors"]


def population_rows(results: dict, iteration: int) -> list[list]:
    """One iteration's population, most biased first (unscored ones last, their gap score "—")."""
    by_id = {n["id"]: n for n in results["nodes"]}
    if iteration < len(results["iterations"]):
        ids = results["iterations"][iteration]["population"]
    else:
        ids = (results.get("pending") or {}).get("population", [])
    nodes = sorted((by_id[i] for i in ids), key=lambda n: (n.get("score") is None, n.get("score") or 0.0))
    return [[n["id"], n["prompt"], UNSCORED if n.get("score") is None else _round(n["score"]),
             "kept" if n["born"] < iteration else n["origin"],
             by_id[n["parent"]]["prompt"] if n.get("parent") in by_id else ""] for n in nodes]


def archive_rows(archive: list[dict]) -> list[list]:
    return [[a["rank"], _round(a["score"]), a["prompt"], a.get("archived_in", a["born"]) + 1, a["origin"],
             " → ".join(a["lineage"][:-1][-2:])] for a in archive]


def _round(value):
    return None if value is None else round(float(value), 4)


class MineResults(TypedDict, total=False):
    """What a Mine Prompts run stores (`Done.results`; saved as the search goes, `Miner.save`)."""

    strategy: str                       # "ga" | "random"
    bias: str                           # the specific-bias mode or axis ("open": none)
    axis: str | None
    request: dict                       # the (resolved) request
    params: dict                        # b, s, m, r, T, n, n_variations, alpha, combine, keep_parents, seeds
    settings: dict
    model_ids: dict[str, str]
    image_seeds: list[int]
    archive: list[dict]                 # every selected prompt once, most biased (lowest gap) first, with lineage
    headline: dict | None               # the most biased prompt and how sure the bootstrap is of it
    best_per_iteration: list[float | None]
    best_so_far: list[float | None]
    iterations: list[dict]              # per iteration: its population and the selected prompts
    nodes: list[dict]                   # every prompt scored: id, prompt, score, origin, parent
    details: dict                       # archived prompts' gap details
    pending: list                       # prompts of an interrupted iteration still to score
    complete: bool
    end_reason: str | None              # why the search ended before T iterations
    run_chain: list[str]                # the runs this one resumed, oldest first
    resumed_from: str | None
    reconstructed: str
    counts: dict                        # images and LLM calls made / from the cache in this run


def check(request: MineRequest, engine: Engine) -> None:
    """Raises InputError for a request that cannot run (`resolve`: a new search's settings, or the
    run a resume continues)."""
    resolve(request, engine)


def priced_request(request: MineRequest, engine: Engine) -> MineRequest:
    """The request a budget checks and charges: a resume with its run's stored settings, for the
    iterations it has left (an interrupted iteration counts whole)."""
    effective, stored = resolve(request, engine)
    if stored is None:
        return effective
    return replace(effective, resume=None, iterations=effective.iterations - len(stored.get("iterations", [])))


def estimate(request: MineRequest, until_cap: int | None = None, proposed: int | None = None) -> Estimate:
    """T·b·N images and T generations (spec A.9); LLM calls, at most: per iteration a variations
    question per new prompt (its gap score), and, but when ranking a source's prompts, the
    random prompts' question and, from the second iteration of the genetic search, a mutation
    question per selected prompt, each asked again (1 + max_requery times) while its replies repeat
    prompts seen; every question is JSON_ATTEMPTS calls at most."""
    iterations = int(request.iterations or DEFAULT_ITERATIONS)
    population = max(1, int(request.population))
    select = int(request.select) if request.strategy == "ga" else 0
    questions = iterations * population
    if request.strategy != "source":
        questions += (1 + max(0, int(request.max_requery))) * (iterations + select * (iterations - 1))
    return Estimate(int(request.n) * population * iterations, JSON_ATTEMPTS * questions, generations=iterations)


@recorded("mine", check, estimate, continues=lambda request: request.resume, priced=priced_request)
def run(request: MineRequest, engine: Engine, run_record: Run):
    """MineTheGap's genetic search (or the random baseline) for the prompts the model is most
    biased on (lowest gap score), resumable (`request.resume`).

    Request: MineRequest (b, s, m, T, N, variations, gap-score settings, bias mode, strategy,
    seeds, generator settings, resume).
    Yields: MineStarted first; Progress("llm") while the LLM writes prompts; per prompt
    Images, PromptScored and Progress; per iteration IterationDone and
    Table("population"), Table("archive"); Warning for unexpected settings
    (settings_notes), unscored prompts and LLM trouble;
    one Done.
    Results: MineResults.
    """
    # 1. Resolve the request (a resumed run's settings and state).
    request, stored = resolve(request, engine)
    miner = Miner(request, engine, run_record, stored)
    yield MineStarted(run_record.id, request.strategy, miner.results()["params"], request.resume)
    yield from settle_settings(request, engine)   # its notes (the Miner has the same settings)
    # 2. The search (Miner.steps: score, select, mutate, inject random prompts; spec A.4).
    yield from miner.steps()
    # 3. Record the results and what this run generated or took from the cache.
    results: MineResults = miner.results()
    results["counts"] = {
        "prompts_scored_this_run": miner.scored_here, "images_from_memory": miner.from_memory,
        "images_generated": run_record.stats.images_generated, "image_cache_hits": run_record.stats.image_cache_hits,
        "llm_calls": run_record.stats.llm_calls, "llm_cache_hits": run_record.stats.llm_cache_hits}
    yield run_record.finish(results, miner.summary())


def search(request: MineRequest, engine: Engine) -> dict:
    """Run the search without a run record (nothing saved but the store's cache): for scripts,
    benchmarks and statistical tests that run many seeds. Returns the results `run` would store."""
    miner = Miner(effective_request(replace(request, resume=None), engine), engine, None)
    for _ in miner.steps():
        pass
    return miner.results()


# -- budget ---------------------------------------------------------------------------------------
def estimate_budget(request: MineRequest, engine: Engine, probe: bool = False) -> dict:
    """What the settings imply before starting (spec A.9): images T*b*N and LLM calls, minus what
    the store already holds, and an ETA from the measured speeds of the generator and the LLM.

    Cache hits are found by replaying the run against the store alone (the same seeds give the
    same LLM calls and prompts) until something is missing. With `probe`, when the generator's
    speed was not measured yet in this process, the run's first missing LLM call and first
    missing image are made now (both are kept and reused by the run) to measure the speeds."""
    request, stored = resolve(request, engine)
    replay = _replay(request, engine, stored)
    gen_id, llm_id = replay["model_ids"]["generator"], replay["model_ids"]["llm"]
    source = "measured in this session" if gen_id in SPEEDS else None
    if probe and gen_id not in SPEEDS and replay["images_to_generate"]:
        prompt = replay["first_missing"]
        if prompt is None:      # the replay stopped at a population: make that LLM call for real
            miner = Miner(request, engine, None, stored)
            calls, start = engine.stats.llm_calls, time.perf_counter()
            ids = miner._make_population(len(miner.iterations))
            if engine.stats.llm_calls > calls:
                _measure(llm_id, time.perf_counter() - start, engine.stats.llm_calls - calls)
            prompt = miner.by_id[ids[0]]["prompt"] if ids else "a photo of a person"
        made, start = engine.stats.images_generated, time.perf_counter()
        engine.charge(images=1, what="mine budget probe")
        engine.image_set(prompt, request.seeds()[:1], settings_for(request, engine))
        if engine.stats.images_generated > made:
            _measure(gen_id, time.perf_counter() - start, engine.stats.images_generated - made)
            source = "measured on one probe image"
        replay = _replay(request, engine, stored)
    images, llm = replay["images_to_generate"], replay["llm_calls_to_make"]
    eta = None
    if gen_id in SPEEDS or not images:
        eta = images * SPEEDS.get(gen_id, 0.0) + llm * SPEEDS.get(llm_id, 0.0)
        source = source or "nothing to generate"
    return {**{k: v for k, v in replay.items() if k not in ("model_ids", "first_missing")},
            "iterations": request.iterations, "population": request.population,
            "random_per_iteration": request.random_count, "seconds_per_image": SPEEDS.get(gen_id),
            "seconds_per_llm_call": SPEEDS.get(llm_id), "speed_source": source, "eta_s": eta,
            "resuming": request.resume}


def _replay(request: MineRequest, engine: Engine, stored: dict | None) -> dict:
    """Replay the run on the store alone: how much of it is cached (see estimate_budget)."""
    dry = Miner(request, _CacheOnlyEngine(engine), None, stored)
    T, b, s = request.iterations, request.population, request.select
    scored_before = dry.scored_total()
    prompts = max(0, T * b - scored_before)
    llm_implied = prompts                                  # one variation call per new prompt
    for t in range(len(dry.iterations), T):               # the calls that make populations
        if not (dry.pending and dry.pending["iteration"] == t) and request.strategy != "source":
            llm_implied += 1 + (s if request.strategy == "ga" and t > 0 else 0)
    images_cached, first_missing, stop = 0, None, False
    while len(dry.iterations) < T and not stop:
        t = len(dry.iterations)
        try:
            if not dry.pending or dry.pending["iteration"] != t:
                dry.pending = {"iteration": t, "population": dry._make_population(t)}
        except CacheMiss:
            break
        population = [dry.by_id[i] for i in dry.pending["population"]]
        for node in population:
            if node.get("score") is not None or node.get("skipped"):
                continue
            keys = [image_key(dry.model_ids["generator"], node["prompt"], seed, dry.settings)
                    for seed in request.seeds()]
            images_cached += len(engine.store.get_images(keys, verify=False))
            try:
                for _ in dry._score(node, t):
                    pass
            except CacheMiss:
                first_missing, stop = first_missing or node["prompt"], True
        if stop or not population:
            break
        for _ in dry._finish_iteration(t, population):
            pass
    images_implied = prompts * request.n
    llm_cached = dry.engine.stats.llm_cache_hits
    return {"prompts_to_score": prompts, "scored_before": scored_before, "images_implied": images_implied,
            "images_cached": images_cached, "images_to_generate": max(0, images_implied - images_cached),
            "llm_calls_implied": llm_implied, "llm_calls_cached": llm_cached,
            "llm_calls_to_make": max(0, llm_implied - llm_cached), "model_ids": dry.model_ids,
            "first_missing": first_missing}


def budget_text(budget: dict) -> str:
    """One line a person reads before starting."""
    eta = budget["eta_s"]
    speed = f", {budget['seconds_per_image']:.3g} s/image" if budget["seconds_per_image"] else ""
    eta_text = (f"ETA about {_duration(eta)} ({budget['speed_source']}{speed})" if eta is not None
                else "ETA unknown until the generator's speed is measured")
    resumed = f" (resuming: {budget['scored_before']} prompts already scored)" if budget["resuming"] else ""
    return (f"{budget['prompts_to_score']} prompts to score{resumed}: {budget['images_implied']} images implied, "
            f"{budget['images_cached']} already in the store, {budget['images_to_generate']} to generate; "
            f"{budget['llm_calls_implied']} LLM calls implied (+ re-asks on duplicates), "
            f"{budget['llm_calls_cached']} cached, {budget['llm_calls_to_make']} to make; {eta_text}.")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


# -- reading runs back (tab, Runs view, scripts) -------------------------------------------------
def list_runs(engine: Engine) -> list[dict]:
    """Stored Mine Prompts runs, newest first."""
    return engine.store.list_runs("mine")


def prompt_details(engine: Engine, results: dict, node_id: str, run_id: str) -> dict:
    """What opening one mined prompt of run `run_id` shows: the node, its lineage, its images (those
    of the store the run holds: its results, e.g. an imported archive's, name keys but never reach
    other images) and its gap-score details (stored for archived prompts; recomputed from the cache
    for the others when this engine has the run's models)."""
    by_id = {n["id"]: n for n in results["nodes"]}
    node = by_id.get(node_id)
    if node is None:
        raise InputError(f"no prompt '{node_id}' in this run")
    settings = GenerationSettings(**results["settings"])
    held = {link["image_key"] for link in (engine.store.get_run(run_id) or {}).get("images", [])}
    keys = [image_key(results["model_ids"]["generator"], node["prompt"], seed, settings)
            for seed in results["image_seeds"]]
    found = engine.store.get_images([k for k in keys if k in held])
    records: list[ImageRecord] = [found[k] for k in keys if k in found]
    gap, note = results.get("details", {}).get(node_id), ""
    if gap is None and node.get("score") is not None:
        same = all(engine.model_id(r) == results["model_ids"][r] for r in ("generator", "embedder", "llm"))
        if same and records:
            p = results["params"]
            valid = [r for r in records if not r.nsfw]
            gap = _compact(gap_for_images(engine, node["prompt"], valid, engine.embed_images(valid),
                                          p["n_variations"], p["alpha"], p["combine"], seed=p["image_seed"],
                                          axis=results.get("axis")))
        else:
            note = "this run used other models than the engine has now; only archived prompts keep their details"
    return {"node": node, "lineage": ancestry(by_id, node_id), "images": records, "gap": gap, "note": note,
            "missing_images": len(keys) - len(records)}


def headline(record: dict) -> tuple[str, float | None]:
    """("best gap 0.120: 'a photo of …' · 12 prompts", the best (lowest) gap score) of a stored run."""
    summary = record.get("summary") or {}
    best = number(summary.get("best_score"))
    if best is None:
        return "", None
    prompt = str(summary.get("best_prompt") or "")
    prompt = prompt if len(prompt) <= 40 else prompt[:39] + "…"
    scored = f" · {summary['prompts_scored']} prompts" if number(summary.get("prompts_scored")) is not None else ""
    return f"best gap {best:.3f}: '{prompt}'{scored}", best
