"""Issue 46 item 5: the cost model times every protocol method a backend exposes.

GpuTimed sleeps before each GPU call of the synthetic backends it wraps; a test that enumerates the wrapped
classes' methods (and the four protocols') keeps the next method from slipping past untimed, as
answer_classes did (bench/scale_out.py's 1-process run then slept none of its answers' GPU time). Several
questions asked at once cost the image's share once and the rest per question."""
from __future__ import annotations

import inspect

import pytest

from engine.backends import base, gpu_costs
from engine.backends.gpu_costs import GpuTimed, call_seconds, questions_seconds
from engine.backends.synthetic import SyntheticEmbedder, SyntheticGenerator, SyntheticVQA, load_world
from engine.core.engine import Engine


def _public_methods(cls) -> set[str]:
    return {name for name, value in inspect.getmembers(cls, callable) if not name.startswith("_")}


@pytest.mark.parametrize("cls", [SyntheticGenerator, SyntheticEmbedder, SyntheticVQA,
                                 base.ImageGenerator, base.Embedder, base.VQA])
def test_gpu_timed_times_or_names_every_method_of_what_it_wraps(cls):
    methods = _public_methods(cls)
    untimed = methods - set(GpuTimed.TIMED) - GpuTimed.UNTIMED
    assert not untimed, f"{cls.__name__} has methods GpuTimed neither times nor names: {sorted(untimed)}"
    for name in methods & set(GpuTimed.TIMED):
        assert name in GpuTimed.__dict__        # its own, not forwarded by __getattr__


def test_the_optional_vqa_methods_are_timed_too():
    assert {"answer_classes", "answer_questions"} <= set(GpuTimed.TIMED)
    assert "answer_questions" in inspect.getsource(base.VQA)   # the protocol names it


def _timed(component, costs):
    slept = []
    timed = GpuTimed(component, costs)
    timed._sleep = slept.append
    return timed, slept


def test_every_timed_call_sleeps_what_the_table_says(engine):
    world = load_world()
    records = engine.image_set("a photo of a doctor", range(3))
    images = [r.image for r in records]
    costs = call_seconds("vqa", {"gpu": "blip_vqa"})
    vqa, slept = _timed(SyntheticVQA(world), costs)
    question = "What is the gender (male, female) of the person in the image?"
    vqa.answer(images, question)
    vqa.answer_classes(images, question, ["male", "female"])
    got = vqa.answer_questions(images, [(question, ["male", "female"])] * 8)
    vqa.caption(images)
    alone = 3 * gpu_costs.QUESTION_SECONDS["blip_vqa"]
    assert slept == pytest.approx([alone, alone, 3 * gpu_costs.vqa_seconds("blip_vqa", 8),
                                   3 * gpu_costs.CAPTION_SECONDS["blip_vqa"]])
    assert slept[2] < 8 * alone / 3                      # eight at once: the image's share paid once
    assert [a.answer for a in got[0]] == [a.answer for a in SyntheticVQA(world).answer_classes(
        images, question, ["male", "female"])]
    embedder, slept = _timed(SyntheticEmbedder(world), call_seconds("embedder", {"gpu": "clip"}))
    embedder.embed_images(images)
    embedder.embed_texts(["a photo", "a cat"])
    assert slept == pytest.approx([3 * gpu_costs.EMBED_SECONDS, 2 * gpu_costs.TEXT_EMBED_SECONDS])
    generator, slept = _timed(SyntheticGenerator(world), call_seconds("generator", {"gpu": "sd-turbo"}))
    generator.generate("a photo of a doctor", [0, 1], engine.settings(steps=2))
    assert slept == pytest.approx([2 * gpu_costs.image_seconds("sd-turbo", 2)])


def test_a_method_neither_timed_nor_named_is_refused():
    class Newer(SyntheticVQA):
        def answer_in_bulk(self, images):
            return []

    timed = GpuTimed(Newer(load_world()), {"question": 0.01})
    with pytest.raises(AttributeError, match="GpuTimed does not time Newer.answer_in_bulk"):
        timed.answer_in_bulk([])
    assert timed.world is timed._backend.world          # attributes still pass through


def test_questions_asked_together_cost_the_images_share_once():
    assert questions_seconds(0.01, 0.9, 1) == pytest.approx(0.01)
    assert questions_seconds(0.01, 0.9, 8) == pytest.approx(0.01 * (0.9 + 8 * 0.1))
    assert questions_seconds(0.01, 0.0, 8) == pytest.approx(0.08) and questions_seconds(0.01, 0.9, 0) == 0


def test_the_engine_asks_a_timed_evaluator_all_questions_at_once(tmp_path):
    engine = Engine("synthetic", data_dir=str(tmp_path), options={"vqa": {"gpu": "blip_vqa"}})
    vqa = engine.models.get(engine.preset.vqa)
    slept = []
    vqa._sleep = slept.append
    records = engine.image_set("a photo of a doctor", range(4))
    engine.ask_many(records, [("What is the gender (male, female) of the person in the image?", ["male", "female"]),
                              ("What age group (young, middle-aged, old) is the person in the image?",
                               ["young", "middle-aged", "old"])])
    assert slept == pytest.approx([4 * gpu_costs.vqa_seconds("blip_vqa", 2)])
