"""Intersectional Matrix (BiasConnect, thesis Ch. 6; docs/spec/thesis-tibet-biasconnect-intermit.md §3): for every
ordered pair of bias axes, how making one diverse (its counterfactual sets mixed equally) moves the other
toward or away from its ideal distribution D*: the signed n×n matrix of Intersectional
Sensitivity IS, χ²-tested edges drawn as a causal BiasGraph, bootstrap CIs on every IS.

The image sets are those of Counterfactuals (same prompts, seeds and settings), so a run
after a Counterfactuals run of the same prompt generates nothing new.

Choices the spec leaves open, each a request field or stated here:
- w̄ (W1 and its normalisation, §3.4): TV(D, D*) / (1 − min D*), biasconnect.w_bar (the
  spec's recommendation: W1 with the 0/1 ground metric, divided by its worst case).
- `other_policy` (answers outside an axis' choices): "drop" (renormalise over the choices,
  default) or "other_bin" (an extra category D* gives 0, so such answers count as bias).
- `importance` (MaxImp/MaxInf): "count" of kept edges (default) or "abs_is", the sum of |IS|
  over them; ties go to the other measure, then the name.
- The diagonal IS_xx (how mixing x's counterfactuals fixes x itself, ≈ w̄_init(x)) is kept in
  the matrix (InterMit needs it, spec §4.3) but never tested as an edge nor counted in 𝓘.
- Each axis' choices are what its counterfactuals name (the words they insert); its question
  is the known one (assets/axes.json) when the choices match its values, else the LLM's
  (engine/llm_prompts.AXIS_QUESTION), else a template; `questions` overrides.
- Aggregate mode (a prompt with a {placeholder} and fill values, §3.7) pools the counts of
  all prompts into global tables and uses the aggregated thresholds (p < 5e-5, |IS| ≥ 0.03).
- Bootstrap: images resampled within every set (an image keeps all its answers), the
  whole matrix recomputed per resample; 95% percentile intervals.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import numpy as np

from ..common.errors import InputError
from ..common.events import Event, Graph, Progress, Warning
from ..common.scores import is_missing, number
from ..core.distributed import distributed_evaluation, distributed_image_sets
from ..core.engine import Engine, Run, recorded
from ..hosting.limits import Estimate
from ..metrics import biasconnect as bc
from ..metrics.bootstrap import percentile_interval
from ..metrics.intervals import headline_claim
from . import cfsets
from .cfsets import SetSpec, SetsRequest, choices, generate_set, prepare, settle_questions_and_ideals
from .measure import AskedAnswers, cant_tell_counts, one_hot, outside_count, resample_weights, tally
from .options import settle_settings

LEVELS = ("auto", "prompt", "aggregated")
IMPORTANCE = ("count", "abs_is")


@dataclass(frozen=True)
class SensitivityMeasured(Event):
    """The sensitivity matrix, its χ² edges and intervals: the run's results (IntersectionalResults)."""

    results: dict


@dataclass
class IntersectionalRequest(SetsRequest):
    ideals: dict = field(default_factory=dict)       # axis -> {value: weight}: D*; missing axis = uniform
    other_policy: str = field(default="drop", metadata={
        "help": "answers outside an axis' choices: drop them, or count them in an 'other' bin D* gives 0",
        "choices": bc.OTHER_POLICIES})
    level: str = field(default="auto", metadata={
        "help": "edge thresholds (auto: aggregated with --fill)", "choices": LEVELS})
    p_threshold: float | None = field(default=None, metadata={
        "help": "χ² p-value below which an edge is kept (default: {:g} per prompt, {:g} aggregated)".format(
            bc.EDGE_THRESHOLDS["prompt"][0], bc.EDGE_THRESHOLDS["aggregated"][0])})
    min_abs_is: float | None = field(default=None, metadata={
        "help": "smallest |IS| of a kept edge (default: {:g} per prompt, {:g} aggregated)".format(
            bc.EDGE_THRESHOLDS["prompt"][1], bc.EDGE_THRESHOLDS["aggregated"][1])})
    importance: str = field(default="count", metadata={
        "help": "MaxImp/MaxInf by edge count or sum of |IS|", "choices": IMPORTANCE})
    questions: dict = field(default_factory=dict)     # axis -> VQA question (overrides the default)
    n_boot: int = field(default=300, metadata={"help": "bootstrap resamples of the images; 0: no intervals",
                                                 "zero_off": True})


def load_reference_csv(path: str | Path) -> dict[str, dict[str, float]]:
    """A real-world D* from a CSV with the columns axis, value, share (shares need not sum to 1)."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise InputError(f"cannot read the reference CSV: {exc}") from None
    if not rows or not {"axis", "value", "share"} <= set(rows[0]):
        raise InputError("the reference CSV needs a header with the columns axis, value, share")
    out: dict[str, dict[str, float]] = {}
    for i, row in enumerate(rows, start=2):
        try:
            out.setdefault(row["axis"].strip().lower(), {})[row["value"].strip().lower()] = float(row["share"])
        except (TypeError, ValueError):
            raise InputError(f"reference CSV line {i}: share '{row.get('share')}' is not a number") from None
    return out


def sensitivity(init: dict, tables: dict, ideals: dict, row: int = 0) -> bc.SensitivityMatrix:
    return bc.intersectional_sensitivity({y: c[row] for y, c in init.items()},
                                         {x: {y: t[row] for y, t in ys.items()} for x, ys in tables.items()}, ideals)


def _floats(values) -> list:
    """JSON-safe numbers: nan (no answer among the choices) becomes None."""
    return [None if is_missing(v) else float(v) for v in values]


def _matrix(values) -> list:
    return [_floats(row) for row in values]


# One tested edge x → y ("is" is IS_xy; kept: it passed the χ² test and the |IS| threshold).
Edge = TypedDict("Edge", {"source": str, "target": str, "is": float, "p_value": float, "statistic": float,
                          "dof": int, "kept": bool, "n_to_pass": int | None})   # N per set at which it would pass


class IntersectionalResults(TypedDict, total=False):
    """What an Intersectional run stores (`Done.results`); every number JSON-safe (nan: None)."""

    prompt: str                         # the prompt as given (a template in aggregate mode)
    prompts: list[str]                  # the filled prompts
    aggregate: bool
    n: int
    seeds: list[int]
    settings: dict                      # the generator settings used
    axes: dict[str, list[str]]          # {axis: [counterfactual prompts]}
    values: dict[str, list[str]]        # each axis' answer choices
    questions: dict[str, str]           # each axis' VQA question
    other_policy: str
    ideals: dict[str, dict[str, float]]  # D* per axis
    level: str                          # "prompt" | "aggregated": which edge thresholds
    p_threshold: float
    min_abs_is: float
    importance: str
    sensitivity: dict                   # {"axes", "matrix", "w_bar_init", "w_bar_mixed", "ci_low", "ci_high",
                                        #  "p_positive"}
    p_values: dict[str, dict[str, float]]
    edges: list[Edge]
    kept_edges: list[Edge]
    max_impact: str | None
    max_influenced: str | None
    distortion: float                   # 𝓘
    distributions: dict[str, dict]      # per axis: values, ideal, initial and mixed (per x) distributions
    outside_choices: dict[str, int]     # answers outside each axis' choices ("can't tell" not among them)
    unanswered: list[str]               # axes with no answer within their choices at all (no distribution)
    cant_tell: dict[str, dict]          # per axis: measure.cant_tell_counts (left out of every distribution)
    answers: dict[str, dict[str, str]]  # image key -> axis -> VQA answer
    answer_probs: dict[str, dict]       # image key -> axis -> class -> probability (evaluators that score classes)
    answer_sources: dict                # the distilled evaluator: axis -> answers by its probe and by its teacher
    per_prompt: dict[str, list]         # aggregate mode: each prompt's own matrix
    headline: dict                      # the strongest effect and how sure the bootstrap is of it


@dataclass
class Answers:
    """Every set's answers: one-hot rows per axis, bootstrap resample weights, and how many
    answers per axis fell outside its choices."""

    onehot: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)   # set label -> axis -> (n, K)
    weights: dict[str, np.ndarray] = field(default_factory=dict)             # set label -> (n_boot, n)
    outside: dict[str, int] = field(default_factory=dict)
    asked: AskedAnswers = field(default_factory=AskedAnswers)                 # per image, for the JSON


def check(request: IntersectionalRequest, engine: Engine) -> None:
    """Raises InputError for a request that cannot run, before any run record exists: a choice
    the method does not know, an edge threshold outside its range (p in [0, 1]; |IS| in [0, 1],
    as w̄ is), or what cfsets.check refuses."""
    if request.other_policy not in bc.OTHER_POLICIES:
        raise InputError(f"the other-answer policy must be one of {', '.join(bc.OTHER_POLICIES)}")
    if request.level not in LEVELS or request.importance not in IMPORTANCE:
        raise InputError(f"level must be one of {', '.join(LEVELS)} and importance one of {', '.join(IMPORTANCE)}")
    for value, what in ((request.p_threshold, "the p threshold"), (request.min_abs_is, "the minimum |IS| for an edge")):
        if value is not None and not (isinstance(value, (int, float)) and 0 <= value <= 1):
            raise InputError(f"{what} must be between 0 and 1; got {value}")
    cfsets.check(request, engine)


def estimate(request: IntersectionalRequest, until_cap: int | None = None, proposed: int | None = None) -> Estimate:
    """N images per set: the prompt's and one per counterfactual, per fill value; a question
    per axis from the LLM (cfsets.estimate_sets)."""
    return cfsets.estimate_sets(request, cfsets.one_set_each, proposed, asks_per_axis=True)


@recorded("intersectional", check, estimate)
def run(request: IntersectionalRequest, engine: Engine, run_record: Run):
    """BiasConnect's sensitivity matrix and bias graph of one prompt (or of a {placeholder}
    prompt filled with each of `request.fill`, pooled: aggregate mode).

    Request: IntersectionalRequest: the axes table (None: the LLM proposes it), N images per
    set, D* per axis (`ideals`), the other-answer policy, edge thresholds, bootstrap size.
    Yields: Table("axes") when the LLM proposed the axes; Warning for dropped
    counterfactuals, unexpected settings (settings_notes), one-counterfactual axes, ignored
    ideals and answers outside the choices;
    Table("questions"); Images and Progress while each set is generated and asked about;
    Progress("sensitivity"); SensitivityMeasured; Graph("biasgraph"); one Done.
    Results: IntersectionalResults.
    """
    # 1. Check the request; settle the prompts, axes and image sets (cfsets.prepare).
    prompts, axes, specs = yield from prepare(request, engine, estimate)
    settings, seeds = (yield from settle_settings(request, engine)), request.seeds()
    yield from distributed_image_sets(engine, [(s.prompt, seeds, settings) for s in specs])  # launched: every process
    # 2. Each axis' choices, VQA question and ideal distribution D* (spec §3.2).
    values = {axis: choices(request.prompt.strip(), cfs) for axis, cfs in axes.items()}
    short = [a for a, cfs in axes.items() if len(cfs) < 2]
    if short:
        yield Warning(f"axes with one counterfactual cannot be tested for edges: {', '.join(short)}")
    questions, ideals = yield from settle_questions_and_ideals(request, engine, axes, values)
    yield from distributed_evaluation(engine, [(s.prompt, seeds, settings) for s in specs],   # launched: every process
                                      asks=[(questions[y], values[y]) for y in questions])
    # 3. Generate every set and ask every axis' multiple-choice question about it.
    answers = yield from answer_sets(request, engine, run_record, specs, questions, values, settings)
    # 4. The matrix (spec §3.4), its χ² edges (§3.5) and bootstrap intervals.
    yield Progress(0, 1, "sensitivity", "computing the matrix, χ² edges and bootstrap intervals")
    results = measure(request, prompts, axes, specs, values, questions, ideals, answers)
    results.update(settings=settings.__dict__, seeds=seeds)
    # 5. Report: the scores, the graph, the record.
    yield SensitivityMeasured(results)
    yield Graph("biasgraph", [{"id": a} for a in axes], results["kept_edges"])
    yield run_record.finish(results, summarise(results))


def default_thresholds(level: str) -> dict[str, tuple[float, float]]:
    """{level: (p threshold, minimum |IS|)} that an empty `p_threshold` / `min_abs_is` means
    under `level` (spec §3.5): that level's pair, or for "auto" both levels' (the prompt
    level's with one prompt, the aggregated level's with fill values)."""
    return dict(bc.EDGE_THRESHOLDS) if level == "auto" else {level: bc.EDGE_THRESHOLDS[level]}


def threshold_notes(results: dict) -> list[str]:
    """Sentences on a p threshold that changes the graph in a way a researcher may not expect
    (p ≤ 0 keeps no edge; p ≥ 1 tests nothing), each naming the level's own threshold."""
    level, p = results.get("level", "prompt"), results.get("p_threshold")
    default = bc.EDGE_THRESHOLDS.get(level, bc.EDGE_THRESHOLDS["prompt"])[0]
    if not isinstance(p, (int, float)) or 0 < p < 1:
        return []
    if p <= 0:
        return [f"p < {p:g} keeps no edge: no p-value is below it (the {level} level's threshold is {default:g})"]
    return [f"p < {p:g} keeps every pair the test could compute: the χ² test prunes nothing (the {level} level's "
            f"threshold is {default:g})"]


def answer_sets(request: IntersectionalRequest, engine: Engine, run_record: Run, specs: list[SetSpec],
                questions: dict[str, str], values: dict[str, list[str]], settings):
    """Generate every set through the store and ask each axis' question about its images
    (use `yield from`: yields Images/Progress, then a Warning per axis with answers outside
    its choices); returns the Answers."""
    answers = Answers(outside=dict.fromkeys(questions, 0))
    seeds = request.seeds()
    for i, spec in enumerate(specs):
        def evaluate(batch):  # the same questions as below, beside the next batch's generation
            engine.ask_many(batch, [(questions[y], values[y]) for y in questions])

        records = yield from generate_set(engine, run_record, spec, seeds, settings, i, len(specs), evaluate)
        yield Progress(i, len(specs), "vqa", f"asking {len(questions)} multiple-choice question(s) about '{spec.prompt}'")
        answers.onehot[spec.label] = {}
        asked = answers.asked.ask_all(engine, spec.label, records, {y: (questions[y], values[y]) for y in questions})
        for y, labels in asked.items():
            answers.onehot[spec.label][y] = one_hot(labels, values[y], request.other_policy)
            answers.outside[y] += outside_count(labels, values[y])
        answers.weights[spec.label] = resample_weights(len(records), request.n_boot, request.seed, i)
    total = len(specs) * request.n
    unanswered = unanswered_axes(answers, request.other_policy)
    for y, count in answers.outside.items():
        if y in unanswered:
            yield Warning(unanswered_sentence(y, total, count, answers.asked.cant_tell().get(y, {}).get("cant_tell", 0)))
        elif count:
            yield Warning(f"{count} of about {total} answers about {y} were outside its choices "
                          f"({'dropped' if request.other_policy == 'drop' else 'counted as other'})")
    return answers


def unanswered_axes(answers: Answers, other_policy: str) -> list[str]:
    """The axes no image of any set was answered for within the choices (every answer outside
    them or "can't tell"; with the "other_bin" policy, outside answers count as other): such an
    axis has no distribution, so no edge can point to it and no share or w̄ is computed for it."""
    axes = dict.fromkeys(y for sets in answers.onehot.values() for y in sets)
    return [y for y in axes if not any(sets[y].sum() > 0 for sets in answers.onehot.values() if y in sets)]


def unanswered_sentence(axis: str, total: int, outside: int, cant_tell: int) -> str:
    """One sentence naming an axis without any answer within its choices (`unanswered_axes`)."""
    why = " and ".join(part for part in (f"{cant_tell} \"can't tell\"" if cant_tell else "",
                                         f"{outside} outside its choices" if outside else "") if part) or "none"
    return (f"{axis}: none of about {total} answers was one of its choices ({why}), so it has no distribution: "
            f"no edge can point to it and it is left out of every share and w̄")


def measure(request: IntersectionalRequest, prompts: list[str], axes: dict[str, list[str]], specs: list[SetSpec],
            values: dict[str, list[str]], questions: dict[str, str], ideals: dict[str, np.ndarray],
            answers: Answers) -> IntersectionalResults:
    """The sensitivity matrix (spec §3.4), its χ² edges at the request's level (§3.5; pooled
    over the prompts in aggregate mode, §3.7), bootstrap intervals on every IS, MaxImp/MaxInf
    and the distortion 𝓘 (§3.6): the results without `settings` and `seeds`."""
    policy = request.other_policy
    categories = {y: values[y] + (["other"] if policy == "other_bin" else []) for y in axes}
    init, tables = tally(specs, axes, answers.onehot)
    matrix = sensitivity(init, tables, ideals)
    level = request.level if request.level != "auto" else ("aggregated" if len(prompts) > 1 else "prompt")
    point_tables = {x: {y: t[0] for y, t in ys.items()} for x, ys in tables.items()}
    edges = bc.chi2_edges(point_tables, matrix, level, request.p_threshold, request.min_abs_is)
    draws = bootstrap_draws(request, specs, axes, ideals, answers)
    # "can't tell" on the initial images and on each axis' counterfactual sets, per answered axis
    cant_tell_initial = answers.asked.cant_tell([s.label for s in specs if s.axis is None])
    cant_tell_of = {x: answers.asked.cant_tell([s.label for s in specs if s.axis == x]) for x in axes}
    low, high = percentile_bounds(draws)
    p_threshold = bc.EDGE_THRESHOLDS[level][0] if request.p_threshold is None else request.p_threshold
    edge_rows = [{"source": e.source, "target": e.target, "is": e.sensitivity, "p_value": e.p_value,
                  "statistic": e.statistic, "dof": e.dof, "kept": e.kept,
                  "n_to_pass": None if e.kept else bc.n_to_pass(point_tables[e.source][e.target], request.n, p_threshold)}
                 for e in edges]
    results: IntersectionalResults = {
        "prompt": request.prompt.strip(), "prompts": prompts, "aggregate": len(prompts) > 1, "n": request.n,
        "axes": axes, "values": values, "questions": questions,
        "other_policy": policy, "ideals": {y: dict(zip(categories[y], ideals[y].tolist())) for y in axes},
        "level": level, "p_threshold": p_threshold,
        "min_abs_is": bc.EDGE_THRESHOLDS[level][1] if request.min_abs_is is None else request.min_abs_is,
        "importance": request.importance,
        "sensitivity": {"axes": matrix.axes, "matrix": _matrix(matrix.matrix), "w_bar_init": _floats(matrix.w_bar_init),
                        "w_bar_mixed": _matrix(matrix.w_bar_mixed), "ci_low": low and _matrix(low),
                        "ci_high": high and _matrix(high)},
        "p_values": {x: {e["target"]: e["p_value"] for e in edge_rows if e["source"] == x} for x in axes},
        "edges": edge_rows, "kept_edges": [e for e in edge_rows if e["kept"]],
        "max_impact": bc.max_impact(edges, request.importance),
        "max_influenced": bc.max_influenced(edges, request.importance),
        "distortion": bc.intersectional_distortion(matrix),
        "distributions": {y: {"values": categories[y], "ideal": ideals[y].tolist(),
                              "initial": _floats(bc.mixed_distribution(init[y][0])),
                              "mixed": {x: _floats(bc.mixed_distribution(tables[x][y][0])) for x in axes},
                              "cant_tell": {"initial": cant_tell_initial.get(y, cant_tell_counts([])),
                                            "mixed": {x: cant_tell_of[x].get(y, cant_tell_counts([])) for x in axes}}}
                          for y in axes},
        "outside_choices": answers.outside,
        "unanswered": unanswered_axes(answers, policy),
        "cant_tell": answers.asked.cant_tell(),
        **answers.asked.json(),
    }
    if draws is not None:
        results["headline"], results["sensitivity"]["p_positive"] = cell_claims(
            list(matrix.axes), np.asarray(matrix.matrix, float), draws, request.n)
    if len(prompts) > 1:
        own = {k: [spec for spec in specs if spec.prompt_index == k] for k in range(len(prompts))}
        results["per_prompt"] = {p: _matrix(sensitivity(*tally(own[k], axes, answers.onehot), ideals).matrix)
                                 for k, p in enumerate(prompts)}
    return results


def bootstrap_draws(request: IntersectionalRequest, specs: list[SetSpec], axes: dict, ideals: dict,
                    answers: Answers) -> np.ndarray | None:
    """(n_boot, n, n): the matrix recomputed on `request.n_boot` resamples of the images; None
    without resamples."""
    if not request.n_boot:
        return None
    boot_init, boot_tables = tally(specs, axes, answers.onehot, answers.weights)
    return np.array([sensitivity(boot_init, boot_tables, ideals, b).matrix for b in range(request.n_boot)])


def percentile_bounds(draws: np.ndarray | None) -> tuple[list | None, list | None]:
    """The 95% percentile interval of every cell as (low, high) matrices; (None, None) without draws."""
    if draws is None:
        return None, None
    k = draws.shape[1]
    bounds = [[percentile_interval(draws[:, i, j]) for j in range(k)] for i in range(k)]
    low, high = ([[b[c] for b in row] for row in bounds] for c in (0, 1))
    return low, high


def summarise(results: IntersectionalResults) -> dict:
    """The run's summary (Runs table, headline)."""
    return {"prompts": len(results["prompts"]), "axes": len(results["axes"]), "n": results["n"],
            "kept_edges": len(results["kept_edges"]), "max_impact": results["max_impact"],
            "max_influenced": results["max_influenced"], "distortion": round(results["distortion"], 3)}


def headline(record: dict) -> tuple[str, float | None]:
    """("distortion 0.120 · 2 bias edges · most impact: gender", the distortion 𝓘) of a stored run."""
    summary = record.get("summary") or {}
    distortion = number(summary.get("distortion"))
    parts = [f"distortion {distortion:.3f}"] if distortion is not None else []
    if number(summary.get("kept_edges")) is not None:
        parts.append(f"{summary['kept_edges']} bias edge{'' if summary['kept_edges'] == 1 else 's'}")
    if summary.get("max_impact"):
        parts.append(f"most impact: {summary['max_impact']}")
    return " · ".join(parts), distortion
def cell_claims(axes: list[str], matrix, draws: np.ndarray, n: int) -> tuple[dict, list]:
    """Issue 16 for the matrix: the strongest off-diagonal cell (largest |IS|) with the bootstrap
    probability that it is the strongest (or "no clear winner" and the N that would settle it),
    how many cells have a clear sign, and P(IS > 0) per cell. Returns (headline, p_positive)."""
    k = len(axes)
    values, cell_draws = {}, {}
    for i in range(k):
        for j in range(k):
            d = draws[:, i, j]
            if i != j and math.isfinite(matrix[i, j]) and np.isfinite(d).mean() > 0.9:
                values[f"{axes[i]} → {axes[j]}"] = abs(float(matrix[i, j]))
                cell_draws[f"{axes[i]} → {axes[j]}"] = np.where(np.isfinite(d), np.abs(d), 0.0)
    finite = np.isfinite(draws)   # a cell without any finite draw (an axis nothing answered) has no share: nan
    counted = finite.sum(axis=0)
    positive = np.where(counted > 0, (finite & (np.nan_to_num(draws) > 0)).sum(axis=0) / np.maximum(counted, 1), np.nan)
    clear = sum(1 for i in range(k) for j in range(k)
                if i != j and math.isfinite(positive[i, j]) and (positive[i, j] >= 0.975 or positive[i, j] <= 0.025))
    claim = headline_claim(values, cell_draws, n, what="strongest intersectional effect (|IS|)",
                           question="which cell is the strongest")
    claim["clear_signs"] = clear
    claim["cells"] = k * (k - 1)
    claim["text"] += (f"; {clear} of {k * (k - 1)} cells have a sign (IS above or below 0) the 95% interval is sure "
                      f"of, which is weaker evidence than a kept χ² edge")
    return claim, _matrix(positive)


# -- reading a run: which pairs are kept (the views mark the others) ------------------------------

def no_edge_note(results: dict) -> dict | None:
    """When a finished run keeps no edge: what was tested and the N per set at which the edge of
    the strongest cell (largest |IS|) would pass, its shares staying as measured. Returns {"tested", "cells", "level", "p_threshold", "min_abs_is",
    "strongest": {source, target, is, p_value, statistic, dof}, "n", "n_needed" (None when no N
    helps: |IS| below the minimum, or nothing testable), "text"}; None when an edge is kept. The
    run stores each pruned edge's N (`n_to_pass`: the same shares, the real test, bisection on N);
    for a run stored before, N·χ²_crit/χ² estimates it."""
    from scipy.stats import chi2

    edges = results.get("edges") or []
    if results.get("kept_edges") or not edges:
        return None
    p, min_is, n = results.get("p_threshold", 0.0), results.get("min_abs_is") or 0.0, results.get("n")
    axes = len(results.get("axes") or (results.get("sensitivity") or {}).get("axes") or [])
    cells = axes * (axes - 1)
    tested = [e for e in edges if e.get("dof") and number(e.get("is")) is not None and math.isfinite(e["is"])]
    unanswered = results.get("unanswered") or []
    untested = len(edges) - len(tested)
    what = (f"No edge passes: {f'all {len(edges)}' if not untested else len(tested)} of the {cells} ordered pairs "
            f"(off the diagonal) were tested with a χ² test of independence between the row axis' counterfactual "
            f"sets and the column axis' answers, needing p < {p:g}" + (f" and |IS| ≥ {min_is:g}" if min_is else "")
            + f" ({results.get('level')} level)"
            + (f"; {untested} could not be tested" + (f" ({', '.join(unanswered)}: no answer within the choices)"
                                                     if unanswered else " (one answer only on those sets)")
               if untested else "")
            + (f"; the counts of the {len(results['prompts'])} prompts are pooled, so a dependence of one prompt "
               f"alone weighs 1/{len(results['prompts'])} of them (each prompt's own matrix is in the run's export, "
               "under per_prompt)"
               if results.get("aggregate") and len(results.get("prompts") or ()) > 1 else ""))
    out = {"tested": len(tested), "cells": cells, "level": results.get("level"), "p_threshold": p,
           "min_abs_is": min_is, "strongest": None, "n": n, "n_needed": None}
    if not tested or not 0 < p < 1:
        return {**out, "text": what + "."}
    e = max(tested, key=lambda e: abs(e["is"]))
    out["strongest"] = {k: e.get(k) for k in ("source", "target", "is", "p_value", "statistic", "dof")}
    cell = f"the strongest cell, {e['source']} → {e['target']} (IS {e['is']:+.2f}, χ² p = {e['p_value']:.1e})"
    if abs(e["is"]) < min_is:
        return {**out, "text": f"{what}. Even {cell} has |IS| below {min_is:g}, which more images do not change."}
    if "n_to_pass" in e:
        out["n_needed"] = e["n_to_pass"]
    elif e.get("statistic") and n:
        out["n_needed"] = max(int(n) + 1, math.ceil(int(n) * float(chi2.isf(p, e["dof"])) / e["statistic"]))
    if not out["n_needed"]:
        return {**out, "text": f"{what}. {cell[0].upper()}{cell[1:]} shows no dependence that more images would "
                               f"bring below p < {p:g}."}
    return {**out, "text": f"{what}. For {cell}, about {out['n_needed']} images per set (now {n}) would make its edge "
                           f"pass, if its shares stay as measured."}


def edge_status(results: dict, intervened: str, affected: str) -> dict:
    """Returns {"kept": bool, "diagonal": bool, "reason": sentence} for one ordered pair of a
    finished run: kept edges are the χ²-tested dependencies the level keeps; the others are
    pruned (p above the threshold, or |IS| below the minimum), and their IS is not evidence
    of an interaction."""
    if intervened == affected:
        return {"kept": False, "diagonal": True,
                "reason": f"the diagonal: how making {affected} diverse fixes {affected} itself (not an edge)"}
    edge = next((e for e in results.get("edges", []) if e["source"] == intervened and e["target"] == affected), None)
    if edge is None:
        return {"kept": False, "diagonal": False, "reason": "this pair was not tested"}
    if edge["kept"]:
        return {"kept": True, "diagonal": False,
                "reason": f"kept edge: χ² p = {edge['p_value']:.1e} < {results.get('p_threshold', 0):g}"}
    why = (f"χ² p = {edge['p_value']:.1e} is not below {results.get('p_threshold', 0):g}"
           if edge["p_value"] is None or not edge["p_value"] < results.get("p_threshold", 0)
           else f"|IS| is below the minimum {results.get('min_abs_is') or 0:g}")
    return {"kept": False, "diagonal": False,
            "reason": f"pruned: {why}, so this is not evidence that {intervened} affects {affected}"}


def default_pair(results: dict) -> tuple[str, str] | None:
    """Returns the pair a view opens on: the kept edge with the largest |IS|, or None when no
    edge is kept (the view then says so instead of showing a pruned pair as if it counted)."""
    kept = [e for e in results.get("kept_edges", []) if e["is"] is not None and e["is"] == e["is"]]
    best = max(kept, key=lambda e: abs(e["is"]), default=None)
    return (best["source"], best["target"]) if best else None
