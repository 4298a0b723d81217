"""Issue 35: evaluators answer within the classes with a probability per class, and say "can't tell".

Tiny BLIP, Qwen2-VL, LLaVA and CLIP models loaded through from_pretrained score the classes: the
probabilities sum to 1, the chosen class is the most probable, and they are the models' own
likelihoods (checked against each model's training loss); the threshold turns low-confidence answers
into "can't tell". On the synthetic world a noisy evaluator's abstention raises its accuracy on the
images it answers (measured against the renderer's truth); free answers about skin tone and ethnicity
still match their classes (table-driven)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image

from engine.backends import load_backend
from engine.backends.base import CANT_TELL, ClassAnswer, label_of
from engine.backends.vqa import VLM_CHOICES_SUFFIX, ClipVQA, match_choice
from engine.core.engine import Engine
from tests import tiny_models

SKIN = ["light", "medium", "dark"]
ETHNICITY = ["white", "black", "asian", "hispanic", "middle eastern", "south asian"]
IMAGES = [Image.new("RGB", (64, 64), c) for c in ((250, 10, 10), (10, 10, 240), (20, 230, 20), (128, 128, 128))]
QUESTION = "What is the skin tone (light, medium, dark) of the person in the image?"


# -- free answers still match (item 3) ------------------------------------------------------------
@pytest.mark.parametrize("answer, choices, expected", [
    ("fair", SKIN, "light"), ("Pale.", SKIN, "light"), ("white", SKIN, "light"), ("Caucasian", SKIN, "light"),
    ("fair-skinned", SKIN, "light"), ("a pale person", SKIN, "light"),
    ("tan", SKIN, "medium"), ("tanned", SKIN, "medium"), ("brown", SKIN, "medium"), ("olive", SKIN, "medium"),
    ("Olive-skinned.", SKIN, "medium"), ("a tan person", SKIN, "medium"),
    ("black", SKIN, "dark"), ("dark-skinned", SKIN, "dark"), ("dark brown", SKIN, "dark"), ("a black person", SKIN, "dark"),
    ("Caucasian", ETHNICITY, "white"), ("The person appears to be Caucasian", ETHNICITY, "white"),
    ("caucasians", ETHNICITY, "white"), ("European", ETHNICITY, "white"),
    ("African American", ETHNICITY, "black"), ("African-Americans", ETHNICITY, "black"), ("an African person", ETHNICITY, "black"),
    ("Latino", ETHNICITY, "hispanic"), ("Latinas", ETHNICITY, "hispanic"), ("a Latina woman", ETHNICITY, "hispanic"),
    ("Indian", ETHNICITY, "south asian"), ("an Indian person", ETHNICITY, "south asian"), ("Pakistani", ETHNICITY, "south asian"),
    ("East Asian", ETHNICITY, "asian"), ("Chinese", ETHNICITY, "asian"), ("Koreans", ETHNICITY, "asian"),
    ("Middle-Eastern", ETHNICITY, "middle eastern"), ("Arab", ETHNICITY, "middle eastern"), ("Persian", ETHNICITY, "middle eastern"),
    ("South Asian", ETHNICITY, "south asian"), ("a robot", ETHNICITY, "other"), ("a robot", SKIN, "other"),
])
def test_what_evaluators_say_for_skin_tone_and_ethnicity_matches_the_classes(answer, choices, expected):
    assert match_choice(answer, choices) == expected


# -- probabilities from real model code (item 1) --------------------------------------------------
def _probs_ok(answers: list[ClassAnswer], choices: list[str]) -> None:
    for a in answers:
        assert list(a.probs) == choices and math.isclose(sum(a.probs.values()), 1.0, abs_tol=1e-9)
        assert a.answer == max(a.probs, key=a.probs.get) and all(0.0 <= p <= 1.0 for p in a.probs.values())


def _softmax(scores):
    scores = np.asarray(scores, float)
    e = np.exp(scores - scores.max())
    return e / e.sum()


@pytest.mark.real_model
def test_blip_ranks_the_classes_by_their_likelihood_as_the_whole_answer(tiny):
    import torch

    vqa = load_backend(tiny["blip_vqa"])
    answers = vqa.answer_classes(IMAGES, QUESTION, SKIN)
    _probs_ok(answers, SKIN)
    # the same likelihoods from BlipForQuestionAnswering's own training loss on "[DEC] answer [SEP]"
    model, tok = vqa.model, vqa.processor.tokenizer
    for image, got in zip(IMAGES[:2], answers):
        inputs = vqa.processor(images=[image], text=[QUESTION], return_tensors="pt")
        scores = []
        for choice in SKIN:
            ids = [model.decoder_start_token_id, *tok(choice, add_special_tokens=False).input_ids,
                   model.config.text_config.sep_token_id]
            with torch.inference_mode():
                loss = model(**inputs, labels=torch.tensor([ids])).loss
            scores.append(-float(loss) * (len(ids) - 1))      # mean over the predicted tokens -> their sum
        assert np.allclose(_softmax(scores), [got.probs[c] for c in SKIN], atol=1e-5)


@pytest.mark.real_model
@pytest.mark.parametrize("builder", ["build_tiny_qwen2_vl", "build_tiny_vlm"])
def test_a_vlm_reads_each_listed_options_probability_from_its_token_scores(tiny_root, builder):
    import torch

    vqa = load_backend(getattr(tiny_models, builder)(tiny_root))
    answers = vqa.answer_classes(IMAGES, QUESTION, SKIN)
    _probs_ok(answers, SKIN)
    text = vqa.prefix + QUESTION + VLM_CHOICES_SUFFIX.format(choices=", ".join(SKIN))
    assert [a.text for a in answers] == vqa.ask(IMAGES, text)        # its own words, kept beside the class
    tokenizer = vqa.processor.tokenizer
    for image, got in zip(IMAGES[:2], answers):
        inputs = vqa._inputs([image], text)
        scores = []
        for choice in SKIN:       # the model's own loss on the option after the prompt, prompt tokens masked
            option = tokenizer(choice, add_special_tokens=False).input_ids
            ids = torch.cat([inputs["input_ids"], torch.tensor([option])], dim=1)
            labels = torch.full_like(ids, -100)
            labels[0, -len(option):] = torch.tensor(option)
            text_only = {k: torch.cat([v, torch.zeros((1, len(option)), dtype=v.dtype)], dim=1)   # Qwen2-VL's mm_token_type_ids
                         for k, v in inputs.items() if k not in ("input_ids", "attention_mask")
                         and tuple(getattr(v, "shape", ())) == tuple(inputs["input_ids"].shape)}
            with torch.inference_mode():
                loss = vqa.model(**{**inputs, **text_only, "input_ids": ids, "attention_mask": torch.ones_like(ids)},
                                 labels=labels).loss
            scores.append(-float(loss) * len(option))
        assert np.allclose(_softmax(scores), [got.probs[c] for c in SKIN], atol=1e-4)


@pytest.mark.real_model
def test_clip_zero_shot_is_a_softmax_over_the_class_prompts(tiny):
    embedder = load_backend(tiny["hf_clip"])
    vqa = ClipVQA(embedder)
    answers = vqa.answer_classes(IMAGES, QUESTION, SKIN)
    _probs_ok(answers, SKIN)
    cosine = vqa.scores(IMAGES, QUESTION, SKIN)
    assert np.allclose([[a.probs[c] for c in SKIN] for a in answers], [_softmax(100 * row) for row in cosine])
    assert [a.answer for a in answers] == vqa.answer(IMAGES, QUESTION, SKIN)   # the same class as before


@pytest.mark.real_model
def test_the_threshold_turns_low_confidence_answers_into_cant_tell(tiny, data_dir):
    engine = Engine("synthetic", data_dir=data_dir, vqa=tiny["vlm"])   # its answers differ a little between images
    records = engine.image_set("a photo of a doctor", range(6))
    scored = engine.ask_scored(records, QUESTION, SKIN)
    tops = sorted(max(a.probs.values()) for a in scored)
    assert tops[0] < tops[-1]
    engine.cant_tell_below = (tops[0] + tops[-1]) / 2
    labels = engine.ask(records, QUESTION, SKIN)
    assert engine.stats.answers_computed == 6                                  # the threshold reads the store
    for a, label in zip(scored, labels):
        assert label == (CANT_TELL if max(a.probs.values()) < engine.cant_tell_below else a.answer)
    assert CANT_TELL in labels and set(labels) - {CANT_TELL} <= set(SKIN)
    stored = engine.store.answers_for_image(records[0].key)
    assert [r["answer"] for r in stored] == [scored[0].answer] and stored[0]["probs"]   # the class itself is stored
    assert engine.answer_probs(records, QUESTION, SKIN)[0] == scored[0].probs


def test_label_of_never_folds_cant_tell_into_a_class():
    sure, unsure = ClassAnswer("male", {"male": 0.8, "female": 0.2}), ClassAnswer("male", {"male": 0.55, "female": 0.45})
    assert [label_of(a, 0.6) for a in (sure, unsure)] == ["male", CANT_TELL]
    assert label_of(unsure, 0.0) == "male" and label_of(ClassAnswer("other"), 0.99) == "other"


# -- the synthetic world: abstention against the truth (item 2) ------------------------------------
def test_abstaining_raises_a_noisy_evaluators_accuracy_on_the_images_it_answers(tmp_path):
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from abstention import measure

    out = measure(0.3, 120, 0.6, data_dir=str(tmp_path))["all"]
    # the planted error rate, against the renderer's truth: about 0.3 wrong without abstention
    assert 0.55 < out["accuracy"] < 0.8
    assert out["accuracy_answered"] > out["accuracy"] + 0.05 and 0.5 < out["answered"] < 0.95
    never = measure(0.3, 120, 0.0, data_dir=str(tmp_path))["all"]
    assert never["answered"] == 1.0 and never["accuracy_answered"] == never["accuracy"] == out["accuracy"]


def test_single_prompt_counts_cant_tell_apart_and_says_so_above_a_fifth(tmp_path):
    from engine.methods import single_prompt
    from engine.report.single_prompt import page

    engine = Engine("synthetic", data_dir=str(tmp_path), options={"vqa": {"error_rate": 0.4}})
    done = list(single_prompt.run(single_prompt.SinglePromptRequest("a photo of a doctor", n=40, gap=False,
                                                                    n_boot=100), engine))[-1]
    results = done.results
    for name, m in results["axes"].items():
        assert m["cant_tell"] == sum(label == CANT_TELL for label in m["labels"])
        assert CANT_TELL not in m["classes"] and m["n"] + m["n_excluded"] == 40 and m["n_excluded"] >= m["cant_tell"]
        assert (m["cant_tell_share"] > 0.2) == bool(m["cant_tell_note"])
    assert any(m["cant_tell_note"] for m in results["axes"].values())
    key = results["images"][0]["key"]
    assert set(results["answer_probs"][key]) == {"gender", "age", "skin tone"}
    for axis, probs in results["answer_probs"][key].items():
        assert math.isclose(sum(probs.values()), 1.0) and results["answers"][key][axis] in (*probs, CANT_TELL)
    html = str(page(results))
    assert "can&#39;t tell" in html and "could not tell on" in html
