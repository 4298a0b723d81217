"""Issue 41 items 5-7: option scores every VLM gets right, and CLIP-like evaluators at their own temperature.

Tiny random-weight PaliGemma, Qwen2-VL and LLaVA models, loaded through from_pretrained: the tokens a
choice appends get the token types the model's own generation gives new tokens (PaliGemma: 1, the causal
suffix; Qwen2-VL: 0), so a reply scores as the model generated it; a choice is scored as the whole reply
(its tokens, then the end of the turn, over the casings a model writes), so on a model trained to reply
"Middle class" the scored choice is its greedy reply, not the prefix "middle". SigLIP's learned scale
and bias set clip_vqa's and Explore's probabilities, not CLIP's 100."""
from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from engine.backends import load_backend
from engine.backends.vqa import VLM_CHOICES_SUFFIX, ClipVQA, appended_token_types, match_choice
from tests import tiny_models

IMAGES = [Image.new("RGB", (64, 64), c) for c in ((250, 10, 10), (10, 10, 240), (20, 230, 20), (128, 128, 128))]
CLASSES = ["middle", "middle class", "rich"]
QUESTION = "What is the social class of the person?"
VLMS = ["build_tiny_paligemma", "build_tiny_qwen2_vl", "build_tiny_vlm"]

pytestmark = pytest.mark.real_model


def _prompt(vqa, choices=CLASSES) -> str:
    return vqa.prefix + QUESTION + VLM_CHOICES_SUFFIX.format(choices=", ".join(choices))


@pytest.mark.parametrize("builder", ["build_tiny_paligemma", "build_tiny_qwen2_vl"])
def test_appended_tokens_get_the_token_types_the_models_own_generation_gives_them(tiny_root, builder):
    import torch
    from transformers.utils import ModelOutput

    vqa = load_backend(getattr(tiny_models, builder)(tiny_root))
    inputs = {k: v for k, v in vqa._inputs(IMAGES[:2], _prompt(vqa)).items()
              if k in ("token_type_ids", "mm_token_type_ids")}
    assert inputs   # PaliGemma marks its prefix with token_type_ids, Qwen2-VL its image tokens with mm_token_type_ids
    generated = vqa.model._update_model_kwargs_for_generation(ModelOutput(), dict(inputs), num_new_tokens=3)
    ours = appended_token_types(vqa.model, inputs, 3)
    assert set(ours) == set(inputs)
    for key in inputs:
        assert torch.equal(ours[key], generated[key])
    appended = next(iter(ours.values()))[:, -3:]
    assert bool((appended == (1 if builder == "build_tiny_paligemma" else 0)).all())


@pytest.fixture(scope="module", params=VLMS)
def trained(request, tiny_root, tmp_path_factory):
    """(builder, the ModelSpec of a copy of that tiny VLM trained to reply "Middle class" to the question
    with CLASSES listed): trained weights attend sharply, as a real model's do, so what each token sees shows."""
    spec = getattr(tiny_models, request.param)(tiny_root)
    out = tmp_path_factory.mktemp("trained") / request.param
    return request.param, tiny_models.train_to_reply(spec, out, IMAGES, _prompt(load_backend(spec)), "Middle class")


@pytest.mark.parametrize("question", [QUESTION, "Who is in the image?"])
def test_a_reply_scores_as_the_model_generated_it(trained, question):
    """The log-likelihood GapLens gives the model's own greedy reply is the one generate() computed for it
    (PaliGemma with the reply's token types 0 is off by about 0.01-0.02)."""
    import torch

    from engine.backends.base import decoding_settings

    vqa = load_backend(trained[1])
    inputs = {k: v for k, v in vqa._inputs(IMAGES[:1], vqa.prefix + question).items() if k != "labels"}
    with torch.inference_mode():
        out = vqa.model.generate(**inputs, **decoding_settings(0), max_new_tokens=4, min_new_tokens=4,
                                 output_logits=True, return_dict_in_generate=True)
    reply = out.sequences[0, -4:].tolist()
    generated = sum(float(torch.log_softmax(step[0].float(), -1)[t]) for step, t in zip(out.logits, reply))
    tokens, _ = vqa._continuations(inputs, [reply], [vqa.processor.tokenizer.eos_token_id])
    assert tokens[0, 0] == pytest.approx(generated, abs=1e-4)


def test_the_scored_choice_is_the_greedy_reply_when_the_reply_is_a_choice(trained):
    vqa = load_backend(trained[1])
    answers = vqa.answer_classes(IMAGES, QUESTION, CLASSES)
    assert [a.text for a in answers] == ["Middle class"] * len(IMAGES)   # capitalised, as Qwen2-VL writes
    # "middle" is the start of the reply: scored without the end of the turn it would always win
    assert [a.answer for a in answers] == [match_choice(a.text, CLASSES) for a in answers] == ["middle class"] * 4
    assert all(a.probs["middle class"] > 0.5 for a in answers)


def _softmax(rows):
    rows = np.asarray(rows, float)
    e = np.exp(rows - rows.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def test_clip_vqa_and_explore_use_siglips_learned_scale_and_bias(tiny, data_dir):
    from engine.core.engine import Engine
    from engine.methods import explore

    embedder = load_backend(tiny["siglip"])
    scale, bias = float(embedder.model.logit_scale.detach().exp()), float(embedder.model.logit_bias.detach())
    assert (embedder.logit_scale, embedder.logit_bias) == pytest.approx((scale, bias)) and scale != 100.0
    vqa = ClipVQA(embedder)
    cosine = vqa.scores(IMAGES, QUESTION, CLASSES)
    probs = [[a.probs[c] for c in CLASSES] for a in vqa.answer_classes(IMAGES, QUESTION, CLASSES)]
    assert np.allclose(probs, _softmax(scale * cosine + bias), atol=1e-6)
    assert not np.allclose(probs, _softmax(100 * cosine), atol=1e-3)

    engine = Engine("synthetic", data_dir=data_dir, embedder=tiny["siglip"])
    concepts = ["a photo of a man", "a photo of a woman"]
    done = list(explore.run(explore.ExploreRequest(prompt="a photo of a doctor", concepts=concepts, n=4), engine))[-1]
    results = done.results
    assert results["normalisation"] == {"kind": "softmax", "logit_scale": pytest.approx(scale),
                                        "logit_bias": pytest.approx(bias)}
    records = engine.image_set("a photo of a doctor", range(4))
    expected = explore.concept_scores(engine.embed_images(records), engine.embed_texts(concepts), scale)
    got = [[image["scores"][c] for c in concepts] for image in results["images"]]
    assert np.allclose(got, expected, atol=1e-5)
