"""Check the evaluator: spot-check labels from a person (or a CSV file), the evaluator's
agreement with them, the distribution corrected for its confusion, and two evaluators
compared on the same images (issue 16).

Labels live in the store's `labels` table with the run they were given in (who, when); a
run's validation uses every label of its images, so a later run over the same cached images
reuses an earlier spot-check. "can't tell" answers are kept but left out of the numbers.

Statistics: engine.metrics.agreement (accuracy, Cohen's κ, confusion, recall, correction)
and engine.metrics.intervals (Jeffreys, BCa, posterior intervals).
"""
from __future__ import annotations

import csv
import io
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..backends.base import CANT_TELL, ModelSpec   # CANT_TELL: one spelling for a person and an evaluator
from ..common.errors import InputError
from ..common.events import AxisScores, Done, Progress
from ..core.engine import Engine
from ..core.evaluators import check_comparable
from ..hosting import backend_choices
from ..hosting.limits import Estimate
from ..metrics import biasbench
from ..metrics.agreement import agreement, corrected_distribution
from ..metrics.intervals import posterior_interval, tidy
from ..store.store import Store
from .axes import axis_for, normalise_free_answer
from .measure import METRIC_RANGES, compare_evaluators_on, metric_ranges

OTHER = "other"
MAX_FREE_CLASSES = 8          # a free-text axis keeps its 8 commonest answers; the rest are 'other'


@dataclass
class CheckAxis:
    """One axis of a run as the evaluator labelled it: the question, the classes a person picks
    from, and the evaluator's label of each image (`keys[i]` → `predicted[i]`), with the set
    (`groups[i]`, e.g. a counterfactual prompt) each image belongs to."""

    axis: str
    question: str
    classes: list[str]
    keys: list[str]
    predicted: list[str]
    groups: list[str]
    pd_groups: tuple | None = None
    reference: dict | None = None      # target shares of the metrics (None = uniform)


def checkable_axes(run: dict) -> dict[str, CheckAxis]:
    """The axes of a stored run whose evaluator labels a person can check: Single Prompt's axes
    and Counterfactuals' axis questions (free-form answers grouped into their commonest
    classes), over the images the run holds (`run["images"]`: a key its results name but it does
    not hold, e.g. in an imported archive, is never read). Other methods: {}."""
    results = run.get("results") or {}
    held = {link["image_key"] for link in run.get("images") or []}
    out: dict[str, CheckAxis] = {}
    if run.get("method") == "single_prompt":
        # the measured images in order (flagged ones are left out of every metric); from the image
        # list, whose keys an import rewrites, rather than the keys of `answers`
        measured = [im["key"] for im in results.get("images") or [] if not im.get("nsfw")]
        for name, m in (results.get("axes") or {}).items():
            labels = list(m.get("labels") or [])
            if len(labels) != len(measured) or not labels:
                continue
            kept = [(k, label) for k, label in zip(measured, labels) if k in held]
            if not kept:
                continue
            keys, labels = [k for k, _ in kept], [label for _, label in kept]
            axis = axis_for(name)
            classes = list(m.get("classes") or axis.values)
            reference = m.get("reference") if isinstance(m.get("reference"), dict) else None
            out[name] = CheckAxis(name, m.get("question") or axis.question, classes, keys, labels,
                                  [""] * len(keys), axis.pd_groups if list(axis.values) == classes else None,
                                  reference)
    elif run.get("method") == "counterfactuals":
        for name, question in (results.get("questions") or {}).items():
            keys, labels, groups = [], [], []
            for label, s in (results.get("sets") or {}).items():
                for image in s.get("images") or []:
                    answer = (image.get("answers") or {}).get(name)
                    if answer is not None and image.get("key") in held and image.get("key") not in keys:
                        keys.append(image["key"])
                        labels.append(normalise_free_answer(answer))
                        groups.append(label)
            if not keys:
                continue
            common = [c for c, _ in Counter(labels).most_common(MAX_FREE_CLASSES)]
            labels = [lab if lab in common else OTHER for lab in labels]
            classes = common + ([OTHER] if OTHER in labels and OTHER not in common else [])
            out[name] = CheckAxis(name, question, classes, keys, labels, groups)
    return out


def spot_check_sample(item: CheckAxis, size: int, seed: int = 0, done: set[str] = frozenset()) -> list[str]:
    """Up to `size` image keys of `item` not in `done`, stratified by the evaluator's label:
    each label gets its proportional share of the sample (largest remainders; at least one
    image while it has any), drawn at random within the stratum; the order is shuffled so the
    strata are interleaved."""
    rng = np.random.default_rng(seed)
    strata: dict[str, list[str]] = {}
    for key, label in zip(item.keys, item.predicted):
        if key not in done:
            strata.setdefault(label, []).append(key)
    total = sum(len(v) for v in strata.values())
    size = min(int(size), total)
    if size <= 0:
        return []
    names = sorted(strata)
    exact = {c: size * len(strata[c]) / total for c in names}
    take = {c: min(len(strata[c]), max(1, math.floor(exact[c]))) for c in names}
    while sum(take.values()) > size:  # the at-least-one rule overshot: trim the largest
        c = max(names, key=lambda c: (take[c], c))
        take[c] -= 1
    for c in sorted(names, key=lambda c: -(exact[c] - math.floor(exact[c]))):
        if sum(take.values()) >= size:
            break
        if take[c] < len(strata[c]):
            take[c] += 1
    picked = [k for c in names for k in rng.permutation(strata[c])[:take[c]].tolist()]
    return [picked[i] for i in rng.permutation(len(picked))]


def latest_labels(store: Store, keys: list[str]) -> dict[tuple[str, str], dict]:
    """{(image_key, axis): the most recent label row} over every run (later answers win)."""
    out: dict[tuple[str, str], dict] = {}
    for row in store.label_rows(image_keys=keys):
        out[(row["image_key"], row["axis"])] = row
    return out


def validate_run(store: Store, run_id: str, seed: int = 0) -> dict:
    """Per checkable axis of the run: accuracy and Cohen's κ with intervals, the confusion matrix,
    per-class recall, and the raw and corrected distributions (overall, and per set for a
    Counterfactuals run) with their intervals, plus the metrics on the corrected shares.
    Returns {"run_id", "axes": {axis: {...}}}; an axis without labels has only its counts."""
    run = _run(store, run_id)
    items = checkable_axes(run)
    labels = latest_labels(store, sorted({k for it in items.values() for k in it.keys}))
    axes = {}
    for name, item in items.items():
        truth, pred, cant_tell = [], [], 0
        for key, p in zip(item.keys, item.predicted):
            row = labels.get((key, name))
            if row is None:
                continue
            if row["label"] == CANT_TELL:
                cant_tell += 1
                continue
            truth.append(row["label"])
            pred.append(p)
        out = {"question": item.question, "classes": item.classes, "n_images": len(item.keys),
               "n_checked": len(truth), "cant_tell": cant_tell,
               "outside_classes": sum(t not in item.classes for t in truth)}
        counts = [sum(p == c for p in item.predicted) for c in item.classes]
        if truth:
            out.update(agreement(truth, pred, item.classes, seed=seed))
            corrected = corrected_distribution(counts, truth, pred, item.classes, seed=seed)
            draws = corrected.pop("_draws")
            out.update(corrected)
            out["corrected_metrics"] = corrected_metrics(corrected["raw"], corrected["corrected"], draws,
                                                         item.classes, item.pd_groups, sum(counts), item.reference)
            groups = sorted(set(item.groups) - {""})
            if groups:
                out["by_set"] = {}
                for g in groups:
                    g_counts = [sum(p == c for p, gg in zip(item.predicted, item.groups) if gg == g)
                                for c in item.classes]
                    by = corrected_distribution(counts, truth, pred, item.classes, seed=seed, target_counts=g_counts)
                    by.pop("_draws")
                    out["by_set"][g] = {k: by[k] for k in ("raw", "raw_ci", "corrected", "corrected_ci")}
        else:
            n = sum(counts)
            out["raw"] = {c: tidy(k / n, 0, 1) if n else None for c, k in zip(item.classes, counts)}
            out.update(n_checked=0, kappa=None, corrected=None, corrected_ci=None)  # nothing checked yet
        axes[name] = out
    return {"run_id": run_id, "method": run.get("method"), "axes": axes}


def corrected_metrics(raw: dict, corrected: dict, draws: np.ndarray, classes: list[str], pd_groups,
                      n: int, reference: dict | None = None) -> dict:
    """T2I-BiasBench paper-mode metrics (PD, normalised entropy, KL, BA, composite) on the raw and
    on the corrected shares, the corrected ones with posterior intervals from the correction's
    draws: {"raw": {...}, "corrected": {...}, "corrected_ci": {...}}."""
    def batch(shares: np.ndarray) -> dict:
        return biasbench.paper_metrics_batch(np.atleast_2d(shares) * max(n, 1), classes, reference, pd_groups)

    raw_b = batch(np.array([raw[c] for c in classes]))
    cor_b = batch(np.array([corrected[c] for c in classes]))
    all_b = batch(draws)
    out = {"raw": {}, "corrected": {}, "corrected_ci": {}}
    for name, (lo, hi) in metric_ranges(classes, reference).items():
        out["raw"][name] = tidy(raw_b[name][0], lo, hi)
        out["corrected"][name] = tidy(cor_b[name][0], lo, hi)
        out["corrected_ci"][name] = list(posterior_interval(all_b[name], float(cor_b[name][0]), 0.05, lo, hi))
    return out


def corrected_axes(axes: dict[str, dict], validation: dict) -> dict[str, dict]:
    """Single Prompt's axis results with, on every axis the spot-check covers, the corrected
    shares, share intervals and metrics in place of the raw ones (`"distribution": "corrected"`;
    counts stay the evaluator's). What the metrics show when the user picks "corrected"."""
    out = {}
    for name, m in axes.items():
        v = (validation.get("axes") or {}).get(name) or {}
        if not v.get("n_checked") or "corrected_metrics" not in v:
            out[name] = m
            continue
        c = {**m, "ci": dict(m.get("ci") or {}), "distribution": "corrected"}
        c["representation_parity"] = {k: v["corrected"].get(k, 0.0) for k in m["classes"]}
        c["share_ci"] = {k: v["corrected_ci"].get(k, [None, None]) for k in m["classes"]}
        for metric in METRIC_RANGES:
            c[metric] = v["corrected_metrics"]["corrected"][metric]
            c["ci"][metric] = v["corrected_metrics"]["corrected_ci"][metric]
        out[name] = c
    return out


def read_labels_csv(text: str, source: str = "the labels file") -> list[dict]:
    """Rows {image_key, axis, label} of a CSV with those columns (a header row is required)."""
    reader = csv.DictReader(io.StringIO(text))
    need = {"image_key", "axis", "label"}
    if not reader.fieldnames or not need <= {f.strip() for f in reader.fieldnames}:
        raise InputError(f"{source} must have the columns image_key,axis,label (found: "
                         f"{', '.join(reader.fieldnames or []) or 'no header'})")
    rows = []
    for i, row in enumerate(reader, start=2):
        row = {k.strip(): (v or "").strip() for k, v in row.items() if k}
        if not row["image_key"] or not row["axis"] or not row["label"]:
            raise InputError(f"{source}, line {i}: image_key, axis and label must all be filled in")
        rows.append({"image_key": row["image_key"], "axis": row["axis"].lower(), "label": row["label"].lower()})
    if not rows:
        raise InputError(f"{source} has no labels")
    return rows


def add_labels(store: Store, run_id: str, rows: list[dict], who: str) -> int:
    """Check labels against the run (known image keys and axes; a label must be one of the
    axis' classes or "can't tell") and store them. Returns how many were stored."""
    items = checkable_axes(_run(store, run_id))
    if not items:
        raise InputError(f"run {run_id} has no evaluator labels to check (a Single Prompt or "
                         "Counterfactuals run has)")
    for row in rows:
        item = items.get(row["axis"])
        if item is None:
            raise InputError(f"axis '{row['axis']}' is not in run {run_id}; its axes are: {', '.join(items)}")
        if row["image_key"] not in item.keys:
            raise InputError(f"image '{row['image_key'][:16]}' is not one of run {run_id}'s images on '{row['axis']}'")
        if row["label"] not in item.classes and row["label"] not in (CANT_TELL, OTHER):
            raise InputError(f"label '{row['label']}' for '{row['axis']}' is not one of: "
                             f"{', '.join(item.classes)}, {CANT_TELL}")
    return store.put_labels([(run_id, r["image_key"], r["axis"], r["label"], who) for r in rows])


def compare_evaluators(engine: Engine, run_id: str, other: str | ModelSpec | list, seed: int = 0) -> dict:
    """The run's images scored by one or more other VQA evaluators (`other`: 'backend:model', a
    ModelSpec, or a list of them) on each checkable axis' question and classes, and their agreement
    with the run's evaluator (measure.compare_evaluators_on): per axis the share of images they
    agree on, Cohen's κ with its BCa interval and the agreement matrix (rows: the run's evaluator)
    for two evaluators, Fleiss' κ for more, the distribution where they agree, the images where
    they disagree with every answer, and each evaluator's distribution ("first", "second" for two).
    An axis one of them cannot answer (the faces evaluator answers only gender and age) is left out
    before any is asked ("left_out": {axis: why}); none left: InputError.
    Returns {"run_id", "first", "second", "second_id", "evaluators", "axes": {axis: {...}}, "left_out"}."""
    run = _run(engine.store, run_id)
    others = [backend_choices.resolve(engine, "vqa", o)   # a visitor of a public GapLens: ones the host offers
              for o in (other if isinstance(other, list) else [other])]
    items = checkable_axes(run)
    if not items:
        raise InputError(f"run {run_id} has no evaluator labels to compare")
    left_out = check_comparable(others, {name: item.question for name, item in items.items()})
    items = {name: item for name, item in items.items() if name not in left_out}
    stored_probs = (run.get("results") or {}).get("answer_probs") or {}
    records_by_key = engine.store.get_images(sorted({k for it in items.values() for k in it.keys}))
    questions, records_of, first, classes_of = {}, {}, {}, {}
    for name, item in items.items():
        present = [i for i, k in enumerate(item.keys) if k in records_by_key]
        records_of[name] = [records_by_key[item.keys[i]] for i in present]
        choices = [c for c in item.classes if c != OTHER] if run.get("method") == "single_prompt" else None
        questions[name] = (item.question, choices or None)
        first[name] = [item.predicted[i] for i in present]
        classes_of[name] = list(item.classes)
    first_label = str((run.get("models") or {}).get("vqa", "the run's evaluator"))
    first_probs = {name: [(stored_probs.get(r.key) or {}).get(name) for r in records_of[name]] for name in items}
    out = compare_evaluators_on(engine, others, questions, records_of, first, first_label, classes_of, seed,
                                first_probs=first_probs)
    for a in out["axes"].values():
        dists = list(a["distributions"].values())
        a["first"], a["second"] = dists[0], dists[1]
    return {"run_id": run_id, "first": out["evaluators"][0], "second": ", ".join(out["evaluators"][1:]),
            "second_id": engine.with_vqa(others[0]).model_id("vqa"), **out, "left_out": left_out}


def _run(store: Store, run_id: str) -> dict:
    return store.require_run(run_id)


# -- as a command ----------------------------------------------------------------------------------
@dataclass
class ValidateRequest:
    run: str                           # the run id (the command's RUN)
    labels: str | None = field(default=None, metadata={
        "metavar": "FILE.csv", "help": "CSV with columns image_key,axis,label"})
    who: str | None = field(default=None, metadata={
        "help": "who labelled (stored with the labels; default file:NAME)"})
    compare_vqa: str | None = field(default=None, metadata={
        "metavar": "BACKEND:MODEL", "help": "score the same images with a second evaluator and show their agreement "
                                            "matrix"})
    seed: int = field(default=0, metadata={"help": "seed of the intervals' bootstrap"})


def check(request: ValidateRequest, engine: Engine) -> None:
    """InputError when the store holds no run `request.run` the current user may see."""
    _run(engine.store, request.run)


def estimate(request: ValidateRequest, until_cap: int | None = None, proposed: int | None = None) -> Estimate:
    """Nothing: validating generates no image and asks no LLM (it reads a stored run's images)."""
    return Estimate(0)


def run(request: ValidateRequest, engine: Engine):
    """`python -m engine validate RUN --labels FILE.csv [--compare-vqa B:M]`: store the file's
    labels with the run, then yield the validation (and the comparison) as one Done event."""
    check(request, engine)
    if request.labels:
        path = Path(request.labels)
        try:
            text = path.read_text(encoding="utf-8-sig")
        except (OSError, UnicodeDecodeError) as exc:
            raise InputError(f"cannot read {path}: {exc}") from None
        stored = add_labels(engine.store, request.run, read_labels_csv(text, str(path)),
                            request.who or f"file:{path.name}")
        yield Progress(1, 1, "labels", f"stored {stored} label(s) with run {request.run}")
    results = validate_run(engine.store, request.run, request.seed)
    if not results["axes"]:
        raise InputError(f"run {request.run} ({results['method']}) has no evaluator labels to check; Single Prompt "
                         "and Counterfactuals runs have")
    for name, out in results["axes"].items():
        yield AxisScores(name, out)
    if request.compare_vqa:
        results["comparison"] = compare_evaluators(engine, request.run, request.compare_vqa, request.seed)
    summary = {name: _summary_line(out) for name, out in results["axes"].items()}
    yield Done(results["run_id"], results, summary)


def _summary_line(out: dict) -> str:
    if not out.get("n_checked"):
        return f"no labels yet ({out['n_images']} images)"
    k, (lo, hi) = out["kappa"], out["kappa_ci"]
    pairs = ", ".join(f"{c} {out['raw'][c]:.2f} -> {out['corrected'][c]:.2f} "
                      f"[{out['corrected_ci'][c][0]:.2f}, {out['corrected_ci'][c][1]:.2f}]" for c in out["classes"])
    kappa = ("kappa undefined (every label in one class)" if k is None
             else f"kappa {k:.2f}" + (f" [{lo:.2f}, {hi:.2f}]" if lo is not None else ""))
    return f"{out['n_checked']} checked, {kappa}; raw -> corrected: {pairs}"
