"""Explore: where every image of a prompt (or of a stored run) sits between two or more concept
texts, which concept the set leans to (with its interval), what images of a test concept lean
to (inverse queries), a hypothesis tree of such steps, and label-free identity clusters.

Placement (the strips): image i's score for concept c is the softmax over the concepts of the
embedder's cosine similarities at the loaded model's own logit scale s (its learned temperature),

    s_ic = exp(s · cos(x_i, t_c)) / Σ_c' exp(s · cos(x_i, t_c')),

which is CLIP's own zero-shot classification probability (Radford et al. 2021, §3.1.2; the
learned temperature of every released CLIP and OpenCLIP model sits at its clamp, 100; SigLIP's is
learned, with a bias that the softmax over concepts cancels; Engine.logit_temperature). Raw
cosines would put the dots of different prompts and embedders on incomparable ranges (CLIP's
cosines crowd into 0.2–0.35); the softmax reads as "how much more like c than like the other
concepts", is in [0, 1] and sums to 1 over the concepts. The **lean** is the share of images
whose nearest concept (largest cosine, the same as the largest score) is c, with its Jeffreys
interval (engine/metrics/intervals.py); a set *leans* to its largest share only when that interval
excludes the even share 1/k of k concepts, else it has *no clear lean* (`lean_claim`, the one rule
every text of a lean goes through). Each strip's median score has the distribution-free 95%
interval of a quantile (scipy.stats.quantile_test, order statistics).

The tree: a node is an Explore run; a child names its parent's run id (`parent`), and every
node records its tree's id (the root's run id) in its results. A tree is therefore stored,
listed, owned, published, exported and imported exactly as its runs are (`tree_nodes`).
"""
from __future__ import annotations

import json
import re
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from ..backends.base import CLIP_LOGIT_SCALE
from ..common.errors import InputError
from ..common.events import Event, Progress, Warning
from ..common.scores import Score, number
from ..core.distributed import missing_units
from ..core.engine import Engine, Run, recorded, stream_image_set
from ..hosting.limits import Estimate
from ..hosting.space import GpuWork
from ..metrics.intervals import share_interval, tidy
from ..metrics import biasbench
from ..store.store import ImageRecord
from .axes import axis_for
from .measure import AskedAnswers, evaluator_names, measure_axes
from .options import GenerationOptions, settle_settings

DEFAULT_CONCEPTS = ["a photo of a man", "a photo of a woman"]
PERSON_CARRIER = "a photo of a person who is {}"
NOUN_CARRIER = "a photo of {}"
MAX_CONCEPTS = 8
MAX_INVERSE = 8
MAX_CLUSTER_RUNS = 64
INVERSE_LABEL = "inverse: "   # the set label of an inverse query's images in its run


@dataclass
class ExploreRequest(GenerationOptions):
    prompt: str = field(default="", metadata={"help": "the prompt whose images are placed (not needed with --run)"})
    concepts: list[str] = field(default_factory=lambda: list(DEFAULT_CONCEPTS), metadata={
        "metavar": "C", "help": "two or more concept texts; each image is placed between them"})
    versus: list[str] = field(default_factory=list, metadata={
        "metavar": "C", "help": "a second axis' concepts (two or more, e.g. 'a photo of a young person' 'a photo "
                                "of an old person'): each image is placed between them too, and the first concept "
                                "of each axis makes a 2-D scatter"})
    n: int = field(default=16, metadata={"flag": "-n", "help": "images of the prompt"})
    seed: int = field(default=0, metadata={"help": "images use the seeds seed, seed+1, ..., seed+n-1"})
    run: str = field(default="", metadata={"metavar": "RUN_ID",
                                           "help": "score this stored run's images instead (from cached embeddings; "
                                                   "generates nothing)"})
    inverse: list[str] = field(default_factory=list, metadata={
        "metavar": "CONCEPT", "help": "test concepts: m images of each one's carrier prompt are placed on the "
                                      "concepts' strips (which concept do images of 'smiling' lean to?)"})
    carrier: str = field(default="", metadata={
        "metavar": "TEMPLATE", "help": "the inverse queries' prompt, {} is the test concept (default: 'a photo "
                                       "of a person who is {}'; 'a photo of {}' for a concept starting with a, an "
                                       "or the)"})
    m: int = field(default=8, metadata={"flag": "-m", "help": "images per inverse query"})
    parent: str = field(default="", metadata={"metavar": "RUN_ID",
                                              "help": "the tree node (an Explore run) this step is a child of"})
    axes: list[str] = field(default_factory=list, metadata={
        "help": "attribute axes to measure with VQA too (off by default; known ones have fixed choices, others "
                "are free answers): the node shows each one's distribution with intervals"})
    mode: str = field(default=biasbench.DEFAULT_MODE, metadata={
        "help": "T2I-BiasBench (with --axes): the paper's equations, or bit-exact with the authors' code",
        "choices": ("paper", "reference")})
    n_boot: int = field(default=1000, metadata={"help": "posterior draws / bootstrap resamples per interval (--axes)"})


@dataclass(frozen=True)
class StripsMeasured(Event):
    """The strips and lean of the prompt's images (results["strips"], results["lean"])."""

    strips: dict
    lean: dict


class ExploreResults(TypedDict, total=False):
    """What an Explore run stores (`Done.results`)."""

    prompt: str              # the prompt (or the stored run's) whose images are placed
    source_run: str          # with `run`: the stored run scored
    concepts: list[str]
    normalisation: dict      # {"kind": "softmax", "logit_scale": the embedder's (100.0 for CLIP), "logit_bias"}
    images: list[dict]       # ImageRecord.to_json + "scores" (concept -> score) and "nearest"
    lean: dict               # concept -> {"share", "ci": [lo, hi], "count"} (the counts sum to the images measured)
    strips: dict             # concept -> {"median", "ci": [lo, hi]}
    versus: list[str]        # a second axis' concepts (images carry "versus_scores", "versus_nearest")
    versus_lean: dict        # as `lean`, on `versus`
    versus_strips: dict      # as `strips`, on `versus`
    inverse: dict            # test concept -> a lean of the same shape as `lean`
    inverse_sets: dict       # test concept -> {"prompt", "images": [...]}
    axes: dict               # with `axes`: as Single Prompt's, axis -> its distribution and metrics with intervals
    answer_sources: dict     # with `axes` and the distilled evaluator: axis -> answers by its probe and by its teacher
    tree: str                # the tree's id: its root node's run id
    parent: str              # the parent node's run id ('' for a root)
    excluded: int            # flagged or refused images left out


# -- measuring -------------------------------------------------------------------------------------------
def concept_scores(image_vectors: np.ndarray, text_vectors: np.ndarray, scale: float = CLIP_LOGIT_SCALE) -> np.ndarray:
    """(n, c) softmax over the concepts of `scale` · cosine (rows sum to 1; module docstring).
    Both inputs are L2-normalised rows."""
    logits = scale * (np.asarray(image_vectors, np.float64) @ np.asarray(text_vectors, np.float64).T)
    logits -= logits.max(axis=1, keepdims=True)
    weights = np.exp(logits)
    return weights / weights.sum(axis=1, keepdims=True)


def lean_of(scores: np.ndarray, concepts: list[str]) -> dict:
    """{concept: {"share", "ci": [lo, hi], "count"}}: the share of rows whose largest score
    is the concept's, with its Jeffreys 95% interval."""
    n = int(len(scores))
    nearest = np.argmax(scores, axis=1) if n else np.zeros(0, int)
    counts = np.bincount(nearest, minlength=len(concepts))
    return {c: share_of(int(k), n) for c, k in zip(concepts, counts)}


def share_of(count: int, n: int) -> dict:
    """{"share", "ci": [lo, hi], "count"}: `count` of `n` with its Jeffreys 95% interval (share None when n = 0)."""
    lo, hi = share_interval(count, n)
    return {"share": tidy(count / n) if n else None, "ci": [lo, hi], "count": count}


def measured(lean: dict) -> int:
    """How many images a lean counts."""
    return sum(int(v.get("count", 0)) for v in (lean or {}).values() if isinstance(v, dict))


def strip_summary(scores: np.ndarray, concepts: list[str]) -> dict:
    """{concept: {"median", "ci": [lo, hi]}}: each strip's median score and its distribution-free 95%
    interval (scipy.stats.quantile_test: order statistics; the whole range [0, 1] when N is too small
    for one)."""
    from scipy.stats import quantile_test

    out = {}
    for j, c in enumerate(concepts):
        column = np.asarray(scores[:, j], float)
        if not len(column):
            out[c] = {"median": None, "ci": [None, None]}
            continue
        ci = quantile_test(column, q=float(np.median(column)), p=0.5).confidence_interval(0.95)
        lo = 0.0 if not np.isfinite(ci.low) else float(ci.low)
        hi = 1.0 if not np.isfinite(ci.high) else float(ci.high)
        out[c] = {"median": tidy(float(np.median(column)), 0, 1), "ci": [tidy(lo, 0, 1), tidy(hi, 0, 1)]}
    return out


def unflagged(records: list[ImageRecord]) -> list[ImageRecord]:
    """The records that are neither flagged nor refused (the ones measured)."""
    return [r for r in records if not r.nsfw and not r.refused]


def place(engine: Engine, records: list[ImageRecord], concepts: list[str],
          vectors: np.ndarray | None = None) -> tuple[list[dict], dict, dict, int]:
    """(images, lean, strips, excluded) of `records` on `concepts`: every image's scores (flagged
    and refused images are listed without scores and left out of the lean and strips). `vectors`:
    the unflagged records' image embeddings when at hand; else from the store's cache."""
    usable = unflagged(records)
    texts = engine.embed_texts(concepts)
    if usable and vectors is None:
        vectors = engine.embed_images(usable)
    scale, _ = engine.logit_temperature()   # the bias cancels in the softmax over concepts
    scores = concept_scores(vectors, texts, scale) if usable else np.zeros((0, len(concepts)))
    by_key = {r.key: row for r, row in zip(usable, scores)}
    images = []
    for r in records:
        item = r.to_json()
        row = by_key.get(r.key)
        if row is not None:
            item["scores"] = {c: round(tidy(float(s), 0, 1), 6) for c, s in zip(concepts, row)}
            item["nearest"] = concepts[int(np.argmax(row))]
        images.append(item)
    return images, lean_of(scores, concepts), strip_summary(scores, concepts), len(records) - len(usable)


def leading(lean: dict) -> tuple[str, dict] | None:
    """(concept, its lean) of the concept with the largest share, None when nothing was measured."""
    entries = [(c, v) for c, v in lean.items() if isinstance(v, dict) and v.get("share") is not None]
    return max(entries, key=lambda e: e[1]["share"]) if entries else None


def carrier_prompt(concept: str, template: str = "") -> str:
    """The inverse query's prompt for a test concept: `template` with {} (or {concept}) replaced by
    it; by default 'a photo of a person who is <concept>', or 'a photo of <concept>' when the
    concept is a noun phrase (starts with a, an or the: 'an old doctor')."""
    concept = concept.strip()
    if not template:
        template = NOUN_CARRIER if re.match(r"(a|an|the)\s", concept, re.I) else PERSON_CARRIER
    if "{concept}" in template:
        return template.replace("{concept}", concept)
    if "{}" not in template:
        raise InputError("the carrier template must contain {} where the test concept goes, e.g. "
                         "'a photo of a person who is {}'")
    return template.replace("{}", concept)


# -- the request -----------------------------------------------------------------------------------------
def clean_concepts(concepts) -> list[str]:
    """The concept texts stripped, without blanks and repeats."""
    return list(dict.fromkeys(c.strip() for c in (concepts or []) if c and c.strip()))


def check(request: ExploreRequest, engine: Engine) -> None:
    """Raises InputError for a request that cannot run (before any run record exists)."""
    concepts = clean_concepts(request.concepts)
    if len(concepts) < 2:
        raise InputError("give two or more different concepts (e.g. 'a photo of a man' and 'a photo of a woman')")
    if len(concepts) > MAX_CONCEPTS:
        raise InputError(f"{len(concepts)} concepts; at most {MAX_CONCEPTS} strips are shown")
    for c in concepts:
        engine.check_prompt(c, "concept")
    versus = clean_concepts(request.versus)
    if versus and (len(versus) < 2 or len(versus) > MAX_CONCEPTS or set(versus) & set(concepts)):
        raise InputError(f"the second axis needs 2 to {MAX_CONCEPTS} concepts of its own (none of the first axis')")
    for c in versus:
        engine.check_prompt(c, "concept")
    if request.run:
        engine.store.require_run(request.run, what="run")
    else:
        engine.check_prompt(request.prompt)
        engine.check_n(request.n)
    inverse = clean_concepts(request.inverse)
    if len(inverse) > MAX_INVERSE:
        raise InputError(f"{len(inverse)} inverse queries; at most {MAX_INVERSE} in one step")
    for concept in inverse:
        engine.check_prompt(carrier_prompt(concept, request.carrier), "inverse query's prompt")
    if inverse:
        engine.check_n(request.m, "number of images per inverse query")
    if request.parent:
        engine.store.require_run(request.parent, "explore", what="tree node")
    engine.check_questions([axis_for(a).question for a in clean_concepts(request.axes)])


def estimate(request: ExploreRequest, until_cap: int | None = None, proposed: int | None = None) -> Estimate:
    """N images of the prompt (none with a stored run) and m per inverse query; no LLM call."""
    own = 0 if request.run else int(request.n)
    return Estimate(own + int(request.m) * len(clean_concepts(request.inverse)))


def gpu_work(request: ExploreRequest, engine: Engine) -> GpuWork:
    """What a step makes a GPU do (ZeroGPU's duration, engine.hosting.space.gpu_seconds): the prompt's N
    images, each embedded and asked each axis' question, or a stored run's images (none generated) with the
    embeddings and answers the store lacks; and m images of each test concept, embedded."""
    asks = [(a.question, list(a.values) or None) for a in (axis_for(x) for x in clean_concepts(request.axes))]
    tests = len(clean_concepts(request.inverse)) * max(0, int(request.m))
    if request.run:
        records, _ = stored_images(engine, request.run)
        units = missing_units(engine, [(r.key, r.prompt, r.seed) for r in unflagged(records)], asks, embed=True)
        own = GpuWork(answers=units["answers"], embeddings=units["embeddings"])
    else:
        n = max(0, int(request.n))
        own = GpuWork(images=n, steps=request.steps, answers=n * len(asks), embeddings=n)
    return own + GpuWork(images=tests, steps=request.steps, embeddings=tests)


@recorded("explore", check, estimate)
def run(request: ExploreRequest, engine: Engine, run_record: Run):
    """Place a prompt's images (or a stored run's) on concept strips, with the lean and inverse queries.

    Request: ExploreRequest (prompt or a stored run, concepts, N, inverse test concepts and their
    carrier, the parent tree node).
    Yields: Images and Progress while generating; StripsMeasured; Warning for excluded images; with
    `axes`, Progress("vqa") and AxisScores per axis; one Done.
    Results: ExploreResults.
    """
    # 1. The images: a stored run's (nothing generated) or the prompt's.
    concepts = clean_concepts(request.concepts)
    parent = engine.store.require_run(request.parent, "explore", what="tree node") if request.parent else None
    results: ExploreResults = {"concepts": concepts, "parent": request.parent or "",
                               "tree": (parent["results"].get("tree") or parent["id"]) if parent else run_record.id,
                               "normalisation": dict(zip(("logit_scale", "logit_bias"), engine.logit_temperature()),
                                                     kind="softmax")}
    settings, tests = None, clean_concepts(request.inverse)
    own = 0 if request.run else request.n          # images this step generates for the prompt
    total = own + len(tests) * request.m
    if request.run:
        records, prompt = stored_images(engine, request.run)
        run_record.add_images(records)
        results["source_run"] = request.run
    else:
        prompt = engine.check_prompt(request.prompt)
        settings = yield from settle_settings(request, engine)
        seeds = list(range(request.seed, request.seed + request.n))
        records = yield from stream_image_set(engine, run_record, prompt, seeds, settings, progress_total=total)
    results["prompt"] = prompt
    # 2. The strips and the lean.
    yield Progress(len(records), len(records), "embedding", "placing the images on the concepts")
    usable = unflagged(records)
    vectors = engine.embed_images(usable) if usable else None   # once, for both axes
    images, lean, strips, excluded = place(engine, records, concepts, vectors)
    results.update(images=images, lean=lean, strips=strips, excluded=excluded)
    versus = clean_concepts(request.versus)
    if versus:   # a second axis: the same images placed between its concepts too (the 2-D scatter)
        placed, v_lean, v_strips, _ = place(engine, records, versus, vectors)
        for item, other in zip(images, placed):
            if "scores" in other:
                item.update(versus_scores=other["scores"], versus_nearest=other["nearest"])
        results.update(versus=versus, versus_lean=v_lean, versus_strips=v_strips)
    if excluded:
        yield Warning(f"{excluded} flagged or refused image(s) left out of the strips and the lean")
    run_record.save(results)
    yield StripsMeasured(strips, lean)
    # 3. The node's attribute distributions (VQA, cached answers reused), when asked for.
    axes = [axis_for(a) for a in clean_concepts(request.axes)]
    if axes:
        results["axes"], results["answer_probs"], asked = {}, {}, AskedAnswers()
        yield from measure_axes(engine, usable, axes, results["axes"], mode=request.mode, n_boot=request.n_boot,
                                answer_probs=results["answer_probs"], asked=asked)
        # image key -> axis -> answer, beside answer_probs (issue 35), as Single Prompt's JSON has them
        results["answers"] = asked.answers
        if asked.sources:   # the distilled evaluator: which answers its probe gave, which its teacher
            results["answer_sources"] = asked.sources
        run_record.save(results)
    # 4. Inverse queries: which concept do images of each test concept lean to?
    inverse, sets = {}, {}
    seeds = list(range(request.seed, request.seed + request.m))
    for i, concept in enumerate(tests):
        settings = settings or (yield from settle_settings(request, engine))
        carrier = carrier_prompt(concept, request.carrier)
        made = yield from stream_image_set(engine, run_record, carrier, seeds, settings, INVERSE_LABEL + concept,
                                           own + i * request.m, total)
        placed, inverse[concept], _, _ = place(engine, made, concepts)
        sets[concept] = {"prompt": carrier, "images": placed}
        results.update(inverse=inverse, inverse_sets=sets)
        run_record.save(results)
    # 5. Record.
    yield run_record.finish(results, summary_of(results))


def stored_images(engine: Engine, run_id: str) -> tuple[list[ImageRecord], str]:
    """(records in the run's order, its prompt) of a stored run the visitor may see; InputError
    when there is none or it has no stored image left."""
    return _images_of(engine, engine.store.require_run(run_id, what="run"), run_id)


def _images_of(engine: Engine, source: dict, run_id: str) -> tuple[list[ImageRecord], str]:
    """`stored_images` of the run `run_id` already read (`Store.require_run`)."""
    keys = list(dict.fromkeys(r["image_key"] for r in source["images"]   # an Explore node: not its inverse sets
                              if not (source["method"] == "explore" and r["label"].startswith(INVERSE_LABEL))))
    found = engine.store.get_images(keys, verify=False)
    records = [found[k] for k in keys if k in found]
    if not records:
        raise InputError(f"run '{run_id[:80]}' has no stored image left to place")
    results = source.get("results") or {}
    prompt = results.get("prompt") or source["request"].get("prompt") or records[0].prompt
    return records, str(prompt)


def summary_of(results: dict) -> dict:
    """The leading concept, its share and interval, whether the lean is clear (`lean_claim`), N, the tree and
    parent (the Runs table's numbers); with a scored run, "prompt": "<its prompt> (scores of run <id>)" (the
    request names no prompt; the prompt first, so that a cut label still names it); when VQA ran, "axes":
    {axis: {"top", "share", "ci"}} (its most frequent answer)."""
    claim = lean_claim(results.get("lean") or {})
    summary = {"n": measured(results.get("lean")), "tree": results.get("tree", ""),
               "parent": results.get("parent", "")}
    if results.get("source_run"):
        summary["prompt"] = scored_name(results.get("prompt", ""), results["source_run"])
    for axis, m in (results.get("axes") or {}).items():   # VQA ran: each axis' most frequent answer
        answer = leading(distribution(m))
        if answer:
            summary.setdefault("axes", {})[axis] = {"top": answer[0], "share": answer[1]["share"],
                                                    "ci": answer[1]["ci"]}
    if claim:
        summary.update(leans_to=claim["concept"], lean_share=claim["share"], lean_low=claim["ci"][0],
                       lean_high=claim["ci"][1], lean_clear=claim["clear"], even_share=tidy(claim["even"]))
    return summary


def scored_name(prompt: str, source_run: str) -> str:
    """"a photo of a doctor (scores of run <id>)": the name of a node that scores a stored run."""
    return f"{prompt} (scores of run {source_run})"


# -- what a lean may claim (issue 42): one rule for the CLI, the tab, the tree, the page and exports ------------
def even_share(k: int) -> float:
    """The share each of `k` concepts would have in an even split (1/k; a lean lists at least two)."""
    return 1 / max(k, 2)


def claim_of(concept: str, share: float, ci, even: float) -> dict:
    """The claim a set may make about its largest share: {"concept", "share", "ci", "even", "clear"}, `clear`
    only when the share's 95% interval excludes the even share `even` (1/k of k concepts): an interval that
    includes it is as consistent with an even split as with a lean."""
    lo, hi = (list(ci) + [None, None])[:2] if ci else (None, None)
    lo, hi = number(lo), number(hi)
    return {"concept": concept, "share": share, "ci": [lo, hi], "even": even,
            "clear": lo is not None and lo > even}


def lean_claim(lean: dict) -> dict | None:
    """`claim_of` the concept with the largest share of `lean` (k = the concepts it lists), with "n": the
    images measured; None when nothing was measured."""
    top = leading(lean)
    if not top:
        return None
    k = sum(1 for v in lean.values() if isinstance(v, dict))
    concept, v = top
    return {**claim_of(concept, v["share"], v.get("ci"), even_share(k)), "n": measured(lean)}


def claim_text(claim: dict | None) -> str:
    """"leans 'a photo of a man' 0.71 [0.62, 0.80]" when the claim is clear, else "no clear lean: 'a photo of
    a man' 0.56 [0.39, 0.72] includes the even share 0.50" ('' for no claim)."""
    if not claim:
        return ""
    lo, hi = claim["ci"]
    numbers = f"'{claim['concept']}' {claim['share']:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if lo is not None
                                                              and hi is not None else "")
    if claim["clear"]:
        return f"leans {numbers}"
    return f"no clear lean: {numbers} includes the even share {claim['even']:.2f}"


def lean_text(lean: dict) -> str:
    """`claim_text` of a lean: "leans 'a photo of a man' 0.71 [0.62, 0.80]" or "no clear lean: ..."."""
    return claim_text(lean_claim(lean))


def lean_sentence(lean: dict, what: str = "This set") -> str:
    """"This set leans 'a photo of a man' 0.71 [0.62, 0.80] (N = 16)", or "This set has no clear lean: 'a
    photo of a man' 0.56 [0.39, 0.72] includes the even share 0.50 (N = 16)"; '' when nothing was measured."""
    claim = lean_claim(lean)
    if not claim:
        return ""
    return f"{what} {'' if claim['clear'] else 'has '}{claim_text(claim)} (N = {claim['n']})"


def scores(results: dict, summary: dict) -> list[Score]:
    """Each concept's lean share with its interval, each inverse query's, and (VQA) each axis' shares."""
    out = [Score("lean", c, v["share"], *v["ci"]) for c, v in (results.get("lean") or {}).items()
           if isinstance(v, dict) and v.get("share") is not None]
    for test, lean in (results.get("inverse") or {}).items():
        out += [Score(f"inverse {test}", c, v["share"], *v["ci"]) for c, v in lean.items()
                if isinstance(v, dict) and v.get("share") is not None]
    for axis, m in (results.get("axes") or {}).items():
        out += [Score(axis, c, v["share"], *v["ci"]) for c, v in distribution(m).items() if v["share"] is not None]
    return out


def headline(record: dict) -> tuple[str, float | None]:
    """("leans 'a photo of a man' 0.71 [0.62, 0.80]", 0.71) of a stored run, or ("no clear lean: ...", 0.56)
    when the interval includes the even share (`claim_of`; runs stored before the rule get it too)."""
    s = record.get("summary") or {}
    share = number(s.get("lean_share"))
    if share is None:
        return "", None
    k = len(clean_concepts((record.get("request") or {}).get("concepts") or DEFAULT_CONCEPTS))
    even = number(s.get("even_share")) or even_share(k)
    return claim_text(claim_of(str(s.get("leans_to", "")), share, [s.get("lean_low"), s.get("lean_high")], even)), share


# -- the tree --------------------------------------------------------------------------------------------
# Every walk of a tree is bounded whatever the store holds (issue 43: an imported loop or a 1,000-node chain):
# it remembers the nodes it has seen and stops at these limits, and says so (the root node's "cut").
MAX_TREE_NODES = 1000
MAX_TREE_DEPTH = 1000


def tree_nodes(engine: Engine, tree_id: str) -> list[dict]:
    """The tree's nodes the current visitor may see (root first, then each parent before its
    children, oldest first; at most MAX_TREE_NODES, at most MAX_TREE_DEPTH below the root): {"id",
    "parent", "depth", "prompt", "concepts", "versus", "lean", "inverse", "axes", "status", "source_run",
    "n", "seeds"}; the root has "cut", a sentence, when the walk stopped at a limit. InputError, reading
    like a missing id, when the visitor may not see the root."""
    return _tree(engine, tree_id)[0]


def _tree(engine: Engine, tree_id: str) -> tuple[list[dict], list[dict]]:
    """(`tree_nodes`, their run records)."""
    records, depths, cut = _tree_records(engine, tree_id)
    nodes = _nodes(records)
    for node, depth in zip(nodes, depths):
        node["depth"] = depth
    if cut and nodes:
        nodes[0]["cut"] = cut
    return nodes, records


def _tree_records(engine: Engine, tree_id: str) -> tuple[list[dict], list[int], str]:
    """(the run records (`Store.get_run`) of `tree_nodes` in its order, their depths, '' or the sentence saying
    where the walk stopped). Breadth first from the root, each run at most once (a loop of parent links
    ends where it comes back), within MAX_TREE_NODES and MAX_TREE_DEPTH."""
    root = engine.store.require_run(tree_id, "explore", what="tree")
    children: dict[str, list[str]] = {}
    for r in engine.store.list_runs("explore", oldest_first=True):
        children.setdefault((r["request"] or {}).get("parent") or "", []).append(r["id"])
    order, depths, seen, todo = [], [], {root["id"]}, deque([(root["id"], 0)])
    cuts: dict[str, str] = {}   # why the walk stopped somewhere, each reason once
    while todo:
        node, depth = todo.popleft()
        if len(order) == MAX_TREE_NODES:
            cuts["nodes"] = f"this tree has more than {MAX_TREE_NODES} nodes; the first {MAX_TREE_NODES} are shown"
            break
        order.append(node)
        depths.append(depth)
        for child in children.get(node, []):
            if child in seen:   # a node has one parent, so only a loop comes back to one
                cuts["loop"] = (f"the parent links loop (node {child} is also below itself, written before imports "
                                "checked them): each node is shown once")
                continue
            if depth + 1 > MAX_TREE_DEPTH:
                cuts["depth"] = f"nodes more than {MAX_TREE_DEPTH} levels below the root are left out"
                continue
            seen.add(child)
            todo.append((child, depth + 1))
    rows = {r["id"]: r for r in engine.store.run_rows(order[1:])}   # one query per 500 nodes, not two a node
    records = [root] + [_decoded(rows.get(run_id)) for run_id in order[1:]]
    kept = [i for i, r in enumerate(records) if r is not None]   # a run deleted meanwhile
    return [records[i] for i in kept], [depths[i] for i in kept], "; ".join(cuts.values())


def evaluator_labels(engine: Engine) -> dict[str, str]:
    """{model id: the name a user types (as Single Prompt shows it)} for the engine's VQA evaluator when it is
    loaded: the store keeps answers under model ids ('synthetic-vqa:85141b93e5:v2'), which nothing loads."""
    spec = engine.preset.vqa
    return {engine.model_id("vqa"): evaluator_names(spec.full_label, [])[0]} if engine.models.holds(spec) else {}


def _decoded(row: dict | None) -> dict | None:
    """A raw runs row (`Store.run_rows`) with the JSON columns a node reads decoded (as `Store.get_run` has them)."""
    if row is None:
        return None
    return {**row, **{column: json.loads(row[column] or "{}") for column in ("request", "results", "summary")}}


def _nodes(records: list[dict]) -> list[dict]:
    """`tree_nodes` of the tree's run records (root first)."""
    nodes = []
    for i, record in enumerate(records):
        results, request = record.get("results") or {}, record.get("request") or {}
        n, seed = request.get("n"), request.get("seed")
        seeds = [seed, seed + n - 1] if isinstance(n, int) and isinstance(seed, int) and n > 0 \
            and not request.get("run") else None
        nodes.append({"id": record["id"], "parent": (request.get("parent") or "") if i else "",
                      "prompt": results.get("prompt") or request.get("prompt", ""),
                      "concepts": results.get("concepts") or request.get("concepts", []),
                      "versus": results.get("versus") or [],
                      "lean": results.get("lean") or {}, "inverse": results.get("inverse") or {},
                      "source_run": results.get("source_run", ""), "status": record["status"],
                      "n": measured(results.get("lean")), "seeds": seeds,
                      "axes": {a: distribution(m) for a, m in (results.get("axes") or {}).items()}})
    return nodes


def short_concepts(concepts: list[str]) -> list[str]:
    """The concepts without the words they all begin with ('a photo of a man', 'a photo of a woman' -> 'man',
    'woman'); as they are when that would leave one empty."""
    words = [str(c).split() for c in concepts]
    if len(words) < 2:
        return [str(c) for c in concepts]
    common = 0
    while all(len(w) > common + 1 and w[common] == words[0][common] for w in words):
        common += 1
    return [" ".join(w[common:]) for w in words]


def node_holds(node: dict) -> str:
    """What a node holds, in one line: its concepts (and second axis), its inverse queries, its VQA axes, its
    images ("man / woman × young / old · inverse: smiling · VQA: gender · N = 16, seeds 0–15")."""
    parts = [" / ".join(short_concepts(node.get("concepts") or []))
             + (" × " + " / ".join(short_concepts(node["versus"])) if node.get("versus") else "")]
    if node.get("inverse"):
        parts.append("inverse: " + ", ".join(node["inverse"]))
    if node.get("axes"):
        parts.append("VQA: " + ", ".join(node["axes"]))
    seeds = node.get("seeds")
    images = f"N = {node.get('n', 0)}" + (f", seeds {seeds[0]}–{seeds[1]}" if seeds else "")
    parts.append(images + (f", scored from run {node['source_run']}" if node.get("source_run") else ""))
    return " · ".join(p for p in parts if p)


def distribution(metrics: dict) -> dict:
    """An axis' distribution (of results["axes"][axis]) in a lean's shape: {class: {"share", "ci", "count"}}."""
    shares, cis, counts = (metrics.get(k) or {} for k in ("representation_parity", "share_ci", "counts"))
    return {c: {"share": shares.get(c), "ci": list(cis.get(c) or [None, None]), "count": int(counts.get(c, 0))}
            for c in metrics.get("classes") or []}


def node_images(results: dict) -> list[dict]:
    """Every image a node shows: its own, then each inverse query's (stored image json with scores)."""
    return [i for images in [results.get("images") or []] + [s.get("images") or [] for s in
                                                            (results.get("inverse_sets") or {}).values()]
            for i in images if i.get("key")]


def tree_json(engine: Engine, tree_id: str) -> dict:
    """The tree as a JSON document: {"format": "gaplens-explore-tree", "tree": id, "nodes": [...]},
    each node with its images (key, seed, scores) too."""
    return tree_and_results(engine, tree_id)[0]


def tree_and_results(engine: Engine, tree_id: str) -> tuple[dict, dict[str, dict]]:
    """(`tree_json`, node id -> its run's results), from one walk of the tree and one read of its runs."""
    nodes, records = _tree(engine, tree_id)
    pages = {}
    for node, record in zip(nodes, records):
        results = pages[node["id"]] = record["results"] or {}
        node["images"] = [{"key": i["key"], "seed": i["seed"], "scores": i.get("scores")}
                          for i in results.get("images", [])]
    return {"format": "gaplens-explore-tree", "version": 1, "tree": tree_id, "nodes": nodes}, pages


def list_trees(engine: Engine) -> list[dict]:
    """The trees the current visitor may see, newest first: {"id", "prompt", "nodes", "created"}."""
    rows = engine.store.list_runs("explore")
    ids = {r["id"] for r in rows}
    sizes: dict[str, int] = {}
    for r in rows:
        tree = (r["summary"] or {}).get("tree") or r["id"]
        sizes[tree] = sizes.get(tree, 0) + 1
    return [{"id": r["id"], "prompt": (r["request"] or {}).get("prompt") or (r["summary"] or {}).get("prompt")
             or (r["request"] or {}).get("run", ""),
             "nodes": sizes.get(r["id"], 1), "created": r["created"]}
            for r in rows if not (r["request"] or {}).get("parent") or (r["request"] or {}).get("parent") not in ids]


# -- label-free identity clusters ------------------------------------------------------------------------
def cluster_work(engine: Engine, run_ids: list[str], k=4) -> GpuWork:
    """The image embeddings `identity_clusters` computes: those the store lacks of the runs' unflagged images.
    InputError first for what it refuses (no run, more than MAX_CLUSTER_RUNS, one the visitor may not see
    or with no image left, k out of range): checked before a GPU is asked for."""
    images = [(r.key, r.prompt, r.seed) for _, _, found, _ in _cluster_sets(engine, run_ids) for r in found]
    _cluster_k(k, len(images))
    return GpuWork(embeddings=missing_units(engine, images, embed=True)["embeddings"])


def _cluster_sets(engine: Engine, run_ids: list[str]) -> list[tuple[str, dict, list[ImageRecord], str]]:
    """(run id, its record, its unflagged images, its prompt) of each run to cluster, in the order given (each
    once); InputError for no run, more than MAX_CLUSTER_RUNS, or one the visitor may not see or with no image left."""
    run_ids = list(dict.fromkeys(r.strip() for r in run_ids or [] if r and r.strip()))
    if not run_ids:
        raise InputError("pick one or more stored runs to cluster")
    if len(run_ids) > MAX_CLUSTER_RUNS:
        raise InputError(f"{len(run_ids)} runs; at most {MAX_CLUSTER_RUNS} are clustered at once")
    sets = []
    for run_id in run_ids:
        source = engine.store.require_run(run_id, what="run")
        found, prompt = _images_of(engine, source, run_id)
        sets.append((run_id, source, unflagged(found), prompt))
    return sets


def _cluster_k(k, images: int) -> int:
    """`k` as a whole number; InputError unless 2 <= k <= min(20, the images to cluster)."""
    k = int(k)
    if not 2 <= k <= min(20, images):
        raise InputError(f"k must be between 2 and {min(20, images)} (the images to cluster)")
    return k


def identity_clusters(engine: Engine, run_ids: list[str], k: int = 4, central: int = 4, seed: int = 0) -> dict:
    """KMeans (scikit-learn) on the image embeddings of stored runs: no labels, no VQA.

    Returns {"k", "groups": [{"run_id", "label", "prompt", "model", "seeds", "n"}], "clusters": [{"size",
    "central": [image json of the `central` images nearest its centre], "shares": {group label: {"share",
    "ci", "count"}}}]}: the share of each group's (run's) images that falls in every cluster, with its
    Jeffreys interval, groups in the order given. Labels are unique (`group_labels`). Embeddings come from
    the store's cache."""
    from sklearn.cluster import KMeans

    groups, records, owner = [], [], []
    for run_id, source, found, prompt in _cluster_sets(engine, run_ids):
        model = str((source.get("models") or {}).get("generator", ""))
        seeds = sorted(r.seed for r in found)
        backend, sep, name = model.partition(":")   # 'synthetic_generator:/a/b/world.json' -> '…:world.json'
        groups.append({"run_id": run_id, "prompt": prompt, "model": backend + sep + name.rsplit("/", 1)[-1],
                       "seeds": f"seeds {seeds[0]}–{seeds[-1]}" if seeds else "", "n": len(found)})
        records += found
        owner += [len(groups) - 1] * len(found)
    group_labels(groups)
    k = _cluster_k(k, len(records))
    vectors = engine.embed_images(records).astype(np.float64)
    model = KMeans(n_clusters=k, n_init=10, random_state=seed).fit(vectors)
    assign, owner = model.labels_, np.asarray(owner)
    distance = np.linalg.norm(vectors - model.cluster_centers_[assign], axis=1)
    clusters = []
    for j in range(k):
        members = np.flatnonzero(assign == j)
        nearest = members[np.argsort(distance[members])][:central]
        shares = {g["label"]: share_of(int(((owner == gi) & (assign == j)).sum()), g["n"])
                  for gi, g in enumerate(groups)}
        clusters.append({"size": int(len(members)), "central": [records[i].to_json() for i in nearest],
                         "shares": shares})
    clusters.sort(key=lambda c: -c["size"])
    return {"k": k, "groups": groups, "clusters": clusters}


def group_labels(groups: list[dict]) -> None:
    """Give every group a unique "label" (issue 41): its prompt; where prompts repeat, with the model; where
    those repeat too, with the seed range; then with the run id (ids are unique)."""
    for g in groups:
        g["label"] = g["prompt"]
    for extra in ("model", "seeds", "run_id"):
        counts = Counter(g["label"] for g in groups)
        for g in groups:
            if counts[g["label"]] > 1 and g.get(extra):
                g["label"] = f"{g['label']} · {g[extra]}"
