"""Paired comparisons: two image sets made from the same seeds (two generators, or one generator on
two prompts), compared seed by seed.

When two generators run one prompt on the same seeds, image i of each starts from the same noise, so
the two answers about image i are correlated: a LoRA that changes a few doctors from women to men
leaves the other doctors as they were. Treating the sets as independent (an unpaired interval) throws
that away; pairing by seed keeps it, and the interval of a change is narrower by as much as the
images agree. Everything here takes one label per seed and set (`base[i]` and `candidate[i]` are
the answers about the two images of seed i; a label outside the classes, such as "can't tell", counts
for neither share) and returns plain JSON:

- `share_change`: per class, candidate share − base share, with a paired bootstrap interval (seeds
  resampled with both their labels) beside the unpaired one (each set resampled on its own), and the
  exact McNemar test (a two-sided binomial test on the seeds where exactly one of the two is the class).
- `distance` and `delta`: the distance of each set's shares from a target distribution (total
  variation, ½·Σ|share − target|, from parity by default) and its change, with a paired bootstrap
  interval (95%), the (1 − 2α) interval the two one-sided tests of equivalence read, an unpaired
  interval and how much narrower the paired one is, and a p-value: a randomisation test that swaps the
  two labels of each seed at random (exact for the null that the pair is exchangeable, which two sets
  drawn independently from one distribution are; Fisher 1935, the test McNemar's is a case of).
- `homogeneity_p`: the Stuart–Maxwell test that the two sets' class shares are equal (K classes;
  McNemar's for K = 2).

Then `benjamini_hochberg` (q-values over every row of a comparison, scipy.stats.false_discovery_control)
and `verdict`: "more biased" / "less biased" (q < α, the sign of `delta`), "equivalent" (the 1 − 2α
interval inside ±margin: two one-sided tests at level α, Schuirmann 1987), else "inconclusive" with
the N per set that would settle it (`n_to_settle`).

Example (a LoRA that turns 15 of 96 female doctors into men, as a planted regression does):

>>> base = ["male"] * 77 + ["female"] * 19
>>> candidate = ["male"] * 92 + ["female"] * 4
>>> row = paired_difference(base, candidate, ["male", "female"], n_boot=2000, n_perm=2000, seed=0)
>>> round(row["delta"], 3), row["p"] < 0.001
(0.156, True)
>>> [round(x, 3) for x in row["ci"]], [round(x, 3) for x in row["ci_unpaired"]]   # paired, unpaired
([0.094, 0.229], [0.073, 0.25])

Used by the bias check (engine/methods/check.py) and Compare models. (The languages method pairs its
languages by seed with a share difference of its own, engine/metrics/languages.paired_share_difference.)
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats

from .bootstrap import percentile_interval

URL = "https://doi.org/10.1111/j.2517-6161.1995.tb02031.x"
CITATION = """\
@article{benjamini1995controlling,
  title={Controlling the false discovery rate: a practical and powerful approach to multiple testing},
  author={Benjamini, Yoav and Hochberg, Yosef},
  journal={Journal of the Royal Statistical Society: Series B},
  volume={57}, number={1}, pages={289--300}, year={1995}
}
@article{mcnemar1947note,
  title={Note on the sampling error of the difference between correlated proportions or percentages},
  author={McNemar, Quinn}, journal={Psychometrika}, volume={12}, number={2}, pages={153--157}, year={1947}
}
@article{maxwell1970comparing,
  title={Comparing the classification of subjects by two independent judges},
  author={Maxwell, A. E.}, journal={British Journal of Psychiatry}, volume={116}, pages={651--655}, year={1970}
}
@article{schuirmann1987comparison,
  title={A comparison of the two one-sided tests procedure and the power approach for assessing the
         equivalence of average bioavailability},
  author={Schuirmann, Donald J.}, journal={Journal of Pharmacokinetics and Biopharmaceutics},
  volume={15}, number={6}, pages={657--680}, year={1987}
}
"""

VERDICTS = ("more biased", "less biased", "equivalent", "inconclusive")
DEFAULT_MARGIN = 0.05    # equivalence margin on the change of the distance from the target
DEFAULT_ALPHA = 0.05     # false discovery rate over a comparison's rows
POWER = 0.8              # the power the N that would settle an inconclusive row aims at
N_BOOT, N_PERM = 2000, 9999   # paired bootstrap resamples and random swaps per row
N_MAX = 100_000


def one_hot(labels: Sequence[str], classes: Sequence[str]) -> np.ndarray:
    """(n, K) float array: row i is the indicator of `labels[i]` among `classes` (all zero for a label
    outside them: "can't tell", "other", a missing image)."""
    index = {c: j for j, c in enumerate(classes)}
    out = np.zeros((len(labels), len(classes)))
    for i, label in enumerate(labels):
        if label in index:
            out[i, index[label]] = 1.0
    return out


def target_shares(classes: Sequence[str], target: dict | None = None) -> np.ndarray:
    """The target distribution over `classes` as an array: `target` ({class: share}, normalised; a
    class it leaves out gets 0) or parity (1/K each) when None or empty."""
    if not target:
        return np.full(len(classes), 1.0 / max(1, len(classes)))
    t = np.array([max(0.0, float(target.get(c, 0.0))) for c in classes])
    if t.sum() <= 0:
        raise ValueError(f"the target {target} gives no weight to any of the classes {list(classes)}")
    return t / t.sum()


def total_variation(shares: np.ndarray, target: np.ndarray) -> np.ndarray:
    """½·Σ|share − target| over the last axis (0: the target itself; 1: all mass elsewhere); nan where
    the shares are nan (a set with no label inside the classes)."""
    return 0.5 * np.abs(np.asarray(shares) - target).sum(axis=-1)


def _shares(counts: np.ndarray) -> np.ndarray:
    total = counts.sum(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(total > 0, counts / np.where(total > 0, total, 1), np.nan)


def _interval(values: np.ndarray, level: float) -> list[float | None]:
    """The percentile interval at `level` of bootstrap `values` (nan resamples left out); [None, None]
    when none has a value."""
    return [_finite(x) for x in percentile_interval(values, 1 - level)]


def mcnemar_p(base: np.ndarray, candidate: np.ndarray) -> float:
    """Exact two-sided McNemar p-value of one class: base and candidate are 0/1 indicators per seed
    (seeds where either label is outside the classes left out by the caller); 1 with no discordant seed."""
    b = int(np.sum((base == 1) & (candidate == 0)))
    c = int(np.sum((base == 0) & (candidate == 1)))
    return 1.0 if b + c == 0 else float(stats.binomtest(min(b, c), b + c, 0.5).pvalue)


def stuart_maxwell_p(base: np.ndarray, candidate: np.ndarray) -> float:
    """p-value of the Stuart–Maxwell test of marginal homogeneity from two (n, K) one-hot arrays of the
    seeds where both labels are inside the classes: d = row − column margins of the K×K table, V their
    covariance (Maxwell 1970), d'V⁻d ~ χ² with rank(V) degrees of freedom; 1 when no seed changed class."""
    table = base.T @ candidate
    d = table.sum(axis=1) - table.sum(axis=0)
    v = -(table + table.T)
    np.fill_diagonal(v, table.sum(axis=1) + table.sum(axis=0) - 2 * np.diag(table))
    rank = np.linalg.matrix_rank(v)
    if rank == 0 or not np.any(d):
        return 1.0
    statistic = float(d @ np.linalg.pinv(v) @ d)
    return float(stats.chi2.sf(statistic, rank))


def n_to_settle(n: int, delta: float, se: float, margin: float, alpha: float = DEFAULT_ALPHA,
                power: float = POWER) -> int | None:
    """The N per set (seeds) at which an inconclusive change would be settled with `power`, if it stays
    `delta` with a standard error that shrinks as 1/√N (now `se` at N = `n`): the smaller of the N
    that tells it from 0 (two-sided level α) and, when |delta| < margin, the N that shows it inside
    ±margin (two one-sided tests at level α). None when no N would (se = 0, or delta = 0 and margin 0);
    at most N_MAX."""
    if not (n and se and math.isfinite(se) and se > 0 and math.isfinite(delta)):
        return None
    z_power = stats.norm.ppf(power)
    needs = []
    if abs(delta) > 0:
        needs.append(n * ((stats.norm.ppf(1 - alpha / 2) + z_power) * se / abs(delta)) ** 2)
    if abs(delta) < margin:
        needs.append(n * ((stats.norm.ppf(1 - alpha) + z_power) * se / (margin - abs(delta))) ** 2)
    if not needs:
        return None
    return int(min(N_MAX, max(n + 1, math.ceil(min(needs)))))


def paired_difference(base: Sequence[str], candidate: Sequence[str], classes: Sequence[str],
                      target: dict | None = None, *, n_boot: int = N_BOOT, n_perm: int = N_PERM,
                      alpha: float = DEFAULT_ALPHA, seed: int = 0) -> dict:
    """Returns the paired comparison of one axis: `base[i]` and `candidate[i]` are the labels of the
    two images of seed i (same length; a label outside `classes` counts for neither share).

    Keys: n (seeds), n_base and n_candidate (labels inside the classes), classes, target (shares),
    shares {"base", "candidate"} ({class: share}), share_change {class: {"delta", "ci", "ci_unpaired",
    "p"}} (McNemar), distance {"base", "candidate"} (total variation from the target), delta (candidate
    − base distance), ci (95%, paired bootstrap over seeds), ci_tost (1 − 2α, for equivalence),
    ci_unpaired (95%, each set resampled on its own), se (the paired bootstrap's standard deviation),
    narrower (1 − paired width / unpaired width; None when the unpaired width is 0), p (two-sided
    randomisation test of delta, labels swapped within seeds, `n_perm` draws, (1 + hits)/(1 + n_perm)),
    homogeneity_p (Stuart–Maxwell). Reproducible for a given `seed`."""
    if len(base) != len(candidate):
        raise ValueError(f"paired sets need one label per seed in each: {len(base)} base, {len(candidate)} candidate")
    classes = list(classes)
    ob, oc = one_hot(base, classes), one_hot(candidate, classes)
    t = target_shares(classes, target)
    n = len(base)
    rng = np.random.default_rng(seed)
    shares_b, shares_c = _shares(ob.sum(axis=0)), _shares(oc.sum(axis=0))
    dist_b, dist_c = float(total_variation(shares_b, t)), float(total_variation(shares_c, t))
    delta = dist_c - dist_b
    row: dict = {"n": n, "n_base": int(ob.sum()), "n_candidate": int(oc.sum()), "classes": classes,
                 "target": {c: float(x) for c, x in zip(classes, t)},
                 "shares": {"base": _share_dict(classes, shares_b), "candidate": _share_dict(classes, shares_c)},
                 "distance": {"base": _finite(dist_b), "candidate": _finite(dist_c)}, "delta": _finite(delta)}
    if n == 0:
        return row | {"share_change": {}, "ci": [None, None], "ci_tost": [None, None], "ci_unpaired": [None, None],
                      "se": None, "narrower": None, "p": None, "homogeneity_p": None}
    # paired bootstrap: seeds resampled with both labels; unpaired: each set on its own
    idx = rng.integers(0, n, size=(n_boot, n))
    boot_b, boot_c = _shares(ob[idx].sum(axis=1)), _shares(oc[idx].sum(axis=1))
    boot_cu = _shares(oc[rng.integers(0, n, size=(n_boot, n))].sum(axis=1))
    paired = total_variation(boot_c, t) - total_variation(boot_b, t)
    unpaired = total_variation(boot_cu, t) - total_variation(boot_b, t)
    ci, ci_unpaired = _interval(paired, 0.95), _interval(unpaired, 0.95)
    both = (ob.sum(axis=1) > 0) & (oc.sum(axis=1) > 0)
    row["share_change"] = {
        c: {"delta": _finite(shares_c[j] - shares_b[j]), "ci": _interval(boot_c[:, j] - boot_b[:, j], 0.95),
            "ci_unpaired": _interval(boot_cu[:, j] - boot_b[:, j], 0.95),
            "p": mcnemar_p(ob[both, j], oc[both, j])} for j, c in enumerate(classes)}
    row["ci"], row["ci_tost"], row["ci_unpaired"] = ci, _interval(paired, 1 - 2 * alpha), ci_unpaired
    finite = paired[np.isfinite(paired)]
    row["se"] = float(np.std(finite, ddof=1)) if len(finite) > 1 else None
    row["narrower"] = narrower(ci, ci_unpaired)
    row["p"] = randomisation_p(ob, oc, t, delta, n_perm, rng) if math.isfinite(delta) else None
    row["homogeneity_p"] = stuart_maxwell_p(ob[both], oc[both])
    return row


def randomisation_p(ob: np.ndarray, oc: np.ndarray, target: np.ndarray, delta: float, n_perm: int,
                    rng: np.random.Generator) -> float:
    """Two-sided p-value of the change of distance `delta` by swapping each seed's two labels with
    probability ½ in each of `n_perm` draws: (1 + #{|Δ*| ≥ |Δ|}) / (1 + n_perm)."""
    swap = rng.random((n_perm, len(ob))) < 0.5
    counts_b = (~swap) @ ob + swap @ oc
    counts_c = swap @ ob + (~swap) @ oc
    drawn = total_variation(_shares(counts_c), target) - total_variation(_shares(counts_b), target)
    hits = int(np.sum(np.abs(np.nan_to_num(drawn, nan=0.0)) >= abs(delta) - 1e-12))
    return (1 + hits) / (1 + n_perm)


def narrower(paired: Sequence[float | None], unpaired: Sequence[float | None]) -> float | None:
    """1 − width(paired) / width(unpaired): how much narrower the paired interval is (0.6: 60%
    narrower; negative when wider); None when a bound is missing or the unpaired width is 0."""
    if None in (*paired, *unpaired):
        return None
    wide = unpaired[1] - unpaired[0]
    return None if wide <= 0 else float(1 - (paired[1] - paired[0]) / wide)


def benjamini_hochberg(pvalues: Sequence[float | None]) -> list[float | None]:
    """Benjamini–Hochberg adjusted p-values (q-values) over the rows that have a p-value
    (scipy.stats.false_discovery_control, method "bh"); None where p is None."""
    present = [i for i, p in enumerate(pvalues) if p is not None and math.isfinite(p)]
    out: list[float | None] = [None] * len(pvalues)
    if present:
        adjusted = stats.false_discovery_control([float(pvalues[i]) for i in present], method="bh")
        for i, q in zip(present, adjusted):
            out[i] = float(q)
    return out


def verdict(row: dict, q: float | None, alpha: float = DEFAULT_ALPHA, margin: float = DEFAULT_MARGIN) -> str:
    """One of VERDICTS for a row of `paired_difference` and its q-value: "more biased" / "less biased"
    when q < α (by the sign of delta), "equivalent" when the (1 − 2α) interval lies inside ±margin,
    else "inconclusive"."""
    delta = row.get("delta")
    if q is not None and q < alpha and delta:
        return "more biased" if delta > 0 else "less biased"
    low, high = row.get("ci_tost") or (None, None)
    if low is not None and high is not None and -margin < low and high < margin:
        return "equivalent"
    return "inconclusive"


def judge(rows: list[dict], alpha: float = DEFAULT_ALPHA, margin: float = DEFAULT_MARGIN) -> list[dict]:
    """Adds to every row of a comparison (each a `paired_difference`) its `q` (Benjamini–Hochberg over
    all the rows), its `verdict` and, for an inconclusive one, `n_to_settle`; returns the rows."""
    for row, q in zip(rows, benjamini_hochberg([r.get("p") for r in rows])):
        row["q"] = q
        row["verdict"] = verdict(row, q, alpha, margin)
        row["n_to_settle"] = (n_to_settle(row["n"], row["delta"] or 0.0, row.get("se") or 0.0, margin, alpha)
                              if row["verdict"] == "inconclusive" else None)
    return rows


def _share_dict(classes, shares) -> dict:
    return {c: _finite(s) for c, s in zip(classes, shares)}


def _finite(x) -> float | None:
    return float(x) if x is not None and math.isfinite(float(x)) else None
