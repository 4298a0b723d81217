"""Readable Top-K concepts: whole phrases instead of word fragments, variants merged.

TIBET's CAS compares unigram histograms (thesis App. A.1; `tibet.concept_histogram`), and that
stays as published because its numbers are pinned by tests against the released code. A list
of the Top-K concepts shown to a person reads better in phrases: an answer to an axis question
("middle-aged", "dark blue") is one concept, a caption's fixed two-word expressions ("formal
attire", "working indoors") stay whole, and variants of one concept ("light" and
"light-skinned", "middleaged" and "middle-aged", "light skin") are counted once. The frequency
is the share of images that mention the concept at least once, so it lies in [0, 1].
"""
from __future__ import annotations

import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence

from engine.metrics.tibet import CAPTIONER_ARTEFACTS, DEFAULT_STOPWORDS

# Words that only qualify the concept before them ("light skin", "dark-skinned"): merged into it.
_QUALIFIERS = ("skinned", "skin", "toned", "tone", "coloured", "colored")
# A word with at most this many different neighbours on one side forms a fixed expression with them.
MAX_PARTNERS = 3


def _clean(text: str) -> str:
    text = re.sub(r"[^\w\s-]", " ", str(text or "").lower())
    return " ".join(w.strip("-") for w in text.split() if w.strip("-"))


def variant_key(phrase: str) -> str:
    """Returns the key under which variants of one concept meet: qualifiers ("-skinned",
    " skin") dropped, hyphens and spaces removed ("Light-skinned" -> "light", "middle aged"
    -> "middleaged")."""
    words = _clean(phrase).replace("-", " ").split()
    while len(words) > 1 and words[-1] in _QUALIFIERS:
        words.pop()
    return "".join(words)


def _qualified(phrase: str) -> bool:
    words = _clean(phrase).replace("-", " ").split()
    return len(words) > 1 and words[-1] in _QUALIFIERS


def answer_phrase(answer: str, stopwords: frozenset[str] = DEFAULT_STOPWORDS) -> str | None:
    """Returns one VQA answer as one concept ("A dark blue." -> "dark blue"; a captioner artefact
    such as "arafed" dropped), or None when it carries none (empty, stop words only, or a whole-answer
    stop entry such as "no face found")."""
    words = [w for w in _clean(answer).split() if w not in CAPTIONER_ARTEFACTS]
    while words and words[0] in ("a", "an", "the"):
        words.pop(0)
    if not words or all(w in stopwords for w in words) or " ".join(words) in stopwords:
        return None
    return " ".join(words)


def _chunks(text: str, stopwords: frozenset[str]) -> list[list[str]]:
    """Runs of consecutive non-stop words."""
    chunks, current = [], []
    for word in _clean(text).split():
        if word in stopwords:
            if current:
                chunks.append(current)
            current = []
        else:
            current.append(word)
    return chunks + ([current] if current else [])


def caption_phrases(captions: Sequence[str], known: Iterable[str] = (),
                    stopwords: frozenset[str] = DEFAULT_STOPWORDS) -> list[list[str]]:
    """Returns the concepts of each caption. Words that are (variants of) `known` concepts
    stand alone; two adjacent unknown words are one concept when one of them always has a
    neighbour on that side, drawn from at most MAX_PARTNERS words across all captions
    ("attire" is always preceded by "formal" or "informal": "formal attire"). A qualifier
    after a concept ("light skin") is merged into it."""
    known_keys = {variant_key(k) for k in known if k}
    chunks = [_chunks(c, stopwords) for c in captions]
    left, right, seen = defaultdict(set), defaultdict(set), Counter()
    no_left, no_right = set(), set()
    for caption in chunks:
        for chunk in caption:
            for i, word in enumerate(chunk):
                seen[word] += 1
                (left[word].add(chunk[i - 1]) if i > 0 else no_left.add(word))
                (right[word].add(chunk[i + 1]) if i + 1 < len(chunk) else no_right.add(word))

    def is_known(word: str) -> bool:
        return variant_key(word) in known_keys

    def joined(a: str, b: str) -> bool:
        if variant_key(f"{a} {b}") in known_keys and not is_known(a):
            return True     # "middle aged" is the known "middle-aged"
        if is_known(a) or is_known(b) or b in _QUALIFIERS:
            return False
        return ((b not in no_left and len(left[b]) <= MAX_PARTNERS)
                or (a not in no_right and len(right[a]) <= MAX_PARTNERS))

    out = []
    for caption in chunks:
        phrases = []
        for chunk in caption:
            i = 0
            while i < len(chunk):
                word = chunk[i]
                if word in _QUALIFIERS and phrases and i > 0:
                    i += 1          # "light skin": the qualifier belongs to the concept before it
                    continue
                if i + 1 < len(chunk) and joined(word, chunk[i + 1]):
                    phrases.append(f"{word} {chunk[i + 1]}")
                    i += 2
                    continue
                phrases.append(word)
                i += 1
        out.append(phrases)
    return out


def phrase_shares(answers_per_image: Sequence[Sequence[str | None]], captions: Sequence[str] | None = None,
                  known: Iterable[str] = (), stopwords: Iterable[str] = DEFAULT_STOPWORDS) -> dict[str, float]:
    """Returns {concept: share of images mentioning it}, most frequent first (ties
    alphabetical). `answers_per_image[i]` are the VQA answers about image i (each one
    concept), `captions[i]` its caption (split by `caption_phrases`, with the answers and
    `known`, e.g. the prompt's words, as known concepts). Variants are merged under a
    spelling without a qualifier ("light", not "light-skinned"), preferring hyphens and
    spaces ("middle-aged", not "middleaged"), then the answer's, then the most frequent."""
    stopwords = frozenset(stopwords)
    answers = [[p for p in (answer_phrase(a, stopwords) for a in image if a is not None) if p]
               for image in answers_per_image]
    known = set(known) | {p for image in answers for p in image}
    from_captions = caption_phrases(captions, known, stopwords) if captions else [[] for _ in answers]
    spellings: dict[str, Counter] = defaultdict(Counter)
    answer_spelling: dict[str, str] = {}
    present = Counter()
    for image_answers, image_caption in zip(answers, from_captions):
        keys = set()
        for phrase in image_answers:
            answer_spelling.setdefault(variant_key(phrase), phrase)
        for phrase in image_answers + image_caption:
            key = variant_key(phrase)
            if not key or phrase in stopwords:
                continue
            spellings[key][phrase] += 1
            keys.add(key)
        present.update(keys)
    n = max(1, len(answers))
    shares = {}
    for key, count in present.items():
        name = max(spellings[key].items(), key=lambda kv: (
            not _qualified(kv[0]), "-" in kv[0], " " in kv[0], kv[0] == answer_spelling.get(key), kv[1], kv[0]))[0]
        shares[name] = count / n
    return dict(sorted(shares.items(), key=lambda kv: (-kv[1], kv[0])))


def top_phrases(answers_per_image, captions=None, k: int = 10, known: Iterable[str] = ()) -> list[tuple[str, float]]:
    """Returns the k most frequent concepts of `phrase_shares` as (concept, share of images)."""
    return list(phrase_shares(answers_per_image, captions, known).items())[:k]
