"""TIBET: concept histograms, CAS, CAS^CLIP, normalised MAD, Top-K (docs/spec/thesis-tibet-biasconnect-intermit.md
§2.5–2.8)."""
import math
import os

import numpy as np
import pytest

from engine.metrics import tibet
from engine.metrics.wordnet import DEFAULT_WORDNET_DIR, load_wordnet, wordnet_synonyms

needs_wordnet = pytest.mark.skipif(not os.path.isfile(os.path.join(DEFAULT_WORDNET_DIR, "index.noun")),
                                   reason="WordNet database (Debian wordnet-base) not installed")


# --- MAD --------------------------------------------------------------------------------


def test_mad_uniform_is_zero_and_one_hot_is_one_for_any_k():
    for k in (2, 3, 4, 6, 9):
        assert tibet.mad_normalised([0.37] * k) == pytest.approx(0.0, abs=1e-6)  # sqrt of round-off
        assert tibet.mad_normalised([0.8] + [0.0] * (k - 1)) == pytest.approx(1.0)


def test_mad_compares_axes_with_unequal_k():
    # gender (K = 2) and ethnicity (K = 6) with the same "all on one value" pattern agree
    gender = tibet.mad_normalised([0.6, 0.0])
    ethnicity = tibet.mad_normalised([0.6, 0, 0, 0, 0, 0])
    assert gender == pytest.approx(ethnicity)
    # the level of CAS does not matter, only its spread
    assert tibet.mad_normalised([0.2, 0.1, 0.1]) == pytest.approx(tibet.mad_normalised([0.6, 0.3, 0.3]))


def test_mad_without_sum_normalisation():
    # raw [0.5, 0.6, 0.4]: MAD = 0.2/3, MAD_3 = 4/9
    assert tibet.mad_normalised([0.5, 0.6, 0.4], sum_normalise=False) == pytest.approx(math.sqrt(0.15))
    assert tibet.mad_normalised([1, 1, 0, 0], sum_normalise=False) > 1.0  # why sum-normalising is the default


def test_mad_degenerate():
    assert tibet.mad_normalised([0.7]) == 0.0
    assert tibet.mad_normalised([0.0, 0.0, 0.0]) == 0.0


# --- concept histograms -------------------------------------------------------------------


def test_concept_histogram_by_hand():
    answers = [
        ["A man.", "Young", "yes"],
        ["The image shows a woman", "young!", "None"],
        ["man", "middle-aged", "no"],
        ["a man", None, "other"],
    ]
    histogram = tibet.concept_histogram(answers)
    assert histogram == {"man": 0.75, "young": 0.5, "middle-aged": 0.25, "shows": 0.25, "woman": 0.25}
    assert list(histogram)[:2] == ["man", "young"]


def test_concept_histogram_threshold_and_parameters():
    answers = [["cat"]] * 199 + [["rare dog"]]
    assert "rare" not in tibet.concept_histogram(answers)             # 1/200 < 0.01
    assert "rare" in tibet.concept_histogram(answers, min_frequency=0.0)
    assert tibet.concept_histogram([["yes", "cat"]], stopwords=set())["yes"] == 1.0
    assert tibet.concept_histogram([]) == {}


def test_top_k_concepts():
    histogram = {"b": 0.5, "a": 0.5, "c": 0.9, "d": 0.1}
    assert tibet.top_k_concepts(histogram, k=3) == [("c", 0.9), ("a", 0.5), ("b", 0.5)]


# --- CAS ----------------------------------------------------------------------------------


def test_cas_by_hand():
    initial = {"man": 0.5, "suit": 0.5}
    counterfactual = {"woman": 0.5, "suit": 0.25, "dress": 0.25}
    # vocabulary (dress, man, suit, woman): min sum 0.25, max sum 1.75
    assert tibet.cas(initial, counterfactual) == pytest.approx(1 / 7)
    assert tibet.cas(initial, initial) == pytest.approx(1.0)
    assert tibet.cas(initial, counterfactual) == pytest.approx(tibet.cas(counterfactual, initial))


def test_cas_renormalisation_matters_only_when_totals_differ():
    assert tibet.cas({"x": 1.0}, {"x": 2.0}) == pytest.approx(1.0)
    assert tibet.cas({"x": 1.0}, {"x": 2.0}, renormalise=False) == pytest.approx(0.5)
    a, b = {"x": 0.3, "y": 0.7}, {"x": 0.6, "y": 0.4}
    assert tibet.cas(a, b) == pytest.approx(tibet.cas(a, b, renormalise=False))


def test_cas_empty_or_disjoint_is_tiny_not_zero():
    assert tibet.cas({}, {"x": 1.0}) == 1e-7
    assert tibet.cas({"x": 1.0}, {"y": 1.0}) == 1e-7


def test_cas_with_synonyms_shares_one_grouping():
    def synonyms(word):
        return {"male": {"male", "man"}, "man": {"man"}}.get(word, {word})

    initial = {"man": 0.6, "male": 0.2, "suit": 0.2}
    counterfactual = {"male": 0.8, "suit": 0.2}
    assert tibet.cas(initial, counterfactual) < 0.5
    assert tibet.cas(initial, counterfactual, synonyms_fn=synonyms) == pytest.approx(1.0)


def test_synonym_mapping_is_greedy_by_weight_and_not_transitive():
    chain = {"man": {"man", "human"}, "human": {"human", "world"}, "world": {"world"}}
    mapping = tibet.synonym_mapping(chain, lambda w: chain[w], weights={"man": 3, "human": 2, "world": 1})
    assert mapping == {"man": "man", "human": "man", "world": "world"}
    merged = tibet.merge_synonyms({"man": 0.3, "human": 0.2, "world": 0.1}, lambda w: chain[w])
    assert merged == pytest.approx({"man": 0.5, "world": 0.1})


def test_cas_clip():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(6, 4)) + 1.0, rng.normal(size=(5, 4)) + 1.0
    unit_a = a / np.linalg.norm(a, axis=1, keepdims=True)
    unit_b = b / np.linalg.norm(b, axis=1, keepdims=True)
    assert tibet.cas_clip(a, b) == pytest.approx((unit_a @ unit_b.T).mean())
    assert tibet.cas_clip(a[:1], a[:1] * 2) == pytest.approx(1.0)
    assert tibet.cas_clip(np.eye(2)[:1], -np.eye(2)[:1]) == 0.0  # negative cosine clipped


# --- WordNet synonyms -----------------------------------------------------------------------


@needs_wordnet
def test_wordnet_synonyms():
    assert "doctor" in wordnet_synonyms("physician")
    assert "man" in wordnet_synonyms("men")          # plural through WordNet's morphology
    assert "man" in wordnet_synonyms("male")         # manual addition of the released code
    assert "woman" in wordnet_synonyms("female")


@needs_wordnet
def test_merge_synonyms_with_wordnet():
    merged = tibet.merge_synonyms({"doctor": 0.6, "physician": 0.3, "male": 0.4, "man": 0.5, "tree": 0.1})
    assert merged == pytest.approx({"doctor": 0.9, "man": 0.9, "tree": 0.1})


def test_missing_wordnet_degrades_to_manual_pairs_with_a_warning(tmp_path):
    root = str(tmp_path / "no-wordnet")
    with pytest.warns(UserWarning, match="WordNet"):
        assert load_wordnet(root) is None
    assert wordnet_synonyms("Male", root=root) == {"male", "man"}
    assert wordnet_synonyms("physician", root=root) == {"physician"}
