"""Issue 46 items 2 and 4: the distilled evaluator (`--vqa distilled`, a teacher given as an option).

On the synthetic world: a calibration sample (a share, at least a minimum, stratified by prompt, seeded) is
asked of the teacher; a logistic-regression probe on the stored embeddings answers the rest, the unsure
images go to the teacher; the probe is stored with its provenance and reused by a later run of the same
embedder and teacher; a probe under the agreement threshold is not used, with one sentence; the page says
which answers came from the probe and which from the teacher; with a 20% noisy teacher its spot-check
corrected distributions cover the truth as well as the teacher's own."""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pytest

from engine.backends.base import CANT_TELL, ModelSpec, label_of
from engine.cli import main as cli_main
from engine.common.errors import ModelLoadError
from engine.core.distilled import calibration_sample, probe_key
from engine.core.engine import Engine
from engine.store.store import ImageRecord, answer_key

GENDER = ("What is the gender (male, female) of the person in the image?", ["male", "female"])
AGE = ("What age group (young, middle-aged, old) is the person in the image?", ["young", "middle-aged", "old"])
PROMPTS = ["a photo of a doctor", "a photo of a nurse", "a photo of a pilot", "a photo of a teacher"]


def _distilled(data_dir, **options) -> Engine:
    spec = ModelSpec("distilled", "probe", {"teacher": "synthetic_vqa:default", "min_sample": 40, **options})
    return Engine("synthetic", data_dir=str(data_dir), vqa=spec, max_images=1000)


def _records(engine, n=40):
    return [r for p in PROMPTS for r in engine.image_set(p, range(n))]


def test_the_calibration_sample_is_a_seeded_share_stratified_by_prompt():
    records = [ImageRecord(f"{p}-{i}", p, i, "") for p, k in (("a", 600), ("b", 300), ("c", 100)) for i in range(k)]
    sample = calibration_sample(records, 0.1, 50, seed=0)
    assert len(sample) == 100 and sample == calibration_sample(records, 0.1, 50, seed=0)
    assert Counter(records[i].prompt for i in sample) == {"a": 60, "b": 30, "c": 10}
    assert sample != calibration_sample(records, 0.1, 50, seed=1)
    assert len(calibration_sample(records[:300], 0.1, 200, seed=0)) == 200     # at least the minimum
    assert len(calibration_sample(records[:30], 0.1, 200, seed=0)) == 30       # all of them when fewer


def test_a_probe_answers_most_images_and_the_unsure_ones_go_to_the_teacher(tmp_path):
    engine = _distilled(tmp_path)
    records = _records(engine)
    got = engine.ask_many(records, [GENDER, AGE])
    teacher = Engine("synthetic", data_dir=str(tmp_path / "teacher")).ask_many(records, [GENDER, AGE])
    for column, truth in zip(got, teacher):   # a noiseless teacher: the probe agrees with it on these images
        assert sum(a.answer == t.answer for a, t in zip(column, truth)) >= 0.95 * len(records)
    sources = engine.answer_sources(records, *GENDER)
    assert sources["probe"] + sources["teacher"] == len(records) and sources["probe"] > sources["teacher"] > 0
    assert sources["held_out"]["accuracy"] >= 0.9 and sources["note"] == ""
    assert sources["teacher_id"] == Engine("synthetic", data_dir=str(tmp_path / "t2")).model_id("vqa")
    asked = engine.with_vqa(ModelSpec("synthetic_vqa", "default")).store.get_scored_answers(
        [answer_key(sources["teacher_id"], r.key, *GENDER, scored=True) for r in records])
    by_probe = [a for a, r in zip(got[0], records)
                if answer_key(sources["teacher_id"], r.key, *GENDER, scored=True) not in asked]
    assert len(by_probe) == sources["probe"]
    assert all(max(a.probs.values()) >= 0.6 for a in by_probe)   # below the can't-tell threshold: the teacher's


def test_where_the_teacher_cannot_tell_the_probe_says_so_instead_of_asking_it_of_every_image(tmp_path):
    """The synthetic world draws no disability: its VQA guesses among the choices with no class above another,
    which is "can't tell". The probe learns that answer too: it says "can't tell" itself, so the teacher is
    asked only the calibration sample, and not every image a second time."""
    disability = ("Does the person use a wheelchair?", ["fit", "blind", "hearing aid", "wheelchair"])
    engine = _distilled(tmp_path)
    records = _records(engine)
    got = engine.ask_many(records, [disability])[0]
    assert all(label_of(a, engine.cant_tell_below) == CANT_TELL for a in got)
    sources = engine.answer_sources(records, *disability)
    assert sources["teacher"] == 40 and sources["probe"] == len(records) - 40   # the calibration sample alone
    assert sources["held_out"]["accuracy"] == 1.0 and sources["note"] == ""


def test_a_probe_is_stored_with_its_provenance_and_reused_by_the_next_run(tmp_path):
    first = _distilled(tmp_path)
    first.ask_many(_records(first), [GENDER])
    teacher_id = first.with_vqa(ModelSpec("synthetic_vqa", "default")).model_id("vqa")
    record = first.store.get_probe(probe_key(teacher_id, first.model_id("embedder"), *GENDER))
    assert record["teacher"] == teacher_id and record["embedder"] == first.model_id("embedder")
    assert record["usable"] and len(record["sample"]) == record["n_pool"] >= 40
    assert set(record["held_out"]) == {"n", "accuracy", "accuracy_ci", "kappa", "kappa_ci"}
    again = _distilled(tmp_path)                    # a new run: the same store, embedder and teacher
    teacher = again.with_vqa(ModelSpec("synthetic_vqa", "default"))
    records = [r for p in ("a photo of a chef", "a photo of a judge") for r in again.image_set(p, range(30))]
    again.ask_many(records, [GENDER])
    sources = again.answer_sources(records, *GENDER)
    assert sources["teacher"] < 15                  # no new calibration sample: only the unsure images
    assert teacher.store.get_probe(probe_key(teacher_id, again.model_id("embedder"), *GENDER))["sample"] == record["sample"]


def test_a_probe_under_the_agreement_threshold_is_not_used_and_one_sentence_says_so(tmp_path):
    engine = _distilled(tmp_path, teacher_options={"error_rate": 0.3}, min_agreement=0.95)
    records = _records(engine)
    engine.ask_many(records, [GENDER])
    sources = engine.answer_sources(records, *GENDER)
    assert sources["probe"] == 0 and sources["teacher"] == len(records)
    assert sources["held_out"]["accuracy"] < 0.95
    assert sources["note"].startswith("the probe for 'What is the gender") and "under 0.95" in sources["note"]
    assert sources["note"].count(". ") == 0 and "synthetic_vqa:default answered every image" in sources["note"]


def test_a_distilled_evaluator_without_a_teacher_is_one_sentence(tmp_path):
    engine = Engine("synthetic", data_dir=str(tmp_path), vqa=ModelSpec("distilled", "probe", {}))
    with pytest.raises(ModelLoadError, match="needs a teacher: --vqa-option teacher=BACKEND:MODEL"):
        engine.model_id("vqa")


def test_single_prompt_from_the_command_line_says_which_answers_the_probe_gave(tmp_path, capsys):
    from engine.report.single_prompt import page

    code = cli_main(["single-prompt", "--prompt", "a photo of a doctor", "-n", "64", "--vqa", "distilled",
                     "--vqa-option", "teacher=synthetic_vqa:default", "--vqa-option", "min_sample=20",
                     "--axes", "gender", "--no-gap", "--data-dir", str(tmp_path), "--json", "--quiet"])
    assert code == 0
    results = json.loads(capsys.readouterr().out)
    sources = results["answer_sources"]["gender"]
    assert sources["probe"] + sources["teacher"] == 64 and sources["teacher"] >= 20   # the sample, at least
    html = str(page(results))
    assert f'data-axis="gender" data-probe="{sources["probe"]}" data-teacher="{sources["teacher"]}"' in html
    assert "answer(s) by the probe" in html and "by the teacher synthetic-vqa:" in html


@pytest.mark.slow
def test_with_a_noisy_teacher_the_corrected_distributions_cover_the_truth_as_well_as_the_teachers(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    from evaluation_cost import coverage, distilled_run, occupation_asks

    asks = occupation_asks()
    noisy = {"teacher": "synthetic_vqa:default", "teacher_options": {"error_rate": 0.2}, "min_sample": 100}
    _, _, truth, _ = distilled_run(tmp_path, "truth", ModelSpec("synthetic_vqa", "default"), 2, 8)
    _, _, distilled, _ = distilled_run(tmp_path, "distilled", ModelSpec("distilled", "probe", noisy), 2, 8)
    _, _, teacher, _ = distilled_run(tmp_path, "teacher", ModelSpec("synthetic_vqa", "default", {"error_rate": 0.2}), 2, 8)
    got = {"distilled": [], "teacher": []}
    for (_, choices), t, d, s in zip(asks, truth, distilled, teacher):
        classes = [c for c in choices if c in set(t)]
        if len(classes) >= 2:
            got["distilled"].append(coverage(d, t, classes, 40, 10))
            got["teacher"].append(coverage(s, t, classes, 40, 10))
    distilled_rate, teacher_rate = sum(got["distilled"]) / len(got["distilled"]), sum(got["teacher"]) / len(got["teacher"])
    assert distilled_rate >= teacher_rate - 0.1 and distilled_rate >= 0.8
