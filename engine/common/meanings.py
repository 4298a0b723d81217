"""What every metric GapLens shows means: what it measures, which way is more biased, and its
range — one table for every page (hover and info lines), the CLI and the clipping of intervals.

`MEANINGS[key]` is keyed like the stored scores ("composite_bias_score", "mad", …);
`meaning(name)` also finds a key inside a longer score name ("mad_environment", "cas_clip").
`clip_interval` keeps a 95% interval inside its metric's range (and around its value);
`difference_range` is the range of a difference of two values of one metric (Compare models).
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Meaning:
    """One metric: its `name` on a page, what it `measures`, which way is more biased
    (`direction`), its range [`low`, `high`] and that range in words (`range_text`)."""

    name: str
    measures: str
    direction: str
    low: float
    high: float
    range_text: str

    def line(self) -> str:
        """Returns the one-line meaning: "<name>: <measures>. <direction>; range <range>."."""
        return f"{self.name}: {self.measures}. {self.direction}; range {self.range_text}."


INF = math.inf
MEANINGS: dict[str, Meaning] = {
    "composite_bias_score": Meaning(
        "Composite Bias Score (CBS)", "the mean of parity difference and 1 − normalised entropy (and CAS when the "
        "prompt has a stereotype lexicon)", "Higher = more biased", 0.0, 1.0, "0 (fair) to 1 (one class only)"),
    "parity_difference": Meaning(
        "Parity difference", "the gap between the most and the least frequent class's share (|p_A − p_B| for "
        "two groups)", "Higher = more biased", 0.0, 1.0, "0 (equal shares) to 1 (one class only)"),
    "normalised_entropy": Meaning(
        "Normalised entropy", "how evenly the images spread over the classes (entropy / log k)",
        "Higher = FAIRER (unlike the other metrics)", 0.0, 1.0, "0 (one class only) to 1 (all classes equal)"),
    "kl_divergence": Meaning(
        "KL from reference", "how far the class shares are from the target distribution (bits in paper mode, "
        "nats in reference mode)", "Higher = more biased", 0.0, INF, "0 (the target exactly) upwards, unbounded"),
    "bias_amplification": Meaning(
        "Bias amplification", "the summed distance Σ|p_j − t_j| of the class shares from the target shares",
        "Higher = more biased", 0.0, 2.0, "0 to 2(1 − 1/k) with a uniform target (1 for two classes, where it "
        "equals the parity difference)"),
    "cas": Meaning(
        "CAS", "how alike the concepts of a counterfactual's images and of the initial images are (histogram "
        "IoU; CAS CLIP: mean CLIP cosine)", "A high CAS means the initial prompt leans toward that counterfactual; "
        "CAS spread unevenly over an axis's counterfactuals = more biased", 0.0, 1.0, "0 (nothing shared) to 1 "
        "(identical)"),
    "mad": Meaning(
        "MAD", "how unevenly CAS spreads over one axis's counterfactuals (normalised mean absolute deviation)",
        "Higher = more biased", 0.0, 1.0, "0 (every counterfactual equally close) to 1 (only one)"),
    "is": Meaning(
        "IS", "how making the row axis diverse changes the column axis's distance from its target (w̄ before − "
        "after)", "Positive = it moves closer to its target, negative = further (the bias spreads); larger |IS| "
        "= stronger interaction", -1.0, 1.0, "−1 to 1"),
    "gap_score": Meaning(
        "Gap score", "how well the images cover the plausible readings of the prompt (B = M − A: the worst-covered "
        "readings' term minus the least-aligned images' term)", "Lower = more biased (readings no image shows)",
        -2.0, 2.0, "−2 to 2 (typically −0.3 to 0.3)"),
    "vendi": Meaning(
        "Vendi score", "the effective number of distinct images (CLIP embeddings)", "Lower = less diverse",
        1.0, INF, "1 (all alike) to N (all different); normalised: Vendi / N"),
}
# score keys that are one of the metrics above under another name
ALIASES = {"max_parity_difference": "parity_difference", "cas_clip": "cas", "mad_clip": "mad", "IS": "is",
           "IS (pruned)": "is", "score": "gap_score", "best_score": "gap_score", "vendi_normalised": "vendi"}


def meaning(name: str) -> Meaning | None:
    """Returns the meaning of the metric `name` names: a key of MEANINGS or ALIASES, or one with a
    suffix ("mad_environment", "cbs_gender"…); None for a number that is not a metric."""
    name = str(name)
    key = ALIASES.get(name, name)
    if key in MEANINGS:
        return MEANINGS[key]
    if name.lower() in MEANINGS:
        return MEANINGS[name.lower()]
    for prefix, key in (("cbs_", "composite_bias_score"), ("mad_clip_", "mad"), ("mad_", "mad"),
                        ("cas_clip_", "cas"), ("cas_", "cas")):
        if name.startswith(prefix):
            return MEANINGS[key]
    return None


def metric_range(name: str, k: int | None = None, target: list[float] | None = None) -> tuple[float, float]:
    """Returns [low, high] of the metric `name` (−inf, inf when it is not one). Bias amplification's
    maximum is 2(1 − min t_j): 2(1 − 1/k) with a uniform target over `k` classes, or from the `target` shares."""
    m = meaning(name)
    if m is None:
        return (0.0, 1.0) if str(name).startswith("share") else (-INF, INF)
    if m is MEANINGS["bias_amplification"]:
        if target:
            return 0.0, 2.0 * (1.0 - min(float(t) for t in target))
        if k:
            return 0.0, 2.0 * (1.0 - 1.0 / k)
    if m is MEANINGS["vendi"] and name == "vendi_normalised":
        return 0.0, 1.0
    return m.low, m.high


def difference_range(name: str, k: int | None = None) -> tuple[float, float]:
    """Returns the range of b − a for two values a, b of the metric `name`: ±(high − low)."""
    low, high = metric_range(name, k)
    return -(high - low), high - low


def clip_interval(low, high, lowest: float, highest: float, value=None) -> tuple[float | None, float | None]:
    """Returns (low, high) clipped to [lowest, highest] and stretched to include `value`; a
    missing bound stays None."""
    def clip(x):
        return None if x is None or (isinstance(x, float) and math.isnan(x)) else min(max(float(x), lowest), highest) + 0.0

    low, high = clip(low), clip(high)
    if value is not None and not (isinstance(value, float) and math.isnan(value)):
        v = clip(value)
        low = v if low is None else min(low, v)
        high = v if high is None else max(high, v)
    return low, high


def equal_by_construction(k: int, reference: dict | None = None) -> str:
    """Returns the sentence that bias amplification equals the parity difference (two classes, a
    uniform target: Σ|p_j − ½| = |p_A − p_B|), or "" when they differ."""
    if k == 2 and not reference:
        return "With two classes and an even target, bias amplification equals the parity difference."
    return ""
