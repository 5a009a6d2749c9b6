"""Maximal cliques by Bron–Kerbosch with pivoting, compiled with numba on bitsets.

Blockwise IKD (Li & Wu 2024, §2.4) needs the maximal cliques of the graph
``s_ij > s0``. The authors' code runs a recursive NumPy Bron–Kerbosch (BKv2, pivot = the vertex
of P ∪ X with most neighbours in P), capped at ``max_n_cliques``. Here the same search runs
iteratively in numba on adjacency bitsets (one uint64 word per 64 vertices), so every set
operation is a few word ANDs and popcounts. As the paper asks, the search can stop as soon as
the kept cliques cover every vertex; the cap bounds the worst case (Bron–Kerbosch is
exponential in general).
"""

from __future__ import annotations

import logging

import numba
import numpy as np

logger = logging.getLogger(__name__)

_M1 = np.uint64(0x5555555555555555)
_M2 = np.uint64(0x3333333333333333)
_M4 = np.uint64(0x0F0F0F0F0F0F0F0F)
_H01 = np.uint64(0x0101010101010101)


@numba.njit(cache=True, inline="always")
def _popcount(x):
    # SWAR popcount: numba has no portable intrinsic for it
    x = x - ((x >> np.uint64(1)) & _M1)
    x = (x & _M2) + ((x >> np.uint64(2)) & _M2)
    x = (x + (x >> np.uint64(4))) & _M4
    return np.int64((x * _H01) >> np.uint64(56))


@numba.njit(cache=True, inline="always")
def _bit_index(low):
    # position of the single set bit of ``low``: the count of the ones below it
    return _popcount(low - np.uint64(1))


@numba.njit(cache=True)
def _count_and(a, b):
    total = 0
    for w in range(a.shape[0]):
        total += _popcount(a[w] & b[w])
    return total


@numba.njit(cache=True)
def _is_empty(a):
    for w in range(a.shape[0]):  # noqa: SIM110  (compiled: numba has no all() of a generator)
        if a[w] != 0:
            return False
    return True


@numba.njit(cache=True)
def _pivot_candidates(adj, P, X, C):
    """C = P minus N(u) for the pivot u of P ∪ X with the most neighbours in P."""
    W = P.shape[0]
    best, pivot = -1, -1
    for w in range(W):
        word = P[w] | X[w]
        while word != 0:
            low = word & (~word + np.uint64(1))
            u = w * 64 + _bit_index(low)
            c = _count_and(P, adj[u])
            if c > best:
                best, pivot = c, u
            word ^= low
    for w in range(W):
        C[w] = P[w] & ~adj[pivot, w]


@numba.njit(cache=True)
def _pop_lowest(C):
    """Index of the lowest set bit of C (cleared), or -1."""
    for w in range(C.shape[0]):
        word = C[w]
        if word != 0:
            low = word & (~word + np.uint64(1))
            C[w] = word ^ low
            return w * 64 + _bit_index(low)
    return -1


@numba.njit(cache=True)
def _bron_kerbosch(  # noqa: C901  (one compiled loop: a helper in its inner loop costs a call)
        adj, n, max_cliques, min_size, stop_when_covered):
    W = adj.shape[1]
    R = np.zeros((n + 2, W), dtype=np.uint64)
    P = np.zeros((n + 2, W), dtype=np.uint64)
    X = np.zeros((n + 2, W), dtype=np.uint64)
    C = np.zeros((n + 2, W), dtype=np.uint64)
    size = np.zeros(n + 2, dtype=np.int64)
    covered = np.zeros(W, dtype=np.uint64)
    for v in range(n):
        P[0, v // 64] |= np.uint64(1) << np.uint64(v % 64)
    members = np.empty(max(1, max_cliques) * 64, dtype=np.int64)
    offsets = np.zeros(max_cliques + 1, dtype=np.int64)
    n_found = 0
    n_covered = 0
    done = n == 0
    if not done:
        _pivot_candidates(adj, P[0], X[0], C[0])
    depth = 0
    while depth >= 0 and not done:
        v = _pop_lowest(C[depth])
        if v < 0:
            depth -= 1
            continue
        w, b = v // 64, np.uint64(1) << np.uint64(v % 64)
        P[depth, w] &= ~b
        d1 = depth + 1
        for k in range(W):
            R[d1, k] = R[depth, k]
            P[d1, k] = P[depth, k] & adj[v, k]
            X[d1, k] = X[depth, k] & adj[v, k]
        R[d1, w] |= b
        size[d1] = size[depth] + 1
        X[depth, w] |= b  # v is done at this level: later siblings must not re-report it
        if _is_empty(P[d1]):
            if _is_empty(X[d1]) and size[d1] >= min_size:
                start = offsets[n_found]
                if start + size[d1] > members.shape[0]:
                    grown = np.empty(max(2 * members.shape[0], start + size[d1]), np.int64)
                    grown[:start] = members[:start]
                    members = grown
                pos = start
                for k in range(W):
                    word = R[d1, k]
                    while word != 0:
                        low = word & (~word + np.uint64(1))
                        members[pos] = k * 64 + _bit_index(low)
                        pos += 1
                        word ^= low
                    new = R[d1, k] & ~covered[k]
                    n_covered += _popcount(new)
                    covered[k] |= R[d1, k]
                n_found += 1
                offsets[n_found] = pos
                if n_found >= max_cliques or (stop_when_covered and n_covered >= n):
                    done = True
            continue
        depth = d1
        _pivot_candidates(adj, P[depth], X[depth], C[depth])
    return members[: offsets[n_found]], offsets[: n_found + 1], n_covered


def adjacency_bitsets(adjacency: np.ndarray) -> np.ndarray:
    """Pack a boolean (T, T) adjacency matrix into rows of uint64 words (bit v of row u)."""
    A = np.asarray(adjacency, dtype=bool)
    T = A.shape[0]
    W = max(1, (T + 63) // 64)
    padded = np.zeros((T, W * 64), dtype=bool)
    padded[:, :T] = A
    # little-endian bit order inside each byte, bytes in little-endian word order
    return np.packbits(padded, axis=1, bitorder="little").view("<u8").astype(np.uint64)


def maximal_cliques(
    adjacency: np.ndarray,
    *,
    max_cliques: int = 500,
    min_size: int = 1,
    stop_when_covered: bool = True,
) -> list[np.ndarray]:
    """Maximal cliques of an undirected graph, Bron–Kerbosch with pivoting (Tomita's rule).

    Parameters
    ----------
    adjacency : ndarray of shape (T, T), bool
        Symmetric adjacency; the diagonal is ignored.
    max_cliques : int
        Stop after this many cliques of at least ``min_size`` vertices (the authors' cap, 500).
    min_size : int
        Cliques smaller than this are neither reported nor counted (blockwise IKD drops
        cliques of fewer than M + 2 points).
    stop_when_covered : bool
        Stop as soon as the reported cliques cover every vertex (the paper's early stop).

    Returns
    -------
    list of ndarray
        Sorted vertex indices of each clique, in discovery order (lowest vertices first, as
        the recursive search of the authors' code visits them).
    """
    A = np.asarray(adjacency, dtype=bool)
    if A.ndim != 2 or A.shape[0] != A.shape[1]:
        raise ValueError(f"adjacency must be square, got shape {A.shape}")
    if not np.array_equal(A, A.T):
        raise ValueError("adjacency must be symmetric (an undirected graph)")
    if int(max_cliques) < 1:
        raise ValueError(f"max_cliques must be a positive integer, got {max_cliques!r}")
    A = A.copy()
    np.fill_diagonal(A, False)
    T = A.shape[0]
    members, offsets, n_covered = _bron_kerbosch(
        adjacency_bitsets(A), T, int(max_cliques), int(min_size), bool(stop_when_covered)
    )
    cliques = [members[offsets[i] : offsets[i + 1]] for i in range(len(offsets) - 1)]
    logger.debug("Bron–Kerbosch: %d cliques cover %d of %d vertices", len(cliques), n_covered, T)
    return cliques
