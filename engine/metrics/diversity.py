"""Diversity of an embedding set: the Vendi score and mean pairwise similarity.

Vendi score (Friedman & Dieng, 2023; T2I-BiasBench Eq. 14 names it): for N items with a
positive semi-definite similarity kernel K (K_ii = 1), VS = exp(−Σ λ log λ) where λ are the
eigenvalues of K / N. VS = 1 when all items are identical and N when they are mutually
orthogonal: "the effective number of distinct items". Here K is the cosine kernel of
CLIP-style embeddings, K = X Xᵀ with X the L2-normalised rows.
"""
from __future__ import annotations

import numpy as np

URL = "https://arxiv.org/abs/2210.02410"
CITATION = """\
@article{friedman2023vendi,
  title={The Vendi Score: A Diversity Evaluation Metric for Machine Learning},
  author={Friedman, Dan and Dieng, Adji Bousso},
  journal={Transactions on Machine Learning Research},
  year={2023}
}
"""


def unit_rows(embeddings: np.ndarray) -> np.ndarray:
    """Return the embeddings as a float64 (N, d) array with L2-normalised rows."""
    x = np.asarray(embeddings, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise ValueError(f"embeddings must be a non-empty (N, d) array, got shape {x.shape}")
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    if (norms == 0).any():
        raise ValueError("embeddings contain an all-zero row, which has no direction")
    return x / norms


def _exp_entropy(eigenvalues: np.ndarray) -> float:
    # Tiny negative eigenvalues are round-off of a PSD matrix.
    positive = eigenvalues[eigenvalues > 1e-12]
    return float(np.exp(-(positive * np.log(positive)).sum()))


def vendi_score_from_similarity(similarity: np.ndarray) -> float:
    """Return VS = exp(−Σ λ log λ), λ the eigenvalues of K / N (Eq. 14) for an (N, N) kernel K with unit diagonal."""
    k = np.asarray(similarity, dtype=np.float64)
    if k.ndim != 2 or k.shape[0] != k.shape[1] or k.shape[0] == 0:
        raise ValueError(f"similarity must be a non-empty square matrix, got shape {k.shape}")
    return _exp_entropy(np.linalg.eigvalsh(k / k.shape[0]))


def vendi_score(embeddings: np.ndarray) -> float:
    """Return the Vendi score ∈ [1, N] of N embeddings under the cosine kernel.

    Uses the smaller of the (N, N) kernel X Xᵀ / N and the (d, d) matrix Xᵀ X / N: their
    nonzero eigenvalues are equal, so 1,000 images with 768-d embeddings cost one 768²
    eigendecomposition.

    N identical images are one distinct image; N orthogonal ones are N (Friedman & Dieng, §3):

    >>> round(vendi_score(np.ones((4, 3))), 6), round(vendi_score(np.eye(3)), 6)
    (1.0, 3.0)
    """
    x = unit_rows(embeddings)
    n, d = x.shape
    gram = x @ x.T if n <= d else x.T @ x
    return _exp_entropy(np.linalg.eigvalsh(gram / n))


def normalised_vendi(embeddings: np.ndarray) -> float:
    """Return (VS − 1) / (N − 1) ∈ [0, 1]; 0 for a single embedding."""
    n = np.asarray(embeddings).shape[0]
    if n == 1:
        return 0.0
    return (vendi_score(embeddings) - 1.0) / (n - 1.0)


def mean_pairwise_similarity(embeddings: np.ndarray) -> float:
    """Return the mean cosine similarity over all pairs i ≠ j; nan for a single embedding.

    Computed as (‖Σ x_i‖² − N) / (N (N − 1)), which is the off-diagonal sum without
    forming the N × N matrix.
    """
    x = unit_rows(embeddings)
    n = x.shape[0]
    if n == 1:
        return float("nan")
    total = x.sum(axis=0)
    return float((total @ total - n) / (n * (n - 1)))
