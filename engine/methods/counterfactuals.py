"""Counterfactuals (TIBET, thesis Ch. 5; spec §2): bias axes and counterfactual prompts from
the LLM (or a preset, or the user's table), an image set per prompt and per counterfactual,
VQA concept histograms, CAS per counterfactual, normalised MAD per axis, with bootstrap CIs.

Choices the spec leaves open (§8 items 3-6), each a request field:
- `caption` (item 3): each image's caption joins its VQA answers, as the thesis says
  (the released code leaves it out); default on.
- concepts (item 4): unigram words, punctuation deleted ("middle-aged" -> "middleaged"),
  English stop words, "image" and the answers yes/no/none dropped, concepts below
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

import numpy as np

from ..core import Engine, Run, recorded
from ..events import Progress, Scores, Table
from ..metrics import tibet
from ..metrics.bootstrap import percentile_interval, resample_indices
from ..metrics.wordnet import wordnet_synonyms
from ..presets import ASSETS
from .cfsets import SetSpec, SetsRequest, add_set_arguments, generate_set, prepare, set_request_fields
from .generate import settings_for


@dataclass
class CounterfactualsRequest(SetsRequest):
    caption: bool = True             # add each image's caption to its concepts (thesis; §8 item 3)
    synonyms: bool = True            # merge WordNet synonyms before CAS (Alg. 3 step 1)
    min_frequency: float = 0.01      # concepts rarer than this per image are dropped (§8 item 4)
    renormalise: bool = True         # HistIoU on histograms scaled to sum 1 (§8 item 5)
    sum_normalise: bool = True       # CAS / sum(CAS) before MAD (§8 item 6)
    n_boot: int = 500                # bootstrap resamples of the images; 0 = no intervals
    top_k: int = 5


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


@functools.lru_cache(maxsize=65536)
def _synonyms(word: str) -> frozenset[str]:
    return frozenset(wordnet_synonyms(word))


@dataclass
class ConceptSet:
    """One image set's VQA answers as per-image concept counts, with its bootstrap resamples."""

    spec: SetSpec
    records: list
    answers: dict[str, list[str]]          # axis -> one answer per image
    captions: list[str]
    embeddings: np.ndarray
    counts: list[Counter]                  # per image: concept -> occurrences (all answers + caption)
    index: np.ndarray                      # (n_boot, n) bootstrap image indices
    replicates: list[dict] = field(default_factory=list)

    @property
    def n(self) -> int:
        return len(self.records)

    def histogram(self, min_frequency: float, rows=None) -> dict[str, float]:
        """tibet.concept_histogram of the images `rows` (a resample; all by default), from the counts."""
        rows = range(self.n) if rows is None else rows
        total = Counter()
        for i in rows:
            total.update(self.counts[i])
        histogram = {w: c / self.n for w, c in total.items() if c / self.n >= min_frequency}
        return dict(sorted(histogram.items(), key=lambda kv: (-kv[1], kv[0])))

    def resampled(self, min_frequency: float) -> list[dict]:
        if not self.replicates:
            self.replicates = [self.histogram(min_frequency, row) for row in self.index]
        return self.replicates


def concept_set(spec: SetSpec, records, answers: dict[str, list[str]], captions: list[str],
                embeddings: np.ndarray, n_boot: int, boot_seed: int) -> ConceptSet:
    per_image = [[answers[a][i] for a in answers] + ([captions[i]] if captions else []) for i in range(len(records))]
    counts = [Counter(w for answer in image for w in tibet.concept_words(answer)) for image in per_image]
    index = resample_indices(len(records), n_boot, boot_seed) if n_boot else np.zeros((0, len(records)), int)
    return ConceptSet(spec, records, answers, captions, embeddings, counts, index)


def compare(initial: ConceptSet, cf: ConceptSet, request: CounterfactualsRequest) -> dict:
    """CAS and CAS^CLIP of one counterfactual against the initial set, with their replicates."""
    h_init, h_cf = initial.histogram(request.min_frequency), cf.histogram(request.min_frequency)
    synonyms = _synonyms if request.synonyms else None
    value = tibet.cas(h_init, h_cf, request.renormalise, synonyms)
    mapping = None
    if synonyms:
        joint = Counter(h_init) + Counter(h_cf)
        mapping = tibet.synonym_mapping(joint, synonyms, joint)

    def merged(h):
        return tibet.merge_synonyms(h, mapping=mapping) if mapping else h

    replicates = np.array([tibet.cas(merged(a), merged(b), request.renormalise) for a, b in
                           zip(initial.resampled(request.min_frequency), cf.resampled(request.min_frequency))])
    clip = tibet.cas_clip(initial.embeddings, cf.embeddings)
    clip_replicates = np.array([tibet.cas_clip(initial.embeddings[i], cf.embeddings[j])
                                for i, j in zip(initial.index, cf.index)])
    return {"cas": value, "cas_clip": clip, "_cas": replicates, "_cas_clip": clip_replicates}


def axis_scores(cfs: list[dict], sum_normalise: bool) -> dict:
    """MAD (VQA and CLIP) of one axis from its counterfactuals' CAS and their replicates."""
    out = {}
    for key, mad_key in (("cas", "mad"), ("cas_clip", "mad_clip")):
        out[mad_key] = tibet.mad_normalised([c[key] for c in cfs], sum_normalise)
        replicates = np.array([c[f"_{key}"] for c in cfs])          # (K, n_boot)
        draws = [tibet.mad_normalised(col, sum_normalise) for col in replicates.T]
        out[f"{mad_key}_ci"] = list(percentile_interval(np.asarray(draws))) if draws else [None, None]
        for c in cfs:
            c[f"{key}_ci"] = list(percentile_interval(c[f"_{key}"])) if len(c[f"_{key}"]) else [None, None]
    return out


def _public(cf: dict) -> dict:
    return {k: v for k, v in cf.items() if not k.startswith("_")}


def _set_json(s: ConceptSet, request: CounterfactualsRequest) -> dict:
    histogram = s.histogram(request.min_frequency)
    axis_top = {a: tibet.top_k_concepts(tibet.concept_histogram([[x] for x in answers], request.min_frequency),
                                        request.top_k)
                for a, answers in s.answers.items()}
    return {"prompt": s.spec.prompt, "axis": s.spec.axis, "cf": s.spec.cf, "value": s.spec.value,
            "histogram": histogram, "top_k": tibet.top_k_concepts(histogram, request.top_k),
            "axis_top_k": axis_top,
            "images": [{"key": r.key, "seed": r.seed, "path": r.path,
                        "answers": {a: s.answers[a][i] for a in s.answers},
                        **({"caption": s.captions[i]} if s.captions else {})} for i, r in enumerate(s.records)]}


def _summarise(cfs_by_axis: dict[str, list[dict]], sum_normalise: bool) -> dict:
    """The results' score part: counterfactuals list, cas/cas_clip per axis, mad per axis, order."""
    out = {"counterfactuals": [], "cas": {}, "cas_clip": {}, "mad": {}, "mad_ci": {}, "mad_clip": {},
           "mad_clip_ci": {}}
    for axis, cfs in cfs_by_axis.items():
        scores = axis_scores(cfs, sum_normalise)
        for key, value in scores.items():
            out[key][axis] = value
        out["cas"][axis] = {c["prompt"]: c["cas"] for c in cfs}
        out["cas_clip"][axis] = {c["prompt"]: c["cas_clip"] for c in cfs}
        out["counterfactuals"] += [_public(c) for c in cfs]
    out["mad_order"] = sorted(out["mad"], key=lambda a: -out["mad"][a])
    return out


@recorded("counterfactuals")
def run(request: CounterfactualsRequest, engine: Engine, run: Run):
    prompts, axes, specs = yield from prepare(request, engine)
    settings = settings_for(request, engine)
    seeds = request.seeds()
    questions = {axis: tibet_question(axis) for axis in axes}
    results: dict = {"prompt": request.prompt, "prompts": prompts, "aggregate": len(prompts) > 1, "n": request.n,
                     "seeds": seeds, "settings": settings.__dict__, "axes": axes, "questions": questions,
                     "options": {k: getattr(request, k) for k in ("caption", "synonyms", "min_frequency",
                                                                  "renormalise", "sum_normalise", "n_boot")},
                     "sets": {}, "per_prompt": {}}
    yield Table("questions", ["axis", "question"], [[a, q] for a, q in questions.items()])

    def measure(spec: SetSpec, index: int):
        records = yield from generate_set(engine, run, spec, seeds, settings, index, len(specs))
        yield Progress(index, len(specs), "vqa", f"asking {len(questions)} question(s) about '{spec.prompt}'")
        answers = {axis: engine.ask(records, q) for axis, q in questions.items()}
        captions = engine.caption(records) if request.caption else []
        s = concept_set(spec, records, answers, captions, engine.embed_images(records), request.n_boot,
                        request.seed * 7919 + index)
        results["sets"][spec.label] = _set_json(s, request)
        return s

    per_prompt_cfs: list[dict[str, list[dict]]] = []
    index = 0
    for p, prompt in enumerate(prompts):
        initial = yield from measure(specs[index], index)
        index += 1
        yield Scores("initial", {"prompt": prompt, "label": initial.spec.label,
                                 **{k: results["sets"][initial.spec.label][k] for k in ("top_k", "axis_top_k")}})
        cfs_by_axis: dict[str, list[dict]] = {}
        while index < len(specs) and specs[index].prompt_index == p:
            spec = specs[index]
            cf = yield from measure(spec, index)
            index += 1
            cfs_by_axis.setdefault(spec.axis, []).append(
                {"axis": spec.axis, "prompt": spec.cf, "value": spec.value, "label": spec.label,
                 **compare(initial, cf, request)})
            if index == len(specs) or specs[index].axis != spec.axis or specs[index].prompt_index != p:
                scores = axis_scores(cfs_by_axis[spec.axis], request.sum_normalise)
                yield Scores(f"axis:{spec.axis}", {"prompt": prompt, "axis": spec.axis, **scores,
                                                   "counterfactuals": [_public(c) for c in cfs_by_axis[spec.axis]]})
        per_prompt_cfs.append(cfs_by_axis)
        results["per_prompt"][prompt] = _summarise(cfs_by_axis, request.sum_normalise)
        run.save(results)

    if len(prompts) == 1:
        results.update(results["per_prompt"][prompts[0]])
    else:
        results.update(_summarise(_average(per_prompt_cfs), request.sum_normalise))
        yield Scores("aggregate", {k: results[k] for k in ("mad", "mad_ci", "mad_order", "counterfactuals")})
    summary = {"prompts": len(prompts), "sets": len(specs), "n": request.n,
               **{f"mad_{a}": round(results["mad"][a], 3) for a in results["mad_order"]}}
    yield run.finish(results, summary)


def _average(per_prompt: list[dict[str, list[dict]]]) -> dict[str, list[dict]]:
    """CAS per counterfactual (and its replicates) averaged over the prompts of an aggregate run."""
    averaged: dict[str, list[dict]] = {}
    for axis, cfs in per_prompt[0].items():
        rows = []
        for k, cf in enumerate(cfs):
            same = [p[axis][k] for p in per_prompt]
            rows.append({"axis": axis, "prompt": cf["prompt"], "value": cf["value"],
                         **{key: np.mean([c[key] for c in same], axis=0)
                            for key in ("cas", "cas_clip", "_cas", "_cas_clip")}})
            rows[-1]["cas"], rows[-1]["cas_clip"] = float(rows[-1]["cas"]), float(rows[-1]["cas_clip"])
        averaged[axis] = rows
    return averaged


def add_cli(sub, common_arguments) -> None:
    """`python -m engine counterfactuals --prompt ... -n 8 [--axes JSON] [--json]`"""
    p = sub.add_parser("counterfactuals", help="TIBET: counterfactual prompts, CAS per counterfactual, MAD per axis")
    add_set_arguments(p, common_arguments)
    p.add_argument("--no-caption", action="store_true", help="leave captions out of the concepts")
    p.add_argument("--no-synonyms", action="store_true", help="do not merge WordNet synonyms")
    p.add_argument("--min-frequency", type=float, default=0.01)
    p.add_argument("--raw-histograms", action="store_true", help="HistIoU without rescaling both to sum 1")
    p.add_argument("--no-sum-normalise", action="store_true", help="MAD of the raw CAS values")
    p.add_argument("--n-boot", type=int, default=500)
    p.add_argument("--top-k", type=int, default=5)
    p.set_defaults(method=run, make_request=lambda a: CounterfactualsRequest(
        **set_request_fields(a), caption=not a.no_caption, synonyms=not a.no_synonyms,
        min_frequency=a.min_frequency, renormalise=not a.raw_histograms, sum_normalise=not a.no_sum_normalise,
        n_boot=a.n_boot, top_k=a.top_k))
