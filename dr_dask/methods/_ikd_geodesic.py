"""Geodesic IKD (Li & Wu 2024, §2.4, second bullet) and landmark IKD.

Weak similarities are replaced by the max-product path similarity
``s_geo(i, j) = sigma^2 max_paths prod s_e / sigma^2 = sigma^2 exp(-shortest path)`` on a graph
with edge weights ``-log(s / sigma^2)`` (docs/decisions.md IKD-A11: normalised, so weights are >=
0). Rules:

- ``geodesic_rule="knn"`` (the authors' code, default): kNN graph by largest correlation
  (for unit-norm centred rows ``||a - b||^2 = 2 - 2 s``, so the package's Euclidean kNN on the
  normalised rows gives it), every entry replaced by the path similarity;
- ``geodesic_rule="threshold"`` (the paper): graph of all pairs with ``s / sigma^2 >= s0``
  (docs/decisions.md IKD-A10: entries equal to s0 are kept), only entries below s0 replaced, by the
  larger of the direct similarity and the best path through the graph (the direct edge is a path
  too).

Disconnected graphs are bridged by the shortest edges between components (with a warning
naming them) or refused (``on_disconnected="raise"``), never left as infinite distances.

Out of core: Dijkstra runs over blocks of sources on the workers. With the kNN rule and tiles
in memory, each task turns its rows straight into its block row of the upper tiles of
D = f^-1(s_geo) (:func:`dr_dask.graph.paths.geodesic_tiles`; float32, multiplied in float64):
no T x T array is written, read back or held by one process. Otherwise (the threshold rule,
which needs the similarity tiles too, or tiles on disk for large T and resumable runs) the
T x T path lengths go to a Zarr array with square chunks (:class:`dr_dask.graph.GeodesicRows`)
and the upper tiles are built from tiles of that array (:func:`dr_dask.linalg.tiles.build_tiles`),
in worker memory or on disk. The eigensolver only sees ``D @ V`` through
:class:`~dr_dask.methods.ikd_core.GramOperator`.

Landmark IKD (not in the papers; docs/decisions.md IKD-LANDMARK): L landmarks, the L x T geodesic
(or, with ``solver="full"``, similarity) rows, landmark MDS of ``D_LL`` and the de Silva–Tenenbaum
triangulation of every point from its L distances, summed over landmark row blocks where they live,
into M + min(M, 4) dimensions of which the embedding keeps the top M principal axes of all T points
(:func:`~dr_dask.graph.landmarks.principal_axes`: the landmarks' own axes follow where they are,
not where the data are).
Memory and time are O(L T), which is how IKD reaches 10^6 rows.

Both solvers are functions ``(config, data, run) -> IKDResult``. A run keeps the geodesic
solver's path lengths and tiles and resumes its eigen stage; landmark IKD writes its L x T rows
into the run's store (where every worker reaches them) and drops them after the stage: it has
no stage to resume, so a rerun of an interrupted landmark fit starts again.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp
import zarr
from scipy.sparse.csgraph import connected_components

from dr_dask.graph import (
    GeodesicRows,
    connect_components,
    graph_from_neighbors,
)
from dr_dask.graph.knn import search_neighbours
from dr_dask.graph.landmarks import (
    landmark_mds,
    principal_axes,
    select_landmarks,
    spare_dimensions,
    triangulate,
    triangulate_block,
)
from dr_dask.graph.partitioned import stored_neighbour_graph
from dr_dask.graph.paths import geodesic_tiles, path_rows_array
from dr_dask.graph.sssp import dijkstra_rows
from dr_dask.graph.stored import StoredGraph
from dr_dask.graph.stored_rows import read_stored
from dr_dask.io.checkpoint import (
    Checkpoint,
    delete_with,
    deleted_on_failure,
    kept_scratch,
    scratch,
    unkept,
)
from dr_dask.io.inputs import InputData
from dr_dask.io.storage import Location
from dr_dask.linalg.cost import memory_of, quadratic_cost
from dr_dask.linalg.mds import double_centre
from dr_dask.linalg.tiles import (
    TileGrid,
    build_tiles,
    row_stats,
    strip_grid,
    tile_stats,
)
from dr_dask.methods._ikd_transform import DeferredTriangulation, triangulation_map
from dr_dask.methods.ikd_core import (
    LANDMARK_WAY_OUT,
    GeodesicKernel,
    GramOperator,
    IKDConfig,
    IKDResult,
    InverseKernel,
    edge_weight,
    eigen_result,
    eigen_stage,
    prepared_rows,
    reference_index,
)
from dr_dask.runtime.blas import single_blas_thread
from dr_dask.runtime.cluster import active_client, compute
from dr_dask.runtime.resources import timed

logger = logging.getLogger(__name__)

#: Rows and columns per chunk of the Zarr array of path lengths (tiles read whole chunks).
PATH_CHUNK = 512


# --------------------------------------------------------------------------------------------
# the graph


def _unit_rows(block: np.ndarray) -> np.ndarray:
    X = np.asarray(block, dtype=np.float64)
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def _row_norms(block: np.ndarray) -> np.ndarray:
    return np.linalg.norm(np.asarray(block, dtype=np.float64), axis=1)


@dataclass(frozen=True)
class _CorrelationWeight:
    """The edge weight ``-log(s / sigma^2)`` of the distance ``d`` between unit rows ``i`` and
    ``j`` (``s``: their correlation, times their norms when S is not a correlation)."""

    floor: float
    ceil: float
    norms: np.ndarray | None
    sigma2: float

    def __call__(self, d: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
        k = 1.0 - 0.5 * np.asarray(d) ** 2  # the correlation of unit rows
        if self.norms is not None:
            k = k * self.norms[i] * self.norms[j] / self.sigma2
        return edge_weight(k, self.floor, self.ceil)


def _bridge_weight(lengths: np.ndarray, floor: float, ceil: float) -> np.ndarray:
    # bridges are found on unit rows, where ||a - b||^2 = 2 - 2 corr
    return edge_weight(1.0 - 0.5 * np.asarray(lengths) ** 2, floor, ceil)


def _threshold_edges(Xi, Xj, i0: int, j0: int, diagonal: bool, sigma2: float, s0: float,
                     floor: float, ceil: float):
    """Pairs (i < j) of one tile with ``s / sigma^2 >= s0`` and their weights."""
    k = (np.asarray(Xi, np.float64) @ np.asarray(Xj, np.float64).T) / sigma2
    keep = k >= s0
    if diagonal:
        keep &= np.triu(np.ones(keep.shape, bool), 1)
    r, c = np.nonzero(keep)
    return r + i0, c + j0, edge_weight(k[r, c], floor, ceil)


def neighbour_graph(cfg: IKDConfig, Xn: Any, sigma2: float, client: Any,
                    inp: InputData | None = None,
                    where: Location | None = None) -> tuple[sp.csr_matrix | StoredGraph, dict]:
    """Symmetric graph with weights ``-log(s / sigma^2)`` per the configured rule, connected.

    Parameters
    ----------
    cfg : IKDConfig
    Xn : dask array of shape (T, N)
        Rows with ``S = Xn Xn^T``: persisted (:func:`~dr_dask.methods.ikd_core.prepared_rows`)
        or computed where used (:func:`~dr_dask.methods.ikd_core.lazy_rows`).
    sigma2 : float
    inp : InputData, optional
        The input, next to which (when remote) the IVF search writes its lists.
    where : Location, optional
        A scratch location every worker reaches: a kNN graph whose search resolves to the
        partitioned one is then built on the workers and stored there
        (:func:`~dr_dask.graph.partitioned.stored_neighbour_graph`).

    Returns
    -------
    graph : csr_matrix of shape (T, T), or StoredGraph
    info : dict
        ``n_components`` of the raw graph, ``n_edges`` and (kNN rule) ``knn_recall`` and
        ``knn_distance_error``.
    """
    T = Xn.shape[0]
    floor, ceil = cfg.floor, cfg.ceil
    info: dict = {}
    norms = None
    if cfg.similarity == "correlation" and cfg.variance is None:
        Xu = Xn  # already unit rows, sigma^2 = 1
    else:
        (norms,) = compute(Xn.map_blocks(_row_norms, drop_axis=1, dtype=np.float64),
                           client=client)
        Xu = Xn.map_blocks(_unit_rows, dtype=np.float64)
    if cfg.geodesic_rule == "knn":
        weight = _CorrelationWeight(floor, ceil, norms, sigma2)
        stored = None if where is None else stored_neighbour_graph(
            Xu, int(cfg.n_neighbors), where, knn=cfg.knn, n_probe=cfg.n_probe, client=client,
            knn_tol=cfg.knn_tol,
            weight=weight, on_disconnected=cfg.on_disconnected, random_state=cfg.random_state)
        if stored is not None:
            return stored.graph, {"knn_recall": stored.recall,
                                  "knn_distance_error": stored.distance_error,
                                  "n_edges": stored.n_edges,
                                  "n_components": stored.n_components,
                                  "seconds": {f"graph.{k}": v for k, v in
                                              stored.seconds.items()}}
        with scratch("knn_lists", None, cfg.scratch, inp) as lists:
            dist, idx, info["knn_recall"], info["knn_distance_error"] = search_neighbours(
                Xu, int(cfg.n_neighbors), knn=cfg.knn, n_probe=cfg.n_probe, client=client,
                knn_tol=cfg.knn_tol,
                scratch=lists, random_state=cfg.random_state)
        graph = graph_from_neighbors(idx, weight(dist, np.arange(T)[:, None], idx), T)
    else:
        assert cfg.threshold is not None  # IKD refuses geodesic_rule="threshold" without it
        grid = TileGrid.from_chunks(Xn.chunks[0])
        blocks = Xn.to_delayed().ravel()
        task = dask.delayed(_threshold_edges, pure=True)
        parts = compute(*[
            task(blocks[i], blocks[j], grid.bounds[i], grid.bounds[j], i == j, sigma2,
                 float(cfg.threshold), floor, ceil)
            for i, j in grid.upper()
        ], client=client)
        r, c, w = (np.concatenate([p[n] for p in parts]) for n in range(3))
        w = np.maximum(w, np.finfo(np.float64).tiny)  # explicit zeros would drop the edge
        upper = sp.coo_matrix((w, (r, c)), shape=(T, T))
        graph = (upper + upper.T).tocsr()
    n_comp, _ = connected_components(graph, directed=False)
    if n_comp > 1:
        X = None
        if cfg.on_disconnected == "bridge":
            (X,) = compute(Xu, client=client)
        graph = connect_components(
            graph, X, on_disconnected=cfg.on_disconnected,
            bridge_weight=functools.partial(_bridge_weight, floor=floor, ceil=ceil),
        )
    return graph, {**info, "n_components": int(n_comp), "n_edges": int(graph.nnz // 2)}


# --------------------------------------------------------------------------------------------
# path lengths -> D


def geodesic_tile(bi: tuple, bj: tuple, diagonal: bool, paths: zarr.Array,
                  kernel: GeodesicKernel, dtype: Any):
    """One tile of D from a tile of the path-length array, with the reference statistics."""
    (ri, Xi), (rj, Xj) = bi, bj
    P = read_stored(paths, (ri, rj))
    S = np.asarray(Xi) @ np.asarray(Xj).T  # the threshold rule: similarities beside paths
    D = kernel(P, S, diagonal, overwrite=True)
    if diagonal:
        D = 0.5 * (D + D.T)  # Dijkstra from i and from j may differ in the last bit
    return D.astype(dtype, copy=False), tile_stats(D)


def _tagged(rows: slice, block: Any) -> tuple:
    return rows, block



def _tiles_from_dijkstra(cfg: IKDConfig, graph: sp.csr_matrix, kernel: GeodesicKernel,
                         T: int, client: Any, seconds: dict, store: Any) -> tuple:
    """Upper tiles of D straight from Dijkstra (the kNN rule) into worker memory, or into the
    tile array ``store`` above the tile budget: no T x T path-length array is written or read
    back, and only the upper half of D is held.

    The tiles are float32 whatever ``cfg.dtype`` (a quarter of float64 full rows: 0.2 GB at
    T=10,000): D comes from float64 path lengths through the clipped inverse kernel, and its
    rounding (6e-8 relative) is far below what the geodesic approximation resolves. Products
    run in float64, so the eigensolver converges on the stored D to any tolerance.
    """
    grid = strip_grid(T, client, int(cfg.tile_size))
    # Dijkstra and the inverse kernel run in the same tasks: one stage
    with timed(seconds, "shortest_paths"):
        # the strip task's path-length buffer becomes D in place
        D, stats = geodesic_tiles(graph, grid, functools.partial(kernel, overwrite=True),
                                  stats_fn=tile_stats, dtype=np.float32,
                                  precision=np.float64, client=client, store=store)

    def d_ref_row(r: int) -> np.ndarray:
        # the reference row, one more Dijkstra here (the tiles hold only the upper half)
        return dijkstra_rows(graph, np.array([r]))

    return D, stats, d_ref_row


def _tiles_through_paths(cfg: IKDConfig, graph: sp.csr_matrix, kernel: GeodesicKernel,
                         Xn: Any, grid: TileGrid, client: Any, seconds: dict,
                         path_loc: Location, tiles: Location | None) -> tuple:
    """Path lengths into a Zarr array (the run's, else scratch: ``path_loc``), then tiles of D
    from its chunks and the rows' similarities, in memory or on disk at ``tiles`` (resumable
    tile by tile): the threshold rule."""
    dtype = cfg.dtype
    T = grid.size
    with timed(seconds, "shortest_paths"):
        chunk = min(PATH_CHUNK, T)
        paths = path_rows_array(path_loc, (T, T), chunk, chunk, dtype)
        GeodesicRows.compute(graph, client=client, block_size=chunk, dtype=dtype, out=paths)

    with timed(seconds, "distance"):
        xb = Xn.to_delayed().ravel()
        blocks = [dask.delayed(_tagged)(grid.block(i), xb[i]) for i in range(grid.n_blocks)]
        D, stats = build_tiles(grid, blocks, geodesic_tile, fn_args=(paths, kernel, dtype),
                               store=tiles, dtype=dtype, client=client, progress=cfg.progress)

    def d_ref_row(r: int) -> np.ndarray:
        return np.asarray(paths[r : r + 1, :])

    return D, stats, d_ref_row


# one BLAS thread in this process for the whole fit (see dr_dask.runtime.blas): its BLAS calls (the
# cell search's principal axes, the eigensolver's) run beside dask's threads or a LocalCluster's
# workers on the same cores, where BLAS's own threads only contend
@single_blas_thread()
def fit_geodesic(cfg: IKDConfig, inp: InputData, run: Checkpoint | None) -> IKDResult:
    """Geodesic IKD of ``inp``: graph, path lengths, distance tiles, eigenpairs of g(D)."""
    client = active_client(cfg.client)
    dtype = cfg.dtype
    seconds: dict[str, float] = {}
    Xn, sigma2 = prepared_rows(cfg, inp)  # persisted on a cluster
    T = Xn.shape[0]
    threshold = None
    if cfg.geodesic_rule == "threshold":
        assert cfg.threshold is not None  # IKD refuses geodesic_rule="threshold" without it
        threshold = float(cfg.threshold)
    kernel = GeodesicKernel(cfg.inverse_kernel(sigma2), threshold)
    grid = TileGrid.from_chunks(Xn.chunks[0])
    # the kNN rule's tiles are float32 whatever dtype (_tiles_from_dijkstra): they fit the
    # budget to a larger T than dtype's tiles would
    itemsize = 4 if kernel.threshold is None else dtype.itemsize
    tile_bytes = T * (T + grid.max_block) / 2 * itemsize
    on_disk = cfg.on_disk(tile_bytes)
    # the Zarr arrays live until the eigen stage has read their tiles
    with contextlib.ExitStack() as arrays:
        # placed (and their cost said, their space checked) before the graph is built
        tiles = (arrays.enter_context(scratch("distance", run, cfg.scratch, inp, keep=True))
                 if on_disk else None)
        parts: list[tuple[float, Any]] = [(tile_bytes, tiles or memory_of(client))]
        path_loc = None
        if kernel.threshold is not None:
            path_loc = arrays.enter_context(scratch("geodesic_paths", run, cfg.scratch, inp,
                                                    keep=True))
            parts.insert(0, (T * T * dtype.itemsize, path_loc))
        quadratic_cost("geodesic IKD", T, parts, way_out=LANDMARK_WAY_OUT)
        with timed(seconds, "graph"):
            graph, info = neighbour_graph(cfg, Xn, sigma2, client, inp)
        if path_loc is None:
            # the kNN rule needs the rows no further: free them on the workers (and the
            # input chunks the scheduler keeps to recompute them) before D's tiles arrive
            del Xn
            D, stats, d_ref_row = _tiles_from_dijkstra(cfg, graph, kernel, T, client, seconds,
                                                       tiles)
        else:
            D, stats, d_ref_row = _tiles_through_paths(cfg, graph, kernel, Xn, grid, client,
                                                       seconds, path_loc, tiles)
        with timed() as reference:
            rowmax, rowsum = row_stats(D.grid, stats)
            r = reference_index(rowmax, rowsum, cfg.reference)
            d_ref = None
            if r is not None:
                S_r = None
                if kernel.threshold is not None:
                    (xr,) = compute(Xn[r], client=client)
                    (S_r,) = compute(Xn @ xr, client=client)
                    S_r = S_r[None, :]
                d_ref = kernel(d_ref_row(r), S_r)[0]
                d_ref[r] = 0.0
        # the reference row is part of D's stage (with the tiles, for the threshold rule)
        seconds["distance"] = seconds.get("distance", 0.0) + reference["seconds"]
        with timed(seconds, "eigen"):
            eig = eigen_stage(cfg, GramOperator(D, d_ref, rowsum / T), run)
    logger.info("geodesic IKD: T=%d, %d edges, stages %s", T, info["n_edges"], seconds)
    result = eigen_result(eig, cfg, r, sigma2, seconds, graph_components=info["n_components"],
                          graph_edges=info["n_edges"],
                          knn_recall=info.get("knn_recall"),
                          knn_distance_error=info.get("knn_distance_error"))
    # the out-of-sample map (256 landmarks' Dijkstra rows) is built by the first transform:
    # most fits are fit_transform calls that never map a new row
    result.out_of_sample = DeferredTriangulation(cfg, inp, sigma2, result.embedding, graph)
    return result


# --------------------------------------------------------------------------------------------
# landmark IKD


def _landmark_triangulate(block: np.ndarray, start: int, kernel: GeodesicKernel,
                          pinv: np.ndarray, sq_mean: np.ndarray) -> np.ndarray:
    # triangulation is linear in the landmark rows: each block of landmarks adds its share
    stop = start + block.shape[0]
    return triangulate_block(pinv[:, start:stop], block, sq_mean[start:stop],
                             functools.partial(kernel, overwrite=True))


def _similarity_triangulate(block: np.ndarray, XL: np.ndarray, inverse: InverseKernel,
                            pinv: np.ndarray, sq_mean: np.ndarray) -> np.ndarray:
    D = inverse(np.asarray(block, np.float64) @ XL.T)  # (b, L)
    return triangulate(pinv, D.T, sq_mean)


def fit_landmarks(cfg: IKDConfig, inp: InputData, run: Checkpoint | None = None) -> IKDResult:
    """Landmark IKD: geodesic (``solver="geodesic"``) or plain similarity (``"full"``)."""
    client = active_client(cfg.client)
    assert cfg.n_landmarks is not None  # IKD runs this solver only when n_landmarks is given
    M, L = cfg.n_components, int(cfg.n_landmarks)
    if run is not None:
        logger.info("landmark IKD: the run holds the L x T rows during the fit; it has no "
                    "stage to resume, so an interrupted fit starts again")
    seconds: dict[str, float] = {}
    # a stored input whose rows would pass the in-memory budget is read again by the few passes
    # over them (landmark candidates, the graph's search and edges) rather than held on the
    # workers throughout (4 GB at T=10^7); below it holding them spares those reads
    T, N = inp.data.shape
    held = (cfg.solver != "geodesic" or inp.values is not None
            or not cfg.on_disk(T * N * np.dtype(cfg.dtype).itemsize))
    Xn, sigma2 = prepared_rows(cfg, inp, persist=held)
    inverse = cfg.inverse_kernel(sigma2)

    with timed(seconds, "landmarks"):
        # max-min: farthest points in correlation distance (Euclidean on unit rows); only the
        # rows it samples are computed
        landmarks = select_landmarks(da.map_blocks(_unit_rows, Xn, dtype=np.float64), L,
                                     method=cfg.landmark_method, random_state=cfg.random_state,
                                     client=client)

    # landmark MDS's axes are the landmarks': every point is triangulated into more
    # dimensions and the embedding keeps the principal axes of all of them (principal_axes)
    spare = spare_dimensions(M)
    info: dict = {}
    if cfg.solver == "geodesic":
        # the graph is built on the workers into the scratch location when the partitioned
        # search is taken (else here, and written there once): the shortest-path tasks open it
        # there (memory-mapped when local); it does not travel from this process to every
        # worker. The L x T float32 rows stay in worker memory up to the tile budget, else in
        # a Zarr array the workers write (4 GB at T=10^6, L=1000), in the run's store or at
        # the scratch location, dropped when the stage is done.
        with scratch("graph", None, cfg.scratch, inp) as graph_loc:
            with timed(seconds, "graph"):
                graph, info = neighbour_graph(cfg, Xn, sigma2, client, inp, graph_loc)
                seconds.update(info.get("seconds", {}))
                del Xn  # the graph is all the rest needs: free the persisted rows
            T = graph.n_nodes if isinstance(graph, StoredGraph) else graph.shape[0]
            on_disk = cfg.on_disk(4 * L * T)
            # above the budget the rows stay in a store the out-of-sample map reads from
            rows_loc = (kept_scratch("landmark_geodesics", run, cfg.scratch, inp) if on_disk
                        else None)
            # a failed or interrupted fit deletes them (none of its objects would)
            with deleted_on_failure(unkept(rows_loc, run)):
                with timed(seconds, "shortest_paths"):
                    rows = GeodesicRows.compute(graph, landmarks, client=client,
                                                dtype=np.float32,
                                                out=rows_loc,
                                                graph_store=graph_loc.child("prepared"),
                                                columns=landmarks)
                    del graph  # the store holds it as long as the rows need it
                kernel = GeodesicKernel(inverse, None)
                with timed(seconds, "landmark_mds"):
                    P_LL = rows.columns(landmarks)
                    D_LL = kernel(P_LL)
                    np.fill_diagonal(D_LL, 0.0)
                    mds = landmark_mds(D_LL, M, n_spare=spare)
                with timed(seconds, "triangulate"):
                    embedding = rows.map_sum(_landmark_triangulate, kernel, mds.pinv,
                                             mds.sq_mean)
                    axes = principal_axes(embedding, M)
                    embedding, pinv = embedding @ axes, axes.T @ mds.pinv
                    # the out-of-sample map keeps the rows: in memory within the budget,
                    # else the store they were written to
                    paths = rows.stored() if on_disk else rows.gather()
                    rows.release()
                    oos = triangulation_map(cfg, inp, sigma2, embedding, landmarks, paths, P_LL,
                                            pinv=pinv)
                    if rows_loc is not None and oos is not None:
                        delete_with(oos, rows_loc, run)
    else:
        with timed(seconds, "landmark_mds"):
            order = np.argsort(landmarks)
            (XL,) = compute(Xn[landmarks[order]], client=client)
            XL = np.asarray(XL, np.float64)[np.argsort(order)]
            D_LL = inverse(XL @ XL.T, diagonal=True)
            mds = landmark_mds(D_LL, M, n_spare=spare)
        with timed(seconds, "triangulate"):
            XL_d = dask.delayed(XL, traverse=False)
            task = dask.delayed(_similarity_triangulate, pure=True)
            parts = compute(*[task(b, XL_d, inverse, mds.pinv, mds.sq_mean)
                              for b in Xn.to_delayed().ravel()], client=client)
            embedding = np.vstack(parts)
            axes = principal_axes(embedding, M)
            embedding, pinv = embedding @ axes, axes.T @ mds.pinv
            oos = triangulation_map(cfg, inp, sigma2, embedding, landmarks, None, pinv=pinv)
    B = double_centre((D_LL + D_LL.T) / 2)
    return IKDResult(
        embedding=embedding,
        eigenvalues=mds.eigenvalues[:M],
        eigen_residuals=mds.residuals[:M],
        eigen_passes=1,  # landmark MDS is one dense L x L eigenproblem
        explained_variance_ratio=float(np.sum(mds.eigenvalues[:M]**2) / np.sum(B * B)),
        reference_index=None,
        sigma2=sigma2,
        timings=seconds,
        graph_components=info.get("n_components"),
        graph_edges=info.get("n_edges"),
        landmarks=landmarks,
        out_of_sample=oos,
        knn_recall=info.get("knn_recall"),
        knn_distance_error=info.get("knn_distance_error"),
    )
