"""LSDR: Localized Skeletonization and Dimensionality Reduction (Roy 2021, Algorithm 1).

Pipeline (Roy 2021, §3 and Algorithm 1, with the errata resolved in ``docs/decisions.md``, LSDR-*):

1. Delaunay tessellation of the points; its edges, weighted by Euclidean length.
2. Per-vertex Beta test on incident squared edge lengths with the text's null
   ``Beta(p/2, (deg-1) p/2)`` at level ``alpha`` (LSDR-F6: not the pseudo-code's); edges of the
   Euclidean minimum spanning tree are never removed, so the pruned graph stays connected. Removal
   is in place (later vertices see earlier removals) or by simultaneous sweeps, repeated until
   nothing changes (LSDR-F7: a single simultaneous pass leaves short-circuit edges).
3. Boundary: vertices of facets (p vertices) whose edges survive and that lie in at most one
   surviving simplex (LSDR-F8); ``d_B`` = graph distance to the boundary (one multi-source
   Dijkstra).
4. Skeleton: local maxima of ``d_B`` over the k graph-nearest neighbours, ties kept (LSDR-F9).
5. Classical MDS of the skeleton's geodesics (Dijkstra from skeleton sources on the cluster,
   :func:`dr_dask.graph.paths.shortest_paths`; top eigenpairs by
   :func:`dr_dask.linalg.mds.classical_mds` on the implicitly double-centred squared geodesics).
6. Nadaraya-Watson average of the skeleton coordinates for every point with the Gaussian kernel
   ``exp(-|x-x'|^2 / (2 sigma^2))`` and the thesis's bandwidth ``sigma = max_{i in Sk} sqrt(d_B(i)^2
   + min_{j in Sk, j != i} d_G(i, j)^2)`` (LSDR-F11).

``transform`` of new points applies step 6 to them (``oos="nw"``, Algorithm 1; the default), so
``fit_transform(X)`` equals ``fit(X).transform(X)``; ``oos="interp"`` uses the Theorem 2 estimator
``K(x)^T K^{-1} Y`` restricted to landmarks drawn from the skeleton (Roy 2021, §2.3) instead, which
reproduces the embedding at those landmarks only.

Delaunay costs O(n^ceil(p/2)); above ``max_delaunay_dim`` (default 6) ``fit`` refuses with a
message: reduce first (PCA), or use ``graph="knn"``, a labelled non-thesis candidate graph
(kNN graph joined by bridging edges; boundary = vertices whose surviving edges point mostly
one way, since a kNN graph has no simplices).
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from functools import partial
from itertools import combinations
from numbers import Integral, Real
from typing import Any, ClassVar

import dask.array as da
import numpy as np
import scipy.linalg
import scipy.sparse as sp
from scipy.sparse.csgraph import dijkstra, minimum_spanning_tree
from scipy.spatial import Delaunay, QhullError
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from dr_dask.graph import connect_components, kneighbors_graph
from dr_dask.graph.knn import KNN_CONSTRAINTS
from dr_dask.graph.knn_tol import DEFAULT_KNN_TOL
from dr_dask.graph.paths import shortest_paths
from dr_dask.io.validation import (
    Interval,
    Options,
    check_array_like,
    check_input,
    check_params,
    checked_rows,
    first_equal_rows,
    non_negative,
    positive,
    warn_duplicates,
)
from dr_dask.linalg.eigen import DenseOperator
from dr_dask.linalg.mds import classical_mds, scaled_vectors
from dr_dask.methods._lsdr_prune import edge_ids, prune_edges
from dr_dask.methods.labelled import LabelledOutput
from dr_dask.methods.persistence import SavedModel
from dr_dask.runtime.cluster import ClientParam, run_stage
from dr_dask.runtime.progress import shown_during
from dr_dask.runtime.resources import timed

logger = logging.getLogger(__name__)

#: Largest input dimension for which ``graph="delaunay"`` is attempted by default.
MAX_DELAUNAY_DIM = 6
#: graph="knn" boundary rule: a vertex is boundary when the mean of the unit vectors along its
#: surviving edges is at least this long (about 0.3 inside a uniform 2-D sample with 10
#: neighbours, 2/pi ~ 0.64 on a straight edge, 1 at the end of a curve). Not in the thesis.
KNN_BOUNDARY_RESULTANT = 0.5
#: Rows per block of the n x |skeleton| kernel matrix (bounds memory of the NW step).
_ROW_BLOCK = 2048
def _sqdist(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    D = (A * A).sum(1)[:, None] + (B * B).sum(1)[None, :] - 2.0 * (A @ B.T)
    return np.maximum(D, 0.0, out=D)


def _nw_block(Xb: np.ndarray, Xs: np.ndarray, Ys: np.ndarray, sigma: float) -> np.ndarray:
    """Nadaraya-Watson average of ``Ys`` at ``Xb`` with a Gaussian kernel (stabilised)."""
    D = _sqdist(Xb, Xs)
    # subtracting each row's minimum cancels in the ratio and keeps the weights from underflowing
    W = np.exp(-(D - D.min(1, keepdims=True)) / (2.0 * sigma**2))
    return (W @ Ys) / W.sum(1, keepdims=True)


def _interp_block(Xb: np.ndarray, XL: np.ndarray, coef: np.ndarray, sigma: float) -> np.ndarray:
    """Theorem 2 estimator ``K(x, X_L) @ coef`` with the Gaussian kernel."""
    return np.exp(-_sqdist(Xb, XL) / (2.0 * sigma**2)) @ coef


def _map_rows(X: np.ndarray, block: Any, *args: Any) -> np.ndarray:
    """``block(rows, *args)`` over blocks of ``_ROW_BLOCK`` rows (bounds the kernel matrix)."""
    parts = [block(X[s:s + _ROW_BLOCK], *args) for s in range(0, len(X), _ROW_BLOCK)]
    return np.vstack(parts) if parts else np.zeros((0, args[1].shape[1]))


def _checked_block(Xb: np.ndarray, block: Any, *args: Any) -> np.ndarray:
    # a dask input's values are seen only here, block by block
    return block(check_array_like(Xb, "X"), *args)


class LSDR(ClientParam, SavedModel, LabelledOutput, TransformerMixin, BaseEstimator):
    """Localized Skeletonization and Dimensionality Reduction (Roy 2021).

    Input (``fit``, ``transform``): an array-like, a dask, zarr or xarray array, or a path /
    URL accepted by :func:`dr_dask.open_dataset`, of shape (n, p); ``fit`` reads it whole.
    Duplicate rows are kept and embedded with their twin, with a
    :class:`~dr_dask.io.validation.DuplicatePointsWarning` (LSDR fits the distinct rows).

    Parameters
    ----------
    n_components : int, default=2
        Output dimension d (at most the number of features).
    alpha : float, default=0.95
        Level in (0, 1) of the per-vertex Beta edge test (Roy 2021: 0.95; 0.9 also endorsed).
    n_skeleton_neighbors : int, default=3
        k of the skeleton's local-maximum test over graph-nearest neighbours (Roy 2021: 3;
        3-5). Where it leaves n_components or fewer skeletal points (a handful of points), a
        smaller k that leaves more is used, with a warning.
    bandwidth : float or None, default=None
        Gaussian kernel sigma; ``None`` takes the thesis's data-driven rule (module docstring).
    removal : {"in_place", "sweep"}, default="in_place"
        Edge removal order, see :func:`prune_edges`.
    max_passes : int or None, default=None
        Removal passes; ``None`` runs until nothing changes. ``1`` with
        ``removal="in_place"`` is the literal Algorithm 1 (single passes fail on a noisy swiss
        roll).
    graph : {"delaunay", "knn"}, default="delaunay"
        ``"delaunay"`` is the thesis; ``"knn"`` (not in the thesis) replaces it by a kNN graph
        with bridging edges so that higher p is feasible.
    n_graph_neighbors : int, default=10
        k of the candidate graph when ``graph="knn"``.
    max_delaunay_dim : int, default=6
        Refuse ``graph="delaunay"`` above this input dimension p (cost grows like n^(p/2)).
    oos : {"nw", "interp"}, default="nw"
        Out-of-sample map of ``transform``: ``"nw"`` is step 6 (the Nadaraya-Watson average of
        the skeleton coordinates, as in ``fit``: ``transform`` of the training points gives
        ``embedding_``); ``"interp"`` the Theorem 2 kernel interpolator on skeleton landmarks
        (not in Algorithm 1; ``fit_transform`` still returns the step 6 embedding).
    max_oos_landmarks : int, default=2000
        Skeleton points used by ``oos="interp"`` (a seeded random subset above this).
    oos_ridge : float, default=1e-6
        Jitter added to the kernel matrix diagonal in ``oos="interp"``'s solve (numerical
        only).
    random_state : int, RandomState instance or None, default=None
        Seeds the eigensolver's start block and the landmark subset of ``oos="interp"``.
    client : distributed.Client or None, default=None
        Cluster for the geodesic passes; ``None`` takes the active client, else local threads.
    progress : bool, default=False
        Progress bars on the fit's computations: a widget in Jupyter, text on a terminal's
        stderr, nothing in a pipe (:mod:`dr_dask.runtime.progress`).
    knn : {"auto", "exact", "ivf"}, default="auto"
        The neighbour search of ``graph="knn"``, as :class:`~dr_dask.methods.isomap.Isomap`'s.
    n_probe : int or None, default=None
        Lists each row searches with IVF, as :class:`~dr_dask.methods.isomap.Isomap`'s.
    knn_tol : float, default=0.003
        The adaptive probe's distance tolerance, as :class:`~dr_dask.methods.isomap.Isomap`'s.

    Attributes
    ----------
    knn_recall_ : float or None
        ``graph="knn"``: the search's recall (1.0 exact, IVF estimated); else None.
    knn_distance_error_ : float or None
        ``graph="knn"``: its k-th distance error (:class:`~dr_dask.methods.isomap.Isomap`'s);
        else None.
    embedding_ : ndarray of shape (n, d)
    skeleton_indices_ : ndarray of shape (r,)
    skeleton_embedding_ : ndarray of shape (r, d)
        Classical MDS coordinates of the skeleton (before the kernel smoothing).
    boundary_indices_ : ndarray of shape (b,)
    d_boundary_ : ndarray of shape (n,)
        Graph distance of every point to the boundary.
    graph_ : scipy.sparse.csr_matrix of shape (n, n)
        The pruned graph G_alpha (symmetric, Euclidean edge lengths); a duplicate row has its
        twin's edges.
    mst_edges_ : ndarray of shape (n_distinct - 1, 2)
    removed_edges_ : ndarray of shape (m_removed, 2)
    n_passes_ : int
    sigma_ : float
    mds_eigenvalues_ : ndarray of shape (d,)
    skeleton_points_ : ndarray of shape (r, n_features)
    oos_landmarks_ : ndarray of shape (L,)
        Training indices used by ``oos="interp"`` (the skeleton with ``oos="nw"``).
    oos_points_ : ndarray of shape (L, n_features)
    oos_coef_ : ndarray of shape (L, d)
        ``(K_LL + ridge I)^{-1} Y_L`` (``oos="interp"`` only, else None).
    n_features_in_ : int
    timings_ : dict
        Wall seconds per stage: ``graph``, ``boundary``, ``shortest_paths`` (the skeleton's
        geodesics), ``mds``, ``smoothing``, ``out_of_sample``.

    See Also
    --------
    Isomap : geodesics and classical MDS over every point instead of the skeleton.
    GPIsomap : streaming Isomap with a Gaussian-process out-of-sample map.

    Examples
    --------
    >>> from sklearn.datasets import make_swiss_roll
    >>> from dr_dask import LSDR
    >>> X, t = make_swiss_roll(n_samples=300, random_state=0)
    >>> lsdr = LSDR(n_components=2, random_state=0).fit(X)
    >>> lsdr.embedding_.shape
    (300, 2)
    >>> lsdr.transform(X[:5]).shape
    (5, 2)
    """

    # fitted by _fit (declared so the type checker knows them where fit maps duplicates)
    embedding_: np.ndarray
    d_boundary_: np.ndarray
    graph_: sp.csr_matrix

    _parameter_constraints: ClassVar[dict] = {
        "n_components": [positive(Integral)],
        "alpha": [Interval(Real, 0, 1, closed="neither")],
        "n_skeleton_neighbors": [positive(Integral)],
        "bandwidth": [positive(Real), None],
        "removal": [Options({"in_place", "sweep"})],
        "max_passes": [positive(Integral), None],
        "graph": [Options({"delaunay", "knn"})],
        "n_graph_neighbors": [positive(Integral)],
        "max_delaunay_dim": [Interval(Integral, 2, None)],
        "oos": [Options({"nw", "interp"})],
        "max_oos_landmarks": [positive(Integral)],
        "oos_ridge": [non_negative(Real)],
        "random_state": ["random_state"],
        "client": "no_validation",
        "progress": ["boolean"],
        **KNN_CONSTRAINTS,
    }

    def __init__(
        self,
        *,
        n_components: int = 2,
        alpha: float = 0.95,
        n_skeleton_neighbors: int = 3,
        bandwidth: float | None = None,
        removal: str = "in_place",
        max_passes: int | None = None,
        graph: str = "delaunay",
        n_graph_neighbors: int = 10,
        max_delaunay_dim: int = MAX_DELAUNAY_DIM,
        oos: str = "nw",
        max_oos_landmarks: int = 2000,
        oos_ridge: float = 1e-6,
        random_state: Any = None,
        client: Any = None,
        progress: bool = False,
        knn: str = "auto",
        n_probe: int | None = None,
        knn_tol: float = DEFAULT_KNN_TOL,
    ):
        self.knn = knn
        self.n_probe = n_probe
        self.knn_tol = knn_tol
        self.n_components = n_components
        self.alpha = alpha
        self.n_skeleton_neighbors = n_skeleton_neighbors
        self.bandwidth = bandwidth
        self.removal = removal
        self.max_passes = max_passes
        self.graph = graph
        self.n_graph_neighbors = n_graph_neighbors
        self.max_delaunay_dim = max_delaunay_dim
        self.oos = oos
        self.max_oos_landmarks = max_oos_landmarks
        self.oos_ridge = oos_ridge
        self.random_state = random_state
        self.client = client
        self.progress = progress

    # ----------------------------------------------------------------------------- validation
    def _training(self, X: Any) -> np.ndarray:
        """The checked training array: parameters, values, then what this data supports."""
        check_params(self)
        X = checked_rows(self, X, reset=True, min_samples=2)
        n, p = X.shape
        if self.n_components > p:
            raise ValueError(f"n_components={self.n_components} is more than the data supports: "
                             f"{p} features give at most {p} components")
        if self.graph == "delaunay":
            if p > self.max_delaunay_dim:
                raise ValueError(
                    f"LSDR's Delaunay tessellation costs O(n^ceil(p/2)) and p={p} exceeds "
                    f"max_delaunay_dim={self.max_delaunay_dim}. Reduce the data first (e.g. PCA to "
                    f"<= {self.max_delaunay_dim} dimensions), or use graph='knn' (a kNN candidate "
                    "graph, not in the thesis)"
                )
            if p < 2:
                raise ValueError(f"Delaunay needs at least 2 features, got n_features={p}; 1-D "
                                 "data is its own embedding")
            if n < p + 2:
                raise ValueError(f"Delaunay in {p}-D needs at least {p + 2} points, got {n}")
        return X

    # ---------------------------------------------------------------------------- graph stage
    def _delaunay(self, X: np.ndarray):

        try:
            tri = Delaunay(X)
        except QhullError as exc:
            raise ValueError(
                "Delaunay tessellation failed: the points are affinely degenerate (they lie in a "
                "lower-dimensional subspace). Reduce with PCA to the rank of the data first"
            ) from exc
        simplices = np.sort(tri.simplices, axis=1)
        if len(tri.coplanar):
            raise ValueError(f"qhull left rows {tri.coplanar[:10, 0].tolist()} out of the "
                             "tessellation (nearly coincident points); remove near-duplicates")
        pairs = np.vstack([simplices[:, [i, j]] for i, j in combinations(range(X.shape[1] + 1), 2)])
        return simplices, pairs

    def _knn_graph_edges(self, X: np.ndarray) -> np.ndarray:

        search = {"knn": self.knn, "n_probe": self.n_probe, "knn_tol": self.knn_tol,
                  "random_state": self.random_state}
        G = kneighbors_graph(X, min(int(self.n_graph_neighbors), X.shape[0] - 1),
                             client=self.client, search=search)
        self.knn_recall_ = search.get("recall")
        self.knn_distance_error_ = search.get("distance_error")
        G = sp.triu(connect_components(G, X, on_disconnected="bridge"), 1).tocoo()
        return np.column_stack([G.row, G.col])

    def _build_graph(self, X: np.ndarray):
        self.knn_recall_ = self.knn_distance_error_ = None  # set by the kNN candidate graph
        n, p = X.shape
        simplices = None
        if self.graph == "delaunay":
            simplices, pairs = self._delaunay(X)
        else:
            pairs = self._knn_graph_edges(X)
        lo, hi = np.minimum(pairs[:, 0], pairs[:, 1]), np.maximum(pairs[:, 0], pairs[:, 1])
        codes = np.unique(lo.astype(np.int64) * n + hi)
        edges = np.column_stack([codes // n, codes % n])
        w = np.linalg.norm(X[edges[:, 0]] - X[edges[:, 1]], axis=1)
        full = sp.coo_matrix((w, (edges[:, 0], edges[:, 1])), shape=(n, n))
        mst = minimum_spanning_tree(full).tocoo()
        protected = np.zeros(len(codes), dtype=bool)
        protected[edge_ids(codes, mst.row, mst.col, n)] = True
        alive, n_passes = prune_edges(edges, w, protected, n, self.alpha, p, self.removal,
                                      self.max_passes)
        logger.info("LSDR graph: %d edges, %d removed in %d passes", len(w), (~alive).sum(),
                    n_passes)
        return simplices, codes, edges, w, alive, protected, n_passes

    def _boundary(self, X, simplices, codes, edges, alive) -> np.ndarray:
        n, p = X.shape
        if simplices is None:  # knn graph: no simplices; resultant of unit edge directions
            e = edges[alive]
            u = X[e[:, 1]] - X[e[:, 0]]
            u /= np.linalg.norm(u, axis=1, keepdims=True)
            R = np.zeros_like(X)
            np.add.at(R, e[:, 0], u)
            np.add.at(R, e[:, 1], -u)
            deg = np.bincount(e.ravel(), minlength=n)
            return np.nonzero(np.linalg.norm(R, axis=1) / deg >= KNN_BOUNDARY_RESULTANT)[0]
        s_alive = np.ones(len(simplices), dtype=bool)
        for i, j in combinations(range(p + 1), 2):
            s_alive &= alive[edge_ids(codes, simplices[:, i], simplices[:, j], n)]
        # facets: each simplex without one vertex (rows stay sorted)
        facets = np.vstack([np.delete(simplices, v, axis=1) for v in range(p + 1)])
        owner_alive = np.tile(s_alive, p + 1)
        uniq, inv = np.unique(facets, axis=0, return_inverse=True)
        inv = inv.ravel()
        count = np.bincount(inv[owner_alive], minlength=len(uniq))
        f_alive = np.ones(len(uniq), dtype=bool)
        for i, j in combinations(range(p), 2):
            f_alive &= alive[edge_ids(codes, uniq[:, i], uniq[:, j], n)]
        return np.unique(uniq[f_alive & (count <= 1)])

    def _graph_knn(self, G: sp.csr_matrix, k: int) -> np.ndarray:
        """k nearest graph (geodesic) neighbours of every vertex, excluding itself."""
        n = G.shape[0]
        deg = np.diff(G.indptr)
        # the k-th nearest geodesic neighbour is no farther than the k-th shortest incident edge
        kth = np.array([np.partition(G.data[G.indptr[v]:G.indptr[v + 1]], j)[j]
                        for v, j in enumerate(np.minimum(k, deg) - 1)])
        out = np.empty((n, k), dtype=np.int64)
        block = max(1, min(n, (1 << 25) // max(n, 1)))
        for s in range(0, n, block):
            idx = np.arange(s, min(n, s + block))
            D = dijkstra(G, directed=False, indices=idx, limit=float(kth[idx].max()) * (1 + 1e-9))
            D[np.arange(len(idx)), idx] = np.inf
            short = np.nonzero(np.isfinite(D).sum(1) < k)[0]  # vertices of degree < k
            if short.size:
                D[short] = dijkstra(G, directed=False, indices=idx[short])
                D[short, idx[short]] = np.inf
            out[idx] = np.argpartition(D, k - 1, axis=1)[:, :k]
        return out

    # --------------------------------------------------------------------------------- fit
    @shown_during
    def fit(self, X: Any, y: Any = None) -> LSDR:
        """Fit LSDR on X of shape (n_samples, n_features) (NumPy or dask; gathered).

        Duplicate rows are kept, as by every estimator: LSDR is fitted on the distinct rows (a
        Delaunay tessellation of coincident points is degenerate), and each duplicate gets its
        twin's embedding, boundary distance and graph edges, with a
        :class:`~dr_dask.io.validation.DuplicatePointsWarning`.
        """
        X = self._training(X)
        first = first_equal_rows(X)
        distinct = np.flatnonzero(first == np.arange(len(X)))
        if distinct.size == len(X):
            return self._fit(X)
        warn_duplicates(first)
        self._fit(X[distinct])
        twin = np.searchsorted(distinct, first)  # each row's twin among the distinct rows
        self.embedding_ = self.embedding_[twin]
        self.d_boundary_ = self.d_boundary_[twin]
        self.graph_ = self.graph_[twin][:, twin].tocsr()
        for name in ("skeleton_indices_", "boundary_indices_", "oos_landmarks_", "mst_edges_",
                     "removed_edges_"):
            setattr(self, name, distinct[getattr(self, name)])  # rows of X
        return self

    def _skeleton(self, G: sp.csr_matrix, d_b: np.ndarray, d: int, k: int) -> np.ndarray:
        """The skeletal points: d_B's local maxima over the k graph-nearest neighbours, ties kept
        (docs/decisions.md LSDR-F9); on few points a narrower test, with a warning, keeps more
        than ``d`` of them, as n_landmarks is clamped to the samples."""
        n = len(d_b)
        if k >= n:
            raise ValueError(f"n_skeleton_neighbors={k} must be below the {n} points")
        k_used = k
        skeleton = np.nonzero(d_b >= d_b[self._graph_knn(G, k)].max(1))[0]
        while skeleton.size <= d and k_used > 1:
            k_used -= 1
            skeleton = np.nonzero(d_b >= d_b[self._graph_knn(G, k_used)].max(1))[0]
        if skeleton.size <= d:
            raise ValueError(f"the skeleton has {skeleton.size} points, too few for "
                             f"n_components={d}; lower n_skeleton_neighbors or alpha")
        if k_used < k:
            warnings.warn(
                f"n_skeleton_neighbors={k} leaves too few skeletal points for n_components={d} "
                f"on these {n} points; LSDR uses n_skeleton_neighbors={k_used}", UserWarning,
                stacklevel=4)
        return skeleton

    def _fit(self, X: np.ndarray) -> LSDR:
        n = X.shape[0]
        d, k = int(self.n_components), int(self.n_skeleton_neighbors)
        rng = check_random_state(self.random_state)
        timings: dict[str, float] = {}
        with timed(timings, "graph"):
            simplices, codes, edges, w, alive, protected, n_passes = self._build_graph(X)
            e = edges[alive]
            G = sp.coo_matrix((np.r_[w[alive], w[alive]], (np.r_[e[:, 0], e[:, 1]],
                                                            np.r_[e[:, 1], e[:, 0]])),
                              shape=(n, n)).tocsr()
        with timed(timings, "boundary"):
            boundary = self._boundary(X, simplices, codes, edges, alive)
            if boundary.size == 0:  # cannot happen for a Delaunay hull; guard the knn heuristic
                logger.warning("LSDR found no boundary vertices; every point becomes skeletal")
                d_b = np.zeros(n)
            else:
                d_b = dijkstra(G, directed=False, indices=boundary, min_only=True)
        skeleton = self._skeleton(G, d_b, d, k)
        r = skeleton.size
        logger.info("LSDR: %d boundary, %d skeletal of %d points", boundary.size, r, n)
        with timed(timings, "shortest_paths"):
            Q = np.empty((r, r))
            step = max(1, (1 << 27) // (8 * n))  # source blocks of ~128 MB of geodesic rows
            for s in range(0, r, step):
                rows = run_stage("skeleton_geodesics", partial(
                    shortest_paths, G, skeleton[s:s + step], client=self.client))
                Q[s:s + step] = rows[:, skeleton]
            Q = (Q + Q.T) / 2  # Dijkstra is symmetric up to rounding
        with timed(timings, "mds"):
            np.fill_diagonal(Q, np.inf)
            nearest = Q.min(1)
            np.fill_diagonal(Q, 0.0)
            sigma = float(self.bandwidth or np.sqrt(d_b[skeleton] ** 2 + nearest**2).max())
            np.multiply(Q, Q, out=Q)
            # an operator: Lanczos never copies the r x r matrix (dense below 1500 rows)
            res = classical_mds(DenseOperator(Q), d, random_state=rng)
            del Q
        lam = res.values
        if np.any(lam <= 0):
            logger.warning("only %d of the top %d skeleton MDS eigenvalues are positive",
                           int((lam > 0).sum()), d)
        Ys = scaled_vectors(lam, res.vectors)
        with timed(timings, "smoothing"):
            Xs = X[skeleton]
            emb = _map_rows(X, _nw_block, Xs, Ys, sigma)

        L, self.oos_coef_ = skeleton, None
        if self.oos == "interp":  # Theorem 2 map on (a seeded subset of) the skeleton
            with timed(timings, "out_of_sample"):
                if r > self.max_oos_landmarks:
                    L = np.sort(rng.choice(skeleton, self.max_oos_landmarks, replace=False))
                K = np.exp(-_sqdist(X[L], X[L]) / (2.0 * sigma**2))
                K[np.diag_indices_from(K)] += self.oos_ridge
                self.oos_coef_ = scipy.linalg.solve(K, emb[L], assume_a="pos")
        self.oos_landmarks_ = L
        self.oos_points_ = X[L]

        self.embedding_ = emb
        self.skeleton_indices_ = skeleton
        self.skeleton_embedding_ = Ys
        self.skeleton_points_ = Xs
        self.boundary_indices_ = boundary
        self.d_boundary_ = d_b
        self.graph_ = G
        self.mst_edges_ = edges[protected]
        self.removed_edges_ = edges[~alive]
        self.n_passes_ = n_passes
        self.sigma_ = sigma
        self.mds_eigenvalues_ = lam
        self.timings_ = timings
        self.embedding_ = self.embedding_.astype(self._out_dtype, copy=False)
        return self

    def fit_transform(self, X: Any, y: Any = None) -> np.ndarray:
        """Fit and return ``embedding_`` of shape (n_samples, n_components)."""
        return self.fit(X).embedding_

    def transform(self, X: Any) -> Any:
        """Embed new points with the ``oos`` map (step 6 by default).

        Parameters
        ----------
        X : array-like, dask / zarr / xarray array or path, of shape (m, n_features)

        Returns
        -------
        ndarray or dask array of shape (m, n_components)
            A dask input gives a dask output with the same row chunks.
        """

        check_is_fitted(self, "oos_points_")
        block: Callable[..., np.ndarray]
        args: tuple[np.ndarray, np.ndarray]
        if self.oos_coef_ is None:
            block, args = _nw_block, (self.skeleton_points_, self.skeleton_embedding_)
        else:
            block, args = _interp_block, (self.oos_points_, self.oos_coef_)
        d = args[1].shape[1]
        if isinstance(X, da.Array):  # (xarray objects have map_blocks too: they are read)
            check_input(self, X, reset=False)
            X = X.rechunk({1: -1})  # the caller's row chunks are kept
            return X.map_blocks(_checked_block, block, *args, self.sigma_,
                                chunks=(X.chunks[0], (d,)), dtype=np.float64)
        X = check_input(self, X, reset=False, in_memory=True, dtype=np.float64).values
        return _map_rows(X, block, *args, self.sigma_)
