"""Vendi score and mean pairwise similarity."""
import math

import numpy as np
import pytest

from engine.metrics.diversity import (
    mean_pairwise_similarity,
    normalised_vendi,
    unit_rows,
    vendi_score,
    vendi_score_from_similarity,
)


def test_identical_embeddings_score_one():
    x = np.tile([0.3, -1.2, 2.0], (10, 1))
    assert vendi_score(x) == pytest.approx(1.0)
    assert normalised_vendi(x) == pytest.approx(0.0, abs=1e-12)
    assert mean_pairwise_similarity(x) == pytest.approx(1.0)


def test_orthonormal_embeddings_score_n():
    x = np.eye(6)[:5] * 3.0  # scale does not matter: the kernel is the cosine
    assert vendi_score(x) == pytest.approx(5.0)
    assert normalised_vendi(x) == pytest.approx(1.0)
    assert mean_pairwise_similarity(x) == pytest.approx(0.0)


def test_two_points_by_hand():
    angle = 0.7
    x = np.array([[1.0, 0.0], [math.cos(angle), math.sin(angle)]])
    c = math.cos(angle)
    eigenvalues = [(1 + c) / 2, (1 - c) / 2]
    expected = math.exp(-sum(v * math.log(v) for v in eigenvalues))
    assert vendi_score(x) == pytest.approx(expected)
    assert mean_pairwise_similarity(x) == pytest.approx(c)


def test_dual_equals_primal():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 16)) + 0.5  # N > d: the d × d dual is used
    primal = vendi_score_from_similarity(unit_rows(x) @ unit_rows(x).T)
    assert vendi_score(x) == pytest.approx(primal, rel=1e-9)
    # a rank-deficient set: 40 points in a 3-dimensional subspace of R^16
    low_rank = rng.normal(size=(40, 3)) @ rng.normal(size=(3, 16))
    primal = vendi_score_from_similarity(unit_rows(low_rank) @ unit_rows(low_rank).T)
    assert vendi_score(low_rank) == pytest.approx(primal, rel=1e-9)
    assert vendi_score(low_rank) <= 3.0 + 1e-9


def test_mean_pairwise_similarity_matches_brute_force():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(20, 8))
    u = unit_rows(x)
    k = u @ u.T
    brute = (k.sum() - np.trace(k)) / (20 * 19)
    assert mean_pairwise_similarity(x) == pytest.approx(brute)


def test_a_thousand_images_take_the_small_side_and_score_as_the_full_kernel():
    # N > d: the score comes from the 768 x 768 matrix; it equals the one of the 1000 x 1000 kernel
    # (timing: bench/metric_speed.py).
    x = np.random.default_rng(2).normal(size=(1000, 768))
    u = unit_rows(x)
    assert vendi_score(x) == pytest.approx(vendi_score_from_similarity(u @ u.T), rel=1e-9)
    # ten orthogonal directions, a hundred images each: exactly ten effective images
    clusters = np.repeat(np.eye(768)[:10] * 3.0, 100, axis=0)
    assert vendi_score(clusters) == pytest.approx(10.0, rel=1e-9)


def test_edge_cases():
    assert vendi_score([[1.0, 2.0]]) == pytest.approx(1.0)
    assert normalised_vendi([[1.0, 2.0]]) == 0.0
    assert math.isnan(mean_pairwise_similarity([[1.0, 2.0]]))
    with pytest.raises(ValueError):
        vendi_score([[0.0, 0.0], [1.0, 0.0]])
    with pytest.raises(ValueError):
        vendi_score(np.zeros((0, 3)))
