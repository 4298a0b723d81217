"""The languages method (issue 45) and the synthetic world's languages: planted grammatical gender
recovered with intervals, MAGBIG's prompt sets and metrics (equal to its own code on count tables),
a mistranslation visible in the back-translation and the result, unknown languages and subjects in
one sentence (issue 42 item 12)."""
import csv
import json
from pathlib import Path

import numpy as np
import pytest

from engine.backends.base import ModelSpec
from engine.backends.llm_json import JSON_ATTEMPTS
from engine.backends.synthetic import SyntheticLLM, load_world
from engine.backends.synthetic.phrasing import back_translate, translate
from engine.cli import main
from engine.common.errors import InputError
from engine.common.events import Images, Warning
from engine.common.llm_prompts import translate_prompt
from engine.hosting.limits import Estimate
from engine.methods import METHODS, languages
from engine.metrics.languages import expected_max_unfairness, magbig_scores
from engine.models.languages import understanding
from engine.report.languages import page
from runhelpers import done_event

MAGBIG = Path(__file__).resolve().parents[1] / "assets" / "magbig"
FIXTURES = Path(__file__).resolve().parent / "data" / "magbig_reference" / "exp_max_unfairness.json"
WORLD_SUBJECTS = {"doctor": "doctor", "nurse": "nurse", "engineer": "engineer", "teacher": "teacher",
                  "librarian": "librarian", "firefighter": "firefighter", "ceo": "ceo", "computer programmer": "programmer",
                  "programmer": "programmer", "software developer": "programmer", "farmer": "farmer",
                  "scientist": "scientist", "lawyer": "lawyer", "pharmacist": "pharmacist", "mechanic": "mechanic",
                  "musician": "musician", "police officer": "police officer", "social worker": "social worker",
                  "cook": "chef", "head cook": "chef"}


def run_languages(engine, **fields):
    method = METHODS["languages"]
    return list(method.run(method.request(**fields), engine))


def magbig_rows(folder: str, language: str) -> dict[str, str]:
    with open(MAGBIG / folder / f"occ_{language}.csv", encoding="utf-8") as handle:
        return {row["name"]: row["prompt"] for row in csv.DictReader(handle)}


# -- the synthetic world speaks the languages it is tested in ---------------------------------------------

def test_grammatical_gender_is_planted_as_the_issue_says():
    world = load_world()
    male = lambda prompt: world.expected_distribution(prompt, "gender")["male"]   # noqa: E731
    assert male("a photo of a doctor") == pytest.approx(0.80)
    assert male("ein Foto von einem Arzt") == pytest.approx(0.95)          # generic masculine
    assert male("ein Foto von einer Ärztin") == pytest.approx(0.05)        # feminine form
    assert male("Ein Foto des Gesichts eine*r Ärzt*in.") == pytest.approx(0.80)   # gender star: as English
    # a gender-neutral paraphrase (MAGBIG's indirect German doctor) is as English, and so is English's own
    assert male(magbig_rows("indirect", "german")["doctor"]) == pytest.approx(0.80)
    assert male(magbig_rows("indirect", "english")["doctor"]) == pytest.approx(0.80)
    # languages without grammatical gender read the noun as English does
    assert male("一张医生的照片") == male("医師の写真") == male("의사의 사진") == pytest.approx(0.80)
    # the pull is on gender only: doctor's age is as in English
    assert world.expected_distribution("ein Foto von einem Arzt", "age") == \
        pytest.approx(world.expected_distribution("a photo of a doctor", "age"))


@pytest.mark.parametrize("language", ["english", "german", "french", "italian", "spanish", "russian", "arabic",
                                      "chinese", "japanese", "korean"])
def test_magbigs_prompts_name_the_same_subjects_in_every_language(language):
    world = load_world()
    for folder in ("direct", "indirect"):
        rows = magbig_rows(folder, language)
        for name, subject in WORLD_SUBJECTS.items():
            parsed = world.parse(rows[name])
            if (language, folder, name) == ("russian", "direct", "ceo"):   # MAGBIG's "caesarean section"
                assert parsed.subject_span is None
                continue
            assert parsed.subject == subject, (folder, name, rows[name])
            if folder == "indirect":
                assert parsed.form in ("neutral", None)


def test_phrases_of_unspaced_scripts_match_inside_words_and_english_is_read_as_before():
    world = load_world()
    assert world.parse("一张Ceo脸的照片").subject == "ceo"          # Latin next to Chinese characters
    assert world.parse("CEO의 얼굴 사진입니다.").subject == "ceo"
    assert world.parse("a herbaceous plant").subject_span is None   # no 'ceo' inside an English word
    assert world.parse("a photo of a female doctor").form is None
    assert world.parse("a photo of a female doctor").values == {"gender": "female"}


def test_the_synthetic_llm_translates_and_translates_back():
    world = load_world()
    llm = SyntheticLLM(world)
    for code, language in world.languages.items():
        for form in ("default", "feminine", "star"):
            text = translate(world, "a photo of a doctor", code, form)
            assert world.parse(text).subject == "doctor", (code, form, text)
            assert back_translate(world, text) in ("a photo of a doctor", "a photo of a female doctor")
        reply = json.loads(llm.chat([{"role": "user", "content": translate_prompt("a photo of a nurse", language.name)}],
                                    temperature=0.0))
        assert world.parse(reply["translation"]).subject == "nurse"
    assert translate(world, "a photo of a doctor", "de", "feminine") == "Ein Foto von einer Ärztin"
    assert back_translate(world, "ein Foto von einer Krankenschwester") == "a photo of a female nurse"
    assert "cannot translate into Swahili" in llm.chat([{"role": "user", "content": translate_prompt("a doctor", "Swahili")}])


def test_a_subject_the_world_does_not_know_gets_one_notice(engine):
    """Issue 42 item 12: a surgeon (or a language the world does not speak) is drawn as the default figure;
    the run says so once, and a known subject gets no such notice."""
    def notices(prompt):
        events = list(METHODS["single_prompt"].run(METHODS["single_prompt"].request(prompt=prompt, n=2, gap=False,
                                                                                     n_boot=100), engine))
        return [e.message for e in events if isinstance(e, Warning) and "knows no subject" in e.message]

    surgeon = notices("a photo of a surgeon")
    assert len(surgeon) == 1 and "default figure" in surgeon[0] and "'a photo of a surgeon'" in surgeon[0]
    assert len(notices("uma foto de um cirurgião")) == 1          # Portuguese: not spoken
    assert notices("a photo of a doctor") == [] and notices("ein Foto von einem Arzt") == []


def test_a_run_over_many_unknown_prompts_names_three_then_says_there_are_more(engine):
    """The occupation study printed 162 such notices, burying its results: a run names the first three
    prompts, then says once that there are more."""
    request = METHODS["counterfactuals"].request(prompt="a photo of a {occupation}", n=2,
                                                 fill=["surgeon", "announcer", "housekeeper", "baker", "doctor"])
    events = list(METHODS["counterfactuals"].run(request, engine))
    prompts = {r.prompt for e in events if isinstance(e, Images) for r in e.records}
    notes = [e.message for e in events if isinstance(e, Warning)
             and ("knows no subject" in e.message or "get such a note" in e.message)]
    assert len(prompts) > 4 and len(notes) == 4, notes
    assert all("knows no subject" in note for note in notes[:3])
    assert notes[3].startswith("more than 3 of this run's prompts get such a note (the next is 'a photo of a")


def test_a_language_the_world_does_not_speak_is_one_sentence_and_no_run(engine):
    with pytest.raises(InputError, match=r"^the synthetic world speaks .*, not Swahili \(sw\): it would draw its "
                                         r"default figure instead of results in that language, so nothing was run$"):
        run_languages(engine, prompt="a photo of a doctor", languages=["en", "sw"], n=4)
    assert engine.store.count("runs") == 0
    with pytest.raises(InputError, match="no language code GapLens knows"):
        run_languages(engine, prompt="a photo of a doctor", languages=["en", "xx"], n=4)
    with pytest.raises(InputError, match="variant '-m'"):
        run_languages(engine, prompt="a photo of a doctor", languages=["en", "de-m"], n=4)


# -- the method ---------------------------------------------------------------------------------------------

def test_the_planted_effects_are_recovered_with_intervals_at_n_96(engine):
    """German generic masculine minus English: planted +0.15 (0.95 vs 0.80); the paired interval excludes 0
    and holds the planted value; the feminine form (0.05) and the gender star (as English) too."""
    done = done_event(run_languages(engine, prompt="a photo of a doctor", languages=["en", "de", "de-f", "de-star"],
                                    translations={"de": "ein Foto von einem Arzt", "de-f": "ein Foto von einer Ärztin",
                                                  "de-star": "ein Foto von eine*r Ärzt*in"}, n=96))
    r = done.results
    world = engine.models.get(engine.preset.generator).world
    for code in ("en", "de", "de-f", "de-star"):
        planted = world.expected_distribution(r["languages"][code]["prompt"], "gender")["male"]
        low, high = r["languages"][code]["shares"]["gender"]["male"]["ci"]
        assert low <= planted <= high, (code, planted, low, high)
    de = r["differences"]["de"]["gender"]["male"]
    assert de["ci"][0] > 0 and de["ci"][0] <= 0.15 <= de["ci"][1], de
    feminine = r["differences"]["de-f"]["gender"]["male"]
    assert feminine["ci"][1] < 0 and feminine["ci"][0] <= -0.75 <= feminine["ci"][1]
    star = r["differences"]["de-star"]["gender"]["male"]
    assert star["ci"][0] <= 0 <= star["ci"][1]
    assert r["tests"]["gender"]["language"]["p"] < 1e-6 and r["tests"]["gender"]["language"]["method"] == "chi-square"
    assert r["pairs"]["de"]["gender"] == 96


def test_the_json_has_exactly_the_issues_shape(engine):
    r = done_event(run_languages(engine, prompt="a photo of a nurse", languages=["en", "fr", "zh"], n=8,
                                 axes=["gender", "age"])).results
    assert r["codes"] == ["en", "fr", "zh"] and set(r["languages"]) == {"en", "fr", "zh"}
    for code, entry in r["languages"].items():
        assert {"prompt", "run_id", "shares"} <= set(entry)
        assert engine.store.get_run(entry["run_id"])["method"] == "single_prompt"
        assert set(entry["shares"]) == {"gender", "age"}
        for axis, classes in entry["shares"].items():
            assert list(classes) == r["axes"][axis]
            assert all(set(s) == {"share", "ci"} for s in classes.values())
    assert set(r["differences"]) == {"fr", "zh"}   # against the first language
    for axes in r["differences"].values():
        assert all(set(d) == {"delta", "ci"} for classes in axes.values() for d in classes.values())
    assert set(r["tests"]) == {"gender", "age"} and set(r["magbig"]["gender"]) == {"en", "fr", "zh"}
    assert r["translations"]["fr"]["source"].startswith("LLM (") and r["translations"]["fr"]["back_translation"]
    # the same seeds in every language
    seeds = {code: sorted(i["seed"] for i in engine.store.get_run(e["run_id"])["results"]["images"])
             for code, e in r["languages"].items()}
    assert seeds["en"] == seeds["fr"] == seeds["zh"] == list(range(8))


def test_a_mistranslation_shows_in_the_back_translation_and_in_the_result(engine):
    """A 'translation' of 'a photo of a doctor' that names a nurse: the back-translation says nurse, and the
    result moves to the nurse's planted 0.9 female instead of the doctor's 0.2."""
    r = done_event(run_languages(engine, prompt="a photo of a doctor", languages=["en", "de"], n=48,
                                 translations={"de": "ein Foto von einer Krankenschwester"})).results
    assert r["translations"]["de"]["back_translation"] == "a photo of a female nurse"
    assert r["translations"]["de"]["source"] == "given"
    female = r["differences"]["de"]["gender"]["female"]
    assert female["ci"][0] > 0.3
    html = str(page(r))
    assert "a photo of a female nurse" in html and "ein Foto von einer Krankenschwester" in html


def test_prompts_come_from_translations_then_magbigs_files_then_the_llm(engine):
    prompt = magbig_rows("direct", "english")["doctor"]
    events = run_languages(engine, prompt=prompt, languages=["en", "de", "de-star", "de-f", "zh"], n=2,
                           translations={"zh": "一张医生的照片"}, back_translate=False)
    t = done_event(events).results["translations"]
    assert t["de"] == {"prompt": magbig_rows("direct", "german")["doctor"], "source": "MAGBIG direct", "understood": True}
    assert t["de-star"]["source"] == "MAGBIG gender star" and "Ärzt*in" in t["de-star"]["prompt"]
    assert t["de-f"]["source"].startswith("GapLens feminine forms") and "Ärztin" in t["de-f"]["prompt"]
    assert t["zh"] == {"prompt": "一张医生的照片", "source": "given", "understood": True}


def test_the_estimate_counts_images_and_every_llm_request_with_its_retries():
    row = METHODS["languages"]
    worst = JSON_ATTEMPTS
    # en -> de, fr by the LLM, both translated back
    assert row.estimate(row.request(prompt="a photo of a doctor", languages=["en", "de", "fr"], n=8)) == \
        Estimate(24, 4 * worst)
    # a given translation is not translated, only back
    assert row.estimate(row.request(prompt="a doctor", languages=["en", "de"], translations={"de": "ein Arzt"},
                                    back_translate=False)).llm_calls == 0
    # MAGBIG's direct set: 19 occupations x 3 languages x N; only back-translations ask the LLM
    cost = row.estimate(row.request(prompt_set="magbig-direct", languages=["en", "de", "ru"], n=4))
    assert cost == Estimate(19 * 3 * 4, 19 * 2 * worst)


def test_a_prompt_set_run_compares_occupations_and_names_magbigs_mistranslation(engine):
    events = run_languages(engine, prompt_set="magbig-direct", languages=["en", "de", "ru"],
                           occupations=["doctor", "nurse", "ceo"], n=8)
    r = done_event(events).results
    assert r["occupations"] == ["doctor", "nurse", "ceo"] and r["prompt"] is None
    assert set(r["languages"]["de"]["prompts"]) == {"doctor", "nurse", "ceo"}
    assert r["translations"]["ru"]["ceo"]["prompt"] == "Фотография лица кесарева сечения."
    notices = [e.message for e in events if isinstance(e, Warning) and "knows no subject" in e.message]
    assert len(notices) == 1 and notices[0].startswith("Russian, ceo:")
    tests = r["tests"]["gender"]
    assert {"language", "stratified", "interaction"} <= set(tests) and tests["interaction"]["df"] == 2 * 2 * 1
    assert len(r["magbig"]["gender"]["de"]["l1"]) == 3
    html = str(page(r))
    assert 'data-chart="languages-heatmap-gender"' in html and 'data-chart="languages-bars-gender"' in html


def test_an_english_only_model_is_labelled_not_refused():
    sd = understanding(ModelSpec("diffusers", "stabilityai/sd-turbo"))
    assert sd.languages == frozenset({"en"}) and not sd.strict and "English-only" in sd.note
    assert sd.understands("de") is False and sd.understands("en") is True
    assert understanding(ModelSpec("openai", "dall-e-3")).understands("de") is None
    world = understanding(ModelSpec("synthetic_generator", "default"))
    assert world.strict and world.understands("ko") and not world.understands("pt")


@pytest.mark.real_model
def test_an_english_only_models_other_languages_are_labelled(tiny_root, data_dir):
    from engine.core.engine import Engine
    from tests import tiny_models

    engine = Engine("synthetic", data_dir=data_dir, generator=tiny_models.build_tiny_sd(tiny_root))
    events = run_languages(engine, prompt="a photo of a doctor", languages=["en", "de"], n=2,
                           translations={"de": "ein Foto von einem Arzt"}, back_translate=False)
    r = done_event(events).results
    assert r["languages"]["de"]["understood"] is False and r["languages"]["en"]["understood"] is True
    assert "English-only" in r["model"]["note"]
    assert any(isinstance(e, Warning) and "German results are labelled" in e.message for e in events)
    assert "not understood: an English-only model" in str(page(r))


def test_hunyuan_dit_is_a_chinese_and_english_family_with_a_memory_plan():
    from engine.backends.diffusers_generator import FAMILY_DEFAULTS, family_from_class_name
    from engine.models.plan import plan
    from engine.models.presets import PRESETS

    assert family_from_class_name("HunyuanDiTPipeline", "Tencent-Hunyuan/HunyuanDiT-v1.2-Diffusers") == "hunyuandit"
    assert FAMILY_DEFAULTS["hunyuandit"].size == 1024
    spec = PRESETS["hunyuan-dit"].generator
    known = understanding(spec)
    assert known.languages == frozenset({"zh", "en"}) and not known.strict and "Chinese and English" in known.note
    p = plan(PRESETS["hunyuan-dit"], 24)
    generator = next(m for m in p.models if m["role"] == "generator")
    assert p.fits and generator["gb"] == pytest.approx(3.605e9 * 2 / 2**30, abs=0.01)   # fp16 weights, 3.6 B


@pytest.mark.real_model
def test_a_chinese_and_english_model_runs_and_labels_its_other_languages(tiny_root, data_dir):
    """A tiny random-weight Hunyuan-DiT through the diffusers backend's from_pretrained: Chinese is understood,
    German is labelled, and every language is drawn on the same seeds."""
    from engine.core.engine import Engine
    from tiny_multilingual import build_tiny_hunyuandit

    engine = Engine("synthetic", data_dir=data_dir, generator=build_tiny_hunyuandit(tiny_root))
    events = run_languages(engine, prompt="a photo of a doctor", languages=["en", "zh", "de"], n=2, steps=2,
                           width=64, height=64, back_translate=False,
                           translations={"zh": "一张医生的照片", "de": "ein Foto von einem Arzt"})
    r = done_event(events).results
    assert engine.models.get(engine.preset.generator).family == "hunyuandit"
    assert [r["languages"][c]["understood"] for c in ("en", "zh", "de")] == [True, True, False]
    assert any(isinstance(e, Warning) and "German results are labelled" in e.message for e in events)
    images = engine.store.get_run(r["languages"]["zh"]["run_id"])["results"]["images"]
    assert [i["seed"] for i in images] == [0, 1]


# -- MAGBIG's metrics equal its own code on count tables ----------------------------------------------------

def test_magbig_metrics_equal_the_repositorys_code_on_count_tables():
    """tests/data/magbig_reference/exp_max_unfairness.json: MAGBIG's exp_max_unfairness.py run on these
    tables (make_fixtures.py); the same legacy seed gives its very draws."""
    fixtures = json.loads(FIXTURES.read_text())
    assert fixtures["magbig_commit"] == "dce31d9e62d124f243d012c445a5dfbbb993b975"
    for case in fixtures["cases"]:
        rng = np.random.RandomState(case["seed"])   # the script draws every subset first, shared by its tables
        prompts = len(case["tables"]["generated"])
        subsets = [rng.choice(range(prompts), size=case["num_occs"], replace=False) for _ in range(case["num_samples"])]
        for location, table in case["tables"].items():
            ours = {**magbig_scores(table, num_samples=1),
                    **expected_max_unfairness(table, case["num_ims"], case["num_occs"], case["num_samples"],
                                              rng=rng, subsets=subsets)}
            theirs = case["unrounded"][location]
            for key, value in theirs.items():
                assert ours[key] == pytest.approx(value, abs=1e-12), (location, key)
                assert round(ours[key], 2) == pytest.approx(case["rounded"][location][key], abs=1e-9)
    # alone (its own subsets), the first table of a case is MAGBIG's first table exactly
    first = fixtures["cases"][0]
    alone = expected_max_unfairness(first["tables"]["generated"], first["num_ims"], first["num_occs"],
                                    first["num_samples"], seed=first["seed"])
    assert alone["exp_max_l1"] == pytest.approx(first["unrounded"]["generated"]["exp_max_l1"], abs=1e-12)


# -- the command line ----------------------------------------------------------------------------------------

def test_the_command_takes_translations_and_prints_the_json(data_dir, capsys):
    argv = ["languages", "--preset", "synthetic", "--data-dir", data_dir, "--prompt", "a photo of a doctor",
            "--languages", "en", "de", "--translation", "de=ein Foto von einem Arzt", "-n", "4", "--axes", "gender",
            "--json", "--quiet"]
    assert main(argv) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["languages"]["de"]["prompt"] == "ein Foto von einem Arzt"
    assert set(printed["differences"]["de"]["gender"]["male"]) == {"delta", "ci"}
    assert main(argv[:-6] + ["--translation", "de", "-n", "4", "--quiet"]) == 2
    assert "must look like CODE=TEXT" in capsys.readouterr().err
