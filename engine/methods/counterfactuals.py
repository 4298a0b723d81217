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

from ..core import Engine, Run, recorded
from ..distributed import distributed_image_sets
from ..events import Progress, Scores, Table
from ..metrics import tibet
from ..metrics.bootstrap import percentile_interval
from ..metrics.intervals import headline_claim
from ..metrics.diversity import unit_rows
from ..metrics.concepts import top_phrases
from ..metrics.wordnet import missing_note, wordnet_synonyms
from ..presets import ASSETS
from ..scores import number
from .cfsets import SetSpec, SetsRequest, check, generate_set, prepare, resample_weights
from .generate import settings_for


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
    n_boot: int = field(default=500, metadata={"help": "bootstrap resamples of the images; 0: no intervals"})
    top_k: int = field(default=5, metadata={"help": "concepts listed per image set"})


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
                embeddings: np.ndarray, weights: np.ndarray) -> ConceptSet:
    """`answers[q][i]`: the answer to question q about image i; captions join them when given;
    `weights`: the set's bootstrap resamples (cfsets.resample_weights)."""
    n = len(records)
    per_image = [[a[i] for a in answers] + ([captions[i]] if captions else []) for i in range(n)]
    counters = [Counter(w for answer in image for w in tibet.concept_words(answer)) for image in per_image]
    vocabulary = sorted(set().union(*counters))
    counts = np.array([[c[w] for w in vocabulary] for c in counters], float).reshape(n, len(vocabulary))
    return ConceptSet(spec, records, vocabulary, counts, unit_rows(embeddings), weights)


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


def compare(initial: ConceptSet, cf: ConceptSet, request: CounterfactualsRequest) -> dict:
    """CAS and CAS^CLIP of one counterfactual set against the initial set, with their replicates."""
    h_init, h_cf = initial.histogram(request.min_frequency), cf.histogram(request.min_frequency)
    synonyms = _synonyms if request.synonyms else None
    vocabulary = sorted(set(initial.vocabulary) | set(cf.vocabulary))
    merge = np.eye(len(vocabulary))
    if synonyms:  # the grouping tibet.cas makes for this pair, reused for every resample
        joint = Counter(h_init) + Counter(h_cf)
        mapping = tibet.synonym_mapping(joint, synonyms, joint)
        groups = sorted(set(mapping.get(w, w) for w in vocabulary))
        merge = np.zeros((len(vocabulary), len(groups)))
        merge[range(len(vocabulary)), [groups.index(mapping.get(w, w)) for w in vocabulary]] = 1.0
    a = initial.resampled(vocabulary, request.min_frequency) @ merge
    b = cf.resampled(vocabulary, request.min_frequency) @ merge
    mean_a, mean_b = initial.weights @ initial.embeddings / initial.n, cf.weights @ cf.embeddings / cf.n
    return {"cas": tibet.cas(h_init, h_cf, request.renormalise, synonyms),
            "cas_clip": tibet.cas_clip(initial.embeddings, cf.embeddings),
            "_cas": cas_rows(a, b, request.renormalise),
            "_cas_clip": np.clip((mean_a * mean_b).sum(axis=1), 0.0, 1.0)}  # tibet.cas_clip per resample


def _interval(draws) -> list:
    return list(percentile_interval(np.asarray(draws, float))) if len(draws) else [None, None]


def axis_scores(cfs: list[dict], sum_normalise: bool) -> dict:
    """MAD (of CAS and of CAS^CLIP) of one axis with bootstrap intervals; adds each
    counterfactual's `cas_ci` / `cas_clip_ci`. `cfs` carry the replicates (`_cas`, `_cas_clip`)."""
    out = {}
    for key, mad_key in (("cas", "mad"), ("cas_clip", "mad_clip")):
        out[mad_key] = tibet.mad_normalised([c[key] for c in cfs], sum_normalise)
        draws = [tibet.mad_normalised(col, sum_normalise) for col in np.array([c[f"_{key}"] for c in cfs]).T]
        out[f"{mad_key}_ci"] = _interval(draws)
        out[f"_{mad_key}_draws"] = np.asarray(draws, float)   # aligned across axes: for the headline's certainty
        for c in cfs:
            c[f"{key}_ci"] = _interval(c[f"_{key}"])
    return out


def _public(cf: dict) -> dict:
    return {k: v for k, v in cf.items() if not k.startswith("_")}


def _set_json(s: ConceptSet, answers: dict[str, list[str]], captions: list[str], request) -> dict:
    histogram = s.histogram(request.min_frequency)   # TIBET's unigrams: what CAS compares
    # Top-K as read by a person: whole phrases, variants merged (metrics.concepts)
    axis_top = {a: top_phrases([[x] for x in got], None, request.top_k) for a, got in answers.items()}
    per_image = [[answers[a][i] for a in answers] for i in range(len(s.records))]
    top = top_phrases(per_image, captions or None, request.top_k, known=s.spec.prompt.lower().split())
    return {"prompt": s.spec.prompt, "axis": s.spec.axis, "cf": s.spec.cf, "value": s.spec.value,
            "histogram": histogram, "top_k": top, "axis_top_k": axis_top,
            "images": [{"key": r.key, "seed": r.seed, "path": r.path, "answers": {a: answers[a][i] for a in answers},
                        **({"caption": captions[i]} if captions else {})} for i, r in enumerate(s.records)]}


def summarise(scored: dict[str, dict], n: int | None = None) -> dict:
    """The score part of the results from {axis: {"cfs": [...], "mad": ..., ...}}, with the
    "most biased axis" headline and the bootstrap probability that it is the top one (issue 16)."""
    out = {"counterfactuals": [_public(c) for a in scored.values() for c in a["cfs"]],
           "cas": {axis: {c["prompt"]: c["cas"] for c in a["cfs"]} for axis, a in scored.items()},
           "cas_clip": {axis: {c["prompt"]: c["cas_clip"] for c in a["cfs"]} for axis, a in scored.items()}}
    for key in ("mad", "mad_ci", "mad_clip", "mad_clip_ci"):
        out[key] = {axis: a[key] for axis, a in scored.items()}
    out["mad_order"] = sorted(out["mad"], key=lambda a: -out["mad"][a])
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
    options: dict                            # caption, synonyms, min_frequency, renormalise, sum_normalise, n_boot
    sets: dict[str, dict]                    # per set label: prompt, histogram, Top-K, images with answers
    per_prompt: dict[str, dict]              # per prompt: the score part below
    counterfactuals: list[dict]              # per counterfactual: axis, prompt, value, CAS, CAS^CLIP (+ _ci)
    cas: dict[str, dict[str, float]]         # axis -> counterfactual -> CAS
    cas_clip: dict[str, dict[str, float]]
    mad: dict[str, float]                    # normalised MAD per axis (Eq. 5.5-5.6)
    mad_ci: dict[str, list]
    mad_clip: dict[str, float]
    mad_clip_ci: dict[str, list]
    mad_order: list[str]                     # axes by MAD, most biased first


@recorded("counterfactuals", check)
def run(request: CounterfactualsRequest, engine: Engine, run_record: Run):
    """TIBET on one prompt (or on a {placeholder} prompt filled with each of `request.fill`,
    CAS averaged over the prompts: aggregate mode).

    Request: CounterfactualsRequest (the axes table or the LLM's, N images per set, concept
    and normalisation choices, bootstrap size, Top-K).
    Yields: Table("axes") when the LLM proposed the axes; Warning for dropped
    counterfactuals and flagged images; Table("questions"); Images and Progress per set;
    Scores("initial") per prompt, Scores("axis:<name>") per axis, Scores("aggregate") in
    aggregate mode; one Done.
    Results: CounterfactualsResults.
    """
    # 1. Settle the prompts, axes and image sets; each axis' VQA question (spec §2.4).
    prompts, axes, specs = yield from prepare(request, engine, "counterfactuals")
    settings = settings_for(request, engine)
    seeds = request.seeds()
    yield from distributed_image_sets(engine, [(s.prompt, seeds, settings) for s in specs])  # launched: every process
    questions = {axis: tibet_question(axis) for axis in axes}
    unique_questions = list(dict.fromkeys(questions.values()))
    results: CounterfactualsResults = {"prompt": request.prompt.strip(), "prompts": prompts, "aggregate": len(prompts) > 1,
                     "n": request.n, "seeds": seeds, "settings": settings.__dict__, "axes": axes,
                     "questions": questions,
                     "options": {k: getattr(request, k) for k in ("caption", "synonyms", "min_frequency",
                                                                  "renormalise", "sum_normalise", "n_boot")},
                     "sets": {}, "per_prompt": {}}
    yield Table("questions", ["axis", "question"], [[a, q] for a, q in questions.items()])
    position = {spec.label: i for i, spec in enumerate(specs)}

    def measure(spec: SetSpec):
        i = position[spec.label]
        def evaluate(batch):  # the same calls as below, batch by batch, beside the next batch's generation
            for q in unique_questions:
                engine.ask(batch, q)
            if request.caption:
                engine.caption(batch)
            engine.embed_images(batch)

        records = yield from generate_set(engine, run_record, spec, seeds, settings, i, len(specs), evaluate)
        yield Progress(i, len(specs), "vqa", f"asking {len(unique_questions)} question(s) about '{spec.prompt}'")
        by_question = {q: engine.ask(records, q) for q in unique_questions}
        captions = engine.caption(records) if request.caption else []
        s = concept_set(spec, records, list(by_question.values()), captions, engine.embed_images(records),
                        resample_weights(len(records), request.n_boot, request.seed, i))
        results["sets"][spec.label] = _set_json(s, {a: by_question[q] for a, q in questions.items()}, captions, request)
        return s

    # 2. Per prompt: the initial set, then every counterfactual set, CAS against the initial
    #    set (Eq. 5.1-5.4) and MAD per axis (Eq. 5.5-5.6) with bootstrap intervals.
    per_prompt = []
    for p, prompt in enumerate(prompts):
        initial_spec, *cf_specs = [s for s in specs if s.prompt_index == p]
        initial = yield from measure(initial_spec)
        yield Scores("initial", {"prompt": prompt, "label": initial_spec.label,
                                 **{k: results["sets"][initial_spec.label][k] for k in ("top_k", "axis_top_k")}})
        scored = {}
        for axis, group in groupby(cf_specs, key=lambda s: s.axis):
            cfs = []
            for spec in group:
                cf = yield from measure(spec)
                cfs.append({"axis": axis, "prompt": spec.cf, "value": spec.value, "label": spec.label,
                            **compare(initial, cf, request)})
            scored[axis] = {"cfs": cfs, **axis_scores(cfs, request.sum_normalise)}
            yield Scores(f"axis:{axis}", {"prompt": prompt, "axis": axis, **_public(scored[axis]),
                                          "counterfactuals": [_public(c) for c in cfs]})
        per_prompt.append(scored)
        results["per_prompt"][prompt] = summarise(scored, request.n)
        run_record.save(results)

    # 3. One prompt: its scores; aggregate mode: CAS averaged over the prompts, then MAD.
    if len(prompts) == 1:
        results.update(results["per_prompt"][prompts[0]])
    else:
        averaged = {axis: _average([s[axis]["cfs"] for s in per_prompt]) for axis in axes}
        results.update(summarise({axis: {"cfs": cfs, **axis_scores(cfs, request.sum_normalise)}
                                  for axis, cfs in averaged.items()}, request.n))
        yield Scores("aggregate", {k: results[k] for k in ("mad", "mad_ci", "mad_order", "counterfactuals")})
    if results.get("headline"):
        yield Scores("headline", results["headline"])
    summary = {"prompts": len(prompts), "sets": len(specs), "n": request.n,
               **{f"mad_{a}": round(results["mad"][a], 3) for a in results["mad_order"]}}
    yield run_record.finish(results, summary)


def _average(per_prompt: list[list[dict]]) -> list[dict]:
    """One axis' counterfactuals with CAS (and replicates) averaged over the prompts of an aggregate run."""
    return [{"axis": cf["axis"], "prompt": cf["prompt"], "value": cf["value"],
             **{key: float(np.mean([p[k][key] for p in per_prompt])) for key in ("cas", "cas_clip")},
             **{key: np.mean([p[k][key] for p in per_prompt], axis=0) for key in ("_cas", "_cas_clip")}}
            for k, cf in enumerate(per_prompt[0])]


def headline(record: dict) -> tuple[str, float | None]:
    """("max MAD 0.412 (gender) · 3 sets", the largest normalised MAD) of a stored run."""
    summary = record.get("summary") or {}
    mads = {k[4:]: float(v) for k, v in summary.items() if k.startswith("mad_") and number(v) is not None}
    if not mads:
        return "", None
    axis = max(mads, key=mads.get)
    sets = f" · {summary['sets']} sets" if number(summary.get("sets")) is not None else ""
    return f"max MAD {mads[axis]:.3f} ({axis}){sets}", mads[axis]
