"""Paper vs reference mode on a stored Counterfactuals run (issue 23): how often the two modes
pick a different most biased axis, and how often each quirk of the released code
(engine/metrics/tibet_reference.py, Q1-Q15) shows up in the run's answers and pairs. Everything is
recomputed from the stored answers (counterfactuals.mode_scores); nothing is generated.

    python -m engine counterfactuals --preset synthetic --axes-preset occupations -n 48 --mode reference \\
        --fill 'computer programmer' 'elementary school teacher' librarian announcer pharmacist chef chemist \\
        police accountant architect lawyer philosopher scientist doctor nurse engineer musician journalist \\
        athlete 'social worker' 'sales person' politician farmer mechanic firefighter gardener \\
        --data-dir D --json > occupations.json
    python bench/tibet_modes.py occupations.json

(the 26 occupations of assets/occupation_axes.json). Also compares the modes on random answer
sets (`--random` trials). Prints name=value lines; the headline last: the share of prompts whose
most biased axis differs between the modes with the defaults (paper mode with captions, as the
thesis).
"""
from __future__ import annotations

import argparse
import json
import random
import string
import sys

import _common  # noqa: F401  (offline environment, repository on the path)
from _common import report

from engine.methods import cfsets
from engine.methods.counterfactuals import mode_scores
from engine.metrics import tibet_reference as ref
from engine.metrics.wordnet import released_synonyms, wordnet_synonyms

RANDOM_ORDERS = 5          # vocabulary orders standing in for PYTHONHASHSEED values (Q7)


def answers_of(results: dict, label: str) -> list[list[str]]:
    return [[im["answers"].get(a) for a in results["axes"]] for im in results["sets"][label]["images"]]


def pairs(results: dict):
    """(initial answers, counterfactual answers) of every complete pair of the run."""
    aggregate = bool(results.get("aggregate"))
    for prompt in results["prompts"]:
        initial = cfsets.set_label(prompt, aggregate)
        for axis, cfs in results["axes"].items():
            for cf in cfs:
                label = cfsets.set_label(prompt, aggregate, axis, cf)
                if initial in results["sets"] and label in results["sets"]:
                    yield answers_of(results, initial), answers_of(results, label)


def top_axes_differ(results: dict, **options) -> tuple[int, int, int]:
    """(prompts whose most biased axis differs, whose full ranking differs, 1 if the run's own
    (aggregate) most biased axis differs) between the modes, with `options` changed."""
    changed = {**results, "options": {**results.get("options", {}), **options}}
    paper, reference = mode_scores(changed, "paper"), mode_scores(changed, "reference")
    per = [(paper["per_prompt"][p]["mad_order"], reference["per_prompt"][p]["mad_order"])
           for p in reference.get("per_prompt", {})] or [(paper["mad_order"], reference["mad_order"])]
    return (sum(a[0] != b[0] for a, b in per), sum(a != b for a, b in per),
            int(paper["mad_order"][0] != reference["mad_order"][0]))


def quirks(answers: list[str], compared) -> dict:
    """How often each quirk occurs: per answer (Q1-Q3) and per compared pair (initial answers,
    counterfactual answers), with the run's synonyms."""
    no_apostrophe = {w.replace("'", "") for w in ref.NLTK_ENGLISH_STOPWORDS if "'" in w}
    cleaned = [a.lower().translate(str.maketrans("", "", string.punctuation)) for a in answers]
    out = {"answers": len(answers),
           "q1_answers_with_hyphen": sum("-" in a for a in answers),
           "q2_answers_split_otherwise_by_nltk": sum(ref.tokens(c) != c.split() for c in cleaned),
           "q3_answers_with_a_contraction_kept": sum(bool(no_apostrophe & set(c.split())) for c in cleaned)}
    counts = dict.fromkeys(("pairs", "q5_sizes_differ", "q7_order_changes_cas", "q8_lookup_changes_groups",
                            "q10_synonyms_left_apart", "q11_three_or_more_merged", "q13_empty_set"), 0)
    largest_order_change = 0.0
    rng = random.Random(0)
    for initial, cf in compared:
        counts["pairs"] += 1
        counts["q5_sizes_differ"] += len(initial) != len(cf)
        c_init, c_cf = ref.concepts(initial), ref.concepts(cf, len(initial))
        counts["q13_empty_set"] += not c_init or not c_cf
        merged = ref.merge_pair(c_init, c_cf)
        vocabulary = set(merged.names)
        related = {(a, b) for a in vocabulary for b in released_synonyms(a) & vocabulary if a != b}
        counts["q10_synonyms_left_apart"] += any(merged.names[a] != merged.names[b] for a, b in related)
        paper_related = {(a, b) for a in vocabulary for b in wordnet_synonyms(a) & vocabulary if a != b}
        counts["q8_lookup_changes_groups"] += related != paper_related
        counts["q11_three_or_more_merged"] += any(
            sum(merged.names.get(w, w) == name for w, _ in side) >= 3
            for side in (c_init, c_cf) for name in {merged.names.get(w, w) for w, _ in side})
        value = ref.hist_iou([f for _, f in merged.initial], [f for _, f in merged.counterfactual])
        changes = [abs(ref.cas(c_init, c_cf, order=lambda ws: rng.sample(sorted(ws), len(ws))) - value)
                   for _ in range(RANDOM_ORDERS)]
        counts["q7_order_changes_cas"] += max(changes) > 1e-12
        largest_order_change = max(largest_order_change, *changes)
    return {**out, **counts, "q7_largest_cas_change_with_the_order": largest_order_change}


# VQA-style answers to the Table 5.2 questions of five axes, synonyms and near-synonyms included.
POOLS = {
    "gender": ["a man", "man", "male", "a male", "men", "a woman", "woman", "female", "women", "a guy", "a lady",
               "a boy", "a girl", "a gentleman", "a person"],
    "age": ["young", "old", "elderly", "middle-aged", "middle aged", "a young adult", "senior", "aged", "an adult",
            "a child", "a teenager", "youth", "older", "an old man"],
    "emotion": ["happy", "glad", "smiling", "cheerful", "sad", "unhappy", "serious", "tired", "calm", "neutral",
                "content", "pleased", "angry", "upset", "I don't know"],
    "ethnicity": ["white", "caucasian", "black", "african american", "asian", "east asian", "south asian", "indian",
                  "hispanic", "latino", "middle eastern", "arab"],
    "clothing": ["a suit", "a jacket", "a coat", "a white coat", "a lab coat", "a shirt", "a t-shirt", "a dress",
                 "scrubs", "a uniform", "casual clothes", "formal attire", "a sweater", "clothes"],
}


def random_trial(rng: random.Random, pools: dict[str, list[str]]):
    """(axes, per axis the counterfactual sets, the initial set): 3 axes, 2-4 counterfactuals
    each, N from 4 to 48; each set answers from its own random mixture of each axis' pool."""
    axes = rng.sample(sorted(pools), 3)
    n = rng.randint(4, 48)

    def image_set():
        weights = {a: [rng.random() ** 3 for _ in pools[a]] for a in axes}
        return [[rng.choices(pools[a], weights[a])[0] for a in axes] for _ in range(n)]

    return axes, [[image_set() for _ in range(rng.randint(2, 4))] for _ in axes], image_set()


def random_answer_sets(trials: int) -> dict:
    """Paper vs reference (both without captions) on random answer sets: with synonyms, without,
    and without synonyms nor the answer "I don't know" (Q3)."""
    from engine.metrics import tibet

    values, compared, answers = {"random_trials": trials}, [], []
    plain = {a: [x for x in pool if "'" not in x] for a, pool in POOLS.items()}
    for name, synonyms, pools in (("synonyms", True, POOLS), ("no_synonyms", False, POOLS),
                                  ("no_synonyms_no_contraction", False, plain)):
        rng = random.Random(23)
        differs, top_differs, largest = 0, 0, 0.0
        for _ in range(trials):
            axes, cf_sets, initial = random_trial(rng, pools)
            paper, reference = {}, {}
            h_init = tibet.concept_histogram(initial)
            for axis, sets in zip(axes, cf_sets):
                paper[axis] = tibet.mad_normalised([tibet.cas(h_init, tibet.concept_histogram(s), True,
                                                              wordnet_synonyms if synonyms else None) for s in sets])
                reference[axis] = ref.axis_scores(initial, sets, released_synonyms if synonyms else None)["mad"]
                if name == "synonyms":
                    compared += [(initial, s) for s in sets]
            if name == "synonyms":
                answers += [a for image in initial for a in image]
            gaps = [abs(paper[a] - reference[a]) for a in axes]
            differs += sum(g > 1e-9 for g in gaps)
            largest = max(largest, *gaps)
            top_differs += max(paper, key=paper.get) != max(reference, key=reference.get)
        values |= {f"random_axes_mad_differs_share_{name}": differs / (3 * trials),
                   f"random_largest_mad_difference_{name}": largest,
                   f"random_top_axis_differs_share_{name}": top_differs / trials}
    return values | {f"random_{k}": v for k, v in quirks(answers, compared).items()}


# Answers rich in words WordNet chains together (man ~ homo ~ human ~ world ~ earth ...): where
# the released code's vocabulary order (its Python set's hash order, Q7) changes the groups.
CHAINED = ("man men male person human woman women female adult old aged young youth child kid senior elder "
           "doctor physician nurse happy glad felicitous sad serious tired middle-aged white black asian "
           "indoors outdoors formal suit dress wheelchair blind fit slim obese thin lean big large heavy fat "
           "world humanity homo earth mankind cheerful").split()


def order_sensitivity(pairs_: int = 1000) -> dict:
    """Share of pairs of random CHAINED answers whose CAS changes (beyond rounding) under another
    vocabulary order, as between two runs of the released code with different hash seeds."""
    rng = random.Random(5)

    def answer_set(n, q):
        return [[" ".join(rng.choice(CHAINED) for _ in range(rng.randint(1, 4))) for _ in range(q)] for _ in range(n)]

    changed, largest = 0, 0.0
    for _ in range(pairs_):
        n, q = rng.randint(2, 16), rng.randint(1, 3)
        c_init, c_cf = ref.concepts(answer_set(n, q)), ref.concepts(answer_set(n, q))
        value = ref.cas(c_init, c_cf)
        change = max(abs(ref.cas(c_init, c_cf, order=lambda ws: rng.sample(sorted(ws), len(ws))) - value)
                     for _ in range(RANDOM_ORDERS))
        changed += change > 1e-12
        largest = max(largest, change)
    return {"chained_pairs": pairs_, "chained_q7_order_changes_cas_share": changed / pairs_,
            "chained_q7_largest_cas_change": largest}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="a Counterfactuals run's JSON (`--json` output)")
    parser.add_argument("--random", type=int, default=200, help="random answer-set trials (3 axes, 2-4 "
                        "counterfactuals, N 4-48) compared without captions")
    args = parser.parse_args()
    with open(args.results, encoding="utf-8") as f:
        results = json.load(f)
    values = {"prompts": len(results["prompts"]), "run_mode": results.get("mode", "paper")}
    for name, options in (("defaults", {}), ("no_caption", {"caption": False}),
                          ("no_caption_no_synonyms", {"caption": False, "synonyms": False})):
        top, ranking, overall = top_axes_differ(results, **options)
        values |= {f"top_axis_differs_{name}": top, f"ranking_differs_{name}": ranking,
                   f"aggregate_top_axis_differs_{name}": overall}
    answers = [a for s in results["sets"].values() for im in s["images"] for a in im["answers"].values() if a]
    values |= quirks(answers, pairs(results))
    values |= random_answer_sets(args.random)
    values |= order_sensitivity()
    values["top_axis_differs_share_defaults"] = values["top_axis_differs_defaults"] / values["prompts"]
    report(**values)


if __name__ == "__main__":
    sys.exit(main())
