"""InterMit's prompt set (thesis Ch. 7; docs/spec/thesis-tibet-biasconnect-intermit.md §4): one
prompt composed from the counterfactual edits of several axes, and the apportionment of N images
among the set's prompts. Pure functions of text and weights, used by engine/methods/mitigate.py."""
from __future__ import annotations

import difflib
import math
import re
from collections import defaultdict
from typing import Hashable, Sequence

import numpy as np

from ..common.errors import InputError
from .cfsets import ARTICLES

_TOKENS = re.compile(r"\{\w+\}|[\w'-]+|[^\w\s]")


def _tokens(text: str) -> list[str]:
    """Words (with inner hyphens and apostrophes) and punctuation marks, in order."""
    return _TOKENS.findall(text)


def _join(tokens: list[str]) -> str:
    return re.sub(r"\s+([.,;:!?)])", r"\1", re.sub(r"([(])\s+", r"\1", " ".join(tokens)))


def compose(base: str, counterfactuals: Sequence[str]) -> tuple[str, bool]:
    """(prompt, clean) with the one-concept edit of every counterfactual applied to `base`
    ('a photo of a doctor' + 'a photo of a male doctor' + 'a photo of an old doctor' ->
    'a photo of a male old doctor'). One counterfactual is returned verbatim. Edits at the
    same place are joined in the given order; articles next to an edit are made to agree
    ('a'/'an'). `clean` is False when two edits replaced the same words: the later one's
    words are then appended after a comma."""
    cfs = [c for c in counterfactuals if c]
    if not cfs:
        return base, True
    if len(cfs) == 1:
        return cfs[0], True
    tokens = _tokens(base)
    keys = [t.lower() for t in tokens]
    inserts: dict[int, list[str]] = defaultdict(list)
    replaces: dict[int, tuple[int, list[str]]] = {}
    covered: set[int] = set()
    agree: set[int] = set()
    appended: list[str] = []
    for cf in cfs:
        new_tokens = _tokens(cf)
        matcher = difflib.SequenceMatcher(a=keys, b=[t.lower() for t in new_tokens], autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                continue
            old, new = keys[i1:i2], new_tokens[j1:j2]
            while old and new and old[0] in ARTICLES and new[0].lower() in ARTICLES:  # 'a' -> 'an old'
                agree.add(i1)
                i1, old, new = i1 + 1, old[1:], new[1:]
            if not old and not new:
                continue
            if i1 - 1 >= 0 and keys[i1 - 1] in ARTICLES:
                agree.add(i1 - 1)
            if not old:
                inserts[i1].extend(new)
            elif covered & set(range(i1, i1 + len(old))):
                appended.extend(new)
            else:
                replaces[i1] = (i1 + len(old), new)
                covered.update(range(i1, i1 + len(old)))
    out: list[str] = []
    article_at: list[int] = []
    i = 0
    while i <= len(tokens):
        out.extend(inserts.get(i, []))
        if i == len(tokens):
            break
        if i in replaces:
            end, new = replaces[i]
            out.extend(new)
            i = end
            continue
        if i in agree:
            article_at.append(len(out))
        out.append(tokens[i])
        i += 1
    for j in article_at:
        if j + 1 < len(out) and out[j].lower() in ("a", "an"):
            article = "an" if out[j + 1][:1].lower() in "aeiou" else "a"
            out[j] = article.capitalize() if out[j][:1].isupper() else article
    prompt = _join(out)
    if appended:
        prompt = prompt.rstrip(" .") + ", " + _join(appended)
    return prompt, not appended


def allocate(weights: Sequence[float], n: int, groups: Sequence[Sequence[Hashable]] = ()) -> list[int]:
    """How many of `n` images each item (prompt) gets, for item weights (any scale).

    Sequential apportionment, deterministic: image k = 1..n goes to the item furthest behind
    its quota, the deficit being k·w_i − n_i plus, for every label the item carries in
    `groups[i]` (e.g. ("age", "young")), that label's k·W_label − n_label; ties go to the
    earlier item. Items of weight 0 get nothing. Each label's count stays within rounding
    of n·W_label, so every mitigated axis meets its D* as closely as n allows."""
    w = np.asarray(weights, dtype=float)
    if len(w) == 0 or w.sum() <= 0:
        raise InputError("the prompt set needs at least one prompt of positive weight")
    w = w / w.sum()
    groups = list(groups) or [()] * len(w)
    label_weight: dict = defaultdict(float)
    for i, labels in enumerate(groups):
        for label in labels:
            label_weight[label] += w[i]
    counts = [0] * len(w)
    label_count: dict = defaultdict(int)
    for k in range(1, n + 1):
        best, best_score = None, -math.inf
        for i, wi in enumerate(w):
            if wi <= 0:
                continue
            score = k * wi - counts[i] + sum(k * label_weight[lab] - label_count[lab] for lab in groups[i])
            if score > best_score + 1e-9:
                best, best_score = i, score
        counts[best] += 1
        for lab in groups[best]:
            label_count[lab] += 1
    return counts
