"""BiasConnect sensitivity, χ² edges, InterMit τ and γ (docs/spec/thesis-tibet-biasconnect-intermit.md §3.4–3.7,
§4.3)."""
import math

import numpy as np
import pytest

from engine.metrics import biasconnect as bc

AGE_INIT = np.array([0.70, 0.25, 0.05])
AGE_GIVEN_MALE = np.array([0.60, 0.30, 0.10])
AGE_GIVEN_FEMALE = np.array([0.90, 0.10, 0.00])


def test_non_uniform_ideal():
    ideal = np.array([0.3, 0.4, 0.3])
    # TV(init, D*) = 0.4, worst case 1 − 0.3 = 0.7
    assert bc.w_bar(AGE_INIT, ideal) == pytest.approx(0.4 / 0.7)
    # the mix is [0.75, 0.20, 0.05]: TV 0.45
    result = bc.intersectional_sensitivity(
        {"gender": np.array([0.5, 0.5]), "age": AGE_INIT},
        {"gender": {"age": np.array([AGE_GIVEN_MALE, AGE_GIVEN_FEMALE])}},
        ideals={"age": ideal},
    )
    assert result.entry("gender", "age") == pytest.approx((0.4 - 0.45) / 0.7)
    assert bc.w_bar(ideal, ideal) == 0.0
    # the one-hot on the least-favoured value is the worst case; other one-hots are below 1
    assert bc.w_bar([1, 0, 0], ideal) == pytest.approx(1.0)
    assert bc.w_bar([0, 1, 0], ideal) == pytest.approx(0.6 / 0.7)


def test_w_bar_bounds_and_counts():
    assert bc.w_bar([5, 0]) == 1.0
    assert bc.w_bar([3, 3, 3]) == 0.0
    assert bc.w_bar([7]) == 0.0  # a single-valued axis cannot be biased
    assert math.isnan(bc.w_bar([np.nan, np.nan]))
    with pytest.raises(ValueError):
        bc.w_bar([0.5, 0.5], [1 / 3] * 3)


def test_cf_sets_of_different_sizes_get_equal_weight():
    counts = np.array([[6, 3, 1], [90, 10, 0]])  # 10 images vs 100 images
    assert bc.mixed_distribution(counts) == pytest.approx([0.75, 0.20, 0.05])
    assert bc.mixed_distribution(np.array([[0, 0, 0], [1, 1, 2]])) == pytest.approx([0.25, 0.25, 0.5])
    assert np.isnan(bc.mixed_distribution(np.zeros((2, 3)))).all()
    assert bc.mixed_distribution(np.array([2, 6])) == pytest.approx([0.25, 0.75])


def test_diagonal_is_the_axis_fixing_itself():
    result = bc.intersectional_sensitivity(
        {"gender": np.array([0.9, 0.1])},
        {"gender": {"gender": np.array([[48, 0], [0, 48]])}},
    )
    assert result.entry("gender", "gender") == pytest.approx(0.8)  # w̄_init − 0


def test_distribution_policies():
    answers = ["Male", " female", "male", "other", "a dog"]
    assert bc.distribution(answers, ["male", "female"]) == pytest.approx([2 / 3, 1 / 3])
    assert bc.distribution(answers, ["male", "female"], "other_bin") == pytest.approx([0.4, 0.2, 0.4])
    assert np.isnan(bc.distribution(["dog"], ["male", "female"])).all()
    ideal = bc.ideal_distribution(["male", "female"], other_policy="other_bin")
    assert ideal == pytest.approx([0.5, 0.5, 0.0])
    # with an "other" bin every answer outside the choices counts as bias
    assert bc.w_bar([0, 0, 1], ideal) == pytest.approx(1.0)
    assert bc.ideal_distribution(["young", "old"], {"young": 3, "old": 1}) == pytest.approx([0.75, 0.25])
    with pytest.raises(ValueError):
        bc.distribution(answers, ["male"], other_policy="keep")
    with pytest.raises(ValueError):
        bc.ideal_distribution(["young", "old"], {"middle": 1.0})
    with pytest.raises(ValueError):
        bc.ideal_distribution(["young", "old"], other_policy="other")


def test_contingency_tables_from_answers():
    values = {"gender": ["male", "female"], "age": ["young", "old"]}
    cf_answers = {"gender": [
        {"gender": ["male"] * 4, "age": ["young", "young", "young", "old"]},
        {"gender": ["female"] * 3 + ["male"], "age": ["old", "old", "young", "?"]},
    ]}
    tables = bc.contingency_tables(cf_answers, values)
    assert tables["gender"]["age"].tolist() == [[3, 1], [1, 2]]
    assert tables["gender"]["gender"].tolist() == [[4, 0], [1, 3]]
    result = bc.intersectional_sensitivity({"gender": np.array([1, 1]), "age": np.array([1, 1])}, tables)
    # mixed age = mean([0.75, 0.25], [1/3, 2/3]) = [13/24, 11/24]: TV = 1/24, w̄ = TV / (1 − 1/2)
    assert result.entry("gender", "age") == pytest.approx(-(13 / 24 - 0.5) * 2)


DEPENDENT = np.array([[40, 8], [8, 40]])
INDEPENDENT = np.array([[24, 24], [24, 24]])


def test_chi2_keeps_dependent_and_prunes_independent_pairs():
    tables = {"gender": {"age": DEPENDENT, "emotion": INDEPENDENT, "gender": np.array([[48, 0], [0, 48]])}}
    edges = {(e.source, e.target): e for e in bc.chi2_edges(tables)}
    assert set(edges) == {("gender", "age"), ("gender", "emotion")}  # x = y is not tested
    assert edges["gender", "age"].kept and edges["gender", "age"].p_value < 1e-4
    assert not edges["gender", "emotion"].kept and edges["gender", "emotion"].p_value > 0.5


def test_chi2_drops_empty_rows_and_columns_and_handles_untestable_tables():
    padded = np.zeros((3, 4))
    padded[:2, 1:3] = DEPENDENT
    assert bc.chi2_test(padded) == pytest.approx(bc.chi2_test(DEPENDENT))
    assert bc.chi2_test(np.array([[10, 5, 0]])) == (1.0, 0.0, 0)
    assert bc.chi2_test(np.array([[10, 0], [7, 0]])) == (1.0, 0.0, 0)


def test_aggregated_level_also_needs_a_large_sensitivity():
    tables = {"gender": {"age": DEPENDENT}, "age": {"gender": DEPENDENT}}
    sensitivity = bc.SensitivityMatrix(["gender", "age"], np.array([[0.0, 0.02], [0.1, 0.0]]),
                                       np.zeros(2), np.zeros((2, 2)))
    kept = {(e.source, e.target) for e in bc.chi2_edges(tables, sensitivity, level="aggregated") if e.kept}
    assert kept == {("age", "gender")}
    with pytest.raises(ValueError):
        bc.chi2_edges(tables, level="aggregated")


def edge(source, target, sensitivity, kept=True):
    return bc.Edge(source, target, 1e-6, 30.0, 1, sensitivity, kept)


def test_max_impact_and_influenced_by_count_or_weight():
    edges = [
        edge("age", "gender", 0.05), edge("age", "emotion", -0.05),
        edge("ethnicity", "gender", 0.6), edge("ethnicity", "clothing", 0.1, kept=False),
    ]
    assert bc.max_impact(edges, by="count") == "age"
    assert bc.max_impact(edges, by="abs_is") == "ethnicity"
    assert bc.max_influenced(edges, by="count") == "gender"
    assert bc.node_scores(edges, "in", "abs_is") == pytest.approx({"gender": 0.65, "emotion": 0.05})
    assert bc.max_impact([edge("a", "b", 0.1, kept=False)]) is None


def test_weighted_bias_and_priority_alignment():
    w_bars = {"gender": 0.8, "age": 0.4, "race": 0.9}
    assert bc.weighted_bias(w_bars, {"gender": 0.7, "age": 0.3}) == pytest.approx(0.68)
    assert bc.weighted_bias(w_bars, {"gender": 7, "age": 3}) == pytest.approx(0.68)  # p is L1-normalised
    s = bc.SensitivityMatrix(
        ["gender", "age", "race"],
        np.array([[0.5, -0.1, 0.0],
                  [0.0, 0.3, 0.0],
                  [0.2, 0.4, 0.6]]),
        np.zeros(3), np.zeros((3, 3)))
    gammas = bc.priority_alignment(s, {"gender": 0.7, "age": 0.3})
    assert gammas == pytest.approx({"gender": 0.32, "age": 0.09, "race": 0.26})
    assert bc.intersectional_distortion(s) == pytest.approx(0.1 + 0.2 + 0.4)
    with pytest.raises(ValueError):
        bc.weighted_bias(w_bars, {"gender": -1.0, "age": 2.0})
