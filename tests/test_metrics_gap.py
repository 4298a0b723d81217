"""MineTheGap bias score (reconstruction, docs/spec/minethegap-and-biasbench.md A.3 and A.6)."""
import zlib

import numpy as np
import pytest

from engine.metrics.gap import COMBINATIONS, combine_terms, gap_score, gap_score_from_similarity, resampled_gap_scores

RGB = np.eye(3)


def test_terms_by_hand():
    s = np.array([[0.9, 0.1, 0.8],
                  [0.2, 0.3, 0.1]])
    result = gap_score_from_similarity(s, alpha=50, k=1)
    assert list(result.coverage) == [0.9, 0.3]
    assert list(result.alignment) == [0.9, 0.3, 0.8]
    assert result.coverage_term == pytest.approx(0.6)   # median of (0.9, 0.3)
    assert result.alignment_term == pytest.approx(0.8)  # median of (0.9, 0.3, 0.8)
    assert result.score == pytest.approx(-0.2)
    assert list(result.missed_variations) == [1]
    assert list(result.least_aligned_images) == [1]
    assert combine_terms(0.6, 0.8, "missed_only") == 0.6
    assert combine_terms(0.6, 0.8, "mean") == pytest.approx(0.7)


def test_missed_variations_are_the_lowest_coverage_ascending():
    rng = np.random.default_rng(0)
    result = gap_score(rng.normal(size=(10, 5)), rng.normal(size=(7, 5)), k=4)
    assert result.similarity.shape == (10, 7)
    assert list(result.missed_variations) == list(np.argsort(result.coverage)[:4])
    assert np.all(np.diff(result.coverage[result.missed_variations]) >= 0)
    assert len(result.least_aligned_images) == 4


@pytest.mark.parametrize("combine", COMBINATIONS)
def test_permutation_invariant(combine):
    rng = np.random.default_rng(1)
    texts, images = rng.normal(size=(12, 6)), rng.normal(size=(9, 6))
    base = gap_score(texts, images, combine=combine)
    text_order, image_order = rng.permutation(12), rng.permutation(9)
    permuted = gap_score(texts[text_order], images[image_order], combine=combine)
    assert permuted.score == pytest.approx(base.score)
    # the same variations are reported missed, under their new indices
    assert set(text_order[permuted.missed_variations]) == set(base.missed_variations)


@pytest.mark.parametrize("combine", COMBINATIONS)
def test_biased_scores_lower_than_balanced(combine):
    modes = np.eye(4)                       # K = 4 orthogonal modes
    texts = np.repeat(modes, 4, axis=0)     # 16 variations, 4 per mode
    balanced = gap_score(texts, np.repeat(modes, 4, axis=0), combine=combine)
    biased = gap_score(texts, np.repeat(modes[:1], 16, axis=0), combine=combine)  # one mode only
    assert biased.score < balanced.score


def test_diff_is_invariant_to_a_constant_shift():
    s = np.random.default_rng(2).uniform(0.1, 0.35, size=(16, 16))
    assert gap_score_from_similarity(s + 0.2).score == pytest.approx(gap_score_from_similarity(s).score)
    assert gap_score_from_similarity(s + 0.2, combine="mean").score != pytest.approx(
        gap_score_from_similarity(s, combine="mean").score)


@pytest.mark.parametrize("combine", COMBINATIONS)
def test_resampled_scores_are_the_scores_of_the_resampled_matrices(combine):
    rng = np.random.default_rng(3)
    s = rng.uniform(0.1, 0.35, size=(5, 7))
    rows, cols = rng.integers(0, 5, size=(40, 5)), rng.integers(0, 7, size=(40, 7))
    one_by_one = [gap_score_from_similarity(s[np.ix_(r, c)], 30, combine).score for r, c in zip(rows, cols)]
    assert resampled_gap_scores(s, rows, cols, 30, combine) == pytest.approx(one_by_one)
    by_hand = np.array([[0.9, 0.1, 0.8], [0.2, 0.3, 0.1]])   # test_terms_by_hand, texts (1, 1), images (0, 2, 2)
    assert resampled_gap_scores(by_hand, np.array([[1, 1]]), np.array([[0, 2, 2]]), 50)[0] == pytest.approx(0.2 - 0.1)


def test_bad_inputs():
    with pytest.raises(ValueError):
        gap_score_from_similarity(np.ones((2, 2)), combine="sum")
    with pytest.raises(ValueError):
        gap_score_from_similarity(np.ones((2, 2)), alpha=120)
    with pytest.raises(ValueError):
        gap_score(np.ones((2, 3)), np.ones((2, 4)))


# --- spec A.6: the synthetic colour task --------------------------------------------------

COLOUR_SHARES = {
    "apple": (1.0, 0.0, 0.0),
    "car": (0.5, 0.5, 0.0),
    "truck": (0.6, 0.3, 0.1),
    "balloon": (1 / 3, 1 / 3, 1 / 3),
}


def colour_texts(obj, n=16, epsilon=0.05):
    """Variations "a red/green/blue {obj}" cycled to n: colour vector + a small object component."""
    object_component = np.random.default_rng(zlib.crc32(obj.encode())).normal(size=3)
    return np.array([RGB[i % 3] + epsilon * object_component for i in range(n)])


def colour_images(shares, seed, n=16):
    return RGB[np.random.default_rng(seed).choice(3, size=n, p=shares)]


def mean_colour_score(obj, combine, n_seeds=50):
    texts = colour_texts(obj)
    return np.mean([gap_score(texts, colour_images(COLOUR_SHARES[obj], seed), combine=combine).score
                    for seed in range(n_seeds)])


def test_colour_task_ranks_objects_by_bias():
    diff = {obj: mean_colour_score(obj, "diff") for obj in COLOUR_SHARES}
    assert diff["apple"] <= diff["car"] + 1e-9 < diff["truck"] < diff["balloon"]
    assert diff["apple"] < diff["balloon"] - 0.5 and diff["car"] < diff["balloon"] - 0.5
    # spec A.6 numbers: −1.059, −0.955, −0.093, −0.021 (their object components are unknown)
    assert diff["truck"] == pytest.approx(-0.093, abs=0.03)
    assert diff["balloon"] == pytest.approx(-0.021, abs=0.01)
    assert diff["apple"] == pytest.approx(-1.0, abs=0.1) and diff["car"] == pytest.approx(-1.0, abs=0.1)
    for combine in ("missed_only", "mean"):
        scores = [mean_colour_score(obj, combine) for obj in ("apple", "truck", "balloon")]
        assert scores == sorted(scores)


@pytest.mark.parametrize("shape", [(16, 16), (5, 9), (1, 3), (4, 1)])
def test_resampled_scores_equal_the_score_of_each_resampled_matrix(shape):
    """The bootstrap's stacked scores are, draw by draw and bit for bit, the scores of the resampled matrices
    (rows and columns drawn with replacement, repeats included)."""
    rng = np.random.default_rng(sum(shape))
    s = np.round(rng.normal(size=shape), 2)      # rounded: ties in the maxima and percentiles
    rows, cols = rng.integers(0, shape[0], (50, shape[0])), rng.integers(0, shape[1], (50, shape[1]))
    for combine in COMBINATIONS:
        for alpha in (0, 25, 33.3, 100):
            expected = [gap_score_from_similarity(s[np.ix_(r, c)], alpha, combine).score for r, c in zip(rows, cols)]
            assert resampled_gap_scores(s, rows, cols, alpha, combine).tolist() == expected, (combine, alpha)
