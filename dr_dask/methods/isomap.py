"""Isomap and Landmark Isomap on the shared graph machinery (``dr_dask.graph``).

Full Isomap: blockwise kNN graph -> explicit connectivity repair -> Dijkstra over blocks of
sources on the workers, squared in the task -> top-d algebraic eigenpairs of
``B = -1/2 H D2 H`` by block Lanczos. ``B`` is never formed: one product is
``B V = -1/2 Hc(D2 Hc(V))`` with ``Hc`` the column-centring (rank-one corrections), and ``D2 V``
runs where D2 lives: in this process up to ``dr_dask.isomap.dist-matrix-max`` rows (kept as
``dist_matrix_``, its row blocks copied as they finish), in a Zarr store (``geodesic_store``), else
as float32 upper tiles in worker memory, written straight from Dijkstra
(:func:`dr_dask.graph.paths.geodesic_tiles`).

Out-of-sample points: geodesics through their k nearest training points
(:func:`dr_dask.graph.geodesics_via_neighbors`), then the kernel-centred vector projected with
``x_k = q_k^T f / sqrt(lambda_k)`` (Law & Jain eq. 3 in full, as scikit-learn's
``Isomap.transform``; docs/decisions.md GPI-SQRT on the paper's sqrt(lambda) erratum). Landmark
Isomap is :mod:`dr_dask.methods.landmark_isomap`; what both share,
:mod:`dr_dask.methods._isomap_base`.
"""

from __future__ import annotations

import itertools
import logging
import warnings
from dataclasses import dataclass
from typing import Any, ClassVar

import dask.array as da
import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.neighbors import NearestNeighbors
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from dr_dask.graph import (
    GeodesicRows,
    shortest_paths,
)
from dr_dask.graph.knn_tol import DEFAULT_KNN_TOL
from dr_dask.graph.paths import all_pairs, geodesic_tiles
from dr_dask.graph.sssp import dijkstra_rows
from dr_dask.io.storage import Location, location
from dr_dask.linalg.cost import memory_of, quadratic_cost
from dr_dask.linalg.mds import classical_mds, scaled_vectors
from dr_dask.linalg.tiles import row_stats, strip_grid, tile_stats
from dr_dask.methods._isomap_base import (
    _CHUNK_BYTES,
    COMMON_CONSTRAINTS,
    TOL_DEFAULT,
    checked_components,
    chunked_transform,
    eigen_method,
    fit_graph,
    map_new_rows,
    neighbours_of,
)
from dr_dask.methods._isomap_sklearn import (
    KernelProjection,
    Neighbours,
    SklearnIsomapTags,
    nearest_neighbors,
    project,
    reconstruction_error,
    row_blocks,
    training_input,
)
from dr_dask.methods.labelled import LabelledOutput
from dr_dask.methods.persistence import SavedModel
from dr_dask.runtime import config
from dr_dask.runtime.blas import single_blas_thread
from dr_dask.runtime.cluster import ClientParam, active_client, run_stage
from dr_dask.runtime.progress import shown_during
from dr_dask.runtime.resources import timed

logger = logging.getLogger(__name__)




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


def _unchanged(P: np.ndarray) -> np.ndarray:
    return P


def _block_matmul(block: np.ndarray, start: int, V: np.ndarray) -> np.ndarray:
    return block @ V


def _block_row_means(block: np.ndarray, start: int) -> np.ndarray:
    return block.mean(axis=1, dtype=np.float64)

#: The way out of exact Isomap's T x T geodesics, named by their cost warning.
ISOMAP_WAY_OUT = ("LandmarkIsomap(n_landmarks=L), L x T geodesics instead of T x T (e.g. "
                  "n_landmarks=500); Isomap itself stays exact")


@dataclass
class _IsomapProjector:
    """Picklable out-of-sample map of a fitted Isomap (sent once per transform to the workers)."""

    nbrs: Neighbours
    graph: sp.csr_matrix
    dist_matrix: np.ndarray | None
    store: Any
    sq_row_mean: np.ndarray
    vectors: np.ndarray
    eigenvalues: np.ndarray

    def rows(self, U: np.ndarray, client: Any = None, local: bool = False) -> np.ndarray:
        if self.dist_matrix is not None:
            return self.dist_matrix[U].astype(np.float64)
        if self.store is not None:
            # the store holds squared geodesics
            return np.sqrt(self.store.get_orthogonal_selection((U, slice(None))))
        if local:
            return dijkstra_rows(self.graph, U)
        return shortest_paths(self.graph, U, client=client)

    def project(self, g: np.ndarray) -> np.ndarray:
        # new rows centred against the training means (the out-of-sample form of MDS)
        return project(g * g, self.sq_row_mean, self.vectors, self.eigenvalues)

    def __call__(self, Xq: Any, client: Any = None, local: bool = True) -> np.ndarray:
        return chunked_transform(
            Xq, self.nbrs, lambda U: self.rows(U, client, local), self.project,
            len(self.sq_row_mean), client=client, local=local,
        )


class Isomap(SklearnIsomapTags, ClientParam, SavedModel, LabelledOutput,
             TransformerMixin, BaseEstimator):
    """Isomap with distributed shortest paths and a matrix-free eigensolver.

    A drop-in for :class:`sklearn.manifold.Isomap`: its parameters with their meaning (its
    own test file passes against this class), and the fitted ``nbrs_``, ``kernel_pca_``,
    ``dist_matrix_`` and ``reconstruction_error()``.

    Input (``fit`` and ``transform``): an array-like, a CSR matrix, a dask, zarr or xarray
    array, or a path / URL accepted by :func:`dr_dask.open_dataset`, of shape (T, N); it is
    read whole (the graph and the geodesics are distributed, the points are not). With
    ``metric="precomputed"``: a (T, T) distance matrix or sparse neighbour graph (``transform``:
    (n, T) distances to the training points). float32 input gives float32 outputs
    (``embedding_``, ``dist_matrix_``, ``transform``); the work is float64. Duplicate rows are
    kept (zero-length edges) and embedded with their twin, with a
    :class:`~dr_dask.io.validation.DuplicatePointsWarning`.

    Parameters
    ----------
    n_neighbors : int or None, default=5
        k of the k-nearest-neighbour graph (``None`` when ``radius`` is used).
    radius : float or None, default=None
        Epsilon rule instead of the k rule (give exactly one of the two).
    n_components : int, default=2
        Embedding dimension d (less than the number of samples).
    eigen_solver : {"auto", "dense", "arpack", "lanczos"}, default="auto"
        ``"auto"``: dense LAPACK up to ``dr_dask.eigen.dense-max`` rows (1500), block Lanczos
        on the centred operator above. ``"dense"`` needs T <= ``dr_dask.isomap.dist-matrix-max``
        (10,000; it forms B). ``"arpack"`` (scikit-learn's iterative solver) is block Lanczos,
        ``"lanczos"`` by its own name, with ``tol`` and ``max_iter``.
    tol : float, default=1e-10
        Relative eigen-residual tolerance of the Lanczos solver; 0 (scikit-learn's default,
        ARPACK's "machine precision") is 1e-10, what block Lanczos reaches in float64.
    max_iter : int or None, default=None
        Cap on operator products (passes over D2); ``None`` is 100.
    path_method : {"auto", "FW", "D"}, default="auto"
        scikit-learn's shortest-path method. Every choice gives the same geodesics, so all
        run the package's Dijkstra (Floyd–Warshall's T^3 work and T x T memory would not fit
        the sizes this class is for).
    neighbors_algorithm : {"auto", "brute", "kd_tree", "ball_tree"}, default="auto"
        scikit-learn's ``NearestNeighbors`` algorithm: of ``nbrs_``, and of the search in a
        non-Euclidean ``metric``. The Euclidean searches are the package's own (exact
        whatever this says; ``knn`` chooses the partitioned approximate one).
    n_jobs : int or None, default=None
        Of ``nbrs_`` (scikit-learn's meaning there). The fit's own parallelism is its
        ``client`` (else dask's threads).
    metric : str or callable, default="minkowski"
        Distance of the neighbour graph, as scikit-learn's ``NearestNeighbors`` takes it
        (names, callables; with ``p=2`` "minkowski" is Euclidean). Any non-Euclidean metric
        is searched exactly, block by block; ``knn="ivf"`` (the partitioned search, Euclidean
        only) refuses it by name, and so does ``knn="auto"`` where it would take that search.
        ``"precomputed"``: X is a distance matrix or sparse neighbour graph (a sparse graph's
        stored entries are the only candidate edges; one with several components cannot be
        bridged and raises RuntimeError).
    p : float, default=2
        Minkowski power (``metric="minkowski"``).
    metric_params : dict or None, default=None
        Further keyword arguments of the metric.
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
        Lists (of about sqrt(T) / 2) each row searches with IVF; ``None``: adaptive, as many as
        hold the k-th neighbour's distance within ``knn_tol`` of the true one (measured on the
        fit's own lists, at most ``dr_dask.knn.max-probe``); at least the number of lists:
        exact.
    knn_tol : float, default=0.003
        The adaptive probe's target (``n_probe=None``): the mean relative error of the k-th
        neighbour's distance over the true one (:mod:`dr_dask.graph.knn_tol`), in [0, 1); 0
        probes every list (the exact search).

    Attributes
    ----------
    embedding_ : ndarray of shape (T, d)
        In the input's float dtype.
    nbrs_ : sklearn.neighbors.NearestNeighbors
        scikit-learn's neighbour search with this estimator's parameters, fitted on the
        training input (built when first read: the fit searches with the package's own).
    kernel_pca_ : KernelProjection
        scikit-learn keeps a fitted ``KernelPCA`` here; this eigenproblem is solved
        matrix-free, so this holds its result in KernelPCA's names (``eigenvalues_``,
        ``eigenvectors_``, ``transform`` of kernel rows) without the T x T kernel.
    eigenvalues_ : ndarray of shape (d,)
        Top algebraic eigenvalues of ``-1/2 H D2 H``.
    eigenvectors_ : ndarray of shape (T, d)
    eigen_residuals_ : ndarray of shape (d,)
    n_iter_ : int
        Products of the eigensolver with the centred geodesics (1 for the dense solver).
    training_data_ : ndarray of shape (T, N)
    n_features_in_ : int
    graph_ : scipy.sparse.csr_matrix of shape (T, T)
        The (repaired) neighbour graph.
    knn_recall_ : float or None
        Share of the true neighbours found (1.0 exact, IVF: estimated on 200 seeded rows);
        None for the radius rule.
    knn_distance_error_ : float or None
        The mean relative excess of the k-th found neighbour's distance over the true one, on
        the same rows (0.0 exact; a warning far above ``knn_tol``); None for the radius rule.
    geodesic_sq_row_mean_ : ndarray of shape (T,)
        Row means of the squared geodesic matrix.
    dist_matrix_ : ndarray of shape (T, T) or None
        Geodesic distances in the input's float dtype, kept when T <=
        ``dr_dask.isomap.dist-matrix-max`` (10,000; the in-memory budget), else None.
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

    _parameter_constraints: ClassVar[dict] = {**COMMON_CONSTRAINTS}

    def __init__(self, *, n_neighbors: int | None = 5, radius: float | None = None,
                 n_components: int = 2, eigen_solver: str = "auto", tol: float = 1e-10,
                 max_iter: int | None = None, path_method: str = "auto",
                 neighbors_algorithm: str = "auto", n_jobs: int | None = None,
                 metric: str | Any = "minkowski", p: float = 2,
                 metric_params: dict | None = None, on_disconnected: str = "bridge",
                 random_state: int | np.random.RandomState | None = None, client: Any = None,
                 geodesic_store: Any = None, block_size: int = 256, progress: bool = False,
                 knn: str = "auto", n_probe: int | None = None,
                 knn_tol: float = DEFAULT_KNN_TOL):
        self.path_method = path_method
        self.neighbors_algorithm = neighbors_algorithm
        self.n_jobs = n_jobs
        self.metric = metric
        self.p = p
        self.metric_params = metric_params
        self.knn = knn
        self.n_probe = n_probe
        self.knn_tol = knn_tol
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
        X, _, self._out_dtype = training_input(self, X)
        self._nbrs: NearestNeighbors | None = None
        T = X.shape[0]
        d = checked_components(self.n_components, T, "samples")
        solver = eigen_method(self, T)
        dist_max = config.get("isomap.dist-matrix-max")
        if solver == "dense" and dist_max < T:
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
        # Isomap stays exact (scikit-learn's drop-in): its cost is said, never cut
        parts: list[tuple[float, Any]] = []
        if self.geodesic_store is not None:
            where = self.geodesic_store
            parts.append((8.0 * T * T, location(where) if isinstance(where, (str, Location))
                          else f"the zarr array {where}"))
        if dist_max >= T:
            parts.append((8.0 * T * T, memory_of(None)))
        elif self.geodesic_store is None:
            parts.append((T * (T + min(T, int(config.get("tiles.strip-max-rows")))) / 2 * 4,
                          memory_of(client)))
        quadratic_cost("exact Isomap geodesics", T, parts, way_out=ISOMAP_WAY_OUT)
        if self.geodesic_store is not None:
            # the workers write the rows to the store; this process reads them back for
            # dist_matrix_ within isomap.dist-matrix-max
            rows = GeodesicRows.compute(self.graph_, client=client, block_size=self.block_size,
                                        square=True, out=self.geodesic_store)
            store, bounds = rows.store, rows.bounds
            if dist_max >= T:
                D2 = rows.gather(np.float64)
        elif dist_max >= T:
            D2, bounds = all_pairs(self.graph_, client=client, square=True,
                                   block_size=self.block_size)
        else:
            # the upper tiles straight from Dijkstra in worker memory, float32 (a quarter of
            # the full float64 rows; their rounding is far below the embedding's accuracy),
            # multiplied in float64 for the 1e-10 tolerance
            grid = strip_grid(T, client)
            op, stats = geodesic_tiles(self.graph_, grid, _unchanged, stats_fn=tile_stats,
                                       square=True, dtype=np.float32, precision=np.float64,
                                       client=client)
            return op, None, None, row_stats(grid, stats)[1] / T
        if D2 is None:
            sq_mean = np.concatenate(rows.map(_block_row_means))
        else:
            # kept anyway for dist_matrix_: products over its row blocks (views) run on this
            # process's threads, with no round trips
            sq_mean = D2.mean(axis=1)
            blocks = [D2[s:e] for s, e in itertools.pairwise(bounds)]
            rows = GeodesicRows((T, T), bounds, blocks, None, store, D2.dtype)
        return _SquaredGeodesics(rows, D2), D2, store, sq_mean

    # one BLAS thread in this process for the whole fit (see dr_dask.runtime.blas): its BLAS calls
    # (the cell search's principal axes, the products over D2's row blocks on dask's threads, the
    # eigensolver's) run beside dask's threads or a LocalCluster's workers on the same cores
    @single_blas_thread()
    def _fit(self, X: np.ndarray, d: int, solver: str) -> Isomap:
        T = X.shape[0]
        client = active_client(self.client)
        timings: dict[str, float] = {}
        with timed(timings, "graph"):
            self.graph_ = fit_graph(self, X, self.n_neighbors, self.radius, client)

        with timed(timings, "shortest_paths"):
            op, D2, store, sq_mean = self._squared_geodesics(T, client)

        with timed(timings, "eigen"):
            res = classical_mds(op, d, method=solver, tol=self.tol or TOL_DEFAULT,
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
        self.n_iter_ = int(res.n_passes)
        self.embedding_ = scaled_vectors(lam, V).astype(self._out_dtype, copy=False)
        self.geodesic_sq_row_mean_ = sq_mean
        if D2 is not None:
            # the in-memory squares, kept for reconstruction_error as the distances' dtype
            self.dist_matrix_ = np.sqrt(D2, out=D2).astype(self._out_dtype, copy=False)
        else:
            self.dist_matrix_ = None
        self.geodesic_store_ = store
        self.training_data_ = X
        self.timings_ = timings
        logger.info("Isomap fit: T=%d, eigenvalues %s, %d operator passes, timings %s",
                    T, lam, res.n_passes, timings)
        return self

    def fit_transform(self, X: Any, y: Any = None) -> np.ndarray:
        """Fit and return ``embedding_`` of shape (T, d)."""
        return self.fit(X).embedding_

    @property
    def nbrs_(self) -> NearestNeighbors:
        """scikit-learn's ``NearestNeighbors`` with this estimator's parameters, fitted on the
        training input (built on first read)."""
        check_is_fitted(self, "embedding_")
        if self._nbrs is None:
            self._nbrs = nearest_neighbors(self, self.training_data_)
        return self._nbrs

    @property
    def kernel_pca_(self) -> KernelProjection:
        """The fitted MDS in scikit-learn's ``KernelPCA`` names (see the class docstring)."""
        check_is_fitted(self, "embedding_")
        return KernelProjection(int(self.n_components), self.eigenvalues_, self.eigenvectors_,
                                -0.5 * self.geodesic_sq_row_mean_)

    def reconstruction_error(self) -> float:
        """scikit-learn's reconstruction error of the fit.

        ``||K - K_d||_F / T`` of the centred geodesic kernel ``K = -1/2 H D^2 H`` and its
        rank-d approximation: ``sqrt(||K||_F^2 - sum of the squared eigenvalues) / T``.
        Needs the geodesics: ``dist_matrix_`` or ``geodesic_store``, read one row block at
        a time.

        Returns
        -------
        float
        """
        check_is_fitted(self, "embedding_")
        T = len(self.geodesic_sq_row_mean_)
        if self.dist_matrix_ is not None:
            D = self.dist_matrix_

            def read(s: int, e: int) -> np.ndarray:
                block = D[s:e].astype(np.float64)
                return block * block
        elif self.geodesic_store_ is not None:
            store = self.geodesic_store_

            def read(s: int, e: int) -> np.ndarray:
                return np.asarray(store[s:e], dtype=np.float64)
        else:
            raise ValueError(
                f"reconstruction_error needs the geodesics: T={T} is above "
                "dr_dask.isomap.dist-matrix-max and no geodesic_store was given")
        step = max(1, _CHUNK_BYTES // (8 * T))
        return reconstruction_error(row_blocks(read, T, step), self.geodesic_sq_row_mean_,
                                    self.eigenvalues_)

    def _projector(self) -> _IsomapProjector:
        check_is_fitted(self, "embedding_")
        return _IsomapProjector(
            neighbours_of(self), self.graph_, self.dist_matrix_, self.geodesic_store_,
            self.geodesic_sq_row_mean_, self.eigenvectors_, self.eigenvalues_,
        )

    def transform(self, X: Any) -> np.ndarray | da.Array:
        """Embed new points of shape (n, N); a dask array in gives a dask array out.

        Geodesics to the training points go through each point's ``n_neighbors`` nearest
        training points; the kernel-centred vector is projected with ``1/sqrt(lambda)``.
        """
        return map_new_rows(self, X)
