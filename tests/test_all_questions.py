"""Issue 46 item 1: every question of an image at once, each image preprocessed and encoded once.

Tiny BLIP, Qwen2-VL, LLaVA and PaliGemma models loaded through from_pretrained answer several questions in
one call with the numbers (and, for the VLMs, the replies) of one call per question, while their vision
tower runs once per batch (PaliGemma: its prompt is one bidirectional block, so once per question); CLIP
zero-shot reads the store's image embeddings; the engine keys every answer per (image, evaluator,
question), so an answer asked alone is a hit when asked with others; and every method asks its closed-set
questions of a batch in one evaluator call."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from engine.backends import load_backend
from engine.backends.base import ModelSpec
from engine.core.engine import Engine
from tests import tiny_models

IMAGES = [Image.new("RGB", (64, 64), c) for c in ((250, 10, 10), (10, 10, 240), (20, 230, 20))]
ASKS = [("What is the gender (male, female) of the person in the image?", ["male", "female"]),
        ("What age group (young, middle-aged, old) is the person in the image?", ["young", "middle-aged", "old"]),
        ("What is the social class of the person?", ["middle", "middle class", "rich", "poor"])]


def _calls(module) -> list:
    """A list that grows by one per forward call of `module`."""
    seen: list = []
    module.register_forward_hook(lambda *_: seen.append(1))
    return seen


def _same(together, alone, tolerance):
    for column, reference in zip(together, alone):
        assert [a.answer for a in column] == [a.answer for a in reference]
        assert [a.text for a in column] == [a.text for a in reference]
        for a, b in zip(column, reference):
            assert a.probs.keys() == b.probs.keys()
            assert max(abs(a.probs[c] - b.probs[c]) for c in a.probs) <= tolerance


@pytest.mark.real_model
def test_blip_asks_every_question_with_one_vision_pass_and_one_question_encoding(tiny):
    vqa = load_backend(tiny["blip_vqa"])
    alone = [vqa.answer_classes(IMAGES, q, c) for q, c in ASKS]
    vision, encoder = _calls(vqa.model.vision_model), _calls(vqa.model.text_encoder)
    together = vqa.answer_questions(IMAGES, ASKS)
    assert (len(vision), len(encoder)) == (1, 1)           # one batch: one vision pass, the questions side by side
    _same(together, alone, 1e-6)


@pytest.mark.real_model
@pytest.mark.parametrize("builder, tower, shared", [("build_tiny_qwen2_vl", "visual", True),
                                                    ("build_tiny_vlm", "vision_tower", True),
                                                    ("build_tiny_paligemma", "vision_tower", False)])
def test_a_vlm_prefills_the_image_once_for_every_question(tiny_root, monkeypatch, builder, tower, shared):
    vqa = load_backend(getattr(tiny_models, builder)(tiny_root))
    alone = [vqa.answer_classes(IMAGES, q, c) for q, c in ASKS]
    vision = _calls(getattr(vqa.model.model, tower))
    preprocessed = []
    image_processor = type(vqa.processor.image_processor)
    original = image_processor.__call__
    monkeypatch.setattr(image_processor, "__call__", lambda self, *a, **k: preprocessed.append(1) or original(self, *a, **k))
    together = vqa.answer_questions(IMAGES, ASKS)
    assert len(preprocessed) == 1                      # the processor's image part once for the three prompts
    assert len(vision) == (1 if shared else len(ASKS))
    _same(together, alone, 1e-5)
    assert vqa._shared_prefix([vqa._inputs(IMAGES, q) for q, _ in ASKS]) > (0 if shared else -1)


@pytest.mark.real_model
def test_clip_zero_shot_reads_the_stored_image_embeddings_of_its_own_embedder(tiny, data_dir, monkeypatch):
    engine = Engine("synthetic", data_dir=data_dir, embedder=tiny["hf_clip"], vqa=ModelSpec("clip_vqa", ""))
    records = engine.image_set("a photo of a doctor", range(4))
    stored = engine.embed_images(records)
    embedder = engine.models.get(engine.preset.embedder)
    embedded = []
    original = type(embedder).embed_images
    monkeypatch.setattr(type(embedder), "embed_images", lambda self, images: embedded.append(len(images))
                        or original(self, images))
    got = engine.ask_many(records, ASKS)
    assert embedded == []                               # the store's embeddings, no image embedded again
    vqa = engine.models.peek(engine.preset.vqa, embedder=embedder)
    for (question, choices), column in zip(ASKS, got):
        expected = vqa.answer_questions([r.image for r in records], [(question, choices)], embeddings=stored)[0]
        assert np.allclose([list(a.probs.values()) for a in column], [list(a.probs.values()) for a in expected])


def test_an_answer_asked_alone_is_a_hit_when_asked_with_others(engine):
    records = engine.image_set("a photo of a doctor", range(6))
    first = engine.ask_scored(records, *ASKS[0])
    assert engine.stats.answers_computed == 6
    together = engine.ask_many(records, ASKS)
    assert engine.stats.answers_computed == 6 + 2 * 6   # only the two new questions
    assert [a.probs for a in together[0]] == [a.probs for a in first]
    again = engine.ask_many(records, ASKS[::-1])
    assert engine.stats.answers_computed == 18 and [a.answer for a in again[-1]] == [a.answer for a in first]


class _Spy:
    """Counts the calls the engine makes of the synthetic VQA, by method (not the calls one method makes of
    another inside it)."""

    def __init__(self, engine, monkeypatch):
        self.calls: dict[str, int] = {}
        self.depth = 0
        vqa = engine.models.get(engine.preset.vqa)
        for name in ("answer_questions", "answer_classes", "answer"):
            monkeypatch.setattr(vqa, name, self._counting(name, getattr(vqa, name)))

    def _counting(self, name, original):
        def call(*args, **kwargs):
            if not self.depth:
                self.calls[name] = self.calls.get(name, 0) + 1
            self.depth += 1
            try:
                return original(*args, **kwargs)
            finally:
                self.depth -= 1
        return call


def test_single_prompt_asks_every_axis_of_its_images_in_one_call(engine, monkeypatch):
    from engine.methods.single_prompt import SinglePromptRequest, run

    spy = _Spy(engine, monkeypatch)
    events = list(run(SinglePromptRequest("a photo of a doctor", n=8, axes=["gender", "age", "skin tone"],
                                          gap=False, n_boot=100), engine))
    results = events[-1].results
    assert spy.calls.get("answer_questions") == 1 and "answer_classes" not in spy.calls
    assert set(results["answers"][next(iter(results["answers"]))]) == {"gender", "age", "skin tone"}
    assert results["answer_probs"]


def test_intersectional_asks_every_axis_of_a_set_in_one_call(engine, monkeypatch):
    from engine.methods.intersectional import IntersectionalRequest, run

    spy = _Spy(engine, monkeypatch)
    request = IntersectionalRequest(prompt="a photo of a doctor", axes={"gender": ["a photo of a male doctor",
                                                                                  "a photo of a female doctor"],
                                                                       "age": ["a photo of a young doctor",
                                                                               "a photo of an old doctor"]},
                                    n=4, n_boot=0)
    list(run(request, engine))
    # one call per set (the prompt and its four counterfactuals), each asking both axes
    assert spy.calls == {"answer_questions": 5}
