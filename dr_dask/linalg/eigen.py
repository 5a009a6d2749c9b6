"""Top-k *algebraic* eigenpairs of a large symmetric, possibly indefinite operator.

``dask.array.linalg.svd_compressed`` returns singular values, that is |lambda|, so on the
indefinite matrices of IKD (g(D)) and Isomap (-1/2 H D^2 H) it mixes in large negative
eigenvalues. This module provides the solver dask lacks: block Lanczos with full
re-orthogonalisation and a Rayleigh-Ritz step that ranks Ritz values by algebraic value.

The operator is only ever touched through ``matmat(V)`` on a thin ``(T, b)`` block, so it can be
a dense array, a dask array, or a tiled out-of-core operator whose every product is one pass
over tiles on a cluster. Every pass is the expensive part; the solver reuses the products it has
(``A Q`` for every basis block) so Rayleigh-Ritz and the residuals cost no extra pass.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np
import scipy.linalg

from dr_dask.runtime import config
from dr_dask.runtime.blas import single_blas_thread

logger = logging.getLogger(__name__)

#: An operator known only through products is materialised (T products) for the dense path
#: when T is at most this many Lanczos blocks: a typical Lanczos run multiplies about as many
#: columns, and a tiled product pass costs far more than LAPACK (docs/scaling.md, "Measurements
#: behind the code's thresholds").
PRODUCT_DENSE_BLOCKS = 6


@runtime_checkable
class SymmetricOperator(Protocol):
    """A symmetric ``(T, T)`` linear operator known through block products."""

    shape: tuple[int, int]

    def matmat(self, V: np.ndarray) -> np.ndarray:
        """Return ``A @ V`` for ``V`` of shape ``(T, b)``."""
        ...


@dataclass
class EigResult:
    """Top eigenpairs, largest algebraic first.

    Attributes
    ----------
    values : ndarray of shape (k,)
    vectors : ndarray of shape (T, k)
        Orthonormal columns.
    residuals : ndarray of shape (k,)
        ``||A v - lambda v||_2`` for each pair.
    n_passes : int
        Number of operator products (passes over the data) used.
    converged : bool
    """

    values: np.ndarray
    vectors: np.ndarray
    residuals: np.ndarray
    n_passes: int
    converged: bool


class DenseOperator:
    """Wrap an in-memory (numpy) or lazy (dask) symmetric matrix as a :class:`SymmetricOperator`."""

    def __init__(self, A: Any):
        self.A = A
        self.shape = tuple(A.shape)

    def matmat(self, V: np.ndarray) -> np.ndarray:
        out = self.A @ V
        return np.asarray(out.compute() if hasattr(out, "compute") else out)

    def to_dense(self) -> np.ndarray:
        A = self.A
        return np.asarray(A.compute() if hasattr(A, "compute") else A, dtype=np.float64)


def as_operator(A: Any) -> SymmetricOperator:
    """A itself if it has ``matmat``, else A (ndarray or dask array) wrapped in DenseOperator."""
    if isinstance(A, SymmetricOperator):
        return A
    return DenseOperator(A)


def materialise(A: Any) -> np.ndarray:
    """A as a float64 ndarray: arrays computed, operators by ``to_dense()`` when they have it,
    else by one product with the identity (only sensible for small T)."""
    op = as_operator(A)
    to_dense = getattr(op, "to_dense", None)
    M = to_dense() if to_dense is not None else op.matmat(np.eye(op.shape[0]))
    return np.asarray(M, dtype=np.float64)


def fix_signs(V: np.ndarray) -> np.ndarray:
    """The package's one eigenvector sign convention: each column's largest-magnitude entry is
    positive (the first such entry on a tie), as scikit-learn's ``svd_flip`` does for singular
    vectors. An eigenvector's sign is arbitrary and differs between LAPACK and Lanczos, runs
    and machines; fixed, the same fit gives the same embedding. Returns a new array."""
    V = np.asarray(V)
    if V.size == 0:
        return V.copy()
    signs = np.sign(V[np.abs(V).argmax(axis=0), np.arange(V.shape[1])])
    return V * np.where(signs == 0, 1.0, signs)


def _orthonormalise(W: np.ndarray, Q: np.ndarray | None) -> np.ndarray:
    """Columns of W made orthonormal and orthogonal to Q (two rounds of Gram-Schmidt)."""
    for _ in range(2):
        if Q is not None and Q.shape[1]:
            W = W - Q @ (Q.T @ W)
    Qw, R = np.linalg.qr(W)
    # drop directions that vanished (Krylov space exhausted or rank deficiency)
    keep = np.abs(np.diag(R)) > 1e-10 * max(1.0, np.abs(R).max(initial=0.0))
    return Qw[:, keep]


def top_eigh(
    A: Any,
    n_components: int,
    *,
    method: str = "auto",
    block_size: int | None = None,
    tol: float = 1e-8,
    max_passes: int = 60,
    max_basis: int | None = None,
    random_state: int | np.random.RandomState | None = None,
) -> EigResult:
    """Top ``n_components`` algebraic eigenpairs of a symmetric operator.

    Parameters
    ----------
    A : ndarray, dask array, or SymmetricOperator of shape (T, T)
        Symmetric; may be indefinite.
    n_components : int
        Number of eigenpairs k.
    method : {"auto", "dense", "lanczos"}
        ``dense`` materialises A (:func:`materialise`: an operator by ``to_dense()`` or one
        product with the identity) and calls LAPACK ``eigh`` with a subset; ``lanczos`` is block
        Lanczos with Rayleigh-Ritz. ``auto`` is dense when T <= ``dr_dask.eigen.dense-max`` for
        arrays and operators with ``to_dense()``, when T <= ``PRODUCT_DENSE_BLOCKS`` Lanczos
        blocks for operators known only by products, or when ``n_components`` is close to T;
        else Lanczos. This is the package's only eigensolver entry.
    block_size : int, optional
        Lanczos block width b (default ``max(2k, k + 8)``): one pass multiplies a (T, b) block.
    tol : float
        Stop when every residual ``||A v - lambda v||`` is below ``tol * max|lambda|``.
    max_passes : int
        Hard cap on operator products.
    max_basis : int, optional
        Basis width at which the solver restarts from its current Ritz vectors
        (default ``max(10 b, 200)``), bounding memory at ``T * max_basis`` floats.
    random_state : int, RandomState or None
        Seeds the starting block.

    Returns
    -------
    EigResult
        Eigenvectors with :func:`fix_signs`'s sign convention.
    """
    T = A.shape[0]
    k = int(n_components)
    if not 1 <= k < T:
        raise ValueError(f"n_components must be in [1, {T - 1}] for a {T}x{T} operator, got {k}")
    if method == "auto":
        in_memory = not isinstance(A, SymmetricOperator) or getattr(A, "to_dense", None)
        width = block_size or max(2 * k, k + 8)
        limit = config.get("eigen.dense-max") if in_memory else PRODUCT_DENSE_BLOCKS * width
        method = "dense" if max(limit, 4 * k) >= T else "lanczos"
    if method == "dense":
        M = materialise(A)
        M = (M + M.T) / 2
        w, v = scipy.linalg.eigh(M, subset_by_index=[T - k, T - 1])
        w, v = w[::-1], v[:, ::-1]
        res = np.linalg.norm(M @ v - v * w, axis=0)
        return EigResult(w, fix_signs(v), res, n_passes=1, converged=True)
    if method != "lanczos":
        raise ValueError(f"method must be 'auto', 'dense' or 'lanczos', got {method!r}")
    from sklearn.utils import check_random_state  # lazy: not on workers (__init__)

    return _block_lanczos(
        as_operator(A), k, block_size, tol, max_passes, max_basis, check_random_state(random_state)
    )


def _block_lanczos(op, k, block_size, tol, max_passes, max_basis, rng) -> EigResult:
    T = op.shape[0]
    b = min(block_size or max(2 * k, k + 8), T)
    max_basis = min(max_basis or max(10 * b, 200), T)
    # A thick restart keeps at least b Ritz vectors, whose residuals continue the Krylov space,
    # so the basis must hold two blocks: on small operators (T < 2b) narrow the block to fit.
    b = max(k, min(b, max_basis // 2))
    Q = _orthonormalise(rng.standard_normal((T, b)), None)
    AQ = np.asarray(op.matmat(Q), dtype=np.float64)
    passes = 1
    while True:
        H = Q.T @ AQ
        H = (H + H.T) / 2
        with single_blas_thread():  # a <= max_basis square: threads only contend (20x, loaded)
            theta, Y = np.linalg.eigh(H)
        order = np.argsort(theta)[::-1]
        theta, Y = theta[order], Y[:, order]
        ritz_top = Q @ Y[:, :k]
        res = np.linalg.norm(AQ @ Y[:, :k] - ritz_top * theta[:k], axis=0)
        scale = max(np.abs(theta).max(initial=0.0), np.finfo(float).tiny)
        converged = bool(np.all(res <= tol * scale))
        logger.debug("pass %d basis %d max rel residual %.2e", passes, Q.shape[1],
                     res.max() / scale)
        if converged or passes >= max_passes:
            if not converged:
                logger.warning(
                    "block Lanczos stopped after %d passes with relative residual %.2e > tol %.1e",
                    passes, res.max() / scale, tol,
                )
            return EigResult(theta[:k], fix_signs(ritz_top), res, passes, converged)
        if Q.shape[1] + b > max_basis:
            # thick restart: keep the leading Ritz vectors (by algebraic value) and their products
            keep = min(max_basis - b, Q.shape[1])
            keep = max(keep, k)
            Q, AQ = Q @ Y[:, :keep], AQ @ Y[:, :keep]
            W = AQ[:, :b] - Q[:, :b] * theta[:b]  # residual block continues the Krylov space
        else:
            W = AQ[:, -b:]
        Qn = _orthonormalise(W, Q)
        if Qn.shape[1] == 0:  # invariant subspace found: the Ritz pairs are exact
            Qn = _orthonormalise(rng.standard_normal((T, b)), Q)
        AQn = np.asarray(op.matmat(Qn), dtype=np.float64)
        passes += 1
        Q, AQ = np.hstack([Q, Qn]), np.hstack([AQ, AQn])
