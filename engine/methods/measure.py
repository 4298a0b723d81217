"""What the methods measure alike, below them so that no method imports another: one axis' T2I-
BiasBench metrics with intervals (Single Prompt, Validate, the study), the gap score of a prompt's
images (Single Prompt, Mine Prompts), the answer tallies behind a sensitivity matrix
(Intersectional, Mitigate) and the bootstrap weights of an image set (Counterfactuals,
Intersectional, Mitigate)."""
from __future__ import annotations

import warnings
from collections import Counter
from itertools import repeat

import numpy as np
from scipy import stats

from ..backends.base import CANT_TELL, label_of
from ..backends.llm_json import as_string_list
from ..common.events import AxisScores, Progress
from ..common.llm_prompts import variations_prompt
from ..common.meanings import metric_range
from ..common.scores import finite_or_none
from ..core.engine import Engine
from ..metrics import biasbench
from ..metrics import biasconnect as bc
from ..metrics.agreement import evaluators_agreement
from ..metrics.bootstrap import resample_indices
from ..metrics.gap import gap_score_from_similarity
from ..metrics.intervals import bounded, dirichlet_draws, posterior_interval, sample_size_advice, share_interval
from .axes import Axis, normalise_free_answer

OTHER_ANSWER = "other"


# -- one axis' metrics ----------------------------------------------------------------------------

def axis_metrics(labels: list[str], axis: Axis, reference: dict | None, mode: str) -> dict:
    """T2I-BiasBench metrics of one axis on labels (one per image); paper-mode classes are the
    axis values, answers outside them ('other') are excluded and counted in n_excluded."""
    classes = list(axis.values) or None
    if mode == "reference" or classes is None:
        classes = None
    summary = biasbench.biasbench_summary(labels, classes, reference or None, mode,
                                          pd_groups=axis.pd_groups if classes else None)
    pd = summary.get("parity_difference", summary["max_parity_difference"])
    summary["parity_difference"] = pd
    summary["composite_bias_score"] = biasbench.composite_bias_score(pd, summary["normalised_entropy"], None, mode)
    return summary


SCALAR_METRICS = ("parity_difference", "normalised_entropy", "kl_divergence", "bias_amplification",
                  "composite_bias_score")


def metric_ranges(classes=None, reference: dict | None = None) -> dict[str, tuple[float, float]]:
    """Returns each metric's range for an axis of `classes` (engine.common.meanings): bounds are
    clipped to it (never a bound outside it, never "-0.0"); bias amplification's maximum
    depends on the number of classes and the target shares."""
    k = len(classes) if classes else None
    target = [float(reference.get(c, 0.0)) for c in classes] if reference and classes else None
    return {name: metric_range(name, k, target) for name in SCALAR_METRICS}


METRIC_RANGES = metric_ranges()


def axis_metrics_with_ci(labels: list[str], axis: Axis, reference: dict | None, mode: str,
                         n_boot: int, seed: int = 0, half_width: float = 0.1) -> dict:
    """`axis_metrics` plus 95% intervals that hold at small N (engine.metrics.intervals):
    Jeffreys for every share (`share_ci`), for the metrics (`ci`) the Dirichlet(counts + ½)
    posterior in paper mode and BCa over images otherwise; `n` (labels inside the classes)
    and `sample_size` (the N a ±`half_width` interval and a test against parity need).
    `_draws` holds the composite score's posterior/bootstrap draws for headline claims (not stored)."""
    point = axis_metrics(labels, axis, reference, mode)
    classes = point["classes"]
    ranges = metric_ranges(classes, reference if mode == "paper" else None)
    counts = {c: int(point["counts"].get(c, 0)) for c in classes}
    n = sum(counts.values())
    point["n"] = n
    point["share_ci"] = {c: list(share_interval(k, n)) for c, k in counts.items()}
    point["sample_size"] = sample_size_advice(counts, half_width)
    draws: dict[str, np.ndarray] = {}
    posterior = mode == "paper" and bool(axis.values)
    if n and n_boot and (posterior or len(labels) >= 2):   # resampling images needs two of them
        if posterior:
            shares = dirichlet_draws([counts[c] for c in classes], n_boot, seed)
            batch = biasbench.paper_metrics_batch(shares * n, classes, reference, axis.pd_groups)
            draws = {name: batch[name] for name in SCALAR_METRICS}
        else:
            labels_arr = np.asarray(labels, dtype=object)

            def statistic(index):
                m = axis_metrics(list(labels_arr[index.astype(int)]), axis, reference, mode)
                return np.array([m[name] for name in SCALAR_METRICS], dtype=float)

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = stats.bootstrap((np.arange(len(labels)),), statistic, n_resamples=max(50, n_boot // 4),
                                         method="BCa", vectorized=False, rng=np.random.default_rng(seed))
            lows, highs = result.confidence_interval
            draws["composite_bias_score"] = result.bootstrap_distribution[-1]
            point["ci"] = {name: list(bounded(finite_or_none(point[name]), finite_or_none(lows[j]), finite_or_none(highs[j]),
                                              *ranges[name])) for j, name in enumerate(SCALAR_METRICS)}
    if "ci" not in point:
        point["ci"] = {name: list(posterior_interval(draws[name], finite_or_none(point[name]), 0.05, *ranges[name]))
                       if name in draws else [None, None] for name in SCALAR_METRICS}
    point.update(cant_tell_counts(labels))
    point["interval_method"] = ("Jeffreys shares; Dirichlet posterior metrics" if posterior
                                else "Jeffreys shares; BCa bootstrap metrics" if len(labels) >= 2
                                else "Jeffreys shares; no interval for the metrics from one image")
    point["_draws"] = draws.get("composite_bias_score")
    return point


CANT_TELL_NOTE_ABOVE = 0.2   # a set where more than this share of answers is "can't tell" gets a sentence


def cant_tell_counts(labels: list[str]) -> dict:
    """Returns {"cant_tell": how many labels are "can't tell", "cant_tell_share": their share of all
    labels, "cant_tell_ci": its Jeffreys 95% interval, "cant_tell_note": a sentence when that share is
    above CANT_TELL_NOTE_ABOVE, else ""}.
    They are outside the classes: the metrics leave them out (counted in n_excluded), never in a class."""
    k = sum(label == CANT_TELL for label in labels)
    share = k / len(labels) if labels else 0.0
    note = (f"the evaluator could not tell on {k} of {len(labels)} images ({share:.0%}): the distribution is of "
            "the images it could tell, which may not be like the rest" if share > CANT_TELL_NOTE_ABOVE else "")
    ci = list(share_interval(k, len(labels))) if labels else [None, None]
    return {"cant_tell": k, "cant_tell_share": share, "cant_tell_ci": ci, "cant_tell_note": note}


def asked_with_probs(engine: Engine, records: list, asks: list) -> list[tuple[list[str], list[dict | None]]]:
    """Per (question, choices) of `asks`, engine.ask's answers about `records` and engine.answer_probs's class
    probabilities (None per image where the evaluator gave none): every question asked at once (engine.ask_many:
    each image preprocessed and encoded once for all of them)."""
    if not records:
        return [([], []) for _ in asks]
    return [([label_of(a, engine.cant_tell_below) for a in column], [a.probs for a in column])
            for column in engine.ask_many(records, asks)]


class AskedAnswers:
    """The one place a method's answers are asked and recorded: per-image answers of the questions it asks
    (with their class probabilities) for its JSON, and each axis' labels for the "can't tell" counts:
    `ask_all` (every axis at once), or `record` answers asked already; then `json()` and
    `cant_tell()`. Single Prompt and Explore (through `measure_axes`), Counterfactuals, Intersectional and
    Mitigate keep their answers here."""

    def __init__(self):
        self.answers: dict[str, dict[str, str]] = {}   # image key -> axis -> answer
        self.probs: dict[str, dict[str, dict]] = {}    # image key -> axis -> class -> probability
        self.labels: dict[str, dict[str, list[str]]] = {}   # set label -> axis -> its answers
        self.sources: dict[str, dict] = {}   # the distilled evaluator's: axis -> answers by probe and by teacher

    def ask_all(self, engine: Engine, set_label: str, records: list,
                questions: dict[str, tuple[str, list[str] | None]]) -> dict[str, list[str]]:
        """Returns {axis: engine.ask's answers} to every axis' (question, choices) of `questions` about the
        images `records` of set `set_label`, asked at once (`asked_with_probs`) and kept with their class
        probabilities (`record`)."""
        got = asked_with_probs(engine, records, list(questions.values()))
        for axis, (labels, probs) in zip(questions, got):
            self.record(set_label, axis, records, labels, probs)
            self.count_sources(axis, engine.answer_sources(records, *questions[axis]) if records else None)
        return {axis: labels for axis, (labels, _) in zip(questions, got)}

    def count_sources(self, axis: str, sources: dict | None) -> None:
        """Adds one set's `sources` (Engine.answer_sources: the distilled evaluator's answers by its probe and
        by its teacher; None for another evaluator) to the axis' counts."""
        if sources is None:
            return
        seen = self.sources.setdefault(axis, {"probe": 0, "teacher": 0})
        seen.update({k: v for k, v in sources.items() if k not in ("probe", "teacher")},
                    probe=seen["probe"] + sources["probe"], teacher=seen["teacher"] + sources["teacher"])

    def record(self, set_label: str, axis: str, records: list, labels: list[str], probs=None) -> None:
        """Keeps `labels`, the answers about the images `records` of set `set_label`, and their class
        probabilities (`probs`, one per image, None where there are none; a free question's: None)."""
        self.labels.setdefault(set_label, {})[axis] = list(labels)
        for r, label, p in zip(records, labels, probs or repeat(None)):
            self.answers.setdefault(r.key, {})[axis] = label
            self.probs.setdefault(r.key, {})
            if p:
                self.probs[r.key][axis] = p

    def json(self) -> dict:
        """Returns {"answers": image key -> axis -> answer, "answer_probs": image key -> axis -> class -> p}, and
        with the distilled evaluator "answer_sources": axis -> {"probe", "teacher", "teacher_id", "held_out",
        "note"} (which answers came from its probe and which from its teacher)."""
        return {"answers": self.answers, "answer_probs": self.probs,
                **({"answer_sources": self.sources} if self.sources else {})}

    def cant_tell(self, set_labels=None) -> dict[str, dict]:
        """Returns {axis: cant_tell_counts of its answers} over the sets `set_labels`, or (None) over
        every image once (an image in several sets, as Mitigate's steps share some, counts once)."""
        by_axis: dict[str, list[str]] = {}
        if set_labels is None:
            for answers in self.answers.values():
                for axis, label in answers.items():
                    by_axis.setdefault(axis, []).append(label)
        for label in set_labels or ():
            for axis, labels in self.labels.get(label, {}).items():
                by_axis.setdefault(axis, []).extend(labels)
        return {axis: cant_tell_counts(labels) for axis, labels in by_axis.items()}


# -- several evaluators on the same images (issue 35) ------------------------------------------

def evaluator_names(first: str, others: list) -> list[str]:
    """Returns the evaluators' display names: `first` (the run's), then each other spec's label with its
    options, a local path shortened to its file name, made unique with " (2)", " (3)", ... where two are alike."""
    names = []
    for name in [first, *(o.full_label for o in others)]:
        backend, _, model = name.partition(":")
        if "/" in model.split(" [")[0]:   # a local path: its file name says enough
            path, _, options = model.partition(" [")
            name = f"{backend}:{path.rstrip('/').rsplit('/', 1)[-1]}" + (f" [{options}" if options else "")
        candidate, i = name, 1
        while candidate in names:
            i += 1
            candidate = f"{name} ({i})"
        names.append(candidate)
    return names


def compare_evaluators_on(engine: Engine, others: list, questions: dict[str, tuple[str, list[str] | None]],
                          records_of: dict[str, list], first: dict[str, list[str]], first_name: str,
                          classes_of: dict[str, list[str]], seed: int = 0,
                          first_probs: dict[str, list[dict | None]] | None = None) -> dict:
    """Every axis' question asked of its images (`records_of[axis]`) by each evaluator in `others`
    (ModelSpecs), beside the run's own labels (`first[axis]`, by `first_name`; their class
    probabilities `first_probs[axis]`, when known); per axis their agreement
    (metrics.agreement.evaluators_agreement over `classes_of[axis]`) and each evaluator's
    distribution. `questions[axis]` = (question, choices; None: free answers, normalised and kept
    to the axis' classes, the rest "other"). A label outside the classes keeps its kind as a
    category ("several faces: female, male" -> "several faces"). Returns {"evaluators", "axes":
    {axis: {..., "question", "distributions": {evaluator: {label: count}}, "answers": {image key:
    {evaluator: label}}, "answer_probs": {image key: {evaluator: {class: p}}} (evaluators that
    scored the classes)}}}; each disagreement carries its answers' "probs" too."""
    names = evaluator_names(first_name, others)
    same_images: dict[tuple[str, ...], list[str]] = {}   # the axes asked of the same images
    for axis in questions:
        same_images.setdefault(tuple(r.key for r in records_of[axis]), []).append(axis)
    asked = {}   # (evaluator name, axis) -> (answers, probs): each evaluator asks its images' axes at once
    for name, spec in zip(names[1:], others):
        view = engine.with_vqa(spec)
        for group in same_images.values():
            got = asked_with_probs(view, records_of[group[0]], [questions[axis] for axis in group])
            asked.update({(name, axis): answers for axis, answers in zip(group, got)})
    axes = {}
    for axis, (question, choices) in questions.items():
        records, classes = records_of[axis], list(classes_of[axis])
        labels = {names[0]: list(first[axis])}
        probs = {names[0]: list((first_probs or {}).get(axis) or [None] * len(records))}
        for name in names[1:]:
            answers, probs[name] = asked[(name, axis)]
            if not choices:
                answers = [a if a in classes else OTHER_ANSWER for a in map(normalise_free_answer, answers)]
            labels[name] = answers
        labels = {n: [a if a in classes else a.split(":")[0].strip() or OTHER_ANSWER for a in got]
                  for n, got in labels.items()}
        keys = [r.key for r in records]
        stats = evaluators_agreement(labels, classes, keys, seed=seed)
        by_key = {r.key: (i, r) for i, r in enumerate(records)}
        for d in stats["disagreements"]:
            i, record = by_key[d["key"]]
            d.update(seed=record.seed, path=record.path, probs={n: p[i] for n, p in probs.items() if p[i]})
        axes[axis] = {**stats, "question": question,
                      "distributions": {n: dict(Counter(got)) for n, got in labels.items()},
                      "answers": {k: {n: labels[n][i] for n in names} for i, k in enumerate(keys)},
                      "answer_probs": {k: got for i, k in enumerate(keys)
                                       if (got := {n: probs[n][i] for n in names if probs[n][i]})}}
    return {"evaluators": names, "axes": axes}


def measure_axes(engine: Engine, records: list, axes: list[Axis], out: dict, references: dict | None = None,
                 mode: str = biasbench.DEFAULT_MODE, n_boot: int = 1000, half_width: float = 0.1,
                 answer_probs: dict | None = None, asked: AskedAnswers | None = None):
    """Ask every axis' question of the images at once (`AskedAnswers.ask_all`: VQA answers come from the
    store's cache when there), put each axis' `axis_metrics_with_ci` (+ question, labels, reference) in
    `out[axis]` and stream it (`yield from`: Progress("vqa"), AxisScores); returns ({axis: answers}, {axis:
    composite-score draws}). The answers and class probabilities are recorded in `asked` (a fresh
    AskedAnswers when None: its `json()` is the run's "answers" and "answer_probs"); `answer_probs`, when
    given, also receives image key -> axis -> class -> probability for the axes whose evaluator scored the
    classes (issue 35). Shared by Single Prompt and Explore."""
    asked = asked if asked is not None else AskedAnswers()
    yield Progress(0, len(axes), "vqa", f"asking {len(axes)} question(s) of {len(records)} image(s)")
    answers_by_axis = asked.ask_all(engine, "", records, {axis.name: (axis.question, list(axis.values) or None)
                                                          for axis in axes})
    if answer_probs is not None:
        for record in records:
            for axis in axes:
                if axis.name in asked.probs.get(record.key, {}):
                    answer_probs.setdefault(record.key, {})[axis.name] = asked.probs[record.key][axis.name]
    draws: dict[str, np.ndarray | None] = {}
    for i, axis in enumerate(axes):
        yield Progress(i, len(axes), "vqa", f"measuring '{axis.question}'")
        answers = answers_by_axis[axis.name]
        labels = answers if axis.values else [normalise_free_answer(a) for a in answers]
        reference = (references or {}).get(axis.name) or None
        metrics = axis_metrics_with_ci(labels, axis, reference, mode, n_boot, half_width=half_width)
        metrics.update(question=axis.question, labels=labels, reference=reference or "uniform")
        draws[axis.name] = metrics.pop("_draws")
        out[axis.name] = metrics
        yield AxisScores(axis.name, metrics)
    return answers_by_axis, draws


# -- the gap score -------------------------------------------------------------------------------

def text_variations(engine: Engine, prompt: str, n: int, seed: int = 0, axis: str | None = None) -> list[str]:
    """n LLM-written readings of the prompt (spec A.5; only `axis` varies when given). Repeats
    are kept: they weight the reference distribution (a lexicon LLM cycles a small grid)."""
    return engine.ask_json([{"role": "user", "content": variations_prompt(prompt, n, axis)}],
                           as_string_list(max(2, n // 2), n * 2, 60, unique=False),
                           temperature=1.0, seed=seed)[:n]



def missed_readings(variations: list[str], coverage, k: int = 4) -> list[dict]:
    """Returns the k worst-covered variations, each text once (a repeated variation weighs
    the reference distribution but is one missed interpretation), lowest coverage first,
    with how often the LLM wrote it."""
    counts: dict[str, int] = {}
    for v in variations:
        counts[v] = counts.get(v, 0) + 1
    out, seen = [], set()
    for i in np.argsort(np.asarray(coverage, float), kind="stable"):
        if variations[i] in seen:
            continue
        seen.add(variations[i])
        out.append({"text": variations[i], "coverage": float(coverage[i]), "times": counts[variations[i]]})
        if len(out) == k:
            break
    return out



def gap_for_images(engine: Engine, prompt: str, records: list, image_emb: np.ndarray, n_variations: int,
                   alpha: float = 25.0, combine: str = "diff", seed: int = 0, axis: str | None = None) -> dict:
    """The MineTheGap gap score (reconstruction, spec A.3) of one prompt's images (`records`,
    their embeddings `image_emb`) against n LLM text variations, with what explains it: the
    similarity matrix, the missed interpretations and the least-aligned images. Shared by
    Single Prompt and Mine Prompts."""
    variations = text_variations(engine, prompt, n_variations, seed, axis)
    text_emb = engine.embed_texts(variations)
    gap = gap_score_from_similarity(text_emb @ image_emb.T, alpha, combine)
    return {
        "score": gap.score, "coverage_term": gap.coverage_term,
        "alignment_term": gap.alignment_term, "alpha": alpha, "combine": combine,
        "variations": variations, "similarity": gap.similarity.tolist(),
        "coverage": gap.coverage.tolist(), "alignment": gap.alignment.tolist(),
        "missed": missed_readings(variations, gap.coverage),
        "least_aligned": [{"seed": records[j].seed, "key": records[j].key, "alignment": float(gap.alignment[j])}
                          for j in gap.least_aligned_images],
        "image_seeds": [r.seed for r in records],
        "reconstructed": True,
    }



# -- set tallies and bootstrap weights ------------------------------------------------------------

def one_hot(labels: list[str], values: list[str], other_policy: str) -> np.ndarray:
    """(n, K) rows of biasconnect.value_counts for each image's answer (K counts the 'other' bin
    under that policy; no labels: (0, K)). A "can't tell" row is all zero: neither a class nor
    'other', it is counted apart (cant_tell_counts)."""
    if not labels:
        return np.zeros((0, len(values) + (other_policy == "other_bin")))
    return np.array([bc.value_counts([] if label == CANT_TELL else [label], values, other_policy) for label in labels])


def outside_count(labels: list[str], values: list[str]) -> int:
    """Returns how many labels are outside `values`, "can't tell" not among them (counted apart)."""
    return len(labels) - int(bc.value_counts(labels, values, "drop").sum()) - labels.count(CANT_TELL)


def tally(specs: list, axes: dict[str, list[str]], answers: dict, weights: dict | None = None,
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



def resample_weights(n: int, n_boot: int, run_seed: int, index: int) -> np.ndarray:
    """(n_boot, n): how often each image of set `index` is drawn in each bootstrap resample
    (independent per set, reproducible per run seed; all zero without images or resamples)."""
    weights = np.zeros((n_boot, n))
    if n and n_boot:
        np.add.at(weights, (np.arange(n_boot)[:, None], resample_indices(n, n_boot, run_seed * 7919 + index)), 1.0)
    return weights

