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
from engine.backends.vqa import VLM_CHOICES_SUFFIX, ClipVQA, match_choice, reply_variants
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
    # the longest phrase first: "light" inside "light brown" is not the class light
    ("light brown", SKIN, "medium"), ("Light brown skin.", SKIN, "medium"), ("a light-brown-skinned man", SKIN, "medium"),
    ("light", SKIN, "light"), ("light skin", SKIN, "light"), ("deep brown", SKIN, "dark"),
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
@pytest.mark.parametrize("builder", ["build_tiny_qwen2_vl", "build_tiny_vlm", "build_tiny_paligemma"])
def test_a_vlm_reads_each_listed_options_probability_from_its_token_scores(tiny_root, builder):
    import torch

    vqa = load_backend(getattr(tiny_models, builder)(tiny_root))
    answers = vqa.answer_classes(IMAGES, QUESTION, SKIN)
    _probs_ok(answers, SKIN)
    text = vqa.prefix + QUESTION + VLM_CHOICES_SUFFIX.format(choices=", ".join(SKIN))
    assert [a.text for a in answers] == vqa.ask(IMAGES, text)        # its own words, kept beside the class
    tokenizer = vqa.processor.tokenizer
    for image, got in zip(IMAGES[:2], answers):
        inputs = {k: v for k, v in vqa._inputs([image], text).items() if k != "labels"}
        scores = []
        for choice in SKIN:       # the model's own loss on each way of writing the option, then its end of turn
            variants = []
            for written in reply_variants([choice]):
                option = tokenizer(written[1], add_special_tokens=False).input_ids + [tokenizer.eos_token_id]
                ids = torch.cat([inputs["input_ids"], torch.tensor([option])], dim=1)
                labels = torch.full_like(ids, -100)
                labels[0, -len(option):] = torch.tensor(option)
                grown = {k: torch.cat([v, torch.full((1, len(option)), int(k == "token_type_ids"), dtype=v.dtype)], dim=1)
                         for k, v in inputs.items() if k in ("token_type_ids", "mm_token_type_ids")}   # PaliGemma: 1
                with torch.inference_mode():
                    loss = vqa.model(**{**inputs, **grown, "input_ids": ids, "attention_mask": torch.ones_like(ids)},
                                     labels=labels).loss
                variants.append(-float(loss) * len(option))
            scores.append(float(np.log(np.exp(variants).sum())))
        assert np.allclose(_softmax(scores), [got.probs[c] for c in SKIN], atol=1e-4)


@pytest.mark.real_model
def test_clip_zero_shot_is_a_softmax_over_the_class_prompts(tiny):
    embedder = load_backend(tiny["hf_clip"])
    vqa = ClipVQA(embedder)
    answers = vqa.answer_classes(IMAGES, QUESTION, SKIN)
    _probs_ok(answers, SKIN)
    cosine = vqa.scores(IMAGES, QUESTION, SKIN)
    scale = float(embedder.model.logit_scale.detach().exp())   # the loaded model's temperature (100 for released CLIPs)
    assert np.allclose([[a.probs[c] for c in SKIN] for a in answers], [_softmax(scale * row) for row in cosine])
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


# -- several evaluators (item 4) ---------------------------------------------------------------------
def test_fleiss_kappa_of_fleiss_worked_example():
    from engine.metrics.agreement import fleiss_kappa

    # 10 subjects, 14 raters, 5 categories (Fleiss 1971; the example of Wikipedia's "Fleiss' kappa"): 0.210
    table = np.array([[0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
                      [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7]])
    assert round(fleiss_kappa(table), 3) == 0.210
    assert math.isnan(fleiss_kappa(np.array([[3, 0], [3, 0]])))                    # one category: undefined


def test_three_evaluators_agreement_by_hand():
    from engine.metrics.agreement import evaluators_agreement

    labels = {"a": ["male", "male", "female", "female"], "b": ["male", "female", "female", CANT_TELL],
              "c": ["male", "male", "female", "female"]}
    out = evaluators_agreement(labels, ["male", "female"], ["k1", "k2", "k3", "k4"])
    assert out["agreement"] == 0.5 and out["agreed"] == {"male": 1, "female": 1}
    assert out["classes"] == ["male", "female", CANT_TELL] and out["kappa_method"] == "Fleiss"
    # κ over the images all three answered (k1-k3; b could not tell on k4), as the spot-check's κ leaves
    # "can't tell" out. By hand: P_i = 1, 1/3, 1 -> P̄ = 7/9; p = (5/9, 4/9) -> P̄e = 41/81; κ = 22/40
    assert out["answered"] == {"a": 4, "b": 3, "c": 4} and out["n_answered"] == 3
    assert math.isclose(out["kappa"], (7 / 9 - 41 / 81) / (1 - 41 / 81))
    assert out["kappa_ci"][0] <= out["kappa"] <= out["kappa_ci"][1]              # Fleiss' κ has its interval
    assert [(p["evaluators"], p["n"]) for p in out["pairs"]] == [(["a", "b"], 3), (["a", "c"], 4), (["b", "c"], 3)]
    assert out["pairs"][1]["kappa"] == 1.0                                       # a and c always agree
    assert out["disagreements"] == [{"key": "k2", "answers": {"a": "male", "b": "female", "c": "male"}},
                                    {"key": "k4", "answers": {"a": "female", "b": CANT_TELL, "c": "female"}}]
    two = evaluators_agreement({"a": labels["a"], "b": labels["b"]}, ["male", "female"], ["k1", "k2", "k3", "k4"])
    assert two["kappa_method"] == "Cohen" and two["agreement_matrix"] == [[1, 1, 0], [0, 1, 1], [0, 0, 0]]
    assert two["n_answered"] == 3 and math.isclose(two["kappa"], 0.4)     # over k1-k3: p_o = 2/3, p_e = 4/9


def test_kappa_is_undefined_when_no_image_was_answered_by_both():
    """Issue 42 item 3: CLIP said "can't tell" on every skin-tone image. κ was 0.000 [0.000, 0.000],
    which reads as certain disagreement; it is undefined, says why, and each evaluator's count shows."""
    from engine.metrics.agreement import evaluators_agreement
    from engine.report import trust

    keys = [f"k{i}" for i in range(32)]
    tones = (["light"] * 21 + ["medium"] * 5 + ["dark"] * 6)
    labels = {"synthetic_vqa:synthetic_world.json": tones, "clip_vqa:synthetic": [CANT_TELL] * 32}
    out = evaluators_agreement(labels, ["light", "medium", "dark"], keys)
    assert out["kappa"] is None and out["kappa_ci"] == [None, None]
    assert out["kappa_undefined"] == "no image answered by both"
    assert out["answered"] == {"synthetic_vqa:synthetic_world.json": 32, "clip_vqa:synthetic": 0}
    assert out["agreement_matrix"][0][3] == 21                       # the matrix still holds every image
    three = evaluators_agreement({**labels, "faces:bundled": ["no face found"] * 32}, ["light", "medium", "dark"], keys)
    assert three["kappa"] is None and three["kappa_undefined"] == "no image answered by all 3"
    for d in out["disagreements"]:
        d["seed"] = int(d["key"][1:])                                # as compare_evaluators_on adds it
    page = str(trust.comparison_html({"evaluators": list(labels), "axes": {"skin tone": out}}))
    kappa = page.split('data-metric="kappa">')[1].split("</span>")[0]
    assert kappa == "undefined: no image answered by both" and "0.000 [0.000, 0.000]" not in page
    assert "synthetic_vqa:synthetic_world.json 32 of 32" in page and "clip_vqa:synthetic 0 of 32" in page


def test_two_evaluators_on_the_synthetic_world_from_the_command_line(tmp_path, capsys):
    """`--vqa A --vqa B`: the noisy synthetic VQA (30% planted errors) and CLIP zero-shot over the synthetic
    embedder (which reads the world as it is) on the same images: per axis the agreement, Cohen's κ, the
    distribution where they agree and the images where they disagree, with both answers, in the JSON."""
    import json

    from engine.backends.synthetic import render_attributes
    from engine.cli import main

    noisy, clip = "synthetic_vqa:default", "clip_vqa:synthetic"
    assert main(["single-prompt", "--preset", "synthetic", "--vqa", noisy, "--vqa-option", "error=0.3", "--vqa", clip,
                 "--prompt", "a photo of a doctor", "-n", "32", "--axes", "gender", "age", "--no-gap",
                 "--data-dir", str(tmp_path), "--json"]) == 0
    results = json.loads(capsys.readouterr().out)
    compared = results["evaluators"]
    first = "synthetic_vqa:default [error=0.3]"
    assert compared["evaluators"] == [first, clip]
    gender = compared["axes"]["gender"]
    assert gender["kappa_method"] == "Cohen" and gender["n"] == 32 and gender["kappa"] < 0.9
    disagree = {d["key"]: d for d in gender["disagreements"]}
    assert disagree and len(disagree) == round((1 - gender["agreement"]) * 32)
    agreed = sum(gender["agreed"].values())
    matrix = np.array(gender["agreement_matrix"])
    assert agreed == np.trace(matrix[:2, :2]) and agreed + len(disagree) <= 32
    for key, d in disagree.items():
        assert d["answers"][first] != d["answers"][clip]
        assert d["answers"][first] == results["answers"][key]["gender"]          # the run's own answer
    # where CLIP disagrees with the noisy VQA on a class, CLIP is right more often (the world's truth)
    seeds = {im["key"]: im["seed"] for im in results["images"]}
    clip_right = sum(d["answers"][clip] == render_attributes("a photo of a doctor", seeds[k])["gender"]
                     for k, d in disagree.items() if CANT_TELL not in d["answers"].values())
    noisy_right = sum(d["answers"][first] == render_attributes("a photo of a doctor", seeds[k])["gender"]
                      for k, d in disagree.items() if CANT_TELL not in d["answers"].values())
    assert clip_right > noisy_right
    assert main(["generate", "--preset", "synthetic", "--vqa", noisy, "--vqa", clip, "--prompt", "a doctor", "-n", "1",
                 "--data-dir", str(tmp_path)]) == 2
    assert "compared by single-prompt" in capsys.readouterr().err


# -- ZeroGPU and memory details (item 7) -----------------------------------------------------------------
BLACKWELL = "NVIDIA RTX PRO 6000 Blackwell Server Edition"


def test_the_zero_gpu_profile_is_the_one_spaces_reports(monkeypatch):
    """spaces 0.51.3 reads the card's model from the driver's files; GapLens takes its memory, SMs,
    duration factor and xlarge threshold from that profile instead of assuming the H200 slice."""
    from spaces.zero import config as zero_config

    from engine.backends import device
    from engine.hosting import space
    from engine.models.presets import PRESETS

    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    monkeypatch.setattr(zero_config, "_read_gpu_information", lambda: f"Model: \t\t {BLACKWELL}\nIRQ: 1\n")
    zero_config.get_config.cache_clear()
    try:
        profile = device.zero_gpu_profile()
        assert (profile["model"], profile["sm_count"], profile["duration_factor"]) == (BLACKWELL, 188, 1.5)
        assert device.DeviceMemory().total_bytes("cuda") == 101973950464           # 95 GiB, no CUDA call
        assert round(space.space_gpu_memory_gb(), 1) == 95.0
        # above 45 GB of weights spaces attaches "xlarge" (counted twice); the durations asked on each
        # profile: tests/test_gpu_handlers.py
        preset = PRESETS["sdxl-turbo"]
        big = {**profile, "xlarge_threshold": 2**30}
        assert space.xlarge(preset, big) and not space.xlarge(preset, profile)
    finally:
        zero_config.get_config.cache_clear()


def test_evaluation_working_memory_follows_image_size_and_batch():
    from engine.backends.base import ModelSpec
    from engine.models import plan as plans
    from engine.models.presets import PRESETS

    qwen = ModelSpec("vlm", "Qwen/Qwen2-VL-2B-Instruct")
    # 1024² at batch 8: ceil(1024² / 28²) = 1,338 visual tokens an image (the "about 1,225")
    assert plans.working_bytes(qwen, 1024 * 1024) == int(0.25 * 2**30 + 8 * 1338 * 256 * 2**10)
    assert plans.working_bytes(qwen, 1024 * 1024) / 2**30 > 2.5 > plans.EVAL_WORKING_GB
    assert plans.working_bytes(ModelSpec("vlm", "x", {"batch_size": 2}), 512 * 512) == int(0.25 * 2**30 + 2 * 335 * 2**18)
    blip = ModelSpec("blip_vqa", "Salesforce/blip-vqa-base")
    assert plans.working_bytes(blip, 1024 * 1024) == plans.working_bytes(blip, 512 * 512) == int(
        0.25 * 2**30 + 16 * 577 * 64 * 2**10)                                       # BLIP resizes to 384 px
    # a preset's plan evaluates the generator's images at its family's size: 1024² for FLUX, 512² for SDXL-Turbo
    assert plans.image_pixels(PRESETS["flux-schnell"].generator) == 1024 * 1024
    assert plans.image_pixels(PRESETS["sdxl-turbo"].generator) == 512 * 512
    assert plans.image_pixels(PRESETS["synthetic"].generator) is None


@pytest.mark.real_model
def test_parking_an_fp16_pipeline_in_host_ram_logs_no_warning(tiny):
    """Eviction's move to the CPU is intended: diffusers' "cannot run with cpu device" is silenced there."""
    import logging

    from diffusers.utils import logging as diffusers_logging

    from engine.backends.base import ModelSpec

    spec = tiny["generator"]
    generator = load_backend(ModelSpec(spec.backend, spec.model, {**spec.options, "dtype": "fp16"}), "cpu")
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record):
            records.append(record)

    logger = diffusers_logging.get_logger("diffusers")
    handler = Keep()
    logger.addHandler(handler)
    try:
        generator.pipe.to("cpu")                                                   # the warning exists...
        assert any("cannot run with `cpu` device" in r.getMessage() for r in records)
        records.clear()
        assert generator.move_to("cpu") and generator.device == "cpu"              # ...and eviction does not log it
        assert not any("cannot run with" in r.getMessage() for r in records)
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize("name", ["intersectional", "mitigate"])
def test_sets_count_cant_tell_apart_in_every_distribution(name, tmp_path):
    """Intersectional and Mitigate: "can't tell" is neither a class nor 'other' (the in-class counts plus
    the "can't tell" ones are every image), is counted per distribution, and is its own bar on the page."""
    from engine.methods import METHODS
    from engine.report import page_for

    engine = Engine("synthetic", data_dir=str(tmp_path), options={"vqa": {"error_rate": 0.4}})
    axes = {"gender": ["a photo of a male doctor", "a photo of a female doctor"],
            "age": ["a photo of a young doctor", "a photo of an old doctor"]}
    method = METHODS[name]
    results = list(method.run(method.request(prompt="a photo of a doctor", axes=axes, n=12, n_boot=0), engine))[-1].results
    for y in axes:
        told = [a[y] for a in results["answers"].values()]
        assert results["cant_tell"][y]["cant_tell"] == told.count(CANT_TELL) > 0
        # "can't tell" is not 'other': outside the choices are only the answers neither a class nor "can't tell"
        assert results["outside_choices"][y] == sum(a not in (*results["values"][y], CANT_TELL) for a in told)
        if name == "intersectional":
            ct = results["distributions"][y]["cant_tell"]
            assert ct["initial"]["cant_tell"] + sum(m["cant_tell"] for m in ct["mixed"].values()) == told.count(CANT_TELL)
        else:
            d, state = results["report"][y]["initial"], results["states"][0]
            outside = sum(a not in (*d["values"], CANT_TELL) for a in told[:state["n_images"]])
            assert sum(d["counts"]) + d["cant_tell"] + outside == state["n_images"] and CANT_TELL not in d["values"]
            assert (d["cant_tell_share"] > 0.2) == bool(d["cant_tell_note"])
    if name == "intersectional":   # the distributions are the pair panel's (a matrix cell clicked)
        from engine.report.intersectional import pair_html
        html = str(pair_html(results, "gender", "age"))
    else:
        html = str(page_for(name)(results))
    assert "can&#39;t tell" in html
