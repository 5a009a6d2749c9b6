"""Symmetric neighbour graphs in one process: from neighbour lists (:func:`graph_from_neighbors`)
or from the rows themselves by the k or the epsilon rule (:func:`kneighbors_graph`, whose k rule
runs the package's one kNN, :func:`dr_dask.graph.knn.kneighbors`). The partitioned graph of
:mod:`dr_dask.graph.partitioned` is the same assembly done block by block on the workers."""

from __future__ import annotations

import logging
from typing import Any

import dask
import numba
import numpy as np
import scipy.sparse as sp

from dr_dask.graph.knn import (
    Metric,
    check_2d,
    count_rows,
    default_block,
    dense_block,
    estimator_neighbours,
    row_blocks,
)
from dr_dask.graph.topk import check_finite
from dr_dask.io.validation import warn_duplicates
from dr_dask.runtime.cluster import active_client, compute

logger = logging.getLogger(__name__)

#: Smallest positive float64: the weight given to zero-length edges so that sparse graph
#: algorithms still see them as edges (an explicit 0 is dropped by sparse arithmetic).
ZERO_EDGE = np.finfo(np.float64).tiny


#: Shell sort gaps (Ciura 2001, extended by x2.25), smallest first.
_GAPS = np.array([1, 4, 10, 23, 57, 132, 301, 701, 1577, 3548, 7983, 17961, 40412, 90927,
                  204585, 460316, 1035711, 2330349, 5243285, 11797391, 26544129, 59724290,
                  134379652, 302354217, 680297000, 1530668250], dtype=np.int64)


@numba.njit(cache=True, nogil=True)
def _sort_pairs(keys: np.ndarray, vals: np.ndarray, s: int, e: int) -> None:
    """Sort ``keys[s:e]`` in place, ``vals`` alongside (a shell sort: not stable, which
    merging duplicates by their maximum does not need). Not ``np.argsort``: numba compiles its
    quicksort on the first call after install, a second and a half of a 10,000-row fit."""
    n = e - s
    g = len(_GAPS) - 1
    while g > 0 and _GAPS[g] >= n:
        g -= 1
    for gi in range(g, -1, -1):
        gap = _GAPS[gi]
        for i in range(s + gap, e):
            k, v = keys[i], vals[i]
            j = i
            while j - gap >= s and keys[j - gap] > k:
                keys[j], vals[j] = keys[j - gap], vals[j - gap]
                j -= gap
            keys[j], vals[j] = k, v


@numba.njit(cache=True, nogil=True)
def _symmetric_csr(rows: np.ndarray, cols: np.ndarray, w: np.ndarray, n: int,
                   indptr: np.ndarray) -> tuple:
    """CSR arrays of the edges (i, j) and (j, i), sorted, duplicates merged by their maximum.

    A counting sort by row, then each row's columns sorted and merged in place: two arrays of
    2 M entries (M edges), where sorting (row, col) keys needs a key array and its sort's
    permutation beside them. ``indptr`` (n + 1 zeros, of the index dtype) is filled and
    returned.
    """
    for e in range(len(rows)):
        indptr[rows[e] + 1] += 1
        indptr[cols[e] + 1] += 1
    for i in range(n):
        indptr[i + 1] += indptr[i]
    fill = indptr[:-1].copy()
    idx = np.empty(indptr[n], dtype=indptr.dtype)
    dat = np.empty(indptr[n])
    for e in range(len(rows)):
        i, j = rows[e], cols[e]
        idx[fill[i]], dat[fill[i]] = j, w[e]
        fill[i] += 1
        idx[fill[j]], dat[fill[j]] = i, w[e]
        fill[j] += 1
    out = 0  # entries kept so far: never past the current row's start
    for i in range(n):
        s, e = indptr[i], indptr[i + 1]
        _sort_pairs(idx, dat, s, e)
        indptr[i] = out
        for t in range(s, e):  # writes land at or before t, on entries already read
            if out > indptr[i] and idx[out - 1] == idx[t]:
                dat[out - 1] = max(dat[out - 1], dat[t])
            else:
                idx[out], dat[out] = idx[t], dat[t]
                out += 1
    indptr[n] = out
    return indptr, idx[:out].copy(), dat[:out].copy()


def symmetric_graph(rows: np.ndarray, cols: np.ndarray, w: np.ndarray, n: int) -> sp.csr_matrix:
    """CSR graph with edges (i, j) and (j, i), duplicate edges merged by their maximum weight."""
    keep = (cols >= 0) & (cols < n) & np.isfinite(w) & (rows != cols)
    rows, cols, w = rows[keep], cols[keep], w[keep]
    if np.any(w < 0):
        raise ValueError("edge weights must be non-negative (Dijkstra needs them)")
    # explicit zeros would vanish in sparse arithmetic and cut the graph: keep them as tiny edges
    w = np.maximum(w.astype(np.float64), ZERO_EDGE)
    itype = np.int32 if max(n, 2 * len(w)) < 2**31 else np.int64  # scipy's index choice
    indptr, idx, dat = _symmetric_csr(rows.astype(itype), cols.astype(itype), w, n,
                                      np.zeros(n + 1, dtype=itype))
    return sp.csr_matrix((dat, idx, indptr), shape=(n, n))


def graph_from_neighbors(indices: np.ndarray, weights: np.ndarray, n: int) -> sp.csr_matrix:
    """Symmetric sparse graph from neighbour lists with arbitrary non-negative edge weights.

    Parameters
    ----------
    indices : ndarray of shape (m, k)
        ``indices[i, j]`` is the j-th neighbour of node i (m <= n). Negative entries are padding.
    weights : ndarray of shape (m, k)
        Edge weights (e.g. Euclidean distances, or ``-log s`` for correlations); non-finite
        entries are padding. Zero weights are kept as edges of weight ``ZERO_EDGE`` (~2e-308),
        which leaves every path length unchanged in float64.
    n : int
        Number of nodes.

    Returns
    -------
    scipy.sparse.csr_matrix of shape (n, n)
        Symmetric: an edge listed in either direction is present in both, with the larger of the
        listed weights. Self-loops are dropped.
    """
    indices = np.asarray(indices)
    weights = np.asarray(weights, dtype=np.float64)
    if indices.shape != weights.shape or indices.ndim != 2:
        raise ValueError(
            f"indices {indices.shape} and weights {weights.shape} must be equal (m, k)")
    if indices.shape[0] > n or (indices.size and indices.max() >= n):
        raise ValueError(f"neighbour lists refer to nodes beyond n={n}")
    rows = np.repeat(np.arange(indices.shape[0]), indices.shape[1])
    return symmetric_graph(rows, indices.ravel().astype(np.int64), weights.ravel(), int(n))


def _block_radius(query: np.ndarray, data: np.ndarray, radius: float, q0: int, d0: int,
                  metric: Metric | None = None):
    query, data = dense_block(query), dense_block(data)
    check_finite(data, d0, "X")
    dist, idx = (metric or Metric()).nearest(radius=radius).fit(data).radius_neighbors(query)
    counts = np.array([len(i) for i in idx])
    rows = np.repeat(np.arange(query.shape[0]) + q0, counts)
    cols = np.concatenate(idx).astype(np.int64) + d0 if counts.sum() else np.array([], np.int64)
    d = np.concatenate(dist) if counts.sum() else np.array([], np.float64)
    return rows, cols, d


def _warn_duplicates(rows: np.ndarray, cols: np.ndarray, d: np.ndarray, n: int) -> None:
    """The duplicate-point warning of the edges found at distance 0 (each point's first twin:
    the least index it is joined to at distance 0)."""
    dup = (d == 0) & (rows != cols)
    if dup.any():
        first = np.arange(n)
        np.minimum.at(first, rows[dup], cols[dup])
        np.minimum.at(first, cols[dup], rows[dup])
        warn_duplicates(first, stacklevel=3)


def kneighbors_graph(
    X: Any,
    n_neighbors: int | None,
    *,
    radius: float | None = None,
    client: Any = None,
    block_size: int | None = None,
    algorithm: str = "auto",
    search: dict | None = None,
    metric: Metric | None = None,
) -> sp.csr_matrix:
    """Symmetric, distance-weighted neighbour graph (k rule or epsilon rule).

    Parameters
    ----------
    X : ndarray or dask array of shape (T, N)
    n_neighbors : int or None
        k rule: each point is joined to its k nearest others (T*k directed edges, then
        symmetrised by the maximum). Ignored when ``radius`` is given.
    radius : float, optional
        Epsilon rule: join every pair closer than ``radius``.
    client : distributed.Client, optional
    block_size : int, optional
        Rows per block, see :func:`kneighbors`.
    algorithm : {"auto", "exact", "cells", "ivf"}
        Search of the k rule, see :func:`kneighbors`.
    search : dict, optional
        An estimator's search instead (the k rule): ``knn``, ``n_probe``, ``scratch`` and
        ``random_state`` of :func:`search_neighbours`; its estimated recall is stored back
        under ``"recall"``.
    metric : Metric, optional
        The distance (default Euclidean; see :func:`kneighbors`).

    Returns
    -------
    scipy.sparse.csr_matrix of shape (T, T)

    Warns
    -----
    DuplicatePointsWarning
        When some points coincide: they are kept, joined by zero-length edges.
    """
    X = check_2d(X, "X")
    n = count_rows(X)
    if radius is None:
        if n_neighbors is None:
            raise ValueError("give n_neighbors (k rule) or radius (epsilon rule)")
        if search is not None:
            search["metric"] = metric  # the caller's dict: the recall comes back in it too
        dist, idx = estimator_neighbours(X, n_neighbors, search, client=client,
                                         block_size=block_size, algorithm=algorithm,
                                         metric=metric)
        rows = np.repeat(np.arange(n), idx.shape[1])
        cols, d = idx.ravel(), dist.ravel()
    else:
        if not radius > 0:
            raise ValueError(f"radius must be positive, got {radius}")
        client = active_client(client)
        bs = int(block_size or default_block(n))
        off, blocks = row_blocks(X, bs, client)
        task = dask.delayed(_block_radius, pure=True)
        parts = compute(
            *[task(qb, db, float(radius), off[qi], off[di], metric)
              for qi, qb in enumerate(blocks) for di, db in enumerate(blocks)],
            client=client,
        )
        rows, cols, d = (np.concatenate([p[i] for p in parts]) for i in range(3))
    _warn_duplicates(rows, cols, d, n)
    return symmetric_graph(rows, cols, d, n)
