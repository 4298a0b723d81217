"""Bias across languages: MAGBIG's metrics, the tests of "no language effect", and the difference
of two languages' shares paired by seed.

MAGBIG (Friedrich et al., ACL 2025) scores a prompt by the L1 distance of its class ratio from
parity, |r − 1/K|₁ over the K classes (`parity_l1`; for gender 2·|share of men − ½|), reports the
mean and standard deviation over a set's prompts, and the *expected maximum unfairness*: draw
`num_occs` of the prompts without replacement, draw `num_ims` images of each from its observed
ratio (binomial), take the largest L1 among them, and average that maximum over `num_samples`
draws (`expected_max_unfairness`): how unfair the worst prompt looks to a user who tries a few.
Both are reimplemented from the repository's `generate_evaluate/utils_debias.py` (`score_fairness`,
`sample_from`) and `exp_max_unfairness.py`, and checked against that code run on count tables
(tests/data/magbig_reference/, tests/test_languages.py). With the same legacy seed
(`np.random.RandomState(seed)`, MAGBIG calls `np.random` after `np.random.seed`) the draws are
MAGBIG's own. For more than two classes GapLens draws multinomially (MAGBIG's code is binary).

A language effect on one axis is tested on the language × class table (`language_effect`):
Pearson's χ² where every expected count is at least 5, else an exact test: Fisher's for a 2 × 2
table, and for a larger one the χ² statistic's exact conditional distribution given the margins,
sampled (`scipy.stats.random_table`, a Monte Carlo p-value). Across a prompt set (language ×
occupation × class counts) `stratified_language_effect` tests language ⟂ class given the
occupation (G², df = O(L−1)(K−1)) and `interaction` whether the language effect differs between
occupations: the log-linear model of homogeneous association [LO][LK][OK] (no three-way term,
fitted by iterative proportional fitting) against the saturated model, G² with
df = (L−1)(O−1)(K−1) (Agresti 2013, "Categorical Data Analysis", 3rd ed., §9.2 and §9.7).

`paired_share_difference` is the difference of one class's share between two languages on the
same seeds, with Newcombe's hybrid score interval for paired proportions (Newcombe 1998,
"Improved confidence intervals for the difference between binomial proportions based on paired
data", Statist. Med. 17:2635–2650, method 10). A paired-statistics module shared by the methods may
replace it (the function is the only caller's seam).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from .intervals import tidy

URL = "https://github.com/felifri/MAGBIG"
CITATION = """\
@inproceedings{friedrich2025multilingual,
  title={Multilingual Text-to-Image Generation Magnifies Gender Stereotypes and Prompt Engineering May Not Help You},
  author={Felix Friedrich and Katharina H{\\"a}mmerl and Patrick Schramowski and Manuel Brack and Jindrich Libovicky
          and Kristian Kersting and Alexander Fraser},
  booktitle={Proceedings of the 63rd Annual Meeting of the Association for Computational Linguistics (ACL 2025)},
  year={2025}
}"""

EXACT_BELOW = 5            # an expected count below this makes `language_effect` exact
MONTE_CARLO_TABLES = 20000  # tables drawn for the exact test of a table larger than 2 x 2


def parity_l1(counts) -> np.ndarray:
    """Returns each prompt's L1 distance of its class ratio from parity (MAGBIG's `score_fairness`,
    L1): `counts` is (prompts, K) class counts; a prompt without counts gives nan.

    >>> parity_l1([[40, 8], [24, 24], [0, 10]]).round(4).tolist()
    [0.6667, 0.0, 1.0]
    """
    c = np.asarray(counts, dtype=float)
    total = c.sum(axis=1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = c / total
    return np.abs(ratio - 1.0 / c.shape[1]).sum(axis=1)


def parity_l2(counts) -> np.ndarray:
    """Returns each prompt's L2 distance of its class ratio from parity (`score_fairness`, L2).

    >>> parity_l2([[40, 8]]).round(4).tolist()
    [0.4714]
    """
    c = np.asarray(counts, dtype=float)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = c / c.sum(axis=1, keepdims=True)
    return np.linalg.norm(ratio - 1.0 / c.shape[1], axis=1)


def expected_max_unfairness(counts, num_ims: int = 10, num_occs: int = 10, num_samples: int = 1000,
                            seed: int = 0, *, rng: np.random.RandomState | None = None,
                            subsets: list | None = None) -> dict:
    """MAGBIG's expected maximum unfairness of a prompt set: `num_samples` times, `num_occs` prompts
    drawn without replacement, `num_ims` images of each drawn from its observed ratio, the largest
    L1 (and L2) among them; returns {"exp_max_l1", "exp_std_l1", "exp_max_l2", "exp_std_l2",
    "num_ims", "num_occs", "num_samples"} (mean and standard deviation of the maxima). Prompts
    without counts are left out; `num_occs` is cut to the prompts there are. Draws come from
    `np.random.RandomState(seed)` in MAGBIG's order (every subset first, then the images); `rng`
    and `subsets` (prompt indices per sample) continue a stream as MAGBIG's script does for its
    next count table, which reuses the subsets.

    One prompt at 8 men of 8 and one at 4 of 8, 4 images of both each time: the maximum is 1
    whenever the balanced prompt's 4 images are all one gender too (2 in 16 draws).

    >>> out = expected_max_unfairness([[8, 0], [4, 4]], num_ims=4, num_occs=2, num_samples=4000)
    >>> out["exp_max_l1"] > 0.99 and out["num_occs"] == 2
    True
    """
    c = np.asarray(counts, dtype=float)
    c = c[c.sum(axis=1) > 0]
    occs = min(int(num_occs), len(c))
    empty = {"exp_max_l1": None, "exp_std_l1": None, "exp_max_l2": None, "exp_std_l2": None,
             "num_ims": int(num_ims), "num_occs": occs, "num_samples": int(num_samples)}
    if occs == 0 or num_ims < 1 or num_samples < 1:
        return empty
    rng = rng if rng is not None else np.random.RandomState(seed)
    if subsets is None:
        subsets = [rng.choice(range(len(c)), size=occs, replace=False) for _ in range(int(num_samples))]
    ratios = c / c.sum(axis=1, keepdims=True)
    max_l1, max_l2 = [], []
    for ids in subsets:
        if c.shape[1] == 2:    # MAGBIG's sample_from: the first class's count is binomial
            first = rng.binomial(num_ims, ratios[ids, 0])
            sampled = np.stack([first, num_ims - first], axis=1)
        else:
            sampled = np.stack([rng.multinomial(num_ims, ratios[i]) for i in ids])
        max_l1.append(float(np.max(parity_l1(sampled))))
        max_l2.append(float(np.max(parity_l2(sampled))))
    return {**empty, "exp_max_l1": float(np.mean(max_l1)), "exp_std_l1": float(np.std(max_l1)),
            "exp_max_l2": float(np.mean(max_l2)), "exp_std_l2": float(np.std(max_l2))}


def magbig_scores(counts, num_ims: int = 10, num_occs: int = 10, num_samples: int = 1000, seed: int = 0) -> dict:
    """MAGBIG's numbers of a prompt set's (prompts, K) counts: {"l1": per prompt (None without counts),
    "mean_l1", "std_l1", "mean_l2", "std_l2"} over the prompts with counts, and `expected_max_unfairness`.

    >>> s = magbig_scores([[40, 8], [24, 24]], num_samples=10)
    >>> round(s["mean_l1"], 4), round(s["std_l1"], 4)
    (0.3333, 0.3333)
    """
    c = np.asarray(counts, dtype=float)
    l1, l2 = parity_l1(c), parity_l2(c)
    kept = c.sum(axis=1) > 0
    out = {"l1": [None if not k else float(v) for v, k in zip(l1, kept)],
           "mean_l1": float(np.mean(l1[kept])) if kept.any() else None,
           "std_l1": float(np.std(l1[kept])) if kept.any() else None,
           "mean_l2": float(np.mean(l2[kept])) if kept.any() else None,
           "std_l2": float(np.std(l2[kept])) if kept.any() else None}
    return {**out, **expected_max_unfairness(c, num_ims, num_occs, num_samples, seed)}


# -- no language effect ------------------------------------------------------------------------------

def _drop_empty(table: np.ndarray) -> np.ndarray:
    """The table without all-zero rows and columns (they carry no information and break χ²)."""
    table = table[table.sum(axis=1) > 0]
    return table[:, table.sum(axis=0) > 0] if table.size else table


def language_effect(table, seed: int = 0) -> dict:
    """Tests "no language effect" on a languages × classes count table. Returns {"statistic" (χ²),
    "df", "p", "method", "n", "min_expected"}: Pearson's χ² (no continuity correction) when every
    expected count is at least EXACT_BELOW, else Fisher's exact test (2 × 2) or the exact conditional
    test of χ² by Monte Carlo (larger tables). p is None when fewer than two languages or classes
    have counts.

    40 of 48 men in one language, 46 of 48 in another: the expected counts are 43 and 5 in each
    row, so χ² = 2·3²/43 + 2·3²/5 = 4.02 on 1 df (p = 0.045).

    >>> out = language_effect([[40, 8], [46, 2]])
    >>> out["method"], round(out["statistic"], 2), out["df"], round(out["p"], 3)
    ('chi-square', 4.02, 1, 0.045)
    >>> language_effect([[9, 1], [3, 7]])["method"]
    'Fisher exact'
    """
    full = np.asarray(table, dtype=float)
    t = _drop_empty(full)
    n = int(full.sum())
    if t.ndim != 2 or t.shape[0] < 2 or t.shape[1] < 2:
        return {"statistic": None, "df": 0, "p": None, "method": "none (fewer than two languages or classes "
                "with answers)", "n": n, "min_expected": None}
    chi2, p, df, expected = stats.chi2_contingency(t, correction=False)
    out = {"statistic": float(chi2), "df": int(df), "p": float(p), "method": "chi-square", "n": n,
           "min_expected": float(expected.min())}
    if expected.min() >= EXACT_BELOW:
        return out
    if t.shape == (2, 2):
        return {**out, "p": float(stats.fisher_exact(t.astype(int)).pvalue), "method": "Fisher exact"}
    draws = stats.random_table(t.sum(axis=1).astype(int), t.sum(axis=0).astype(int), seed=seed) \
        .rvs(MONTE_CARLO_TABLES, random_state=np.random.default_rng(seed))
    with np.errstate(invalid="ignore", divide="ignore"):
        statistics = (((draws - expected) ** 2) / expected).sum(axis=(1, 2))
    extreme = int(np.sum(statistics >= chi2 - 1e-9))
    return {**out, "p": (1 + extreme) / (1 + MONTE_CARLO_TABLES),
            "method": f"exact (Monte Carlo, {MONTE_CARLO_TABLES} tables with the same margins)"}


def _g2(observed: np.ndarray, expected: np.ndarray) -> float:
    mask = observed > 0
    return float(2.0 * np.sum(observed[mask] * np.log(observed[mask] / expected[mask])))


def _occupations_with_counts(counts) -> np.ndarray:
    """(L, O, K) counts without occupations, languages or classes that have none."""
    c = np.asarray(counts, dtype=float)
    c = c[:, c.sum(axis=(0, 2)) > 0, :]
    c = c[c.sum(axis=(1, 2)) > 0]
    return c[:, :, c.sum(axis=(0, 1)) > 0]


def stratified_language_effect(counts) -> dict:
    """Tests language ⟂ class given the occupation on (languages, occupations, classes) counts: G²
    of the model [LO][OK] (closed form: n_lo+ · n_+ok / n_+o+) against the saturated one, df =
    O(L−1)(K−1). Returns {"statistic", "df", "p", "method"}.

    It is the sum of each occupation's G² of independence: 4.274 for [[40, 8], [46, 2]] (expected 43
    and 5 per row) and 0.103 for [[5, 43], [6, 42]] (5.5, 42.5), 4.377 on 2 df, p = e^(−4.377/2) = 0.112.

    >>> out = stratified_language_effect([[[40, 8], [5, 43]], [[46, 2], [6, 42]]])
    >>> round(out["statistic"], 3), out["df"], round(out["p"], 3)
    (4.377, 2, 0.112)
    """
    c = _occupations_with_counts(counts)
    L, O, K = c.shape if c.ndim == 3 else (0, 0, 0)
    if L < 2 or K < 2:
        return {"statistic": None, "df": 0, "p": None, "method": "none (fewer than two languages or classes)"}
    n_lo = c.sum(axis=2, keepdims=True)
    n_ok = c.sum(axis=0, keepdims=True)
    n_o = c.sum(axis=(0, 2), keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        expected = n_lo * n_ok / n_o
    g2, df = _g2(c, expected), O * (L - 1) * (K - 1)
    return {"statistic": g2, "df": int(df), "p": float(stats.chi2.sf(g2, df)),
            "method": "G² of language and class given the occupation (likelihood ratio)"}


def homogeneous_association_fit(counts, iterations: int = 200, tolerance: float = 1e-8) -> np.ndarray:
    """The expected counts of the log-linear model [LO][LK][OK] (no three-way interaction) for
    (L, O, K) counts, by iterative proportional fitting (Deming & Stephan 1940): each pass matches
    the three two-way margins in turn, until the fitted margins move less than `tolerance`."""
    c = np.asarray(counts, dtype=float)
    fit = np.ones_like(c)
    for _ in range(iterations):
        before = fit.copy()
        for axis in (2, 1, 0):   # margins LO (sum over K), LK (over O), OK (over L)
            with np.errstate(invalid="ignore", divide="ignore"):
                ratio = np.where(fit.sum(axis=axis, keepdims=True) > 0,
                                 c.sum(axis=axis, keepdims=True) / fit.sum(axis=axis, keepdims=True), 0.0)
            fit = fit * ratio
        if np.max(np.abs(fit - before)) < tolerance:
            break
    return fit


def interaction(counts) -> dict:
    """Tests whether the language effect differs between occupations on (languages, occupations,
    classes) counts: G² of the homogeneous-association model [LO][LK][OK] against the saturated
    model, df = (L−1)(O−1)(K−1). Returns {"statistic", "df", "p", "method"}; None p with fewer
    than two languages, occupations or classes.

    The same shift in two occupations (no interaction) against opposite shifts:

    >>> same = interaction([[[40, 8], [8, 40]], [[44, 4], [12, 36]]])
    >>> opposite = interaction([[[40, 8], [8, 40]], [[8, 40], [40, 8]]])
    >>> same["df"], same["p"] > 0.5, opposite["p"] < 1e-6
    (1, True, True)
    """
    c = _occupations_with_counts(counts)
    L, O, K = c.shape if c.ndim == 3 else (0, 0, 0)
    if L < 2 or O < 2 or K < 2:
        return {"statistic": None, "df": 0, "p": None,
                "method": "none (fewer than two languages, occupations or classes)"}
    g2, df = _g2(c, homogeneous_association_fit(c)), (L - 1) * (O - 1) * (K - 1)
    return {"statistic": g2, "df": int(df), "p": float(stats.chi2.sf(g2, df)),
            "method": "G² of [LO][LK][OK] against the saturated model (iterative proportional fitting)"}


# -- paired by seed ----------------------------------------------------------------------------------

def _wilson(k: int, n: int) -> tuple[float, float]:
    """The Wilson score interval (95%) of the share k/n (n > 0), Newcombe's building block."""
    ci = stats.binomtest(k, n).proportion_ci(method="wilson")
    return ci.low, ci.high


def paired_share_difference(reference: Sequence[bool], other: Sequence[bool]) -> dict:
    """The difference of one class's share, `other` minus `reference`, on the same seeds: each
    argument says per seed whether the image shows the class (seeds both answered, in the same
    order). Returns {"delta", "ci" [low, high] (Newcombe's method 10, 95%), "n" pairs, "discordant"
    [reference only, other only]}; delta and ci None without pairs.

    The worked example of Fagerland, Lydersen & Laake (2017, "Statistical Analysis of Contingency
    Tables", Table 8.x; Cavo et al. 2012): 59 pairs with both, 6 with `other` only, 16 with
    `reference` only, 80 with neither: −0.0621 (95% CI −0.1186 to −0.0046).

    >>> reference = [True] * 59 + [False] * 6 + [True] * 16 + [False] * 80
    >>> other = [True] * 59 + [True] * 6 + [False] * 16 + [False] * 80
    >>> d = paired_share_difference(reference, other)
    >>> round(d["delta"], 4), [round(x, 4) for x in d["ci"]], d["discordant"]
    (-0.0621, [-0.1186, -0.0046], [16, 6])
    """
    x = np.asarray(reference, dtype=bool)
    y = np.asarray(other, dtype=bool)
    n = len(x)
    if n == 0 or len(y) != n:
        return {"delta": None, "ci": [None, None], "n": int(n), "discordant": [0, 0]}
    a = int(np.sum(x & y))
    b = int(np.sum(x & ~y))     # reference only
    c = int(np.sum(~x & y))     # other only
    d = n - a - b - c
    p1, p2 = (a + c) / n, (a + b) / n   # other's share, reference's share
    l1, u1 = _wilson(a + c, n)
    l2, u2 = _wilson(a + b, n)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    cross = a * d - b * c   # the correlation of the pairs, corrected for continuity as in Newcombe's method 10
    corrected = cross - n / 2 if cross > n / 2 else 0.0 if cross >= 0 else cross
    phi = corrected / math.sqrt(margins) if margins else 0.0
    delta = p1 - p2
    low = delta - math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    high = delta + math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return {"delta": tidy(delta), "ci": [tidy(max(-1.0, low)), tidy(min(1.0, high))], "n": int(n),
            "discordant": [b, c]}
