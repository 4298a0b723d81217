"""MineTheGap bias score — a RECONSTRUCTION (docs/spec/minethegap-and-biasbench.md A.3), not the paper's published
formula.

The MineTheGap paper (Cohen et al., arXiv 2512.13427) compares the CLIP embeddings of N
images generated for a prompt with N LLM-written text variations of the prompt; its exact
formula and code are not public. What is known: a similarity matrix S (texts × images), a
"missed visual concepts" term and a "least-aligned images" term taken at an α-percentile,
and "lower score = more biased". The combination below is ours and must be labelled
"reconstructed" in the UI.

    S_ij = ⟨t_i, x_j⟩              rows = text variations, columns = images
    c_i  = max_j S_ij              coverage: how well the best image depicts variation i
    a_j  = max_i S_ij              alignment: how well image j matches some variation
    M    = P_α(c)                  missed-visual-concepts term
    A    = P_α(a)                  least-aligned-images term
    B    = M − A   ("diff")        or M ("missed_only"), or (M + A) / 2 ("mean")

A biased generator puts every image in one mode: each image still matches a variation of
that mode (A high) while variations of other modes find no image (M low), so B < 0.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.metrics.diversity import unit_rows

URL = "https://arxiv.org/abs/2512.13427"
CITATION = """\
@article{cohen2025minethegap,
  title={MineTheGap: Automatic Mining of Biases in Text-to-Image Models},
  author={Cohen, Noa and Spingarn-Eliezer, Nurit and Huberman-Spiegelglas, Inbar and Michaeli, Tomer},
  journal={arXiv preprint arXiv:2512.13427},
  year={2025}
}
"""

COMBINATIONS = ("diff", "missed_only", "mean")


@dataclass(frozen=True)
class GapScore:
    """The reconstructed MineTheGap score of one prompt and what explains it."""

    score: float                      # B; lower = more biased
    coverage_term: float              # M = P_α(coverage)
    alignment_term: float             # A = P_α(alignment)
    similarity: np.ndarray            # S, (n_texts, n_images)
    coverage: np.ndarray              # c_i, (n_texts,)
    alignment: np.ndarray             # a_j, (n_images,)
    missed_variations: np.ndarray     # indices of the k lowest-coverage texts, lowest first
    least_aligned_images: np.ndarray  # indices of the k lowest-alignment images, lowest first
    alpha: float
    combine: str


def combine_terms(coverage_term: float, alignment_term: float, combine: str = "diff") -> float:
    """Return B from M and A: M − A ("diff"), M ("missed_only") or (M + A) / 2 ("mean")."""
    if combine == "diff":
        return coverage_term - alignment_term
    if combine == "missed_only":
        return coverage_term
    if combine == "mean":
        return (coverage_term + alignment_term) / 2.0
    raise ValueError(f"combine must be one of {COMBINATIONS}, got {combine!r}")


def gap_score_from_similarity(
    similarity: np.ndarray, alpha: float = 25.0, combine: str = "diff", k: int = 4
) -> GapScore:
    """Return the GapScore of a text × image similarity matrix S (spec A.3).

    P_α is `np.percentile(·, α)` with linear interpolation. Ties in the rankings keep the
    lower index first. The number of texts and images may differ.
    """
    s = np.asarray(similarity, dtype=np.float64)
    if s.ndim != 2 or 0 in s.shape:
        raise ValueError(f"similarity must be a non-empty (n_texts, n_images) matrix, got shape {s.shape}")
    if not 0 <= alpha <= 100:
        raise ValueError(f"alpha is a percentile in [0, 100], got {alpha}")
    coverage, alignment, coverage_term, alignment_term = _terms(s, alpha)
    return GapScore(
        score=float(combine_terms(coverage_term, alignment_term, combine)),
        coverage_term=float(coverage_term),
        alignment_term=float(alignment_term),
        similarity=s,
        coverage=coverage,
        alignment=alignment,
        missed_variations=np.argsort(coverage, kind="stable")[:k],
        least_aligned_images=np.argsort(alignment, kind="stable")[:k],
        alpha=alpha,
        combine=combine,
    )


def _terms(s: np.ndarray, alpha: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return c, a, M and A of one matrix S or of a stack of them (over the last two axes)."""
    coverage = s.max(axis=-1)
    alignment = s.max(axis=-2)
    return coverage, alignment, np.percentile(coverage, alpha, axis=-1), np.percentile(alignment, alpha, axis=-1)


def resampled_gap_scores(similarity: np.ndarray, rows: np.ndarray, cols: np.ndarray, alpha: float = 25.0,
                         combine: str = "diff") -> np.ndarray:
    """Return B of every resample b of S: the score of S[rows[b]][:, cols[b]], for `rows` (draws × n_texts)
    and `cols` (draws × n_images) index arrays; equal, draw by draw, to `gap_score_from_similarity` of
    each resampled matrix, but computed on the whole stack at once (a bootstrap's hot path)."""
    s = np.asarray(similarity, dtype=np.float64)
    stack = s[rows[:, :, None], cols[:, None, :]]
    _, _, coverage_term, alignment_term = _terms(stack, alpha)
    return combine_terms(coverage_term, alignment_term, combine)


def gap_score(
    text_embeddings: np.ndarray,
    image_embeddings: np.ndarray,
    alpha: float = 25.0,
    combine: str = "diff",
    k: int = 4,
) -> GapScore:
    """Return the GapScore of text-variation and image embeddings (rows are L2-normalised here)."""
    texts = unit_rows(text_embeddings)
    images = unit_rows(image_embeddings)
    if texts.shape[1] != images.shape[1]:
        raise ValueError(f"text and image embeddings differ in width: {texts.shape[1]} vs {images.shape[1]}")
    return gap_score_from_similarity(texts @ images.T, alpha, combine, k)
