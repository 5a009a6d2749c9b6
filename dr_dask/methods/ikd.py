"""Inverse Kernel Decomposition (Li & Wu), out-of-core on Dask: the estimator.

IKD (Li & Wu 2022/2024, Algorithm 1): the T x T sample similarity S over samples, the elementwise
inverse kernel D = l^2 f^-1(S / sigma^2), the reference transform G = g(D), and the top-M algebraic
eigenpairs of G give the latent up to an orthogonal map.

This module is the estimator only. ``fit`` validates the parameters once (the declarative
``_parameter_constraints``, checked by :func:`dr_dask.io.validation.check_params` in
scikit-learn's wording, then the rules across parameters and the data's size) into a frozen
:class:`~dr_dask.methods.ikd_core.IKDConfig` and calls one solver, a function
``(config, data, run) -> IKDResult``: :mod:`._ikd_full` (Algorithm 1, tiled),
:mod:`._ikd_geodesic` (geodesic and landmark IKD) or :mod:`._ikd_blockwise`. Their shared
primitives live in :mod:`.ikd_core`, which never imports this module. Every solver returns the
same fields, so every fit sets the same attributes.

One estimator with ``solver=``, not a public estimator per solver: the solvers share most
parameters (the kernel and its alpha/gamma/nu, similarity, variance, length scale, clipping,
precision, tiling, eigensolver, seed, cluster), the CLI,
workflows, benches and run identities name IKD with its ``solver``, and the result is the
same kind of object for each. A class per solver would repeat those parameters and their
docstrings four times for the gain of hiding a handful of solver options; instead each option
says which solver reads it, and options of another solver are ignored, as scikit-learn's
estimators do (``SVC``'s ``degree`` without ``kernel="poly"``).

Resolutions of the papers' ambiguities (``docs/decisions.md``, IKD-*), all parameters of
:class:`IKD`:

- entries outside the kernel's domain (0, sigma^2] are clipped to ``[floor, ceil]`` on the
  normalised scale (the authors' code: 1e-3 and 1 - 1e-5), A1-A2;
- the diagonal of D is zero (IKD-A3); the gamma-exponential kernel is the arXiv form (IKD-A5);
- fewer than M positive eigenvalues: the missing columns are zero (A8), with a warning;
- ``explained_variance_ratio_`` is sum_{m<=M} lambda_m^2 / ||G||_F^2 (A9).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable
from dataclasses import dataclass, fields
from numbers import Integral, Real
from typing import Any, ClassVar

import dask.array as da
import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted

from dr_dask.graph.knn import KNN_CONSTRAINTS
from dr_dask.graph.knn_tol import DEFAULT_KNN_TOL
from dr_dask.io.checkpoint import Checkpoint, deleted_on_failure
from dr_dask.io.storage import Location
from dr_dask.io.validation import (
    Interval,
    Options,
    check_input,
    check_params,
    check_values,
    clamp_to_samples,
    output_dtype,
    positive,
)
from dr_dask.linalg.kernels import ALIASES, KERNELS, Kernel, get_kernel
from dr_dask.methods._ikd_blockwise import fit_blockwise
from dr_dask.methods._ikd_full import fit_full
from dr_dask.methods._ikd_geodesic import fit_geodesic, fit_landmarks
from dr_dask.methods._ikd_transform import DeferredTriangulation
from dr_dask.methods._isomap_base import map_new_rows
from dr_dask.methods.ikd_core import IKDConfig
from dr_dask.methods.labelled import LabelledOutput
from dr_dask.methods.persistence import SavedModel
from dr_dask.runtime.cluster import ClientParam, active_client, run_stage
from dr_dask.runtime.progress import shown_during

logger = logging.getLogger(__name__)

SOLVERS = ("full", "geodesic", "blockwise")


class IKD(ClientParam, SavedModel, LabelledOutput, TransformerMixin, BaseEstimator):
    """Inverse Kernel Decomposition.

    Fits the latent of data that are a smooth (Gaussian-process-like) map of it, from the
    similarities between samples (Li & Wu 2024, Algorithm 1). The options of one solver are
    ignored by the others, as scikit-learn's estimators do (``SVC``'s ``degree`` without
    ``kernel="poly"``); each says which solver reads it.

    Input of ``fit``: an array-like, a dask, zarr or xarray array, or a path / URL accepted by
    :func:`dr_dask.open_dataset`, of shape (T, N), read chunk by chunk (never modified).
    Duplicate rows are kept and embedded (nearly exactly) with their twin, with a
    :class:`~dr_dask.io.validation.DuplicatePointsWarning`.

    Parameters
    ----------
    n_components : int, default=2
        Latent dimension M (at most N - 1: each sample is centred across its features; more
        is clamped to N - 1 with a warning).
    kernel : {"se", "rational_quadratic", "gamma_exponential", "matern"} or Kernel, \
default="se"
        Stationary kernel whose inverse is applied to the similarities (the aliases
        ``"squared_exponential"`` and ``"rq"`` are accepted).
    similarity : {"correlation", "covariance"}, default="correlation"
        ``"covariance"`` is Algorithm 1 (per-sample centring over the N features, 1/(N-1), one
        pooled sigma^2); ``"correlation"`` is what the authors' code uses (sigma^2 = 1).
    reference : {"min_max", "min_mean", "center"} or None, default=None
        The paper's reference point, the min-mean variant, or MDS double centring. ``None``
        takes the solver's: ``"min_max"`` (the paper's) for ``"full"`` and ``"blockwise"``,
        ``"center"`` for ``"geodesic"`` (on geodesic covariances MDS centring recovers the
        latent far better: R^2 0.94 vs 0.79 on the sinusoidal data; docs/decisions.md
        IKD-REF). Landmark IKD always centres.
    variance : float or None, default=None
        sigma^2; ``None`` takes the mean of diag(S) (1 for the correlation).
    length_scale : float, default=1.0
        l: only rescales the output.
    alpha : float, default=1.0
        Shape of the ``"rational_quadratic"`` kernel (> 0).
    gamma : float, default=1.0
        Exponent of the ``"gamma_exponential"`` kernel, in (0, 2] (the arXiv form, IKD-A5).
    nu : float, default=1.5
        Smoothness of the ``"matern"`` kernel (> 0).
    solver : {"full", "geodesic", "blockwise"}, default="full"
        ``"full"`` is Algorithm 1; ``"geodesic"`` and ``"blockwise"`` are the paper's
        solutions for weakly correlated data (section 2.4).
    floor : float, default=1e-3
        Lower end of the clip range of S / sigma^2, in (0, 1) (the domain of f^-1 is (0, 1];
        the authors' code's value).
    ceil : float, default=1 - 1e-5
        Upper end of the clip range, in (floor, 1].
    dtype : {"float64", "float32"}, default="float64"
        Precision of the tiles (float32 halves memory and disk and doubles GEMM speed).
        Geodesic IKD's tiles held in memory (kNN rule) are float32 either way, multiplied in
        float64: they come from float64 path lengths, and their rounding is far below what
        the geodesic approximation resolves.
    tile_size : int, default=4096
        Rows per tile block.
    tile_cache : {"auto", "memory", "disk"}, default="auto"
        Where D's tiles live between eigensolver passes: worker memory, or a Zarr array
        (in the run's group, else under ``scratch``). ``"auto"`` picks memory up to
        ``dr_dask.tiles.memory-bytes`` of dask's configuration (1 GiB).
        Landmark IKD: where its L x T float32 landmark geodesic rows live, by the same rule.
    scratch : str, path or Location, default=None
        Local path or URL for the temporary Zarr arrays of a fit without a run (disk tiles,
        path lengths, landmark rows), deleted after use; every worker must reach it. ``None``:
        next to a remote input, else a local temporary directory.
    tol : float, default=1e-8
        Relative residual tolerance of the eigensolver.
    eigen_solver : {"auto", "dense", "lanczos"}, default="auto"
        ``"auto"`` is :func:`dr_dask.linalg.eigen.top_eigh`'s rule for an operator known by
        products: g(D) materialised for dense LAPACK up to 6 Lanczos blocks
        (T <= 6 max(2M, M + 8)), block Lanczos above; ``"dense"`` materialises it at any T.
    n_neighbors : int, default=5
        ``solver="geodesic"`` (and landmark IKD), kNN rule: k of the graph of largest
        correlations.
    threshold : float or None, default=None
        ``solver="geodesic"``, threshold rule: s0 in (0, 1); the graph joins pairs with
        s / sigma^2 >= s0 and only entries below it are replaced by path similarities.
    geodesic_rule : {"knn", "threshold"}, default="knn"
        ``solver="geodesic"``: the authors' code's kNN graph (every entry replaced by its path
        similarity) or the paper's threshold graph (needs ``threshold``).
    on_disconnected : {"bridge", "raise"}, default="bridge"
        ``solver="geodesic"``: join a disconnected graph's components by their shortest edges
        (with a warning naming them), or refuse it.
    clique_threshold : float or None, default=None
        ``solver="blockwise"``: s0 in (0, 1) of the graph whose maximal cliques are solved;
        ``None`` takes the authors' N-based rule (0.3 up to N = 100, 0.1 from N = 1000).
    max_cliques : int, default=500
        ``solver="blockwise"``: the clique search stops after this many cliques of at
        least M + 2 points (the authors' cap).
    min_overlap : int or None, default=None
        ``solver="blockwise"``: shared points needed to align two cliques directly (at least
        M + 1; ``None`` is M + 1); with fewer, a bridging sub-problem aligns them.
    shared_points : {"keep_larger", "average", "weighted"}, default="keep_larger"
        ``solver="blockwise"``: coordinates of points two merged cliques share: the larger
        clique's (the authors'), the mean, or the mean weighted by how many cliques each side
        merged.
    n_landmarks : int or None, default=None
        Landmark IKD (with ``solver="full"`` or ``"geodesic"``): L landmarks, L x T rows instead
        of T x T (docs/decisions.md IKD-LANDMARK). More than the samples uses every sample,
        with a warning. ``None``: no landmarks.
    landmark_method : {"maxmin", "random"}, default="maxmin"
        Landmark IKD: max-min (farthest-point order over a seeded subset) or a seeded uniform
        choice.
    random_state : int, RandomState instance or None, default=None
        Seeds the eigensolver and every randomized step of the solvers (landmarks).
    client : distributed.Client or None, default=None
        Cluster to run on; ``None`` takes the active client, else dask's threads.
    progress : bool, default=False
        Progress bars on the fit's computations: a widget in Jupyter, text on a terminal's
        stderr, nothing in a pipe (:mod:`dr_dask.runtime.progress`).
    knn : {"auto", "exact", "ivf"}, default="auto"
        The kNN rule's neighbour search (``solver="geodesic"``, also landmark IKD): the exact
        search, the partitioned approximate search (each row probing its ``n_probe`` nearest
        of about sqrt(T) / 2 lists), or ``"auto"`` (see
        :func:`dr_dask.graph.knn.search_neighbours`).
    n_probe : int or None, default=None
        Lists each row probes with the IVF search; ``None``: adaptive (as
        :class:`~dr_dask.methods.isomap.Isomap`'s).
    knn_tol : float, default=0.003
        The adaptive probe's target: the mean relative error of the k-th neighbour's distance
        (:mod:`dr_dask.graph.knn_tol`), in [0, 1); 0 is the exact search.

    Attributes
    ----------
    Every solver sets every attribute below (``None`` where it has no such quantity).

    embedding_ : ndarray of shape (T, M)
    eigenvalues_ : ndarray of shape (M,)
        Top algebraic eigenvalues of g(D) (``full``, ``geodesic``); of the landmarks'
        centred matrix ``-1/2 H D_LL H`` (landmark IKD); for ``blockwise``, which has no single
        g(D), the eigenvalues of ``Zc^T Zc`` for the centred merged embedding ``Zc`` (its
        squared singular values, largest first).
    eigen_residuals_ : ndarray of shape (M,) or None
        ``||G v - lambda v||`` of each returned pair; None for ``blockwise``.
    eigen_passes_ : int or None
        Products with g(D) the eigensolver made (1 for a dense solve); None for ``blockwise``.
    explained_variance_ratio_ : float
        sum_{m<=M} lambda_m^2 / ||g(D)||_F^2 (landmark IKD: of the landmarks' matrix;
        blockwise: the clique-size-weighted mean over the cliques).
    reference_index_ : int or None
        Row used as the reference point (None with ``center``, landmark and blockwise IKD).
    sigma2_ : float
    timings_ : dict
        Wall time in seconds of each stage, by stage name.
    n_features_in_ : int
    graph_components_, graph_edges_ : int or None
        ``solver="geodesic"``: components of the neighbour graph before repair, and its edges.
    cliques_ : list of ndarray or None
        ``solver="blockwise"``: the cliques the merge used.
    merge_log_ : list of dict or None
        ``solver="blockwise"``: each merge, its overlap and alignment residual (or fallback).
    clique_threshold_ : float or None
        ``solver="blockwise"``: the s0 used (given, or the authors' N-based rule).
    landmarks_ : ndarray of shape (L,) or None
        With ``n_landmarks``: indices of the landmark rows.
    out_of_sample_ : NystromMap or TriangulationMap or None
        What :meth:`transform` needs (:mod:`dr_dask.methods._ikd_transform`): NumPy arrays
        (weights, reference row, landmark rows, pseudo-inverse; for geodesic maps the L x T
        float32 landmark path lengths) and the training rows (the NumPy input, or the input's
        dask array, read block by block). None when the path lengths exceed the in-memory
        budget (landmark IKD with its rows on disk). ``solver="geodesic"`` builds its map when
        this attribute is first read (by :meth:`transform`, or by the caller), on the
        estimator's client, so that ``fit`` does not pay for the landmarks' Dijkstra rows
        (1.6-2 s at T=10,000); until then the fit keeps its neighbour graph.
    knn_recall_ : float or None
        ``solver="geodesic"`` with the kNN rule: share of the true neighbours the search found
        (1.0 exact; IVF: estimated on 200 seeded rows).
    knn_distance_error_ : float or None
        Likewise, the mean relative excess of the k-th found neighbour's distance over the true
        k-th distance on those rows (0.0 exact; a warning far above ``knn_tol``).

    See Also
    --------
    Isomap : Isomap on the same graph machinery (Euclidean geodesics, out-of-sample map).
    LandmarkIsomap : Landmark Isomap, the Euclidean counterpart of landmark IKD.
    GPIsomap : streaming Isomap with a Gaussian-process map and predictive variance.
    dr_dask.runs.group.run_embedding : a fit into a resumable run group on any store.

    Examples
    --------
    >>> import numpy as np
    >>> from dr_dask import IKD
    >>> rng = np.random.default_rng(0)
    >>> z = rng.uniform(-1, 1, size=(200, 1))                # the latent
    >>> X = np.sin(z * rng.normal(size=(1, 40)) * 3 + rng.uniform(0, 6, size=(1, 40)))
    >>> ikd = IKD(n_components=1, random_state=0).fit(X[:150])
    >>> ikd.embedding_.shape
    (150, 1)
    >>> bool(abs(np.corrcoef(ikd.embedding_[:, 0], z[:150, 0])[0, 1]) > 0.9)
    True
    >>> ikd.transform(X[150:]).shape  # new rows
    (50, 1)
    """

    _parameter_constraints: ClassVar[dict] = {
        "n_components": [positive(Integral)],
        "kernel": [Options({*KERNELS, *ALIASES}), Kernel],
        "similarity": [Options({"correlation", "covariance"})],
        "reference": [Options({"min_max", "min_mean", "center"}), None],
        "variance": [positive(Real), None],
        "length_scale": [positive(Real)],
        "alpha": [positive(Real)],
        "gamma": [Interval(Real, 0, 2, closed="right")],
        "nu": [positive(Real)],
        "solver": [Options(set(SOLVERS))],
        "floor": [Interval(Real, 0, 1, closed="neither")],
        "ceil": [Interval(Real, 0, 1, closed="right")],
        "dtype": [Options({"float32", "float64"})],
        "tile_size": [positive(Integral)],
        "tile_cache": [Options({"auto", "memory", "disk"})],
        "scratch": [str, os.PathLike, Location, None],
        "tol": [positive(Real)],
        "eigen_solver": [Options({"auto", "dense", "lanczos"})],
        "n_neighbors": [positive(Integral)],
        "threshold": [Interval(Real, 0, 1, closed="neither"), None],
        "geodesic_rule": [Options({"knn", "threshold"})],
        "on_disconnected": [Options({"bridge", "raise"})],
        "clique_threshold": [Interval(Real, 0, 1, closed="neither"), None],
        "max_cliques": [positive(Integral)],
        "min_overlap": [positive(Integral), None],
        "shared_points": [Options({"keep_larger", "average", "weighted"})],
        "n_landmarks": [positive(Integral), None],
        "landmark_method": [Options({"maxmin", "random"})],
        "random_state": ["random_state"],
        "client": "no_validation",
        "progress": ["boolean"],
        **KNN_CONSTRAINTS,
    }

    def __init__(
        self,
        *,
        n_components: int = 2,
        kernel: str = "se",
        similarity: str = "correlation",
        reference: str | None = None,
        variance: float | None = None,
        length_scale: float = 1.0,
        alpha: float = 1.0,
        gamma: float = 1.0,
        nu: float = 1.5,
        solver: str = "full",
        floor: float = 1e-3,
        ceil: float = 1.0 - 1e-5,
        dtype: str = "float64",
        tile_size: int = 4096,
        tile_cache: str = "auto",
        scratch: Any = None,
        tol: float = 1e-8,
        eigen_solver: str = "auto",
        n_neighbors: int = 5,
        threshold: float | None = None,
        geodesic_rule: str = "knn",
        on_disconnected: str = "bridge",
        clique_threshold: float | None = None,
        max_cliques: int = 500,
        min_overlap: int | None = None,
        shared_points: str = "keep_larger",
        n_landmarks: int | None = None,
        landmark_method: str = "maxmin",
        random_state: Any = None,
        client: Any = None,
        progress: bool = False,
        knn: str = "auto",
        n_probe: int | None = None,
        knn_tol: float = DEFAULT_KNN_TOL,
    ):
        self.n_components = n_components
        self.kernel = kernel
        self.similarity = similarity
        self.reference = reference
        self.variance = variance
        self.length_scale = length_scale
        self.alpha = alpha
        self.gamma = gamma
        self.nu = nu
        self.solver = solver
        self.floor = floor
        self.ceil = ceil
        self.dtype = dtype
        self.tile_size = tile_size
        self.tile_cache = tile_cache
        self.scratch = scratch
        self.tol = tol
        self.eigen_solver = eigen_solver
        self.n_neighbors = n_neighbors
        self.threshold = threshold
        self.geodesic_rule = geodesic_rule
        self.on_disconnected = on_disconnected
        self.clique_threshold = clique_threshold
        self.max_cliques = max_cliques
        self.min_overlap = min_overlap
        self.shared_points = shared_points
        self.n_landmarks = n_landmarks
        self.landmark_method = landmark_method
        self.random_state = random_state
        self.client = client
        self.progress = progress
        self.knn = knn
        self.n_probe = n_probe
        self.knn_tol = knn_tol

    # -- parameters -----------------------------------------------------------------------

    def _config(self, n_samples: int, n_features: int) -> IKDConfig:
        """The validated configuration: the rules that involve several parameters or the
        data's size (:data:`_RULES`), after the declarative checks of each parameter
        (``check_params``)."""
        T = int(n_samples)
        M = _supported_components(int(self.n_components), int(n_features))
        for rule in _RULES:
            rule.check(self, T, M)
        n_landmarks = self.n_landmarks
        if n_landmarks is not None:  # landmark IKD
            n_landmarks = clamp_to_samples(self, "n_landmarks", T, stacklevel=4)
            if self.reference not in (None, "center"):
                warnings.warn(
                    f"reference={self.reference!r} is ignored by landmark IKD: landmark MDS "
                    "centres the landmark distances (the 'center' reference)", UserWarning,
                    stacklevel=3)
        # MDS centring on geodesic covariances recovers the latent far better (docs/decisions.md
        # IKD-REF)
        reference = self.reference or ("center" if self.solver == "geodesic" else "min_max")
        return IKDConfig.from_params(
            self.get_params(deep=False),
            kernel=get_kernel(self.kernel, alpha=self.alpha, gamma=self.gamma, nu=self.nu),
            reference="center" if n_landmarks is not None else reference,
            dtype=np.dtype(self.dtype),
            n_landmarks=n_landmarks,
            n_components=M,
        )

    # -- fitting --------------------------------------------------------------------------

    @shown_during
    def fit(self, X: Any, y: Any = None, *, run: Checkpoint | None = None) -> IKD:
        """Fit IKD on X.

        Parameters
        ----------
        X : array-like of shape (T, N)
            numpy, dask, zarr or xarray; or a path accepted by :func:`dr_dask.open_dataset`
            (checked by :func:`dr_dask.io.validation.check_input`; never modified).
        y : ignored
        run : Checkpoint, optional
            Keep the stages' arrays and marks in this run's Zarr group so that an interrupted
            fit, rerun, resumes after the last complete stage: ``full`` and ``geodesic`` keep
            their tiles and eigenpairs, ``blockwise`` its cliques; landmark IKD writes its
            L x T rows there (every worker reaches the run's store) and starts again.

        Returns
        -------
        self
        """
        check_params(self)
        # a correlation needs 2 features; Algorithm 1 needs M + 2 samples
        inp = check_input(self, X, reset=True, min_samples=int(self.n_components) + 2,
                          min_features=2, stage=True)
        with deleted_on_failure(inp.discard):
            T, N = (int(n) for n in inp.data.shape)
            cfg = self._config(T, N)
            run_stage("validate", lambda: check_values(
                inp,
                min_samples=cfg.n_components + 2,
                constant_rows=cfg.similarity == "correlation",
                client=cfg.client,
            ))
            if cfg.landmark:
                result = run_stage("landmark", lambda: fit_landmarks(cfg, inp, run))
            elif cfg.solver == "full":  # its distance and eigen stages are retried one by one
                result = fit_full(cfg, inp, run)
            else:
                solve = fit_geodesic if cfg.solver == "geodesic" else fit_blockwise
                result = run_stage(cfg.solver, lambda: solve(cfg, inp, run))
        for f in fields(result):
            setattr(self, f"{f.name}_", getattr(result, f.name))
        self._out_dtype = output_dtype(inp.data)
        if isinstance(result.embedding, np.ndarray):
            self.embedding_ = result.embedding.astype(self._out_dtype, copy=False)
        return self

    def fit_transform(self, X: Any, y: Any = None, **fit_params: Any) -> np.ndarray:
        """Fit and return ``embedding_`` of shape (T, M)."""
        return self.fit(X, y, **fit_params).embedding_

    @property
    def out_of_sample_(self) -> Any:
        """The out-of-sample map (see the class's attributes), built on first read for
        ``solver="geodesic"``."""
        try:
            oos = self.__dict__["_out_of_sample"]
        except KeyError:  # not fitted: no such attribute, as for every fitted attribute
            raise AttributeError(
                f"{type(self).__name__!r} object has no attribute 'out_of_sample_'") from None
        if isinstance(oos, DeferredTriangulation):
            return oos.get(active_client(self.client))
        return oos

    @out_of_sample_.setter
    def out_of_sample_(self, value: Any) -> None:
        self._out_of_sample = value

    def _projector(self) -> Any:
        check_is_fitted(self, "embedding_")
        oos = self.out_of_sample_
        if oos is None:
            # landmark IKD dropped its rows in the fit; geodesic IKD builds its map on demand
            remedy = ("refit with fewer n_landmarks or a larger budget"
                      if self.n_landmarks is not None else "raise the budget and call again")
            raise ValueError(
                f"this IKD fit has no out-of-sample map: the float32 path lengths from its "
                f"landmarks to its {len(self.embedding_)} rows exceed the in-memory budget "
                f"(dask config 'dr_dask.tiles.memory-bytes'); {remedy} to use transform")
        return oos

    def transform(self, X: Any) -> np.ndarray | da.Array:
        """Map new rows of shape (n, N) into the fitted embedding; a dask array in gives a
        dask array out with the same row chunks.

        Full IKD (Nyström): ``y(x) = g_x U~ Lambda^-1``, with ``g_x`` the row of g(D) of x's
        inverse-kernel distances to the training rows (Li & Wu 2024, §2.2, Eqs. 3-5): O(T N)
        per row, the training rows read block by block. Geodesic, landmark and blockwise
        IKD: de Silva-Tenenbaum triangulation from x's IKD distances to the landmarks, through
        the neighbour graph (geodesics via x's ``n_neighbors`` nearest training rows) or, for
        blockwise and landmark full IKD, directly. Formulas and costs:
        :mod:`dr_dask.methods._ikd_transform`.

        Parameters
        ----------
        X : array-like, dask / zarr / xarray array or path, of shape (n, N)

        Returns
        -------
        ndarray or dask array of shape (n, M)
        """
        return map_new_rows(self, X)


def _supported_components(M: int, n_features: int) -> int:
    """``n_components``, clamped with a warning to what the data support: each sample is
    centred across its features, so the samples span at most N - 1 dimensions (more
    components would be degenerate eigenvectors, not structure)."""
    if n_features - 1 >= M:
        return M
    if n_features < 2:
        raise ValueError(
            f"n_components={M} is more than the data supports: {n_features} feature gives no "
            "component (each sample is centred across features); use more features")
    # a default sized for real data then works on few features, as n_landmarks is clamped to
    # the samples
    warnings.warn(
        f"n_components={M} is more than the data supports: {n_features} features give at most "
        f"{n_features - 1} components (each sample is centred across features); IKD uses "
        f"n_components={n_features - 1}", UserWarning, stacklevel=5)
    return n_features - 1


@dataclass(frozen=True)
class _Rule:
    """A rule across IKD's parameters and the data's size: for the ``solvers`` it names, when
    ``applies(est)``, the fit needs ``holds(est, T, M)``; else ValueError(``message``,
    formatted with ``est``, ``T``, ``M``, ``last`` = T - 1 and ``need`` = M + 1)."""

    solvers: frozenset[str]
    applies: Callable[[Any], bool]
    holds: Callable[[Any, int, int], bool]
    message: str

    def check(self, est: Any, T: int, M: int) -> None:
        if est.solver in self.solvers and self.applies(est) and not self.holds(est, T, M):
            raise ValueError(self.message.format(est=est, T=T, M=M, last=T - 1, need=M + 1))


def _always(est: Any) -> bool:
    return True


def _never(est: Any, T: int, M: int) -> bool:
    return False


def _landmark(est: Any) -> bool:
    return est.n_landmarks is not None


#: Every rule across IKD's parameters, per solver, in one table (``IKD._config`` checks them in
#: order; each parameter's own range is in ``IKD._parameter_constraints``).
_RULES: tuple[_Rule, ...] = (
    _Rule(frozenset(SOLVERS), _always, lambda e, T, M: e.floor < e.ceil,
          "need floor < ceil (the clip range of S / sigma^2), got floor={est.floor}, "
          "ceil={est.ceil}"),
    _Rule(frozenset({"geodesic"}), lambda e: e.geodesic_rule == "knn",
          lambda e, T, M: e.n_neighbors < T,
          "n_neighbors must be an integer in [1, {last}] (a point is not its own neighbour), got "
          "{est.n_neighbors!r}"),
    _Rule(frozenset({"geodesic"}), lambda e: e.geodesic_rule == "threshold",
          lambda e, T, M: e.threshold is not None,
          "geodesic_rule='threshold' needs threshold (s0 in (0, 1))"),
    _Rule(frozenset({"geodesic"}), lambda e: _landmark(e) and e.geodesic_rule == "threshold",
          _never,
          "landmark IKD supports geodesic_rule='knn' only (the threshold rule needs every "
          "similarity next to the L x T geodesics)"),
    _Rule(frozenset({"blockwise"}), lambda e: e.min_overlap is not None,
          lambda e, T, M: e.min_overlap >= M + 1,
          "min_overlap must be an integer >= {need} (M + 1 shared points make the "
          "rigid alignment unique), got {est.min_overlap!r}"),
    _Rule(frozenset({"blockwise"}), _landmark, _never,
          "n_landmarks is a geodesic/full-solver extension; blockwise IKD has no landmark "
          "variant (use solver='geodesic' or 'full' with n_landmarks)"),
    _Rule(frozenset({"geodesic", "full"}), _landmark,
          lambda e, T, M: min(e.n_landmarks, T) >= M + 1,
          "n_landmarks must be an integer >= {need} (more than n_components), got "
          "{est.n_landmarks!r}"),
)
