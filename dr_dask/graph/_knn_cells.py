"""The cell search behind ``kneighbors(algorithm="cells")``: float32 GEMM over pruned cells.

Brute force costs T^2 N. Here the rows are projected on their top ``N_PROJ`` principal axes
(an orthogonal projection never lengthens a distance, so the distance between two cells'
bounding boxes in the projection is a rigorous lower bound on every distance between their
rows) and cut into cells of at most
``dr_dask.knn.cells-leaf-size`` rows by median splits of the widest projected
coordinate (the leaves of a k-d tree). A query cell visits the cells in increasing order of
that bound, folding float32 GEMM tiles into running top-k lists with the brute-force kernel,
and stops once the bound exceeds every row's current k-th distance. Within a visited cell only
the query rows whose own projection is within their k-th distance of the cell's box take part
in the GEMM (the bound from a point is tighter than from the query cell's box, so fewer row-cell
products pass it). The kept candidates (a few
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

from dr_dask.graph.topk import EXTRA, check_finite, fold_knn, rerank_labelled
from dr_dask.linalg.eigen import top_eigh
from dr_dask.runtime import config
from dr_dask.runtime.blas import single_blas_thread
from dr_dask.runtime.cluster import compute, share

logger = logging.getLogger(__name__)

#: Principal axes of the projection that bounds distances between cells.
N_PROJ = 8
#: Rows sampled to estimate the principal axes, at most ``PCA_SAMPLE_BYTES`` of float64 (the
#: axes only tighten the bounds; the result is exact whatever they are).
PCA_SAMPLE = 20_000
PCA_SAMPLE_BYTES = 16 << 20
#: Relative slack on the stopping bound for float32 rounding of the squared distances.
SLACK = 1e-3
#: Absolute slack, per unit of squared norm: float32 rounding of ``||x||^2 - 2 <q, x>``.
ABS_SLACK = 64 * float(np.finfo(np.float32).eps)
#: Rows per step of the in-process passes over X.
BLOCK = 1 << 16


def _finite_mean(X: Any, client: Any) -> np.ndarray:
    """Column means of X over its finite entries (so that a non-finite row stays the only one
    non-finite after centring, and the error names it alone)."""
    if isinstance(X, da.Array):
        X = X.astype(np.float64)
        (mean,) = compute(da.where(da.isfinite(X), X, 0.0).mean(axis=0), client=client)
        return mean
    mean = np.zeros(X.shape[1])
    for s in range(0, X.shape[0], BLOCK):  # no T x N float64 temporary
        b = X[s:s + BLOCK]
        mean += np.where(np.isfinite(b), b, 0.0).sum(axis=0)
    return mean / X.shape[0]


def _principal_axes(X: Any, mean: np.ndarray, p: int, rng: np.random.RandomState,
                    client: Any) -> np.ndarray:
    """(N, p) top principal axes of a sample of the centred rows."""
    T, N = X.shape
    n = min(PCA_SAMPLE, T, max(8 * p, PCA_SAMPLE_BYTES // (8 * N)))
    S = X[np.sort(rng.choice(T, n, replace=False))]
    if isinstance(S, da.Array):
        (S,) = compute(S, client=client)
    S = np.array(S, np.float64)
    S -= mean
    S[~np.isfinite(S)] = 0.0  # a non-finite row is reported by _project
    return top_eigh(S.T @ S, p, method="dense").vectors


def _project(block: np.ndarray, offset: int, mean: np.ndarray, axes: np.ndarray) -> np.ndarray:
    """Projections (b, p) of the centred float32 rows of ``block`` (checked finite)."""
    check_finite(block, offset, "X")
    return _centred(block, mean) @ axes


def _project_block(block: np.ndarray, mean: np.ndarray, axes: np.ndarray,
                   block_info: dict | None = None) -> np.ndarray:
    assert block_info is not None
    return _project(block, block_info[0]["array-location"][0][0], mean, axes)


def _centred(block: np.ndarray, mean: np.ndarray) -> np.ndarray:
    """``block - mean`` in float32: rounding relative to the data's spread, not its offset."""
    return (np.asarray(block, np.float64) - mean).astype(np.float32)


def _sorted_rows(blocks: list, starts: list[int], order: np.ndarray) -> np.ndarray:
    """The rows of ``blocks`` (offsets ``starts``) in cell ``order``, as one array."""
    T = int(starts[-1])
    rank = np.empty(T, dtype=np.int64)
    rank[order] = np.arange(T)
    out = np.empty((T, blocks[0].shape[1]), dtype=blocks[0].dtype)
    for b, s in zip(blocks, starts):
        out[rank[s:s + len(b)]] = b
    return out


def _row_sq(Xs: np.ndarray) -> np.ndarray:
    return np.einsum("ij,ij->i", Xs, Xs)


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
                fold_knn(q, Xs[c:f], sq[c:f], c, best, idx)
            elif len(rows):
                part_best, part_idx = best[rows], idx[rows]
                fold_knn(q[rows], Xs[c:f], sq[c:f], c, part_best, part_idx)
                best[rows], idx[rows] = part_best, part_idx
        own = order[s:e] if exclude_self else order[:0]
        d, i = rerank_labelled(q.astype(np.float64), Xs, idx, k, order, own)
        out_d.append(d)
        out_i.append(i)
    return np.vstack(out_d), np.vstack(out_i)


def cell_kneighbors(X: Any, k: int, exclude_self: bool, *, client: Any,
                    random_state: Any = 0, in_memory: np.ndarray | None = None,
                    ) -> tuple[np.ndarray, np.ndarray]:
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
    in_memory : ndarray of shape (T, N), optional
        X's rows in this process's memory when X is a NumPy input staged for the workers: the
        mean, the principal axes and the projection are read from it here, as with no
        client, where on the staged rows they took three round trips to the workers (1 s of
        2.5 at T=10^4, N=1,000 on a fresh LocalCluster); the workers still sort the rows.

    Returns
    -------
    distances, indices : ndarrays of shape (T, k)
        As :func:`dr_dask.graph.knn.kneighbors`; distances between the centred rows rounded
        to float32 (relative error ~1e-7 of the data's spread).
    """
    T, N = X.shape
    p = min(N_PROJ, N)
    here = X if in_memory is None else in_memory
    mean = _finite_mean(here, client)
    from sklearn.utils import check_random_state  # lazy: not on workers (__init__)

    axes = _principal_axes(here, mean, p, check_random_state(random_state), client)
    if isinstance(here, da.Array):
        X = X.rechunk({1: -1})
        (P,) = compute(X.map_blocks(_project_block, mean, axes, chunks=(X.chunks[0], (p,)),
                                    dtype=np.float64), client=client)
    else:
        P = np.empty((T, p))
        for s in range(0, T, BLOCK):
            P[s:s + BLOCK] = _project(here[s:s + BLOCK], s, mean, axes)
    order, bounds = _cells(P, int(config.get("knn.cells-leaf-size")))
    starts = bounds[:-1]
    Ps = P[order]
    del P
    lo = np.minimum.reduceat(Ps, starts, axis=0)
    hi = np.maximum.reduceat(Ps, starts, axis=0)
    if isinstance(X, da.Array):
        # each block is centred where it lives, then one task sorts the float32 rows: this
        # process never holds them (a copy here and another in the scheduler's graph cost
        # 0.8 GB at T=10^6, N=100), and only float32 blocks travel
        Xc = da.map_blocks(_centred, X, mean, dtype=np.float32)
        Xs: Any = dask.delayed(_sorted_rows, pure=True)(
            list(Xc.to_delayed().ravel()), [0, *np.cumsum(X.chunks[0]).tolist()], order)
    else:
        Xs = np.empty((T, N), dtype=np.float32)
        for s in range(0, T, BLOCK):
            Xs[s:s + BLOCK] = _centred(X[order[s:s + BLOCK]], mean)
    Xs, Ps, order_d = (
        a if not isinstance(a, np.ndarray)
        else share(a, client) if client is not None  # recomputable if its worker dies
        else dask.delayed(a, traverse=False)
        for a in (Xs, Ps, order))
    sq = dask.delayed(_row_sq, pure=True)(Xs)
    kk = min(k + exclude_self + EXTRA, T)
    n_cells = len(starts)
    logger.debug("cell kNN: T=%d in %d cells, projection on %d axes", T, n_cells, p)
    task = dask.delayed(_cell_task, pure=True)
    per_task = int(config.get("knn.cells-per-task"))
    groups = [range(c, min(c + per_task, n_cells)) for c in range(0, n_cells, per_task)]
    tasks = [task(Xs, sq, Ps, lo, hi, bounds, order_d, g, kk, k, exclude_self) for g in groups]
    # many small GEMMs in parallel threads: BLAS's own threads would only oversubscribe the
    # cores (dask's workers get one thread from their nanny)
    with single_blas_thread():
        parts = compute(*tasks, client=client)
    dist = np.empty((T, k))
    idx = np.empty((T, k), dtype=np.int64)
    rows = order[np.concatenate([np.arange(bounds[g[0]], bounds[g[-1] + 1]) for g in groups])]
    dist[rows] = np.vstack([d for d, _ in parts])
    idx[rows] = np.vstack([i for _, i in parts])
    return dist, idx
