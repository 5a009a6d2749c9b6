"""Top-k primitives shared by every neighbour search: running k-best selection over tiles of
inner products, and the exact float64 re-rank of float32 candidates."""

from __future__ import annotations

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


@numba.njit(cache=True, nogil=True)
def select_k(inner: np.ndarray, sq: np.ndarray, col0: int, best: np.ndarray,
              idx: np.ndarray) -> None:
    """Fold one (rows, cols) tile of inner products into each row's running k best.

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
                p = k - 1
                while p > 0 and b[p - 1] > v:
                    b[p] = b[p - 1]
                    ix[p] = ix[p - 1]
                    p -= 1
                b[p] = v
                ix[p] = col0 + j
                worst = b[k - 1]


def fold_knn(query: np.ndarray, data: np.ndarray, sq: np.ndarray, col0: int, best: np.ndarray,
             idx: np.ndarray, tile: tuple[int, int] = BRUTE_TILE) -> None:
    """Fold every (query, data) inner product into the running top-k lists ``best``, ``idx``
    (Q, kk): data row j is candidate ``col0 + j``, ``sq`` its ``||data[j]||^2`` (float64).

    The products are computed in tiles of at most ``tile`` (query rows, data rows), split
    evenly, so that each tile's block of inner products stays in cache while :func:`select_k`
    reads it (an inverted list's whole block, thousands of queries by a thousand rows, ran the
    GEMM at about half speed); one buffer serves every tile. Tiles arrive in column order for
    every row, so ties still go to the smaller index and the result is the untiled one.
    """
    m, n = query.shape[0], data.shape[0]
    if not m or not n:
        return
    rows, cols = even_width(m, tile[0]), even_width(n, tile[1])  # a thin tile: a slow GEMM
    buf = thread_buffer("inner_products", (rows * cols,), np.result_type(query.dtype, data.dtype))
    for s in range(0, m, rows):
        e = min(s + rows, m)
        for c in range(0, n, cols):
            f = min(c + cols, n)
            inner = buf[: (e - s) * (f - c)].reshape(e - s, f - c)
            np.matmul(query[s:e], data[c:f].T, out=inner)
            select_k(inner, sq[c:f], col0 + c, best[s:e], idx[s:e])


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
