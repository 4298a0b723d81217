"""Trust the numbers (issue 16): small-N intervals and their coverage in the synthetic world,
agreement and correction against hand-computed numbers, the planted evaluator error and its
correction, sample-size advice, headline claims, and the `single-prompt` / `validate` commands."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from engine.common.errors import InputError
from engine.methods.axes import axis_for
from engine.backends.base import ModelSpec
from engine.backends.synthetic import load_world
from engine.core.engine import Engine
from engine.metrics.agreement import agreement, cohens_kappa, correct_shares, rogan_gladen
from engine.metrics.intervals import (bca_interval, headline_claim, n_for_half_width, n_for_power,
                                      sample_size_advice, share_interval, top_probability)
from engine.methods import measure, single_prompt, validate
from engine.models.presets import SYNTHETIC_TABLE

ROOT = Path(__file__).resolve().parents[1]
COVERAGE_PROMPTS = [f"a photo of a {s}" for s in
                    ("firefighter", "nurse", "doctor", "ceo", "teacher", "chef", "engineer", "farmer")]


# -- intervals -------------------------------------------------------------------------------------
def test_jeffreys_interval_matches_published_values_and_never_collapses():
    # Brown, Cai & DasGupta (2001): Jeffreys for 0 of 10 is [0, 0.217]; here 7/8 and 8/8 too
    assert share_interval(0, 10)[0] == 0.0
    assert share_interval(0, 10)[1] == pytest.approx(0.2172, abs=5e-4)
    lo, hi = share_interval(8, 8)
    assert hi == 1.0 and 0.70 < lo < 0.78          # not [1, 1]
    lo, hi = share_interval(7, 8)
    assert 0.5 < lo < 0.6 and 0.98 < hi < 1.0
    # the same beta quantiles computed by hand
    assert share_interval(3, 16) == pytest.approx((stats.beta.ppf(0.025, 3.5, 13.5), stats.beta.ppf(0.975, 3.5, 13.5)))
    assert share_interval(0, 0) != share_interval(0, 0)   # nan: no images, no interval


@pytest.mark.parametrize("n", [8, 16, 48])
def test_share_intervals_cover_the_planted_share_95_percent_of_the_time(n):
    """Calibration in the synthetic world: labels drawn from the planted probabilities of 8
    prompts × 3 axes (every class), 600 repetitions with fresh seeds each; the Jeffreys 95%
    intervals Single Prompt shows must contain the planted share 93–97% of the time."""
    world = load_world(SYNTHETIC_TABLE)
    hits = total = 0
    for p, prompt in enumerate(COVERAGE_PROMPTS):
        for a, axis in enumerate(("gender", "age", "skin tone")):
            planted = world.expected_distribution(prompt, axis)
            probs = np.array(list(planted.values()))
            rng = np.random.default_rng([n, p, a])                    # fresh seeds per repetition block
            counts = rng.multinomial(n, probs, size=600)              # (600, k)
            low, high = share_interval(counts, n)
            inside = (low <= probs) & (probs <= high)
            hits += inside.sum()
            total += inside.size
    coverage = hits / total
    assert 0.93 <= coverage <= 0.97, f"coverage {coverage:.3f} at N = {n}"


def test_single_prompt_shows_these_intervals_in_range_with_their_n():
    axis = axis_for("gender")
    m = measure.axis_metrics_with_ci(["male"] * 8, axis, None, "paper", n_boot=500)
    assert m["n"] == 8
    assert m["share_ci"]["male"] == list(share_interval(8, 8))
    for name, (lo, hi) in m["ci"].items():
        assert lo is not None and hi is not None and lo <= m[name] <= hi, name
        assert not str(lo).startswith("-0") and lo >= 0.0 and hi <= measure.METRIC_RANGES[name][1]
    # entropy 0 sits at the edge: its interval includes it and stays inside [0, 1]
    assert m["ci"]["normalised_entropy"][0] == 0.0
    assert "-0.0" not in json.dumps(m["ci"])


def test_bca_interval_and_its_degenerate_case():
    data = np.array([1, 1, 1, 0, 1, 1, 1, 1.0])
    lo, hi = bca_interval(np.mean, data, low=0.0, high=1.0)
    assert 0.0 <= lo < 0.875 <= hi <= 1.0
    assert bca_interval(np.mean, np.ones(8)) == (1.0, 1.0)


# -- how many images -------------------------------------------------------------------------------
def test_sample_size_advice_against_the_textbook_formulas():
    # ±0.1 around a share of one half: z²·p(1−p)/h² = 96 by the normal approximation
    assert 90 <= n_for_half_width(0.5, 0.1) <= 100
    lo, hi = share_interval(round(0.5 * n_for_half_width(0.5, 0.1)), n_for_half_width(0.5, 0.1))
    assert (hi - lo) / 2 <= 0.1
    # 0.9 vs parity 0.5 with 80% power, α = 0.05: ((1.96·0.5 + 0.8416·0.3) / 0.4)² = 9.5 → 10
    assert n_for_power(0.9, 0.5) == 10
    assert n_for_power(0.5, 0.5) is None
    advice = sample_size_advice({"male": 7, "female": 1})
    assert advice["n"] == 8 and advice["n_parity"] == n_for_power(0.875, 0.5)


# -- agreement and correction ----------------------------------------------------------------------
def test_kappa_accuracy_and_recall_by_hand():
    # po = 35/50 = 0.7, pe = (25·30 + 25·20) / 50² = 0.5, κ = 0.4
    assert cohens_kappa(np.array([[20, 5], [10, 15]])) == pytest.approx(0.4)
    truth = ["a"] * 25 + ["b"] * 25
    pred = ["a"] * 20 + ["b"] * 5 + ["a"] * 10 + ["b"] * 15
    out = agreement(truth, pred, ["a", "b"])
    assert out["kappa"] == pytest.approx(0.4) and out["accuracy"] == pytest.approx(0.7)
    assert out["confusion"] == [[20, 5], [10, 15]]
    assert out["recall"] == {"a": 0.8, "b": 0.6}
    assert out["kappa_ci"][0] < 0.4 < out["kappa_ci"][1]
    assert out["accuracy_ci"] == list(share_interval(35, 50))
    # one class on both sides: κ is undefined, not 1; six pairs: an interval, not a point
    assert agreement(list("mmmm"), list("mmmm"), ["m", "f"])["kappa"] is None
    lo, hi = agreement(list("mmmmfm"), list("mmfmfm"), ["m", "f"])["kappa_ci"]
    assert lo < 4 / 7 < hi


def test_rogan_gladen_and_constrained_least_squares_by_hand():
    # (q + Sp − 1) / (Se + Sp − 1) = (0.6 + 0.8 − 1) / 0.7
    assert rogan_gladen(0.6, 0.9, 0.8) == pytest.approx(0.4 / 0.7)
    assert rogan_gladen(0.05, 0.9, 0.8) == 0.0        # clipped, never negative
    m = np.array([[0.8, 0.1, 0.1], [0.1, 0.8, 0.1], [0.2, 0.0, 0.8]])
    p = np.array([0.5, 0.3, 0.2])
    assert correct_shares(m.T @ p, m) == pytest.approx(p, abs=1e-3)


# -- the planted evaluator error and its correction ------------------------------------------------
@pytest.mark.slow
def test_planted_error_is_in_the_model_id_and_follows_its_pattern(tmp_path):
    noisy = Engine("synthetic", data_dir=str(tmp_path), vqa=ModelSpec("synthetic_vqa", SYNTHETIC_TABLE, {"error": 0.3}))
    assert "error=0.3" in noisy.model_id("vqa")
    noisy.cant_tell_below = 0.0                           # every answer, the unsure ones too (issue 35)
    clean = Engine("synthetic", data_dir=str(tmp_path))
    records = clean.image_set("a photo of a firefighter", range(200))
    q = axis_for("age").question
    truth = clean.ask(records, q, ["young", "middle-aged", "old"])
    said = noisy.ask(records, q, ["young", "middle-aged", "old"])
    wrong = [(t, s) for t, s in zip(truth, said) if t != s]
    assert 0.2 < len(wrong) / len(truth) < 0.4
    nxt = {"young": "middle-aged", "middle-aged": "old", "old": "young"}
    assert all(s == nxt[t] for t, s in wrong)             # the planted pattern: always the next class


def test_spot_check_of_40_images_corrects_the_planted_error(tmp_path):
    """Firefighters (planted 90% male) judged by a VQA that confuses gender 30% of the time: a
    40-image spot-check (labels = the error-free VQA's answers) gives a corrected male share
    whose interval holds the error-free share and that is closer to it than the raw share."""
    noisy = Engine("synthetic", data_dir=str(tmp_path), vqa=ModelSpec("synthetic_vqa", SYNTHETIC_TABLE, {"error": 0.3}))
    request = single_prompt.SinglePromptRequest("a photo of a firefighter", n=96, axes=["gender", "age"], gap=False,
                                                n_boot=200, cant_tell_below=0.0)   # no abstention: all 96 answered
    done = list(single_prompt.run(request, noisy))[-1]
    clean = Engine("synthetic", data_dir=str(tmp_path))
    keys = list(done.results["answers"])
    records = clean.store.get_images(keys)
    q = axis_for("gender").question
    truth = dict(zip(keys, clean.ask([records[k] for k in keys], q, ["male", "female"])))
    error_free = sum(truth[k] == "male" for k in keys) / len(keys)

    item = validate.checkable_axes(noisy.store.get_run(done.run_id))["gender"]
    sample = validate.spot_check_sample(item, 40, seed=1)
    assert len(sample) == 40 and len(set(sample)) == 40
    validate.add_labels(noisy.store, done.run_id,
                        [{"image_key": k, "axis": "gender", "label": truth[k]} for k in sample], "tester")
    out = validate.validate_run(noisy.store, done.run_id)["axes"]["gender"]
    raw, corrected, (lo, hi) = out["raw"]["male"], out["corrected"]["male"], out["corrected_ci"]["male"]
    assert out["n_checked"] == 40 and out["kappa"] < 0.9
    assert lo <= error_free <= hi
    assert abs(corrected - error_free) < abs(raw - error_free)
    assert lo <= corrected <= hi and 0.0 <= lo and hi <= 1.0


def test_stratified_sample_keeps_every_evaluator_label():
    item = validate.CheckAxis("gender", "?", ["male", "female"], [f"k{i}" for i in range(100)],
                              ["male"] * 95 + ["female"] * 5, [""] * 100)
    sample = validate.spot_check_sample(item, 10, seed=0)
    labels = [item.predicted[item.keys.index(k)] for k in sample]
    assert len(sample) == 10 and labels.count("female") >= 1 and labels.count("male") >= 8
    assert validate.spot_check_sample(item, 10, seed=0, done=set(sample)) != sample


# -- claims ----------------------------------------------------------------------------------------
def test_headline_claim_says_no_clear_winner_when_draws_overlap():
    rng = np.random.default_rng(0)
    draws = {"a": rng.normal(0.32, 0.1, 2000), "b": rng.normal(0.30, 0.1, 2000), "c": rng.normal(0.1, 0.01, 2000)}
    probs = top_probability(draws)
    assert sum(probs.values()) == pytest.approx(1.0) and probs["c"] < 0.01
    claim = headline_claim({"a": 0.32, "b": 0.30, "c": 0.1}, draws, 8)
    assert not claim["clear"] and claim["top"] == "a" and "no clear winner" in claim["text"]
    assert claim["n_to_settle"] > 8 and "N = 8" in claim["text"]
    sure = headline_claim({"a": 0.9, "b": 0.1}, {"a": rng.normal(0.9, 0.01, 500), "b": rng.normal(0.1, 0.01, 500)}, 8)
    assert sure["clear"] and sure["probability"] == 1.0 and "probability 100%" in sure["text"]


# -- commands --------------------------------------------------------------------------------------
def _cli(*args, data_dir):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-m", "engine", *args, "--preset", "synthetic", "--data-dir", str(data_dir)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)


@pytest.mark.slow
def test_single_prompt_and_validate_commands(tmp_path):
    out = _cli("single-prompt", "--prompt", "a photo of a firefighter", "-n", "8", "--axes", "gender", "age",
               "--no-gap", "--json", "--quiet", data_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    gender = result["axes"]["gender"]
    assert gender["n"] == 8 and set(gender["share_ci"]) == {"male", "female"}
    assert gender["sample_size"]["n_width"] > 8
    assert result["headline"]["text"]
    assert "-0.0" not in out.stdout

    labels = tmp_path / "labels.csv"
    with labels.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["image_key", "axis", "label"])
        for key in list(result["answers"])[:6]:
            w.writerow([key, "gender", "male"])
        w.writerow([list(result["answers"])[6], "gender", "can't tell"])
    out = _cli("validate", result["run_id"], "--labels", str(labels), "--json", "--quiet", data_dir=tmp_path)
    assert out.returncode == 0, out.stderr
    g = json.loads(out.stdout)["axes"]["gender"]
    assert g["n_checked"] == 6 and g["cant_tell"] == 1
    for key in ("kappa", "raw", "corrected", "corrected_ci"):
        assert key in g
    assert set(g["corrected_ci"]) == {"male", "female"} and all(len(v) == 2 for v in g["corrected_ci"].values())

    bad = tmp_path / "bad.csv"
    bad.write_text("key,label\nx,male\n")
    out = _cli("validate", result["run_id"], "--labels", str(bad), data_dir=tmp_path)
    assert out.returncode == 2 and out.stderr.startswith("error: ") and "image_key,axis,label" in out.stderr
    out = _cli("validate", "no-such-run", data_dir=tmp_path)
    assert out.returncode == 2 and "no run" in out.stderr


def test_labels_travel_with_the_exported_run(tmp_path):
    from engine.runs import imports
    from engine.report import export
    from engine.store.store import Store

    source = Engine("synthetic", data_dir=str(tmp_path / "a"))
    done = list(single_prompt.run(single_prompt.SinglePromptRequest("a photo of a nurse", n=6, axes=["gender"],
                                                                    gap=False, n_boot=100), source))[-1]
    keys = list(done.results["answers"])
    validate.add_labels(source.store, done.run_id, [{"image_key": keys[0], "axis": "gender", "label": "female"},
                                                    {"image_key": keys[1], "axis": "gender", "label": "can't tell"}],
                        "Ada")
    with pytest.raises(InputError, match="not one of"):
        validate.add_labels(source.store, done.run_id, [{"image_key": keys[0], "axis": "gender", "label": "cat"}], "x")
    manifest = export.export_zip(source.store, [done.run_id], tmp_path / "run.zip")
    assert manifest["counts"]["labels"] == 2
    assert export.scores_json(source.store, [done.run_id])["runs"][0]["validation"]["axes"]["gender"]["n_checked"] == 1
    import zipfile

    with zipfile.ZipFile(tmp_path / "run.zip") as zf:
        meta = [json.loads(line) for line in zf.read("metadata.jsonl").decode().splitlines()]
        assert "gaplens/labels.jsonl" in zf.namelist()
    first = next(m for m in meta if m["image_key"] == keys[0])
    assert first["labels"][0]["label"] == "female" and first["labels"][0]["who"] == "Ada"
    target = Store(tmp_path / "b")
    imports.import_zip(target, tmp_path / "run.zip")
    assert sorted(r["label"] for r in target.label_rows(done.run_id)) == ["can't tell", "female"]
    assert validate.validate_run(target, done.run_id)["axes"]["gender"]["n_checked"] == 1


@pytest.mark.slow
def test_counterfactuals_headline_states_its_certainty(tmp_path):
    """The issue's firefighter: environment tops the MAD ranking at N = 16 while every interval
    overlaps, so the headline must not claim a winner without saying how sure it is."""
    from engine.methods import counterfactuals

    engine = Engine("synthetic", data_dir=str(tmp_path))
    request = counterfactuals.CounterfactualsRequest(prompt="a photo of a firefighter", n=16, n_boot=300)
    results = list(counterfactuals.run(request, engine))[-1].results
    claim = results["headline"]
    assert claim["top"] == results["mad_order"][0]
    assert 0 < claim["probability"] < 0.95 and not claim["clear"]
    assert "no clear winner" in claim["text"] and claim["n_to_settle"] > 16 and "N = 16" in claim["text"]

    # its free-form answers can be spot-checked too: raw beside corrected for every image set
    run_id = engine.store.list_runs()[0]["id"]
    item = validate.checkable_axes(engine.store.get_run(run_id))["gender"]
    assert {"man", "woman"} <= set(item.classes) and len(set(item.groups)) > 1
    sample = validate.spot_check_sample(item, 12, seed=0)
    truth = {k: p for k, p in zip(item.keys, item.predicted)}
    validate.add_labels(engine.store, run_id, [{"image_key": k, "axis": "gender", "label": truth[k]} for k in sample],
                        "tester")
    gender = validate.validate_run(engine.store, run_id)["axes"]["gender"]
    assert gender["n_checked"] == 12 and gender["accuracy"] == 1.0
    assert set(gender["by_set"]) == set(item.groups)
    for s in gender["by_set"].values():
        assert s["corrected"] == pytest.approx(s["raw"], abs=1e-9)   # a perfect evaluator needs no correction


def test_add_images_until_every_interval_is_narrow_enough(tmp_path):
    engine = Engine("synthetic", data_dir=str(tmp_path), max_images=256)
    request = single_prompt.SinglePromptRequest("a photo of a firefighter", n=8, axes=["gender"], gap=False,
                                                n_boot=100, until_half_width=0.12)
    events = list(single_prompt.run(request, engine))
    results = events[-1].results
    n = results["n"]
    widest = max((hi - lo) / 2 for lo, hi in results["axes"]["gender"]["share_ci"].values())
    assert n > 8 and widest <= 0.12 and len(results["images"]) == n
    assert engine.stats.images_generated == n            # the first images were not drawn twice
    assert engine.stats.image_cache_hits >= 8
    assert any("adding images" in getattr(e, "message", "") for e in events)
    with pytest.raises(InputError, match="between 0 and 0.5"):
        list(single_prompt.run(single_prompt.SinglePromptRequest("a photo", n=4, until_half_width=2.0), engine))


def test_reference_mode_metrics_get_bca_intervals():
    axis = axis_for("age")
    labels = ["young"] * 5 + ["old"] * 2 + ["middle-aged"]
    m = measure.axis_metrics_with_ci(labels, axis, None, "reference", n_boot=200)
    assert "BCa" in m["interval_method"]
    for name, (lo, hi) in m["ci"].items():
        assert lo <= m[name] <= hi, name


@pytest.mark.slow
def test_two_evaluators_compared_on_the_same_images(tmp_path):
    """The planted 'shift' error shows up in the agreement matrix against the error-free VQA;
    CLIP zero-shot over the synthetic embedder agrees with the error-free VQA."""
    noisy = Engine("synthetic", data_dir=str(tmp_path), vqa=ModelSpec("synthetic_vqa", SYNTHETIC_TABLE, {"error": 0.3}))
    noisy.cant_tell_below = 0.0                           # the planted confusion of every answer (issue 35)
    done = list(single_prompt.run(single_prompt.SinglePromptRequest("a photo of a doctor", n=48, axes=["age"],
                                                                    gap=False, n_boot=100, cant_tell_below=0.0),
                                  noisy))[-1]
    out = validate.compare_evaluators(noisy, done.run_id, f"synthetic_vqa:{SYNTHETIC_TABLE}")
    age = out["axes"]["age"]
    m = np.array(age["agreement_matrix"])                 # rows: the noisy run's labels, columns: error-free
    assert m.sum() == 48 and 0.2 < 1 - np.trace(m) / 48 < 0.45 and age["kappa"] < 0.8
    # the noisy VQA says the next class: its 'middle-aged' images are really 'young', never 'old'
    classes = age["classes"]
    assert m[classes.index("middle-aged"), classes.index("old")] == 0
    clean = Engine("synthetic", data_dir=str(tmp_path))
    done = list(single_prompt.run(single_prompt.SinglePromptRequest("a photo of a doctor", n=16, axes=["age"],
                                                                    gap=False, n_boot=100), clean))[-1]
    clip = validate.compare_evaluators(clean, done.run_id, "clip_vqa:synthetic")
    assert clip["axes"]["age"]["kappa"] == 1.0 and clip["second_id"].startswith("clip_vqa:")


def test_best_mined_prompt_claim_follows_its_bootstrap():
    from types import SimpleNamespace

    from engine.methods.mine import best_prompt_claim
    from engine.metrics.gap import gap_score_from_similarity

    rng = np.random.default_rng(0)
    request = SimpleNamespace(image_seed=0, alpha=25.0, combine="diff", n=8)
    biased = np.full((8, 8), 0.2)
    biased[:, :] += rng.normal(0, 0.01, (8, 8))
    biased[:2, :] = 0.9                                    # every image matches only two of the readings
    fair = np.eye(8) * 0.7 + 0.2 + rng.normal(0, 0.01, (8, 8))
    details = {"a": {"similarity": biased.tolist()}, "b": {"similarity": fair.tolist()},
               "c": {"similarity": (fair + 0.001).tolist()}}
    archive = [{"id": k, "prompt": k, "score": gap_score_from_similarity(np.asarray(d["similarity"])).score}
               for k, d in details.items()]
    claim = best_prompt_claim(archive, details, request)
    assert claim["top"] == "a" and claim["clear"] and claim["probability"] >= 0.95
    tie = best_prompt_claim([a for a in archive if a["id"] != "a"], details, request)
    assert not tie["clear"] and "no clear winner" in tie["text"]


@pytest.mark.slow
@pytest.mark.parametrize("p_true, n, error, checked", [(0.9, 96, 0.3, 40), (0.7, 48, 0.2, 40), (0.5, 32, 0.3, 20)])
def test_corrected_interval_carries_both_sampling_errors(p_true, n, error, checked):
    """300 simulated audits (fresh seeds): N images with a planted share, an evaluator that swaps
    the two classes at `error`, a spot-check of `checked` of them; the corrected share's 95%
    interval holds the planted share 92–98% of the time."""
    from engine.metrics.agreement import corrected_distribution

    hits = 0
    for r in range(300):
        rng = np.random.default_rng([r, n])
        truth = np.where(rng.random(n) < p_true, "m", "f")
        pred = np.where(rng.random(n) < error, np.where(truth == "m", "f", "m"), truth)
        idx = rng.choice(n, checked, replace=False)
        out = corrected_distribution([(pred == "m").sum(), (pred == "f").sum()], truth[idx], pred[idx], ["m", "f"],
                                     n_draws=1000, seed=r)
        lo, hi = out["corrected_ci"]["m"]
        hits += lo <= p_true <= hi
    assert 0.92 <= hits / 300 <= 0.98


def test_the_pooled_confusion_corrects_each_image_set():
    """Two sets (90% and 10% 'm') judged by one evaluator that swaps classes 30% of the time, one
    40-image check drawn from both: each set's corrected share moves to its planted share."""
    from engine.metrics.agreement import corrected_distribution

    rng = np.random.default_rng(3)
    truth = np.concatenate([np.where(rng.random(64) < 0.9, "m", "f"), np.where(rng.random(64) < 0.1, "m", "f")])
    pred = np.where(rng.random(128) < 0.3, np.where(truth == "m", "f", "m"), truth)
    idx = rng.choice(128, 40, replace=False)
    pooled = [(pred == "m").sum(), (pred == "f").sum()]
    for part, planted in ((slice(0, 64), 0.9), (slice(64, 128), 0.1)):
        counts = [(pred[part] == "m").sum(), (pred[part] == "f").sum()]
        out = corrected_distribution(pooled, truth[idx], pred[idx], ["m", "f"], target_counts=counts)
        lo, hi = out["corrected_ci"]["m"]
        assert out["n_images"] == 64 and lo <= planted <= hi
        assert abs(out["corrected"]["m"] - planted) < abs(out["raw"]["m"] - planted)


def test_headline_over_a_fixed_and_a_free_text_axis():
    """Posterior draws (paper mode) and BCa resamples (a free-text axis) differ in number; the
    headline still compares them (they are independent across axes)."""
    fixed = measure.axis_metrics_with_ci(["male"] * 7 + ["female"], axis_for("gender"), None, "paper", 400)
    free = measure.axis_metrics_with_ci(["red", "blue", "red", "green"] * 2, axis_for("hair colour"), None,
                                              "paper", 400)
    assert len(fixed["_draws"]) != len(free["_draws"])
    claim = single_prompt.most_biased_axis({"gender": fixed, "hair colour": free},
                                           {"gender": fixed["_draws"], "hair colour": free["_draws"]})
    assert claim["top"] == "gender" and 0 < claim["probability"] <= 1
