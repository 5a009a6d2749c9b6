"""Isomap and Landmark Isomap on the shared graph machinery (``dr_dask.graph``).

Full Isomap: blockwise kNN graph -> explicit connectivity repair -> Dijkstra over blocks of
sources on the workers, squared in the task -> top-d algebraic eigenpairs of
``B = -1/2 H D2 H`` by block Lanczos. ``B`` is never formed: one product is
``B V = -1/2 Hc(D2 Hc(V))`` with ``Hc`` the column-centring (rank-one corrections), and ``D2 V``
runs where D2 lives: in this process up to ``dr_dask.isomap.dist-matrix-max`` rows (kept as
``dist_matrix_``, its row blocks copied as they finish), in a Zarr store (``geodesic_store``), else
as float32 upper tiles in worker memory, written straight from Dijkstra
(:func:`dr_dask.graph.paths.geodesic_tiles`).

Landmark Isomap (de Silva & Tenenbaum 2003): L landmarks, the L x T geodesics (float32, row
blocks on the workers), classical MDS of the L x L block and distance-based triangulation of every
point, summed over landmark row blocks on the workers, so the driver never holds L x T while
fitting.

Out-of-sample points (both): geodesics through their k nearest training points
(:func:`dr_dask.graph.geodesics_via_neighbors`); full Isomap then projects the kernel-centred
vector with ``x_k = q_k^T f / sqrt(lambda_k)`` (Law & Jain eq. 3 in full, as scikit-learn's
``Isomap.transform``; docs/decisions.md GPI-SQRT on the paper's sqrt(lambda) erratum), Landmark
Isomap triangulates.
"""

from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any, ClassVar

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.neighbors import NearestNeighbors
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from dr_dask.graph import (
    GeodesicRows,
    connect_components,
    geodesics_via_neighbors,
    kneighbors,
    kneighbors_graph,
    landmark_mds,
    select_landmarks,
    shortest_paths,
    triangulate,
)
from dr_dask.graph.knn import KNN_CONSTRAINTS, kneighbors_local
from dr_dask.graph.landmarks import triangulate_block
from dr_dask.graph.partitioned import stored_neighbour_graph
from dr_dask.graph.paths import geodesic_tiles
from dr_dask.graph.sssp import dijkstra_rows
from dr_dask.graph.stored import StoredGraph
from dr_dask.io.checkpoint import delete_with, kept_scratch, scratch
from dr_dask.io.inputs import InputData
from dr_dask.io.storage import Location
from dr_dask.io.validation import (
    Options,
    check_array_like,
    check_input,
    check_params,
    clamp_to_samples,
    is_stored,
    non_negative,
    positive,
)
from dr_dask.linalg.mds import classical_mds, double_centre, scaled_vectors
from dr_dask.linalg.tiles import row_stats, strip_grid, tile_stats
from dr_dask.methods.labelled import LabelledOutput
from dr_dask.runtime import config
from dr_dask.runtime.blas import single_blas_thread
from dr_dask.runtime.cluster import ClientParam, active_client, run_stage
from dr_dask.runtime.progress import shown_during
from dr_dask.runtime.resources import timed

logger = logging.getLogger(__name__)

#: Bytes of one (queries x T) float64 temporary in ``transform``.
_CHUNK_BYTES = 1 << 26


# ---------------------------------------------------------------------------------------------
# shared helpers


#: Parameter constraints shared by both estimators (scikit-learn's vocabulary).
_COMMON_CONSTRAINTS: dict = {
    "n_components": [positive(Integral)],
    "on_disconnected": [Options({"bridge", "raise", "ignore"})],
    "random_state": ["random_state"],
    "client": "no_validation",
    "progress": ["boolean"],
    "geodesic_store": "no_validation",  # a path, URL, Location or zarr.Array
    "block_size": [positive(Integral)],
    **KNN_CONSTRAINTS,
}


def _training(estimator: Any, X: Any) -> np.ndarray:
    """The checked float64 training array (any input kind; MDS needs 2 points at least)."""
    check_params(estimator)
    values = check_input(estimator, X, reset=True, in_memory=True, dtype=np.float64,
                         min_samples=2).values
    assert values is not None  # in_memory=True always holds the checked values
    return values


def _n_components(n_components: int, n_points: int, points: str) -> int:
    """n_components, checked against the data: classical MDS of n points has at most n - 1
    dimensions."""
    if n_components >= n_points:
        raise ValueError(
            f"n_components={n_components} needs at least {n_components + 1} {points} (n points "
            f"embed in at most n - 1 dimensions), got {n_points}")
    return int(n_components)


def _neighbour_graph(est: Any, X: Any, n_neighbors: int | None, radius: float | None,
                     client: Any, where: Location | None = None,
                     timings: dict | None = None) -> sp.csr_matrix | StoredGraph:
    """The estimator's repaired graph; sets its ``knn_recall_`` (None for the radius rule).

    With ``where`` (a scratch location every worker reaches), a k-rule graph whose search
    resolves to the partitioned one is built on the workers and stored there
    (:func:`~dr_dask.graph.partitioned.stored_neighbour_graph`); its stages' seconds go to
    ``timings`` as ``graph.<stage>``.
    """
    T = X.shape[0]
    if (n_neighbors is None) == (radius is None):
        raise ValueError("give exactly one of n_neighbors (k rule) and radius (epsilon rule); "
                         f"got n_neighbors={n_neighbors}, radius={radius}")
    if n_neighbors is not None and not 1 <= n_neighbors < T:
        raise ValueError(f"n_neighbors={n_neighbors} must be in [1, {T - 1}] for {T} samples "
                         "(a point is not its own neighbour)")
    if where is not None and n_neighbors is not None:
        stored = stored_neighbour_graph(X, n_neighbors, where, knn=est.knn,
                                        n_probe=est.n_probe, client=client,
                                        on_disconnected=est.on_disconnected,
                                        random_state=est.random_state)
        if stored is not None:
            est.knn_recall_ = stored.recall
            if timings is not None:
                timings.update({f"graph.{k}": v for k, v in stored.seconds.items()})
            return stored.graph
    search = {"knn": est.knn, "n_probe": est.n_probe, "random_state": est.random_state}
    graph = kneighbors_graph(X, n_neighbors, radius=radius, client=client, search=search)
    est.knn_recall_ = search.get("recall")
    return connect_components(graph, X, on_disconnected=est.on_disconnected)


@dataclass
class _Neighbours:
    """Picklable view of what finding the training neighbours of new points needs."""

    training: np.ndarray
    n_neighbors: int | None
    radius: float | None

    def query(self, Xq: np.ndarray, client: Any = None, local: bool = False):
        """Neighbours of checked float64 points ``Xq`` (see ``check_input``)."""
        if self.radius is None:
            assert self.n_neighbors is not None  # fit checked that exactly one rule is given
            if local:
                return kneighbors_local(self.training, self.n_neighbors, Xq)
            return kneighbors(self.training, self.n_neighbors, query=Xq, client=client)
        dist, idx = NearestNeighbors(radius=self.radius).fit(self.training).radius_neighbors(Xq)
        counts = np.array([len(i) for i in idx])
        if (counts == 0).any():
            rows = np.flatnonzero(counts == 0)[:10].tolist()
            raise ValueError(f"rows {rows} of X have no training point within radius="
                             f"{self.radius}; their geodesics are undefined")
        D = np.full((len(idx), counts.max()), np.inf)
        ind = np.full(D.shape, -1, dtype=np.int64)
        for r, (d, i) in enumerate(zip(dist, idx)):
            D[r, : len(d)], ind[r, : len(i)] = d, i
        return D, ind


def _chunked_transform(Xq: np.ndarray, nbrs: _Neighbours, rows_for, finish, n_cols: int,
                       client: Any = None, local: bool = False) -> np.ndarray:
    """Shared transform loop: neighbours, batch of geodesic rows, geodesics, finish(g)."""
    dist, idx = nbrs.query(Xq, client=client, local=local)
    step = max(1, _CHUNK_BYTES // (8 * n_cols))
    out = []
    for s in range(0, len(Xq), step):
        d, i = dist[s : s + step], idx[s : s + step]
        U, local_idx = np.unique(np.where(i < 0, 0, i), return_inverse=True)
        local_idx = np.where(i < 0, -1, local_idx.reshape(i.shape))
        g = geodesics_via_neighbors(d, local_idx, rows_for(U))
        out.append(finish(g))
    return np.vstack(out)


def _transform_dask(X: da.Array, fn, n_out: int) -> da.Array:
    """Apply ``fn(block)`` to every row block: a dask array with X's row chunks."""
    X = X.rechunk({1: -1})
    blocks = X.to_delayed().ravel()
    # one graph key holds the projector, so its arrays are shipped once, not once per block
    fn_key = dask.delayed(fn)
    parts = [da.from_delayed(dask.delayed(_call)(fn_key, b), shape=(n, n_out), dtype=np.float64)
             for b, n in zip(blocks, X.chunks[0])]
    return da.concatenate(parts, axis=0)


def _call(fn, block: np.ndarray) -> np.ndarray:
    # a dask input's values are seen only here, block by block
    return fn(check_array_like(block, "X"))


def _out_of_sample(estimator: Any, X: Any) -> np.ndarray | da.Array:
    """``transform`` of both estimators: a dask array maps lazily, block by block; any other
    input (array-like, path, zarr, xarray) is checked and mapped in memory."""
    proj = estimator._projector()
    if isinstance(getattr(estimator, "training_data_", None), da.Array):
        # a training set in a store: the neighbours are searched blockwise where its rows are
        inp = check_input(estimator, X, reset=False, in_memory=not is_stored(X),
                          dtype=np.float64)
        query = inp.values if inp.values is not None else inp.data
        return proj(query, client=active_client(estimator.client), local=False)
    if isinstance(X, da.Array):
        check_input(estimator, X, reset=False)  # the caller's row chunks are kept
        return _transform_dask(X, proj, estimator.embedding_.shape[1])
    X = check_input(estimator, X, reset=False, in_memory=True, dtype=np.float64).values
    return proj(X, client=active_client(estimator.client), local=False)


# ---------------------------------------------------------------------------------------------
# full Isomap


class _SquaredGeodesics:
    """D2 as an operator over its row blocks (SymmetricOperator protocol); ``dense`` is D2
    when it is in memory anyway (the dense eigensolver then uses it without a copy)."""

    def __init__(self, rows: GeodesicRows, dense: np.ndarray | None = None):
        self.rows = rows
        self.dense = dense
        self.shape = rows.shape

    def matmat(self, V: np.ndarray) -> np.ndarray:
        return np.vstack(self.rows.map(_block_matmul, V))

    def to_dense(self) -> np.ndarray:
        return self.dense if self.dense is not None else self.rows.gather(np.float64)


def _identity(P: np.ndarray) -> np.ndarray:
    return P


def _block_matmul(block: np.ndarray, start: int, V: np.ndarray) -> np.ndarray:
    return block @ V


def _block_row_means(block: np.ndarray, start: int) -> np.ndarray:
    return block.mean(axis=1, dtype=np.float64)


@dataclass
class _IsomapProjector:
    """Picklable out-of-sample map of a fitted Isomap (sent once per transform to the workers)."""

    nbrs: _Neighbours
    graph: sp.csr_matrix
    dist_matrix: np.ndarray | None
    store: Any
    sq_row_mean: np.ndarray
    vectors: np.ndarray
    eigenvalues: np.ndarray

    def rows(self, U: np.ndarray, client: Any = None, local: bool = False) -> np.ndarray:
        if self.dist_matrix is not None:
            return self.dist_matrix[U]
        if self.store is not None:
            # the store holds squared geodesics
            return np.sqrt(self.store.get_orthogonal_selection((U, slice(None))))
        if local:
            return dijkstra_rows(self.graph, U)
        return shortest_paths(self.graph, U, client=client)

    def project(self, g: np.ndarray) -> np.ndarray:
        # new rows centred against the training means (the out-of-sample form of MDS)
        f = double_centre(g * g, col_mean=self.sq_row_mean, total=self.sq_row_mean.mean())
        lam = self.eigenvalues
        scale = np.where(lam > 0, 1.0 / np.sqrt(np.where(lam > 0, lam, 1.0)), 0.0)
        return (f @ self.vectors) * scale

    def __call__(self, Xq: np.ndarray, client: Any = None, local: bool = True) -> np.ndarray:
        return _chunked_transform(
            Xq, self.nbrs, lambda U: self.rows(U, client, local), self.project,
            len(self.sq_row_mean), client=client, local=local,
        )


class Isomap(ClientParam, LabelledOutput, TransformerMixin, BaseEstimator):
    """Isomap with distributed shortest paths and a matrix-free eigensolver.

    Input (``fit`` and ``transform``): an array-like, a dask, zarr or xarray array, or a
    path / URL accepted by :func:`dr_dask.open_dataset`, of shape (T, N); it is read whole
    (the graph and the geodesics are distributed, the points are not). Duplicate rows are kept
    (zero-length edges) and embedded with their twin, with a
    :class:`~dr_dask.io.validation.DuplicatePointsWarning`.

    Parameters
    ----------
    n_neighbors : int or None, default=5
        k of the k-nearest-neighbour graph (``None`` when ``radius`` is used).
    radius : float or None, default=None
        Epsilon rule instead of the k rule (give exactly one of the two).
    n_components : int, default=2
        Embedding dimension d (less than the number of samples).
    eigen_solver : {"auto", "dense", "lanczos"}, default="auto"
        ``"auto"``: dense LAPACK up to ``dr_dask.eigen.dense-max`` rows (1500), block Lanczos
        on the centred operator above. ``"dense"`` needs T <= ``dr_dask.isomap.dist-matrix-max``
        (10,000; it forms B).
    tol : float, default=1e-10
        Relative eigen-residual tolerance of the Lanczos solver.
    max_iter : int or None, default=None
        Cap on operator products (passes over D2); ``None`` is 100.
    on_disconnected : {"bridge", "raise", "ignore"}, default="bridge"
        A disconnected graph's components are joined by their shortest edges (with a
        warning), refused, or left as they are; see :func:`dr_dask.graph.connect_components`.
    random_state : int, RandomState instance or None, default=None
        Seeds the Lanczos start block.
    client : distributed.Client or None, default=None
        Cluster for the graph, the shortest paths and the products; ``None`` takes the active
        client, else dask's threads.
    geodesic_store : str, Location, zarr.Array or None, default=None
        Zarr array (or local path / URL; a :class:`~dr_dask.io.storage.Location` carries storage
        options) for the squared geodesics, for T too large for worker memory. ``None``: in
        this process up to ``dr_dask.isomap.dist-matrix-max`` rows (10,000), else float32
        tiles in worker memory.
    block_size : int, default=256
        Dijkstra sources per task.
    progress : bool, default=False
        Progress bars on the fit's computations: a widget in Jupyter, text on a terminal's
        stderr, nothing in a pipe (:mod:`dr_dask.runtime.progress`).
    knn : {"auto", "exact", "ivf"}, default="auto"
        Neighbour search of the k rule: exact, or the partitioned approximate IVF search
        (:func:`dr_dask.graph.knn.search_neighbours`; its lists go to a local temporary
        directory); ``"auto"`` takes IVF from ``dr_dask.knn.ivf-min-rows`` rows (one search,
        its estimated recall in ``knn_recall_``), else the exact search.
    n_probe : int or None, default=None
        Lists (of about sqrt(T)) each row searches with IVF; ``None``: adaptive, as many as
        keep about 0.975 of the true neighbours (measured on the fit's own lists, at most
        ``dr_dask.knn.max-probe``); at least the number of lists: exact.

    Attributes
    ----------
    embedding_ : ndarray of shape (T, d)
    eigenvalues_ : ndarray of shape (d,)
        Top algebraic eigenvalues of ``-1/2 H D2 H``.
    eigenvectors_ : ndarray of shape (T, d)
    eigen_residuals_ : ndarray of shape (d,)
    training_data_ : ndarray of shape (T, N)
    n_features_in_ : int
    graph_ : scipy.sparse.csr_matrix of shape (T, T)
        The (repaired) neighbour graph.
    knn_recall_ : float or None
        Share of the true neighbours found (1.0 exact, IVF: estimated on 200 seeded rows,
        warning below 0.9); None for the radius rule.
    geodesic_sq_row_mean_ : ndarray of shape (T,)
        Row means of the squared geodesic matrix.
    dist_matrix_ : ndarray of shape (T, T)
        Geodesic distances, kept only when T <= 10,000 (like scikit-learn's).
    geodesic_store_ : zarr.Array or None
        Squared geodesics when ``geodesic_store`` was given.
    timings_ : dict
        Wall seconds per stage of ``fit``.

    See Also
    --------
    LandmarkIsomap : L x T geodesics instead of T x T, for large T.
    IKD : inverse kernel decomposition, for data that are a smooth map of their latent.
    sklearn.manifold.Isomap : the single-process reference this equals.

    Examples
    --------
    >>> from sklearn.datasets import make_swiss_roll
    >>> from dr_dask import Isomap
    >>> X, t = make_swiss_roll(n_samples=300, random_state=0)
    >>> iso = Isomap(n_neighbors=10, n_components=2).fit(X)
    >>> iso.embedding_.shape
    (300, 2)
    >>> iso.transform(X[:5]).shape
    (5, 2)
    """

    _parameter_constraints: ClassVar[dict] = {
        **_COMMON_CONSTRAINTS,
        "n_neighbors": [positive(Integral), None],
        "radius": [positive(Real), None],
        "eigen_solver": [Options({"auto", "dense", "lanczos"})],
        "tol": [non_negative(Real)],
        "max_iter": [positive(Integral), None],
    }

    def __init__(self, *, n_neighbors: int | None = 5, radius: float | None = None,
                 n_components: int = 2, eigen_solver: str = "auto", tol: float = 1e-10,
                 max_iter: int | None = None, on_disconnected: str = "bridge",
                 random_state: int | np.random.RandomState | None = None, client: Any = None,
                 geodesic_store: Any = None, block_size: int = 256, progress: bool = False,
                 knn: str = "auto", n_probe: int | None = None):
        self.knn = knn
        self.n_probe = n_probe
        self.n_neighbors = n_neighbors
        self.radius = radius
        self.n_components = n_components
        self.eigen_solver = eigen_solver
        self.tol = tol
        self.max_iter = max_iter
        self.on_disconnected = on_disconnected
        self.random_state = random_state
        self.client = client
        self.geodesic_store = geodesic_store
        self.block_size = block_size
        self.progress = progress

    @shown_during
    def fit(self, X: Any, y: Any = None) -> Isomap:
        """Fit on X of shape (T, N) (see the class docstring for input kinds). Returns self."""
        X = _training(self, X)
        T = X.shape[0]
        d = _n_components(self.n_components, T, "samples")
        solver = self.eigen_solver
        if solver == "auto":
            solver = "dense" if T <= config.get("eigen.dense-max") else "lanczos"
        dist_max = config.get("isomap.dist-matrix-max")
        if solver == "dense" and T > dist_max:
            raise ValueError(f"eigen_solver='dense' forms a T x T matrix; T={T} > "
                             f"{dist_max}: use 'lanczos'")
        return run_stage("isomap", lambda: self._fit(X, d, solver))

    def _squared_geodesics(
        self, T: int, client: Any
    ) -> tuple[Any, np.ndarray | None, Any, np.ndarray]:
        """The operator of the squared geodesics along ``graph_``, the in-memory float64
        squares (``T <= isomap.dist-matrix-max``, else None), the geodesic store's location
        (``geodesic_store``, else None) and the squares' row means."""
        D2, store = None, None
        dist_max = config.get("isomap.dist-matrix-max")
        if self.geodesic_store is not None or T <= dist_max:
            # the workers write the rows to the store, or (wait=False) this process copies
            # them as they finish: the copies overlap the later blocks' Dijkstra and the
            # workers never hold them all
            rows = GeodesicRows.compute(self.graph_, client=client, block_size=self.block_size,
                                        square=True, out=self.geodesic_store, wait=False)
            store = rows.store
            if T <= dist_max:
                # kept anyway for dist_matrix_: products on it here cost no round trips
                D2 = rows.gather(np.float64, release=True)
                sq_mean = D2.mean(axis=1)
                # row blocks of D2 (views): the products run on this process's threads
                rows = GeodesicRows((T, T), rows.bounds,
                                    [D2[s:e] for s, e in zip(rows.bounds, rows.bounds[1:])],
                                    None, store, D2.dtype)
            else:
                sq_mean = np.concatenate(rows.map(_block_row_means))
            op: Any = _SquaredGeodesics(rows, D2)
        else:
            # the upper tiles straight from Dijkstra in worker memory, float32 (a quarter of
            # the full float64 rows: 0.9 instead of 3.2 GB at T=20,000; rounding 6e-8, far
            # below the embedding's accuracy), multiplied in float64 for the 1e-10 tolerance
            grid = strip_grid(T, client)
            op, stats = geodesic_tiles(self.graph_, grid, _identity, stats_fn=tile_stats,
                                       square=True, dtype=np.float32, precision=np.float64,
                                       client=client)
            sq_mean = row_stats(grid, stats)[1] / T
        return op, D2, store, sq_mean

    # one BLAS thread in this process for the whole fit (see dr_dask.runtime.blas): its BLAS calls (the
    # cell search's principal axes, the products over D2's row blocks on dask's threads, the
    # eigensolver's) run beside dask's threads or a LocalCluster's workers on the same cores
    @single_blas_thread()
    def _fit(self, X: np.ndarray, d: int, solver: str) -> Isomap:
        T = X.shape[0]
        client = active_client(self.client)
        timings: dict[str, float] = {}
        with timed(timings, "graph"):
            self.graph_ = _neighbour_graph(self, X, self.n_neighbors, self.radius, client)

        with timed(timings, "shortest_paths"):
            op, D2, store, sq_mean = self._squared_geodesics(T, client)

        with timed(timings, "eigen"):
            res = classical_mds(op, d, method=solver, tol=self.tol,
                                max_passes=self.max_iter or 100,
                                random_state=check_random_state(self.random_state))
            del op  # frees the tiles on the workers
        lam, V = res.values, res.vectors  # signs fixed by top_eigh
        if np.any(lam <= 0):
            warnings.warn(f"Isomap: eigenvalues {lam[lam <= 0]} are not positive; the matching "
                          "embedding axes are set to zero", RuntimeWarning, stacklevel=2)
        self.eigenvalues_ = lam
        self.eigenvectors_ = V
        self.eigen_residuals_ = res.residuals
        self.embedding_ = scaled_vectors(lam, V)
        self.geodesic_sq_row_mean_ = sq_mean
        self.dist_matrix_ = np.sqrt(D2, out=D2) if D2 is not None else None
        self.geodesic_store_ = store
        self.training_data_ = X
        self.timings_ = timings
        logger.info("Isomap fit: T=%d, eigenvalues %s, %d operator passes, timings %s",
                    T, lam, res.n_passes, timings)
        return self

    def fit_transform(self, X: Any, y: Any = None) -> np.ndarray:
        """Fit and return ``embedding_`` of shape (T, d)."""
        return self.fit(X).embedding_

    def _projector(self) -> _IsomapProjector:
        check_is_fitted(self, "embedding_")
        return _IsomapProjector(
            _Neighbours(self.training_data_, self.n_neighbors, self.radius), self.graph_,
            self.dist_matrix_, self.geodesic_store_, self.geodesic_sq_row_mean_,
            self.eigenvectors_, self.eigenvalues_,
        )

    def transform(self, X: Any) -> np.ndarray | da.Array:
        """Embed new points of shape (n, N); a dask array in gives a dask array out.

        Geodesics to the training points go through each point's ``n_neighbors`` nearest
        training points; the kernel-centred vector is projected with ``1/sqrt(lambda)``.
        """
        return _out_of_sample(self, X)


# ---------------------------------------------------------------------------------------------
# Landmark Isomap


def _squared(paths: np.ndarray) -> np.ndarray:
    D2 = paths.astype(np.float64)
    return np.multiply(D2, D2, out=D2)


def _block_triangulate(block: np.ndarray, start: int, pinv: np.ndarray,
                       sq_mean: np.ndarray) -> np.ndarray:
    # triangulation is linear in the landmark rows: each block adds its share
    s, e = start, start + block.shape[0]
    return triangulate_block(pinv[:, s:e], block, sq_mean[s:e], _squared)


@dataclass
class _LandmarkProjector:
    """Picklable out-of-sample map of a fitted Landmark Isomap."""

    nbrs: _Neighbours
    landmark_geodesics: Any  # (L, T) ndarray or zarr.Array
    pinv: np.ndarray
    sq_mean: np.ndarray

    def rows(self, U: np.ndarray) -> np.ndarray:
        G = self.landmark_geodesics
        cols = G[:, U] if isinstance(G, np.ndarray) else G.get_orthogonal_selection(
            (slice(None), U))
        return np.asarray(cols, dtype=np.float64).T  # (|U|, L)

    def finish(self, g: np.ndarray) -> np.ndarray:
        return triangulate(self.pinv, (g * g).T, self.sq_mean)

    def __call__(self, Xq: np.ndarray, client: Any = None, local: bool = True) -> np.ndarray:
        return _chunked_transform(Xq, self.nbrs, self.rows, self.finish, len(self.sq_mean),
                                  client=client, local=local)


class LandmarkIsomap(ClientParam, LabelledOutput, TransformerMixin, BaseEstimator):
    """Landmark Isomap (de Silva & Tenenbaum): L x T geodesics instead of T x T.

    Input, and duplicate rows: as :class:`Isomap`.

    Parameters
    ----------
    n_neighbors : int, default=5
        k of the neighbour graph.
    n_components : int, default=2
        Embedding dimension d (less than the number of landmarks).
    n_landmarks : int, default=1000
        L. More than the samples uses every sample, with a warning (as scikit-learn's
        ``Nystroem`` clamps its ``n_components``).
    landmark_method : {"maxmin", "random"}, default="maxmin"
        Max-min picks landmarks by Euclidean farthest-point order (spreads them over the data);
        random is a seeded uniform choice.
    on_disconnected : {"bridge", "raise", "ignore"}, default="bridge"
        As :class:`Isomap`'s.
    random_state : int, RandomState instance or None, default=None
        Seeds the landmark choice.
    client : distributed.Client or None, default=None
        As :class:`Isomap`'s.
    geodesic_store : str, Location, zarr.Array or None, default=None
        Zarr array (or local path / URL; a :class:`~dr_dask.io.storage.Location` carries storage
        options) for the L x T geodesics (float32); ``None`` keeps them in memory as
        ``landmark_geodesics_`` up to ``dr_dask.tiles.memory-bytes``, above it in a Zarr
        array at the fit's scratch location (``scratch``, else next to a remote input, else a
        local temporary directory), which ``transform`` reads and which is deleted with the
        estimator.
    block_size : int, default=256
        Landmark sources per Dijkstra task.
    progress : bool, default=False
        Progress bars on the fit's computations: a widget in Jupyter, text on a terminal's
        stderr, nothing in a pipe (:mod:`dr_dask.runtime.progress`).
    knn : {"auto", "exact", "ivf"}, default="auto"
        Neighbour search of the graph, as :class:`Isomap`'s. With the partitioned search the
        graph is built on the workers (:mod:`dr_dask.graph.partitioned`): no process holds all
        its edges.
    n_probe : int or None, default=None
        Lists each row searches with IVF, as :class:`Isomap`'s.
    scratch : str, Location or None, default=None
        Where the workers write the IVF lists and the graph during the fit (a local path or
        URL every worker reaches; a :class:`~dr_dask.io.storage.Location` carries storage
        options); None: next to a remote input (its bucket), else a local temporary
        directory. Deleted when the fit ends.

    Attributes
    ----------
    embedding_ : ndarray of shape (T, d)
    landmarks_ : ndarray of shape (L,)
        Landmark row indices.
    landmark_embedding_ : ndarray of shape (L, d)
        Landmark MDS coordinates (equal to ``embedding_[landmarks_]``).
    eigenvalues_ : ndarray of shape (d,)
    landmark_pinv_ : ndarray of shape (d, L)
    landmark_sq_mean_ : ndarray of shape (L,)
    landmark_geodesics_ : ndarray of shape (L, T) float32, or zarr.Array
    training_data_ : ndarray or dask array of shape (T, N)
        The input; a dask array over the store for a stored or dask input (then ``transform``
        finds the new points' neighbours blockwise on the workers and returns a NumPy array).
    n_features_in_ : int
    graph_ : scipy.sparse.csr_matrix of shape (T, T) or None
        None when the graph was built on the workers (it lived at ``scratch``).
    knn_recall_ : float
        As :class:`Isomap`'s.
    timings_ : dict
        Wall seconds per stage.

    See Also
    --------
    Isomap : every geodesic (T x T), exact classical MDS.
    IKD : with ``n_landmarks``, landmark IKD on correlation geodesics.

    Examples
    --------
    >>> from sklearn.datasets import make_swiss_roll
    >>> from dr_dask import LandmarkIsomap
    >>> X, t = make_swiss_roll(n_samples=300, random_state=0)
    >>> lm = LandmarkIsomap(n_neighbors=10, n_landmarks=50, random_state=0).fit(X)
    >>> lm.embedding_.shape, lm.landmarks_.shape
    ((300, 2), (50,))
    >>> lm.transform(X[:5]).shape
    (5, 2)
    """

    _parameter_constraints: ClassVar[dict] = {
        **_COMMON_CONSTRAINTS,
        "n_neighbors": [positive(Integral)],
        "n_landmarks": [positive(Integral)],
        "landmark_method": [Options({"maxmin", "random"})],
        "scratch": "no_validation",  # a path, URL or Location
    }

    def __init__(self, *, n_neighbors: int = 5, n_components: int = 2, n_landmarks: int = 1000,
                 landmark_method: str = "maxmin", on_disconnected: str = "bridge",
                 random_state: int | np.random.RandomState | None = None, client: Any = None,
                 geodesic_store: Any = None, block_size: int = 256, progress: bool = False,
                 knn: str = "auto", n_probe: int | None = None, scratch: Any = None):
        self.knn = knn
        self.n_probe = n_probe
        self.scratch = scratch
        self.n_neighbors = n_neighbors
        self.n_components = n_components
        self.n_landmarks = n_landmarks
        self.landmark_method = landmark_method
        self.on_disconnected = on_disconnected
        self.random_state = random_state
        self.client = client
        self.geodesic_store = geodesic_store
        self.block_size = block_size
        self.progress = progress

    @shown_during
    def fit(self, X: Any, y: Any = None) -> LandmarkIsomap:
        """Fit on X of shape (T, N) (input kinds as :class:`Isomap`). Returns self.

        A stored or dask input stays where it is: the workers read its rows (its values are
        checked block by block as they are read), and this process never holds them.
        """
        check_params(self)
        inp = check_input(self, X, reset=True, in_memory=not is_stored(X), dtype=np.float64,
                          min_samples=2)
        X = inp.values if inp.values is not None else inp.data
        T = X.shape[0]
        L = clamp_to_samples(self, "n_landmarks", T)
        d = _n_components(self.n_components, L, "landmarks")
        return run_stage("landmark_isomap", lambda: self._fit(X, L, d, inp))

    def _fit(self, X: Any, L: int, d: int, inp: InputData) -> LandmarkIsomap:
        T = X.shape[0]
        client = active_client(self.client)
        timings: dict[str, float] = {}
        # the IVF lists and a graph built on the workers live there (by default next to a
        # remote input, else in a local temporary directory) until the rows are used (a row
        # block lost with its worker is recomputed from the graph)
        with scratch("landmark_isomap_graph", None, self.scratch, inp) as where:
            with timed(timings, "graph"):
                # on a cluster the workers read the rows where the input put them
                # (validation.check_input), never from inside the task graph
                graph = _neighbour_graph(self, X if inp.staged is None else inp.data,
                                         self.n_neighbors, None, client, where, timings)
            self.graph_ = None if isinstance(graph, StoredGraph) else graph

            with timed(timings, "landmarks"):
                self.landmarks_ = select_landmarks(X, L, method=self.landmark_method,
                                                   random_state=self.random_state,
                                                   client=client)

            # above the in-memory budget the float32 rows go to a store that transform
            # reads (the fit's scratch, kept while the estimator lives)
            out, kept = self.geodesic_store, None
            if out is None and 4 * L * T > config.get_bytes("tiles.memory-bytes"):
                out = kept = kept_scratch("landmark_geodesics", None, self.scratch, inp)
            with timed(timings, "shortest_paths"):
                rows = GeodesicRows.compute(graph, self.landmarks_, client=client,
                                            block_size=self.block_size, dtype=np.float32,
                                            out=out, columns=self.landmarks_)
            del graph

            with timed(timings, "landmark_mds"):
                D_LL = rows.columns(self.landmarks_).astype(np.float64)
                mds = landmark_mds(D_LL * D_LL, d)

            with timed(timings, "triangulation"):
                self.embedding_ = rows.map_sum(_block_triangulate, mds.pinv, mds.sq_mean)

            with timed(timings, "gather"):
                self.landmark_geodesics_ = (rows.store if rows.store is not None
                                            else rows.gather())
                rows.release()
                if kept is not None:
                    delete_with(self.landmark_geodesics_, kept)
        self.landmark_embedding_ = mds.coords
        self.landmark_pinv_ = mds.pinv
        self.landmark_sq_mean_ = mds.sq_mean
        self.eigenvalues_ = mds.eigenvalues
        self.training_data_ = X
        self.timings_ = timings
        logger.info("LandmarkIsomap fit: T=%d L=%d timings %s", T, L, timings)
        return self

    def fit_transform(self, X: Any, y: Any = None) -> np.ndarray:
        """Fit and return ``embedding_`` of shape (T, d)."""
        return self.fit(X).embedding_

    def _projector(self) -> _LandmarkProjector:
        check_is_fitted(self, "embedding_")
        return _LandmarkProjector(_Neighbours(self.training_data_, self.n_neighbors, None),
                                  self.landmark_geodesics_, self.landmark_pinv_,
                                  self.landmark_sq_mean_)

    def transform(self, X: Any) -> np.ndarray | da.Array:
        """Embed new points of shape (n, N) by triangulation from their landmark geodesics."""
        return _out_of_sample(self, X)
