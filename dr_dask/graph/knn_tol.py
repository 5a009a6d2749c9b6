"""The distance error of an approximate neighbour search, and the probe share it asks for.

The geodesics need neighbours as near as the true ones, not the same ones. On data whose
neighbours noise decides (the sinusoid with noise in all 100 features: a row's 11th nearest
row is barely farther than its 10th, and the 10 nearest lie in a latent window that holds the
same share of all rows at every size) which rows are "the" k nearest is chance; how far they
are is not. An approximate search is therefore judged, and the
adaptive probe of :mod:`dr_dask.graph._knn_ivf` stopped, on the k-th neighbour's distance:

    error = mean over rows of  d_k(found) / d_k(exact) - 1

(0 for the exact search; docs/scaling.md, "The distance tolerance"). Identity
recall stays reported beside it.

:func:`distance_error` measures it on sampled rows from their exact neighbours;
:func:`distance_share` picks the adaptive probe's gap share that holds it within a tolerance.
"""

from __future__ import annotations

import logging

import numpy as np

from dr_dask.graph import knn_backends

logger = logging.getLogger(__name__)

#: The estimators' ``knn_tol`` (kept in the backends' table, which the CLI reads without
#: loading the searches): the distance error the adaptive probe aims at. The largest
#: tolerance whose embeddings stayed within 0.003 of the exact search's (R^2 to the latent on
#: the sinusoid at noise 0.1 and 0.01; trustworthiness and 10-NN label accuracy on augmented
#: digits; docs/scaling.md, "The distance tolerance").
DEFAULT_KNN_TOL = knn_backends.DEFAULT_KNN_TOL
#: Neighbours the calibration searches per sampled row, in multiples of k: the rows a probe
#: may find instead of a missed one are among them.
CALIBRATION_WIDTH = 3
#: Relative differences of two float64 distances that rounding alone makes.
ROUNDING = 64 * float(np.finfo(np.float64).eps)


def kth_errors(found_kth: np.ndarray, exact_kth: np.ndarray) -> np.ndarray:
    """Per row, the k-th found neighbour's relative distance excess over the exact one
    (0 where both are 0: duplicates; 0 within float64 rounding: the two distances may be
    summed in different orders, and that is no error of the search)."""
    found_kth = np.asarray(found_kth, dtype=np.float64)
    exact_kth = np.asarray(exact_kth, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        err = np.where(exact_kth > 0, found_kth / exact_kth - 1.0,
                       np.where(found_kth > 0, np.inf, 0.0))
    return np.where(err > ROUNDING, err, 0.0)


def distance_error(query: np.ndarray, found_rows: np.ndarray,
                   exact_kth: np.ndarray) -> tuple[float, float]:
    """The mean relative excess of the k-th found neighbour's distance over the exact one, and
    that mean's standard error.

    Parameters
    ----------
    query : ndarray of shape (S, N)
        The sampled rows.
    found_rows : ndarray of shape (S, k, N)
        The rows the search found as their neighbours (float64 distances are measured here,
        so the float32 rounding of the searches cannot make an error negative or hide one).
    exact_kth : ndarray of shape (S,)
        Each sampled row's exact k-th neighbour distance.

    Returns
    -------
    error : float
        ``mean(max_j ||q - x_j|| / exact_kth - 1)``: 0 when every row's found neighbours are
        as near as its true ones.
    standard_error : float
        The rows' standard deviation of it over sqrt(S): how far another sample of rows may
        put the estimate (0 with fewer than two rows).
    """
    q = np.asarray(query, dtype=np.float64)[:, None, :]
    d = np.sqrt(((np.asarray(found_rows, dtype=np.float64) - q) ** 2).sum(axis=2))
    if not len(d):
        return 0.0, 0.0
    err = kth_errors(d.max(axis=1), exact_kth)
    se = float(err.std(ddof=1) / np.sqrt(len(err))) if len(err) > 1 else 0.0
    return float(err.mean()), se


def distance_share(dist_sq: np.ndarray, ratio: np.ndarray, k: int, tol: float) -> float:
    """The smallest gap share that holds the mean k-th distance error of sampled rows within
    ``tol``.

    Parameters
    ----------
    dist_sq : ndarray of shape (S, K)
        Each sampled row's K >= k nearest rows' squared distances, ascending (inf: padding).
    ratio : ndarray of shape (S, K)
        Per neighbour, its list's centroid gap over the row's exact k-th squared distance: the
        adaptive probe reaches it with any share above that (inf: padding).
    k : int
    tol : float
        The mean relative error of the k-th distance allowed (> 0).

    Returns
    -------
    float
        With this share a row finds at least its neighbours whose ratio is below it (its
        running k-th distance never falls below the final one); its k-th found distance is the
        k-th smallest of theirs, or, when fewer than k of its K are among them, taken as the
        K-th (a lower bound: K is ``CALIBRATION_WIDTH`` k). Monotone in the share, so found by
        bisection over the ratios.
    """
    d = np.sqrt(np.asarray(dist_sq, dtype=np.float64))
    ratio = np.asarray(ratio, dtype=np.float64)
    if not len(d) or d.shape[1] < k:
        return 0.0
    exact = d[:, k - 1]
    farthest = np.where(np.isfinite(d), d, -np.inf).max(axis=1)

    def mean_error(share: float) -> float:
        found = np.where(ratio <= share, d, np.inf)
        kth = np.partition(found, k - 1, axis=1)[:, k - 1]
        return float(kth_errors(np.where(np.isfinite(kth), kth, farthest), exact).mean())

    shares = np.unique(ratio[np.isfinite(ratio)])
    if not len(shares):
        return 0.0
    lo, hi = 0, len(shares) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        if mean_error(shares[mid]) <= tol:
            hi = mid
        else:
            lo = mid + 1
    # a hair above: the probe asks for a gap strictly below the share
    share = float(shares[lo]) * (1 + 1e-6) + 1e-12
    logger.info("adaptive probe: gap share %.4g holds the k-th distance error of %d rows at "
                "%.2g (tolerance %g)", share, len(d), mean_error(share), tol)
    return share
