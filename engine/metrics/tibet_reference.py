"""TIBET as the authors' released code computes it: Counterfactuals' `reference` mode (issue 23).

A port of GitHub TIBET-AI/TIBET, commit 8558c4d, `tibet/metrics/` (clean_concepts.py,
concept_matching.py, CAS_func.py, MAD_func.py), equal to it number for number on any VQA
answers; `engine.metrics.tibet` is the thesis's version (`paper` mode, the default). The spec
summarises the code in docs/spec/thesis-tibet-biasconnect-intermit.md §2.16. What the
released code does, with where, and where it departs from the thesis (the quirks):

Concepts (clean_concepts.py)
  Q1  Each answer is lower-cased and every character of `string.punctuation` is deleted,
      hyphens too ("middle-aged" -> "middleaged", "T-shirt" -> "tshirt"), `preprocess_text`
      L29-32.
  Q2  Tokens come from NLTK's `word_tokenize` (L35), which after Q1 still splits off the
      curly quotes «“‘„»”’ and splits "cannot", "gimme", "gonna", "gotta", "lemme" and
      "wanna" in two ("gonna" -> "gon", "na"). `tokens` reproduces NLTK 3.9.1, the version
      the code pins; NLTK 3.10 also splits at the dashes U+2012-2015.
  Q3  Stop words are NLTK's English list plus "image" (L41-44). The list's contractions
      keep their apostrophe ("don't"), so after Q1 they never match: "dont", "isnt",
      "youre" and the like stay concepts ("I don't know" -> "dont", "know").
  Q4  The answers of all images are joined into one text (`merge_clean_VQAans`, L93-106)
      and tokenised again (L66); "yes", "no" and "none" are dropped only then
      (`word_frequency`, L68-72), after the stop words.
  Q5  Counts are divided by the number of images (L84) and concepts under 0.01 are dropped
      (`get_freq_dict`, L90; the threshold is passed at MAD_func.py L63, L71, L90, L95). A
      counterfactual set's counts are divided by the number of images of the *initial* set
      (MAD_func.py L47, used at L71 and L95). Concepts stay in order of first appearance.
  Q6  A caption is not part of the concepts: the caption question is commented out
      (tibet/minigptv2.py, `build_mini_gpt_questions`).

Synonym merge (concept_matching.py `clean_concepts_syn`, L22-91), per compared pair
  Q7  The vocabulary is the set of both lists' concepts (L28), iterated in a Python set's
      order, which follows string hashes: it changes from one process to the next (unless
      PYTHONHASHSEED is fixed) and between Python versions. `merge_pair` takes the order as
      `order`; the default, alphabetical, makes reference mode reproducible.
  Q8  Synonyms are the lemma names of NLTK's `wordnet.synsets(word)` plus male -> man and
      female -> woman (`get_syn`, L6-20; `engine.metrics.wordnet.released_synonyms`).
  Q9  Pairs: for every (v1, v2) of vocabulary x vocabulary in that order, (v1, v2) is
      recorded when `v1 in syns[v2] or v2 in syns[v1] and (v2, v1) not in syns_tuples`
      (L36-40): by operator precedence the "not yet recorded" test guards the second half
      only, so a pair is recorded in both directions when v1 is a synonym of v2 both ways,
      and (v, v) when v is its own lemma.
  Q10 Renaming (L44-56): each concept walks through all pairs in order and takes the first
      word of every pair holding its *current* name, so names chain along the pairs. The
      groups are neither closed (a ~ b ~ c can leave c apart) nor independent of the order.
  Q11 Summing (L58-76): the loop keeps the first entry of a name as it was before the loop,
      so a name with three or more concepts gets the frequency of its first and its last
      concept only; those in between are lost.
  Q12 A concept missing on one side gets frequency 0 there, and both lists are sorted by
      name (L78-89).

CAS and MAD (CAS_func.py, MAD_func.py)
  Q13 HistIoU rescales both vectors to sum 1 (CAS_func.py L6-7); an all-zero vector becomes
      the *number* 1e-7, compared with every entry of the other: CAS is n x 1e-7 when one
      set has no concept and the other has n (each at least 1e-7), and 1.0 when neither
      has one. CAS is 1e-7 when the intersection is 0 (L15-16).
  Q14 An axis' CAS are divided by their sum (MAD_func.py L100; L77 per question), then MAD =
      sqrt(mean|x - mean x|) / sqrt(the same for [0, ..., 0, 1]) (`MAD_func`, L12-41), which
      is undefined (0/0, NaN) for an axis with one counterfactual.
  Q15 Besides the overall MAD, one per question, from the answers to that question alone
      (MAD_func.py L57-81); the code asks one question per axis, in axis order
      (tibet/gen_questions.py `generate_questions`), so question q is the question of axis q.
  Q16 Axes are ranked by MAD, ties by axis name, both descending (`get_CAS_data`,
      tibet/metrics/plotting.py L32); the plot then shows each MAD divided by their sum (L34).
"""
from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from engine.metrics import tibet
from engine.metrics.wordnet import released_synonyms

COMMIT = "8558c4da6e612f6f0ad3e8b50d5b5951a265db2d"
URL = f"https://github.com/TIBET-AI/TIBET/tree/{COMMIT}/tibet/metrics"
CITATION = tibet.CITATION   # the paper the released code belongs to

# NLTK's English stop words (`stopwords.words("english")`, 179 words) as the released code
# loads them, apostrophes included (Q3), plus "image".
NLTK_ENGLISH_STOPWORDS = tuple("""
i me my myself we our ours ourselves you you're you've you'll you'd your yours yourself
yourselves he him his himself she she's her hers herself it it's its itself they them their
theirs themselves what which who whom this that that'll these those am is are was were be
been being have has had having do does did doing a an the and but if or because as until
while of at by for with about against between into through during before after above below
to from up down in out on off over under again further then once here there when where why
how all any both each few more most other some such no nor not only own same so than too
very s t can will just don don't should should've now d ll m o re ve y ain aren aren't
couldn couldn't didn didn't doesn doesn't hadn hadn't hasn hasn't haven haven't isn isn't ma
mightn mightn't mustn mustn't needn needn't shan shan't shouldn shouldn't wasn wasn't weren
weren't won won't wouldn wouldn't
""".split())
STOPWORDS = frozenset(NLTK_ENGLISH_STOPWORDS) | {"image"}
DROPPED_TOKENS = ("yes", "no", "none")
MIN_FREQUENCY = 0.01
EMPTY = 0.0000001          # CAS_func.py's stand-in for an empty histogram and for no overlap

_PUNCTUATION = str.maketrans("", "", string.punctuation)
# NLTK 3.9.1 NLTKWordTokenizer (word_tokenize) rules that can still apply once string.punctuation
# is gone: the curly quotes and the contractions spelt without an apostrophe. Sentence splitting
# (punkt) has nothing to split at without ".", "?" and "!".
_OPENING_QUOTES = re.compile("([«“‘„])")
_CLOSING_QUOTES = re.compile("([»”’])")
_CONTRACTIONS = tuple(re.compile(p) for p in (
    r"(?i)\b(can)(not)\b", r"(?i)\b(gim)(me)\b", r"(?i)\b(gon)(na)\b", r"(?i)\b(got)(ta)\b",
    r"(?i)\b(lem)(me)\b", r"(?i)\b(wan)(na)(?=\s)"))

Concepts = list[tuple[str, float]]   # (concept, frequency per image), the released code's C


def tokens(text: str) -> list[str]:
    """Return NLTK 3.9.1's `word_tokenize(text)` for a text without ASCII punctuation (Q2)."""
    text = " " + _OPENING_QUOTES.sub(r" \1 ", text) + " "
    text = _CLOSING_QUOTES.sub(r" \1 ", text)
    for contraction in _CONTRACTIONS:
        text = contraction.sub(r" \1 \2 ", text)
    return text.split()


def preprocess(answer: str | None) -> str:
    """Return `preprocess_text(answer)` (clean_concepts.py L27-53): lower-cased, punctuation
    deleted (Q1), tokenised (Q2), stop words dropped (Q3), joined by spaces. A missing
    answer (None) counts as empty."""
    words = tokens(str(answer or "").lower().translate(_PUNCTUATION))
    return " ".join(w for w in words if w not in STOPWORDS)


def concepts(answers_per_image: Sequence[Sequence[str | None]], n_images: int | None = None,
             question: int | None = None, threshold: float = MIN_FREQUENCY) -> Concepts:
    """Return the concept list C of one image set (`merge_clean_VQAans` + `get_freq_dict`).

    `answers_per_image[i]` are the answers about image i, one per question in question order;
    `question` keeps that question's answers only (Q15). Frequencies are counts over all the
    answers, after "yes"/"no"/"none" are dropped (Q4), divided by `n_images` (default: the
    number of images; Q5), at least `threshold`, in order of first appearance.
    """
    n_images = len(answers_per_image) if n_images is None else n_images
    if question is None:
        text = "".join(_image_text(answers) for answers in answers_per_image)
    else:
        text = "".join(preprocess(answers[question]) + " " for answers in answers_per_image)
    counts = Counter(t for t in tokens(text) if t not in DROPPED_TOKENS)   # insertion order: first seen
    return [(word, count / n_images) for word, count in counts.items() if count / n_images >= threshold]


def _image_text(answers: Sequence[str | None]) -> str:
    """What one image adds to its set's text (L101-104)."""
    return "".join(" " + preprocess(a) for a in answers) + " "


def image_concepts(answers: Sequence[str | None]) -> list[str]:
    """Return the concept words the answers about one image add to their set's text, in order
    (Q1-Q4): `concepts` counts these over the images."""
    return [t for t in tokens(_image_text(answers)) if t not in DROPPED_TOKENS]


def representatives(vocabulary: Sequence[str], synonyms: Mapping[str, Collection[str]]) -> dict[str, str]:
    """Return {word: the name it ends with} after `clean_concepts_syn`'s renaming (Q9, Q10).

    `vocabulary` in the order the released code iterates it, `synonyms[w]` = get_syn(w).
    Writing v_i for the i-th word, the pair (v_i, v_j), i != j, is recorded iff v_i and v_j
    are synonyms in either direction when i < j, and iff v_i is in synonyms[v_j] when i > j
    (Q9's precedence). The pairs are recorded row by row (i, then j), so a word currently
    named x is renamed v_i in row i exactly when (v_i, x) was recorded; the walk below visits
    only the rows of x's synonyms, which gives the same names as going through every pair.
    """
    position = {w: i for i, w in enumerate(vocabulary)}
    related: dict[str, set[int]] = {w: set() for w in vocabulary}
    for w in vocabulary:
        for other in synonyms[w]:
            if other != w and other in position:
                related[w].add(position[other])
                related[other].add(position[w])
    rows = {w: sorted(r) for w, r in related.items()}
    names = {}
    for word in vocabulary:
        name, next_row = word, 0
        while True:
            for i in rows[name]:
                if i >= next_row and (i < position[name] or vocabulary[i] in synonyms[name]):
                    name, next_row = vocabulary[i], i + 1
                    break
            else:
                break
        names[word] = name
    return names


def _first_and_last(concepts_: Concepts, names: Mapping[str, str]) -> dict[str, list[tuple[str, float]]]:
    """{name: [its first concept, its last one when it has more]}, in order of first appearance."""
    kept: dict[str, list[tuple[str, float]]] = {}
    for word, frequency in concepts_:
        name = names.get(word, word)
        kept[name] = [kept[name][0], (word, frequency)] if name in kept else [(word, frequency)]
    return kept


def _summed(concepts_: Concepts, names: Mapping[str, str]) -> Concepts:
    """The concepts renamed and summed per name as L58-76 do it: first + last entry of a name (Q11)."""
    summed = [(name, kept[0][1] + kept[1][1] if len(kept) == 2 else kept[0][1])
              for name, kept in _first_and_last(concepts_, names).items()]
    return [(name, value) for name, value in summed if value != 0]


def counted(concepts_: Concepts, names: Mapping[str, str]) -> set[str]:
    """Return the concepts whose frequency a merged list keeps: the first and last of each name (Q11)."""
    return {word for entries in _first_and_last(concepts_, names).values() for word, _ in entries}


@dataclass
class Merged:
    """One pair after `clean_concepts_syn`: both concept lists over one vocabulary, sorted by
    name (Q12), and each concept's name."""

    initial: Concepts
    counterfactual: Concepts
    names: dict[str, str]


def merge_pair(initial: Concepts, counterfactual: Concepts,
               synonyms_fn: Callable[[str], Collection[str]] | None = released_synonyms,
               order: Callable[[Iterable[str]], list[str]] = sorted) -> Merged:
    """Return `clean_concepts_syn(initial, counterfactual)` (concept_matching.py L22-91).

    `synonyms_fn` (get_syn; None: no synonyms, every concept keeps its name) and `order`,
    the vocabulary order the released code takes from a Python set (Q7).
    """
    names: dict[str, str] = {}
    if synonyms_fn is not None:
        vocabulary = order({w for w, _ in initial} | {w for w, _ in counterfactual})
        names = representatives(vocabulary, {w: synonyms_fn(w) for w in vocabulary})
    a, b = _summed(initial, names), _summed(counterfactual, names)
    a_names, b_names = {w for w, _ in a}, {w for w, _ in b}
    a += [(w, 0.0) for w in sorted(b_names - a_names)]
    b += [(w, 0.0) for w in sorted(a_names - b_names)]
    return Merged(sorted(a, key=lambda c: c[0]), sorted(b, key=lambda c: c[0]), names)


def hist_iou(p: Sequence[float], q: Sequence[float]) -> float:
    """Return `histogram_intersection_over_union(p, q)` (CAS_func.py L3-18), its empty cases
    included (Q13)."""
    p = np.array(p, dtype=float) / np.sum(p) if np.sum(p) != 0 else EMPTY
    q = np.array(q, dtype=float) / np.sum(q) if np.sum(q) != 0 else EMPTY
    intersection, union = np.sum(np.minimum(p, q)), np.sum(np.maximum(p, q))
    if union == 0 or intersection == 0:
        return EMPTY
    return float(intersection / union)


def cas(initial: Concepts, counterfactual: Concepts,
        synonyms_fn: Callable[[str], Collection[str]] | None = released_synonyms,
        order: Callable[[Iterable[str]], list[str]] = sorted) -> float:
    """Return `compute_association(C_init, C_cf, histogram_intersection_over_union)`
    (concept_matching.py L93-103): the HistIoU of the merged pair."""
    merged = merge_pair(initial, counterfactual, synonyms_fn, order)
    return hist_iou([f for _, f in merged.initial], [f for _, f in merged.counterfactual])


def hist_iou_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Return `hist_iou` of each row pair of two (m, V) matrices over one vocabulary, its empty
    cases included (Q13); a column that is 0 in both rows is left out, as the released
    vocabulary holds only the concepts of the pair."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    sa, sb = a.sum(axis=1, keepdims=True), b.sum(axis=1, keepdims=True)
    present = (a > 0) | (b > 0)
    pa = np.where(sa > 0, a / np.where(sa > 0, sa, 1.0), np.where(present, EMPTY, 0.0))
    pb = np.where(sb > 0, b / np.where(sb > 0, sb, 1.0), np.where(present, EMPTY, 0.0))
    intersection, union = np.minimum(pa, pb).sum(axis=1), np.maximum(pa, pb).sum(axis=1)
    out = np.where((intersection > 0) & (union > 0), intersection / np.where(union > 0, union, 1.0), EMPTY)
    return np.where((sa[:, 0] == 0) & (sb[:, 0] == 0), 1.0, out)


def normalised_by_sum(values: Sequence[float]) -> list[float]:
    """Return `[s / sum(values) for s in values]` (MAD_func.py L77, L100)."""
    total = sum(values)
    return [v / total for v in values]


def mad(values: Sequence[float]) -> float:
    """Return `MAD_func(values)` (MAD_func.py L12-41): sqrt(mean|x - mean x|) over the same
    for [0, ..., 0, 1]; NaN for a single value (Q14). Call it on sum-normalised CAS."""
    data = np.array(values, dtype=float)
    control = np.array([0] * (len(data) - 1) + [1])
    with np.errstate(invalid="ignore", divide="ignore"):
        return float(np.sqrt(np.mean(np.abs(data - np.mean(data))))
                     / np.sqrt(np.mean(np.abs(control - np.mean(control)))))


def ranking(mad: Mapping[str, float]) -> list[str]:
    """Return the axes most biased first as the released code ranks them (Q16)."""
    return [axis for _, axis in sorted(zip(mad.values(), mad), reverse=True)]


def axis_cas(initial: Sequence[Sequence[str | None]], counterfactuals: Sequence[Sequence[Sequence[str | None]]],
             question: int | None = None,
             synonyms_fn: Callable[[str], Collection[str]] | None = released_synonyms,
             order: Callable[[Iterable[str]], list[str]] = sorted) -> list[float]:
    """Return the raw CAS of each counterfactual set against the initial set, from all answers
    or from `question`'s only (MAD_func.py L60-75, L88-98).

    `initial[i]` / `counterfactuals[k][i]`: the answers about image i of the initial set / of
    counterfactual k, one per question. Every set's frequencies are divided by the initial
    set's size (Q5).
    """
    n_images = len(initial)
    c_init = concepts(initial, n_images, question)
    return [cas(c_init, concepts(cf, n_images, question), synonyms_fn, order) for cf in counterfactuals]


def axis_scores(initial: Sequence[Sequence[str | None]], counterfactuals: Sequence[Sequence[Sequence[str | None]]],
                synonyms_fn: Callable[[str], Collection[str]] | None = released_synonyms,
                order: Callable[[Iterable[str]], list[str]] = sorted) -> dict:
    """Return what `get_variance(p_dict, axis)` computes for one axis (MAD_func.py L45-127):
    {"cas": raw CAS per counterfactual (`axis_cas`), "mad": MAD of the sum-normalised CAS,
    "cas_per_question": raw CAS per question and counterfactual, "mad_per_question": MAD per
    question}. The number of questions is that of the first initial image (L48).
    """
    raw = axis_cas(initial, counterfactuals, None, synonyms_fn, order)
    per_question = [axis_cas(initial, counterfactuals, q, synonyms_fn, order) for q in range(len(initial[0]))]
    return {"cas": raw, "mad": mad(normalised_by_sum(raw)), "cas_per_question": per_question,
            "mad_per_question": [mad(normalised_by_sum(s)) for s in per_question]}
