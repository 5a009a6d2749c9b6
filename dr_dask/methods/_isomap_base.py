"""What Isomap and Landmark Isomap share: the neighbour graph of a fit (any metric, a
precomputed graph, or the partitioned search), the eigensolver's choice, and the out-of-sample
loop (geodesics of new points through their k nearest training points,
:func:`dr_dask.graph.geodesics_via_neighbors`, chunk by chunk; a dask input mapped lazily block by
block)."""

from __future__ import annotations

import logging
from numbers import Integral, Real
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp

from dr_dask.graph import (
    connect_components,
    geodesics_via_neighbors,
    kneighbors_graph,
)
from dr_dask.graph.knn import KNN_CONSTRAINTS, knn_algorithm
from dr_dask.graph.partitioned import stored_neighbour_graph
from dr_dask.graph.stored import StoredGraph
from dr_dask.io.storage import Location
from dr_dask.io.validation import (
    Options,
    check_array_like,
    check_input,
    is_stored,
    non_negative,
    positive,
)
from dr_dask.methods._isomap_sklearn import (
    SKLEARN_CONSTRAINTS,
    Neighbours,
    metric_of,
    nearest_neighbors,
    precomputed,
    precomputed_graph,
    query_input,
)
from dr_dask.runtime import config
from dr_dask.runtime.cluster import active_client

logger = logging.getLogger(__name__)

#: Bytes of one (queries x T) float64 temporary in ``transform``.
_CHUNK_BYTES = 1 << 26



#: Parameter constraints shared by both estimators (scikit-learn's vocabulary).
COMMON_CONSTRAINTS: dict = {
    "n_components": [positive(Integral)],
    "on_disconnected": [Options({"bridge", "raise", "ignore"})],
    "random_state": ["random_state"],
    "client": "no_validation",
    "progress": ["boolean"],
    "geodesic_store": "no_validation",  # a path, URL, Location or zarr.Array
    "block_size": [positive(Integral)],
    "n_neighbors": [positive(Integral), None],
    "radius": [positive(Real), None],
    # "arpack" is scikit-learn's name of an iterative solver: here block Lanczos
    "eigen_solver": [Options({"auto", "dense", "lanczos", "arpack"})],
    "tol": [non_negative(Real)],
    "max_iter": [positive(Integral), None],
    **KNN_CONSTRAINTS,
    **SKLEARN_CONSTRAINTS,
}

#: The Lanczos tolerance ``tol=0`` stands for (ARPACK's 0 is "machine precision"; block
#: Lanczos reaches about this relative residual in float64).
TOL_DEFAULT = 1e-10


def eigen_method(est: Any, T: int) -> str:
    """The :func:`~dr_dask.linalg.top_eigh` method of ``eigen_solver`` for T points."""
    solver = {"arpack": "lanczos"}.get(est.eigen_solver, est.eigen_solver)
    if solver == "auto":
        solver = "dense" if config.get("eigen.dense-max") >= T else "lanczos"
    return solver


def checked_components(n_components: int, n_points: int, points: str) -> int:
    """n_components, checked against the data: classical MDS of n points has at most n - 1
    dimensions."""
    if n_components >= n_points:
        raise ValueError(
            f"n_components={n_components} needs at least {n_components + 1} {points} (n points "
            f"embed in at most n - 1 dimensions), got {n_points}")
    return int(n_components)


def fit_graph(est: Any, X: Any, n_neighbors: int | None, radius: float | None,
                     client: Any, where: Location | None = None,
                     timings: dict | None = None) -> sp.csr_matrix | StoredGraph:
    """The estimator's repaired graph; sets its ``knn_recall_`` and ``knn_distance_error_``
    (None for the radius rule).

    With ``where`` (a scratch location every worker reaches), a k-rule graph whose search
    resolves to the partitioned one is built on the workers and stored there
    (:func:`~dr_dask.graph.partitioned.stored_neighbour_graph`); its stages' seconds go to
    ``timings`` as ``graph.<stage>``.
    """
    T = X.shape[0]
    if n_neighbors is not None and radius is not None:
        raise ValueError(f"Both n_neighbors and radius are provided (n_neighbors={n_neighbors}"
                         f", radius={radius}): give exactly one; use n_neighbors=None for the "
                         "epsilon rule")
    if n_neighbors is None and radius is None:
        raise ValueError("give exactly one of n_neighbors (k rule) and radius (epsilon rule); "
                         "both are None")
    if n_neighbors is not None and not 1 <= n_neighbors < T:
        raise ValueError(f"n_neighbors={n_neighbors} must be in [1, {T - 1}] for {T} samples "
                         "(a point is not its own neighbour)")
    if precomputed(est):
        est._nbrs = nearest_neighbors(est, X)
        est.knn_recall_ = None if radius is not None else 1.0
        est.knn_distance_error_ = None if radius is not None else 0.0
        graph = precomputed_graph(est._nbrs, n_neighbors, radius)
        return connect_components(graph, X, on_disconnected=est.on_disconnected,
                                  metric="precomputed")
    metric = metric_of(est)
    if not metric.euclidean or sp.issparse(X):
        # refuses the partitioned search (Euclidean, dense) by name where it would be taken
        if knn_algorithm(est.knn, T, int(X.shape[1]), metric) == "ivf":
            raise ValueError(f"knn={est.knn!r}: the partitioned neighbour search takes dense "
                             f"rows; sparse X ({T} rows) needs knn='exact'")
        where = None
    if where is not None and n_neighbors is not None:
        stored = stored_neighbour_graph(X, n_neighbors, where, knn=est.knn,
                                        n_probe=est.n_probe, client=client,
                                        on_disconnected=est.on_disconnected,
                                        random_state=est.random_state, knn_tol=est.knn_tol)
        if stored is not None:
            est.knn_recall_, est.knn_distance_error_ = stored.recall, stored.distance_error
            if timings is not None:
                timings.update({f"graph.{k}": v for k, v in stored.seconds.items()})
            return stored.graph
    search = {"knn": est.knn, "n_probe": est.n_probe, "knn_tol": est.knn_tol,
              "random_state": est.random_state}
    graph = kneighbors_graph(X, n_neighbors, radius=radius, client=client, search=search,
                             metric=metric)
    est.knn_recall_, est.knn_distance_error_ = search.get("recall"), search.get("distance_error")
    return connect_components(graph, X, on_disconnected=est.on_disconnected, metric=metric)


def neighbours_of(est: Any) -> Neighbours:
    """What the fitted estimator's ``transform`` searches the new points' neighbours with."""
    fitted = est.nbrs_ if precomputed(est) else None
    return Neighbours(est.training_data_, est.n_neighbors, est.radius, metric_of(est), fitted)


def chunked_transform(Xq: Any, nbrs: Neighbours, geodesic_rows, embed, n_cols: int,
                       client: Any = None, local: bool = False) -> np.ndarray:
    """Shared transform loop: neighbours, batch of geodesic rows, geodesics, embed(g)."""
    dist, idx = nbrs.query(Xq, client=client, local=local)
    step = max(1, _CHUNK_BYTES // (8 * n_cols))
    out = []
    for s in range(0, Xq.shape[0], step):
        d, i = dist[s : s + step], idx[s : s + step]
        U, local_idx = np.unique(np.where(i < 0, 0, i), return_inverse=True)
        local_idx = np.where(i < 0, -1, local_idx.reshape(i.shape))
        g = geodesics_via_neighbors(d, local_idx, geodesic_rows(U))
        out.append(embed(g))
    return np.vstack(out)


def transform_dask(X: da.Array, fn, n_out: int) -> da.Array:
    """Apply ``fn(block)`` to every row block: a dask array with X's row chunks."""
    X = X.rechunk({1: -1})
    blocks = X.to_delayed().ravel()
    # one graph key holds the projector, so its arrays are shipped once, not once per block
    fn_key = dask.delayed(fn)
    parts = [da.from_delayed(dask.delayed(_checked_call)(fn_key, b), shape=(n, n_out),
                             dtype=np.float64) for b, n in zip(blocks, X.chunks[0])]
    return da.concatenate(parts, axis=0)


def _checked_call(fn, block: np.ndarray) -> np.ndarray:
    # a dask input's values are seen only here, block by block
    return fn(check_array_like(block, "X"))


def map_new_rows(estimator: Any, X: Any) -> np.ndarray | da.Array:
    """``transform`` of both estimators: a dask array maps lazily, block by block; any other
    input (array-like, CSR, path, zarr, xarray) is checked and mapped in memory (the
    LabelledOutput wrapper gives the output the training input's float dtype)."""
    proj = estimator._projector()
    client = active_client(estimator.client)
    sparse = query_input(estimator, X)
    if sparse is not None:
        return proj(sparse, client=client, local=False)
    if isinstance(getattr(estimator, "training_data_", None), da.Array):
        # a training set in a store: the neighbours are searched blockwise where its rows are
        inp = check_input(estimator, X, reset=False, in_memory=not is_stored(X),
                          dtype=np.float64)
        query = inp.values if inp.values is not None else inp.data
        return proj(query, client=client, local=False)
    if isinstance(X, da.Array):
        check_input(estimator, X, reset=False)  # the caller's row chunks are kept
        return transform_dask(X, proj, estimator.embedding_.shape[1])
    X = check_input(estimator, X, reset=False, in_memory=True, dtype=np.float64).values
    return proj(X, client=client, local=False)
