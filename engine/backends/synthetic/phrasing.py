"""Editing prompts with the world's canonical phrases: insert or replace attribute phrases,
swap the subject, keep "a"/"an" right, and describe a scene in words.

Counterfactuals, variations and mutations are all made here, so every text the synthetic
LLM writes parses back (world.parse) to exactly the attributes it was meant to name.
"""
from __future__ import annotations

import re

from .world import Mention, World

_ARTICLE = re.compile(r"\b(a|an)(\s+)$", re.IGNORECASE)
# words starting with a vowel letter but a consonant sound, and the reverse
_CONSONANT_SOUND = ("uni", "use", "user", "usu", "eu", "one", "once")
_VOWEL_SOUND = ("hour", "honest", "honour", "honor", "heir")


def article_for(word: str) -> str:
    """'an' or 'a' for the word that follows it."""
    w = word.lower()
    if w.startswith(_VOWEL_SOUND):
        return "an"
    if w.startswith(_CONSONANT_SOUND):
        return "a"
    return "an" if w[:1] in "aeiou" else "a"


def _fix_article(before: str, next_word: str) -> str:
    """`before` with a trailing 'a'/'an' made to agree with `next_word`."""
    match = _ARTICLE.search(before)
    if not match:
        return before
    wanted = article_for(next_word)
    if match.group(1)[0].isupper():
        wanted = wanted.capitalize()
    return before[:match.start()] + wanted + match.group(2)


def _apply(text: str, edits: list[tuple[int, int, str]]) -> str:
    """Apply (start, end, replacement) edits, fixing the article in front of each one."""
    for start, end, replacement in sorted(edits, key=lambda e: (e[0], e[1]), reverse=True):
        before = text[:start]
        if replacement:
            before = _fix_article(before, replacement.split()[0])
        else:  # a removed phrase: the article now faces the next word
            rest = text[end:].lstrip()
            before = _fix_article(before, rest.split()[0]) if rest else before
        text = before + replacement + text[end:]
    return re.sub(r"\s{2,}", " ", text).strip()


# Adjectives read best in this order ("a young slim dark-skinned female doctor"); axes not
# listed follow in table order.
ADJECTIVE_ORDER = ("age", "bodytype", "skin tone", "gender", "color")


def with_attributes(world: World, prompt: str, values: dict[str, str]) -> str:
    """The prompt changed to name exactly these axis values: a phrase for an axis the prompt
    already names is replaced in place; others are inserted, adjectives right before the
    subject noun and suffixes right after it. A prompt without a subject noun gets
    ", with a <adjectives> figure <suffixes>" appended (the default subject's phrase)."""
    parsed = world.parse(prompt)
    first_mention: dict[str, Mention] = {}
    for m in parsed.mentions:
        if m.axis and m.axis not in first_mention:
            first_mention[m.axis] = m
    edits: list[tuple[int, int, str]] = []
    adjectives: dict[str, str] = {}
    suffixes: list[str] = []
    for axis_name in world.axes:
        if axis_name not in values:
            continue
        axis, value = world.axes[axis_name], values[axis_name]
        phrase = axis.phrase(value, parsed.kind if parsed.kind in axis.applies_to else axis.applies_to[0])
        existing = first_mention.get(axis_name)
        if existing is None:
            if axis.position == "adjective":
                adjectives[axis_name] = phrase
            else:
                suffixes.append(phrase)
        elif existing.value != value:
            if existing.noun:                           # "a woman" -> "a man", not "a male"
                phrase = (axis.extra.get("nouns") or {}).get(value, [phrase])[0]
            edits.append((existing.start, existing.end, phrase))
    ordered = sorted(adjectives, key=lambda a: (ADJECTIVE_ORDER.index(a) if a in ADJECTIVE_ORDER
                                                else len(ADJECTIVE_ORDER), list(world.axes).index(a)))
    adjective_text = " ".join(adjectives[a] for a in ordered)
    suffix_text = " ".join(suffixes)
    span = parsed.subject_span
    if span is None:
        if adjective_text or suffix_text:
            noun = " ".join(p for p in (adjective_text, world.subjects[world.default_subject].phrase, suffix_text) if p)
            edits.append((len(prompt), len(prompt), f", with {article_for(noun)} {noun}"))
        return _apply(prompt, edits)
    if adjective_text:
        noun_edit = next((e for e in edits if e[0] == span[0]), None)
        if noun_edit:   # the subject is a gender noun being replaced: adjectives go before the new noun
            edits.remove(noun_edit)
            edits.append((noun_edit[0], noun_edit[1], f"{adjective_text} {noun_edit[2]}"))
        else:
            edits.append((span[0], span[0], adjective_text + " "))
    if suffix_text:
        edits.append((span[1], span[1], " " + suffix_text))
    return _apply(prompt, edits)


def with_subject(world: World, prompt: str, subject: str) -> str:
    """The prompt with its subject noun replaced by another subject's phrase (appended as
    "with a ..." when the prompt names no subject)."""
    parsed = world.parse(prompt)
    phrase = world.subjects[subject].phrase
    if parsed.subject_span is None:
        return _apply(prompt, [(len(prompt), len(prompt), f" with {article_for(phrase)} {phrase}")])
    start, end = parsed.subject_span
    return _apply(prompt, [(start, end, phrase)])


def describe(world: World, scene: dict) -> str:
    """A caption of a read scene that parses back to the same attributes, e.g. 'a young slim
    dark-skinned female doctor in formal attire working indoors who is happy'."""
    subject = world.subjects[scene["subject"]]
    values = {a.name: scene[a.name] for a in world.axes_for(subject.kind) if a.name in scene}
    gender_nouns = (world.axes["gender"].extra.get("nouns") or {}) if "gender" in world.axes else {}
    if subject.name == "person" and values.get("gender") in gender_nouns:
        noun = gender_nouns[values.pop("gender")][0]
    else:
        noun = subject.phrase
    return with_attributes(world, f"{article_for(noun)} {noun}", values)


def translate(world: World, prompt: str, code: str, form: str = "default") -> str | None:
    """`prompt` as the synthetic LLM writes it in language `code` (World.languages): the language's
    frame around its phrase for the prompt's subject in `form` ("default", "feminine" or "star"; the
    default form where the language has no such form), the attributes the prompt names kept as the
    world's English phrases after a comma. None when the prompt names no subject the world knows.
    English ("en") gets "a photo of a <subject>" with its attributes in place."""
    parsed = world.parse(prompt)
    if parsed.subject_span is None:
        return None
    if code == "en":
        return _english(world, parsed.subject, dict(parsed.values))
    language = world.languages[code]
    forms = language.translations.get(parsed.subject) or {}
    noun = forms.get(form) or forms.get("default")
    if not noun:
        return None
    text = language.frame.format(noun=noun)
    named = [world.axes[a].phrase(v, parsed.kind if parsed.kind in world.axes[a].applies_to
                                  else world.axes[a].applies_to[0]) for a, v in parsed.values.items()]
    return text + (", " + ", ".join(named) if named else "")


def back_translate(world: World, text: str) -> str | None:
    """`text` (in any language the world speaks) in English, as the synthetic LLM translates it back:
    "a photo of a <subject>" with the attributes it names, a feminine noun read as "female"; None when
    it names no subject the world knows."""
    parsed = world.parse(text)
    if parsed.subject_span is None:
        return None
    values = dict(parsed.values)
    if parsed.form == "feminine" and "gender" in world.axes and "gender" not in values:
        values["gender"] = "female"
    return _english(world, parsed.subject, values)


def _english(world: World, subject: str, values: dict[str, str]) -> str:
    phrase = world.subjects[subject].phrase
    return with_attributes(world, f"a photo of {article_for(phrase)} {phrase}", values)
