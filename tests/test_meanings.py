"""Every metric shown has a meaning (what it measures, which way is more biased, its range), and
every interval stays inside its metric's range (issue 34 item 4)."""
import math

import pytest

from engine.common.meanings import MEANINGS, clip_interval, difference_range, equal_by_construction, meaning, metric_range
from engine.common.scores import Score, difference
from engine.methods.axes import Axis
from engine.methods.measure import axis_metrics_with_ci, metric_ranges
from engine.report import explain

GENDER = Axis("gender", "What is the gender?", ("male", "female"))
AGE = Axis("age", "How old?", ("young", "middle-aged", "old"))


def test_every_metric_the_pages_show_says_what_it_measures_its_direction_and_range():
    for key in ("composite_bias_score", "parity_difference", "normalised_entropy", "kl_divergence",
                "bias_amplification", "cas", "mad", "is", "gap_score", "vendi"):
        m = MEANINGS[key]
        assert m.measures and m.direction and m.range_text and m.low < m.high
        assert m.line().startswith(m.name) and "range" in m.line()
    assert "FAIRER" in MEANINGS["normalised_entropy"].direction          # unlike the rest
    assert MEANINGS["gap_score"].direction.startswith("Lower = more biased")
    # stored score names find their metric: per-axis keys, the CLIP variants, the IS cells
    assert meaning("mad_environment") is meaning("mad_clip") is MEANINGS["mad"]
    assert meaning("cas_clip") is MEANINGS["cas"] and meaning("IS (pruned)") is MEANINGS["is"]
    assert meaning("cbs_gender") is MEANINGS["composite_bias_score"] and meaning("seconds") is None
    assert explain.tip("seconds") == "" and 'data-metric="mad"' in explain.info(["mad", "seconds"])


def test_bias_amplification_is_clipped_to_its_range_for_k_classes():
    assert metric_range("bias_amplification", k=2) == (0.0, 1.0)
    assert metric_range("bias_amplification", k=3) == pytest.approx((0.0, 4 / 3))
    assert metric_range("bias_amplification", target=[0.8, 0.2]) == pytest.approx((0.0, 1.6))
    # the 0.708 [0.271, 1.020] on a two-class axis
    assert clip_interval(0.271, 1.020, *metric_range("bias_amplification", k=2), value=0.708) == (0.271, 1.0)
    assert clip_interval(0.271, 1.020, *metric_range("bias_amplification", k=3), value=0.708) == (0.271, 1.02)
    # a value outside its own interval stretches it; missing bounds stay missing
    assert clip_interval(0.3, 0.5, 0.0, 1.0, value=0.6) == (0.3, 0.6)
    assert clip_interval(None, None, 0.0, 1.0) == (None, None)


@pytest.mark.parametrize("mode", ["paper", "reference"])
def test_measured_intervals_stay_inside_each_metrics_range(mode):
    labels = ["male"] * 15 + ["female"]
    m = axis_metrics_with_ci(labels, GENDER, None, mode, n_boot=200)
    for name, (low, high) in metric_ranges(GENDER.values).items():
        lo, hi = m["ci"][name]
        assert low <= lo <= m[name] <= hi <= high, (name, lo, m[name], hi)
    assert m["ci"]["bias_amplification"][1] <= 1.0
    # two classes and an even target: bias amplification equals the parity difference, and the page says so
    assert m["bias_amplification"] == pytest.approx(m["parity_difference"]) == pytest.approx(14 / 16)
    assert equal_by_construction(2) and not equal_by_construction(3) and not equal_by_construction(2, {"male": .7})
    from engine.report.single_prompt import axis_html

    assert "(= parity difference: two classes)" in axis_html("gender", m)
    assert "(= parity difference" not in axis_html("age", axis_metrics_with_ci(["young"] * 4 + ["old", "middle-aged"], AGE, None,
                                                                               mode, n_boot=50))


def test_a_difference_of_two_runs_stays_inside_the_range_a_difference_can_take():
    # Compare models: normalised entropy 0.900 [0.800, 1.000] vs 0.004 [0.000, 0.350]: −0.896 ± 0.202 by hand
    # (se = hypot(0.2, 0.35) / 3.92), whose low end −1.098 is past the −1 a difference of two values in [0, 1] can reach
    d = difference(Score("gender", "normalised_entropy", 0.9, 0.8, 1.0),
                   Score("gender", "normalised_entropy", 0.004, 0.0, 0.35))
    assert d["value"] == pytest.approx(-0.896) and d["low"] == -1.0 and d["high"] == pytest.approx(-0.694, abs=1e-3)
    assert difference_range("normalised_entropy") == (-1.0, 1.0)
    shares = difference(Score("gender", "share: male", 0.05, 0.0, 0.3), Score("gender", "share: male", 0.95, 0.7, 1.0))
    assert shares["high"] <= 1.0
    kl = difference(Score("g", "kl_divergence", 0.1, 0.0, 0.4), Score("g", "kl_divergence", 3.0, 1.0, 9.0))
    assert kl["high"] == pytest.approx(2.9 + math.hypot(0.4, 8.0) / 2)   # unbounded above: nothing clipped
