"""``dr-dask bench knn-floor``: the least a neighbour search must scan to hold its distance error.

On the sinusoid with noise in every feature, which rows are a row's k nearest is decided by the
noise; how far they are is not (:mod:`dr_dask.graph.knn_tol`). An index can narrow the search
to the rows near a row on the manifold, but not further: what makes one of them nearer than
another is noise it cannot know without computing the distance. The floor here is the search
of an *oracle* index that knows the latent coordinate of every row: for each of ``queries``
seeded rows it scans the others in order of latent distance, and its k-th found neighbour's
distance error after m rows is that of the k nearest among them (exact float64 distances).

Two oracles are reported per tolerance, as shares of T scanned per row:

- ``uniform``: the same share for every row (a fixed probe) whose mean distance error is the
  tolerance;
- ``allocated``: the shares that reach the tolerance on the mean with the fewest rows in all
  (each row's share chosen at the same marginal error per row scanned, as an adaptive probe
  that knew every row's error curve would).

The floor of the whole search is ``allocated`` x T^2 distances of N features (2N flops each),
and its seconds at this machine's float32 GEMM rate on distance blocks, measured in the same
run. No index that narrows by the manifold does better than its oracle: the figure bounds the
search stage of a fit at this tolerance from below.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

import numpy as np

from dr_dask.bench._common import bench_workdir, dataset_arrays

logger = logging.getLogger(__name__)

TOLERANCES = (0.001, 0.003, 0.01)
#: Scanned prefixes at which each row's error is evaluated: log-spaced from k rows to this
#: share of T (the latent window of the true neighbours holds 2-3 % of the rows).
MAX_SHARE = 0.15
GRID = 80


def _error_curve(d: np.ndarray, order: np.ndarray, k: int, grid: np.ndarray) -> np.ndarray:
    """The k-th found neighbour's relative distance error after scanning ``order[:m]``, for
    each m of ``grid`` (ascending)."""
    exact = np.partition(d, k - 1)[k - 1]
    scanned = d[order[:grid[-1]]]
    return np.array([np.partition(scanned[:m], k - 1)[k - 1] / exact - 1.0 for m in grid])


def _allocated_share(errors: np.ndarray, grid: np.ndarray, tol: float, T: int) -> float:
    """The fewest rows (mean share of T per row) whose mean error is at most ``tol``: each
    row takes the m minimising m + lam * error(m), lam bisected (a Lagrangian allocation)."""

    def take(lam: float) -> tuple[float, float]:
        pick = np.argmin(grid[None, :] + lam * errors, axis=1)
        rows = np.arange(len(errors))
        return float(errors[rows, pick].mean()), float(grid[pick].mean())

    lo, hi = 0.0, 1.0
    while take(hi)[0] > tol and hi < 1e18:
        hi *= 10
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if take(mid)[0] > tol else (lo, mid)
    return take(hi)[1] / T


def _uniform_share(errors: np.ndarray, grid: np.ndarray, tol: float, T: int) -> float:
    """The smallest common prefix whose mean error is at most ``tol`` (share of T)."""
    ok = np.flatnonzero(errors.mean(axis=0) <= tol)
    return float(grid[ok[0]]) / T if len(ok) else float("nan")


def _gemm_gflops(N: int, seconds: float = 1.0) -> float:
    """This machine's float32 GEMM rate on distance blocks (rows x N times N x rows), at the
    most favourable of a few block sizes: a floor takes the fastest rate the search could."""
    rng = np.random.default_rng(0)
    best = 0.0
    for rows in (512, 1024, 2048):
        a, b = rng.random((rows, N), np.float32), rng.random((N, rows), np.float32)
        a @ b
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            a @ b
            n += 1
        best = max(best, n * 2 * rows * rows * N / (time.perf_counter() - t0) / 1e9)
    return best


def run_knn_floor(T: int = 1_000_000, *, queries: int = 150, k: int = 10,
                  tolerances: tuple[float, ...] = TOLERANCES, noise: float = 0.1,
                  workdir: str | None = None) -> dict:
    """The oracle index's scan on the sinusoid (N = 100) at each tolerance (see the module).

    Parameters
    ----------
    T : int
        Rows of the sinusoid.
    queries : int
        Seeded rows whose error curves are measured (each costs a pass over all T rows).
    k : int
        Neighbours per row.
    tolerances : tuple of float
        Distance errors (the fits' ``knn_tol``).
    noise : float
        The sinusoid's noise in every feature.
    workdir : str, optional
        Where the dataset is kept (default a temporary directory).

    Returns
    -------
    dict
        ``window_share``: the median share of T in the latent window of a row's true k
        nearest; per tolerance the ``uniform`` and ``allocated`` shares, the floor's flops and
        its seconds at ``gemm_gflops_float32``; the settings and the load averages.
    """
    with bench_workdir(workdir, "knn_floor") as workdir:
        X, latent = dataset_arrays(workdir, "sinusoidal", T, 100, noise=noise)
        X = np.asarray(X, dtype=np.float64)
        latent = np.asarray(latent, dtype=np.float64).reshape(T, -1)[:, 0]
        out: dict[str, Any] = {"T": T, "N": X.shape[1], "k": k, "queries": queries,
                               "noise": noise, "load_average_before": os.getloadavg()}
        grid = np.unique(np.geomspace(k, max(k + 1, MAX_SHARE * T), GRID).astype(np.int64))
        sq = np.einsum("ij,ij->i", X, X)
        rows = np.random.default_rng(1).choice(T, queries, replace=False)
        errors, windows = np.empty((queries, len(grid))), np.empty(queries)
        t0 = time.perf_counter()
        for i, q in enumerate(rows):
            d = np.sqrt(np.maximum(sq + sq[q] - 2 * (X @ X[q]), 0.0))
            d[q] = np.inf
            apart = np.abs(latent - latent[q])
            order = np.argsort(apart, kind="stable")
            errors[i] = _error_curve(d, order, k, grid)
            nearest = np.argpartition(d, k - 1)[:k]
            windows[i] = np.mean(apart <= apart[nearest].max())
        logger.info("error curves of %d rows in %.0f s", queries, time.perf_counter() - t0)
        gflops = _gemm_gflops(X.shape[1])
        out["window_share"] = float(np.median(windows))
        out["gemm_gflops_float32"] = gflops
        for tol in tolerances:
            share = _allocated_share(errors, grid, tol, T)
            flops = share * T * T * 2 * X.shape[1]
            out[f"tol_{tol:g}"] = {
                "uniform_share": _uniform_share(errors, grid, tol, T),
                "allocated_share": share, "floor_flops": flops,
                "floor_seconds_at_gemm": flops / (gflops * 1e9)}
        out["load_average_after"] = os.getloadavg()
        return out
