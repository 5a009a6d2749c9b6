"""GP-Isomap (Mahapatra & Chandola 2020): streaming Isomap whose predictive variance flags drift.

Batch phase (S-Isomap++, Mahapatra & Chandola 2020, §3.3 and Algorithm 1): split the batch into
manifolds, run Isomap on each, stitch the local frames into one global frame through the support
set, and fit one Gaussian process per manifold from geodesic distances to local coordinates. Mapping
a point: geodesics to each manifold through its nearest manifold points, GP mean and variance per
manifold, the manifold of least variance wins, its mean goes through the stitch.

Decisions where the paper is silent or wrong are listed in the class docstring; the kernel
variants are documented in :mod:`dr_dask.methods._gp`.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from numbers import Integral, Real
from typing import Any, ClassVar

import dask.array as da
import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from dr_dask.graph.knn import KNN_CONSTRAINTS
from dr_dask.graph.knn_tol import DEFAULT_KNN_TOL
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
from dr_dask.linalg.align import procrustes_fit
from dr_dask.methods._gp import KERNELS
from dr_dask.methods._manifolds import cluster_labels, fit_manifolds, stitch_frames
from dr_dask.methods.labelled import LabelledOutput
from dr_dask.methods.persistence import SavedModel
from dr_dask.runtime.blas import single_blas_thread
from dr_dask.runtime.cluster import ClientParam, active_client
from dr_dask.runtime.progress import shown_during
from dr_dask.runtime.resources import timed

logger = logging.getLogger(__name__)


class GPIsomap(ClientParam, SavedModel, LabelledOutput, TransformerMixin, BaseEstimator):
    """GP-Isomap: multi-manifold streaming Isomap with predictive variance.

    Input (``fit``, ``transform``, ``map_points``): an array-like, a dask, zarr or xarray
    array, or a path / URL accepted by :func:`dr_dask.open_dataset`, of shape (n, D); the
    batch is read whole (the batch phase is in memory, O(n_i^2)); a dask array given to
    ``transform`` is mapped block by block. Duplicate rows are kept and embedded with their
    twin, with a :class:`~dr_dask.io.validation.DuplicatePointsWarning`.

    Parameters
    ----------
    n_neighbors : int, default=10
        k of the Isomap graphs and of the clusterer's kNN graph. A manifold needs k + 2
        points: on a batch of fewer, k is clamped to the batch size - 2 with a warning
        (``n_neighbors_``).
    n_components : int, default=2
        Intrinsic dimension d_i of every manifold.
    kernel : {"geodesic_se", "geodesic_se_cailliez", "spectral", "literal_btilde"}, \
default="geodesic_se"
        The GP's kernel on geodesics; see :mod:`dr_dask.methods._gp`. ``"literal_btilde"``
        warns (ablation only).
    length_scale : float or None, default=None
        Fixed GP length scale of the mean; ``None`` fits it (see ``noise_variance``).
    noise_variance : float or None, default=1e-3
        Fixed GP hyper-parameters; ``None`` fits them by maximum marginal likelihood, shared
        across output dimensions, per manifold (signal variance fixed to 1, paper §5.1). The
        noise is fixed by default: Isomap coordinates are noiseless, so maximum likelihood
        drives it to its lower bound, where held-out variances stop matching the batch's.
        It is the variance's floor too. 0.01 (this class's earlier default) shrank the mean
        (per-patch disparity 0.005-0.010 on Euler-roll patches, 0.001-0.002 at 1e-3). Length
        scales whose kernel is indefinite beyond 0.1 x noise are excluded from the search.
    clusterer : "tangent", "single", array-like of shape (n,) or callable, default="tangent"
        ``tangent``: kNN-graph components refined by tangent similarity
        (:func:`dr_dask.methods._manifolds.tangent_clusters`); ``single``: one manifold; an
        array: one label per batch row; a callable ``f(X) -> labels``.
    tangent_threshold : float, default=0.5
        Minimum tangent-plane similarity of a kept graph edge in the clusterer.
    density_persistence : float or None, default=1.2
        The clusterer splits manifolds at density saddles deeper than this (log density);
        ``None``: whole graph components.
    min_cluster_size : int or None, default=None
        Smaller clusters are merged into their nearest one; ``None`` is ``max(2k, 10)``.
    n_support_nearest : int, default=16
        k nearest point pairs per pair of manifolds in the support set (paper default); the
        ``"rigid"`` stitch bridges manifolds with these pairs only.
    n_support_farthest : int, default=1
        l farthest point pairs per pair of manifolds in the support set (paper default).
    ridge_lambda : float, default=0.005
        Ridge of the ``"ridge"`` stitch (paper default).
    stitch : {"rigid", "ridge"}, default="rigid"
        How each manifold's local frame enters the global frame. ``"ridge"`` is Algorithm
        1's affine ridge regression onto the MDS of the support points: fitted on ~17 points
        near a pair's closest approach, it shears patches (disparity 0.25 against truth for a
        patch whose own Isomap has 0.001). ``"rigid"`` (default): see Notes, stitching.
    global_dim : int or None, default=None
        Dimension of the global frame; ``None`` is ``n_components`` (the roll's patches share
        one 2-D frame, so the paper's alternative sum of d_i would only add empty axes).
    stream_neighbors : int or None, default=None
        k_s: neighbours linking a new point into a manifold's geodesics; ``None`` is
        ``n_neighbors``.
    sigma_t : float or None, default=None
        Novelty threshold on the variance. ``None`` calibrates it at fit time from the batch's
        leave-one-out variances at ``threshold_quantile``; :meth:`calibrate_threshold` sets
        it from held-out data (preferable: thresholds do not transfer between data sets).
    threshold_quantile : float, default=0.995
        Quantile in (0, 1] of the batch's leave-one-out variances that calibrates ``sigma_t``
        when it is ``None``.
    hyper_max_points : int, default=800
        Manifolds larger than this are subsampled for the hyper-parameter search only.
    random_state : int, RandomState instance or None, default=None
        Seeds the hyper-parameter subsamples and the eigensolvers.
    client : distributed.Client or None, default=None
        The clusterer's neighbour search and the per-manifold Isomap + GP fits run on it;
        ``None`` takes the active client, else in-process.
    progress : bool, default=False
        Progress bars on the fit's computations: a widget in Jupyter, text on a terminal's
        stderr, nothing in a pipe (:mod:`dr_dask.runtime.progress`).
    knn : {"auto", "exact", "ivf"}, default="auto"
        The batch's neighbour search (``clusterer="tangent"``), as
        :class:`~dr_dask.methods.isomap.Isomap`'s; each manifold's own Isomap stays exact.
    n_probe : int or None, default=None
        Lists each row searches with IVF, as :class:`~dr_dask.methods.isomap.Isomap`'s.
    knn_tol : float, default=0.003
        The adaptive probe's distance tolerance, as :class:`~dr_dask.methods.isomap.Isomap`'s.

    Attributes
    ----------
    n_neighbors_ : int
        The k used: ``n_neighbors``, or fewer on a batch too small for it.
    knn_recall_ : float or None
        The batch search's recall (1.0 exact, IVF estimated; None without that search).
    knn_distance_error_ : float or None
        Its k-th distance error (:class:`~dr_dask.methods.isomap.Isomap`'s), likewise.
    labels_ : ndarray of shape (n,)
        Manifold of each batch point; -1 for outliers (a user labelling may use -1 too).
    outliers_ : ndarray of shape (n_outliers, D)
        Batch points in no manifold (kept so that refits see the whole batch).
    n_manifolds_ : int
    manifolds_ : list of ManifoldGP
        Per manifold: points, neighbour graph, hyper-parameters, beta (the n_i x n_i
        geodesics are recomputed from the graph by the first mapping, not kept).
    local_embedding_ : list of ndarray of shape (n_i, n_components)
        Each manifold's Isomap coordinates.
    stitch_rotation_ : ndarray of shape (p, global_dim, n_components)
    stitch_translation_ : ndarray of shape (p, global_dim)
    support_ : ndarray of shape (n_support,)
        Batch rows of the support set.
    embedding_ : ndarray of shape (n, global_dim)
        Global coordinates of the batch.
    sigma_t_ : float
    threshold_source_ : {"manual", "loo", "holdout"}
    n_features_in_ : int
    timings_ : dict
        Wall seconds per stage of ``fit``: ``clustering``, ``manifolds`` (Isomap + GP per
        manifold), ``stitch`` and, when ``sigma_t`` is calibrated, ``threshold``.

    See Also
    --------
    Isomap : the batch embedding each manifold gets, with its out-of-sample map.
    dr_dask.stream : the stream runner that maps, flags and refits with this model.
    dr_dask.methods.gp_isomap_io.save_gp_isomap : the model file (Zarr, no pickle).

    Notes
    -----
    Decisions where the paper is silent or wrong (docs/decisions.md, the GPI- entries, with
    the measurements behind each):

    - Assignment: a point is mapped through the manifold of least *link distance* (its mean
      distance to its k_s nearest manifold points in units of that manifold's own median,
      :class:`~dr_dask.methods._gp.ManifoldGP`), not of least variance, which differs between
      manifolds by less than their noise; the variance is then the novelty signal only.
    - Scale: beta is rescaled per axis so that the batch points' GP means reproduce their
      Isomap coordinates (the zero-mean prior shrinks each axis by its own factor, Theorem
      6.1); ``fit_transform`` returns ``embedding_`` and the stream writes in its frame.
    - Variance: one prior, two length scales: the mean's maximum-likelihood one, the
      variance's sampling scale (2 x the median k-th-neighbour distance) on the k_s nearest
      manifold points (a nearest-neighbour GP, never below the full GP's variance);
      ``sigma_t_`` is a quantile of leave-one-out variances computed the same way.
    - Clustering: tangent clustering, split at density saddles (``density_persistence``) and
      border points moved to the manifold of least link distance.
    - Stitching: each manifold enters the global frame by a rotation and a translation only
      (Isomap coordinates are in geodesic units); the frame is landmark MDS of the manifolds'
      graphs bridged along a minimum spanning tree of their gaps
      (:func:`~dr_dask.methods._manifolds.global_frame`), since bridging every pair folds it.
    - Refits: aligned to the previous frame on the previous batch, globally then per manifold
      (:meth:`align_to`); a new mode keeps the global map.
    - The variance is eq. 8 with the noise term, one scalar per manifold; the S-Isomap scaling
      is 1/sqrt(lambda) (GPI-SQRT); ties in the link distance go to the lowest manifold index.

    Examples
    --------
    >>> from sklearn.datasets import make_swiss_roll
    >>> from dr_dask import GPIsomap
    >>> X, t = make_swiss_roll(n_samples=300, random_state=0)
    >>> gp = GPIsomap(n_neighbors=10, clusterer="single", random_state=0).fit(X[:250])
    >>> gp.embedding_.shape, gp.n_manifolds_
    ((250, 2), 1)
    >>> Y, variance = gp.transform(X[250:], return_variance=True)
    >>> Y.shape, variance.shape
    ((50, 2), (50,))
    """

    # fitted by fit's _stitch (declared so the type checker knows it before fit assigns it)
    embedding_: np.ndarray

    _parameter_constraints: ClassVar[dict] = {
        "n_neighbors": [positive(Integral)],
        "n_components": [positive(Integral)],
        "kernel": [Options(KERNELS)],
        "length_scale": [positive(Real), None],
        "noise_variance": [positive(Real), None],
        "clusterer": [Options({"tangent", "single"}), "array-like", callable],
        "tangent_threshold": [Real],
        "density_persistence": [non_negative(Real), None],
        "min_cluster_size": [positive(Integral), None],
        "n_support_nearest": [positive(Integral)],
        "n_support_farthest": [non_negative(Integral)],
        "ridge_lambda": [non_negative(Real)],
        "stitch": [Options({"rigid", "ridge"})],
        "global_dim": [positive(Integral), None],
        "stream_neighbors": [positive(Integral), None],
        "sigma_t": [positive(Real), None],
        "threshold_quantile": [Interval(Real, 0, 1, closed="right")],
        "hyper_max_points": [positive(Integral)],
        "random_state": ["random_state"],
        "client": "no_validation",
        "progress": ["boolean"],
        **KNN_CONSTRAINTS,
    }

    def __init__(
        self,
        *,
        n_neighbors: int = 10,
        n_components: int = 2,
        kernel: str = "geodesic_se",
        length_scale: float | None = None,
        noise_variance: float | None = 1e-3,
        clusterer: str | np.ndarray | Callable = "tangent",
        tangent_threshold: float = 0.5,
        density_persistence: float | None = 1.2,
        min_cluster_size: int | None = None,
        n_support_nearest: int = 16,
        n_support_farthest: int = 1,
        ridge_lambda: float = 0.005,
        stitch: str = "rigid",
        global_dim: int | None = None,
        stream_neighbors: int | None = None,
        sigma_t: float | None = None,
        threshold_quantile: float = 0.995,
        hyper_max_points: int = 800,
        random_state: int | np.random.RandomState | None = None,
        client: Any = None,
        progress: bool = False,
        knn: str = "auto",
        n_probe: int | None = None,
        knn_tol: float = DEFAULT_KNN_TOL,
    ):
        self.knn = knn
        self.n_probe = n_probe
        self.knn_tol = knn_tol
        self.n_neighbors = n_neighbors
        self.n_components = n_components
        self.kernel = kernel
        self.length_scale = length_scale
        self.noise_variance = noise_variance
        self.clusterer = clusterer
        self.tangent_threshold = tangent_threshold
        self.density_persistence = density_persistence
        self.min_cluster_size = min_cluster_size
        self.n_support_nearest = n_support_nearest
        self.n_support_farthest = n_support_farthest
        self.ridge_lambda = ridge_lambda
        self.stitch = stitch
        self.global_dim = global_dim
        self.stream_neighbors = stream_neighbors
        self.sigma_t = sigma_t
        self.threshold_quantile = threshold_quantile
        self.hyper_max_points = hyper_max_points
        self.random_state = random_state
        self.client = client
        self.progress = progress

    # ------------------------------------------------------------------ fit
    def _cluster(self, X: np.ndarray, client) -> np.ndarray:
        search = {"knn": self.knn, "n_probe": self.n_probe, "knn_tol": self.knn_tol,
                  "random_state": self.random_state}
        labels = cluster_labels(
            self.clusterer, X, self.n_neighbors_, self.n_components,
            tangent_threshold=self.tangent_threshold,
            density_persistence=self.density_persistence,
            min_cluster_size=self.min_cluster_size, client=client, search=search)
        self.knn_recall_ = search.get("recall")
        self.knn_distance_error_ = search.get("distance_error")
        return labels

    @shown_during
    def fit(self, X: Any, y: None = None) -> GPIsomap:
        """Run the batch phase.

        Parameters
        ----------
        X : array-like, dask / zarr / xarray array or path, of shape (n, D)
            The batch (read whole: the batch phase is in memory, O(n_i^2)).
        y : ignored

        Returns
        -------
        self
        """
        check_params(self)
        X = checked_rows(self, X, reset=True, min_samples=2)  # a point alone has no neighbour
        warn_duplicates(first_equal_rows(X))  # kept: twins get the same coordinates
        # a manifold needs n_neighbors + 2 points: a batch smaller than that fits with fewer
        # neighbours, with a warning (as n_landmarks is clamped to the samples)
        self.n_neighbors_ = int(self.n_neighbors)
        if self.n_neighbors_ > len(X) - 2 >= 1:
            self.n_neighbors_ = len(X) - 2
            warnings.warn(
                f"n_neighbors={self.n_neighbors} needs {self.n_neighbors + 2} points in a "
                f"manifold, more than the {len(X)} of the batch: GPIsomap uses "
                f"n_neighbors={self.n_neighbors_}", UserWarning, stacklevel=3)
        client = active_client(self.client)
        rng = check_random_state(self.random_state)
        timings: dict[str, float] = {}
        with timed(timings, "clustering"):
            labels = self._cluster(X, client)
        params = {
            "n_neighbors": int(self.n_neighbors_), "n_components": int(self.n_components),
            "kernel": self.kernel, "length_scale": self.length_scale,
            "noise_variance": self.noise_variance,
            "stream_neighbors": int(self.stream_neighbors or self.n_neighbors_),
            "hyper_max_points": int(self.hyper_max_points),
        }
        results = fit_manifolds(X, labels, params,
                                min_size=max(self.n_neighbors_ + 2, self.n_components + 2),
                                rng=rng, client=client, timings=timings)
        outlier = labels < 0
        p = len(results)
        self.local_embedding_ = [r[0] for r in results]
        self.manifolds_ = [r[1] for r in results]
        self.labels_ = labels
        self.n_manifolds_ = p
        self.outliers_ = X[outlier]
        with timed(timings, "stitch"):
            self._stitch(X[~outlier], labels[~outlier], rng)
        if outlier.any():
            # outliers keep a row in embedding_ (the model's batch order) through the mapping
            emb = np.empty((len(X), self.embedding_.shape[1]))
            emb[~outlier] = self.embedding_
            emb[outlier] = self._map(X[outlier])[0]
            self.embedding_ = emb
            logger.info("%d batch points are outliers of every manifold", outlier.sum())
        for i, gp in enumerate(self.manifolds_):
            logger.info(
                "manifold %d: %d points, length_scale %.3g, noise_variance %.3g, jitter %.2g",
                i, gp.n_points, gp.length_scale, gp.noise_variance, gp.jitter,
            )
        if self.sigma_t is not None:
            self.sigma_t_ = float(self.sigma_t)
            self.threshold_source_ = "manual"
        else:
            with timed(timings, "threshold"):
                self.sigma_t_ = float(np.nanquantile(self.loo_variance(),
                                                     self.threshold_quantile))
            self.threshold_source_ = "loo"
        self.timings_ = timings
        self.embedding_ = self.embedding_.astype(self._out_dtype, copy=False)
        for gp in self.manifolds_:
            # the batch's n_i x n_i geodesics are not kept (the graph recomputes them on the
            # first mapping): a fitted model holds O(n k), and maps the same before and
            # after a save
            gp.release()
        return self

    def _stitch(self, X: np.ndarray, labels: np.ndarray, rng) -> None:
        frames = stitch_frames(
            X, labels, self.local_embedding_, int(self.n_components),
            int(self.global_dim or self.n_components), self.stitch,
            n_neighbors=int(self.n_neighbors_), n_support_nearest=self.n_support_nearest,
            n_support_farthest=self.n_support_farthest, ridge_lambda=self.ridge_lambda, rng=rng)
        self.stitch_rotation_, self.stitch_translation_, self.support_, self.embedding_ = frames

    #: Names of transform's outputs after the embedding (labelled like it:
    #: dr_dask.methods.labelled).
    _output_names = ("variance",)

    def fit_transform(self, X: Any, y: None = None) -> np.ndarray:
        """Run the batch phase and return ``embedding_`` of shape (n, global_dim).

        The batch's own coordinates (Isomap per manifold, stitched), not the GP's mapping
        of the batch: ``transform`` of the batch rows reproduces them (the mean is
        calibrated to them), up to the GP's smoothing.
        """
        return self.fit(X).embedding_

    # ------------------------------------------------------------------ mapping
    def _map(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Global coordinates (m, d_g), variance (m,), manifold (m,) of new points.

        The manifold is the one of least link distance (the point lies on it); the variance
        is that manifold's (see the class Notes).
        """
        m = X.shape[0]
        dg = self.stitch_rotation_.shape[1]
        emb = np.zeros((m, dg))
        var = np.zeros(m)
        if not m:
            return emb, var, np.zeros(0, dtype=np.int32)
        with single_blas_thread():
            nbrs = [gp.neighbours(X) for gp in self.manifolds_]
            link = np.column_stack([gp.link_distance(nb[0])
                                    for gp, nb in zip(self.manifolds_, nbrs)])
            j = np.argmin(link, axis=1)
            # mean and variance only under the manifold a point lies on: the O(n_i^2) part
            # of the mapping runs once per point, not once per manifold
            for i, (gp, (dist, idx)) in enumerate(zip(self.manifolds_, nbrs)):
                sel = np.flatnonzero(j == i)
                if sel.size:
                    mu, var[sel] = gp.predict(X[sel], (dist[sel], idx[sel]))
                    emb[sel] = mu @ self.stitch_rotation_[i].T + self.stitch_translation_[i]
        return emb, var, j.astype(np.int32)

    def map_points(self, X: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Map in-memory points: global coordinates, variance and manifold of each.

        Parameters
        ----------
        X : array-like of shape (m, D)

        Returns
        -------
        embedding : ndarray of shape (m, global_dim)
        variance : ndarray of shape (m,)
            Least predictive variance over the manifolds (eq. 8, noise included).
        manifold : ndarray of shape (m,)
            The manifold of least variance.
        """
        check_is_fitted(self, "manifolds_")
        return self._map(checked_rows(self, X, reset=False))

    def transform(self, X: Any, return_variance: bool = False):
        """Global coordinates of new points (and their predictive variance).

        Parameters
        ----------
        X : array-like or dask array of shape (m, D)
        return_variance : bool
            Also return the variance, shape (m,).

        Returns
        -------
        embedding : ndarray or dask array of shape (m, global_dim)
            A dask input gives dask outputs with the same row chunks.
        variance : ndarray or dask array of shape (m,), only with ``return_variance``
            Labelled like the embedding: an xarray input gives a DataArray along its sample
            dimension (``<name>_variance``), a DataFrame a Series with its index.
        """
        check_is_fitted(self, "manifolds_")

        if isinstance(X, da.Array):
            check_input(self, X, reset=False)
            X = X.rechunk({1: -1})  # the caller's row chunks are kept
            dg = self.stitch_rotation_.shape[1]
            out = X.map_blocks(
                _transform_block, self, dtype=np.float64, chunks=(X.chunks[0], (dg + 1,)),
            )
            emb, var = out[:, :dg], out[:, dg]
            return (emb, var) if return_variance else emb
        emb, var, _ = self.map_points(X)
        return (emb, var) if return_variance else emb

    def predict_variance(self, X: Any) -> np.ndarray:
        """Least predictive variance over manifolds, shape (m,)."""
        return self.map_points(X)[1]

    def is_novel(self, X: Any) -> np.ndarray:
        """Boolean per point: variance above ``sigma_t_`` (not explained by any manifold)."""
        return self.predict_variance(X) > self.sigma_t_

    def loo_variance(self) -> np.ndarray:
        """Leave-one-out predictive variance of every batch point in its own manifold, (n,).

        NaN for outliers.
        """
        check_is_fitted(self, "manifolds_")
        out = np.full(len(self.labels_), np.nan)  # outliers have no manifold
        for i, gp in enumerate(self.manifolds_):
            out[self.labels_ == i] = gp.loo_variance()
        return out

    def calibrate_threshold(self, X_holdout: Any = None, quantile: float = 0.99) -> float:
        """Set ``sigma_t_`` to a quantile of variances of held-out in-distribution points.

        Parameters
        ----------
        X_holdout : array-like of shape (m, D) or None
            Points from the batch's distribution not used for fitting. ``None`` uses the
            batch's leave-one-out variances.
        quantile : float in (0, 1]

        Returns
        -------
        float
            The new ``sigma_t_``.
        """
        check_is_fitted(self, "manifolds_")
        if not 0 < quantile <= 1:
            raise ValueError(f"quantile must be in (0, 1], got {quantile}")
        if X_holdout is None:
            var, self.threshold_source_ = self.loo_variance(), "loo"
        else:
            var, self.threshold_source_ = self.predict_variance(X_holdout), "holdout"
        self.sigma_t_ = float(np.nanquantile(var, quantile))
        self.threshold_quantile_ = float(quantile)
        return self.sigma_t_

    # ------------------------------------------------------------------ frames
    def align_to(self, reference: np.ndarray, rows: np.ndarray | slice | None = None,
                 per_manifold: bool = True):
        """Move this model's global frame onto another frame by Procrustes similarities.

        Used after a refit so that a new model version continues the previous frame: the new
        batch contains the old one, the old version's ``embedding_`` is the reference.

        Parameters
        ----------
        reference : ndarray of shape (m, global_dim)
            Target coordinates of the batch rows ``rows``.
        rows : index into the batch, default the first m rows
        per_manifold : bool, default=True
            After the global similarity, align every manifold that has at least ``n_components + 2``
            reference points on its own (docs/decisions.md GPI-REFIT: the re-stitched frames of a
            refit differ per manifold, not only globally). Manifolds without reference points (new
            modes) keep the global similarity.

        Returns
        -------
        dr_dask.linalg.align.Similarity
            The global map.
        """
        check_is_fitted(self, "manifolds_")
        reference = np.asarray(reference, dtype=np.float64)
        idx = np.arange(len(self.labels_))[slice(0, len(reference)) if rows is None else rows]
        sim = procrustes_fit(self.embedding_[idx], reference, scaling=True, reflection=True)
        self._compose(sim, range(self.n_manifolds_))
        out = self.labels_ < 0
        self.embedding_[out] = sim.apply(self.embedding_[out])
        if per_manifold:
            for j in range(self.n_manifolds_):
                mine = self.labels_[idx] == j
                if mine.sum() >= self.n_components + 2:
                    local = procrustes_fit(self.embedding_[idx[mine]], reference[mine],
                                           scaling=True, reflection=True)
                    self._compose(local, [j])
        return sim

    def _compose(self, sim, manifolds) -> None:
        """Fold ``x -> s x Q + t`` into the stitch of the given manifolds."""
        s, Q, tr = sim.scale, sim.rotation, sim.translation
        for j in manifolds:
            # global' = s * (mu R^T + t) Q + tr
            self.stitch_rotation_[j] = s * Q.T @ self.stitch_rotation_[j]
            self.stitch_translation_[j] = s * self.stitch_translation_[j] @ Q + tr
            sel = self.labels_ == j
            self.embedding_[sel] = sim.apply(self.embedding_[sel])


def _transform_block(block: np.ndarray, model: GPIsomap) -> np.ndarray:
    emb, var, _ = model._map(check_array_like(block, "X"))
    return np.column_stack([emb, var])
