"""A dense NumPy implementation of IKD Algorithm 1 (Li & Wu 2022, Algorithm 1), written
independently of the package so that tests can compare the tiled Dask path against it.

Kernel inverses are written out here in closed form (and Matérn by scipy's scalar root
finder), not taken from dr_dask.linalg.kernels, so that a mistake there cannot hide in both.
"""

from __future__ import annotations

import numpy as np
import scipy.linalg
from scipy.optimize import brentq
from scipy.special import gamma as gamma_fn
from scipy.special import kv


def _matern(d: float, nu: float) -> float:
    if d == 0:
        return 1.0
    x = np.sqrt(2 * nu * d)
    return 2 ** (1 - nu) / gamma_fn(nu) * x**nu * kv(nu, x)


def inverse_kernel(k: np.ndarray, kernel: str, alpha=1.0, gamma=1.0, nu=1.5) -> np.ndarray:
    if kernel == "se":
        return -2 * np.log(k)
    if kernel == "rational_quadratic":
        return 2 * alpha * (k ** (-1 / alpha) - 1)
    if kernel == "gamma_exponential":
        return (-np.log(k)) ** (2 / gamma)
    if kernel == "matern":
        flat = k.ravel()
        uniq, inv = np.unique(flat, return_inverse=True)
        out = np.array([
            0.0 if u >= 1 else brentq(lambda d, u=u: _matern(d, nu) - u, 0, 1e4, xtol=1e-14)
            for u in uniq
        ])
        return out[inv].reshape(k.shape)
    raise ValueError(kernel)


_DISTANCES: dict = {}


def distance_dense(X, kernel, similarity, floor, ceil, **kparams):
    """D = f^-1(clip(S / sigma^2)) with a zero diagonal (cached: Matérn's root finding is slow)."""
    key = (X.tobytes(), kernel, similarity, floor, ceil, tuple(sorted(kparams.items())))
    if key in _DISTANCES:
        return _DISTANCES[key]
    N = X.shape[1]
    Xc = X - X.mean(axis=1, keepdims=True)
    if similarity == "covariance":
        S = Xc @ Xc.T / (N - 1)
        sigma2 = np.mean(np.diag(S))
    else:
        S = np.corrcoef(X)
        sigma2 = 1.0
    k = np.clip(S / sigma2, floor, ceil)
    D = inverse_kernel(k, kernel, **kparams)
    np.fill_diagonal(D, 0.0)
    _DISTANCES[key] = D
    return D


def ikd_dense(X, M, kernel="se", similarity="covariance", reference="min_max", floor=1e-3,
              ceil=1 - 1e-5, **kparams):
    X = np.asarray(X, dtype=np.float64)
    T = X.shape[0]
    D = distance_dense(X, kernel, similarity, floor, ceil, **kparams)
    if reference == "center":
        J = np.eye(T) - 1.0 / T
        G = -0.5 * J @ D @ J
        r = None
    else:
        r = int(np.argmin(D.max(axis=1) if reference == "min_max" else D.mean(axis=1)))
        G = 0.5 * (D[:, [r]] + D[[r], :] - D)
    w, v = scipy.linalg.eigh(G, subset_by_index=[T - M, T - 1])
    w, v = w[::-1], v[:, ::-1]
    Z = v * np.sqrt(np.clip(w, 0, None))
    evr = np.sum(w**2) / np.sum(G**2)
    return Z, w, r, evr


def align_signs(Z: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Flip each column of Z to best match ref (eigenvectors are defined up to sign)."""
    s = np.sign(np.sum(Z * ref, axis=0))
    s[s == 0] = 1
    return Z * s
