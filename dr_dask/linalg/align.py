"""The one Procrustes alignment of the package.

Every module that aligns point sets (blockwise IKD merges, refit frames in streaming,
Procrustes disparity in metrics, LSDR's generalised Procrustes) uses :func:`procrustes_fit`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np

logger = logging.getLogger(__name__)


@dataclass
class Similarity:
    """``x -> scale * x @ rotation + translation`` mapping source onto target.

    Attributes
    ----------
    rotation : ndarray of shape (d_src, d_tgt)
        Orthogonal (reflections allowed) when both dimensions agree.
    scale : float
    translation : ndarray of shape (d_tgt,)
    residual : float
        ``||apply(source) - target||_F^2`` on the points used for the fit.
    """

    rotation: np.ndarray
    scale: float
    translation: np.ndarray
    residual: float

    def apply(self, X: np.ndarray) -> np.ndarray:
        """Map points of shape (n, d_src) into the target frame."""
        return self.scale * (np.asarray(X) @ self.rotation) + self.translation


def procrustes_fit(
    source: np.ndarray,
    target: np.ndarray,
    *,
    scaling: bool = True,
    reflection: bool = True,
    weights: np.ndarray | None = None,
) -> Similarity:
    """Least-squares similarity (or rigid) map of ``source`` onto ``target``.

    Parameters
    ----------
    source, target : ndarray of shape (n, d)
        Corresponding points. A source of lower dimension is zero-padded.
    scaling : bool
        Fit an isotropic scale (``False`` gives the rigid map used by blockwise IKD merges).
    reflection : bool
        Allow improper rotations (the papers' "flip + rotation"); ``False`` forces det = +1.
    weights : ndarray of shape (n,), optional
        Non-negative point weights.

    Returns
    -------
    Similarity
    """
    A = np.asarray(source, dtype=np.float64)
    B = np.asarray(target, dtype=np.float64)
    if A.ndim != 2 or B.ndim != 2 or A.shape[0] != B.shape[0]:
        raise ValueError(f"source {A.shape} and target {B.shape} must be (n, d) with equal n")
    w = np.ones(A.shape[0]) if weights is None else np.asarray(weights, dtype=np.float64)
    w = w / w.sum()
    mu_a, mu_b = w @ A, w @ B
    A0, B0 = A - mu_a, B - mu_b
    C = (A0 * w[:, None]).T @ B0  # (d_src, d_tgt) cross-covariance
    U, s, Vt = np.linalg.svd(C, full_matrices=False)
    if not reflection and np.linalg.det(U @ Vt) < 0:
        U[:, -1] *= -1
        s[-1] *= -1
    R = U @ Vt
    var_a = float(np.sum(w[:, None] * A0**2))
    scale = float(s.sum() / var_a) if (scaling and var_a > 0) else 1.0
    t = mu_b - scale * (mu_a @ R)
    resid = float(np.sum((scale * A @ R + t - B) ** 2))
    return Similarity(R, scale, t, resid)


def procrustes_disparity(reference: np.ndarray, estimate: np.ndarray) -> float:
    """Standardised squared Procrustes disparity in [0, 1] (``scipy.spatial.procrustes``'s).

    Both sets are centred and scaled to unit Frobenius norm, ``estimate`` is optimally rotated,
    reflected and scaled onto ``reference``, and the residual sum of squares is returned.
    Inputs of different dimension are zero-padded to the larger one.
    """
    A = np.asarray(reference, dtype=np.float64)
    B = np.asarray(estimate, dtype=np.float64)
    if A.shape[0] != B.shape[0]:
        raise ValueError(f"reference has {A.shape[0]} points but estimate has {B.shape[0]}")
    d = max(A.shape[1], B.shape[1])
    A = np.pad(A, ((0, 0), (0, d - A.shape[1])))
    B = np.pad(B, ((0, 0), (0, d - B.shape[1])))
    A = A - A.mean(0)
    B = B - B.mean(0)
    na, nb = np.linalg.norm(A), np.linalg.norm(B)
    if na == 0 or nb == 0:
        raise ValueError("Procrustes disparity is undefined for a set of identical points")
    fit = procrustes_fit(B / nb, A / na, scaling=True)
    return fit.residual
