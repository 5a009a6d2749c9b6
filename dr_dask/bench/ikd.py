"""IKD benchmarks (issue 2).

Cases, each with its baseline measured in the same run:

- ``gemm``: throughput of the similarity-tile stage (upper-triangle tiles of S = Xn Xn^T on the
  cluster) against one plain NumPy GEMM ``X @ X.T`` of the same rows and dtype in this process;
- ``incore``: IKD (full solver, tiles in worker memory, block Lanczos) against dense NumPy
  Algorithm 1 (``np.corrcoef`` + ``scipy.linalg.eigh`` with a subset) at T=5000, N=1000;
- ``outofcore``: GP-mapping data by random Fourier features at T=60,000, N=1000, float32, tiles
  on disk; peak RSS of the whole process tree (driver + workers), wall time per stage, R^2.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from typing import Any

import numpy as np

from dr_dask.bench._common import PeakRSS, median_time, timed
from dr_dask.quickstart import gp_dataset, read_latent

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
    return v[:, ::-1] * np.sqrt(np.clip(w[::-1], 0, None))


def _gemm_tile(Xi: np.ndarray, Xj: np.ndarray, diagonal: bool):
    S = Xi @ Xj.T
    return None, float(S[0, 0])  # keep the tile off the wire: only its cost is measured


def bench_gemm(client: Any, T: int, N: int, dtype: str, repeats: int = 3) -> dict:
    """Similarity-tile stage throughput vs NumPy GEMM, same rows, same dtype."""
    import dask.array as da

    from dr_dask.linalg.tiles import TileGrid, build_tiles

    rng = np.random.default_rng(0)
    X = rng.standard_normal((T, N)).astype(dtype)
    flops = 2.0 * T * T * N  # the full product; the tiles compute only the upper triangle of it
    t_np, _ = median_time(lambda: X @ X.T, repeats)
    Xd = client.persist(da.from_array(X, chunks=(2048, N)))
    grid = TileGrid.from_chunks(Xd.chunks[0])
    blocks = list(Xd.to_delayed().ravel())
    tile_flops = sum(
        2.0 * (grid.bounds[i + 1] - grid.bounds[i]) * (grid.bounds[j + 1] - grid.bounds[j]) * N
        for i, j in grid.upper()
    )
    t_tiles, _ = median_time(lambda: build_tiles(grid, blocks, _gemm_tile, client=client), repeats)
    return {
        "T": T, "N": N, "dtype": dtype,
        "numpy_gemm_seconds": t_np,
        "numpy_gflops": flops / t_np / 1e9,
        "tiles_seconds": t_tiles,
        "tiles_gflops": tile_flops / t_tiles / 1e9,
        "throughput_ratio": (tile_flops / t_tiles) / (flops / t_np),
        "target_ratio": 0.6,
    }


def bench_incore(client: Any, T: int, N: int, workdir: str, repeats: int = 3) -> dict:
    """IKD full solver vs dense NumPy Algorithm 1, same data, same R^2 metric."""
    import zarr

    from dr_dask.methods.ikd import IKD
    from dr_dask.metrics import r2_affine

    path = gp_dataset(os.path.join(workdir, f"gp_T{T}_N{N}.zarr"), T, N)
    X = np.asarray(zarr.open_group(path, mode="r")["X"][...])
    Z = read_latent(path)
    with PeakRSS() as mem_dense:
        t_dense, E_dense = median_time(lambda: dense_algorithm1(X, 3), repeats)
    est = IKD(3, similarity="correlation", random_state=0, client=client, tol=1e-8)
    with PeakRSS() as mem_ikd:
        t_ikd, E_ikd = median_time(lambda: est.fit_transform(X), repeats)
    return {
        "T": T, "N": N,
        "dense_numpy_seconds": t_dense,
        "dr_dask_seconds": t_ikd,
        "speedup_vs_dense": t_dense / t_ikd,
        "r2_dense": r2_affine(Z, E_dense),
        "r2_dr_dask": r2_affine(Z, E_ikd),
        "peak_rss_gb_dense": mem_dense.peak_gb,
        "peak_rss_gb_dr_dask": mem_ikd.peak_gb,
        "dr_dask_stage_seconds": est.stage_seconds_,
        "eigen_passes": est.eigen_passes_,
    }


def bench_outofcore(client: Any, T: int, N: int, workdir: str) -> dict:
    """T x T never in one process: D tiles on disk, peak RSS of the process tree."""
    from dr_dask.methods.ikd import IKD
    from dr_dask.metrics import r2_affine
    from dr_dask.store import RunGroup, open_dataset

    path = os.path.join(workdir, f"gp_rff_T{T}_N{N}.zarr")
    stages: dict[str, float] = {}
    with PeakRSS() as mem:
        with timed() as t:
            gp_dataset(path, T, N, dtype="float32")
        stages["generate_seconds"] = t["seconds"]
        inp = open_dataset(path + ":X")
        run = RunGroup(os.path.join(workdir, "ooc_run.zarr"), "ikd", params={}, identity={},
                       overwrite=True)
        est = IKD(3, similarity="correlation", dtype="float32", tile_cache="disk",
                  random_state=0, client=client, tol=1e-6)
        with timed() as t:
            est.fit(inp, run=run)
        stages["fit_seconds"] = t["seconds"]
    r2 = r2_affine(read_latent(path), est.embedding_)
    dense_gb = T * T * 8 / 1e9
    return {
        "T": T, "N": N, "dtype": "float32",
        **stages,
        "stage_seconds": est.stage_seconds_,
        "eigen_passes": est.eigen_passes_,
        "r2": r2,
        "peak_rss_gb_process_tree": mem.peak_gb,
        "target_peak_rss_gb": 6.0,
        "dense_float64_T_by_T_gb": dense_gb,
        "explained_variance_ratio": est.explained_variance_ratio_,
        "eigen_residuals": est.eigen_residuals_.tolist(),
    }


def run_bench(client: Any, *, quick: bool, only: set, ooc_T: int, workdir: str | None) -> dict:
    own_tmp = workdir is None
    workdir = workdir or tempfile.mkdtemp(prefix="dr_dask_bench_")
    os.makedirs(workdir, exist_ok=True)
    cases = only or {"gemm", "incore", "outofcore"}
    results: dict[str, Any] = {"workers": len(client.scheduler_info()["workers"])}
    try:
        if "gemm" in cases:
            for dtype in ("float32", "float64"):
                T = 4096 if quick else 12_288
                results[f"gemm_{dtype}"] = bench_gemm(client, T, 1000, dtype)
        if "incore" in cases:
            results["incore"] = bench_incore(client, 1500 if quick else 5000, 1000, workdir)
        if "outofcore" in cases:
            results["outofcore"] = bench_outofcore(client, 8000 if quick else ooc_T, 1000, workdir)
    finally:
        if own_tmp:
            shutil.rmtree(workdir, ignore_errors=True)
    return results
