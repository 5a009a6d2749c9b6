"""Double centring and classical MDS: the package's one implementation of each.

Classical (Torgerson) MDS embeds points from squared distances ``D2`` through the top
eigenpairs of ``B = -1/2 H D2 H`` (``H = I - 11^T/n``). Every method needs the centring in one
of three shapes, all here:

- :func:`double_centre`, dense: a whole matrix, one tile of a larger one, or the rows of new
  points against a training set's means (the out-of-sample form), by passing the means;
- :class:`CentredOperator`, matrix-free: ``B V`` from products ``D2 V`` only (rank-one
  corrections, never H), for out-of-core distances;
- :func:`classical_mds`: either of them through the one eigensolver,
  :func:`dr_dask.linalg.eigen.top_eigh` (dense below its size threshold, Lanczos above).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np

from dr_dask.linalg.eigen import (
    EigResult,
    SymmetricOperator,
    as_operator,
    materialise,
    top_eigh,
)

logger = logging.getLogger(__name__)


def double_centre(
    A: Any,
    row_mean: np.ndarray | None = None,
    col_mean: np.ndarray | None = None,
    total: float | None = None,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """``-1/2 (A - r 1^T - 1 c^T + t)``, which is ``-1/2 H A H`` with A's own means.

    Parameters
    ----------
    A : array-like of shape (n, m)
        Squared distances (or any matrix to centre).
    row_mean, col_mean : ndarray of shape (n,) and (m,), optional
        Means to subtract; default A's own. Pass a larger matrix's means to centre one of its
        tiles, or the training means to centre the distance rows of new points.
    total : float, optional
        Grand mean; default A's own.
    out : ndarray of shape (n, m), float64, optional
        Where to write the result (it may be A itself): no temporaries, the same values.

    Returns
    -------
    ndarray of shape (n, m), float64
    """
    # into ``out`` a float32 A is widened element by element, not copied whole first
    A = np.asarray(A, dtype=None if out is not None else np.float64)
    r = A.mean(axis=1, dtype=np.float64) if row_mean is None else np.asarray(row_mean, np.float64)
    c = A.mean(axis=0, dtype=np.float64) if col_mean is None else np.asarray(col_mean, np.float64)
    t = float(A.mean(dtype=np.float64)) if total is None else float(total)
    if out is None:
        return -0.5 * (A - r[:, None] - c[None, :] + t)
    np.subtract(A, r[:, None], out=out)  # the expression's operations, in its order
    out -= c[None, :]
    out += t
    out *= -0.5
    return out


def centred_product(matmat: Any, V: np.ndarray) -> np.ndarray:
    """``-1/2 H A H V`` from a function ``matmat(W) = A W`` (A symmetric): one product."""
    W = np.asarray(matmat(V - V.mean(axis=0)), dtype=np.float64)
    return -0.5 * (W - W.mean(axis=0))


class CentredOperator:
    """``B = -1/2 H A H`` of a symmetric operator A, known through products only.

    Parameters
    ----------
    A : ndarray, dask array or SymmetricOperator of shape (n, n)
    """

    def __init__(self, A: Any):
        self.A = as_operator(A)
        self.shape = tuple(self.A.shape)
        # B has a dense form (the eigensolver's dense path for small n) only when A has one; an
        # A known only by products leaves it None, so the eigensolver judges materialising by size
        self.to_dense: Callable[[], np.ndarray] | None = (
            self._centred_dense if getattr(self.A, "to_dense", None) is not None else None
        )

    def matmat(self, V: np.ndarray) -> np.ndarray:
        return centred_product(self.A.matmat, V)

    def _centred_dense(self) -> np.ndarray:
        return double_centre(materialise(self.A))


def scaled_vectors(values: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """MDS coordinates ``[sqrt(lambda_m) v_m]``; non-positive eigenvalues give zero columns."""
    return vectors * np.sqrt(np.clip(values, 0.0, None))


class MDSResult(EigResult):
    """The eigenpairs of ``-1/2 H D2 H`` (:class:`~dr_dask.linalg.eigen.EigResult`) and their
    MDS coordinates ``embedding`` (n, k): ``vectors * sqrt(max(values, 0))``."""

    @property
    def embedding(self) -> np.ndarray:
        return scaled_vectors(self.values, self.vectors)


def classical_mds(
    D2: Any,
    n_components: int,
    *,
    method: str = "auto",
    tol: float = 1e-8,
    max_passes: int = 60,
    random_state: Any = None,
) -> MDSResult:
    """Classical MDS from squared distances.

    Parameters
    ----------
    D2 : ndarray, dask array or SymmetricOperator of shape (n, n)
        Squared distances; an operator stays matrix-free (:class:`CentredOperator`).
    n_components : int
        k < n.
    method, tol, max_passes, random_state
        Passed to :func:`dr_dask.linalg.eigen.top_eigh`.

    Returns
    -------
    MDSResult
    """
    if isinstance(D2, SymmetricOperator):
        B: Any = CentredOperator(D2)
    else:
        B = double_centre(D2.compute() if hasattr(D2, "compute") else D2)
    res = top_eigh(B, n_components, method=method, tol=tol, max_passes=max_passes,
                   random_state=random_state)
    return MDSResult(res.values, res.vectors, res.residuals, res.n_passes, res.converged)
