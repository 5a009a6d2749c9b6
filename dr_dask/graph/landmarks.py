"""Landmarks and the de Silva–Tenenbaum landmark extension (landmark MDS + triangulation).

Generic over the dissimilarity: everything works on SQUARED distances, so the same extension
serves Landmark Isomap (squared geodesics) and landmark IKD (squared kernel-induced distances).

* :func:`landmark_mds`: classical MDS of the L x L squared distances, returning the landmark
  coordinates and the pseudo-inverse transpose ``L# = [v_k / sqrt(lambda_k)]^T``.
* :func:`triangulate`: ``x = -1/2 L# (delta_x - delta_mean)`` for any number of points. It is
  linear in the landmark rows, so callers may sum it over row blocks of an L x T matrix.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, NamedTuple

import dask.array as da
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra

from dr_dask.linalg.mds import classical_mds
from dr_dask.runtime.blas import single_blas_thread
from dr_dask.runtime.buffers import thread_buffer
from dr_dask.runtime.cluster import compute

logger = logging.getLogger(__name__)

#: Spare landmark MDS dimensions triangulated beyond the embedding's M (M of them, at most
#: this many), among which :func:`principal_axes` finds the data's axes: a 2-D or 3-D view's
#: lie within a few more, and further ones, of small eigenvalues, only add their
#: triangulation's error (scaled by 1 / sqrt(lambda)).
MAX_SPARE_DIMENSIONS = 4
#: Spare landmark MDS dimensions need an eigenvalue above this share of the largest.
SPARE_RTOL = 1e-8

#: Max-min on points runs over a seeded random subset of this many rows per landmark (at
#: least ``MAXMIN_MIN_CANDIDATES``): L passes over L * 20 rows instead of over all T rows.
MAXMIN_CANDIDATES_PER_LANDMARK = 20
MAXMIN_MIN_CANDIDATES = 10_000


class LandmarkMDS(NamedTuple):
    """Result of :func:`landmark_mds`.

    Attributes
    ----------
    coords : ndarray of shape (L, d)
        Landmark coordinates ``v_k sqrt(lambda_k)``.
    pinv : ndarray of shape (d, L)
        ``L#``: rows ``v_k^T / sqrt(lambda_k)``.
    sq_mean : ndarray of shape (L,)
        ``delta_mean``: mean squared distance from each landmark to the landmarks.
    eigenvalues : ndarray of shape (d,)
    residuals : ndarray of shape (d,)
        ``||B v - lambda v||`` of each eigenpair of the centred matrix B.
    n_passes : int
        Products of the eigensolver with B (1 for the dense solver).
    """

    coords: np.ndarray
    pinv: np.ndarray
    sq_mean: np.ndarray
    eigenvalues: np.ndarray
    residuals: np.ndarray
    n_passes: int = 1


def select_landmarks(
    X_or_graph: Any,
    n_landmarks: int,
    *,
    method: str = "random",
    random_state: int | np.random.RandomState | None = None,
    client: Any = None,
) -> np.ndarray:
    """Choose landmark rows, seeded random or max-min (farthest-point) order.

    Parameters
    ----------
    X_or_graph : ndarray or dask array of shape (T, N), or sparse matrix of shape (T, T)
        Points: max-min on Euclidean distances over a seeded random subset of
        ``C = max(20 L, 10,000)`` rows (all rows when T <= C; only those rows are read), one
        O(C N) pass per landmark. A uniform subset keeps the landmarks spread over where the
        data are dense and ignores isolated outliers that a full max-min would pick first.
        Or a graph: max-min on geodesics, one Dijkstra per landmark over all T nodes (exact
        but sequential, for small T).
    n_landmarks : int
        L, with 1 <= L <= T.
    method : {"random", "maxmin"}
    random_state : int, RandomState or None
        Seeds the random choice, or the first landmark of max-min.
    client : distributed.Client, optional
        Reads the candidate rows of a dask array (the selection itself is sequential).

    Returns
    -------
    ndarray of shape (L,)
        Distinct row indices, in selection order.
    """
    is_graph = sp.issparse(X_or_graph)
    T = X_or_graph.shape[0]
    L = int(n_landmarks)
    if not 1 <= L <= T:
        raise ValueError(f"n_landmarks={n_landmarks} must be in [1, {T}] (the number of points)")
    from sklearn.utils import check_random_state  # lazy: not on workers (__init__)

    rng = check_random_state(random_state)
    if method == "random":
        return rng.choice(T, L, replace=False)
    if method != "maxmin":
        raise ValueError(f"method must be 'random' or 'maxmin', got {method!r}")
    if is_graph:
        return _maxmin(sp.csr_matrix(X_or_graph), L, rng, is_graph=True)
    C = max(MAXMIN_CANDIDATES_PER_LANDMARK * L, MAXMIN_MIN_CANDIDATES)
    candidates = np.arange(T) if T <= C else np.sort(rng.choice(T, C, replace=False))
    points = X_or_graph if T <= C else X_or_graph[candidates]
    if isinstance(points, da.Array):
        (points,) = compute(points, client=client)
    return candidates[_maxmin(np.asarray(points, dtype=np.float64), L, rng, is_graph=False)]


def _maxmin(data: Any, L: int, rng: np.random.RandomState, is_graph: bool) -> np.ndarray:
    """Farthest-point order over all rows of ``data`` (points or a graph), from a random start."""
    T = data.shape[0]
    if not is_graph:
        data = data - data.mean(axis=0)  # centred: no cancellation in the expansion below
        sq = np.einsum("ij,ij->i", data, data)

    def dist_from(i: int) -> np.ndarray:
        if is_graph:
            return dijkstra(data, directed=False, indices=i)
        # one matrix-vector product per landmark, no (T, N) temporary
        return np.sqrt(np.maximum(sq - 2.0 * (data @ data[i]) + sq[i], 0.0))

    chosen = np.empty(L, dtype=np.int64)
    chosen[0] = rng.randint(T)
    # L small memory-bound products: BLAS threads would only contend with dask's
    with single_blas_thread():
        mind = dist_from(chosen[0])
        mind[chosen[0]] = -1.0  # never re-pick a landmark, even among exact duplicates
        for m in range(1, L):
            nxt = int(np.argmax(mind))
            chosen[m] = nxt
            np.minimum(mind, dist_from(nxt), out=mind)
            mind[chosen[: m + 1]] = -1.0
    return chosen


def landmark_mds(D2_LL: np.ndarray, n_components: int, *, method: str = "dense",
                 tol: float = 1e-10, max_passes: int = 100,
                 random_state: Any = None, n_spare: int = 0) -> LandmarkMDS:
    """Classical MDS of landmarks from their squared distances.

    Parameters
    ----------
    D2_LL : ndarray of shape (L, L)
        Squared distances between landmarks (symmetrised here).
    n_components : int
        d < L.
    method, tol, max_passes, random_state
        The eigensolver's (:func:`dr_dask.linalg.classical_mds`): dense LAPACK by default.
    n_spare : int, default=0
        Up to this many further eigenpairs (at most L - 1 in all), kept while their
        eigenvalues exceed ``SPARE_RTOL`` times the largest: dimensions to triangulate before
        :func:`principal_axes`.

    Returns
    -------
    LandmarkMDS
        Unpacks as ``coords, pinv, sq_mean, eigenvalues, residuals, n_passes``; d plus the
        spare dimensions kept.

    Raises
    ------
    ValueError
        If fewer than d eigenvalues of the centred matrix are positive.
    """
    D2 = np.asarray(D2_LL, dtype=np.float64)
    L = D2.shape[0]
    if D2.shape != (L, L):
        raise ValueError(f"D2_LL must be square, got {D2.shape}")
    if not 1 <= n_components < L:
        raise ValueError(f"n_components={n_components} must be in [1, {L - 1}] for {L} landmarks")
    D2 = (D2 + D2.T) / 2
    n = min(L - 1, n_components + max(int(n_spare), 0))
    res = classical_mds(D2, n, method=method, tol=tol, max_passes=max_passes,
                        random_state=random_state)
    # a spare dimension of (numerically) zero variance would only scale rounding by 1/sqrt
    spare_ok = res.values[n_components:] > SPARE_RTOL * max(res.values[0], 0.0)
    keep = n_components + int(np.cumprod(spare_ok).sum())
    lam, V = res.values[:keep], res.vectors[:, :keep]
    if np.any(lam[:n_components] <= 0):
        raise ValueError(
            f"only {int((lam > 0).sum())} of the top {n_components} landmark MDS eigenvalues "
            f"are positive ({lam}); use fewer components or more landmarks"
        )
    root = np.sqrt(lam)
    return LandmarkMDS(V * root, (V / root).T, D2.mean(axis=1), lam, res.residuals[:keep],
                       res.n_passes)


def spare_dimensions(n_components: int) -> int:
    """Spare landmark MDS dimensions for an M-dimensional embedding: ``min(M, 4)``."""
    return min(int(n_components), MAX_SPARE_DIMENSIONS)


def principal_axes(Y: np.ndarray, n_components: int) -> np.ndarray:
    """The top principal axes of every point's triangulated coordinates.

    Landmark MDS takes its axes from the landmarks alone: their centred Gram matrix, whose
    leading eigenvectors follow the landmarks' distribution (max-min spreads them evenly,
    outliers first), not the data's. Triangulating every point into a few more dimensions and
    keeping the top principal axes of all T of them is de Silva & Tenenbaum's (2004) optional
    last step of landmark MDS (PCA normalisation), run on more dimensions than are kept: the
    axes then come from the whole data set, as the exact solver's do (within that subspace,
    the orthogonalised Nystrom approximation of Fowlkes, Belongie, Chung & Malik, 2004).

    Parameters
    ----------
    Y : ndarray of shape (T, m)
        Triangulated coordinates, m >= n_components.
    n_components : int

    Returns
    -------
    ndarray of shape (m, n_components)
        Orthonormal axes ``R``, largest variance first, each signed so that its largest entry
        is positive: the embedding is ``Y @ R``, and ``R.T @ pinv`` triangulates new points
        onto it (the map stays linear; no centring is added).
    """
    Yc = Y - Y.mean(axis=0)
    w, V = np.linalg.eigh(Yc.T @ Yc)
    R = V[:, np.argsort(w)[::-1][:n_components]]
    pivot = np.abs(R).argmax(axis=0)
    return R * np.where(R[pivot, np.arange(R.shape[1])] < 0, -1.0, 1.0)


def triangulate(pinv: np.ndarray, D2_LX: np.ndarray, D2_mean: np.ndarray, *,
                overwrite: bool = False) -> np.ndarray:
    """de Silva–Tenenbaum distance-based triangulation ``x = -1/2 L# (delta_x - delta_mean)``.

    Parameters
    ----------
    pinv : ndarray of shape (d, L)
        ``L#`` from :func:`landmark_mds` (or the matching rows-slice of it).
    D2_LX : ndarray of shape (L, n)
        Squared distances from the landmarks to n points (any float dtype).
    D2_mean : ndarray of shape (L,)
        ``delta_mean`` from :func:`landmark_mds` (or the matching slice).
    overwrite : bool
        A float64 ``D2_LX`` may be overwritten (no temporary of its size).

    Returns
    -------
    ndarray of shape (n, d)
    """
    D2_LX = np.asarray(D2_LX)
    if D2_LX.shape[0] != pinv.shape[1] or D2_mean.shape != (pinv.shape[1],):
        raise ValueError(f"shapes disagree: pinv {pinv.shape}, D2_LX {D2_LX.shape}, "
                         f"D2_mean {D2_mean.shape}")
    centred = D2_LX.astype(np.float64, copy=not overwrite)
    # pinv @ 1 = 0 in exact arithmetic; subtracting the mean keeps it exact in floating point
    centred -= D2_mean[:, None]
    return (-0.5 * (pinv @ centred)).T


#: Columns per slice when a block of landmark rows is triangulated, which bounds its float64
#: temporaries (two of rows x 65,536 x 8 bytes: 67 MB for 64 rows) whatever T.
TRIANGULATE_COLUMNS = 1 << 16


def triangulate_block(pinv: np.ndarray, rows: Any, D2_mean: np.ndarray,
                      squared: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """:func:`triangulate` from a block of landmark rows, ``TRIANGULATE_COLUMNS`` points at a
    time.

    Parameters
    ----------
    pinv : ndarray of shape (d, L_b)
        The block's columns of ``L#``.
    rows : ndarray of shape (L_b, n)
        The block's landmark rows (path lengths, or whatever ``squared`` takes), or any
        object with that ``shape`` whose ``rows[:, columns]`` reads them (a stored block).
    D2_mean : ndarray of shape (L_b,)
    squared : callable
        Squared distances of a slice of ``rows`` given as float64 (L_b, m), which it may
        overwrite and return.

    Returns
    -------
    ndarray of shape (n, d)
        The block's share of the embedding (triangulation is linear in the landmark rows).
    """
    n, width = rows.shape[1], min(rows.shape[1], TRIANGULATE_COLUMNS)
    out = np.empty((n, pinv.shape[0]))
    # one float64 buffer for every slice (see dr_dask.runtime.buffers): fresh pages for each
    # were most of this task's system time on a cluster's workers
    buf = thread_buffer("triangulation_slices", (rows.shape[0] * width,), np.float64)
    for c in range(0, n, width):
        m = min(width, n - c)
        part = buf[:rows.shape[0] * m].reshape(rows.shape[0], m)
        np.copyto(part, rows[:, c:c + m])
        out[c:c + m] = triangulate(pinv, squared(part), D2_mean, overwrite=True)
    return out
