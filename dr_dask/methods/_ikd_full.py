"""Full IKD (Li & Wu 2022/2024, Algorithm 1), tiled: ``fit_full(config, data, run) -> IKDResult``.

D is produced as upper-triangle tiles from row blocks of X (kept on the workers, or in a Zarr
array for large T), the reference point is a reduction over tile statistics, and the
eigensolver sees D only through :class:`~dr_dask.methods.ikd_core.GramOperator`.
A run keeps the tiles and the stage marks: a rerun resumes after the last complete stage.
"""

from __future__ import annotations

import logging

import numpy as np

from dr_dask.io.checkpoint import Checkpoint, scratch
from dr_dask.io.inputs import InputData
from dr_dask.linalg.cost import memory_of, quadratic_cost
from dr_dask.linalg.tiles import (
    TiledSymmetric,
    TileGrid,
    band_stats,
    build_tiles,
    row_stats,
    stored_tiles,
)
from dr_dask.methods._ikd_transform import nystrom_map
from dr_dask.methods.ikd_core import (
    LANDMARK_WAY_OUT,
    GramOperator,
    IKDConfig,
    IKDResult,
    InverseKernel,
    eigen_result,
    eigen_stage,
    prepared_rows,
    reference_index,
)
from dr_dask.runtime.cluster import active_client, compute, run_stage
from dr_dask.runtime.resources import timed

logger = logging.getLogger(__name__)


def distance_tile(Xi: np.ndarray, Xj: np.ndarray, diagonal: bool, inverse: InverseKernel,
                  row0: int = 0):
    """One tile of D (or the band of its rows from ``row0``, given those rows of Xi) from two
    row blocks, with the statistics the reference point needs.

    The GEMM's result is the only tile-sized array: the inverse kernel and the statistics
    run over it in place (:meth:`InverseKernel.tile`).
    """
    return inverse.tile(Xi @ Xj.T, diagonal, row0=row0)


def fit_full(cfg: IKDConfig, inp: InputData, run: Checkpoint | None) -> IKDResult:
    """Full IKD of ``inp``: distance tiles, reference point, eigenpairs of g(D)."""
    client = active_client(cfg.client)
    Xn, sigma2 = prepared_rows(cfg, inp)
    inverse = cfg.inverse_kernel(sigma2)
    T = Xn.shape[0]
    grid = TileGrid.from_chunks(Xn.chunks[0])
    blocks = list(Xn.to_delayed().ravel())
    tile_bytes = T * (T + grid.max_block) / 2 * cfg.dtype.itemsize
    on_disk = cfg.on_disk(tile_bytes)
    with scratch("distance", run, cfg.scratch, inp, keep=True) as tiles:
        store = tiles if on_disk else None
        if not (run is not None and store is not None and run.is_done("distance")):
            quadratic_cost("full IKD distance tiles", T,
                           [(tile_bytes, store or memory_of(client))], way_out=LANDMARK_WAY_OUT)
        timings: dict[str, float] = {}
        with timed(timings, "distance"):
            D, rowmax, rowsum = run_stage(
                "distance", lambda: _distance_stage(cfg, grid, blocks, inverse, store, run))
        r = reference_index(rowmax, rowsum, cfg.reference)
        d_ref = None

        def eigen() -> dict:
            nonlocal d_ref
            if r is not None:  # row r of D, recomputed from X: O(TN), not a tile row read
                (xr,) = compute(Xn[r], client=client)
                (s_r,) = compute(Xn @ xr, client=client)
                d_ref = inverse(s_r[None, :].astype(np.float64))[0]
                d_ref[r] = 0.0
            return eigen_stage(cfg, GramOperator(D, d_ref, rowsum / T), run)

        with timed(timings, "eigen"):
            eig = run_stage("eigen", eigen)
    result = eigen_result(eig, cfg, r, sigma2, timings)
    result.out_of_sample = run_stage("out_of_sample", lambda: nystrom_map(
        cfg, inp, Xn, sigma2, result.embedding, result.eigenvalues, r, d_ref, rowsum / T))
    return result


def _distance_stage(cfg: IKDConfig, grid, blocks, inverse, store, run):
    """Tiles of D (resumed from the run's group when that stage completed)."""
    if run is not None and store is not None and run.is_done("distance"):
        logger.info("distance tiles: reusing the completed stage in %s", run.path)
        return (
            TiledSymmetric(grid, stored_tiles(store, grid), cfg.client),
            run.read("distance_rowmax"),
            run.read("distance_rowsum"),
        )
    logger.info(
        "distance tiles: T=%d in %d blocks (%d tiles) %s",
        grid.size, grid.n_blocks, len(grid.upper()),
        f"on disk at {store}" if store else "in memory",
    )
    D, stats = build_tiles(
        grid, blocks, distance_tile, fn_args=(inverse,), store=store,
        dtype=cfg.dtype, client=cfg.client, progress=cfg.progress, band_stats=band_stats,
    )
    rowmax, rowsum = row_stats(grid, stats)
    if run is not None and store is not None:
        run.write("distance_rowmax", rowmax, ("sample",))
        run.write("distance_rowsum", rowsum, ("sample",))
        run.mark_done("distance", sigma2=inverse.sigma2)
    return D, rowmax, rowsum
