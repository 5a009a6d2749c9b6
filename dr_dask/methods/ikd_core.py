"""IKD's shared primitives: the configuration, the result, and what every solver uses.

Nothing here imports the estimator (:mod:`dr_dask.methods.ikd`): the estimator validates its
parameters once into an :class:`IKDConfig` and hands it to a solver, a function
``(config, data, run) -> IKDResult`` in :mod:`._ikd_full`, :mod:`._ikd_geodesic` or
:mod:`._ikd_blockwise`. The solvers depend on this module only, never on each other's
internals or on estimator state.

IKD (Li & Wu 2022/2024, Algorithm 1): the sample similarity S, the elementwise inverse kernel D =
l^2 f^-1(S / sigma^2), the reference transform G = g(D) and its top-M algebraic eigenpairs. G is
never formed at scale: for a reference point r, ``G V = 1/2 (d_r 1^T V + 1 d_r^T V - D V)``, and for
MDS centring ``G V = -1/2 J D J V`` (:func:`dr_dask.linalg.mds.centred_product`), so the eigensolver
only needs products ``D V``.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from types import NoneType
from typing import Any, get_args, get_type_hints

import dask.array as da
import numpy as np

from dr_dask.graph.knn_tol import DEFAULT_KNN_TOL
from dr_dask.io.checkpoint import Checkpoint
from dr_dask.io.inputs import InputData
from dr_dask.linalg.cost import over_memory_budget
from dr_dask.linalg.eigen import DenseOperator, top_eigh
from dr_dask.linalg.kernels import Kernel
from dr_dask.linalg.mds import centred_product, double_centre, scaled_vectors
from dr_dask.linalg.tiles import rows_per_chunk
from dr_dask.runtime import config
from dr_dask.runtime.buffers import thread_buffer
from dr_dask.runtime.cluster import active_client, compute

logger = logging.getLogger(__name__)

# --------------------------------------------------------------------------------------------
# configuration and result


@dataclass(frozen=True)
class IKDConfig:
    """IKD's parameters after validation (built once per fit by ``IKD.fit``).

    Each field is the :class:`dr_dask.methods.ikd.IKD` parameter of the same name, copied by
    :meth:`from_params` (so an option is declared on the estimator and read here, never copied
    by hand), except the values the estimator resolves: ``kernel`` is the
    :class:`~dr_dask.linalg.kernels.Kernel` object (its alpha/gamma/nu applied), ``reference`` has
    the per-solver default applied, ``dtype`` is a numpy dtype, ``n_landmarks`` is at most the
    number of samples. ``landmark`` says whether ``n_landmarks`` selects landmark IKD.
    """

    n_components: int
    kernel: Kernel
    similarity: str
    reference: str
    variance: float | None
    length_scale: float
    solver: str
    floor: float
    ceil: float
    dtype: np.dtype
    tile_size: int
    tile_cache: str
    scratch: Any
    tol: float
    eigen_solver: str
    n_neighbors: int
    threshold: float | None
    geodesic_rule: str
    on_disconnected: str
    clique_threshold: float | None
    max_cliques: int
    min_overlap: int | None
    shared_points: str
    n_landmarks: int | None
    landmark_method: str
    random_state: Any
    client: Any
    progress: bool
    knn: str = "auto"
    n_probe: int | None = None
    knn_tol: float = DEFAULT_KNN_TOL

    @classmethod
    def from_params(cls, params: Mapping[str, Any], **resolved: Any) -> IKDConfig:
        """The configuration of an estimator's ``get_params()``: each field takes the parameter
        of its name, or its value in ``resolved``; int, float and bool fields get Python
        scalars (a NumPy integer, or an int given for a float, is converted)."""
        hints = get_type_hints(cls)
        values = {}
        for f in fields(cls):
            value = resolved[f.name] if f.name in resolved else params[f.name]
            kinds = [k for k in get_args(hints[f.name]) or (hints[f.name],) if k is not NoneType]
            if value is not None and len(kinds) == 1 and kinds[0] in (int, float, bool):
                value = kinds[0](value)
            values[f.name] = value
        return cls(**values)

    @property
    def landmark(self) -> bool:
        return self.n_landmarks is not None

    def inverse_kernel(self, sigma2: float) -> InverseKernel:
        return InverseKernel(self.kernel, sigma2, self.floor, self.ceil, self.length_scale)

    def on_disk(self, nbytes: float) -> bool:
        """Whether an array of ``nbytes`` goes to Zarr rather than worker memory."""
        return self.tile_cache == "disk" or (
            self.tile_cache == "auto" and over_memory_budget(nbytes))


#: The way out of IKD's T x T stages, named by their cost warning.
LANDMARK_WAY_OUT = ("landmark IKD: IKD(n_landmarks=L), an L x T matrix instead of T x T "
                    "(e.g. n_landmarks=500), or LandmarkIsomap(n_landmarks=L) for Isomap's "
                    "geodesics")


@dataclass
class IKDResult:
    """What every solver returns; ``IKD.fit`` sets each field as the attribute ``<name>_``.

    The common fields are set by every solver (``None`` where a solver has no such quantity,
    as documented on :class:`~dr_dask.methods.ikd.IKD`); the solver-specific ones are ``None``
    for the other solvers.
    """

    embedding: np.ndarray
    eigenvalues: np.ndarray
    eigen_residuals: np.ndarray | None
    eigen_passes: int | None
    explained_variance_ratio: float
    reference_index: int | None
    sigma2: float
    timings: dict[str, float] = field(default_factory=dict)
    graph_components: int | None = None
    graph_edges: int | None = None
    landmarks: np.ndarray | None = None
    cliques: list | None = None
    merge_log: list | None = None
    clique_threshold: float | None = None
    #: what ``transform`` needs (:mod:`._ikd_transform`); None where it cannot be kept
    out_of_sample: Any = None
    knn_recall: float | None = None
    knn_distance_error: float | None = None


# --------------------------------------------------------------------------------------------
# similarity rows and the inverse-kernel transform (picklable: they run on workers)


def normalise_rows(block: np.ndarray, similarity: str, dtype: Any) -> np.ndarray:
    """Rows scaled so that ``S = Xn Xn^T``: centred per sample across features, then
    divided by sqrt(N - 1) (covariance, Algorithm 1) or by their norm (correlation)."""
    X = np.asarray(block, dtype=np.float64)
    Xc = X - X.mean(axis=1, keepdims=True)
    if similarity == "correlation":
        Xc /= np.linalg.norm(Xc, axis=1, keepdims=True)
    else:
        Xc /= np.sqrt(X.shape[1] - 1)
    return Xc.astype(dtype, copy=False)


def lazy_rows(cfg: IKDConfig, inp: InputData) -> da.Array:
    """Row-normalised data Xn (S = Xn Xn^T), computed from the input wherever it is used."""
    X = inp.data.rechunk({0: cfg.tile_size, 1: -1})
    return X.map_blocks(normalise_rows, cfg.similarity, cfg.dtype, dtype=cfg.dtype)


def prepared_rows(cfg: IKDConfig, inp: InputData, persist: bool = True) -> tuple[da.Array, float]:
    """Row-normalised data Xn (S = Xn Xn^T) and sigma^2 for the configuration.

    On a cluster Xn is persisted before sigma^2 is computed from it: the input (an in-memory
    array is part of the graph) then travels to the workers once, not once for sigma^2 and
    again for the solver. ``persist=False`` leaves it lazy (:func:`lazy_rows`).
    """
    Xn = lazy_rows(cfg, inp)
    client = active_client(cfg.client)
    if client is not None and persist:
        Xn = client.persist(Xn)
    if cfg.variance is not None:
        return Xn, float(cfg.variance)
    if cfg.similarity == "correlation":
        return Xn, 1.0
    (sq,) = compute((Xn.astype(np.float64) ** 2).sum(axis=1).mean(), client=cfg.client)
    return Xn, float(sq)  # mean of diag(S), Algorithm 1 line 3


@dataclass(frozen=True)
class InverseKernel:
    """``S -> D = l^2 f^-1(clip(S / sigma^2, floor, ceil))`` with a zero diagonal."""

    kernel: Any
    sigma2: float
    floor: float
    ceil: float
    length_scale: float

    def __call__(self, S: np.ndarray, diagonal: bool = False) -> np.ndarray:
        """D of the similarities ``S`` (a new array of S's dtype; S is left alone)."""
        return self.tile(S / np.asarray(self.sigma2, S.dtype), diagonal, scaled=True,
                         stats=False)[0]

    def tile(self, S: np.ndarray, diagonal: bool = False, *, scaled: bool = False,
             row0: int = 0, stats: bool = True) -> tuple:
        """D computed over ``S`` in place, with the tile's :func:`~dr_dask.linalg.tiles.tile_stats`.

        One pass over row chunks of ``dr_dask.tiles.kernel-chunk-bytes``: each
        chunk goes through the whole chain
        (scale, clip, inverse, diagonal, statistics) while in cache, so a tile is read from
        memory once and needs no tile-sized temporary (the tile functions hand over a fresh
        GEMM result). For float64 the values are bit-for-bit those of the ufuncs applied to
        the whole tile; only the column sums accumulate in another order.

        Parameters
        ----------
        S : ndarray of shape (n, m), float32 or float64, writable
            Similarities (``scaled``: already divided by sigma^2). Overwritten with D.
        diagonal : bool
            S is a diagonal tile (n == m), or rows ``row0`` on of one: D's diagonal entries
            ``(r, row0 + r)`` are set to 0.
        row0 : int
            The tile row of S's first row (a band of a tile, see ``build_tiles``).
        stats : bool
            Compute the statistics (the triangulations, which only need D, skip them: they
            were as much as the inverse kernel itself there).

        Returns
        -------
        D : ndarray of shape (n, m)
            ``S`` itself.
        stats : tuple or None
            As :func:`~dr_dask.linalg.tiles.tile_stats` of D (None without ``stats``).
        """
        n, m = S.shape
        sigma2 = np.asarray(self.sigma2, S.dtype)
        l2 = self.length_scale**2
        rmax, rsum = np.empty(n), np.empty(n)
        cmax, csum = np.full(m, -np.inf, S.dtype), np.zeros(m)
        step = rows_per_chunk(m, S.itemsize, config.get_bytes("tiles.kernel-chunk-bytes"))
        for a in range(0, n, step):
            b = min(a + step, n)
            blk = S[a:b]
            if not scaled:
                np.divide(blk, sigma2, out=blk)
            np.clip(blk, self.floor, self.ceil, out=blk)
            self.kernel.inverse_inplace(blk)
            if l2 != 1.0:
                blk *= l2
            if diagonal:  # np.fill_diagonal's entries of the whole tile: (i, i), i < m
                i = np.arange(row0 + a, min(row0 + b, m))
                blk[i - row0 - a, i] = 0.0
            if not stats:
                continue
            rmax[a:b] = blk.max(axis=1)
            rsum[a:b] = blk.sum(axis=1, dtype=np.float64)
            np.maximum(cmax, blk.max(axis=0), out=cmax)
            csum += blk.sum(axis=0, dtype=np.float64)
        return S, (rmax, cmax.astype(np.float64), rsum, csum) if stats else None


# --------------------------------------------------------------------------------------------
# geodesic similarities (Li & Wu 2024, §2.4, second bullet)


def edge_weight(k: np.ndarray, floor: float, ceil: float) -> np.ndarray:
    """``-log`` of the normalised similarity, clipped like the inverse kernel's input."""
    return -np.log(np.clip(k, floor, ceil))


@dataclass(frozen=True)
class GeodesicKernel:
    """Path lengths (and, for the threshold rule, similarities) to inverse-kernel distances."""

    inverse: InverseKernel
    threshold: float | None  # None: the kNN rule, every entry replaced

    def __call__(self, P: np.ndarray, S: np.ndarray | None = None, diagonal: bool = False,
                 *, overwrite: bool = False) -> np.ndarray:
        """D of the path lengths ``P``: a new float64 array, or ``P`` itself (a float64 ``P``
        with ``overwrite``). Computed in place, without a temporary of P's size."""
        k = np.asarray(P, dtype=np.float64)
        k = np.negative(k, out=k if overwrite or k is not P else None)
        np.exp(k, out=k)
        if self.threshold is not None:
            s = np.asarray(S, dtype=np.float64) / self.inverse.sigma2
            k = np.where(s >= self.threshold, s, np.maximum(s, k))
        # k is already s / sigma^2
        return self.inverse.tile(k, diagonal, scaled=True, stats=False)[0]


# --------------------------------------------------------------------------------------------
# the reference transform g(D)


def reference_index(rowmax: np.ndarray, rowsum: np.ndarray, reference: str) -> int | None:
    """Reference point of Li & Wu (2022), §2.5: argmin_i max_j d_ij (paper), argmin mean, or None
    for MDS centring."""
    if reference == "min_max":
        return int(np.argmin(rowmax))
    if reference == "min_mean":
        return int(np.argmin(rowsum))
    return None


class GramOperator:
    """g(D) without forming it: products need only ``D @ V``.

    The first product also computes ``||g(D)||_F^2`` (``frobenius_sq``) tile by tile, riding
    along with the pass over the tiles that the product makes anyway.

    Parameters
    ----------
    D : ndarray or TiledSymmetric of shape (T, T)
        The inverse-kernel distance matrix (zero diagonal).
    d_ref : ndarray of shape (T,) or None
        Row r of D for a reference point; ``None`` means MDS double centring.
    row_mean : ndarray of shape (T,)
        Row means of D (the centred norm needs them).
    """

    def __init__(self, D: Any, d_ref: np.ndarray | None, row_mean: np.ndarray):
        self.D = D if hasattr(D, "matmat") else DenseOperator(D)
        self.d_ref = d_ref
        self.row_mean = row_mean
        self.shape = self.D.shape
        self.frobenius_sq: float | None = None

    def _d_times(self, V: np.ndarray) -> np.ndarray:
        if self.frobenius_sq is None and hasattr(self.D, "matmat_reduce"):
            W, parts = self.D.matmat_reduce(
                V, _gram_frobenius_tile, self.d_ref, self.row_mean, float(self.row_mean.mean())
            )
            self.frobenius_sq = float(sum(parts))
            return W
        if self.frobenius_sq is None:  # an in-memory D: one elementwise pass here
            full = slice(None)
            self.frobenius_sq = _gram_frobenius_tile(
                np.asarray(self.D.A), full, full, True, self.d_ref, self.row_mean,
                float(self.row_mean.mean()),
            )
        return self.D.matmat(V)

    def matmat(self, V: np.ndarray) -> np.ndarray:
        if self.d_ref is None:
            return centred_product(self._d_times, V)
        d = self.d_ref[:, None]
        return 0.5 * (d * V.sum(axis=0) + (d * V).sum(axis=0) - self._d_times(V))


def gram_dense(D: np.ndarray, d_ref_index: int | None) -> np.ndarray:
    """Dense g(D) for small T (per-clique solves, tests)."""
    if d_ref_index is None:
        return double_centre(D)
    d = D[:, d_ref_index]
    return reference_gram(D, d, d)


def reference_gram(D: Any, d_rows: np.ndarray, d_cols: np.ndarray,
                   out: np.ndarray | None = None) -> np.ndarray:
    """g of a block of D against the reference point r: ``1/2 (d_r 1^T + 1 d_c^T - D)``,
    where ``d_rows``, ``d_cols`` are the reference row's entries of the block's rows and
    columns; into ``out`` (float64, the same values) without temporaries."""
    if out is None:
        return 0.5 * (d_rows[:, None] + d_cols[None, :] - D)
    np.add(d_rows[:, None], d_cols[None, :], out=out)  # the expression's operations, in order
    out -= D
    out *= 0.5
    return out


def _gram_frobenius_tile(D, rows, cols, diagonal, d_ref, row_mean, total_mean):
    """||g(D)_ij||_F^2 of one tile (x2 off the diagonal, for the lower mirror).

    By row chunks of ``dr_dask.tiles.kernel-chunk-bytes``: g of a chunk is computed in place
    in one cache-sized float64 buffer (:mod:`dr_dask.runtime.buffers`), not in two or three
    tile-sized temporaries per task (at 4096^2, 128 MB each beside the tile).
    """
    rm, cm = row_mean[rows], row_mean[cols]
    total = 0.0
    step = rows_per_chunk(D.shape[1], 8, config.get_bytes("tiles.kernel-chunk-bytes"))
    for a in range(0, D.shape[0], step):
        blk = D[a:a + step]
        G = thread_buffer("gram_rows", blk.shape, np.float64)
        if d_ref is None:
            double_centre(blk, rm[a:a + step], cm, total_mean, out=G)
        else:
            reference_gram(blk, d_ref[rows][a:a + step], d_ref[cols], out=G)
        total += float(np.einsum("ij,ij->", G, G))
    return total * (1.0 if diagonal else 2.0)


def embedding_from_eigenpairs(values: np.ndarray, vectors: np.ndarray, n_components: int):
    """U~ = [sqrt(lambda_m) u_m]; non-positive eigenvalues give zero columns
    (docs/decisions.md IKD-A8)."""
    n_pos = int(np.sum(values[:n_components] > 0))
    if n_pos < n_components:
        warnings.warn(
            f"only {n_pos} of the top {n_components} eigenvalues of g(D) are positive; "
            "the remaining embedding columns are zero",
            RuntimeWarning,
            stacklevel=3,
        )
    return scaled_vectors(values[:n_components], vectors[:, :n_components])


# --------------------------------------------------------------------------------------------
# the eigen stage shared by the full and geodesic solvers


def eigen_stage(cfg: IKDConfig, G: GramOperator, run: Checkpoint | None) -> dict:
    """Top-M eigenpairs of g(D) (resumed from the run when that stage completed).

    ``eigen_solver="auto"`` is :func:`dr_dask.linalg.eigen.top_eigh`'s: G is known only by
    products, so it is materialised for LAPACK up to a few Lanczos blocks (T <= ~60 for M=2),
    Lanczos above.
    """
    if run is not None and run.is_done("eigen"):
        out = {n: run.read(f"eigen_{n}") for n in ("values", "vectors", "residuals")}
        info = run.stage_info("eigen")
        return {**out, "n_passes": info["n_passes"], "frobenius_sq": info["frobenius_sq"]}
    res = top_eigh(G, cfg.n_components, method=cfg.eigen_solver, tol=cfg.tol,
                   random_state=cfg.random_state)
    logger.info(
        "eigensolver: %d passes, converged=%s, max residual %.2e",
        res.n_passes, res.converged, res.residuals.max(),
    )
    out = {"values": res.values, "vectors": res.vectors, "residuals": res.residuals}
    if run is not None:
        for n, v in out.items():
            run.write(f"eigen_{n}", v, ("component",) if v.ndim == 1 else ("sample", "component"))
        run.mark_done("eigen", n_passes=res.n_passes, converged=res.converged,
                      frobenius_sq=G.frobenius_sq)
    return {**out, "n_passes": res.n_passes, "frobenius_sq": G.frobenius_sq}


def eigen_result(eig: dict, cfg: IKDConfig, r: int | None, sigma2: float,
                 timings: dict, **extra: Any) -> IKDResult:
    """The result of a solver that ends in one eigenproblem of g(D)."""
    M = cfg.n_components
    values = eig["values"]
    return IKDResult(
        embedding=embedding_from_eigenpairs(values, eig["vectors"], M),
        eigenvalues=values[:M],
        eigen_residuals=eig["residuals"][:M],
        eigen_passes=int(eig["n_passes"]),
        explained_variance_ratio=float(np.sum(values[:M] ** 2) / eig["frobenius_sq"]),
        reference_index=r,
        sigma2=sigma2,
        timings=timings,
        **extra,
    )
