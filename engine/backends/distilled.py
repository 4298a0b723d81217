"""The distilled evaluator ("distilled"): a VQA evaluator that answers closed-set questions from a probe
on the image embeddings GapLens already stores, trained on a teacher evaluator's answers, and asks the
teacher where the probe is unsure or not good enough.

    --vqa distilled --vqa-option teacher=blip_vqa:Salesforce/blip-vqa-base

Like the large audits that label a sample with an expensive model and let a linear head on one embedding
per image label the rest (the LAION-400M person-centric annotations, ICLR 2026: a SigLIP linear head on a
VLM ensemble's consensus; HEIM and MAGBIG classify from one CLIP embedding per image).

This module is the backend the model manager loads: it names the evaluator (its `id`: the teacher's and
the embedder's identities and the options below, so its answers never mix with another's) and holds the
loaded teacher and embedder (passed by the engine as `teacher=` and `embedder=`). The probes themselves
need the store and are trained and used by the engine (engine/core/distilled.py); asked directly, this
backend answers as its teacher does. Free questions and captions are always the teacher's.

Options (each part of the id): teacher (required, "backend:model" as `--vqa` takes it), teacher_options
(the teacher's options, a JSON object: `--vqa-option 'teacher_options={"max_new_tokens": 8}'`), sample (share of
the images asked of the teacher to calibrate a probe, default 0.1), min_sample (at least this many, default
200), held_out (share of the calibration answers kept out of training to measure agreement, default 0.25),
min_agreement (a probe whose held-out accuracy against the teacher is below it is not used, default 0.8),
teacher_below (images whose probe probability is under it go to the teacher, default the "can't tell"
threshold, base.DEFAULT_CANT_TELL_BELOW), seed (the calibration sample's, default 0).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from PIL import Image

from ..common.errors import ModelLoadError
from .base import DEFAULT_CANT_TELL_BELOW, ClassAnswer, ModelSpec, answer_all, with_options


@dataclass(frozen=True)
class DistillSettings:
    """The distilled evaluator's options (module docstring)."""

    sample: float = 0.1
    min_sample: int = 200
    held_out: float = 0.25
    min_agreement: float = 0.8
    teacher_below: float = DEFAULT_CANT_TELL_BELOW
    seed: int = 0

    @classmethod
    def from_options(cls, options: dict) -> "DistillSettings":
        """The settings `options` give; ModelLoadError (one sentence) for a value out of range."""
        try:
            settings = cls(sample=float(options.get("sample", cls.sample)),
                           min_sample=int(options.get("min_sample", cls.min_sample)),
                           held_out=float(options.get("held_out", cls.held_out)),
                           min_agreement=float(options.get("min_agreement", cls.min_agreement)),
                           teacher_below=float(options.get("teacher_below", cls.teacher_below)),
                           seed=int(options.get("seed", cls.seed)))
        except (TypeError, ValueError):
            raise ModelLoadError("the distilled evaluator's options sample, held_out, min_agreement and "
                                 "teacher_below are numbers, min_sample and seed whole numbers") from None
        if not (0 < settings.sample <= 1 and 0 < settings.held_out < 1 and settings.min_sample >= 10
                and 0 <= settings.min_agreement <= 1 and 0 <= settings.teacher_below <= 1):
            raise ModelLoadError("the distilled evaluator needs 0 < sample <= 1, 0 < held_out < 1, min_sample >= 10 "
                                 "and min_agreement and teacher_below between 0 and 1")
        return settings


class DistilledVQA:
    """The distilled evaluator as the model manager holds it (module docstring): its id, settings, teacher
    and embedder. Asked directly it answers as its teacher; the engine answers its closed-set questions
    from probes (engine/core/distilled.py)."""

    def __init__(self, teacher, embedder, settings: DistillSettings, teacher_spec: ModelSpec, options: dict):
        self.teacher, self.embedder, self.settings, self.teacher_spec = teacher, embedder, settings, teacher_spec
        teacher_id = with_options(teacher.id, teacher_spec.options)
        self.teacher_id = teacher_id
        self.id = with_options(f"distilled:{teacher_id}|probe-on:{embedder.id}",
                               {k: v for k, v in options.items() if k not in ("teacher", "teacher_options")})
        self.options_in_id = True   # Engine.model_id: the options are in the id already

    def memory_bytes(self) -> int:
        """0: the teacher and the embedder are the manager's own entries."""
        return 0

    def move_to(self, device: str) -> bool:
        """Nothing of its own to move (the teacher and embedder are moved as theirs)."""
        return True

    def answer(self, images: Sequence[Image.Image], question: str,
               choices: Sequence[str] | None = None) -> list[str]:
        """The teacher's answers (a free question has no probe)."""
        return self.teacher.answer(images, question, choices)

    def answer_questions(self, images: Sequence[Image.Image],
                         asks: Sequence[tuple[str, Sequence[str]]]) -> list[list[ClassAnswer]]:
        """The teacher's scored answers (the engine answers from probes: engine/core/distilled.py)."""
        return answer_all(self.teacher, images, asks)

    def answer_classes(self, images: Sequence[Image.Image], question: str, choices: Sequence[str]) -> list[ClassAnswer]:
        """The teacher's scored answers to one question."""
        return self.answer_questions(images, [(question, choices)])[0]

    def caption(self, images: Sequence[Image.Image]) -> list[str]:
        """The teacher's captions."""
        return self.teacher.caption(images)


def load(spec: ModelSpec, device: str, **context) -> DistilledVQA:
    """The distilled evaluator `spec` names, over the loaded `context["teacher"]` (the evaluator of
    `context["teacher_spec"]`) and `context["embedder"]`: the engine passes them (Engine._spec_and_context)."""
    if spec.backend != "distilled":
        raise ModelLoadError(f"distilled cannot load backend '{spec.backend}'")
    teacher, embedder, named = context.get("teacher"), context.get("embedder"), context.get("teacher_spec")
    if teacher is None or embedder is None or named is None:
        raise ModelLoadError("the distilled evaluator is loaded by the engine, with its teacher and embedder")
    if not callable(getattr(teacher, "answer_classes", None)):
        raise ModelLoadError(f"the distilled evaluator's teacher ({named.label}) gives no probability per class, "
                             "which a probe needs to learn from")
    return DistilledVQA(teacher, embedder, DistillSettings.from_options(spec.options), named, spec.options)
