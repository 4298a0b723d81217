"""Intersectional Matrix (BiasConnect, thesis Ch. 6; spec §3): for every ordered pair of
bias axes, how making one diverse (its counterfactual sets mixed equally) moves the other
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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..axes import known_axes
from ..biasgraph import graph_from_results
from ..core import Engine, Run, recorded
from ..distributed import distributed_image_sets
from ..errors import InputError, LLMOutputError
from ..events import Graph, Progress, Scores, Table, Warning
from ..llm_prompts import axis_question_prompt
from ..metrics import biasconnect as bc
from ..metrics.bootstrap import percentile_interval
from .cfsets import (SetSpec, SetsRequest, add_set_arguments, check, counterfactual_value, generate_set, prepare,
                     resample_weights, set_request_fields)
from .generate import settings_for

LEVELS = ("auto", "prompt", "aggregated")
IMPORTANCE = ("count", "abs_is")


@dataclass
class IntersectionalRequest(SetsRequest):
    ideals: dict = field(default_factory=dict)       # axis -> {value: weight}: D*; missing axis = uniform
    other_policy: str = "drop"                        # "drop" | "other_bin"
    level: str = "auto"                               # edge thresholds: "prompt" | "aggregated" | "auto"
    p_threshold: float | None = None                  # None: 1e-4 (prompt) / 5e-5 (aggregated)
    min_abs_is: float | None = None                   # None: 0 (prompt) / 0.03 (aggregated)
    importance: str = "count"                         # MaxImp/MaxInf by edge "count" or "abs_is"
    questions: dict = field(default_factory=dict)     # axis -> VQA question (overrides the default)
    n_boot: int = 300                                 # bootstrap resamples; 0 = no intervals


def choices(template: str, cfs: list[str]) -> list[str]:
    """An axis' answer choices: what its counterfactuals name, in order, without repeats."""
    return list(dict.fromkeys(counterfactual_value(template, cf) for cf in cfs))


def _question_reply(obj) -> str:
    text = obj.get("question") if isinstance(obj, dict) else obj
    if not isinstance(text, str) or not text.strip():
        raise ValueError('expected {"question": "..."}')
    return text.strip()


def axis_question(engine: Engine, axis: str, values: list[str], seed: int = 0) -> tuple[str, str]:
    """(question, where it came from) for a multiple-choice VQA over `values` (spec §3.2)."""
    known = known_axes().get(axis)
    if known and set(known.values) == set(values):
        return known.question, "assets/axes.json"
    try:
        return engine.ask_json([{"role": "user", "content": axis_question_prompt(axis, values)}], _question_reply,
                               temperature=0.0, seed=seed), "LLM"
    except LLMOutputError:
        return f"What is the {axis} ({', '.join(values)}) of the person in the image?", "template (the LLM failed)"


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


def one_hot(labels: list[str], values: list[str], other_policy: str) -> np.ndarray:
    """(n, K) rows of biasconnect.value_counts for each image's answer."""
    return np.array([bc.value_counts([label], values, other_policy) for label in labels])


def tally(specs: list[SetSpec], axes: dict[str, list[str]], answers: dict, weights: dict | None = None,
          interventions: dict[str, list[str]] | None = None):
    """Counts behind the matrix: init {y: (m, K)} and tables {x: {y: (m, rows, K)}} summed over
    the prompts. `answers[label][y]` is a set's one-hot (n, K); with `weights[label]` (m, n)
    every one of the m resamples is counted, else m = 1 (all images once). `interventions`
    ({x: [cfs]}, default `axes`) limits the rows x to the axes whose sets were generated
    (Mitigate measures only the axes not mitigated yet); the columns y stay `axes`."""
    def counts(spec, y):
        rows = answers[spec.label][y]
        return rows.sum(axis=0)[None] if weights is None else weights[spec.label] @ rows

    init = {y: sum(counts(s, y) for s in specs if s.axis is None) for y in axes}
    tables = {x: {y: np.stack([sum(counts(s, y) for s in specs if s.axis == x and s.cf == cf) for cf in cfs], axis=1)
                  for y in axes} for x, cfs in (axes if interventions is None else interventions).items()}
    return init, tables


def sensitivity(init: dict, tables: dict, ideals: dict, row: int = 0) -> bc.SensitivityMatrix:
    return bc.intersectional_sensitivity({y: c[row] for y, c in init.items()},
                                         {x: {y: t[row] for y, t in ys.items()} for x, ys in tables.items()}, ideals)


def _floats(values) -> list:
    """JSON-safe numbers: nan (no answer among the choices) becomes None."""
    return [None if v != v else float(v) for v in values]


def _matrix(values) -> list:
    return [_floats(row) for row in values]


def check_request(request: IntersectionalRequest, engine: Engine) -> None:
    """Raises InputError for a request that cannot run (before any run record exists)."""
    if request.other_policy not in bc.OTHER_POLICIES:
        raise InputError(f"the other-answer policy must be one of {', '.join(bc.OTHER_POLICIES)}")
    if request.level not in LEVELS or request.importance not in IMPORTANCE:
        raise InputError(f"level must be one of {', '.join(LEVELS)} and importance one of {', '.join(IMPORTANCE)}")
    check(request, engine)


@recorded("intersectional", check_request)
def run(request: IntersectionalRequest, engine: Engine, run: Run):
    prompts, axes, specs = yield from prepare(request, engine)
    template = request.prompt.strip()
    settings = settings_for(request, engine)
    seeds = request.seeds()
    yield from distributed_image_sets(engine, [(s.prompt, seeds, settings) for s in specs])  # launched: every process
    policy = request.other_policy
    values = {axis: choices(template, cfs) for axis, cfs in axes.items()}
    categories = {y: values[y] + (["other"] if policy == "other_bin" else []) for y in axes}
    short = [a for a, cfs in axes.items() if len(cfs) < 2]
    if short:
        yield Warning(f"axes with one counterfactual cannot be tested for edges: {', '.join(short)}")
    questions, sources = {}, {}
    for axis in axes:
        if axis in request.questions:
            questions[axis], sources[axis] = request.questions[axis], "request"
        else:
            questions[axis], sources[axis] = axis_question(engine, axis, values[axis], request.llm_seed)
    try:
        ideals = {y: bc.ideal_distribution(values[y], {k.strip().lower(): v for k, v in request.ideals[y].items()}
                                           if request.ideals.get(y) else None, policy) for y in axes}
    except ValueError as exc:
        raise InputError(f"ideal distribution: {exc}") from None
    unknown = set(request.ideals) - set(axes)
    if unknown:
        yield Warning(f"ideal distributions for axes not in the table are ignored: {', '.join(sorted(unknown))}")
    yield Table("questions", ["axis", "question", "choices", "source"],
                [[a, questions[a], ", ".join(values[a]), sources[a]] for a in axes])

    answers, weights, outside = {}, {}, dict.fromkeys(axes, 0)
    for i, spec in enumerate(specs):
        records = yield from generate_set(engine, run, spec, seeds, settings, i, len(specs))
        yield Progress(i, len(specs), "vqa", f"asking {len(axes)} multiple-choice question(s) about '{spec.prompt}'")
        answers[spec.label] = {}
        for y in axes:
            labels = engine.ask(records, questions[y], values[y])
            answers[spec.label][y] = one_hot(labels, values[y], policy)
            outside[y] += len(labels) - int(bc.value_counts(labels, values[y], "drop").sum())
        weights[spec.label] = resample_weights(len(records), request.n_boot, request.seed, i)
    total = len(specs) * request.n
    for y, count in outside.items():
        if count:
            yield Warning(f"{count} of about {total} answers about {y} were outside its choices "
                          f"({'dropped' if policy == 'drop' else 'counted as other'})")

    yield Progress(0, 1, "sensitivity", "computing the matrix, χ² edges and bootstrap intervals")
    init, tables = tally(specs, axes, answers)
    matrix = sensitivity(init, tables, ideals)
    level = request.level if request.level != "auto" else ("aggregated" if len(prompts) > 1 else "prompt")
    point_tables = {x: {y: t[0] for y, t in ys.items()} for x, ys in tables.items()}
    edges = bc.chi2_edges(point_tables, matrix, level, request.p_threshold, request.min_abs_is)
    low = high = None
    if request.n_boot:
        boot_init, boot_tables = tally(specs, axes, answers, weights)
        draws = np.array([sensitivity(boot_init, boot_tables, ideals, b).matrix for b in range(request.n_boot)])
        bounds = [[percentile_interval(draws[:, i, j]) for j in range(len(axes))] for i in range(len(axes))]
        low, high = ([[b[k] for b in row] for row in bounds] for k in (0, 1))
    edge_rows = [{"source": e.source, "target": e.target, "is": e.sensitivity, "p_value": e.p_value,
                  "statistic": e.statistic, "dof": e.dof, "kept": e.kept} for e in edges]
    results = {
        "prompt": template, "prompts": prompts, "aggregate": len(prompts) > 1, "n": request.n, "seeds": seeds,
        "settings": settings.__dict__, "axes": axes, "values": values, "questions": questions,
        "other_policy": policy, "ideals": {y: dict(zip(categories[y], ideals[y].tolist())) for y in axes},
        "level": level, "p_threshold": bc.EDGE_THRESHOLDS[level][0] if request.p_threshold is None else request.p_threshold,
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
                              "mixed": {x: _floats(bc.mixed_distribution(tables[x][y][0])) for x in axes}}
                          for y in axes},
        "outside_choices": outside,
    }
    if len(prompts) > 1:
        own = {k: [spec for spec in specs if spec.prompt_index == k] for k in range(len(prompts))}
        results["per_prompt"] = {p: _matrix(sensitivity(*tally(own[k], axes, answers), ideals).matrix)
                                 for k, p in enumerate(prompts)}
    yield Scores("sensitivity", results)
    yield Graph("biasgraph", [{"id": a} for a in axes], results["kept_edges"], graph_from_results(results))
    summary = {"prompts": len(prompts), "axes": len(axes), "n": request.n, "kept_edges": len(results["kept_edges"]),
               "max_impact": results["max_impact"], "max_influenced": results["max_influenced"],
               "distortion": round(results["distortion"], 3)}
    yield run.finish(results, summary)


def add_cli(sub, common_arguments) -> None:
    """`python -m engine intersectional --prompt ... -n 8 [--axes JSON] [--json]`"""
    p = sub.add_parser("intersectional", help="BiasConnect: intersectional sensitivity matrix and χ² bias graph")
    add_set_arguments(p, common_arguments)
    p.add_argument("--other-policy", choices=bc.OTHER_POLICIES, default="drop",
                   help="answers outside an axis' choices: drop them, or count them in an 'other' bin D* gives 0")
    p.add_argument("--level", choices=LEVELS, default="auto", help="edge thresholds (auto: aggregated with --fill)")
    p.add_argument("--p-threshold", type=float, default=None)
    p.add_argument("--min-abs-is", type=float, default=None)
    p.add_argument("--importance", choices=IMPORTANCE, default="count", help="MaxImp/MaxInf by edge count or sum |IS|")
    p.add_argument("--reference-csv", default=None, help="real-world D*: a CSV with the columns axis, value, share")
    p.add_argument("--n-boot", type=int, default=300)
    p.set_defaults(method=run, make_request=lambda a: IntersectionalRequest(
        **set_request_fields(a), other_policy=a.other_policy, level=a.level, p_threshold=a.p_threshold,
        min_abs_is=a.min_abs_is, importance=a.importance, n_boot=a.n_boot,
        ideals=load_reference_csv(a.reference_csv) if a.reference_csv else {}))


# -- reading a run: which pairs are kept (the views mark the others) ------------------------------

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
