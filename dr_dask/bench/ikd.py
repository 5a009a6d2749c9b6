"""IKD benchmarks.

Cases, each with its baseline measured in the same run:

- ``similarity``: throughput of the distance-tile stage (IKD's real tile function: S = Xn Xn^T,
  inverse kernel, row statistics, over the upper tiles) against one plain NumPy GEMM
  ``X @ X.T`` of the same rows and dtype in this process;
- ``incore``: IKD (full solver, tiles in worker memory, block Lanczos) against dense NumPy
  Algorithm 1 (``np.corrcoef`` + ``scipy.linalg.eigh`` with a subset) at T=5000, N=1000;
- ``outofcore``: GP-mapping data by random Fourier features at T=60,000, N=1000, float32, tiles
  on disk; peak RSS of the whole process tree (driver + workers), wall time per stage, R^2.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from dr_dask.bench._common import bench_workdir, n_workers
from dr_dask.io.storage import read_array
from dr_dask.jobs.quickstart import gp_dataset, read_latent
from dr_dask.linalg.mds import scaled_vectors
from dr_dask.runtime.resources import PeakRSS, measure, timed

logger = logging.getLogger(__name__)


def dense_algorithm1(X: np.ndarray, M: int) -> np.ndarray:
    """The dense NumPy baseline: correlation, SE inverse, min-max reference, LAPACK subset eigh."""
    import scipy.linalg

    S = np.clip(np.corrcoef(X), 1e-3, 1 - 1e-5)
    D = -2.0 * np.log(S)
    np.fill_diagonal(D, 0.0)
    r = int(np.argmin(D.max(axis=1)))
    G = 0.5 * (D[:, [r]] + D[[r], :] - D)
    T = len(G)
    w, v = scipy.linalg.eigh(G, subset_by_index=[T - M, T - 1], overwrite_a=True)
    return scaled_vectors(w[::-1], v[:, ::-1])


def _distance_tile_stats(Xi: np.ndarray, Xj: np.ndarray, diagonal: bool, inverse: Any):
    """IKD's real tile function, tile dropped: the benchmark times it, not the tiles' memory."""
    from dr_dask.methods._ikd_full import distance_tile

    return None, distance_tile(Xi, Xj, diagonal, inverse)[1]


def _gemm_tile(Xi: np.ndarray, Xj: np.ndarray, diagonal: bool):
    return None, float((Xi @ Xj.T)[0, 0])


def bench_similarity(client: Any, T: int, N: int, dtype: str, repeats: int = 3,
                     block: int = 2048) -> dict:
    """The distance-tile stage's throughput against a bare GEMM of the same rows and dtype.

    Ours: :func:`dr_dask.methods._ikd_full.distance_tile` (similarity GEMM, inverse kernel, row and
    column maxima and sums) over the upper tiles with :func:`~dr_dask.linalg.tiles.build_tiles`
    on the command's scheduler. Baseline, same run: one NumPy GEMM ``X @ X^T`` in this process
    (all BLAS threads) at the full product's flops; the tiles count their own (the upper
    triangle). Two diagnostics split the gap: a bare GEMM through the same tile stage
    (scheduling and partitioning cost) and one diagonal-free tile computed both ways in this
    process (the inverse kernel and reductions per tile).
    """
    from dr_dask.linalg.kernels import get_kernel
    from dr_dask.linalg.tiles import TileGrid, build_tiles
    from dr_dask.methods._ikd_full import distance_tile
    from dr_dask.methods.ikd import IKD
    from dr_dask.methods.ikd_core import InverseKernel, normalise_rows
    from dr_dask.runtime.cluster import share

    rng = np.random.default_rng(0)
    X = normalise_rows(rng.standard_normal((T, N)), "correlation", dtype)
    defaults = IKD(n_components=1)
    inverse = InverseKernel(get_kernel(defaults.kernel), 1.0, defaults.floor, defaults.ceil,
                            defaults.length_scale)
    flops = 2.0 * T * T * N
    # a copy: NumPy turns ``X @ X.T`` of one buffer into a SYRK (half the product), which
    # would not be the full GEMM these flops count
    Xt = X.T.copy()
    t_np = measure(lambda: X @ Xt, repeats, rss=False).seconds
    grid = TileGrid.regular(T, block)
    blocks = [share(X[grid.block(i)], client) for i in range(grid.n_blocks)]
    tile_flops = sum(2.0 * (grid.bounds[i + 1] - grid.bounds[i])
                     * (grid.bounds[j + 1] - grid.bounds[j]) * N for i, j in grid.upper())

    def stage(tile_fn, *args):
        return measure(lambda: build_tiles(grid, blocks, tile_fn, fn_args=args, client=client),
                       repeats, rss=False).seconds

    t_tiles = stage(_distance_tile_stats, inverse)
    t_gemm_tiles = stage(_gemm_tile)
    Xi, Xj = X[:block], X[block : 2 * block]
    t_one_gemm = measure(lambda: Xi @ Xj.T, repeats, rss=False).seconds
    t_one_tile = measure(lambda: distance_tile(Xi, Xj, False, inverse), repeats,
                         rss=False).seconds
    return {
        "T": T, "N": N, "dtype": dtype, "block": block, "workers": n_workers(client),
        "numpy_gemm_seconds": t_np,
        "numpy_gflops": flops / t_np / 1e9,
        "tiles_seconds": t_tiles,
        "tiles_gflops": tile_flops / t_tiles / 1e9,
        "throughput_ratio": (tile_flops / t_tiles) / (flops / t_np),
        "target_ratio": 0.6,
        "bare_gemm_tiles_ratio": (tile_flops / t_gemm_tiles) / (flops / t_np),
        "one_tile_gemm_seconds": t_one_gemm,
        "one_tile_distance_seconds": t_one_tile,
        "one_tile_ratio": t_one_gemm / t_one_tile,
    }


def bench_incore(client: Any, T: int, N: int, workdir: str, repeats: int = 3) -> dict:
    """IKD full solver vs dense NumPy Algorithm 1, same data, same R^2 metric."""
    import zarr

    from dr_dask.methods.ikd import IKD
    from dr_dask.metrics import r2_affine

    path = gp_dataset(os.path.join(workdir, f"gp_T{T}_N{N}.zarr"), T, N)
    X = read_array(zarr.open_group(path, mode="r"), "X")
    Z = read_latent(path)
    dense = measure(lambda: dense_algorithm1(X, 3), repeats)
    est = IKD(n_components=3, similarity="correlation", random_state=0, client=client, tol=1e-8)
    ours = measure(lambda: est.fit_transform(X), repeats)
    t_dense, E_dense, t_ikd, E_ikd = dense.seconds, dense.result, ours.seconds, ours.result
    return {
        "T": T, "N": N,
        "dense_numpy_seconds": t_dense,
        "dr_dask_seconds": t_ikd,
        "speedup_vs_dense": t_dense / t_ikd,
        "r2_dense": r2_affine(Z, E_dense),
        "r2_dr_dask": r2_affine(Z, E_ikd),
        "peak_rss_gb_dense": dense.peak_rss_gb,
        "peak_rss_gb_dr_dask": ours.peak_rss_gb,
        "dr_dask_stage_seconds": est.timings_,
        "eigen_passes": est.eigen_passes_,
    }


def bench_outofcore(client: Any, T: int, N: int, workdir: str) -> dict:
    """T x T never in one process: D tiles on disk, peak RSS of the process tree."""
    from dr_dask.io.inputs import open_dataset
    from dr_dask.methods.ikd import IKD
    from dr_dask.metrics import r2_affine
    from dr_dask.runs.group import RunGroup

    path = os.path.join(workdir, f"gp_rff_T{T}_N{N}.zarr")
    stages: dict[str, float] = {}
    with PeakRSS() as mem:
        with timed(stages, "generate_seconds"):
            gp_dataset(path, T, N, dtype="float32")
        inp = open_dataset(path + ":X")
        run = RunGroup(os.path.join(workdir, "ooc_run.zarr"), "ikd", params={}, identity={},
                       overwrite=True)
        est = IKD(n_components=3, similarity="correlation", dtype="float32", tile_cache="disk",
                  random_state=0, client=client, tol=1e-6)
        with timed(stages, "fit_seconds"):
            est.fit(inp, run=run)
    r2 = r2_affine(read_latent(path), est.embedding_)
    dense_gb = T * T * 8 / 1e9
    return {
        "T": T, "N": N, "dtype": "float32",
        **stages,
        "stage_seconds": est.timings_,
        "eigen_passes": est.eigen_passes_,
        "r2": r2,
        "peak_rss_gb_process_tree": mem.peak_gb,
        "target_peak_rss_gb": 6.0,
        "dense_float64_T_by_T_gb": dense_gb,
        "explained_variance_ratio": est.explained_variance_ratio_,
        "eigen_residuals": est.eigen_residuals_.tolist(),
    }


#: Sizes of ``--quick`` (a smoke run; the tests shrink them further).
QUICK = {"similarity_T": 4096, "incore_T": 1500, "outofcore_T": 8000, "N": 1000}
CASES = ("similarity", "incore", "outofcore")


def run_bench(client: Any, *, quick: bool, only: set, ooc_T: int, workdir: str | None) -> dict:
    with bench_workdir(workdir, "bench") as workdir:
        cases = only or set(CASES)
        N = QUICK["N"] if quick else 1000
        results: dict[str, Any] = {"workers": n_workers(client), "quick": quick}
        if "similarity" in cases:
            T = QUICK["similarity_T"] if quick else 12_288
            for dtype in ("float32", "float64"):
                results[f"similarity_{dtype}"] = bench_similarity(
                    client, T, N, dtype, block=min(2048, max(T // 2, 1)))
        if "incore" in cases:
            results["incore"] = bench_incore(client, QUICK["incore_T"] if quick else 5000, N,
                                             workdir)
        if "outofcore" in cases:
            results["outofcore"] = bench_outofcore(
                client, QUICK["outofcore_T"] if quick else ooc_T, N, workdir)
    return results
