"""Counterfactuals (TIBET, thesis Ch. 5; docs/spec/thesis-tibet-biasconnect-intermit.md §2): bias axes and
counterfactual prompts from the LLM (or a preset, or the user's table), an image set per prompt and per counterfactual,
VQA concept histograms, CAS per counterfactual, normalised MAD per axis, with bootstrap CIs.

Choices the spec leaves open (§8 items 3-6), each a request field:
- `caption` (item 3): each image's caption joins its VQA answers, as the thesis says
  (the released code leaves it out); default on.
- concepts (item 4): unigram words (tibet.concept_words: punctuation deleted except inner
  hyphens), English stop words, "image" and the answers yes/no/none dropped, concepts below
  `min_frequency` (0.01 per image, as the released code) dropped; `synonyms` merges
  WordNet synonyms (plus male->man, female->woman) with one grouping per compared pair.
- `renormalise` (item 5): HistIoU on histograms scaled to sum 1 (released code); default on.
- `sum_normalise` (item 6): CAS of an axis divided by its sum before MAD, which makes the
  normalised MAD lie in [0, 1] (released code); default on.
`mode` (issue 23): "paper" (default) computes the above; "reference" computes CAS and MAD
as the authors' released code does, number for number (engine/metrics/tibet_reference.py:
its tokens, stop words and synonym merge, no captions, threshold 0.01, rescaled HistIoU,
CAS divided by their sum), and MAD per question. `synonyms` switches the merge in both
modes; the other four options are the released code's in reference mode. Every run also
stores both modes' point values (`modes`), recomputed from its stored answers as
`mode_scores` does for any stored run.
Bootstrap (DESIGN: every score with its uncertainty): images are resampled with
replacement within every set, independently per set and jointly for all counterfactuals of
a replicate; CAS, CAS^CLIP and MAD are recomputed per replicate (95% percentile intervals).
The synonym grouping of a pair is the one of the full sets. Aggregate mode (a prompt with a
{placeholder} and fill values) averages CAS per counterfactual over the prompts (per
replicate too) and takes MAD of the averages (thesis §2.1).
"""
from __future__ import annotations

import functools
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import groupby
from typing import TypedDict

import numpy as np

from ..backends.base import CANT_TELL
from ..common.errors import InputError
from ..common.events import AxisScores, Event, Headline, Progress, Table, Warning
from ..common.scores import Score, as_interval, finite_or_none, number
from ..core.distributed import distributed_evaluation, distributed_image_sets
from ..core.engine import Engine, Run, recorded
from ..hosting.limits import Estimate
from ..metrics import tibet, tibet_reference
from ..metrics.bootstrap import percentile_interval
from ..metrics.concepts import top_phrases
from ..metrics.diversity import unit_rows
from ..metrics.intervals import headline_claim
from ..metrics.wordnet import missing_note, released_synonyms, wordnet_synonyms
from ..models.presets import ASSETS
from . import cfsets
from .cfsets import SetSpec, SetsRequest, generate_set, prepare, set_label
from .measure import AskedAnswers, resample_weights
from .options import settle_settings

MODES = ("paper", "reference")   # the same words as the T2I-BiasBench metrics' modes
DEFAULT_MODE = "paper"
OPTIONS = ("caption", "synonyms", "min_frequency", "renormalise", "sum_normalise")   # the concept and CAS choices


@dataclass(frozen=True)
class InitialMeasured(Event):
    """The initial set of `prompt` (set `label`) is measured: its Top-K concepts, over all answers
    and per axis."""

    prompt: str
    label: str
    top_k: list
    axis_top_k: dict


@dataclass(frozen=True)
class Aggregated(Event):
    """Aggregate mode: MAD per axis (with its interval and order) from CAS averaged over the prompts."""

    mad: dict
    mad_ci: dict
    mad_order: list
    counterfactuals: list


@dataclass
class CounterfactualsRequest(SetsRequest):
    caption: bool = field(default=True, metadata={  # thesis; spec §8 item 3
        "help": "leave captions out of the concepts", "flag": "--no-caption"})
    synonyms: bool = field(default=True, metadata={  # Alg. 3 step 1
        "help": "do not merge WordNet synonyms before CAS", "flag": "--no-synonyms"})
    min_frequency: float = field(default=0.01, metadata={  # spec §8 item 4
        "help": "concepts rarer than this per image are dropped"})
    renormalise: bool = field(default=True, metadata={  # spec §8 item 5
        "help": "HistIoU without rescaling both histograms to sum 1", "flag": "--raw-histograms"})
    sum_normalise: bool = field(default=True, metadata={  # spec §8 item 6
        "help": "MAD of the raw CAS values (not CAS / sum CAS)", "flag": "--no-sum-normalise"})
    n_boot: int = field(default=500, metadata={"help": "bootstrap resamples of the images; 0: no intervals",
                                                 "zero_off": True})
    top_k: int = field(default=5, metadata={"help": "concepts listed per image set"})
    mode: str = field(default=DEFAULT_MODE, metadata={  # issue 23
        "help": "paper: TIBET as the thesis writes it; reference: CAS and MAD as the authors' released code "
                "computes them", "choices": MODES})


# What reference mode fixes (the released code's choices) and the options a user may have changed.
REFERENCE_OPTIONS = {"min_frequency": tibet_reference.MIN_FREQUENCY, "renormalise": True, "sum_normalise": True}


def check(request: CounterfactualsRequest, engine: Engine) -> None:
    """Raises InputError for a request that cannot run (cfsets.check, and the mode)."""
    if request.mode not in MODES:
        raise InputError(f"mode must be one of {', '.join(MODES)}, not '{request.mode}'")
    if not 0 <= request.min_frequency <= 1:   # a share of the images (NaN fails this too)
        raise InputError(f"min frequency (a share of the images) must be between 0 and 1; got {request.min_frequency}")
    cfsets.check(request, engine)


@functools.lru_cache(maxsize=1)
def _question_bank() -> dict:
    return json.loads((ASSETS / "vqa_questions.json").read_text())


def tibet_question(axis: str) -> str:
    """The Table 5.2 question whose keyword begins a word of the axis name, else the template
    'What is {axis} in the image?' (axis name without 'bias'/'biases'; spec §2.4)."""
    words = [w for w in re.split(r"[\s_-]+", axis.lower()) if w and w not in ("bias", "biases")]
    bank = _question_bank()
    for entry in bank["questions"]:
        if any(w.startswith(k) for k in entry["keywords"] for w in words):
            return entry["question"]
    return bank["template"].format(axis=" ".join(words) or axis)


def synonyms_note() -> str:
    """Returns "" when WordNet is installed, else the sentence the synonym option needs."""
    return missing_note()


@functools.lru_cache(maxsize=65536)
def _synonyms(word: str) -> frozenset[str]:
    return frozenset(wordnet_synonyms(word))


@dataclass
class ConceptSet:
    """One image set's VQA answers as per-image concept counts, with its bootstrap resamples."""

    spec: SetSpec
    records: list
    vocabulary: list[str]                  # every concept of the set
    counts: np.ndarray                     # (n, V): occurrences of each concept in each image's answers
    embeddings: np.ndarray                 # (n, d) unit image embeddings
    weights: np.ndarray                    # (n_boot, n): how often each image is drawn in each resample
    answers: list = field(default_factory=list)   # [image][question]: the answers the counts come from

    @property
    def n(self) -> int:
        return len(self.records)

    def histogram(self, min_frequency: float) -> dict[str, float]:
        """The set's concept histogram (equal to tibet.concept_histogram of its answers)."""
        frequency = self.counts.sum(axis=0) / self.n
        histogram = {w: float(f) for w, f in zip(self.vocabulary, frequency) if f >= min_frequency}
        return dict(sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0])))

    def resampled(self, vocabulary: list[str], min_frequency: float) -> np.ndarray:
        """(n_boot, len(vocabulary)) histograms of the resamples over `vocabulary`."""
        column = {w: j for j, w in enumerate(vocabulary)}
        out = np.zeros((len(self.weights), len(vocabulary)))
        out[:, [column[w] for w in self.vocabulary]] = self.weights @ self.counts / self.n
        out[out < min_frequency] = 0.0
        return out


def concept_set(spec: SetSpec, records, answers: list[list[str]], captions: list[str],
                embeddings: np.ndarray, weights: np.ndarray, mode: str = DEFAULT_MODE) -> ConceptSet:
    """`answers[q][i]`: the answer to question q about image i; in paper mode captions join
    them when given (tibet.concept_words); in reference mode the questions are one per axis,
    in axis order, captions are left out and the words are the released code's
    (tibet_reference.image_concepts). `weights`: the set's bootstrap resamples
    (measure.resample_weights)."""
    n = len(records)
    per_image = [[a[i] for a in answers] for i in range(n)]
    if mode == "reference":
        words = [tibet_reference.image_concepts(image) for image in per_image]
    else:
        # a "can't tell" answer names no concept (issue 35: counted apart, `cant_tell`, never measured)
        words = [[w for answer in image + ([captions[i]] if captions else []) if answer != CANT_TELL
                  for w in tibet.concept_words(answer)] for i, image in enumerate(per_image)]
    counters = [Counter(image_words) for image_words in words]
    vocabulary = sorted(set().union(*counters))
    counts = np.array([[c[w] for w in vocabulary] for c in counters], float).reshape(n, len(vocabulary))
    return ConceptSet(spec, records, vocabulary, counts, unit_rows(embeddings), weights, per_image)


def cas_rows(a: np.ndarray, b: np.ndarray, renormalise: bool = True) -> np.ndarray:
    """tibet.cas of each row pair of two (m, V) histogram matrices over one vocabulary."""
    if renormalise:
        sa, sb = a.sum(axis=1, keepdims=True), b.sum(axis=1, keepdims=True)
        a, b = a / np.where(sa > 0, sa, 1), b / np.where(sb > 0, sb, 1)
    intersection, union = np.minimum(a, b).sum(axis=1), np.maximum(a, b).sum(axis=1)
    cas = intersection / np.where(union > 0, union, 1)
    empty = (intersection == 0) | (union == 0)
    if renormalise:
        empty |= (a.sum(axis=1) == 0) | (b.sum(axis=1) == 0)
    return np.where(empty, 1e-7, cas)


def _released_synonyms(request: CounterfactualsRequest):
    return released_synonyms if request.synonyms else None


def _reference_concepts(initial: ConceptSet, cf: ConceptSet) -> tuple[list, list]:
    """The released code's concept lists of a pair, both divided by the initial set's size (Q5)."""
    return (tibet_reference.concepts(initial.answers, initial.n),
            tibet_reference.concepts(cf.answers, initial.n))


def pair_cas(initial: ConceptSet, cf: ConceptSet, request: CounterfactualsRequest) -> float:
    """CAS of one counterfactual set against the initial set in `request.mode` (Eq. 5.1-5.3;
    reference: tibet_reference.cas)."""
    if request.mode == "reference":
        return tibet_reference.cas(*_reference_concepts(initial, cf), _released_synonyms(request))
    return tibet.cas(initial.histogram(request.min_frequency), cf.histogram(request.min_frequency),
                     request.renormalise, _synonyms if request.synonyms else None)


def _merge_matrix(vocabulary: list[str], groups: list[str], names: dict, kept=None) -> np.ndarray:
    """(V, G): word -> its synonym group; words outside `kept` (when given) count nowhere."""
    column = {g: j for j, g in enumerate(groups)}
    merge = np.zeros((len(vocabulary), len(groups)))
    for i, w in enumerate(vocabulary):
        if kept is None or w in kept:
            merge[i, column[names.get(w, w)]] = 1.0
    return merge


def resampled_cas(initial: ConceptSet, cf: ConceptSet, request: CounterfactualsRequest) -> np.ndarray:
    """(n_boot,) CAS of the pair's bootstrap resamples, each over the synonym grouping of the
    full sets (paper: tibet.cas's shared grouping; reference: the released merge's names, each
    name counting its first and last concept, tibet_reference Q10-Q11)."""
    vocabulary = sorted(set(initial.vocabulary) | set(cf.vocabulary))
    if request.mode == "reference":
        c_init, c_cf = _reference_concepts(initial, cf)
        names = tibet_reference.merge_pair(c_init, c_cf, _released_synonyms(request)).names
        groups = sorted({names.get(w, w) for w in vocabulary})
        threshold = tibet_reference.MIN_FREQUENCY
        a = initial.resampled(vocabulary, threshold) @ _merge_matrix(
            vocabulary, groups, names, tibet_reference.counted(c_init, names))
        b = cf.resampled(vocabulary, threshold) @ _merge_matrix(vocabulary, groups, names,
                                                                tibet_reference.counted(c_cf, names))
        return tibet_reference.hist_iou_rows(a, b)
    names = {}
    if request.synonyms:  # the grouping tibet.cas makes for this pair
        joint = Counter(initial.histogram(request.min_frequency)) + Counter(cf.histogram(request.min_frequency))
        names = tibet.synonym_mapping(joint, _synonyms, joint)
    merge = _merge_matrix(vocabulary, sorted({names.get(w, w) for w in vocabulary}), names)
    a = initial.resampled(vocabulary, request.min_frequency) @ merge
    b = cf.resampled(vocabulary, request.min_frequency) @ merge
    return cas_rows(a, b, request.renormalise)


def compare(initial: ConceptSet, cf: ConceptSet, request: CounterfactualsRequest) -> dict:
    """CAS and CAS^CLIP of one counterfactual set against the initial set, with their replicates."""
    mean_a, mean_b = initial.weights @ initial.embeddings / initial.n, cf.weights @ cf.embeddings / cf.n
    return {"cas": pair_cas(initial, cf, request),
            "cas_clip": tibet.cas_clip(initial.embeddings, cf.embeddings),
            "_cas": resampled_cas(initial, cf, request),
            "_cas_clip": np.clip((mean_a * mean_b).sum(axis=1), 0.0, 1.0)}  # tibet.cas_clip per resample


def _interval(draws) -> list:
    return list(percentile_interval(np.asarray(draws, float))) if len(draws) else [None, None]


def _mad(values, sum_normalise: bool, mode: str) -> float:
    """MAD of one axis' CAS: tibet.mad_normalised (Eq. 5.5-5.6), or in reference mode the
    released code's MAD of the CAS divided by their sum (NaN for a single counterfactual)."""
    if mode == "reference":
        return tibet_reference.mad(tibet_reference.normalised_by_sum(values))
    return tibet.mad_normalised(values, sum_normalise)


def axis_scores(cfs: list[dict], sum_normalise: bool, mode: str = DEFAULT_MODE) -> dict:
    """MAD (of CAS and of CAS^CLIP) of one axis with bootstrap intervals; adds each
    counterfactual's `cas_ci` / `cas_clip_ci`. `cfs` carry the replicates (`_cas`, `_cas_clip`).
    In reference mode MAD of CAS is the released code's (`_mad`; None where it is undefined)
    and, from each counterfactual's `cas_per_question`, so is `mad_per_question`; MAD of
    CAS^CLIP, which the released code does not have, stays the thesis's."""
    out = {}
    for key, mad_key in (("cas", "mad"), ("cas_clip", "mad_clip")):
        how = mode if key == "cas" else DEFAULT_MODE
        out[mad_key] = finite_or_none(_mad([c[key] for c in cfs], sum_normalise, how))
        draws = [_mad(col, sum_normalise, how) for col in np.array([c[f"_{key}"] for c in cfs]).T]
        out[f"{mad_key}_ci"] = _interval(draws) if out[mad_key] is not None else [None, None]
        out[f"_{mad_key}_draws"] = np.asarray(draws, float)   # aligned across axes: for the headline's certainty
        for c in cfs:
            c[f"{key}_ci"] = _interval(c[f"_{key}"])
    if cfs and "cas_per_question" in cfs[0]:
        out["mad_per_question"] = {q: finite_or_none(_mad([c["cas_per_question"][q] for c in cfs], True, mode))
                                   for q in cfs[0]["cas_per_question"]}
    return out


def _public(cf: dict) -> dict:
    return {k: v for k, v in cf.items() if not k.startswith("_")}


def _set_json(s: ConceptSet, answers: dict[str, list[str]], captions: list[str], request, asked: AskedAnswers) -> dict:
    histogram = s.histogram(request.min_frequency)   # TIBET's unigrams: what CAS compares
    # Top-K as read by a person: whole phrases, variants merged (metrics.concepts)
    axis_top = {a: top_phrases([[x] for x in got], None, request.top_k) for a, got in answers.items()}
    per_image = [[answers[a][i] for a in answers] for i in range(len(s.records))]
    top = top_phrases(per_image, captions or None, request.top_k, known=s.spec.prompt.lower().split())
    return {"prompt": s.spec.prompt, "axis": s.spec.axis, "cf": s.spec.cf, "value": s.spec.value,
            "histogram": histogram, "top_k": top, "axis_top_k": axis_top,
            "images": [{"key": r.key, "seed": r.seed, "path": r.path, "answers": {a: answers[a][i] for a in answers},
                        "answer_probs": asked.probs.get(r.key, {}),
                        **({"caption": captions[i]} if captions else {})} for i, r in enumerate(s.records)]}


def mad_order(mad: dict[str, float | None], mode: str = DEFAULT_MODE) -> list[str]:
    """The axes by MAD, most biased first (ties: in axis order; reference mode: as the
    released code ranks them, tibet_reference.ranking); an undefined MAD (None) last."""
    defined = {a: v for a, v in mad.items() if v is not None}
    order = tibet_reference.ranking(defined) if mode == "reference" else sorted(defined, key=lambda a: -defined[a])
    return order + [a for a in mad if mad[a] is None]


def summarise(scored: dict[str, dict], n: int | None = None, mode: str = DEFAULT_MODE) -> dict:
    """The score part of the results from {axis: {"cfs": [...], "mad": ..., ...}}, with the
    "most biased axis" headline and the bootstrap probability that it is the top one (issue 16)."""
    out = {"counterfactuals": [_public(c) for a in scored.values() for c in a["cfs"]],
           "cas": {axis: {c["prompt"]: c["cas"] for c in a["cfs"]} for axis, a in scored.items()},
           "cas_clip": {axis: {c["prompt"]: c["cas_clip"] for c in a["cfs"]} for axis, a in scored.items()}}
    for key in ("mad", "mad_ci", "mad_clip", "mad_clip_ci", "mad_per_question"):
        if all(key in a for a in scored.values()):
            out[key] = {axis: a[key] for axis, a in scored.items()}
    out["mad_order"] = mad_order(out["mad"], mode)
    draws = {axis: a.get("_mad_draws") for axis, a in scored.items()}
    if n and all(d is not None and len(d) for d in draws.values()):
        out["headline"] = headline_claim(out["mad"], draws, n, what="most biased axis (MAD of CAS)")
    return out


class CounterfactualsResults(TypedDict, total=False):
    """What a Counterfactuals run stores (`Done.results`); saved after each prompt."""

    prompt: str                              # as given (a template in aggregate mode)
    prompts: list[str]                       # the filled prompts
    aggregate: bool
    n: int
    seeds: list[int]
    settings: dict
    axes: dict[str, list[str]]               # {axis: [counterfactual prompts]}
    questions: dict[str, str]                # each axis' VQA question (Table 5.2)
    mode: str                                # "paper" or "reference": how CAS and MAD were computed
    options: dict                            # caption, synonyms, min_frequency, renormalise, sum_normalise, n_boot
    sets: dict[str, dict]                    # per set label: prompt, histogram, Top-K, images with answers
                                             # and answer_probs (image -> axis -> class -> p; free questions: {})
    cant_tell: dict[str, dict]               # per axis: measure.cant_tell_counts over every set's answers
    per_prompt: dict[str, dict]              # per prompt: the score part below
    counterfactuals: list[dict]              # per counterfactual: axis, prompt, value, CAS, CAS^CLIP (+ _ci)
    cas: dict[str, dict[str, float]]         # axis -> counterfactual -> CAS
    cas_clip: dict[str, dict[str, float]]
    mad: dict[str, float]                    # normalised MAD per axis (Eq. 5.5-5.6)
    mad_ci: dict[str, list]
    mad_clip: dict[str, float]
    mad_clip_ci: dict[str, list]
    mad_order: list[str]                     # axes by MAD, most biased first
    mad_per_question: dict[str, dict]        # reference mode: axis -> question (named by its axis) -> MAD
    modes: dict[str, dict]                   # both modes' point values: mode -> {"cas", "mad", "mad_order"}


def estimate(request: CounterfactualsRequest, until_cap: int | None = None, proposed: int | None = None) -> Estimate:
    """N images per set: the prompt's and one per counterfactual, per fill value (cfsets.estimate_sets)."""
    return cfsets.estimate_sets(request, cfsets.one_set_each, proposed)


@recorded("counterfactuals", check, estimate)
def run(request: CounterfactualsRequest, engine: Engine, run_record: Run):
    """TIBET on one prompt (or on a {placeholder} prompt filled with each of `request.fill`,
    CAS averaged over the prompts: aggregate mode).

    Request: CounterfactualsRequest (the axes table or the LLM's, N images per set, concept
    and normalisation choices, bootstrap size, Top-K).
    Yields: Table("axes") when the LLM proposed the axes; Warning for dropped
    counterfactuals, unexpected settings (settings_notes) and flagged images;
    Table("questions"); Images and Progress per set;
    InitialMeasured per prompt, AxisScores per axis (and prompt), Aggregated in aggregate mode;
    Headline; one Done. `request.mode` picks the paper's or the released code's CAS and
    MAD; the other mode's point values are added at the end (`modes`, from the stored answers).
    Results: CounterfactualsResults.
    """
    # 1. Settle the prompts, axes and image sets; each axis' VQA question (spec §2.4).
    prompts, axes, specs = yield from prepare(request, engine, estimate)
    settings = yield from settle_settings(request, engine)
    seeds = request.seeds()
    yield from distributed_image_sets(engine, [(s.prompt, seeds, settings) for s in specs])  # launched: every process
    questions = {axis: tibet_question(axis) for axis in axes}
    unique_questions = list(dict.fromkeys(questions.values()))
    yield from distributed_evaluation(engine, [(s.prompt, seeds, settings) for s in specs],   # launched: every process
                                      asks=[(q, None) for q in unique_questions], caption=request.caption, embed=True)
    results: CounterfactualsResults = {"prompt": request.prompt.strip(), "prompts": prompts, "aggregate": len(prompts) > 1,
                     "n": request.n, "seeds": seeds, "settings": settings.__dict__, "axes": axes,
                     "questions": questions, "mode": request.mode,
                     "options": {k: getattr(request, k) for k in (*OPTIONS, "n_boot")},
                     "sets": {}, "per_prompt": {}}
    yield Table("questions", ["axis", "question"], [[a, q] for a, q in questions.items()])
    reference = request.mode == "reference"
    changed = [k for k, v in REFERENCE_OPTIONS.items() if getattr(request, k) != v]
    if reference and changed:
        yield Warning(f"reference mode computes as the released code does, so {', '.join(changed)} "
                      "apply to the paper-mode numbers only")
    position = {spec.label: i for i, spec in enumerate(specs)}
    asked = AskedAnswers()   # every set's answers, for the "can't tell" counts

    def measure(spec: SetSpec):
        i = position[spec.label]
        def evaluate(batch):  # the same calls as below, batch by batch, beside the next batch's generation
            engine.ask_many(batch, [(q, None) for q in unique_questions])
            if request.caption:
                engine.caption(batch)
            engine.embed_images(batch)

        records = yield from generate_set(engine, run_record, spec, seeds, settings, i, len(specs), evaluate)
        yield Progress(i, len(specs), "vqa", f"asking {len(unique_questions)} question(s) about '{spec.prompt}'")
        by_question = dict(zip(unique_questions, engine.ask_each(records, [(q, None) for q in unique_questions])))
        captions = engine.caption(records) if request.caption else []
        # reference mode: one question per axis, in axis order, as the released code asks them
        answers = [by_question[questions[a]] for a in axes] if reference else list(by_question.values())
        s = concept_set(spec, records, answers, captions, engine.embed_images(records),
                        resample_weights(len(records), request.n_boot, request.seed, i), request.mode)
        for a, q in questions.items():   # free questions: no class probabilities
            asked.record(spec.label, a, records, by_question[q])
        results["sets"][spec.label] = _set_json(s, {a: by_question[q] for a, q in questions.items()}, captions, request,
                                                asked)
        return s

    # 2. Per prompt: the initial set, then every counterfactual set, CAS against the initial
    #    set (Eq. 5.1-5.4) and MAD per axis (Eq. 5.5-5.6) with bootstrap intervals.
    per_prompt = []
    for p, prompt in enumerate(prompts):
        initial_spec, *cf_specs = [s for s in specs if s.prompt_index == p]
        initial = yield from measure(initial_spec)
        initial_set = results["sets"][initial_spec.label]
        yield InitialMeasured(prompt, initial_spec.label, initial_set["top_k"], initial_set["axis_top_k"])
        scored = {}
        for axis, group in groupby(cf_specs, key=lambda s: s.axis):
            cfs, cf_sets = [], []
            for spec in group:
                cf = yield from measure(spec)
                cf_sets.append(cf)
                cfs.append({"axis": axis, "prompt": spec.cf, "value": spec.value, "label": spec.label,
                            **compare(initial, cf, request)})
            if reference:   # CAS from one question's answers, for each question (tibet_reference Q15)
                for q, q_axis in enumerate(axes):
                    values = tibet_reference.axis_cas(initial.answers, [c.answers for c in cf_sets], q,
                                                      _released_synonyms(request))
                    for c, value in zip(cfs, values):
                        c.setdefault("cas_per_question", {})[q_axis] = value
            scored[axis] = {"cfs": cfs, **axis_scores(cfs, request.sum_normalise, request.mode)}
            yield AxisScores(axis, {**_public(scored[axis]), "counterfactuals": [_public(c) for c in cfs]}, prompt)
        per_prompt.append(scored)
        results["per_prompt"][prompt] = summarise(scored, request.n, request.mode)
        run_record.save(results)

    # 3. One prompt: its scores; aggregate mode: CAS averaged over the prompts, then MAD.
    if len(prompts) == 1:
        results.update(results["per_prompt"][prompts[0]])
    else:
        averaged = {axis: _average([s[axis]["cfs"] for s in per_prompt]) for axis in axes}
        results.update(summarise({axis: {"cfs": cfs, **axis_scores(cfs, request.sum_normalise, request.mode)}
                                  for axis, cfs in averaged.items()}, request.n, request.mode))
        yield Aggregated(*(results[k] for k in ("mad", "mad_ci", "mad_order", "counterfactuals")))
    if results.get("headline"):
        yield Headline(results["headline"])
    other = MODES[1 - MODES.index(request.mode)]
    results["cant_tell"] = asked.cant_tell()
    results["modes"] = {request.mode: own_mode_scores(results), other: mode_scores(results, other)}
    summary = {"prompts": len(prompts), "sets": len(specs), "n": request.n, "mode": request.mode,
               **{f"mad_{a}": round(results["mad"][a], 3) for a in results["mad_order"]
                  if results["mad"][a] is not None}}
    yield run_record.finish(results, summary)


def _average(per_prompt: list[list[dict]]) -> list[dict]:
    """One axis' counterfactuals with CAS (and replicates, and per-question CAS in reference
    mode) averaged over the prompts of an aggregate run."""
    averaged = [{"axis": cf["axis"], "prompt": cf["prompt"], "value": cf["value"],
                 **{key: float(np.mean([p[k][key] for p in per_prompt])) for key in ("cas", "cas_clip")},
                 **{key: np.mean([p[k][key] for p in per_prompt], axis=0) for key in ("_cas", "_cas_clip")}}
                for k, cf in enumerate(per_prompt[0])]
    if "cas_per_question" in per_prompt[0][0]:
        for k, cf in enumerate(averaged):
            cf["cas_per_question"] = {q: float(np.mean([p[k]["cas_per_question"][q] for p in per_prompt]))
                                      for q in per_prompt[0][k]["cas_per_question"]}
    return averaged


def own_mode_scores(results: dict) -> dict:
    """The run's own point values in `mode_scores`' shape."""
    out = {"cas": results["cas"], "mad": results["mad"], "mad_order": results["mad_order"]}
    if results.get("aggregate"):
        out["per_prompt"] = {p: {"mad": v["mad"], "mad_order": v["mad_order"]} for p, v in results["per_prompt"].items()}
    return out


def mode_scores(results: dict, mode: str) -> dict:
    """A stored run's CAS per counterfactual and MAD per axis computed in `mode` (point values,
    no intervals) from its stored VQA answers and captions, with its options; nothing is
    generated or asked again. For the run's own mode they equal its stored values. Returns
    {"cas": {axis: {counterfactual: CAS}}, "mad": {axis: MAD}, "mad_order": [...]} and, in
    aggregate mode, "per_prompt": {prompt: {"mad", "mad_order"}}; {} when no prompt has all
    its sets stored (a stopped run)."""
    options = results.get("options") or {}
    request = CounterfactualsRequest(prompt=results.get("prompt") or "", mode=mode, n_boot=0,
                                     **{k: options[k] for k in OPTIONS if k in options})
    axes, questions, sets = results["axes"], results["questions"], results["sets"]
    aggregate = bool(results.get("aggregate"))
    asked_by = {}                     # each question once, by the first axis that asks it (as the run asked it)
    for axis in axes:
        asked_by.setdefault(questions[axis], axis)

    def rebuild(label: str) -> ConceptSet:
        images = sets[label]["images"]
        by = list(axes) if mode == "reference" else list(asked_by.values())
        captions = ([im.get("caption") for im in images]
                    if request.caption and mode == "paper" and all("caption" in im for im in images) else [])
        return concept_set(SetSpec(label, "", 0), images, [[im["answers"].get(a) for im in images] for a in by],
                           captions, np.ones((len(images), 1)), np.zeros((0, len(images))), mode)

    per_prompt = {}
    for prompt in results.get("prompts") or []:
        labels = {(a, cf): set_label(prompt, aggregate, a, cf) for a, cfs in axes.items() for cf in cfs}
        if set_label(prompt, aggregate) not in sets or any(label not in sets for label in labels.values()):
            continue
        initial = rebuild(set_label(prompt, aggregate))
        per_prompt[prompt] = {a: [pair_cas(initial, rebuild(labels[a, cf]), request) for cf in cfs]
                              for a, cfs in axes.items()}
    if not per_prompt:
        return {}

    def mads(cas: dict[str, list[float]]) -> dict[str, float | None]:
        return {a: finite_or_none(_mad(values, request.sum_normalise, mode)) for a, values in cas.items()}

    cas = {a: [float(np.mean([p[a][k] for p in per_prompt.values()])) for k in range(len(cfs))]
           for a, cfs in axes.items()}
    mad = mads(cas)
    out = {"cas": {a: dict(zip(cfs, cas[a])) for a, cfs in axes.items()}, "mad": mad,
           "mad_order": mad_order(mad, mode)}
    if aggregate:
        out["per_prompt"] = {p: {"mad": m, "mad_order": mad_order(m, mode)} for p, m in
                             ((p, mads(c)) for p, c in per_prompt.items())}
    return out


def in_mode(results: dict, mode: str) -> dict:
    """Returns a stored run's results as `mode` scores them, generating and asking nothing: the
    run's own results for its own mode; else its CAS per counterfactual, MAD per axis (and per
    prompt) and the axis order of that mode (`results["modes"]`, or `mode_scores` for a run
    stored without them), point values only (intervals and the headline belong to the run's
    own mode), with "rescored_from" naming the run's mode. A stopped run without every set
    stays as it is."""
    own = results.get("mode", DEFAULT_MODE)
    if mode == own or mode not in MODES:
        return results
    other = (results.get("modes") or {}).get(mode) or mode_scores(results, mode)
    if not other:
        return results
    cas = other.get("cas") or {}
    out = {**results, "mode": mode, "rescored_from": own, "headline": None, "mad": other["mad"],
           "mad_order": other["mad_order"], "mad_ci": {a: [None, None] for a in other["mad"]},
           "cas": cas, "counterfactuals": [{**c, "cas": (cas.get(c["axis"]) or {}).get(c["prompt"], c["cas"]),
                                            "cas_ci": [None, None]} for c in results.get("counterfactuals", [])]}
    if results.get("aggregate") and other.get("per_prompt"):
        out["per_prompt"] = {p: {**v, **other["per_prompt"].get(p, {})} for p, v in results["per_prompt"].items()}
    return out


def scores(results: dict, summary: dict) -> list[Score]:
    """Score rows of a stored run (Runs, comparison, export), each metric named by its mode:
    per axis MAD in both modes (the run's own with its interval) and MAD of CAS^CLIP; per
    counterfactual CAS in both modes and CAS^CLIP; per prompt MAD in aggregate mode. A run
    stored without the other mode's values gets them from `mode_scores`."""
    mode = results.get("mode", DEFAULT_MODE)
    modes = {m: (results.get("modes") or {}).get(m) or (own_mode_scores(results) if m == mode
                                                            else mode_scores(results, m)) for m in MODES}

    def row(group: str, metric: str, value, interval=None) -> list[Score]:
        if number(value) is None:
            return []
        return [Score(group, metric, float(value), *(as_interval(interval) or (None, None)))]

    rows = []
    for axis in results["mad_order"]:
        for m in MODES:
            rows += row(axis, f"MAD ({m})", (modes[m].get("mad") or {}).get(axis),
                        results["mad_ci"].get(axis) if m == mode else None)
        rows += row(axis, "MAD of CAS CLIP", results["mad_clip"].get(axis), results["mad_clip_ci"].get(axis))
    for c in results["counterfactuals"]:
        group = f"{c['axis']}: {c['prompt']}"
        for m in MODES:
            rows += row(group, f"CAS ({m})", ((modes[m].get("cas") or {}).get(c["axis"]) or {}).get(c["prompt"]),
                        c.get("cas_ci") if m == mode else None)
        rows += row(group, "CAS CLIP", c.get("cas_clip"), c.get("cas_clip_ci"))
    if results.get("aggregate"):
        for prompt, own in results["per_prompt"].items():
            for axis in results["mad_order"]:
                for m in MODES:
                    per_prompt = ((modes[m].get("per_prompt") or {}).get(prompt) or {}).get("mad") or {}
                    rows += row(f"{prompt}: {axis}", f"MAD ({m})", per_prompt.get(axis),
                                own["mad_ci"].get(axis) if m == mode else None)
    return rows


def headline(record: dict) -> tuple[str, float | None]:
    """("max MAD 0.412 (gender) · 3 sets", the largest normalised MAD) of a stored run;
    " · reference mode" is added for a run in reference mode."""
    summary = record.get("summary") or {}
    mads = {k[4:]: float(v) for k, v in summary.items() if k.startswith("mad_") and number(v) is not None}
    if not mads:
        return "", None
    axis = max(mads, key=mads.get)
    sets = f" · {summary['sets']} sets" if number(summary.get("sets")) is not None else ""
    mode = " · reference mode" if summary.get("mode") == "reference" else ""
    return f"max MAD {mads[axis]:.3f} ({axis}){sets}{mode}", mads[axis]
