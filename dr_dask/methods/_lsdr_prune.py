"""LSDR's skeleton pruning (Roy 2021, Algorithm 1, step 1): each vertex keeps the edges whose
length passes a Beta test against its other edges (docs/decisions.md LSDR-F6), repeated until
nothing changes; the protected edges (a spanning tree) keep the skeleton connected."""

from __future__ import annotations

import logging

import numpy as np
from scipy.stats import beta as beta_dist

logger = logging.getLogger(__name__)

#: Cap of the passes over the vertices in removal (the fixed point is normally reached in < 10).
_MAX_PASSES = 100


def edge_ids(codes_sorted: np.ndarray, a: np.ndarray, b: np.ndarray, n: int) -> np.ndarray:
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    return np.searchsorted(codes_sorted, lo.astype(np.int64) * n + hi)


def _beta_quantiles(alpha: float, p: float, max_deg: int) -> np.ndarray:
    """q[deg] = Beta(p/2, (deg-1) p/2).ppf(alpha) (the text's null, docs/decisions.md LSDR-F6);
    q[0..1] = inf."""
    q = np.full(max_deg + 1, np.inf)
    degs = np.arange(2, max_deg + 1)
    q[2:] = beta_dist.ppf(alpha, p / 2.0, (degs - 1) * p / 2.0)
    return q


def prune_edges(
    edges: np.ndarray, w: np.ndarray, protected: np.ndarray, n: int, alpha: float, null_dim: float,
    removal: str = "in_place", max_passes: int | None = None,
) -> tuple[np.ndarray, int]:
    """Per-vertex Beta pruning of graph edges (Algorithm 1, step 1).

    Parameters
    ----------
    edges : ndarray of shape (m, 2)
    w : ndarray of shape (m,)
        Edge lengths.
    protected : ndarray of shape (m,), bool
        Edges never removed (the minimum spanning tree).
    n : int
        Number of vertices.
    alpha : float
        Level of the Beta quantile.
    null_dim : float
        p of the null ``Beta(p/2, (deg-1) p/2)``.
    removal : {"in_place", "sweep"}
        ``in_place``: vertices in index order, each seeing the removals of the previous ones
        (the literal reading); ``sweep``: all vertices tested on the same graph, removals
        applied together.
    max_passes : int, optional
        Passes over the vertices; default: repeat until no edge is removed.

    Returns
    -------
    alive : ndarray of shape (m,), bool
    n_passes : int
    """
    m = edges.shape[0]
    alive = np.ones(m, dtype=bool)
    w2 = w * w
    cap = _MAX_PASSES if max_passes is None else int(max_passes)
    deg0 = np.bincount(edges.ravel(), minlength=n)
    q = _beta_quantiles(alpha, null_dim, int(deg0.max()))
    # incidence lists: for vertex v, the edge ids inc[ptr[v]:ptr[v+1]]
    ends = edges.ravel()
    order = np.argsort(ends, kind="stable")
    inc = order // 2
    ptr = np.concatenate([[0], np.cumsum(deg0)])
    n_passes = 0
    for n_passes in range(1, cap + 1):
        before = int(alive.sum())
        if removal == "sweep":
            live = np.nonzero(alive)[0]
            a, b = edges[live, 0], edges[live, 1]
            S = np.bincount(a, w2[live], n) + np.bincount(b, w2[live], n)
            deg = np.bincount(a, minlength=n) + np.bincount(b, minlength=n)
            with np.errstate(divide="ignore", invalid="ignore"):
                cut = (w2[live] / S[a] > q[deg[a]]) | (w2[live] / S[b] > q[deg[b]])
            alive[live[cut & ~protected[live]]] = False
        else:
            for v in range(n):
                e = inc[ptr[v]:ptr[v + 1]]
                e = e[alive[e]]
                if e.size < 2:
                    continue
                t = w2[e] / w2[e].sum()
                alive[e[(t > q[e.size]) & ~protected[e]]] = False
        removed = before - int(alive.sum())
        logger.debug("pruning pass %d removed %d edges", n_passes, removed)
        if removed == 0:
            break
    else:
        if max_passes is None:
            logger.warning("edge pruning still changing after %d passes", cap)
    return alive, n_passes
