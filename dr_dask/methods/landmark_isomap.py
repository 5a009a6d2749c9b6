"""Landmark Isomap (de Silva & Tenenbaum 2003): L landmarks, the L x T geodesics (float32, row
blocks on the workers), classical MDS of the L x L block and distance-based triangulation of every
point, summed over landmark row blocks on the workers, so the driver never holds L x T while
fitting. New points are triangulated from their geodesics to the landmarks, taken through their
k nearest training points.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from numbers import Integral
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
    landmark_mds,
    select_landmarks,
    triangulate,
)
from dr_dask.graph.knn_tol import DEFAULT_KNN_TOL
from dr_dask.graph.landmarks import (
    principal_axes,
    spare_dimensions,
    triangulate_block,
)
from dr_dask.graph.stored import StoredGraph
from dr_dask.io.checkpoint import (
    delete_with,
    deleted_on_failure,
    kept_scratch,
    scratch,
    unkept,
)
from dr_dask.io.inputs import InputData
from dr_dask.io.validation import (
    Options,
    clamp_to_samples,
    is_stored,
    positive,
)
from dr_dask.linalg.cost import over_memory_budget
from dr_dask.methods._isomap_base import (
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
    Neighbours,
    SklearnIsomapTags,
    metric_of,
    nearest_neighbors,
    precomputed,
    training_input,
)
from dr_dask.methods.labelled import LabelledOutput
from dr_dask.methods.persistence import SavedModel
from dr_dask.runtime.cluster import ClientParam, active_client, run_stage
from dr_dask.runtime.progress import shown_during
from dr_dask.runtime.resources import timed

logger = logging.getLogger(__name__)


def _squared(paths: np.ndarray) -> np.ndarray:
    """The squares of float64 path lengths, in place."""
    return np.multiply(paths, paths, out=paths)


def _block_triangulate(block: np.ndarray, start: int, pinv: np.ndarray,
                       sq_mean: np.ndarray) -> np.ndarray:
    # triangulation is linear in the landmark rows: each block adds its share
    s, e = start, start + block.shape[0]
    return triangulate_block(pinv[:, s:e], block, sq_mean[s:e], _squared)


@dataclass
class _LandmarkProjector:
    """Picklable out-of-sample map of a fitted Landmark Isomap."""

    nbrs: Neighbours
    landmark_geodesics: Any  # (L, T) ndarray or zarr.Array
    pinv: np.ndarray
    sq_mean: np.ndarray

    def geodesic_rows(self, U: np.ndarray) -> np.ndarray:
        """The landmarks' geodesics to the training rows ``U``, (|U|, L)."""
        G = self.landmark_geodesics
        cols = G[:, U] if isinstance(G, np.ndarray) else G.get_orthogonal_selection(
            (slice(None), U))
        return np.asarray(cols, dtype=np.float64).T  # (|U|, L)

    def embed(self, g: np.ndarray) -> np.ndarray:
        """New rows triangulated from their geodesics ``g`` to the landmarks."""
        return triangulate(self.pinv, (g * g).T, self.sq_mean)

    def __call__(self, Xq: Any, client: Any = None, local: bool = True) -> np.ndarray:
        return chunked_transform(Xq, self.nbrs, self.geodesic_rows, self.embed,
                                 len(self.sq_mean), client=client, local=local)


class LandmarkIsomap(SklearnIsomapTags, ClientParam, SavedModel, LabelledOutput,
                     TransformerMixin, BaseEstimator):
    """Landmark Isomap (de Silva & Tenenbaum): L x T geodesics instead of T x T.

    Input (CSR, float32 and ``metric="precomputed"`` included), duplicate rows, and
    scikit-learn's Isomap parameters: as :class:`Isomap`.

    Parameters
    ----------
    n_neighbors : int or None, default=5
        k of the neighbour graph (``None`` when ``radius`` is used).
    radius : float or None, default=None
        Epsilon rule instead of the k rule (give exactly one of the two).
    n_components : int, default=2
        Embedding dimension d (less than the number of landmarks).
    n_landmarks : int, default=500
        L. More than the samples uses every sample, with a warning (as scikit-learn's
        ``Nystroem`` clamps its ``n_components``).
    landmark_method : {"maxmin", "random"}, default="maxmin"
        Max-min picks landmarks by Euclidean farthest-point order (spreads them over the data;
        for CSR input, ``metric="precomputed"`` or a non-Euclidean metric by geodesic
        farthest-point order on the graph, one Dijkstra per landmark); random is a seeded
        uniform choice.
    eigen_solver : {"auto", "dense", "arpack", "lanczos"}, default="auto"
        Of the L x L landmark MDS, as :class:`Isomap`'s (``"auto"`` is dense up to
        ``dr_dask.eigen.dense-max`` landmarks).
    tol : float, default=1e-10
        As :class:`Isomap`'s.
    max_iter : int or None, default=None
        As :class:`Isomap`'s.
    path_method : {"auto", "FW", "D"}, default="auto"
        As :class:`Isomap`'s.
    neighbors_algorithm : {"auto", "brute", "kd_tree", "ball_tree"}, default="auto"
        As :class:`Isomap`'s.
    n_jobs : int or None, default=None
        As :class:`Isomap`'s.
    metric : str or callable, default="minkowski"
        As :class:`Isomap`'s.
    p : float, default=2
        As :class:`Isomap`'s.
    metric_params : dict or None, default=None
        As :class:`Isomap`'s.
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
    knn_tol : float, default=0.003
        The adaptive probe's distance tolerance, as :class:`Isomap`'s.

    Attributes
    ----------
    embedding_ : ndarray of shape (T, d)
        In the input's float dtype.
    nbrs_ : sklearn.neighbors.NearestNeighbors or None
        As :class:`Isomap`'s; None when the training rows stay in a store.
    landmarks_ : ndarray of shape (L,)
        Landmark row indices.
    landmark_embedding_ : ndarray of shape (L, d)
        Landmark MDS coordinates on the embedding's axes (equal to
        ``embedding_[landmarks_]``): landmark MDS keeps d + min(d, 4) dimensions, every point is
        triangulated into them and the embedding takes the top d principal axes of all T
        (de Silva & Tenenbaum, 2004, PCA normalisation), not the landmarks' own axes.
    eigenvalues_ : ndarray of shape (d,)
        The top d of the landmarks' centred matrix.
    n_iter_ : int
        Products of the eigensolver with the landmarks' centred matrix (1 for the dense one).
    landmark_pinv_ : ndarray of shape (d, L)
    landmark_sq_mean_ : ndarray of shape (L,)
    landmark_geodesics_ : ndarray of shape (L, T) float32, or zarr.Array
    training_data_ : ndarray or dask array of shape (T, N)
        The input; a dask array over the store for a stored or dask input (then ``transform``
        finds the new points' neighbours blockwise on the workers and returns a NumPy array).
    n_features_in_ : int
    graph_ : scipy.sparse.csr_matrix of shape (T, T) or None
        None when the graph was built on the workers (it lived at ``scratch``).
    knn_recall_, knn_distance_error_ : float
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
        **COMMON_CONSTRAINTS,
        "n_landmarks": [positive(Integral)],
        "landmark_method": [Options({"maxmin", "random"})],
        "scratch": "no_validation",  # a path, URL or Location
    }

    def __init__(self, *, n_neighbors: int | None = 5, radius: float | None = None,
                 n_components: int = 2, n_landmarks: int = 500,
                 landmark_method: str = "maxmin", eigen_solver: str = "auto",
                 tol: float = 1e-10, max_iter: int | None = None, path_method: str = "auto",
                 neighbors_algorithm: str = "auto", n_jobs: int | None = None,
                 metric: str | Any = "minkowski", p: float = 2,
                 metric_params: dict | None = None, on_disconnected: str = "bridge",
                 random_state: int | np.random.RandomState | None = None, client: Any = None,
                 geodesic_store: Any = None, block_size: int = 256, progress: bool = False,
                 knn: str = "auto", n_probe: int | None = None, scratch: Any = None,
                 knn_tol: float = DEFAULT_KNN_TOL):
        self.radius = radius
        self.eigen_solver = eigen_solver
        self.tol = tol
        self.max_iter = max_iter
        self.path_method = path_method
        self.neighbors_algorithm = neighbors_algorithm
        self.n_jobs = n_jobs
        self.metric = metric
        self.p = p
        self.metric_params = metric_params
        self.knn = knn
        self.n_probe = n_probe
        self.knn_tol = knn_tol
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
        values, inp, self._out_dtype = training_input(self, X, in_memory=not is_stored(X),
                                                      stage=True)
        with deleted_on_failure(None if inp is None else inp.discard):
            self._nbrs: NearestNeighbors | None = None
            X = values if values is not None else inp.data
            T = X.shape[0]
            L = clamp_to_samples(self, "n_landmarks", T)
            d = checked_components(self.n_components, L, "landmarks")
            return run_stage("landmark_isomap", lambda: self._fit(X, L, d, inp))

    def _fit(self, X: Any, L: int, d: int, inp: InputData | None) -> LandmarkIsomap:
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
                graph = fit_graph(self, X if inp is None or inp.staged is None else inp.data,
                                  self.n_neighbors, self.radius, client, where, timings)
            self.graph_ = None if isinstance(graph, StoredGraph) else graph

            with timed(timings, "landmarks"):
                # rows that are not Euclidean points: farthest points along the graph
                points = (graph if sp.issparse(X) or not metric_of(self).euclidean
                          or precomputed(self) else X)
                self.landmarks_ = select_landmarks(points, L, method=self.landmark_method,
                                                   random_state=self.random_state,
                                                   client=client)

            # above the in-memory budget the float32 rows go to a store that transform
            # reads (the fit's scratch, kept while the estimator lives)
            out, kept = self.geodesic_store, None
            if out is None and over_memory_budget(4 * L * T):
                out = kept = kept_scratch("landmark_geodesics", None, self.scratch, inp)
            # a failed or interrupted fit deletes them (none of its objects would)
            with deleted_on_failure(unkept(kept)):
                with timed(timings, "shortest_paths"):
                    # by blocks over a large stored graph (no worker holds it), unless the rows
                    # go to the user's store, which keeps the rows' own column order
                    rows = GeodesicRows.compute(graph, self.landmarks_, client=client,
                                                block_size=self.block_size, dtype=np.float32,
                                                out=out, columns=self.landmarks_,
                                                blocks=False if self.geodesic_store is not None
                                                else None)
                del graph

                with timed(timings, "landmark_mds"):
                    D_LL = rows.columns(self.landmarks_).astype(np.float64)
                    mds = landmark_mds(D_LL * D_LL, d, method=eigen_method(self, L),
                                       tol=self.tol or TOL_DEFAULT,
                                       max_passes=self.max_iter or 100,
                                       random_state=check_random_state(self.random_state),
                                       n_spare=spare_dimensions(d))

                with timed(timings, "triangulation"):
                    # into the spare dimensions too: the embedding keeps the principal axes of
                    # every point, not the landmarks' (principal_axes)
                    Y = rows.map_sum(_block_triangulate, mds.pinv, mds.sq_mean)
                    axes = principal_axes(Y, d)
                    self.embedding_ = (Y @ axes).astype(self._out_dtype, copy=False)

                with timed(timings, "gather"):
                    self.landmark_geodesics_ = (rows.stored() if rows.store is not None
                                                else rows.gather())
                    rows.release()
                    if kept is not None:
                        delete_with(self.landmark_geodesics_, kept)
        self.landmark_embedding_ = mds.coords @ axes
        self.landmark_pinv_ = axes.T @ mds.pinv
        self.landmark_sq_mean_ = mds.sq_mean
        self.eigenvalues_ = mds.eigenvalues[:d]
        self.n_iter_ = int(mds.n_passes)
        self.training_data_ = X
        self.timings_ = timings
        logger.info("LandmarkIsomap fit: T=%d L=%d timings %s", T, L, timings)
        return self

    def fit_transform(self, X: Any, y: Any = None) -> np.ndarray:
        """Fit and return ``embedding_`` of shape (T, d)."""
        return self.fit(X).embedding_

    @property
    def nbrs_(self) -> NearestNeighbors | None:
        """As :class:`Isomap`'s; None when the training rows stay in a store."""
        check_is_fitted(self, "embedding_")
        if self._nbrs is None and not isinstance(self.training_data_, da.Array):
            self._nbrs = nearest_neighbors(self, self.training_data_)
        return self._nbrs

    def _projector(self) -> _LandmarkProjector:
        check_is_fitted(self, "embedding_")
        return _LandmarkProjector(neighbours_of(self), self.landmark_geodesics_,
                                  self.landmark_pinv_, self.landmark_sq_mean_)

    def transform(self, X: Any) -> np.ndarray | da.Array:
        """Embed new points of shape (n, N) by triangulation from their landmark geodesics."""
        return map_new_rows(self, X)
