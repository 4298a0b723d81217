"""Compare models: the same Single Prompt, Counterfactuals or Intersectional audit on two or
more generators in one action, results side by side with differences and their intervals.

The Stable Bias explorers and the thesis (Fig. 6.8: aggregated BiasGraphs of SD 1.4,
FLUX-dev, Kandinsky 2.2 and Playground 2.5 side by side) compare generators this way. Only
the generator changes: the embedder, VQA and LLM stay the engine's, so a difference is the
generators' and not the evaluators'; Counterfactuals and Intersectional use one set of axes
and counterfactuals for every model (proposed once when none are given). Generators load one
after another: each is unloaded before the next loads, so the memory plan holds one
generator at a time, never all of them. Each model's audit is an ordinary run of its method
(listed in Runs, resumable from the store); this run records their ids and the comparison.

Every model makes its images from the same seeds, so image i of each starts from the same noise. When
the sets' seeds match (Single Prompt), the models are compared seed by seed (engine/metrics/paired.py):
each share's change gets a paired interval (bootstrap over seeds) in place of the approximate unpaired
one, which is kept beside it with how much narrower the paired one is, and each axis a paired verdict
on its distance from the target (`paired_by_seed`), as the bias check (`python -m engine check`) gives.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields

from ..backends.base import ModelSpec
from ..common.errors import GapLensError, InputError
from ..common.events import Done, Event, Progress, Table, Warning
from ..common.names import short_label
from ..common.scores import Score, difference, is_missing
from ..core.engine import Engine, Run, recorded
from ..hosting import backend_choices
from ..hosting.limits import Estimate
from ..metrics import paired
from . import cfsets

AUDITS = ("single_prompt", "counterfactuals", "intersectional")   # the methods it compares (rows of METHODS)


@dataclass(frozen=True)
class ModelDone(Event):
    """The run of model `index` (`generator`, its label) finished: its run id and results."""

    index: int
    generator: str
    run_id: str
    results: dict


@dataclass(frozen=True)
class Compared(Event):
    """The runs side by side (results["comparison"])."""

    comparison: dict


@dataclass
class CompareModelsRequest:
    method: str                                        # single_prompt | counterfactuals | intersectional
    generators: list[str] = field(default_factory=list,  # preset names or "backend:model" specs
                                  metadata={"backend": "generator"})  # public mode: backend_choices.offered
    request: dict = field(default_factory=dict)         # the method's request fields (prompt, n, axes, ...)


def generator_spec(engine: Engine, text: str) -> ModelSpec:
    """Returns the generator a name stands for: a preset's generator, or a 'backend:model' spec
    (a visitor of a public GapLens: one the host offers; engine.hosting.backend_choices.resolve)."""
    return backend_choices.resolve(engine, "generator", text)


def audit(request: CompareModelsRequest):
    """The row of METHODS of the method `request` compares; InputError for one it does not."""
    from . import METHODS     # the table lists this module: read at call time

    if request.method not in AUDITS:
        raise InputError(f"compare models runs {', '.join(AUDITS)}, not '{request.method}'")
    return METHODS[request.method]


def method_request(request: CompareModelsRequest):
    """Returns the method's own request object; InputError names an unknown method or field."""
    kind = audit(request).request
    known = {f.name for f in fields(kind)}
    unknown = sorted(set(request.request) - known)
    if unknown:
        raise InputError(f"{request.method} has no setting {', '.join(unknown)}")
    return kind(**request.request)


def check(request: CompareModelsRequest, engine: Engine) -> None:
    """Raises InputError before any run exists: two or more distinct generators, a valid audit."""
    specs = [generator_spec(engine, g) for g in request.generators if g and g.strip()]
    if len(set(specs)) < 2:
        raise InputError("pick two or more different generators to compare")
    audit(request).check(method_request(request), engine)


def estimate(request: CompareModelsRequest, until_cap: int | None = None, proposed: int | None = None) -> Estimate:
    """The audit's estimate (its row's, on its own request's defaults) once per model. Axes the
    LLM proposes are proposed once for every model, and with `proposed` (the images the request
    is held to) every model's sets are cut to `proposed` // models (cfsets.fit_proposed)."""
    child = method_request(request)
    models = max(1, len({str(g).strip() for g in request.generators if str(g).strip()}))
    each = audit(request).estimate(child, until_cap=until_cap)
    proposes = isinstance(child, cfsets.SetsRequest) and not child.axes
    once = cfsets.PROPOSE_CALLS if proposes else 0
    images = proposed if proposes and proposed is not None else models * each.images
    return Estimate(images, once + models * (each.llm_calls - once))


@recorded("compare_models", check, estimate)
def run(request: CompareModelsRequest, engine: Engine, run: Run):
    base = method_request(request)
    row = audit(request)
    labels = list(dict.fromkeys(g.strip() for g in request.generators if g and g.strip()))
    specs = [generator_spec(engine, g) for g in labels]
    if request.method != "single_prompt" and not base.axes:
        # one set of counterfactuals for every model, so the comparison is of the generators only
        axes, problems = cfsets.propose_for(engine, base.prompt, base.fill, base.llm_seed, base.max_length_change)
        for problem in problems:
            yield Warning(f"counterfactual {problem}")
        base.axes = yield from cfsets.fit_proposed(engine, audit(request).estimate, base, axes, share=len(specs))
        yield Table("axes", ["axis", "counterfactual"], cfsets.rows_from_axes(axes))
    models = [s.label if backend_choices.free(engine) else short_label(s.label) for s in specs]  # visitors: no host path
    results: dict = {"method": request.method, "generators": labels, "models": models,
                     "request": _plain(base), "runs": [], "results": []}
    for i, (label, spec) in enumerate(zip(labels, specs)):
        yield Progress(i, len(specs), "model", f"model {i + 1} of {len(specs)}: {label}")
        child = engine.with_only_generator(spec, specs, label)
        try:
            for event in row.run(row.request(**_plain(base)), child):
                if isinstance(event, Done):
                    results["runs"].append(event.run_id)
                    results["results"].append(event.results)
                    yield ModelDone(i, label, event.run_id, event.results)
                else:
                    yield _tagged(event, label)
        except GapLensError as exc:
            raise type(exc)(f"{label}: {exc}") from exc
        run.save(results)
    engine.unload_generators(specs)
    pairs = paired_by_seed(request.method, results["results"], labels, base.references if
                           request.method == "single_prompt" else {})
    results["comparison"] = side_by_side(request.method, results["results"], labels, pairs)
    yield Compared(results["comparison"])
    summary = {"method": request.method, "generators": labels, "runs": results["runs"]}
    yield run.finish(results, summary)


def _plain(request) -> dict:
    return {f.name: getattr(request, f.name) for f in fields(request)}


def _tagged(event, label: str):
    """A child run's event with the model named where a person reads it."""
    if isinstance(event, Progress):
        return Progress(event.done, event.total, event.stage, f"{label}: {event.message or event.stage}", event.eta_s)
    if isinstance(event, Warning):
        return Warning(f"{label}: {event.message}")
    return event


# -- side by side ----------------------------------------------------------------------------------

def _score(group: str, metric: str, value, interval=None) -> Score | None:
    if is_missing(value):
        return None
    low, high = (interval or (None, None))[:2] if interval else (None, None)
    return Score(group, metric, float(value), None if low is None else float(low),
                 None if high is None else float(high))


def scores_of(method: str, results: dict) -> list[Score]:
    """Returns the numbers compared across models: Single Prompt's shares and T2I-BiasBench
    metrics per axis (bootstrap intervals), Counterfactuals' MAD per axis and CAS per
    counterfactual, Intersectional's IS matrix cells and distortion."""
    out: list[Score | None] = []
    if method == "single_prompt":
        for axis, m in (results.get("axes") or {}).items():
            for c in m.get("classes", []):
                out.append(_score(axis, f"share: {c}", m.get("representation_parity", {}).get(c, 0.0),
                                  m.get("share_ci", {}).get(c)))
            for key in ("composite_bias_score", "parity_difference", "normalised_entropy", "kl_divergence"):
                out.append(_score(axis, key, m.get(key), (m.get("ci") or {}).get(key)))
        if results.get("diversity"):
            out.append(_score("diversity", "vendi", results["diversity"].get("vendi")))
        if results.get("gap"):
            out.append(_score("gap", "gap_score", results["gap"].get("score")))
    elif method == "counterfactuals":
        for axis in results.get("mad_order") or results.get("mad", {}):
            out.append(_score(axis, "mad", results["mad"][axis], (results.get("mad_ci") or {}).get(axis)))
        for c in results.get("counterfactuals", []):
            out.append(_score(c.get("axis", ""), f"cas: {c.get('prompt', '')}", c.get("cas"), c.get("cas_ci")))
    elif method == "intersectional":
        s = results.get("sensitivity") or {}
        axes = s.get("axes", [])
        kept = {(e["source"], e["target"]) for e in results.get("kept_edges", [])}
        for i, x in enumerate(axes):
            for j, y in enumerate(axes):
                if i == j:
                    continue
                ci = (s["ci_low"][i][j], s["ci_high"][i][j]) if s.get("ci_low") else None
                tag = "" if (x, y) in kept else " (pruned)"
                out.append(_score(f"IS {x} → {y}", "IS" + tag, s["matrix"][i][j], ci))
        out.append(_score("graph", "distortion", results.get("distortion")))
    return [s for s in out if s is not None]


def side_by_side(method: str, results: list[dict], labels: list[str], pairs: dict | None = None) -> dict:
    """Returns {"models": labels, "rows": [{"group", "metric", "values": [per model or None],
    "differences": [model k − model 1 with an approximate 95% interval (runs.difference)]}], "paired"}.
    With `pairs` (paired_by_seed: the models ran on the same seeds), a share's difference is the paired
    one (its interval from the bootstrap over seeds, `unpaired` the interval of independent sets and
    `narrower` how much narrower the paired one is, `p` McNemar's) and "paired" holds every axis' row."""
    per_model = [{(s.group, s.metric.replace(" (pruned)", "")): s for s in scores_of(method, r)} for r in results]
    order = list(dict.fromkeys(k for scores in per_model for k in scores))
    rows = []
    for key in order:
        values = [scores.get(key) for scores in per_model]
        rows.append({"group": key[0], "metric": key[1],
                     "pruned": [bool(v and v.metric.endswith("(pruned)")) for v in values],
                     "values": [v.to_json() if v else None for v in values],
                     "differences": [_paired_share(pairs, k, key) or difference(values[0], v)
                                     for k, v in enumerate(values[1:])]})
    return {"method": method, "models": labels, "rows": rows, "paired": pairs}


# -- paired by seed (issue 44) ---------------------------------------------------------------------

def labels_by_seed(results: dict, axis: str) -> dict[int, str]:
    """{seed: the VQA's answer on `axis`} of a Single Prompt run's results (flagged images have none)."""
    answers = results.get("answers") or {}
    return {int(img["seed"]): answers[img["key"]][axis] for img in results.get("images") or []
            if axis in answers.get(img["key"], {})}


def paired_by_seed(method: str, results: list[dict], labels: list[str], references: dict | None = None,
                   alpha: float = paired.DEFAULT_ALPHA, margin: float = paired.DEFAULT_MARGIN) -> dict | None:
    """The comparison of every model with the first, seed by seed, when their images are Single Prompt
    sets on the same seeds (else None): {"seeds": [first, last], "n", "alpha", "margin", "pairs": [{"model",
    "rows": one paired.paired_difference per axis with classes + q (BH over the pair's axes), verdict}]}.
    The distance is the total variation from the axis' reference (`references`), parity by default."""
    if method != "single_prompt" or len(results) < 2:
        return None
    seeds = [sorted(int(img["seed"]) for img in r.get("images") or []) for r in results]
    if not seeds[0] or any(s != seeds[0] for s in seeds[1:]):
        return None
    first = results[0]
    pairs = []
    for label, other in zip(labels[1:], results[1:]):
        rows = []
        for axis, m in (first.get("axes") or {}).items():
            if axis not in (other.get("axes") or {}) or not m.get("classes"):
                continue
            a, b = labels_by_seed(first, axis), labels_by_seed(other, axis)
            row = paired.paired_difference([a.get(s, "") for s in seeds[0]], [b.get(s, "") for s in seeds[0]],
                                           m["classes"], (references or {}).get(axis) or None, alpha=alpha,
                                           seed=seeds[0][0])
            rows.append({"prompt": first.get("prompt", ""), "axis": axis, **row})
        pairs.append({"model": label, "rows": paired.judge(rows, alpha, margin)})
    return {"seeds": [seeds[0][0], seeds[0][-1]], "n": len(seeds[0]), "alpha": alpha, "margin": margin,
            "pairs": pairs}


def _paired_share(pairs: dict | None, k: int, key: tuple[str, str]) -> dict | None:
    """Model k+1's paired difference from the first on a "share: CLASS" row, or None."""
    if not pairs or not key[1].startswith("share: "):
        return None
    row = next((r for r in pairs["pairs"][k]["rows"] if r["axis"] == key[0]), None)
    change = (row or {}).get("share_change", {}).get(key[1][len("share: "):])
    if not change or change["delta"] is None or None in change["ci"]:
        return None
    low, high = change["ci"]
    return {"value": change["delta"], "low": low, "high": high, "significant": bool(low > 0 or high < 0),
            "paired": True, "unpaired": change["ci_unpaired"], "p": change["p"],
            "narrower": paired.narrower(change["ci"], change["ci_unpaired"])}


def headline(record: dict) -> tuple[str, float | None]:
    """("Single Prompt on sd-turbo vs sdxl-turbo", None) of a stored run."""
    from . import METHODS     # the table lists this module: read at call time

    summary = record.get("summary") or {}
    generators = summary.get("generators") or []
    method = METHODS.get(summary.get("method", ""))
    title = method.title if method else str(summary.get("method", "")).replace("_", " ")
    return f"{title} on " + " vs ".join(map(str, generators)), None
