"""Geodesics of new points through their graph neighbours: the out-of-sample hot path of
GP-Isomap and of the landmark triangulations."""

from __future__ import annotations

import numba
import numpy as np


def geodesics_via_neighbors(
    dist_to_nbrs: np.ndarray,
    nbr_idx: np.ndarray,
    geodesic_rows: np.ndarray,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Geodesics of new points through their graph neighbours.

    ``g[q, i] = min_j (dist_to_nbrs[q, j] + geodesic_rows[nbr_idx[q, j], i])``.

    Parameters
    ----------
    dist_to_nbrs : ndarray of shape (Q, k)
        Distances (or edge weights) from each new point to its neighbours; ``inf`` marks padding.
    nbr_idx : ndarray of shape (Q, k)
        Row indices into ``geodesic_rows`` (a batch of rows, e.g. the unique neighbours).
    geodesic_rows : ndarray of shape (n_batch, n_cols)
        Geodesics from those neighbours to the n_cols targets.
    out : ndarray of shape (Q, n_cols), float64, C-contiguous, optional
        Where to write the result: hot loops reuse one buffer instead of allocating per call.

    Returns
    -------
    ndarray of shape (Q, n_cols), float64
    """
    dist_to_nbrs = np.asarray(dist_to_nbrs, dtype=np.float64)
    nbr_idx = np.asarray(nbr_idx)
    if dist_to_nbrs.shape != nbr_idx.shape or dist_to_nbrs.ndim != 2:
        raise ValueError(f"dist_to_nbrs {dist_to_nbrs.shape} and nbr_idx {nbr_idx.shape} must "
                         "be equal (Q, k)")
    rows = np.ascontiguousarray(geodesic_rows)
    shape = (dist_to_nbrs.shape[0], rows.shape[1])
    if out is None:
        out = np.empty(shape, dtype=np.float64)
    elif out.shape != shape or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float64 array of shape {shape}")
    _min_plus(dist_to_nbrs, nbr_idx.astype(np.int64, copy=False), rows, out)
    return out


@numba.njit(cache=True, nogil=True)
def _min_plus(dist: np.ndarray, idx: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """The min-plus product of the mapping hot path, fused: no (Q, k, n) temporary, one sweep
    over each neighbour row. Serial on purpose: dask already runs chunks in parallel, and
    numba's parallel layer must not be entered from several dask threads at once."""
    n = rows.shape[1]
    for q in range(dist.shape[0]):
        o = out[q]
        o[:] = np.inf
        for j in range(dist.shape[1]):
            d, r = dist[q, j], idx[q, j]
            if r < 0 or not np.isfinite(d):
                continue  # padding
            row = rows[r]
            for i in range(n):  # branch-free so it vectorises
                o[i] = min(o[i], d + row[i])
