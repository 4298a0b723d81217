"""TIBET metrics (Chinchure et al., ECCV 2024; thesis Ch. 5; docs/spec/thesis-tibet-biasconnect-intermit.md
§2.5–2.8, §2.16).

For one prompt, the VQA answers about each image set become a concept histogram (word ->
occurrences per image). The Concept Association Score (CAS) compares the histogram of the
initial prompt's images with that of one counterfactual's images; the normalised Mean
Absolute Deviation (MAD) of an axis' CAS values measures how strongly the initial images
lean toward some counterfactuals of that axis.
"""
from __future__ import annotations

import math
import string
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from engine.metrics.diversity import unit_rows
from engine.metrics.wordnet import wordnet_synonyms

URL = "https://arxiv.org/abs/2312.01261"
CITATION = """\
@inproceedings{chinchure2024tibet,
  title={TIBET: Identifying and Evaluating Biases in Text-to-Image Generative Models},
  author={Chinchure, Aditya and Shukla, Pushkar and Bhatt, Gaurav and Salij, Kiri and Hosanagar, Kartik and Sigal, Leonid and Turk, Matthew},
  booktitle={European Conference on Computer Vision (ECCV)},
  year={2024}
}
"""

# English stop words (the NLTK list), written without apostrophes because punctuation is
# stripped before words are compared.
ENGLISH_STOPWORDS = frozenset("""
i me my myself we our ours ourselves you youre youve youll youd your yours yourself
yourselves he him his himself she shes her hers herself it its itself they them their theirs
themselves what which who whom this that thatll these those am is are was were be been being
have has had having do does did doing a an the and but if or because as until while of at by
for with about against between into through during before after above below to from up down
in out on off over under again further then once here there when where why how all any both
each few more most other some such no nor not only own same so than too very s t can will
just don dont should shouldve now d ll m o re ve y ain aren arent couldn couldnt didn didnt
doesn doesnt hadn hadnt hasn hasnt haven havent isn isnt ma mightn mightnt mustn mustnt needn
neednt shan shant shouldn shouldnt wasn wasnt weren werent won wont wouldn wouldnt
""".split())

# Released TIBET code: "image" joins the stop words; yes/no/none answers carry no concept, nor does
# the face-attribute evaluator's "no face found" (engine.backends.faces).
EXTRA_STOPWORDS = frozenset({"image"})
NON_CONCEPT_ANSWERS = frozenset({"yes", "no", "none", "no face found"})
# BLIP captioners' artefact word ("arafed man in a suit"; not English) and its spellings: never a
# concept, in Top-K or in CAS.
CAPTIONER_ARTEFACTS = frozenset({"arafed", "araffe", "arafe", "araffed", "arafly"})
DEFAULT_STOPWORDS = ENGLISH_STOPWORDS | EXTRA_STOPWORDS | NON_CONCEPT_ANSWERS | CAPTIONER_ARTEFACTS

_STRIP_PUNCTUATION = str.maketrans("", "", string.punctuation.replace("-", ""))


def _by_frequency(histogram: Mapping[str, float]) -> list[tuple[str, float]]:
    return sorted(histogram.items(), key=lambda item: (-item[1], item[0]))


def concept_words(answer: str, stopwords: frozenset[str] = DEFAULT_STOPWORDS) -> list[str]:
    """Return the concept words of one answer: lower-cased, punctuation removed, stop words dropped.

    Hyphens inside a word are kept, so "middle-aged" stays one readable concept instead of
    counting as "middle" and "aged"; all other punctuation is deleted.
    """
    words = [word.strip("-") for word in str(answer).lower().translate(_STRIP_PUNCTUATION).split()]
    if " ".join(words) in stopwords:    # a whole-answer entry such as "no face found"
        return []
    return [word for word in words if word and word not in stopwords]


def concept_histogram(
    answers_per_image: Sequence[Sequence[str | None]],
    min_frequency: float = 0.01,
    stopwords: Iterable[str] = DEFAULT_STOPWORDS,
) -> dict[str, float]:
    """Return the concept set C = {word: occurrences per image} of one image set (App. A.1).

    `answers_per_image[i]` holds the VQA answers about image i (None for a failed answer).
    Word counts over all answers are divided by the number of images; words below
    `min_frequency` are dropped (0.01 in the released code). `stopwords` defaults to the
    English list, "image", and the answers yes/no/none. Sorted by frequency, then word.
    """
    n_images = len(answers_per_image)
    if n_images == 0:
        return {}
    stopwords = frozenset(stopwords)
    counts = Counter(
        word
        for answers in answers_per_image
        for answer in answers if answer is not None
        for word in concept_words(answer, stopwords)
    )
    histogram = {word: count / n_images for word, count in counts.items() if count / n_images >= min_frequency}
    return dict(_by_frequency(histogram))


def synonym_mapping(
    words: Iterable[str],
    synonyms_fn: Callable[[str], set[str]] = wordnet_synonyms,
    weights: Mapping[str, float] | None = None,
) -> dict[str, str]:
    """Return {word: representative}, grouping each word with its synonyms among `words`.

    Greedy, as Alg. 3 step 1 merges pairwise: words are visited by descending weight (then
    alphabetically); a word not yet grouped becomes a representative and takes every
    ungrouped word that is its synonym (in either direction, so "men" joins "man"). Groups
    are not closed transitively: WordNet chains ("man" ~ "human" ~ "world") would otherwise
    swallow unrelated concepts.
    """
    weights = weights or {}
    order = sorted(set(words), key=lambda word: (-weights.get(word, 0.0), word))
    synonyms = {word: set(synonyms_fn(word)) for word in order}
    mapping: dict[str, str] = {}
    for word in order:
        if word in mapping:
            continue
        mapping[word] = word
        for other in order:
            if other not in mapping and (other in synonyms[word] or word in synonyms[other]):
                mapping[other] = word
    return mapping


def merge_synonyms(
    histogram: Mapping[str, float],
    synonyms_fn: Callable[[str], set[str]] = wordnet_synonyms,
    mapping: Mapping[str, str] | None = None,
) -> dict[str, float]:
    """Return the histogram with synonymous concepts merged (frequencies added) (Alg. 3 step 1).

    `mapping` (from `synonym_mapping`) lets two histograms share one grouping; by default it
    is built from this histogram's own words, weighted by their frequencies.
    """
    if mapping is None:
        mapping = synonym_mapping(histogram, synonyms_fn, histogram)
    merged: dict[str, float] = {}
    for word, frequency in histogram.items():
        representative = mapping.get(word, word)
        merged[representative] = merged.get(representative, 0.0) + frequency
    return dict(_by_frequency(merged))


def cas(
    histogram_a: Mapping[str, float],
    histogram_b: Mapping[str, float],
    renormalise: bool = True,
    synonyms_fn: Callable[[str], set[str]] | None = None,
) -> float:
    """Return the Concept Association Score Σ_j min(w_a, w_b) / Σ_j max(w_a, w_b) (Eq. 5.1–5.3).

    The histogram IoU over the union of both vocabularies (a missing concept has weight 0).
    `renormalise` scales both histograms to sum 1 first, as the released code does; this
    matters only when their totals differ. With `synonyms_fn` both histograms are merged
    with one shared grouping of their joint vocabulary (Alg. 3 merges each set on its own,
    which can name the same group "man" in one set and "male" in the other). Returns 1e-7
    when the intersection or union is 0, as the released code.
    """
    if synonyms_fn is not None:
        joint = Counter(histogram_a) + Counter(histogram_b)
        mapping = synonym_mapping(joint, synonyms_fn, joint)
        histogram_a = merge_synonyms(histogram_a, mapping=mapping)
        histogram_b = merge_synonyms(histogram_b, mapping=mapping)
    vocabulary = sorted(set(histogram_a) | set(histogram_b))
    a = np.array([histogram_a.get(word, 0.0) for word in vocabulary], dtype=float)
    b = np.array([histogram_b.get(word, 0.0) for word in vocabulary], dtype=float)
    if renormalise:
        if a.sum() == 0 or b.sum() == 0:
            return 1e-7
        a, b = a / a.sum(), b / b.sum()
    intersection, union = np.minimum(a, b).sum(), np.maximum(a, b).sum()
    if intersection == 0 or union == 0:
        return 1e-7
    return float(intersection / union)


def cas_clip(embeddings_a: np.ndarray, embeddings_b: np.ndarray) -> float:
    """Return CAS^CLIP: mean cosine over all image pairs across the two sets (Eq. 5.4), clipped to [0, 1].

    The thesis claims the range [0, 1]; a cosine can be negative, so negative means are
    clipped to 0 (no association). The mean over all pairs equals the dot product of the
    two mean unit embeddings.
    """
    a, b = unit_rows(embeddings_a), unit_rows(embeddings_b)
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"embedding widths differ: {a.shape[1]} vs {b.shape[1]}")
    return float(np.clip(a.mean(axis=0) @ b.mean(axis=0), 0.0, 1.0))


def mad_normalised(cas_values: Sequence[float], sum_normalise: bool = True) -> float:
    """Return the bias strength of one axis, sqrt(MAD / MAD_K) (Eq. 5.5–5.6, A.1).

    MAD = mean_i |CAS_i − mean(CAS)| over the K counterfactuals of the axis; MAD_K =
    2(K − 1)/K² is the MAD of the most skewed vector [1, 0, …, 0]. `sum_normalise` divides
    the CAS values by their sum first (released code); only then is the result in [0, 1].
    0 for K = 1 (one counterfactual cannot be skewed) and for all-zero CAS.

    Worked examples (spec §2.7): three counterfactuals with CAS 0.5, 0.6, 0.4, and two with
    0.56, 0.44; a uniform axis scores 0, a one-hot one 1 for any K.

    >>> round(mad_normalised([0.5, 0.6, 0.4]), 3), round(mad_normalised([0.56, 0.44]), 3)
    (0.316, 0.346)
    >>> mad_normalised([0.8, 0.0, 0.0, 0.0])
    1.0
    """
    values = np.asarray(cas_values, dtype=float)
    k = len(values)
    if k < 2:
        return 0.0
    if sum_normalise:
        total = values.sum()
        if total == 0:
            return 0.0
        values = values / total
    mad = np.abs(values - values.mean()).mean()
    return math.sqrt(mad / (2.0 * (k - 1) / k**2))


def top_k_concepts(histogram: Mapping[str, float], k: int = 5) -> list[tuple[str, float]]:
    """Return the k most frequent concepts as (word, frequency), ties alphabetical (§2.8).

    For the axis-aligned Top-K, build the histogram from the answers to that axis' question only.
    """
    return _by_frequency(histogram)[:k]
