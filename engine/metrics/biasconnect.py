"""BiasConnect and InterMit quantities (thesis Ch. 6–7;
docs/spec/thesis-tibet-biasconnect-intermit.md §3.4–3.7, §4.3).

Each image gets one attribute value per bias axis (a multiple-choice VQA answer). For axes
B_x (intervened on) and B_y (affected):

    D_init(B_y)    distribution of B_y over the initial prompt's images
    D_{B_x}(B_y)   distribution of B_y over the counterfactual (CF) image sets of B_x, mixed
                   with equal weight per CF set: "B_x mitigated"
    w̄              normalised distance of a distribution from the ideal D* (see `w_bar`)
    IS_xy          = w̄(D_init(B_y)) − w̄(D_{B_x}(B_y))   (Eq. 6.4); > 0: mitigating B_x helps B_y

Contingency tables are nested mappings `{x: {y: counts}}` with one row per CF set of x and
one column per value of y; the same tables feed `intersectional_sensitivity` and
`chi2_edges`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import chi2_contingency

from engine.metrics._weights import normalised_weights

URL = "https://arxiv.org/abs/2505.17280"
CITATION = """\
@article{shukla2025mitigate,
  title={Mitigate One, Skew Another? Tackling Intersectional Biases in Text-to-Image Models},
  author={Shukla, Pushkar and Chinchure, Aditya and Diana, Emily and Tolbert, Alexander and Hosanagar, Kartik and Balasubramanian, Vineeth N. and Sigal, Leonid and Turk, Matthew},
  journal={arXiv preprint arXiv:2505.17280},
  year={2025}
}
"""

OTHER_POLICIES = ("drop", "other_bin")
# Pruning thresholds of Sec. 6.6: per prompt p < 1e-4; aggregated p < 5e-5 and |IS| ≥ 0.03.
EDGE_THRESHOLDS = {"prompt": (1e-4, 0.0), "aggregated": (5e-5, 0.03)}


def _normalise_answer(answer) -> str:
    return str(answer).strip().lower()


def _check_other_policy(other_policy: str) -> None:
    if other_policy not in OTHER_POLICIES:
        raise ValueError(f"other_policy must be one of {OTHER_POLICIES}, got {other_policy!r}")


def value_counts(labels: Sequence[str], values: Sequence[str], other_policy: str = "drop") -> np.ndarray:
    """Return the counts of `values` among `labels` (case and surrounding spaces ignored).

    Answers outside `values` (no person, "other", free text) are dropped (`"drop"`) or
    counted in one extra last bin (`"other_bin"`).
    """
    _check_other_policy(other_policy)
    position = {_normalise_answer(value): i for i, value in enumerate(values)}
    counts = np.zeros(len(values) + (other_policy == "other_bin"), dtype=float)
    for label in labels:
        i = position.get(_normalise_answer(label))
        if i is not None:
            counts[i] += 1
        elif other_policy == "other_bin":
            counts[-1] += 1
    return counts


def distribution(labels: Sequence[str], values: Sequence[str], other_policy: str = "drop") -> np.ndarray:
    """Return the distribution of `labels` over `values` (+ an "other" bin); nan when no label counts."""
    counts = value_counts(labels, values, other_policy)
    total = counts.sum()
    return counts / total if total > 0 else np.full(len(counts), np.nan)


def ideal_distribution(
    values: Sequence[str], weights: Mapping[str, float] | None = None, other_policy: str = "drop"
) -> np.ndarray:
    """Return D* over `values`: uniform, or `weights` (value -> weight, normalised to sum 1).

    With `"other_bin"` a last entry 0 is appended: answers outside the choices count as bias.
    """
    _check_other_policy(other_policy)
    if weights is None:
        weights = {value: 1.0 for value in values}
    ideal = normalised_weights(values, weights, "the ideal distribution")
    return np.append(ideal, 0.0) if other_policy == "other_bin" else ideal


def w_bar(dist: np.ndarray, ideal: np.ndarray | None = None) -> float:
    """Return w̄ = TV(D, D*) / (1 − min_k D*_k) ∈ [0, 1]: 0 = matches D*, 1 = as far as possible.

    W1 (Eq. 6.1–6.2) with the 0/1 ground metric on categories is the total variation
    distance TV = ½ Σ |D − D*|. Its worst case over all distributions is a one-hot on the
    value D* favours least, 1 − min D*, so dividing by it puts every axis on [0, 1] whatever
    its number of values ("normalised by the number of counterfactuals"). For uniform D*
    the divisor is 1 − 1/K and the value equals what the commented-out scipy
    `wasserstein_distance(vec, [1/K]*K)` calls of the released TIBET code give after their
    one-hot normalisation; unlike those calls it stays correct for a non-uniform D*, and
    unlike an ordinal ground metric it does not depend on the order of nominal values.
    `dist` may be counts; `ideal` is a distribution (see `ideal_distribution`), uniform by
    default. nan in, nan out; 0 for a single-valued axis.
    """
    p = np.asarray(dist, dtype=float)
    q = np.full(len(p), 1.0 / len(p)) if ideal is None else np.asarray(ideal, dtype=float)
    if p.shape != q.shape:
        raise ValueError(f"distribution and ideal differ in length: {p.shape} vs {q.shape}")
    if np.isnan(p).any() or p.sum() <= 0:
        return math.nan
    worst = 1.0 - q.min()
    if worst <= 0:
        return 0.0
    return float(0.5 * np.abs(p / p.sum() - q).sum() / worst)


def contingency_tables(
    cf_answers: Mapping[str, Sequence[Mapping[str, Sequence[str]]]],
    values: Mapping[str, Sequence[str]],
    other_policy: str = "drop",
) -> dict[str, dict[str, np.ndarray]]:
    """Return {x: {y: counts}} from the answers on the counterfactual image sets.

    `cf_answers[x][c][y]` is the list of answers (one per image) to axis y's question on the
    images of the c-th counterfactual of axis x; `values[y]` are the choices of axis y.
    Row c of table (x, y) counts those answers over `values[y]`.
    """
    return {
        x: {y: np.array([value_counts(cf_set[y], values[y], other_policy) for cf_set in cf_sets])
            for y in values if all(y in cf_set for cf_set in cf_sets)}
        for x, cf_sets in cf_answers.items()
    }


def mixed_distribution(table: np.ndarray) -> np.ndarray:
    """Return D_{B_x}(B_y): the CF sets' distributions (table rows) averaged with equal weight.

    Equal weight per CF set simulates "every value of B_x equally represented" even when a
    set lost images (the thesis sums counts over sets of equal size, which is the same).
    Rows without any count are left out; nan when none remains. A 1-D table is one row
    (e.g. counts already summed over CF sets, as the thesis' global graphs do).
    """
    rows = np.atleast_2d(np.asarray(table, dtype=float))
    width = rows.shape[1]
    rows = rows[rows.sum(axis=1) > 0]
    if len(rows) == 0:
        return np.full(width, np.nan)
    return (rows / rows.sum(axis=1, keepdims=True)).mean(axis=0)


@dataclass(frozen=True)
class SensitivityMatrix:
    """The Bias Intersectionality Matrix S (rows intervene, columns are affected)."""

    axes: list[str]
    matrix: np.ndarray       # S[x, y] = IS_xy, (n, n); nan where no CF data
    w_bar_init: np.ndarray   # w̄ of each axis on the initial images, (n,)
    w_bar_mixed: np.ndarray  # w̄ of axis y after intervening on x, (n, n)

    def entry(self, intervened: str, affected: str) -> float:
        """Return IS of `affected` when `intervened` is mitigated."""
        return float(self.matrix[self.axes.index(intervened), self.axes.index(affected)])


def intersectional_sensitivity(
    init_dists: Mapping[str, np.ndarray],
    cf_dists_by_axis: Mapping[str, Mapping[str, np.ndarray]],
    ideals: Mapping[str, np.ndarray] | None = None,
) -> SensitivityMatrix:
    """Return the signed n × n matrix S with S_xy = IS_xy = w̄_init(y) − w̄_{B_x}(y) (Eq. 6.1–6.4).

    `init_dists[y]`: distribution (or counts) of axis y on the initial images; its keys fix
    the axis order. `cf_dists_by_axis[x][y]`: one row per CF set of x, the distribution (or
    counts) of y on that set's images, e.g. `contingency_tables(...)`; rows are mixed by
    `mixed_distribution`. `ideals[y]`: D* of axis y (default uniform; with an "other" bin use
    `ideal_distribution(..., other_policy="other_bin")`). The diagonal S_xx = w̄_init(x) −
    w̄ of x on its own mixed CF sets, so an axis can be chosen to fix itself (spec §4.3).

    The worked example of spec §3.4 (gender → age, uniform D*): age on the initial images
    [.70 .25 .05] is w̄ 0.55 from uniform; the male and female CF sets give [.60 .30 .10] and
    [.90 .10 0], mixed [.75 .20 .05], w̄ 0.625, so IS = 0.55 − 0.625 = −0.075 (diversifying
    gender pushes age further from D*). No CF sets of age were given: that row is nan.

    >>> s = intersectional_sensitivity({"gender": np.array([.5, .5]), "age": np.array([.70, .25, .05])},
    ...                                {"gender": {"age": np.array([[.60, .30, .10], [.90, .10, 0]])}})
    >>> round(float(s.w_bar_init[1]), 3), round(float(s.w_bar_mixed[0, 1]), 3), round(s.entry("gender", "age"), 3)
    (0.55, 0.625, -0.075)
    >>> bool(np.isnan(s.entry("age", "gender")))
    True
    """
    axes = list(init_dists)
    ideals = ideals or {}
    n = len(axes)
    w_init = np.array([w_bar(init_dists[y], ideals.get(y)) for y in axes])
    w_mixed = np.full((n, n), np.nan)
    for i, x in enumerate(axes):
        for j, y in enumerate(axes):
            table = cf_dists_by_axis.get(x, {}).get(y)
            if table is not None:
                w_mixed[i, j] = w_bar(mixed_distribution(table), ideals.get(y))
    return SensitivityMatrix(axes, w_init[None, :] - w_mixed, w_init, w_mixed)


def intersectional_distortion(sensitivity: SensitivityMatrix) -> float:
    """Return 𝓘 = Σ_{x≠y} |IS_xy| (Eq. 6.13), ignoring missing entries."""
    off_diagonal = ~np.eye(len(sensitivity.axes), dtype=bool)
    return float(np.nansum(np.abs(sensitivity.matrix[off_diagonal])))


@dataclass(frozen=True)
class Edge:
    """The χ² test of one ordered pair source → target (Sec. 6.6)."""

    source: str
    target: str
    p_value: float
    statistic: float
    dof: int
    sensitivity: float  # IS_source,target (nan when not given)
    kept: bool


def chi2_test(table: np.ndarray, correction: bool = True) -> tuple[float, float, int]:
    """Return (p, χ², dof) of independence of rows and columns; (1, 0, 0) when not testable.

    All-zero rows and columns are dropped first (chi2_contingency rejects them); fewer than
    two rows or columns left means nothing to test. `correction` is scipy's Yates
    correction for 2 × 2 tables (scipy's default, which the thesis most likely used).
    """
    counts = np.asarray(table, dtype=float)
    counts = counts[counts.sum(axis=1) > 0][:, counts.sum(axis=0) > 0]
    if counts.shape[0] < 2 or counts.shape[1] < 2:
        return 1.0, 0.0, 0
    result = chi2_contingency(counts, correction=correction)
    return float(result.pvalue), float(result.statistic), int(result.dof)


def n_to_pass(table: np.ndarray, n: int, p_threshold: float, correction: bool = True,
              n_max: int = 100_000) -> int | None:
    """Return the smallest N per set at which `table` (counts at `n` per set) scaled to N, i.e. the
    same shares measured on N images, gets χ² p < `p_threshold`; None when no N up to `n_max`
    does (no dependence, or nothing to test). Bisection on N (p falls as N grows)."""
    counts = np.asarray(table, dtype=float)

    def passes(size: int) -> bool:
        return chi2_test(counts * (size / n), correction)[0] < p_threshold

    if n <= 0 or not 0 < p_threshold < 1 or not passes(n_max):
        return None
    low, high = n, n_max          # passes(high); low is where the run stood (it did not pass, or N itself)
    if passes(low):
        return n
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (low, mid) if passes(mid) else (mid, high)
    return high


def chi2_edges(
    tables: Mapping[str, Mapping[str, np.ndarray]],
    sensitivity: SensitivityMatrix | None = None,
    level: str = "prompt",
    p_threshold: float | None = None,
    min_abs_sensitivity: float | None = None,
    correction: bool = True,
) -> list[Edge]:
    """Return one Edge per ordered pair x ≠ y of `tables` ({x: {y: counts}}), `kept` if significant.

    Kept when p < `p_threshold` and |IS_xy| ≥ `min_abs_sensitivity`; defaults by `level`:
    "prompt" p < 1e-4; "aggregated" p < 5e-5 and |IS| ≥ 0.03 (which needs `sensitivity`).
    Pairs x = y are not tested: a CF set of x determines x.
    """
    if level not in EDGE_THRESHOLDS:
        raise ValueError(f"level must be one of {tuple(EDGE_THRESHOLDS)}, got {level!r}")
    default_p, default_is = EDGE_THRESHOLDS[level]
    p_threshold = default_p if p_threshold is None else p_threshold
    min_abs_sensitivity = default_is if min_abs_sensitivity is None else min_abs_sensitivity
    if min_abs_sensitivity > 0 and sensitivity is None:
        raise ValueError("an |IS| threshold needs the sensitivity matrix")
    edges = []
    for x, row in tables.items():
        for y, table in row.items():
            if x == y:
                continue
            p_value, statistic, dof = chi2_test(table, correction)
            weight = sensitivity.entry(x, y) if sensitivity is not None else math.nan
            strong = min_abs_sensitivity <= 0 or abs(weight) >= min_abs_sensitivity
            edges.append(Edge(x, y, p_value, statistic, dof, weight, p_value < p_threshold and strong))
    return edges


def node_scores(edges: Sequence[Edge], direction: str = "out", by: str = "count") -> dict[str, float]:
    """Return each node's score over kept edges: outgoing ("out", impact) or incoming ("in", susceptibility).

    `by="count"` counts edges; `by="abs_is"` sums |IS| (the thesis leaves this open).
    """
    if direction not in ("out", "in") or by not in ("count", "abs_is"):
        raise ValueError(f"direction must be 'out'|'in' and by 'count'|'abs_is', got {direction!r}, {by!r}")
    scores: dict[str, float] = {}
    for edge in edges:
        if edge.kept:
            node = edge.source if direction == "out" else edge.target
            weight = 1.0 if by == "count" else abs(edge.sensitivity)
            scores[node] = scores.get(node, 0.0) + weight
    return scores


def _strongest_node(edges: Sequence[Edge], direction: str, by: str) -> str | None:
    primary = node_scores(edges, direction, by)
    # ties: the other measure decides, then the name
    secondary = node_scores(edges, direction, "abs_is" if by == "count" else "count")
    if not primary:
        return None
    return min(primary, key=lambda node: (-primary[node], -secondary[node], node))


def max_impact(edges: Sequence[Edge], by: str = "count") -> str | None:
    """Return MaxImp, the node whose kept outgoing edges weigh most; None without kept edges."""
    return _strongest_node(edges, "out", by)


def max_influenced(edges: Sequence[Edge], by: str = "count") -> str | None:
    """Return MaxInf, the node whose kept incoming edges weigh most; None without kept edges."""
    return _strongest_node(edges, "in", by)


def _priority_weights(priorities: Mapping[str, float]) -> dict[str, float]:
    axes = list(priorities)
    return dict(zip(axes, normalised_weights(axes, priorities, "the priority vector").tolist()))


def weighted_bias(w_bars: Mapping[str, float], priorities: Mapping[str, float]) -> float:
    """Return InterMit's τ = ⟨w̄_{B*}, p⟩ (Alg. 4), p = `priorities` scaled to ‖p‖₁ = 1.

    `w_bars` holds w̄ of every axis measured on the current image set; B* = the axes in
    `priorities`.
    """
    return float(sum(weight * w_bars[axis] for axis, weight in _priority_weights(priorities).items()))


def priority_alignment(sensitivity: SensitivityMatrix, priorities: Mapping[str, float]) -> dict[str, float]:
    """Return γ_i = ⟨s'_i, p⟩ for every row axis i (Alg. 4), s'_i = row i of S on the columns B*.

    InterMit mitigates argmax γ_i among the axes not yet mitigated; that choice and the
    stopping rules belong to the method.
    """
    weights = _priority_weights(priorities)
    columns = [sensitivity.axes.index(axis) for axis in weights]
    p = np.array(list(weights.values()))
    gammas = sensitivity.matrix[:, columns] @ p
    return dict(zip(sensitivity.axes, gammas.tolist()))
