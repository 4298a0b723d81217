"""Single Prompt: N images of one prompt, then (streamed as each is ready) the attribute
distribution and T2I-BiasBench metrics of every axis with small-N intervals (Jeffreys shares,
posterior or BCa metric intervals, the N a narrower interval needs), CLIP diversity
(Vendi), the MineTheGap gap score with its missed interpretations, and Top-K concepts.

Specs (docs/spec/): minethegap-and-biasbench.md Part B (metrics), A.3 (gap score, a reconstruction),
Part C (wiring); thesis §2.8 (Top-K concepts); issue 16 (intervals, headline certainty, adding
images until the intervals are narrow enough).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypedDict

import numpy as np

from ..backends.llm_json import JSON_ATTEMPTS
from ..common.errors import InputError
from ..common.events import Event, Headline, Progress, Table, Warning
from ..core.engine import Engine, Run, recorded, stream_image_set
from ..core.evaluators import axes_left_out, check_comparable
from ..store.store import CAPTION
from ..hosting import backend_choices
from ..hosting.limits import Estimate
from ..metrics import biasbench
from ..metrics.concepts import top_phrases
from .axes import Axis, axis_for
from ..metrics.intervals import headline_claim
from ..common.names import readable
from ..common.scores import Score, as_interval, finite_or_none, is_missing, number
from ..metrics.diversity import mean_pairwise_similarity, normalised_vendi, vendi_score
from ..metrics.gap import COMBINATIONS
from .measure import (SCALAR_METRICS, AskedAnswers, compare_evaluators_on, evaluator_names, gap_for_images,
                      measure_axes)
from .options import GenerationOptions, settle_settings

DEFAULT_AXES = ("gender", "age", "skin tone")


@dataclass(frozen=True)
class DiversityMeasured(Event):
    """Vendi score and mean pairwise similarity of the images' embeddings (results["diversity"])."""

    diversity: dict


@dataclass(frozen=True)
class EvaluatorsCompared(Event):
    """Several evaluators' agreement on the run's images (results["evaluators"]; issue 35)."""

    comparison: dict


@dataclass(frozen=True)
class GapMeasured(Event):
    """The prompt's MineTheGap gap score and its missed interpretations (results["gap"]; spec A.3)."""

    gap: dict


@dataclass
class SinglePromptRequest(GenerationOptions):
    prompt: str = field(metadata={"help": "the prompt to audit"})
    n: int = field(default=16, metadata={"flag": "-n", "help": "images"})
    seed: int = field(default=0, metadata={"help": "images use the seeds seed .. seed+n-1"})
    axes: list[str] = field(default_factory=lambda: list(DEFAULT_AXES), metadata={
        "help": "attribute axes to measure (known ones have fixed choices; others are free VQA answers)"})
    references: dict = field(default_factory=dict)   # axis -> {value: target share}; missing = uniform
    mode: str = field(default=biasbench.DEFAULT_MODE, metadata={
        "help": "T2I-BiasBench: the paper's equations, or bit-exact with the authors' code",
        "choices": ("paper", "reference")})
    n_variations: int | None = field(default=None, metadata={
        "help": "MineTheGap text variations of the prompt (default: n)"})
    alpha: float = field(default=25.0, metadata={"help": "gap-score percentile (spec A.3)"})
    combine: str = field(default="diff", metadata={"help": "how the gap score combines its terms",
                                                   "choices": COMBINATIONS})
    n_boot: int = field(default=1000, metadata={"help": "posterior draws / bootstrap resamples per interval"})
    top_k: int = field(default=10, metadata={"help": "concepts listed"})
    gap: bool = field(default=True, metadata={"flag": "--no-gap", "help": "skip the gap score (it needs the LLM)"})
    half_width: float = field(default=0.1, metadata={
        "help": "the ± interval the 'how many images' advice aims at"})
    until_half_width: float | None = field(default=None, metadata={
        "metavar": "X", "help": "add images (reusing the cache) until every share's interval is within ±X"})
    # other VQA evaluators ('backend:model') that answer every axis too, for their agreement (issue 35;
    # on the command line a second --vqa, not an option of its own)
    evaluators: list[str] = field(default_factory=list)

    def seeds(self) -> list[int]:
        return list(range(self.seed, self.seed + self.n))


def most_biased_axis(axes: dict[str, dict], draws: dict[str, np.ndarray | None]) -> dict:
    """The headline over a Single Prompt's axes: the axis with the largest composite bias score,
    the posterior probability that it is the largest (draws are independent across axes), or
    "no clear winner" and the N that would settle it (engine.metrics.intervals.headline_claim)."""
    values = {a: finite_or_none(m.get("composite_bias_score")) for a, m in axes.items()}
    usable = {a: v for a, v in values.items() if v is not None and draws[a] is not None and len(draws[a]) > 2}
    if len(usable) < 2:  # one axis: nothing to rank
        return {"top": None, "text": ""}
    n = min(axes[a]["n"] for a in usable)
    return headline_claim(usable, {a: draws[a] for a in usable}, n, what="most biased axis (composite bias score)",
                          unit="images")


class SinglePromptResults(TypedDict, total=False):
    """What a Single Prompt run stores (`Done.results`); saved step by step as it goes."""

    prompt: str
    settings: dict                       # the generator settings used
    n: int                               # images measured (grown by `until_half_width`)
    images: list[dict]                   # ImageRecord.to_json of every image
    axes: dict[str, dict]                # per axis: axis_metrics_with_ci + question, labels, reference
    headline: dict                       # the most biased axis and how sure the intervals are of it
    answers: dict[str, dict[str, str]]   # image key -> axis -> VQA answer (a class, "can't tell" or "other")
    answer_probs: dict[str, dict]        # image key -> axis -> class -> probability (evaluators that score classes)
    answer_sources: dict                 # the distilled evaluator: axis -> answers by its probe and by its teacher
    diversity: dict                      # vendi, vendi_normalised, mean_pairwise_similarity, n, embedder
    evaluators: dict                     # several evaluators compared (when request.evaluators): compare_evaluators_on
    gap: dict                            # gap_for_images (when request.gap)
    captions: list[str]
    top_concepts: list[list]             # [concept, share of images], most frequent first
    notes: list[dict]                    # optional parts missing ({"part", "note"}: why), when a step failed
    all_flagged: bool                    # every image flagged: nothing measured (then `message` says so)
    message: str


def compared_axes(axes: list[Axis]) -> list[Axis]:
    """The axes other evaluators answer too: those with classes (a free answer has none to agree on)."""
    return [a for a in axes if a.values]


def several_evaluators(engine: Engine, others: list, axes: list[Axis], valid: list,
                       answers_by_axis: dict[str, list[str]], answer_probs: dict, left_out: dict[str, str],
                       seed: int = 0) -> dict:
    """The run's evaluator and the `others` (ModelSpecs) on the same images, per axis of `axes` with
    classes but those `left_out` ({axis: why}: one of them cannot answer it): their agreement, κ, the
    distribution where they agree, the images where they disagree and every answer with its
    probabilities (`answer_probs`: the run's, image key -> axis -> class -> p); measure.compare_evaluators_on.
    The result names the axes left out ("left_out")."""
    axes = [a for a in compared_axes(axes) if a.name not in left_out]
    first_probs = {a.name: [answer_probs.get(r.key, {}).get(a.name) for r in valid] for a in axes}
    out = compare_evaluators_on(
        engine, others, {a.name: (a.question, list(a.values)) for a in axes}, {a.name: valid for a in axes},
        {a.name: answers_by_axis[a.name] for a in axes}, engine.preset.vqa.full_label,
        {a.name: list(a.values) for a in axes}, seed=seed, first_probs=first_probs)
    return {**out, "left_out": left_out}


def _more_images(request: SinglePromptRequest, axes: dict, n: int, max_images: int) -> int | None:
    """None when no more images are wanted (no target, or every share interval is within
    ±until_half_width); else the N to grow to (capped at max_images; ≤ n means the cap is hit)."""
    target = request.until_half_width
    if not target:
        return None
    widest = max(((hi - lo) / 2 for m in axes.values() for lo, hi in m["share_ci"].values()
                  if lo is not None and hi is not None), default=0.0)
    if widest <= target:
        return None
    need = max((m["sample_size"]["n_width"] or 0) for m in axes.values()) if axes else n
    wanted = max(n + 1, min(int(need), 4 * n))   # grow at most 4x per round: the advice uses the shares seen so far
    return min(max_images, wanted)


def check(request: SinglePromptRequest, engine: Engine) -> None:
    """Raises InputError for a request that cannot run (before any run record exists)."""
    n = engine.check_n(request.n)
    engine.check_prompt(request.prompt)
    engine.check_n(request.n_variations or n, "number of text variations")
    engine.check_questions([axis_for(a).question for a in request.axes if a and a.strip()])
    # a name that is no evaluator, or one a public GapLens does not offer; no axis every evaluator answers
    check_comparable(other_evaluators(engine, request),
                     {a.name: a.question for a in compared_axes(unique_axes(request.axes))})
    for what, value in (("interval half-width", request.half_width), ("target half-width", request.until_half_width)):
        if value is not None and not 0 < float(value) < 0.5:
            raise InputError(f"the {what} must be between 0 and 0.5 (e.g. 0.1 for ±10 points), not {value:g}")


def unique_axes(names: list[str]) -> list[Axis]:
    """The request's axes, each once, in order (blank names dropped)."""
    return [axis_for(a) for a in dict.fromkeys(a.strip() for a in names if a and a.strip())]


def other_evaluators(engine: Engine, request: SinglePromptRequest) -> list:
    """The ModelSpecs of `request.evaluators` (InputError for a name that is none, or that a
    public GapLens does not offer)."""
    return [backend_choices.resolve(engine, "vqa", name) for name in request.evaluators or []]


def distinct_evaluators(engine: Engine, others: list) -> tuple[list, list[str]]:
    """(the `others` whose loaded model is neither the run's evaluator nor an earlier one, the labels of
    those left out): the same model listed again would only count its agreement with itself."""
    if not others:
        return [], []
    seen, kept, repeated = {engine.model_id("vqa")}, [], []
    for spec in others:
        model_id = engine.with_vqa(spec).model_id("vqa")
        (repeated if model_id in seen else kept).append(spec.full_label if model_id in seen else spec)
        seen.add(model_id)
    return kept, repeated


def estimate(request: SinglePromptRequest, until_cap: int | None = None, proposed: int | None = None) -> Estimate:
    """N images, or up to `until_cap` (the largest N the user may grow a set to; None: not
    counted) when `until_half_width` grows the set; the gap score's variations: one JSON question
    to the LLM, asked again while its reply is unusable (JSON_ATTEMPTS calls at most)."""
    n = int(request.n)
    return Estimate(max(n, until_cap or 0) if request.until_half_width else n, JSON_ATTEMPTS if request.gap else 0)


@recorded("single_prompt", check, estimate)
def run(request: SinglePromptRequest, engine: Engine, run_record: Run):
    """N images of one prompt measured for bias: the attribute distribution of every axis with
    T2I-BiasBench metrics and small-N intervals, CLIP diversity, the MineTheGap gap score and
    Top-K concepts, each streamed as soon as it is computed.

    Request: SinglePromptRequest (prompt, N, seed, axes and their reference distributions,
    metric mode, gap-score settings, interval settings, Top-K).
    Yields: Warning for an over-long prompt, unexpected settings
    (settings_notes) and flagged images; Images and Progress while
    generating; Progress("vqa") and AxisScores per axis (again after images are
    added); Headline; DiversityMeasured; Progress("gap") and GapMeasured (when
    `gap`); Table("top_concepts"); one Done.
    Results: SinglePromptResults.
    """
    # 1. Check the request.
    prompt = engine.check_prompt(request.prompt)
    n = int(request.n)                          # check() has checked N and the variations
    n_var = int(request.n_variations or n)
    axes = unique_axes(request.axes)
    others = other_evaluators(engine, request)
    left_out = axes_left_out(others, {a.name: a.question for a in compared_axes(axes)})
    settings = yield from settle_settings(request, engine)
    results: SinglePromptResults = {"prompt": prompt, "settings": settings.__dict__, "axes": {}, "n": n}
    if len(prompt.split()) * 1.3 > 75:
        yield Warning("this prompt is likely longer than CLIP's 77 tokens; the end may be ignored")
    if left_out:   # said before any image is made; the comparison says it again
        yield Warning(f"left out of the evaluator comparison: {', '.join(left_out)}, since "
                      f"{next(iter(left_out.values()))}")

    # 2. Generate the images (flagged ones are kept but left out of every metric; each batch is
    #    evaluated while the next one generates) and measure every axis (VQA; spec B.2-B.3); with
    #    `until_half_width`, add images until the share intervals are narrow enough.
    def evaluate(batch):  # overlaps the next batch's generation; fills the caches the calls below read
        valid_batch = [r for r in batch if not r.nsfw]
        if valid_batch:
            engine.ask_many(valid_batch, [(axis.question, list(axis.values) or None) for axis in axes])
            engine.embed_images(valid_batch)
            engine.caption(valid_batch)

    while True:
        records = yield from stream_image_set(engine, run_record, prompt, list(range(request.seed, request.seed + n)),
                                              settings, evaluate=evaluate)
        results["images"] = [r.to_json() for r in records]
        results["n"] = n
        valid = [r for r in records if not r.nsfw]
        if not valid:
            # Nothing left to measure: one clear result instead of metrics over an empty set.
            message = (f"every image was flagged by the safety checker or refused by the API ({len(records)} of "
                       f"{len(records)}), so nothing was measured; try another prompt or seed, or load the "
                       "generator with option safety_checker=False")
            results.update(all_flagged=True, message=message)
            yield Warning(message)
            yield run_record.finish(results, {"n": 0, "flagged": len(records), "message": message})
            return
        flagged = sum(r.nsfw and not r.refused for r in records)   # refusals were reported as such
        if flagged:
            yield Warning(f"{flagged} image(s) flagged by the safety checker are excluded from every metric")
        run_record.save(results)
        results["answer_probs"], asked = {}, AskedAnswers()
        answers_by_axis, draws = yield from measure_axes(engine, valid, axes, results["axes"], request.references,
                                                           request.mode, request.n_boot, request.half_width,
                                                           answer_probs=results["answer_probs"], asked=asked)
        more = _more_images(request, results["axes"], n, engine.max_set_images())  # what admission charged
        if more is None:
            break
        if more <= n:
            yield Warning(f"stopped at N = {n}, the most a set may have here: the widest share interval is still wider "
                          f"than ±{request.until_half_width:g}")
            break
        yield Progress(n, more, "images", f"an interval is wider than ±{request.until_half_width:g}: "
                       f"adding images until N = {more} (the first {n} come from the cache)")
        n = more
    results["headline"] = most_biased_axis(results["axes"], draws)
    yield Headline(results["headline"])
    results["answers"] = asked.answers   # image key -> axis -> answer
    if asked.sources:   # the distilled evaluator: which answers its probe gave, which its teacher
        results["answer_sources"] = asked.sources
    run_record.save(results)
    others, repeated = distinct_evaluators(engine, others)
    if repeated:
        yield Warning(f"asked once: {', '.join(repeated)} (the run's own evaluator, or listed twice: an evaluator "
                      "always agrees with itself)")
    if others:   # every axis with classes answered by each other evaluator too (issue 35)
        yield Progress(0, 1, "vqa", f"asking {len(others)} more evaluator(s)")
        results["evaluators"] = several_evaluators(engine, others, axes, valid, answers_by_axis,
                                                   results["answer_probs"], left_out, request.seed)
        yield EvaluatorsCompared(results["evaluators"])
        run_record.save(results)

    # 3. Diversity over CLIP image embeddings (Vendi).
    image_emb = engine.embed_images(valid)
    results["diversity"] = diversity(image_emb, engine.model_id("embedder"))
    yield DiversityMeasured(results["diversity"])

    # 4. MineTheGap gap score (reconstruction, spec A.3).
    #    Optional steps (the gap score, captions, Top-K concepts): a failure leaves a note, never loses the run.
    if request.gap:
        yield Progress(0, 1, "gap", "asking the LLM for text variations of the prompt")
        gap_result = yield from run_record.optional(results, "gap", "the gap score", lambda: gap_for_images(
            engine, prompt, valid, image_emb, n_var, request.alpha, request.combine, seed=request.seed))
        if gap_result is not None:
            results["gap"] = gap_result
            yield GapMeasured(gap_result)
            run_record.save(results)

    # 5. Top-K concepts from every VQA answer plus a caption per image (thesis §2.8), as whole
    # phrases with variants merged (metrics.concepts; CAS keeps TIBET's unigrams).
    captions = yield from run_record.optional(results, "captions", "the captions", lambda: engine.caption(valid))
    if captions is not None:
        results["captions"] = captions
    per_image = [[answers_by_axis[a][j] for a in answers_by_axis] for j in range(len(valid))]
    top = yield from run_record.optional(results, "top_concepts", "the Top-K concepts", lambda: top_phrases(
        per_image, captions, request.top_k, known=prompt.lower().split()))
    if top is not None:
        results["top_concepts"] = [[c, round(f, 3)] for c, f in top]
        yield Table("top_concepts", ["concept", "share of images"], results["top_concepts"])

    yield run_record.finish(results, summary_of(results))


def diversity(image_emb: np.ndarray, embedder: str) -> dict:
    """Diversity of a set from its (n, d) CLIP image embeddings: Vendi (raw and normalised by n)
    and the mean pairwise cosine similarity (engine.metrics.diversity)."""
    return {"vendi": vendi_score(image_emb), "vendi_normalised": normalised_vendi(image_emb),
            "mean_pairwise_similarity": mean_pairwise_similarity(image_emb), "n": len(image_emb),
            "embedder": embedder}


def summary_of(results: SinglePromptResults) -> dict:
    """The run's summary row (the Runs list): N measured, Vendi, the gap score, the headline's
    top axis, each axis' composite bias score (None where it is undefined) and class counts, and
    the optional parts missing (`missing`, each explained in results["notes"])."""
    summary = {"n": results["diversity"]["n"], "vendi": round(results["diversity"]["vendi"], 3)}
    if "gap" in results:
        summary["gap_score"] = round(results["gap"]["score"], 4)
    if results["headline"].get("top"):
        summary["top_axis"] = results["headline"]["top"]
        summary["top_axis_probability"] = round(results["headline"]["probability"], 3)
    for name, m in results["axes"].items():
        summary[f"cbs_{name}"] = None if is_missing(m["composite_bias_score"]) else round(m["composite_bias_score"], 3)
        summary[f"counts_{name}"] = {c: int(k) for c, k in m["counts"].items()}
    if results.get("notes"):
        summary["missing"] = [n["part"] for n in results["notes"]]
    return summary


def image_details(engine: Engine, image_key: str, results: dict | None = None, run_id: str | None = None) -> dict:
    """What the gallery shows for one clicked image: its row in the store, its caption, and per axis of
    the run (`results`) the question once with every evaluator's answer about it (`image_answers`;
    the run's evaluator named from run `run_id`'s record, else the engine's)."""
    rows = engine.store.image_rows([image_key])
    stored = engine.store.answers_for_image(image_key)
    caption = next((a["answer"] for a in stored if a["question"] == CAPTION and a["answer"]), "")
    run = engine.store.get_run(run_id) if run_id else None
    evaluator = evaluator_names(str(((run or {}).get("models") or {}).get("vqa") or engine.preset.vqa.full_label),
                                [])[0]
    return {"image": rows[0] if rows else None, "caption": caption,
            "answers": image_answers(results or {}, image_key, evaluator)}


def image_answers(results: dict, image_key: str, evaluator: str) -> list[dict]:
    """Per axis of a Single Prompt run's `results`: {"axis", "question", "answers": [{"evaluator", "label",
    "probs"}]}, the answers about image `image_key` as the run's distributions and its evaluator
    comparison counted them ("can't tell" where the top probability was below the run's threshold),
    each evaluator once by the comparison's name (the run's own: `evaluator` when none was compared)."""
    compared = (results.get("evaluators") or {}).get("axes") or {}
    own = (results.get("answers") or {}).get(image_key) or {}
    own_probs = (results.get("answer_probs") or {}).get(image_key) or {}
    out = []
    for axis, m in (results.get("axes") or {}).items():
        c = compared.get(axis) or {}
        if image_key in (c.get("answers") or {}):
            labels, probs = c["answers"][image_key], (c.get("answer_probs") or {}).get(image_key) or {}
        elif axis in own:
            labels, probs = {evaluator: own[axis]}, {evaluator: own_probs.get(axis)}
        else:
            continue
        out.append({"axis": axis, "question": m.get("question") or axis,
                    "answers": [{"evaluator": name, "label": label, "probs": probs.get(name)}
                                for name, label in labels.items()]})
    return out


def scores(results: dict, summary: dict) -> list[Score]:
    """Per axis the T2I-BiasBench scalars and each class' share (with their bootstrap
    intervals), then diversity, the gap score and the Top-K concept frequencies."""
    rows = []
    for axis, m in results.get("axes", {}).items():
        ci = m.get("ci", {})
        for key in ("composite_bias_score", *SCALAR_METRICS[:-1]):
            if number(m.get(key)) is not None:
                rows.append(Score(axis, key, float(m[key]), *(as_interval(ci.get(key)) or (None, None))))
        for c in m.get("classes", []):
            share = m.get("representation_parity", {}).get(c, 0.0)
            rows.append(Score(axis, f"share: {c}", float(share),
                              *(as_interval(m.get("share_ci", {}).get(c)) or (None, None))))
    d = results.get("diversity") or {}
    for key in ("vendi", "vendi_normalised", "mean_pairwise_similarity"):
        if number(d.get(key)) is not None:
            rows.append(Score("diversity", key, float(d[key])))
    g = results.get("gap") or {}
    for key in ("score", "coverage_term", "alignment_term"):
        if number(g.get(key)) is not None:
            rows.append(Score("gap", key, float(g[key])))
    for concept, freq in results.get("top_concepts") or []:
        rows.append(Score("top concepts", str(concept), float(freq)))
    return rows


def headline(record: dict) -> tuple[str, float | None]:
    """("max Composite Bias Score 0.412 (gender) · Vendi 3.10 · gap 0.120", the largest CBS) of a stored run."""
    summary = record.get("summary") or {}
    cbs = {k[4:]: v for k, v in summary.items() if k.startswith("cbs_") and number(v) is not None}
    parts, value = [], None
    if cbs:
        axis = max(cbs, key=cbs.get)
        value = float(cbs[axis])
        parts.append(f"max {readable('composite_bias_score')} {value:.3f} ({axis})")
        p = number(summary.get("top_axis_probability"))  # issue 16: how sure "most biased" is
        if p is not None and summary.get("top_axis") == axis:
            parts[-1] += f", top with probability {p:.2f}" + ("" if p >= 0.95 else ": no clear winner")
    if number(summary.get("vendi")) is not None:
        parts.append(f"Vendi {summary['vendi']:.2f}")
    if number(summary.get("gap_score")) is not None:
        parts.append(f"gap {summary['gap_score']:.3f}")
    return " · ".join(parts), value
