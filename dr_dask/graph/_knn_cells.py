"""The cell search behind ``kneighbors(algorithm="cells")``: float32 GEMM over pruned cells.

Brute force costs T^2 N. Here the rows are projected on their top ``N_PROJ`` principal axes
(an orthogonal projection never lengthens a distance, so the distance between two cells'
bounding boxes in the projection is a rigorous lower bound on every distance between their
rows) and cut into cells of at most ``LEAF_SIZE`` rows by median splits of the widest projected
coordinate (the leaves of a k-d tree). A query cell visits the cells in increasing order of
that bound, folding float32 GEMM tiles into running top-k lists with the brute-force kernel,
and stops once the bound exceeds every row's current k-th distance. Within a visited cell only
the query rows whose own projection is within their k-th distance of the cell's box take part
in the GEMM (the bound from a point is tighter than from the query cell's box: on the noisy
sinusoid at T=10^6 it cuts the row-cell products from 11% to 9% of all). The kept candidates (a few
more than k, so that float32 rounding cannot push a true neighbour out) are re-ranked by
distances recomputed in float64, so the result is the exact kNN of the float32 rows.

On data near a low-dimensional manifold (even under isotropic noise) a query visits a small
fraction of the cells; on data without structure it degrades gracefully to brute force. The
float32 rows (and their float64 projections) are held whole by every worker (T (4 N + 8 p)
bytes each), the price of letting any query cell reach any other.
"""

from __future__ import annotations

import logging
from typing import Any

import dask
import dask.array as da
import numpy as np
from sklearn.utils import check_random_state

from dr_dask.blas import single_blas_thread
from dr_dask.cluster import compute, share
from dr_dask.graph.knn import EXTRA, _check_finite, _rerank_labelled, _select_k
from dr_dask.linalg.eigen import top_eigh

logger = logging.getLogger(__name__)

#: Rows per cell: large enough for an efficient GEMM tile, small enough for tight boxes.
LEAF_SIZE = 256
#: Principal axes of the projection that bounds distances between cells.
N_PROJ = 8
#: Rows sampled to estimate the principal axes.
PCA_SAMPLE = 20_000
#: Relative slack on the stopping bound for float32 rounding of the squared distances.
SLACK = 1e-3
#: Absolute slack, per unit of squared norm: float32 rounding of ``||x||^2 - 2 <q, x>``.
ABS_SLACK = 64 * float(np.finfo(np.float32).eps)
#: Query cells per task.
CELLS_PER_TASK = 16
#: Rows per step of the in-process passes over X.
BLOCK = 1 << 16


def _principal_axes(X: np.ndarray, p: int, rng: np.random.RandomState) -> np.ndarray:
    """(N, p) top principal axes of a sample of the (centred) rows."""
    rows = rng.choice(X.shape[0], min(PCA_SAMPLE, X.shape[0]), replace=False)
    S = X[np.sort(rows)].astype(np.float64)
    S -= S.mean(axis=0)
    return top_eigh(S.T @ S, p, method="dense").vectors


def _centred_float32(X: Any, client: Any) -> np.ndarray:
    """X minus its column means, in float32: rounding relative to the spread, not the offset.

    The means skip non-finite entries, so that such rows stay the only non-finite ones.
    """
    if isinstance(X, da.Array):
        X = X.astype(np.float64)
        (mean,) = compute(da.where(da.isfinite(X), X, 0.0).mean(axis=0), client=client)
        (X32,) = compute((X - mean).astype(np.float32), client=client)
        return X32
    X = np.asarray(X)
    mean = np.where(np.isfinite(X), X, 0.0).mean(axis=0)
    X32 = np.empty(X.shape, dtype=np.float32)
    for s in range(0, X.shape[0], BLOCK):  # no T x N float64 temporary
        X32[s:s + BLOCK] = X[s:s + BLOCK] - mean
    return X32


def _cells(P: np.ndarray, leaf_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Row order grouping the cells, and the cell offsets into it (k-d tree leaves of P)."""
    order = np.arange(P.shape[0])
    done, todo = [], [(0, P.shape[0])]
    while todo:
        s, e = todo.pop()
        if e - s <= leaf_size:
            done.append(s)
            continue
        seg = P[order[s:e]]
        dim = int(np.argmax(seg.max(axis=0) - seg.min(axis=0)))
        h = (e - s) // 2
        order[s:e] = order[s:e][np.argpartition(seg[:, dim], h)]
        todo += [(s, s + h), (s + h, e)]
    return order, np.array([*sorted(done), P.shape[0]])


def _box_gap2(lo: np.ndarray, hi: np.ndarray, p_lo: np.ndarray, p_hi: np.ndarray) -> np.ndarray:
    """Squared distances between boxes ``[lo, hi]`` and ``[p_lo, p_hi]`` (a point: equal)."""
    gap = np.maximum(np.maximum(lo - p_hi, p_lo - hi), 0.0)
    return np.einsum("ij,ij->i", gap, gap)


def _cell_task(Xs: np.ndarray, sq: np.ndarray, Ps: np.ndarray, lo: np.ndarray, hi: np.ndarray,
               bounds: np.ndarray, order: np.ndarray, cells: range, kk: int, k: int,
               exclude_self: bool) -> tuple[np.ndarray, np.ndarray]:
    """k nearest rows (original indices, float64 distances) of the rows of ``cells``."""
    out_d, out_i = [], []
    k_own = k + exclude_self
    sq_max = float(sq.max())
    for a in cells:
        s, e = bounds[a], bounds[a + 1]
        q, pq = Xs[s:e], Ps[s:e]
        lb2 = _box_gap2(lo, hi, lo[a], hi[a])
        best = np.full((e - s, kk), np.inf)
        idx = np.full((e - s, kk), -1, dtype=np.int64)
        q_sq = sq[s:e].astype(np.float64)
        slack = ABS_SLACK * (q_sq.max() + sq_max)
        for b in np.argsort(lb2, kind="stable"):
            # best holds ||x||^2 - 2 <q, x>: add ||q||^2 for the squared k-th distance; every
            # row of a farther cell is farther than every query row's k-th neighbour
            kth2 = (1.0 + SLACK) * (best[:, k_own - 1] + q_sq) + slack
            if lb2[b] > kth2.max():
                break
            # the rows that cell b can still serve: own projection within their k-th distance
            rows = np.flatnonzero(_box_gap2(pq, pq, lo[b], hi[b]) <= kth2)
            c, f = bounds[b], bounds[b + 1]
            if len(rows) == e - s:
                _select_k(q @ Xs[c:f].T, sq[c:f], c, best, idx)
            elif len(rows):
                part_best, part_idx = best[rows], idx[rows]
                _select_k(q[rows] @ Xs[c:f].T, sq[c:f], c, part_best, part_idx)
                best[rows], idx[rows] = part_best, part_idx
        own = order[s:e] if exclude_self else order[:0]
        d, i = _rerank_labelled(q.astype(np.float64), Xs, idx, k, order, own)
        out_d.append(d)
        out_i.append(i)
    return np.vstack(out_d), np.vstack(out_i)


def cell_kneighbors(X: Any, k: int, exclude_self: bool, *, client: Any,
                    random_state: Any = 0) -> tuple[np.ndarray, np.ndarray]:
    """k nearest neighbours of every row of X among its rows, by the pruned cell search.

    Parameters
    ----------
    X : ndarray or dask array of shape (T, N)
    k : int
    exclude_self : bool
        A row is not its own neighbour (``kneighbors`` without ``query``).
    client : distributed.Client or None
    random_state : int, RandomState or None
        Seeds the rows sampled for the principal axes (the result does not depend on it).

    Returns
    -------
    distances, indices : ndarrays of shape (T, k)
        As :func:`dr_dask.graph.knn.kneighbors`; distances between the centred rows rounded
        to float32 (relative error ~1e-7 of the data's spread).
    """
    X32 = _centred_float32(X, client)
    _check_finite(X32, 0, "X")
    T = X32.shape[0]
    p = min(N_PROJ, X32.shape[1])
    axes = _principal_axes(X32, p, check_random_state(random_state))
    P = np.empty((T, p))
    for s in range(0, T, BLOCK):
        P[s:s + BLOCK] = X32[s:s + BLOCK] @ axes
    order, bounds = _cells(P, LEAF_SIZE)
    starts = bounds[:-1]
    Ps = P[order]
    del P
    lo = np.minimum.reduceat(Ps, starts, axis=0)
    hi = np.maximum.reduceat(Ps, starts, axis=0)
    Xs = np.ascontiguousarray(X32[order])
    del X32
    sq = np.einsum("ij,ij->i", Xs, Xs)
    kk = min(k + exclude_self + EXTRA, T)
    n_cells = len(starts)
    logger.debug("cell kNN: T=%d in %d cells, projection on %d axes", T, n_cells, p)
    if client is not None:  # recomputable if its worker dies (scattered data is not)
        data = [share(a, client) for a in (Xs, sq, Ps, order)]
    else:
        data = [dask.delayed(a, traverse=False) for a in (Xs, sq, Ps, order)]
    task = dask.delayed(_cell_task, pure=True)
    groups = [range(c, min(c + CELLS_PER_TASK, n_cells))
              for c in range(0, n_cells, CELLS_PER_TASK)]
    tasks = [task(data[0], data[1], data[2], lo, hi, bounds, data[3], g, kk, k, exclude_self)
             for g in groups]
    # many small GEMMs in parallel threads: BLAS's own threads would only oversubscribe the
    # cores, 50x slower on a loaded machine (dask's workers get one thread from their nanny)
    with single_blas_thread():
        parts = compute(*tasks, client=client)
    dist = np.empty((T, k))
    idx = np.empty((T, k), dtype=np.int64)
    rows = order[np.concatenate([np.arange(bounds[g[0]], bounds[g[-1] + 1]) for g in groups])]
    dist[rows] = np.vstack([d for d, _ in parts])
    idx[rows] = np.vstack([i for _, i in parts])
    return dist, idx
