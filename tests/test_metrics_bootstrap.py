"""Bootstrap intervals over images."""
import math

import numpy as np
import pytest

from engine.metrics.biasbench import bias_amplification
from engine.metrics.bootstrap import Estimate, bootstrap_ci, percentile_interval, resample_indices


def test_value_is_the_statistic_on_all_items_and_interval_brackets_it():
    x = np.random.default_rng(0).normal(loc=2.0, size=200)
    estimate = bootstrap_ci(np.mean, x)
    assert isinstance(estimate, Estimate)
    assert estimate.value == pytest.approx(x.mean())
    assert estimate.low < estimate.value < estimate.high
    # the percentile interval of a mean is about ±1.96 standard errors
    assert estimate.high - estimate.low == pytest.approx(2 * 1.96 * x.std() / math.sqrt(200), rel=0.15)


def test_same_seed_same_interval_other_seed_other_interval():
    x = np.arange(30.0)
    assert bootstrap_ci(np.median, x, seed=3) == bootstrap_ci(np.median, x, seed=3)
    assert bootstrap_ci(np.median, x, seed=3) != bootstrap_ci(np.median, x, seed=4)


def test_arrays_are_resampled_jointly():
    labels = np.array(["a", "b", "c", "d"] * 5)
    ids = np.arange(20)

    def paired(resampled_labels, resampled_ids):
        assert (resampled_labels == labels[resampled_ids]).all()
        return len(set(resampled_ids)) / 20

    estimate = bootstrap_ci(paired, labels, ids, n_boot=200)
    assert estimate.value == 1.0 and estimate.high < 1.0


def test_index_mode_for_non_array_data():
    answers = [["a man"], ["a woman", "young"], ["a man", "old"], ["nobody"]]

    def share_with_man(indices):
        return np.mean(["man" in answers[i][0].split() for i in indices])

    estimate = bootstrap_ci(share_with_man, n_items=len(answers), n_boot=500)
    assert estimate.value == 0.5
    assert 0.0 <= estimate.low <= 0.5 <= estimate.high <= 1.0


def test_batched_equals_one_by_one():
    x = np.random.default_rng(1).exponential(size=50)
    one_by_one = bootstrap_ci(np.mean, x, n_boot=300, seed=7)
    batched = bootstrap_ci(lambda a: a.mean(axis=-1), x, n_boot=300, seed=7, batched=True)
    assert batched.value == pytest.approx(one_by_one.value)
    assert (batched.low, batched.high) == pytest.approx((one_by_one.low, one_by_one.high))
    by_index = bootstrap_ci(lambda idx: x[idx].mean(axis=-1), n_items=50, n_boot=300, seed=7, batched=True)
    assert (by_index.low, by_index.high) == pytest.approx((one_by_one.low, one_by_one.high))


def test_with_a_label_metric():
    labels = np.array(["male"] * 30 + ["female"] * 10)
    estimate = bootstrap_ci(lambda l: bias_amplification(list(l), ("female", "male")), labels, n_boot=300)
    assert estimate.value == pytest.approx(0.5)
    assert estimate.low < 0.5 < estimate.high


def test_nan_resamples_are_left_out():
    x = np.array([0.0, 1.0])
    estimate = bootstrap_ci(lambda a: a.mean() if a.max() > 0 else float("nan"), x, n_boot=200)
    assert estimate.low >= 0.5
    assert math.isnan(percentile_interval(np.array([np.nan, np.nan]))[0])


def test_bad_calls():
    with pytest.raises(ValueError):
        bootstrap_ci(np.mean, np.arange(3), np.arange(4))
    with pytest.raises(ValueError):
        bootstrap_ci(np.mean)
    with pytest.raises(ValueError):
        bootstrap_ci(np.mean, np.arange(3), n_items=3)
    with pytest.raises(ValueError):
        bootstrap_ci(lambda a: a.mean(), np.arange(3), batched=True)
    with pytest.raises(ValueError):
        resample_indices(0)
    with pytest.raises(ValueError):
        percentile_interval(np.arange(3.0), alpha=1.5)
