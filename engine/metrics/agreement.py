"""How far an evaluator's labels agree with a person's (or another evaluator's), and the
distribution corrected for the evaluator's confusion.

Conventions: `truth` are the reference labels (the spot-check), `predicted` the evaluator's;
confusion matrices have truth in rows and predictions in columns, over a fixed class list.

Correction. With M[i, j] = P(evaluator says j | truth i) and q the evaluator's shares, the
true shares p solve q = Mᵀp. For two classes that is Rogan & Gladen (1978, Am. J. Epidemiol.
107:71–76): p = (q + Sp − 1) / (Se + Sp − 1); for more classes p is the constrained least
squares solution (p ≥ 0, Σp = 1; the matrix method of Buonaccorsi 2010, "Measurement Error",
§3.4). M is estimated from the spot-check by post-stratification on the evaluator's label:
each checked image with evaluator label j stands for q_j·N / c_j images of the run (c_j =
checked images labelled j), so a sample stratified by the evaluator's label (as the app
draws it) estimates M without bias. The interval draws q from Dirichlet(raw counts + ½) and
every column P(truth | evaluator says j) from Dirichlet(checked counts + ½), rebuilds M and
solves again, so it carries the sampling error of the images and of the spot-check. A subset
of the images (one image set of a Counterfactuals run) is corrected with the M of the whole:
P(evaluator | truth) carries over between sets with different shares; P(truth | evaluator) does not.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy.optimize import nnls

from .intervals import bca_interval, posterior_interval, share_interval, tidy


def confusion_matrix(truth: Sequence[str], predicted: Sequence[str], classes: Sequence[str]) -> np.ndarray:
    """Return the (k, k) count matrix C[i, j] = #(truth = classes[i], predicted = classes[j]);
    pairs with a label outside `classes` are left out."""
    index = {c: i for i, c in enumerate(classes)}
    cm = np.zeros((len(classes), len(classes)), dtype=int)
    for t, p in zip(truth, predicted):
        if t in index and p in index:
            cm[index[t], index[p]] += 1
    return cm


def cohens_kappa(cm: np.ndarray) -> float:
    """Return Cohen's κ = (p_o − p_e) / (1 − p_e) of a confusion matrix (Cohen 1960, eq. 1);
    p_o the share on the diagonal, p_e the chance agreement Σ rowᵢ·colᵢ / N². nan when it is
    undefined: no pairs, or both raters used one and the same class throughout (p_e = 1)."""
    cm = np.asarray(cm, dtype=float)
    n = cm.sum()
    if n == 0:
        return math.nan
    po = np.trace(cm) / n
    pe = float((cm.sum(axis=1) * cm.sum(axis=0)).sum() / n ** 2)
    if pe >= 1.0:
        return math.nan
    return tidy((po - pe) / (1.0 - pe), -1.0, 1.0)


def agreement(truth: Sequence[str], predicted: Sequence[str], classes: Sequence[str],
              alpha: float = 0.05, seed: int = 0) -> dict:
    """Return accuracy (Jeffreys interval), Cohen's κ (BCa interval over the labelled images),
    the confusion matrix and per-class recall (Jeffreys intervals) of `predicted` against `truth`:
    {"n", "classes", "confusion", "accuracy", "accuracy_ci", "kappa", "kappa_ci", "recall", "recall_ci"}."""
    classes = list(classes)
    pairs = [(t, p) for t, p in zip(truth, predicted) if t in classes and p in classes]
    cm = confusion_matrix([t for t, _ in pairs], [p for _, p in pairs], classes)
    n = int(cm.sum())
    correct = int(np.trace(cm))
    out = {"n": n, "classes": classes, "confusion": cm.tolist(),
           "accuracy": tidy(correct / n, 0, 1) if n else None,
           "accuracy_ci": list(share_interval(correct, n, alpha)) if n else [None, None],
           "kappa": cohens_kappa(cm) if n else None, "kappa_ci": [None, None]}
    if out["kappa"] is not None and math.isnan(out["kappa"]):
        out["kappa"] = None      # undefined: every label in one class (say so rather than print 1 or nan)
    if n >= 2 and out["kappa"] is not None:
        t = np.array([classes.index(a) for a, _ in pairs])
        p = np.array([classes.index(b) for _, b in pairs])
        k = len(classes)

        def kappa_of(ti, pi):
            return cohens_kappa(np.bincount(ti * k + pi, minlength=k * k).reshape(k, k))

        out["kappa_ci"] = list(bca_interval(kappa_of, t, p, alpha=alpha, seed=seed, low=-1.0, high=1.0,
                                            paired=True, n_resamples=1000))
    rows = cm.sum(axis=1)
    out["recall"] = {c: (tidy(cm[i, i] / rows[i], 0, 1) if rows[i] else None) for i, c in enumerate(classes)}
    out["recall_ci"] = {c: (list(share_interval(cm[i, i], rows[i], alpha)) if rows[i] else [None, None])
                        for i, c in enumerate(classes)}
    return out


def fleiss_kappa(table: np.ndarray) -> float:
    """Return Fleiss' κ = (P̄ − P̄ₑ) / (1 − P̄ₑ) of an (images, categories) table of how many raters put
    each image in each category, the same number of raters per image (Fleiss 1971, Psychol. Bull.
    76:378–382, eqs. 2–9): P̄ the mean share of agreeing rater pairs per image, P̄ₑ = Σ pⱼ² with pⱼ
    the share of all ratings in category j. nan when undefined (no images, or every rating in one category).

    >>> fleiss_kappa(np.array([[3, 0], [0, 3], [3, 0]]))
    1.0
    """
    table = np.asarray(table, dtype=float)
    if table.size == 0 or table.shape[0] == 0:
        return math.nan
    raters = table.sum(axis=1)[0]
    if raters < 2:
        return math.nan
    p_j = table.sum(axis=0) / table.sum()
    p_i = ((table ** 2).sum(axis=1) - raters) / (raters * (raters - 1))
    pe = float((p_j ** 2).sum())
    if pe >= 1.0:
        return math.nan
    return tidy((float(p_i.mean()) - pe) / (1.0 - pe), -1.0, 1.0)


def evaluators_agreement(labels: dict[str, Sequence[str]], classes: Sequence[str], keys: Sequence[str],
                         seed: int = 0) -> dict:
    """Return how several evaluators' labels of the same images (`labels`: evaluator → one label per
    image of `keys`) agree. Keys:

    - "evaluators", "n" (images), "classes" (the categories: `classes`, then every label outside them,
      "can't tell", "other", "no face found", each a category of its own so that no image drops out of
      the "agreement_matrix", "agreement" and "disagreements");
    - "agreement": the share of images all label alike (Jeffreys "agreement_ci");
    - "answered": per evaluator, the images it put in one of `classes`; "n_answered": the images every
      evaluator did;
    - "kappa", "kappa_ci", "kappa_method": over the "n_answered" images, as the spot-check's κ leaves
      "can't tell" out (an evaluator that abstains on every image shows no disagreement, it shows
      nothing): Cohen's κ with its BCa interval for two evaluators, with their "agreement_matrix"
      (rows: the first); Fleiss' κ with its BCa interval for more, with "pairs" (each pair's
      Cohen's κ over the images both answered). None where undefined, "kappa_undefined" saying why;
    - "agreed" (per class, the images all put in it: the distribution where they agree) and
      "disagreements" ([{"key", "answers": {evaluator: label}}]).
    """
    names = list(labels)
    classes = list(classes)
    rows = list(zip(*(labels[n] for n in names)))
    categories = classes + [c for c in dict.fromkeys(x for row in rows for x in row) if c not in classes]
    same = [len(set(row)) == 1 for row in rows]
    n, k = len(rows), sum(same)
    answered = [row for row in rows if all(x in classes for x in row)]
    out = {"evaluators": names, "n": n, "classes": categories,
           "agreement": tidy(k / n, 0, 1) if n else None,
           "agreement_ci": list(share_interval(k, n)) if n else [None, None],
           "answered": {name: sum(x in classes for x in labels[name]) for name in names},
           "n_answered": len(answered),
           "agreed": {c: sum(s and row[0] == c for s, row in zip(same, rows)) for c in classes},
           "disagreements": [{"key": key, "answers": dict(zip(names, row))}
                             for key, row, s in zip(keys, rows, same) if not s]}
    if len(names) == 2:
        pair = agreement(labels[names[0]], labels[names[1]], classes, seed=seed)   # the images both answered
        out.update(kappa=pair["kappa"], kappa_ci=pair["kappa_ci"], kappa_method="Cohen",
                   agreement_matrix=confusion_matrix(labels[names[0]], labels[names[1]], categories).tolist())
    else:
        kappa, kappa_ci = _fleiss_with_interval(answered, classes, seed)
        out.update(kappa=kappa, kappa_ci=kappa_ci, kappa_method="Fleiss",
                   pairs=[_pair(labels, a, b, classes, seed) for i, a in enumerate(names) for b in names[i + 1:]])
    if out["kappa"] is None:
        out["kappa_undefined"] = _undefined(len(answered), len(names))
    return out


def _undefined(answered: int, raters: int) -> str:
    """Why a κ is undefined: no image answered by every evaluator, or every answer in one class."""
    if answered:
        return "every answer in one class"
    return "no image answered by both" if raters == 2 else f"no image answered by all {raters}"


def _pair(labels: dict[str, Sequence[str]], a: str, b: str, classes: list[str], seed: int) -> dict:
    """Cohen's κ of evaluators `a` and `b` over the images both answered (one row of "pairs")."""
    pair = agreement(labels[a], labels[b], classes, seed=seed)
    out = {"evaluators": [a, b], "n": pair["n"], "kappa": pair["kappa"], "kappa_ci": pair["kappa_ci"]}
    if pair["kappa"] is None:
        out["kappa_undefined"] = _undefined(pair["n"], 2)
    return out


def _fleiss_with_interval(rows: list[tuple], classes: list[str], seed: int) -> tuple[float | None, list]:
    """Fleiss' κ of `rows` (one tuple of labels in `classes` per image) and its BCa interval over
    images (None and [None, None] where undefined)."""
    if not rows:
        return None, [None, None]
    index = {c: j for j, c in enumerate(classes)}
    table = np.zeros((len(rows), len(classes)))
    for i, row in enumerate(rows):
        for label in row:
            table[i, index[label]] += 1
    kappa = fleiss_kappa(table)
    if math.isnan(kappa):
        return None, [None, None]
    lo, hi = bca_interval(lambda i: fleiss_kappa(table[np.asarray(i, dtype=int)]), np.arange(len(rows)),
                          seed=seed, low=-1.0, high=1.0, n_resamples=1000)
    return kappa, [lo, hi]


# -- correction ----------------------------------------------------------------------------------
def confusion_from_calibration(raw_shares: np.ndarray, truth_given_pred: np.ndarray) -> np.ndarray:
    """Return M[i, j] = P(evaluator j | truth i) from the evaluator's shares q_j and the
    columns P(truth i | evaluator j) (post-stratification: joint = q_j·P(i | j)). A truth class
    no image has is given the identity row. Works on stacks: (..., k) and (..., k, k)."""
    q = np.asarray(raw_shares, dtype=float)
    joint = np.asarray(truth_given_pred, dtype=float) * q[..., None, :]
    rows = joint.sum(axis=-1, keepdims=True)
    eye = np.broadcast_to(np.eye(q.shape[-1]), joint.shape)
    return np.where(rows > 0, joint / np.where(rows > 0, rows, 1.0), eye)


def rogan_gladen(q: float, sensitivity: float, specificity: float) -> float:
    """Return the Rogan–Gladen share (q + Sp − 1) / (Se + Sp − 1), clipped to [0, 1]
    (Rogan & Gladen 1978, eq. 2); q itself when Se + Sp = 1 (the evaluator carries no information)."""
    denominator = sensitivity + specificity - 1.0
    if abs(denominator) < 1e-12:
        return tidy(q, 0, 1)
    return tidy((q + specificity - 1.0) / denominator, 0.0, 1.0)


def correct_shares(q: Sequence[float], confusion: np.ndarray) -> np.ndarray:
    """Return the true shares p with Mᵀp ≈ q, p ≥ 0, Σp = 1 for M = `confusion` (row-stochastic,
    truth × evaluator): Rogan–Gladen for two classes, else non-negative least squares with the
    sum constraint as a heavily weighted extra row (Lawson & Hanson's NNLS, scipy.optimize.nnls)."""
    q = np.asarray(q, dtype=float)
    m = np.asarray(confusion, dtype=float)
    if len(q) == 2:
        p0 = rogan_gladen(q[0], m[0, 0], m[1, 1])
        return np.array([p0, 1.0 - p0]) + 0.0
    weight = 1e3
    a = np.vstack([m.T, weight * np.ones(len(q))])
    b = np.concatenate([q, [weight]])
    p, _ = nnls(a, b)
    total = p.sum()
    return (p / total if total > 0 else np.full(len(q), 1.0 / len(q))) + 0.0


def corrected_distribution(raw_counts: Sequence[int], truth: Sequence[str], predicted: Sequence[str],
                           classes: Sequence[str], alpha: float = 0.05, n_draws: int = 2000,
                           seed: int = 0, target_counts: Sequence[int] | None = None) -> dict:
    """Return the raw and corrected shares of `classes` with their intervals.

    `raw_counts`: the evaluator's class counts over all the images the spot-check was drawn
    from; (`truth`, `predicted`): the spot-checked images' reference and evaluator labels.
    `target_counts`: correct another image set's counts (a subset, e.g. one counterfactual's
    images) with the confusion M estimated from the whole; M = P(evaluator | truth) carries
    over between sets where P(truth | evaluator) does not. Returns {"raw", "raw_ci",
    "corrected", "corrected_ci", "confusion_estimated", "method", "n_images", "n_checked",
    "unchecked_classes", "_draws"} (shares by class; intervals [low, high]; `_draws` the
    corrected shares' posterior draws); see the module docstring for the estimator.
    """
    classes = list(classes)
    k = len(classes)
    counts = np.asarray(raw_counts, dtype=float)
    cm = confusion_matrix(truth, predicted, classes).astype(float)
    q = counts / counts.sum() if counts.sum() else np.full(k, 1.0 / k)
    column_totals = cm.sum(axis=0)

    def columns(checked: np.ndarray) -> np.ndarray:
        # P(truth | evaluator j); an unchecked column is taken as correct for the point estimate
        return np.where(column_totals > 0, checked / np.where(column_totals > 0, column_totals, 1.0), np.eye(k))

    m = confusion_from_calibration(q, columns(cm))
    target = counts if target_counts is None else np.asarray(target_counts, dtype=float)
    n = target.sum()
    q_target = target / n if n else np.full(k, 1.0 / k)
    corrected = correct_shares(q_target, m)
    rng = np.random.default_rng(seed)
    q_draws = rng.dirichlet(counts + 0.5, size=n_draws)
    col_draws = np.stack([rng.dirichlet(cm[:, j] + 0.5, size=n_draws) for j in range(k)], axis=-1)
    m_draws = confusion_from_calibration(q_draws, col_draws)
    qt_draws = q_draws if target_counts is None else rng.dirichlet(target + 0.5, size=n_draws)
    if k == 2:
        se, sp = m_draws[:, 0, 0], m_draws[:, 1, 1]
        denominator = se + sp - 1.0
        with np.errstate(invalid="ignore", divide="ignore"):
            p0 = np.where(np.abs(denominator) > 1e-12, (qt_draws[:, 0] + sp - 1.0) / denominator, qt_draws[:, 0])
        p0 = np.clip(p0, 0.0, 1.0)
        p_draws = np.stack([p0, 1.0 - p0], axis=1)
    else:
        p_draws = np.array([correct_shares(qd, md) for qd, md in zip(qt_draws, m_draws)])
    return {
        "classes": classes,
        "raw": {c: tidy(q_target[i], 0, 1) for i, c in enumerate(classes)},
        "raw_ci": {c: list(share_interval(target[i], n, alpha)) for i, c in enumerate(classes)},
        "corrected": {c: tidy(corrected[i], 0, 1) for i, c in enumerate(classes)},
        "corrected_ci": {c: list(posterior_interval(p_draws[:, i], corrected[i], alpha, 0.0, 1.0))
                         for i, c in enumerate(classes)},
        "confusion_estimated": np.round(m, 4).tolist(),
        "method": "Rogan-Gladen" if k == 2 else "constrained least squares",
        "n_images": int(n), "n_checked": int(cm.sum()),
        "unchecked_classes": [c for i, c in enumerate(classes) if column_totals[i] == 0 and counts[i] > 0],
        "_draws": p_draws,
    }
