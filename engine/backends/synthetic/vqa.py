"""The synthetic VQA: answers attribute questions by reading the image's pixels.

A question is mapped to what it asks about (an axis by its keywords, the occupation, the
style, "is there a person", or a yes/no check of one value); the answer is read from the
image (scene.read_scene), then phrased free-form or matched to the given choices through
the world's lexicon. `error_rate` simulates a fallible VQA model: with that probability an
answer is replaced by another value (or another choice), deterministically per (image,
question). The pattern of the confusion is planted too: "uniform" picks any other value,
"shift" (the `error` option, issue 16) always says the next one — the next choice in the
list asked, or the next value of the axis — so the evaluator's confusion matrix is known:
M = (1 − rate)·I + rate·(cyclic shift).

Asked to choose about something the world does not draw (a disability: "fit, blind, hearing aid,
wheelchair"), it still answers one of the choices, as a real evaluator must: a guess, fixed per
(image, question), whose class probabilities are flat (the guess 1/K + 0.01), so that the
"can't tell" threshold (engine.backends.base.label_of) reads it as the guess it is.
"""
from __future__ import annotations

import re
from collections import OrderedDict
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from PIL import Image

from ..base import ClassAnswer
from .phrasing import describe
from .scene import check_drawable, image_digest, read_scene
from .world import World, seed_int

STYLE_ANSWER = "a flat cartoon illustration"
NO_PERSON = "no person"
OTHER = "other"
NOT_MODELLED = "not modelled in the synthetic world"
SCENE_CACHE_SIZE = 4096
CONFIDENCE_CONCENTRATION = 4.0   # κ of the planted confidences: larger keeps them closer to 1 − e
ANSWERS_VERSION = 2              # in the id, which keys stored answers: bumped when an answer changes (2: guesses)
GUESS_MARGIN = 0.01              # a guess's probability above the even 1/K (the most probable, barely)
PATTERNS = ("uniform", "shift")

_PRESENCE = re.compile(r"\b(is|are)\s+there\b|\bdoes\s+(the|this)\s+(image|picture|photo)\s+(contain|show|have)\b")
_PERSON_WORDS = re.compile(r"\b(person|people|human|humans|someone|anyone|man|woman|men|women|anybody|somebody)\b")
_OCCUPATION = re.compile(r"\b(occupation|job|profession|career|works?\s+as)\b")
_STYLE = re.compile(r"\bstyle\b")
_ETHNICITY = re.compile(r"\b(ethnic\w*|race|racial)\b")
# The world draws one colour on a person: the outfit's. Colours of body parts it does not model.
_BODY_PART = re.compile(r"\b(hair\w*|eyes?|eyebrows?|lips?|beard|moustache|mustache|nails?|teeth)\b")
_YES_NO_START = re.compile(r"^\s*(\[vqa\]\s*)?(is|are|does|do|was|were|can|has|have)\b")


@dataclass(frozen=True)
class Query:
    """What a question asks: kind is 'axis', 'occupation', 'presence', 'yesno', 'style' or
    'caption'; for 'axis' and 'yesno' also the axis (and the value checked)."""

    kind: str
    axis: str | None = None
    value: str | None = None
    ethnicity: bool = False


class SyntheticVQA:
    def __init__(self, world: World, error_rate: float = 0.0, pattern: str = "uniform"):
        if not 0.0 <= float(error_rate) <= 1.0:
            raise ValueError(f"error_rate must be between 0 and 1, not {error_rate}")
        if pattern not in PATTERNS:
            raise ValueError(f"the error pattern must be one of {PATTERNS}, not {pattern!r}")
        check_drawable(world)
        self.world = world
        self.error_rate = float(error_rate)
        self.pattern = pattern
        suffix = f":error={self.error_rate:g}" + (f":{pattern}" if pattern != "uniform" else "")
        self.id = f"synthetic-vqa:{world.hash}:v{ANSWERS_VERSION}" + (suffix if self.error_rate else "")
        # the engine asks several questions of each image: read its pixels once
        self._scenes: OrderedDict[str, dict] = OrderedDict()

    # -- protocol ---------------------------------------------------------------------------------
    def answer(self, images: Sequence[Image.Image], question: str,
               choices: Sequence[str] | None = None) -> list[str]:
        """One short answer per image; with `choices`, one of them (lower-case) or 'other'."""
        choices = [c.strip().lower() for c in choices] if choices else None
        query = self.interpret(question, choices)
        return [self._answer_one(self._read(image), question, query, choices)[0] for image in images]

    def answer_classes(self, images: Sequence[Image.Image], question: str, choices: Sequence[str]) -> list[ClassAnswer]:
        """Per image the answer of `answer` with a probability per choice, calibrated: the chosen
        choice gets confidence c, the others (1 − c) evenly. With error rate e, c is drawn from
        Beta(κ(1 − e) + 1, κe) for a right answer and Beta(κ(1 − e), κe + 1) for a wrong one
        (κ = CONFIDENCE_CONCENTRATION), so that P(right | c) = c and the mean confidence is 1 − e;
        c is kept above 1/K so the chosen choice stays the most probable. Without errors c = 1; a
        guess (a question about nothing the world draws) has c = 1/K + GUESS_MARGIN. An answer
        outside the choices ('other') has no probabilities."""
        return self._classes([self._read(image) for image in images], question, choices)

    def _classes(self, reads: list[tuple[str, dict]], question: str, choices: Sequence[str]) -> list[ClassAnswer]:
        """`answer_classes` of the images whose (digest, scene) `reads` are given."""
        names = [c.strip().lower() for c in choices]
        query = self.interpret(question, names)
        out = []
        for read in reads:
            answer, wrong, digest = self._answer_one(read, question, query, names)
            if answer not in names:
                out.append(ClassAnswer(answer))
                continue
            confidence = 1.0
            if self._guesses(query):
                confidence = 1 / len(names) + GUESS_MARGIN
            elif self.error_rate > 0:
                rng = np.random.default_rng(seed_int("vqa-confidence", digest, question))
                a, b = CONFIDENCE_CONCENTRATION * (1 - self.error_rate), CONFIDENCE_CONCENTRATION * self.error_rate
                confidence = rng.beta(max(a, 1e-3), b + 1) if wrong else rng.beta(a + 1, max(b, 1e-3))
                confidence = max(float(confidence), 1 / len(names) + GUESS_MARGIN)
            rest = (1 - confidence) / max(1, len(names) - 1)
            out.append(ClassAnswer(answer, {c: confidence if c == answer else rest for c in names}))
        return out

    def answer_questions(self, images: Sequence[Image.Image],
                         asks: Sequence[tuple[str, Sequence[str]]]) -> list[list[ClassAnswer]]:
        """Per (question, choices) of `asks`, per image, `answer_classes`: each image's pixels read once for
        every question (as a real evaluator encodes an image once)."""
        reads = [self._read(image) for image in images]
        return [self._classes(reads, question, choices) for question, choices in asks]

    def _answer_one(self, read: tuple[str, dict], question: str, query: Query,
                    choices: list[str] | None) -> tuple[str, bool, str]:
        """(the answer, whether the planted error changed it, the image's pixel digest) of the image whose
        (digest, scene) `read` is given."""
        digest, scene = read
        if choices and self._guesses(query):
            guess = np.random.default_rng(seed_int("vqa-guess", digest, question))
            return choices[int(guess.integers(len(choices)))], False, digest
        truth = self._truth(scene, query)
        rng = np.random.default_rng(seed_int("vqa-error", digest, question))
        wrong = self.error_rate > 0 and rng.random() < self.error_rate
        if choices:
            return self._choose(truth, query, choices, rng if wrong else None), wrong, digest
        if wrong:
            truth = self._flip(truth, query, scene, rng)
        return self._phrase(truth, query, scene), wrong, digest

    @staticmethod
    def _guesses(query: Query) -> bool:
        """Whether the question asks about nothing the world draws (no axis, subject or check of
        one), so that an answer among choices can only be a guess."""
        return query.kind == "caption"

    def caption(self, images: Sequence[Image.Image]) -> list[str]:
        """One caption per image, e.g. 'a young slim light-skinned female doctor in formal
        attire working indoors who is happy'."""
        return [describe(self.world, self._read(image)[1]) for image in images]

    def _read(self, image: Image.Image) -> tuple[str, dict]:
        """(pixel digest, read scene) of an image, from a small cache."""
        digest = image_digest(image)
        scene = self._scenes.get(digest)
        if scene is None:
            scene = self._scenes[digest] = read_scene(self.world, image)
            if len(self._scenes) > SCENE_CACHE_SIZE:
                self._scenes.popitem(last=False)
        return digest, scene

    # -- understanding the question -----------------------------------------------------------------
    def interpret(self, question: str, choices: Sequence[str] | None = None) -> Query:
        """What the question asks about (see Query)."""
        q = (question or "").lower()
        choice_axes = [m[0] for m in (self.world.lookup(c) for c in choices or []) if m]
        choice_subjects = [s for s in (self._subject_of(c) for c in choices or []) if s]
        yes_no_choices = bool(choices) and set(choices) <= {"yes", "no"}
        if _PRESENCE.search(q) and _PERSON_WORDS.search(q):
            return Query("presence")
        if (not choices or yes_no_choices) and _YES_NO_START.search(q) and " or " not in q:
            named = self.world.parse(re.sub(r"\b(person|image|picture|photo)\b", " ", q)).values
            if named:
                axis, value = next(iter(named.items()))
                return Query("yesno", axis, value)
        if _OCCUPATION.search(q) or (choice_subjects and len(choice_subjects) >= len(choice_axes)):
            return Query("occupation")
        if _STYLE.search(q):
            return Query("style")
        ethnicity = bool(_ETHNICITY.search(q))
        if choice_axes:
            most = max(set(choice_axes), key=lambda a: (choice_axes.count(a), -choice_axes.index(a)))
            return Query("axis", most, ethnicity=ethnicity)
        asked = self.world.axes_in_text(q)
        if asked:
            # value "body part": a colour the world does not draw (it draws the outfit's only)
            part = "body part" if asked[0] == "color" and _BODY_PART.search(q) else None
            return Query("axis", asked[0], part, ethnicity=ethnicity)
        return Query("caption")

    def _subject_of(self, text: str) -> str | None:
        subject = self.world.parse(text).subject
        return None if subject in ("person", self.world.default_subject) else subject

    # -- answering ------------------------------------------------------------------------------------
    def _truth(self, scene: dict, query: Query) -> str | None:
        """The canonical answer: an axis value, a subject name, 'yes'/'no', or None when the
        image has no such attribute (a person axis asked of an object)."""
        if query.kind == "presence":
            return "yes" if scene["kind"] == "person" else "no"
        if query.kind == "occupation":
            return scene["subject"]
        if query.kind == "yesno":
            return "yes" if scene.get(query.axis) == query.value else "no"
        if query.kind == "axis":
            return scene.get(query.axis)
        return None

    def _flip(self, truth: str | None, query: Query, scene: dict, rng: np.random.Generator) -> str | None:
        """Another possible answer than `truth`, drawn uniformly."""
        if query.kind in ("presence", "yesno"):
            return {"yes": "no", "no": "yes"}[truth]
        if query.kind == "occupation":
            others = [s for s in self.world.subjects_of(scene["kind"]) if s != truth]
        elif query.kind == "axis" and truth is not None:
            values = list(self.world.axes[query.axis].values)
            if self.pattern == "shift":
                return values[(values.index(truth) + 1) % len(values)]
            others = [v for v in values if v != truth]
        else:
            return truth
        return others[int(rng.integers(len(others)))] if others else truth

    def _choose(self, truth: str | None, query: Query, choices: list[str],
                wrong: np.random.Generator | None) -> str:
        """The first choice that means `truth`, else 'other'; with `wrong`, another choice."""
        correct = OTHER
        for choice in choices:
            if self._choice_means(choice, query) == truth and truth is not None:
                correct = choice
                break
        if wrong is not None and self.pattern == "shift" and correct in choices:
            return choices[(choices.index(correct) + 1) % len(choices)]
        if wrong is not None:
            others = [c for c in choices if c != correct]
            if others:
                return others[int(wrong.integers(len(others)))]
        return correct

    def _choice_means(self, choice: str, query: Query) -> str | None:
        if query.kind in ("presence", "yesno"):
            return choice if choice in ("yes", "no") else None
        if query.kind == "occupation":
            return self.world.parse(choice).subject
        found = self.world.lookup(choice)
        return found[1] if found and found[0] == query.axis else None

    def _phrase(self, truth: str | None, query: Query, scene: dict) -> str:
        """A short free-form answer, e.g. 'a woman', 'old', 'dark skin', 'a formal suit'."""
        if query.kind in ("presence", "yesno"):
            return truth
        if query.kind == "style":
            return STYLE_ANSWER
        if query.kind == "caption":
            return describe(self.world, scene)
        if query.kind == "occupation":
            if scene["kind"] != "person":
                return NO_PERSON
            subject = self.world.subjects[truth]
            return "unknown" if truth in ("person", self.world.default_subject) else subject.phrase
        axis = self.world.axes[query.axis]
        if truth is None:
            if query.axis == "color" and "outfit_colour" in scene:
                return NOT_MODELLED if query.value == "body part" else scene["outfit_colour"]
            return NO_PERSON if scene["kind"] != "person" else "unknown"
        if query.ethnicity and truth in (axis.extra.get("ethnicity_answers") or {}):
            return axis.extra["ethnicity_answers"][truth]
        return axis.answers[truth]
