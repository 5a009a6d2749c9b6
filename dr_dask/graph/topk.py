"""Top-k primitives shared by every neighbour search: running k-best selection over tiles of
inner products, and the exact float64 re-rank of float32 candidates."""

from __future__ import annotations

from typing import NamedTuple

import numba
import numpy as np

from dr_dask.linalg.tiles import even_width
from dr_dask.runtime.buffers import thread_buffer

#: Float32 candidates kept beyond k for the float64 re-rank (float32 misorders near-ties);
#: shared by the brute-force and the cell search.
EXTRA = 4

#: (query rows, data rows) per GEMM tile of the brute-force search: 2 MB of inner products.
BRUTE_TILE = (256, 1024)


def check_finite(block: np.ndarray, offset: int, name: str) -> None:
    bad = ~np.isfinite(block).all(axis=1)
    if bad.any():
        rows = (np.flatnonzero(bad)[:10] + offset).tolist()
        raise ValueError(f"{name} has NaN or infinite values in rows {rows} (first 10 shown)")


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def distance(q: np.ndarray, x: np.ndarray) -> float:
    # reassociation lets the sum vectorise: serial, its latency cost 80 ns at 100 features
    acc = 0.0
    for t in range(q.shape[0]):
        diff = q[t] - x[t]
        acc += diff * diff
    return np.sqrt(acc)


@numba.njit(cache=True, nogil=True)
def rerank_labelled(query: np.ndarray, data: np.ndarray, cand: np.ndarray, k: int,
                     labels: np.ndarray, own: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each query row's k best candidates by exact float64 distance, fused: distances and a
    small insertion sort in one pass, no (Q, k, N) temporary.

    ``cand[i]`` are rows of ``data`` (negative: padding, skipped); they are reported as
    ``labels[cand]`` (empty ``labels``: as themselves), ties go to the smaller label, and the
    label ``own[i]`` is left out (empty ``own``: nothing is). Rows with fewer than k
    candidates are padded with (inf, -1).
    """
    m, c = cand.shape
    dist = np.full((m, k), np.inf)
    idx = np.full((m, k), -1, dtype=np.int64)
    d = np.empty(c)
    ix = np.empty(c, dtype=np.int64)
    for i in range(m):
        n = 0
        for j in range(c):
            r = cand[i, j]
            if r < 0:
                continue
            lab = labels[r] if labels.size else r
            if own.size and lab == own[i]:
                continue
            v = distance(query[i], data[r])
            p = n
            while p > 0 and (d[p - 1] > v or (d[p - 1] == v and ix[p - 1] > lab)):
                d[p] = d[p - 1]
                ix[p] = ix[p - 1]
                p -= 1
            d[p] = v
            ix[p] = lab
            n += 1
        for q in range(min(n, k)):  # element-wise: see sssp._heap_lanes
            dist[i, q] = d[q]
            idx[i, q] = ix[q]
    return dist, idx


NONE = np.empty(0, dtype=np.int64)


def rerank(query: np.ndarray, data: np.ndarray, cand: np.ndarray,
            k: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`rerank_labelled` with candidates reported as themselves, none left out."""
    return rerank_labelled(query, data, cand, k, NONE, NONE)


@numba.njit(cache=True, nogil=True, inline="always")
def _insert(b: np.ndarray, ix: np.ndarray, v: float, label: int) -> float:
    """Insert key ``v`` of candidate ``label`` into one sorted running list (ascending; an
    equal key stays behind: ties go to the candidate folded first); its new k-th key."""
    p = b.shape[0] - 1
    while p > 0 and b[p - 1] > v:
        b[p] = b[p - 1]
        ix[p] = ix[p - 1]
        p -= 1
    b[p] = v
    ix[p] = label
    return b[b.shape[0] - 1]


@numba.njit(cache=True, nogil=True)
def select_k(inner: np.ndarray, sq: np.ndarray, ids: np.ndarray, best: np.ndarray,
              idx: np.ndarray) -> None:
    """Fold one (rows, cols) tile of inner products into each row's running k best; column j
    is candidate ``ids[j]``.

    The key ``sq[j] - 2 inner[i, j]`` is the squared distance up to the row's constant. Each
    row keeps a sorted list of k (ascending, ties to the smaller index: tiles arrive in
    column order and only a strictly smaller key displaces), so most columns are rejected by
    one comparison.
    """
    k = idx.shape[1]
    for i in range(inner.shape[0]):
        b, ix = best[i], idx[i]
        worst = b[k - 1]  # a local: no reload from memory per column
        for j in range(inner.shape[1]):
            v = sq[j] - 2.0 * inner[i, j]
            if v < worst:
                worst = _insert(b, ix, v, ids[j])


@numba.njit(cache=True, nogil=True)
def select_k_columns(inner: np.ndarray, c0: int, sq: np.ndarray, ids: np.ndarray,
                      best: np.ndarray, idx: np.ndarray) -> None:
    """:func:`select_k` of the tile's transpose, for some columns: column ``c0 + t`` is the
    row whose running list is ``best[t]``, ``idx[t]``, and its candidates are the tile's rows
    (row i is candidate ``ids[i]``, ``sq[i]`` its squared norm), folded in row order.

    The tile is read row by row, as :func:`select_k` reads it: down each column, every
    product is a cache line of its own (a 256 x 1024 tile: 0.94 ms against 0.56 ms).
    """
    k = idx.shape[1]
    worst = np.empty(best.shape[0])
    for t in range(best.shape[0]):
        worst[t] = best[t, k - 1]
    for i in range(inner.shape[0]):
        s, label = sq[i], ids[i]
        for t in range(best.shape[0]):
            v = s - 2.0 * inner[i, c0 + t]
            if v < worst[t]:
                worst[t] = _insert(best[t], idx[t], v, label)


class Mirror(NamedTuple):
    """Data rows of a :func:`fold_knn` that are queries too, ``start`` to ``start +
    len(best)``: each also receives the query rows as candidates, from the same products."""

    start: int
    best: np.ndarray  #: (c, kk) their running lists, as ``best`` and ``idx`` of the queries
    idx: np.ndarray
    sq: np.ndarray  #: (Q,) the query rows' ``||query[i]||^2`` (float64)
    ids: np.ndarray  #: (Q,) the query rows' candidate numbers


def fold_knn(query: np.ndarray, data: np.ndarray, sq: np.ndarray, ids: int | np.ndarray,
             best: np.ndarray, idx: np.ndarray, tile: tuple[int, int] = BRUTE_TILE,
             mirror: Mirror | None = None) -> None:
    """Fold every (query, data) inner product into the running top-k lists ``best``, ``idx``
    (Q, kk): data row j is candidate ``ids[j]`` (an int: ``ids + j``), ``sq`` its
    ``||data[j]||^2`` (float64). With ``mirror``, the products also go the other way.

    The products are computed in tiles of at most ``tile`` (query rows, data rows), split
    evenly, so that each tile's block of inner products stays in cache while :func:`select_k`
    reads it (an inverted list's whole block, thousands of queries by a thousand rows, ran the
    GEMM at about half speed); one buffer serves every tile. Tiles arrive in column order for
    every row (and in row order for a mirrored column), so ties still go to the candidate
    folded first and the result is the untiled one.
    """
    m, n = query.shape[0], data.shape[0]
    if not m or not n:
        return
    if isinstance(ids, int | np.integer):
        ids = np.arange(ids, ids + n)
    rows, cols = even_width(m, tile[0]), even_width(n, tile[1])  # a thin tile: a slow GEMM
    buf = thread_buffer("inner_products", (rows * cols,), np.result_type(query.dtype, data.dtype))
    for s in range(0, m, rows):
        e = min(s + rows, m)
        for c in range(0, n, cols):
            f = min(c + cols, n)
            inner = buf[: (e - s) * (f - c)].reshape(e - s, f - c)
            np.matmul(query[s:e], data[c:f].T, out=inner)
            select_k(inner, sq[c:f], ids[c:f], best[s:e], idx[s:e])
            if mirror is not None:
                a, b = max(c, mirror.start) - mirror.start, min(f - mirror.start, len(mirror.best))
                if b > a:
                    select_k_columns(inner, mirror.start + a - c, mirror.sq[s:e],
                                     mirror.ids[s:e], mirror.best[a:b], mirror.idx[a:b])


def fold_knn_self(rows: np.ndarray, sq: np.ndarray, ids: np.ndarray, best: np.ndarray,
                  idx: np.ndarray) -> None:
    """Fold every pair of ``rows`` (each row itself included) into their running lists, each
    pair's product computed once: blocks of rows against the rows from theirs on, mirrored
    into the later rows (half :func:`fold_knn`'s GEMM of the rows against themselves)."""
    n = len(rows)
    width = even_width(n, BRUTE_TILE[0]) if n else 1
    for s in range(0, n, width):
        e = min(s + width, n)
        fold_knn(rows[s:e], rows[s:], sq[s:], ids[s:], best[s:e], idx[s:e],
                 mirror=Mirror(e - s, best[e:], idx[e:], sq[s:e], ids[s:e]))


def brute_knn(
    query: np.ndarray, data: np.ndarray, k: int, sq: np.ndarray | None = None,
    bound: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Keys and indices (Q, k) of the k nearest data rows: GEMM tiles folded into top-k lists
    (:func:`fold_knn`).

    The key is the squared distance minus ``||query[i]||^2``; the GEMMs run in the rows'
    dtype (float32 or float64), ``sq`` (``||data[j]||^2`` in float64) may be precomputed.
    With ``bound`` (Q,) only rows whose key is below ``bound[i]`` are kept (padding:
    ``bound[i]``, -1): the lists start full of it, so every other row costs one comparison
    where a wide k would otherwise insert many.
    """
    if sq is None:
        sq = np.einsum("ij,ij->i", data, data, dtype=np.float64)
    best = np.empty((query.shape[0], k))
    best[:] = np.inf if bound is None else bound[:, None]
    idx = np.full((query.shape[0], k), -1, dtype=np.int64)
    fold_knn(query, data, sq, 0, best, idx)
    return best, idx
