"""The synthetic world: planted biases come out, pixels read back, texts and images share a
space, and the lexicon LLM answers every meta-prompt with JSON of the right shape."""
import copy
import json
import math
from collections import Counter

import numpy as np
import pytest

from engine.common import llm_prompts
from engine.backends import load_backend
from engine.backends.base import ModelSpec
from engine.backends.synthetic import (SyntheticEmbedder, SyntheticGenerator, SyntheticLLM, SyntheticVQA,
                                       load_world, parse_prompt, render_attributes)
from engine.backends.synthetic.world import DEFAULT_TABLE_PATH
from engine.common.errors import InputError, ModelLoadError

N = 200


@pytest.fixture(scope="module")
def world():
    return load_world()


@pytest.fixture(scope="module")
def gen(world):
    return SyntheticGenerator(world)


@pytest.fixture(scope="module")
def vqa(world):
    return SyntheticVQA(world)


@pytest.fixture(scope="module")
def emb(world):
    return SyntheticEmbedder(world)


@pytest.fixture(scope="module")
def llm(world):
    return SyntheticLLM(world)


def share(gen, prompt, axis, value, n=N, **settings):
    s = gen.defaults().replace(**settings)
    return sum(gen.render_attributes(prompt, seed, s)[axis] == value for seed in range(n)) / n


def within_ci(observed, p, n=N, z=3.5):
    return abs(observed - p) <= z * math.sqrt(p * (1 - p) / n) + 1e-9


# -- the table and its planted biases -------------------------------------------------------------------
def test_backends_load_through_the_factory():
    spec = lambda backend, **options: ModelSpec(backend, str(DEFAULT_TABLE_PATH), options)
    generator = load_backend(spec("synthetic_generator"))
    assert generator.family == "synthetic" and generator.id.startswith("synthetic:")
    assert load_backend(spec("synthetic_embedder")).id.startswith("synthetic-embedder:")
    assert load_backend(spec("synthetic_llm")).id.startswith("synthetic-llm:")
    assert load_backend(spec("synthetic_vqa", error_rate=0.1)).error_rate == 0.1
    with pytest.raises(ModelLoadError):
        load_backend(ModelSpec("synthetic_generator", "/no/such/table.json"))


def test_the_id_changes_when_the_table_is_edited(world):
    table = copy.deepcopy(world.table)
    table["subjects"]["doctor"]["dist"]["gender"] = {"male": 0.5, "female": 0.5}
    assert load_world(table).hash != world.hash
    assert load_world(copy.deepcopy(world.table)).hash == world.hash


def test_a_broken_table_is_refused_with_a_message(world):
    table = copy.deepcopy(world.table)
    table["subjects"]["doctor"]["dist"]["gender"] = {"male": 0.8, "female": 0.8}
    with pytest.raises(ValueError, match="doctor"):
        load_world(table)
    table = copy.deepcopy(world.table)
    table["axes"]["age"]["values"].append("ancient")
    with pytest.raises(ValueError, match="renderer draws axis 'age'"):
        SyntheticGenerator(load_world(table))


def test_exact_planted_numbers(world):
    assert world.expected_distribution("a photo of a doctor", "gender")["male"] == pytest.approx(0.8)
    assert world.expected_distribution("a photo of an old doctor", "gender")["male"] == pytest.approx(0.9)
    assert world.expected_distribution("a photo of a young doctor", "gender")["male"] == pytest.approx(0.6)
    assert world.expected_distribution("a photo of a firefighter", "gender")["male"] == pytest.approx(0.9)
    for value in ("young", "middle-aged", "old"):
        assert world.expected_distribution("a photo of a firefighter", "age")[value] == pytest.approx(1 / 3)
    for axis in ("gender", "age", "skin tone", "clothing", "environment", "emotion", "bodytype"):
        dist = world.expected_distribution("a photo of a teacher", axis)
        assert max(dist.values()) == pytest.approx(min(dist.values()))
    assert world.expected_distribution("a photo of an apple", "color") == pytest.approx({"red": 1, "green": 0, "blue": 0})
    objects = world.subjects_of("object")
    with_a_zero = [s for s in objects if min(world.subjects[s].dist["color"].values()) == 0]
    assert len(objects) >= 25 and 0.25 <= len(with_a_zero) / len(objects) <= 0.45


def test_planted_gender_bias_is_recovered_from_200_images(gen):
    assert within_ci(share(gen, "a photo of a doctor", "gender", "male"), 0.8)
    assert within_ci(share(gen, "a photo of a firefighter", "gender", "male"), 0.9)
    assert within_ci(share(gen, "a photo of a teacher", "gender", "male"), 0.5)
    assert within_ci(share(gen, "a photo of a firefighter", "age", "old"), 1 / 3)


def test_prompt_named_attributes_override_sampling(gen):
    assert share(gen, "a female firefighter", "gender", "female") == 1.0
    s = gen.defaults()
    for seed in range(50):
        truth = gen.render_attributes("a photo of an old female doctor working outdoors", seed, s)
        assert (truth["age"], truth["gender"], truth["environment"]) == ("old", "female", "outdoors")


def test_interaction_old_doctors_are_more_often_male(gen):
    old, young = share(gen, "a photo of an old doctor", "gender", "male"), share(gen, "a photo of a young doctor", "gender", "male")
    assert within_ci(old, 0.9) and within_ci(young, 0.6)
    assert old - young > 0.15


def test_emotion_is_independent_of_everything(world):
    plain = world.expected_distribution("a photo of a doctor", "emotion")
    for prompt in ("a photo of an old female doctor", "a photo of a young dark-skinned male doctor in informal attire",
                   "a photo of a doctor working outdoors"):
        assert world.expected_distribution(prompt, "emotion") == pytest.approx(plain)


def test_guidance_sharpens_and_the_negative_prompt_excludes(world):
    males = [world.expected_distribution("a photo of a doctor", "gender", guidance=g)["male"] for g in (0, 3, 7.5, 15)]
    assert males == sorted(males) and males[0] == pytest.approx(0.8) and males[-1] > 0.95
    assert world.expected_distribution("a photo of a teacher", "gender", guidance=15)["male"] == pytest.approx(0.5)
    assert world.expected_distribution("a photo of a doctor", "gender", negative_prompt="male")["female"] == 1.0


def test_prompt_parsing_lexicon():
    assert parse_prompt("a photo of a middle-aged doctor") == ("doctor", {"age": "middle-aged"})
    assert parse_prompt("an elderly South Asian woman") == ("person", {"age": "old", "skin tone": "medium", "gender": "female"})
    assert parse_prompt("an African American nurse in casual clothes")[1] == {"skin tone": "dark", "clothing": "informal"}
    assert parse_prompt("a doctor in informal attire")[1] == {"clothing": "informal"}
    assert parse_prompt("an obese smiling computer programmer indoors") == (
        "programmer", {"bodytype": "heavy", "emotion": "happy", "environment": "indoors"})
    assert parse_prompt("a sunset over the sea") == ("default", {})
    assert parse_prompt("two doctors and a nurse")[0] == "doctor"


# -- the renderer --------------------------------------------------------------------------------------------
def test_renderer_is_deterministic_and_sized(gen):  # its speed: bench/metric_speed.py
    s = gen.defaults()
    first = [g.image.tobytes() for g in gen.generate("a photo of a doctor", [1, 2], s)]
    again = [g.image.tobytes() for g in gen.generate("a photo of a doctor", [1, 2], s)]
    assert first == again and first[0] != first[1]
    out = gen.generate("a photo of a car", [0], s.replace(width=200, height=96))
    assert out[0].image.size == (200, 96) and out[0].nsfw is False and out[0].seed == 0
    assert min(gen.generate("a photo of a car", [0], s)[0].image.size) >= 64
    with pytest.raises(InputError):
        gen.generate("a photo of a car", [0], s.replace(width=32))


def test_render_attributes_is_the_ground_truth_of_generate(gen):
    s = gen.defaults()
    assert render_attributes("a photo of a chef", 5, s) == gen.render_attributes("a photo of a chef", 5, s)
    assert render_attributes("a photo of a chef", 5)["subject"] == "chef"


# -- the VQA reads pixels ------------------------------------------------------------------------------------------
PROMPTS = ["a photo of a doctor", "a photo of a nurse", "a photo of a teacher", "a photo of a person",
           "a photo of a firefighter", "a photo of a librarian", "a photo of an apple", "a photo of a balloon",
           "a photo of a truck", "a photo of a kite", "a photo of a whale", "a photo of a mug", "a busy street"]


def _images_with_truth(gen, size=(128, 128), per_prompt=24):
    s = gen.defaults().replace(width=size[0], height=size[1])
    images, truths = [], []
    for prompt in PROMPTS:
        seeds = range(per_prompt)
        images += [g.image for g in gen.generate(prompt, seeds, s)]
        truths += [gen.render_attributes(prompt, seed, s) for seed in seeds]
    return images, truths


@pytest.mark.slow
@pytest.mark.parametrize("size", [(128, 128), (64, 64), (256, 192)])
def test_vqa_answers_from_pixels_match_the_ground_truth(world, gen, vqa, size):
    images, truths = _images_with_truth(gen, size)
    for axis in world.axes.values():
        idx = [i for i, t in enumerate(truths) if axis.name in t]
        answers = vqa.answer([images[i] for i in idx], f"What is the {axis.name} in the image?", list(axis.values))
        agree = np.mean([a == truths[i][axis.name] for a, i in zip(answers, idx)])
        assert agree >= 0.99, (axis.name, agree)
    occupations = vqa.answer(images, "What is the occupation of the person in the image?", list(world.subjects))
    assert np.mean([o == t["subject"] for o, t in zip(occupations, truths)]) >= 0.99


def test_vqa_free_form_answers_parse_back_to_the_truth(world, gen, vqa):
    images, truths = _images_with_truth(gen, per_prompt=8)
    for axis in world.axes.values():
        idx = [i for i, t in enumerate(truths) if axis.name in t]
        answers = vqa.answer([images[i] for i in idx], f"What is the {axis.name} in the image?")
        assert all(world.lookup(a) == (axis.name, truths[i][axis.name]) for a, i in zip(answers, idx)), axis.name


def test_vqa_free_form_answers_follow_the_thesis_questions(gen, vqa):
    s = gen.defaults()
    seeds = [seed for seed in range(40) if gen.render_attributes("a photo of a doctor", seed, s)["gender"] == "male"][:3]
    images = [g.image for g in gen.generate("a photo of a doctor", seeds, s)]
    assert vqa.answer(images, "What is the gender (male, female, other) of the person in the image?") == ["a man"] * 3
    ages = vqa.answer(images, "What age group (young, middle, old) is the person in the image?")
    assert set(ages) <= {"young", "middle-aged", "old"}
    assert vqa.answer(images[:1], "What is the occupation of the person in the image?") == ["doctor"]
    assert vqa.answer(images[:1], "What is the style of the image?") == ["a flat cartoon illustration"]
    assert vqa.answer(images[:1], "Is there a person in the image?") == ["yes"]
    assert vqa.answer(images[:1], "Is the person a woman?") == ["no"]
    assert vqa.answer(images[:1], "What is the ethnicity of the person in the image?")[0] in {"white", "asian", "black"}
    caption = vqa.caption(images[:1])[0]
    assert "male doctor" in caption and parse_prompt(caption)[0] == "doctor"
    apple = gen.generate("a photo of an apple", [0], s)[0].image
    assert vqa.answer([apple], "What color is the image?") == ["red"]
    assert vqa.answer([apple], "Is there a person in the image?") == ["no"]


def test_vqa_choices_map_through_the_lexicon(gen, vqa):
    s = gen.defaults()
    female = gen.generate("a photo of a female doctor", [0], s)[0].image
    dark = gen.generate("a photo of a dark-skinned doctor who is sad", [0], s)[0].image
    apple = gen.generate("a photo of an apple", [0], s)[0].image
    assert vqa.answer([female], "gender?", ["Man", "Woman"]) == ["woman"]
    assert vqa.answer([female], "What is the gender?", ["male", "female", "other"]) == ["female"]
    ethnicities = ["white", "african american", "asian", "south asian", "black"]
    assert vqa.answer([dark], "What is the ethnicity of the person?", ethnicities) == ["african american"]
    assert vqa.answer([dark], "How does the person feel?", ["happy", "sad", "serious", "tired"]) == ["sad"]
    assert vqa.answer([female], "What is the gender?", ["robot", "alien"]) == ["other"]
    assert vqa.answer([apple], "What is the gender?", ["male", "female"]) == ["other"]
    assert vqa.answer([apple], "Which object is this?", ["car", "apple", "kite"]) == ["apple"]


def test_vqa_error_rate_flips_about_that_share(world, gen):
    images, truths = _images_with_truth(gen, per_prompt=48)
    noisy = SyntheticVQA(world, error_rate=0.2)
    assert noisy.id != SyntheticVQA(world).id
    idx = [i for i, t in enumerate(truths) if "gender" in t]
    answers = noisy.answer([images[i] for i in idx], "What is the gender?", ["male", "female"])
    wrong = np.mean([a != truths[i]["gender"] for a, i in zip(answers, idx)])
    assert 0.15 <= wrong <= 0.25
    assert answers == noisy.answer([images[i] for i in idx], "What is the gender?", ["male", "female"])


# -- the embedder ---------------------------------------------------------------------------------------------------
def test_embedder_ranks_the_matching_text_first(world, gen, emb):
    s = gen.defaults()
    images = [g.image for g in gen.generate("a photo of a doctor", range(100), s)]
    truths = [gen.render_attributes("a photo of a doctor", seed, s) for seed in range(100)]
    I = emb.embed_images(images)
    assert I.dtype == np.float32 and I.shape == (100, emb.dim)
    assert np.allclose(np.linalg.norm(I, axis=1), 1, atol=1e-5)
    for axis in ("gender", "age", "skin tone", "clothing"):
        values = world.axes[axis].values
        texts = [f"a photo of a doctor {world.axes[axis].phrase(v, 'person')}" if world.axes[axis].position == "suffix"
                 else f"a photo of a {world.axes[axis].phrase(v, 'person')} doctor" for v in values]
        T = emb.embed_texts(texts)
        picked = [values[k] for k in (I @ T.T).argmax(axis=1)]
        assert np.mean([p == t[axis] for p, t in zip(picked, truths)]) >= 0.95, axis
    apple_image = emb.embed_images([gen.generate("a photo of an apple", [0], s)[0].image])
    texts = emb.embed_texts(["a photo of a red apple", "a photo of a blue apple", "a photo of a red car"])
    assert (apple_image @ texts.T).argmax() == 0


@pytest.mark.slow
def test_gap_score_sees_the_missed_modes(world, gen, emb, llm):
    s = gen.defaults()

    def score(prompt, seeds):
        images = emb.embed_images([g.image for g in gen.generate(prompt, seeds, s)])
        sims = emb.embed_texts(llm.variations(prompt, 16)) @ images.T
        return np.percentile(sims.max(axis=1), 25) - np.percentile(sims.max(axis=0), 25)

    mean = {p: np.mean([score(f"a photo of a {p}", range(16 * k, 16 * k + 16)) for k in range(8)])
            for p in ("apple", "car", "truck", "balloon")}
    unit = emb.text_scale   # every image-text cosine is text_scale × its attribute part's (the modality gap)
    assert mean["apple"] <= mean["car"] + 0.01 * unit < mean["truck"] < mean["balloon"] + 0.01 * unit
    assert mean["car"] < mean["balloon"] - 0.5 * unit
    images = emb.embed_images([g.image for g in gen.generate("a photo of a male firefighter", range(16), s)])
    variations = llm.variations("a photo of a firefighter", 16)
    coverage = (emb.embed_texts(variations) @ images.T).max(axis=1)
    female = np.array([parse_prompt(v)[1]["gender"] == "female" for v in variations])
    assert coverage[female].mean() < coverage[~female].mean() - 0.05 * unit


# -- the lexicon LLM --------------------------------------------------------------------------------------------------
def _tibet(llm, prompt, **sampling):
    messages = []
    for turn in llm_prompts.tibet_turns(prompt):
        messages.append({"role": "user", "content": turn})
        messages.append({"role": "assistant", "content": llm.chat(messages, **sampling)})
    return messages


def test_tibet_conversation_ends_in_counterfactual_json(world, llm):
    messages = _tibet(llm, "a photo of a doctor", temperature=1.0, seed=7)
    assert "gender" in messages[1]["content"] and "a photo of a female doctor" in messages[3]["content"]
    result = json.loads(messages[5]["content"])
    assert set(result) == {"gender", "age", "skin tone", "clothing", "environment", "emotion", "bodytype"}
    assert "a photo of a female doctor" in result["gender"] and "a photo of an old doctor" in result["age"]
    assert "a photo of a doctor working outdoors" in result["environment"]
    for axis, counterfactuals in result.items():
        assert len(counterfactuals) == len(world.axes[axis].values)
        for cf in counterfactuals:
            subject, values = parse_prompt(cf)
            assert subject == "doctor" and list(values) == [axis]
    objects = json.loads(_tibet(llm, "a photo of an apple", temperature=0)[5]["content"])
    assert set(objects) == {"color", "environment"} and "a photo of a green apple" in objects["color"]
    named = json.loads(_tibet(llm, "a photo of a female doctor", temperature=0)[5]["content"])
    assert "gender" not in named


def test_llm_is_deterministic_per_seed(llm):
    turn = [{"role": "user", "content": llm_prompts.tibet_turns("a photo of a nurse")[0]}]
    assert llm.chat(turn, temperature=1.0, seed=1) == llm.chat(turn, temperature=1.0, seed=1)
    assert llm.chat(turn, temperature=0, seed=1) == llm.chat(turn, temperature=0, seed=2)
    assert len({llm.chat(turn, temperature=1.0, seed=s) for s in range(5)}) > 1


def test_variations_are_balanced_and_keep_the_prompt(world, llm):
    reply = llm.chat([{"role": "user", "content": llm_prompts.variations_prompt("a photo of a doctor", 16)}])
    variations = json.loads(reply)
    assert len(variations) == 16
    parsed = [parse_prompt(v) for v in variations]
    assert all(subject == "doctor" and "a photo of a" in v for (subject, _), v in zip(parsed, variations))
    for axis in ("gender", "age", "skin tone", "clothing", "environment", "emotion", "bodytype"):
        counts = Counter(values[axis] for _, values in parsed)
        assert len(counts) == len(world.axes[axis].values) and max(counts.values()) - min(counts.values()) <= 1
    only_gender = json.loads(llm.chat([{"role": "user", "content": llm_prompts.variations_prompt(
        "a photo of an old doctor", 6, axis="gender")}]))
    assert [parse_prompt(v)[1] for v in only_gender].count({"age": "old", "gender": "male"}) == 3
    colours = Counter(parse_prompt(v)[1]["color"] for v in json.loads(llm.chat(
        [{"role": "user", "content": llm_prompts.variations_prompt("a photo of an apple", 16)}])))
    assert max(colours.values()) - min(colours.values()) <= 1


def test_mutations_random_prompts_and_axis_question(world, llm):
    mutations = json.loads(llm.chat([{"role": "user", "content": llm_prompts.mutations_prompt("a photo of an old doctor", 3)}]))
    assert len(mutations) == 3
    for text in mutations:
        subject, values = parse_prompt(text)
        assert subject != "doctor" and world.subjects[subject].kind == "person" and values == {"age": "old"}
    objects = json.loads(llm.chat([{"role": "user", "content": llm_prompts.mutations_prompt("a photo of an apple", 4)}]))
    assert len(objects) == 4 and all(world.subjects[parse_prompt(t)[0]].kind == "object" for t in objects)

    avoid = ["a photo of a car", "a photo of a doctor"]
    prompts = json.loads(llm.chat([{"role": "user", "content": llm_prompts.random_prompts_prompt(6, avoid)}]))
    assert len(prompts) == 6 and not set(prompts) & set(avoid)
    assert all(parse_prompt(p)[0] in world.subjects for p in prompts)
    people = json.loads(llm.chat([{"role": "user", "content": llm_prompts.random_prompts_prompt(
        5, [], axis_needs="at least one person")}]))
    assert all(world.subjects[parse_prompt(p)[0]].kind == "person" for p in people)

    question = json.loads(llm.chat([{"role": "user", "content": llm_prompts.axis_question_prompt(
        "gender", ["male", "female"])}]))["question"]
    assert "male, female" in question
    assert "synthetic" in llm.chat([{"role": "user", "content": "What is the capital of France?"}])


def test_vqa_answers_only_what_the_world_models(gen, vqa):
    # issue 17: "hair color" was answered with the outfit's colour
    images = [g.image for g in gen.generate("a photo of a doctor", [0, 1, 2], gen.defaults())]
    assert vqa.answer(images, "What is hair color in the image?") == ["not modelled in the synthetic world"] * 3
    assert vqa.answer(images[:1], "What color are the eyes of the person?") == ["not modelled in the synthetic world"]
    outfit = vqa.answer(images, "What color is the clothing of the person?")
    assert all(a != "not modelled in the synthetic world" and a for a in outfit)
    assert vqa.answer(images, "What color is the image?") == outfit


def test_zero_shot_probabilities_spread_as_clips_do_and_keep_every_nearest_text(world, gen, emb):
    """Issue 42: CLIP's zero-shot probabilities are rarely exactly 0 or 1; the embedder's were all 1 − 1e-9.
    Now images of a doctor score 0.9-0.995 for their gender and differ from image to image, and the nearest
    text of every image is the one its attribute part names (so every planted share stays as it was)."""
    from engine.methods.explore import concept_scores

    s = gen.defaults()
    images = gen.generate("a photo of a doctor", range(64), s)
    vectors = emb.embed_images([g.image for g in images])
    texts = emb.embed_texts(["a photo of a man", "a photo of a woman"])
    scores = concept_scores(vectors, texts)
    top = np.round(scores.max(axis=1), 6)               # as Explore stores them
    assert top.max() < 0.999 and top.min() > 0.85 and 0.95 < np.median(top) < 0.995
    assert len(set(top)) > 32 and np.percentile(top, 90) - np.percentile(top, 10) > 0.02
    truth = [gen.render_attributes("a photo of a doctor", g.seed, s)["gender"] for g in images]
    assert [["male", "female"][k] for k in scores.argmax(axis=1)] == truth
    cosines = vectors @ texts.T                          # CLIP's cosines are small too (its modality gap)
    assert cosines.max() < 0.2
