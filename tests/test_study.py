"""User-study packs (engine/tools/study.py): counterbalancing, hidden conditions, analysis, alpha."""
import csv
import io
import json
import math
import zipfile

import numpy as np
import pytest

from engine.tools import study
from engine.core.engine import Engine
from engine.common.errors import InputError
from engine.methods import generate, single_prompt
from engine.report.study import analysis_html, form_page

from runhelpers import done_event

PROMPTS = ["a photo of a teacher", "a photo of a doctor", "a photo of a firefighter", "a photo of a mechanic",
           "a photo of a nurse"]


@pytest.fixture(scope="module")
def study_engine(tmp_path_factory):
    """Five Single Prompt runs with different planted gender biases (one store for the module)."""
    engine = Engine("synthetic", data_dir=str(tmp_path_factory.mktemp("study") / "store"))
    ids = []
    for prompt in PROMPTS:
        request = single_prompt.SinglePromptRequest(prompt, n=16, n_boot=100, gap=False)
        ids.append(done_event(single_prompt.run(request, engine)).run_id)
    return engine, ids


def simulated_answers(key, raters_per_form=2, noise=0.3, seed=0, careless=()):
    """A CSV as the form writes it, from raters whose answers follow the automatic scores
    (plus noise); `careless` participant ids answer at random and miss the attention checks."""
    rng = np.random.default_rng(seed)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(study.ANSWER_COLUMNS)
    sets = key["sets"]
    for form in key["forms"]:
        for r in range(raters_per_form):
            pid = f"P{form['form']:02d}{r}"
            for item in form["items"]:
                if pid in careless:
                    answer = str(rng.choice(key["options"]))
                    if item["kind"] == "attention" and answer == item["expected"]:
                        answer = next(o for o in key["options"] if o != item["expected"])
                elif item["kind"] == "attention":
                    answer = item["expected"]
                elif key["question_type"] == "rating":
                    score = sets[item["sets"][0]]["auto_score"]
                    answer = str(int(np.clip(round(1 + 4 * score + rng.normal(0, noise)), 1, 5)))
                else:
                    a, b = (sets[s]["auto_score"] for s in item["sets"])
                    answer = "left" if a + rng.normal(0, noise / 4) > b else "right"
                writer.writerow([pid, form["form"], item["position"], item["item"], item["sets"][0],
                                 (item["sets"] + [""])[1], answer, 1234])
    return out.getvalue()


@pytest.mark.slow
@pytest.mark.parametrize("question, n_sets", [("rating", 5), ("pair", 3), ("pair", 4)])
def test_every_condition_is_balanced_across_positions_and_sides(study_engine, question, n_sets):
    engine, ids = study_engine
    pack = study.build_pack(engine, ids[:n_sets], question=question, axis="gender", images_per_set=4, seed=11,
                            n_attention=2)
    key = pack["key"]
    trials = n_sets if question == "rating" else n_sets * (n_sets - 1)
    rows = trials if trials % 2 == 0 else 2 * trials
    assert key["n_forms"] == rows and key["design"]["balanced"]
    assert key["design"]["trials_per_form"] == trials
    for form in key["forms"]:
        assert [i["position"] for i in form["items"]] == list(range(1, trials + 3))
        checks = [i for i in form["items"] if i["kind"] == "attention"]
        assert len(checks) == 2 and all(c["position"] > 1 and c["expected"] in key["options"] for c in checks)
        assert sorted(tuple(i["sets"]) for i in form["items"] if i["kind"] == "trial") == sorted(
            [(s,) for s in key["sets"]] if question == "rating"
            else [(a, b) for a in key["sets"] for b in key["sets"] if a != b])
    # Recount from the forms, independently of the key's own balance table.
    per_position = {s: [0] * trials for s in key["sets"]}
    sides = {s: [0, 0] for s in key["sets"]}
    for form in key["forms"]:
        for item in form["items"]:
            if item["kind"] == "trial":
                for side, s in enumerate(item["sets"]):
                    per_position[s][item["trial_position"] - 1] += 1
                    sides[s][side] += 1
    for s in key["sets"]:
        assert len(set(per_position[s])) == 1, per_position  # equally often at every position
        if question == "pair":
            assert sides[s][0] == sides[s][1]  # equally often left and right
    assert key["balance"] == {s: {"positions": per_position[s], "left": sides[s][0] if question == "pair" else 0,
                                  "right": sides[s][1] if question == "pair" else 0} for s in key["sets"]}
    # The same seed builds the same study; another seed another one.
    again = study.build_pack(engine, ids[:n_sets], question=question, axis="gender", images_per_set=4, seed=11,
                             n_attention=2)["key"]
    assert {k: v for k, v in again.items() if k != "created"} == {k: v for k, v in key.items() if k != "created"}
    other = study.build_pack(engine, ids[:n_sets], question=question, axis="gender", images_per_set=4, seed=12,
                             n_attention=2)["key"]
    assert other["forms"] != key["forms"]
    # Fewer forms than a full cycle is allowed, and reported as not balanced.
    partial = study.build_pack(engine, ids[:n_sets], question=question, images_per_set=2, seed=1, n_raters=rows + 1)
    assert not partial["key"]["design"]["balanced"] and partial["key"]["n_forms"] == rows + 1


def test_williams_square_is_latin_and_carryover_balanced():
    for n in (2, 3, 4, 5, 6):
        rows = study.williams_rows(n)
        assert len(rows) == (n if n % 2 == 0 else 2 * n)
        for row in rows:
            assert sorted(row) == list(range(n))
        for position in range(n):
            counts = np.bincount([row[position] for row in rows], minlength=n)
            assert len(set(counts)) == 1
        pairs = np.zeros((n, n), int)
        for row in rows:
            for a, b in zip(row, row[1:]):
                pairs[a, b] += 1
        off = pairs[~np.eye(n, dtype=bool)]
        assert len(set(off)) == 1  # every ordered neighbour pair equally often


def test_participant_files_name_no_condition(study_engine, tmp_path):
    engine, ids = study_engine
    pack = study.build_pack(engine, ids, question="pair", axis="gender", images_per_set=3, seed=3, n_raters=2)
    path = study.write_pack(pack, tmp_path / "pack.zip", form_page(pack))
    runs_ = [engine.store.get_run(i) for i in ids]
    secrets = set(ids) | set(PROMPTS) | {p.split()[-1] for p in PROMPTS}
    secrets |= {"single_prompt", "synthetic", "run_id", "generator", "prompt"}
    secrets |= {v for r in runs_ for v in r["models"].values()}
    with zipfile.ZipFile(path) as zf:
        names = zf.namelist()
        participant = [n for n in names if n.startswith("participant/")]
        assert sorted(participant) == ["participant/README.txt", "participant/study.html"]
        for name in participant:
            text = zf.read(name).decode("utf-8").lower()
            leaked = [s for s in secrets if s.lower() in text or s.lower() in name.lower()]
            assert not leaked, (name, leaked)
        key = json.loads(zf.read("researcher/answer_key.json"))
        design = zf.read("researcher/design.csv").decode()
    # The key is where the conditions are named.
    assert {s["run_id"] for s in key["sets"].values()} == set(ids)
    assert {s["prompt"] for s in key["sets"].values()} == set(PROMPTS)
    assert all(s["generator"].startswith("synthetic") and s["auto_score_source"] == "stored" for s in key["sets"].values())
    assert ids[0] in design and len(design.splitlines()) == 1 + 2 * (20 + 2)
    # Set ids are opaque: not derived from the order of the runs or their ids.
    assert all(len(s) == 5 and s[0] == "S" for s in key["sets"])


@pytest.mark.parametrize("question", ["rating", "pair"])
def test_simulated_answers_that_follow_the_scores_give_a_high_spearman(study_engine, question):
    engine, ids = study_engine
    key = study.build_pack(engine, ids, question=question, axis="gender", images_per_set=6, seed=5)["key"]
    scores = [s["auto_score"] for s in key["sets"].values()]
    assert all(s is not None for s in scores) and len(set(scores)) >= 3
    text = simulated_answers(key, careless={"P011"})
    analysis = study.analyse(key, [text])
    assert analysis["failed_attention"] == ["P011"] and analysis["excluded"] == ["P011"]
    assert analysis["participants"] == 2 * key["n_forms"] and analysis["kept"] == analysis["participants"] - 1
    assert analysis["spearman"]["n"] == len(ids)
    assert analysis["spearman"]["rho"] > 0.8, analysis["spearman"]
    assert analysis["agreement"]["alpha"] > 0.5
    assert analysis["agreement"]["level"] == ("interval" if question == "rating" else "nominal")
    if question == "pair":
        assert analysis["self_consistency"] > 0.6
    html = analysis_html(analysis)
    assert "study-spearman" in html and "Krippendorff" in html
    # The same answers split over several files (one per participant) give the same result.
    lines = text.splitlines()
    per_participant = {}
    for line in lines[1:]:
        per_participant.setdefault(line.split(",")[0], []).append(line)
    files = ["\n".join([lines[0], *rows]) + "\n" for rows in per_participant.values()]
    assert study.analyse(key, files)["spearman"] == analysis["spearman"]
    # Raters answering at random give a low agreement.
    noisy = study.analyse(key, [simulated_answers(key, noise=50.0, seed=1)])
    assert noisy["agreement"]["alpha"] < analysis["agreement"]["alpha"]


def test_answers_from_another_pack_or_malformed_are_clear_errors(study_engine):
    engine, ids = study_engine
    key = study.build_pack(engine, ids[:3], question="rating", images_per_set=2, seed=1)["key"]
    other = study.build_pack(engine, ids[:3], question="rating", images_per_set=2, seed=2)["key"]
    with pytest.raises(InputError, match="not in this answer key"):
        study.analyse(key, [simulated_answers(other)])
    with pytest.raises(InputError, match="lacks the column"):
        study.analyse(key, ["who,what\n1,2\n"])
    with pytest.raises(InputError, match="attention check"):
        study.analyse(key, [simulated_answers(key, raters_per_form=1,
                                              careless={f"P{f['form']:02d}0" for f in key["forms"]})])
    with pytest.raises(InputError, match="answer key"):
        study.load_key('{"format": "something else"}')
    with pytest.raises(InputError, match="at least two image sets"):
        study.build_pack(engine, ids[:1], question="rating")
    with pytest.raises(InputError, match="question type"):
        study.build_pack(engine, ids[:2], question="essay")


def test_runs_without_stored_scores_are_scored_from_their_images(study_engine):
    """Generate runs have no metrics: the pack computes them with the engine's (cached) VQA."""
    engine, _ = study_engine
    ids = [done_event(generate.run(generate.GenerateRequest(p, n=8), engine)).run_id
           for p in ("a photo of a ceo", "a photo of a librarian")]
    key = study.build_pack(engine, ids, question="pair", axis="gender", images_per_set=4, seed=0)["key"]
    assert all(s["auto_score_source"] == "computed" and s["auto_score"] is not None for s in key["sets"].values())


def test_krippendorff_alpha_against_hand_computed_and_published_values():
    # By hand: units (a,a), (a,b), (b,b). Coincidences o_aa = 2, o_ab = o_ba = 1, o_bb = 2, so
    # n_a = n_b = 3, n = 6; D_o = 2/6; D_e = (3·3 + 3·3)/(6·5) = 0.6; alpha = 1 − (1/3)/0.6 = 4/9.
    assert study.krippendorff_alpha([["a", "a"], ["a", "b"], ["b", "b"]], "nominal") == pytest.approx(4 / 9)
    # Interval on 1/3 ratings: every disagreement weighs (3−1)² = 4 in both D_o and D_e: 4/9 again.
    assert study.krippendorff_alpha([[1, 1], [1, 3], [3, 3]], "interval") == pytest.approx(4 / 9)
    # Three raters, two units: (1,1,2) and (2,2,2). o_11 = 2/2 = 1, o_12 = o_21 = 2/2 = 1, o_22 = 0/2 + 6/2 = 3;
    # n_1 = 2, n_2 = 4, n = 6; D_o = 2/6; D_e = 2·2·4/30 = 16/30; alpha = 1 − (1/3)/(16/30) = 0.375.
    assert study.krippendorff_alpha([[1, 1, 2], [2, 2, 2]], "nominal") == pytest.approx(0.375)
    # Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability": 4 observers, 12 units, missing data.
    units = [[1, 1, None, 1], [2, 2, 3, 2], [3, 3, 3, 3], [3, 3, 3, 3], [2, 2, 2, 2], [1, 2, 3, 4], [4, 4, 4, 4],
             [1, 1, 2, 1], [2, 2, 2, 2], [None, 5, 5, 5], [None, None, 1, 1], [None, 3, None, None]]
    assert study.krippendorff_alpha(units, "nominal") == pytest.approx(0.743, abs=5e-4)
    assert study.krippendorff_alpha(units, "ordinal") == pytest.approx(0.815, abs=5e-4)
    assert study.krippendorff_alpha(units, "interval") == pytest.approx(0.849, abs=5e-4)
    assert study.krippendorff_alpha(units, "ratio") == pytest.approx(0.797, abs=5e-4)
    assert study.krippendorff_alpha([[1, 1], [2, 2], [3, 3]], "interval") == 1.0
    assert math.isnan(study.krippendorff_alpha([[2, 2], [2, 2]], "nominal"))  # no variation: undefined
    assert math.isnan(study.krippendorff_alpha([[1], [2]], "nominal"))        # nothing pairable


def test_a_large_pair_study_defaults_to_workable_forms_and_says_what_raters_face(study_engine):
    """Issue 17: 19 sets made '342 forms of 342 items'. Five sets = 20 ordered pairs; with
    max_items=8 that is 3 blocks of at most 7 (the default 40 splits designs of 7+ sets)."""
    engine, ids = study_engine
    key = study.build_pack(engine, ids, question="pair", axis="gender", images_per_set=2, seed=4, max_items=8,
                           n_attention=1)["key"]
    d = key["design"]
    assert d["trials"] == 20 and d["blocks"] == 3 and d["trials_per_form"] == 7 and key["n_forms"] == 3
    assert not d["balanced"] and "too many for one rater" in d["note"]
    trials = [tuple(i["sets"]) for f in key["forms"] for i in f["items"] if i["kind"] == "trial"]
    assert sorted(trials) == sorted((a, b) for a in key["sets"] for b in key["sets"] if a != b)  # each once
    assert all(len(f["items"]) <= 8 for f in key["forms"]) and d["items_per_form"] == 8
    text = study.pack_summary({"key": key})["text"]
    assert "Each rater answers 8 items, about 2 minutes" in text
