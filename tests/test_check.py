"""The bias check and paired comparisons (issue 44): paired statistics against scipy and their worked
examples, the controls on the synthetic world (a planted regression flagged at n = 96, a fine-tune of another
attribute passing, at most 5% false flags over 100 null comparisons), the command's JSON keys, exit codes
and offline report, and Compare models' paired design."""
import json
import re

import numpy as np
import pytest
from scipy import stats

from engine.backends.synthetic.world import load_world
from engine.cli import main
from engine.common.events import Done
from engine.methods import check, compare_models
from engine.metrics import paired
from engine.report.charts import spec_in

DOCTOR = "a photo of a doctor"
PROMPTS = [DOCTOR, "a photo of a nurse", "a photo of a teacher"]


def run_check(tmp_path, capsys, suite: dict, candidate: str, *extra, base: str = "synthetic") -> tuple[int, dict]:
    """The check's exit status and JSON; what it printed on stderr is in `run_check.err`."""
    path = tmp_path / "suite.json"
    path.write_text(json.dumps(suite))
    code = main(["check", str(path), "--base", base, "--candidate", candidate, "--preset", "synthetic",
                 "--data-dir", str(tmp_path / "store"), "--json", "--quiet", *extra])
    printed = capsys.readouterr()
    run_check.err = printed.err
    return code, json.loads(printed.out) if printed.out.strip() else {}


# -- the statistics ---------------------------------------------------------------------------------

def test_benjamini_hochberg_is_scipys_and_leaves_rows_without_a_p_out():
    rng = np.random.default_rng(3)
    p = list(rng.uniform(size=30) ** 3)
    p[4] = None
    q = paired.benjamini_hochberg(p)
    present = [x for x in p if x is not None]
    assert q[4] is None
    np.testing.assert_allclose([x for x in q if x is not None], stats.false_discovery_control(present, method="bh"))
    # Benjamini & Hochberg's own example (1995, §4): 15 p-values, the four smallest rejected at q = 0.05
    bh = [0.0001, 0.0004, 0.0019, 0.0095, 0.0201, 0.0278, 0.0298, 0.0344, 0.0459, 0.3240, 0.4262, 0.5719,
          0.6528, 0.7590, 1.0]
    assert sum(x < 0.05 for x in paired.benjamini_hochberg(bh)) == 4


def test_mcnemar_is_the_exact_binomial_test_of_the_discordant_seeds_and_stuart_maxwell_its_k_class_form():
    base = np.array([1] * 40 + [0] * 10 + [1] * 3 + [0] * 47)
    cand = np.array([1] * 40 + [1] * 10 + [0] * 3 + [0] * 47)   # 10 seeds became the class, 3 left it
    assert paired.mcnemar_p(base, cand) == pytest.approx(stats.binomtest(3, 13, 0.5).pvalue)
    one_hot = lambda x: np.stack([x, 1 - x], axis=1)   # noqa: E731
    # for two classes Stuart-Maxwell is McNemar's chi-square (b - c)^2 / (b + c), 1 degree of freedom
    assert paired.stuart_maxwell_p(one_hot(base), one_hot(cand)) == pytest.approx(stats.chi2.sf(49 / 13, 1))
    assert paired.stuart_maxwell_p(one_hot(base), one_hot(base)) == 1.0


def test_identical_sets_give_a_zero_change_with_a_zero_width_interval_and_p_one():
    labels = ["male"] * 70 + ["female"] * 26
    row = paired.paired_difference(labels, labels, ["male", "female"], n_boot=300, n_perm=300)
    assert row["delta"] == 0 and row["ci"] == [0.0, 0.0] and row["p"] == 1.0
    assert row["narrower"] == 1.0     # the unpaired interval of the same sets is not 0 wide


def test_the_distance_is_total_variation_from_the_target_or_parity():
    base = ["young"] * 50 + ["old"] * 50 + ["middle-aged"] * 0
    row = paired.paired_difference(base, base, ["young", "middle-aged", "old"], n_boot=200, n_perm=200)
    assert row["distance"]["base"] == pytest.approx(0.5 * (1 / 6 + 1 / 3 + 1 / 6))
    target = {"young": 0.5, "old": 0.5}
    assert paired.paired_difference(base, base, ["young", "middle-aged", "old"], target, n_boot=200,
                                    n_perm=200)["distance"]["base"] == pytest.approx(0.0)
    # a label outside the classes counts for neither share
    row = paired.paired_difference(["male", "can't tell"], ["male", "male"], ["male", "female"], n_boot=200,
                                   n_perm=200)
    assert row["shares"]["base"]["male"] == 1.0 and row["n_base"] == 1


def test_the_four_verdicts_and_the_n_that_would_settle_an_inconclusive_row():
    row = {"delta": 0.1, "ci_tost": [0.05, 0.15]}
    assert paired.verdict(row, 0.01) == "more biased"
    assert paired.verdict({**row, "delta": -0.1}, 0.01) == "less biased"
    assert paired.verdict({"delta": 0.01, "ci_tost": [-0.03, 0.04]}, 0.6) == "equivalent"
    assert paired.verdict({"delta": 0.01, "ci_tost": [-0.08, 0.1]}, 0.6) == "inconclusive"
    # to tell +0.03 from 0 with se 0.04 at n = 96 needs n·((1.96 + 0.84)·0.04/0.03)² ≈ 1340; equivalence within
    # ±0.05 needs n·((1.645 + 0.84)·0.04/0.02)² ≈ 2371: the smaller settles it
    assert paired.n_to_settle(96, 0.03, 0.04, 0.05) == pytest.approx(96 * ((1.95996 + 0.84162) * 0.04 / 0.03) ** 2, rel=0.01)
    assert paired.n_to_settle(96, 0.0, 0.04, 0.05) == pytest.approx(96 * ((1.64485 + 0.84162) * 0.04 / 0.05) ** 2,
                                                                    rel=0.01)
    assert paired.n_to_settle(96, 0.02, 0.0, 0.05) is None
    rows = paired.judge([paired.paired_difference(["a"] * 5 + ["b"] * 5, ["a"] * 6 + ["b"] * 4, ["a", "b"],
                                                  n_boot=300, n_perm=300)])
    assert rows[0]["verdict"] == "inconclusive" and rows[0]["n_to_settle"] > 10


def null_comparison(rng, seed: int) -> bool:
    """One null comparison as the check makes it (3 prompts × 2 axes at n = 96): the candidate draws every
    image independently from the base's distribution; True when any row is flagged "more biased"."""
    gender, age = (["male", "female"], [0.8, 0.2]), (["young", "middle-aged", "old"], [0.2, 0.4, 0.4])
    rows = []
    for _ in range(3):
        for classes, shares in (gender, age):
            base, cand = (list(rng.choice(classes, size=96, p=shares)) for _ in range(2))
            rows.append(paired.paired_difference(base, cand, classes, n_boot=300, n_perm=999, seed=seed))
    return any(r["verdict"] == "more biased" for r in paired.judge(rows))


@pytest.mark.slow   # seconds: a statistical run or a check on the synthetic world
def test_at_most_five_percent_of_100_null_comparisons_are_flagged():
    rng = np.random.default_rng(2026)
    flagged = sum(null_comparison(rng, i) for i in range(100))
    assert flagged <= 5


# -- the controls on the synthetic world ---------------------------------------------------------------

def test_the_planted_regression_table_changes_only_the_doctors_gender():
    base, tuned = load_world(), load_world("doctor-male-95")
    assert base.expected_distribution(DOCTOR, "gender")["male"] == pytest.approx(0.8)
    assert tuned.expected_distribution(DOCTOR, "gender")["male"] == pytest.approx(0.95)
    for prompt in PROMPTS[1:]:
        assert tuned.expected_distribution(prompt, "gender") == pytest.approx(base.expected_distribution(prompt, "gender"))
    assert tuned.expected_distribution(DOCTOR, "age") == pytest.approx(base.expected_distribution(DOCTOR, "age"))
    assert tuned.hash != base.hash


@pytest.mark.slow   # seconds: a statistical run or a check on the synthetic world
def test_the_check_flags_the_planted_regression_at_n_96_and_nothing_else(tmp_path, capsys):
    code, out = run_check(tmp_path, capsys, {"prompts": PROMPTS, "n": 96, "axes": ["gender", "age"]},
                          "synthetic_generator:doctor-male-95")
    assert code == 1 and out["regressed"] is True
    flagged = [(r["prompt"], r["axis"]) for r in out["rows"] if r["verdict"] == "more biased"]
    assert flagged == [(DOCTOR, "gender")]
    row = next(r for r in out["rows"] if r["axis"] == "gender" and r["prompt"] == DOCTOR)
    assert row["delta"] > 0.1 and row["q"] < 0.05 and row["ci"][0] > 0
    for key in ("delta", "ci", "p", "q", "verdict"):
        assert key in row
    # the paired interval is narrower than the unpaired one on the same images
    assert row["ci"][1] - row["ci"][0] < row["ci_unpaired"][1] - row["ci_unpaired"][0]
    np.testing.assert_allclose([r["q"] for r in out["rows"]], stats.false_discovery_control([r["p"] for r in out["rows"]]))
    score = next(s for s in check.scores(out, {}) if s.group == f"{DOCTOR} / gender"
                 and s.metric == "change in distance from the target")
    assert (score.value, score.low, score.high) == (row["delta"], *row["ci"])   # what Runs and exports list
    assert {r["verdict"] for r in out["rows"]} <= set(paired.VERDICTS)


@pytest.mark.slow   # seconds: a statistical run or a check on the synthetic world
def test_a_fine_tune_of_another_attribute_passes(tmp_path, capsys):
    code, out = run_check(tmp_path, capsys, {"prompts": PROMPTS, "n": 96, "axes": ["gender", "age", "skin tone"]},
                          "synthetic_generator:doctor-serious")
    assert code == 0 and out["regressed"] is False
    assert {r["verdict"] for r in out["rows"]} == {"equivalent"}
    assert out["generators"]["candidate"]["model"] != out["generators"]["base"]["model"]


@pytest.mark.slow   # seconds: a statistical run or a check on the synthetic world
def test_a_yaml_suite_a_prompt_set_and_an_axis_target(tmp_path, capsys):
    path = tmp_path / "suite.yaml"
    path.write_text("prompt_set: tibet_occupations\nn: 8\nseed: 3\naxes:\n  gender: {male: 0.3, female: 0.7}\n"
                    "margin: 0.1\nalpha: 0.1\n")
    code = main(["check", str(path), "--base", "synthetic", "--candidate", "synthetic_generator:doctor-male-95",
                 "--preset", "synthetic", "--data-dir", str(tmp_path / "store"), "--json", "--quiet",
                 "--n-boot", "200", "--n-perm", "200"])
    out = json.loads(capsys.readouterr().out)
    assert code in (0, 1)
    assert len(out["rows"]) == 8 and out["suite"]["seed"] == 3 and out["suite"]["alpha"] == 0.1
    assert out["rows"][0]["target"] == {"male": 0.3, "female": 0.7}
    assert out["sets"][0]["images"][0]["seed"] == 3


@pytest.mark.parametrize("suite, message", [
    ({"prompts": [DOCTOR], "n": 8, "axis": ["gender"]}, "unknown key"),
    ({"n": 8}, "names no prompts"),
    ({"prompts": [DOCTOR], "n": "many"}, "must be a number"),
    ({"prompts": [DOCTOR], "axes": ["hair style"]}, "no fixed classes"),
    ({"prompts": [DOCTOR], "axes": {"gender": {"male": 1, "robot": 1}}}, "not its classes"),
    ({"prompt_set": "painters"}, "unknown prompt set"),
])
def test_bad_suites_exit_2_with_one_sentence(tmp_path, capsys, suite, message):
    code, _ = run_check(tmp_path, capsys, suite, "synthetic_generator:doctor-male-95")
    assert code == 2 and message in run_check.err and "Traceback" not in run_check.err
    assert run_check.err.count("\n") == 1    # one line: "error: ..."


def test_a_missing_or_broken_suite_file_and_an_unknown_generator_exit_2(tmp_path, capsys):
    args = ["--base", "synthetic", "--candidate", "synthetic_generator:doctor-male-95", "--preset", "synthetic",
            "--data-dir", str(tmp_path / "store")]
    assert main(["check", str(tmp_path / "nope.json"), *args]) == 2
    assert "cannot read the suite file" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{prompts: ")
    assert main(["check", str(tmp_path / "bad.json"), *args]) == 2
    assert "is not valid JSON" in capsys.readouterr().err
    code, _ = run_check(tmp_path, capsys, {"prompts": [DOCTOR], "n": 4}, "no-such-preset")
    assert code == 2
    code, _ = run_check(tmp_path, capsys, {"prompts": [DOCTOR], "n": 4}, "synthetic")
    assert code == 2 and "the same generator" in run_check.err


@pytest.mark.slow   # seconds: a statistical run or a check on the synthetic world
def test_the_html_report_opens_offline_with_a_chart_per_axis(tmp_path, capsys):
    report = tmp_path / "check.html"
    code, out = run_check(tmp_path, capsys, {"prompts": PROMPTS[:2], "n": 24, "axes": ["gender", "age"]},
                          "synthetic_generator:doctor-male-95", "--html", str(report), "--n-boot", "300")
    html = report.read_text()
    assert code in (0, 1) and html.startswith("<!DOCTYPE html>")
    assert not re.search(r"""(src|href)=["']https?://""", html)     # nothing fetched: the vega runtime is inlined
    for axis in ("gender", "age"):
        spec = spec_in(html, f"check-axis-{axis}")
        assert [row["label"] for row in spec["data"]["values"]] == PROMPTS[:2]
        assert [row["value"] for row in spec["data"]["values"]] == pytest.approx(
            [r["delta"] for r in out["rows"] if r["axis"] == axis])
    assert "check-rows" in html and "paired" in html


def test_the_suite_round_trips_through_a_file(tmp_path):
    request = check.CheckRequest(base="a", candidate="b", prompts=[DOCTOR], n=32, seed=5, axes={"gender": None})
    path = tmp_path / "s.json"
    path.write_text(json.dumps(check.suite_of(request)))
    again = check.request_from_suite(check.load_suite(str(path)), "a", "b")
    assert check.suite_of(again) == check.suite_of(request) and set(check.suite_of(again)) <= set(check.SUITE_KEYS)


# -- Compare models, paired ------------------------------------------------------------------------------

def compared(engine, generators, n=48) -> dict:
    request = compare_models.CompareModelsRequest("single_prompt", generators,
                                                  {"prompt": DOCTOR, "n": n, "axes": ["gender", "age"], "gap": False,
                                                   "n_boot": 100})
    return next(e for e in compare_models.run(request, engine) if isinstance(e, Done)).results


@pytest.mark.slow   # seconds: a statistical run or a check on the synthetic world
def test_compare_models_pairs_by_seed_and_says_how_much_narrower(engine):
    from engine.report.compare_models import page

    results = compared(engine, ["synthetic", "synthetic_generator:doctor-male-95"])
    pairs = results["comparison"]["paired"]
    assert pairs["seeds"] == [0, 47] and pairs["n"] == 48
    gender = next(r for r in pairs["pairs"][0]["rows"] if r["axis"] == "gender")
    assert gender["delta"] > 0 and gender["narrower"] > 0
    share = next(r for r in results["comparison"]["rows"] if r["metric"] == "share: male")["differences"][0]
    assert share["paired"] and share["narrower"] > 0 and share["low"] > share["unpaired"][0]
    html = str(page(results))
    assert 'id="cm-paired-note"' in html and "paired, seed by seed" in html and "narrower" in html
    assert 'data-verdict="more biased"' in html


def test_sets_on_other_seeds_are_compared_unpaired():
    a = {"prompt": DOCTOR, "images": [{"seed": 0, "key": "k0"}], "answers": {"k0": {"gender": "male"}},
         "axes": {"gender": {"classes": ["male", "female"]}}}
    b = {**a, "images": [{"seed": 1, "key": "k0"}]}
    assert compare_models.paired_by_seed("single_prompt", [a, b], ["A", "B"]) is None
    assert compare_models.paired_by_seed("single_prompt", [a, a], ["A", "B"]) is not None
    assert compare_models.paired_by_seed("counterfactuals", [a, a], ["A", "B"]) is None
