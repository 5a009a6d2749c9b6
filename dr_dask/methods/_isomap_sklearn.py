"""What Isomap and Landmark Isomap share with scikit-learn's ``Isomap`` beyond the method.

scikit-learn's parameters and their meaning here (``metric``, ``p``, ``metric_params``,
``neighbors_algorithm``, ``path_method``, ``n_jobs``), the training input (dense or CSR
features, or with ``metric="precomputed"`` a distance matrix or sparse neighbour graph; float32
kept as the output dtype), the neighbour search of new points, the fitted ``nbrs_``, the
``kernel_pca_`` view of the fitted MDS, and ``reconstruction_error`` (the residual of the
centred geodesic kernel's rank-d approximation, as scikit-learn reports it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.neighbors import NearestNeighbors
from sklearn.utils.validation import validate_data

from dr_dask.graph.knn import Metric, kneighbors, kneighbors_local
from dr_dask.graph.neighbour_graph import graph_from_neighbors
from dr_dask.io.validation import (
    FLOAT_DTYPES,
    Options,
    check_input,
    check_params,
    output_dtype,
    positive,
)
from dr_dask.linalg.mds import double_centre

logger = logging.getLogger(__name__)

#: scikit-learn's ``Isomap`` parameters beyond the method's own (merged into both estimators'
#: ``_parameter_constraints``).
SKLEARN_CONSTRAINTS: dict = {
    "metric": [str, callable],
    "p": [positive(Real)],
    "metric_params": [dict, None],
    "path_method": [Options({"auto", "FW", "D"})],
    "neighbors_algorithm": [Options({"auto", "brute", "kd_tree", "ball_tree"})],
    "n_jobs": [Integral, None],
}

def precomputed(est: Any) -> bool:
    """Whether the estimator's input is a distance matrix or neighbour graph."""
    return isinstance(est.metric, str) and est.metric == "precomputed"


def metric_of(est: Any) -> Metric:
    """The estimator's distance (not for ``metric="precomputed"``)."""
    return Metric(est.metric, est.p, est.metric_params, est.neighbors_algorithm)


def training_input(est: Any, X: Any, *, in_memory: bool = True,
                   stage: bool = False) -> tuple[Any, Any, np.dtype]:
    """The checked training input of an Isomap estimator: ``(values, inp, dtype)``.

    ``values`` is a float64 array, a float64 CSR matrix (sparse features or a sparse
    precomputed graph), or (``in_memory=False`` and a stored input) None, with ``inp`` the
    :class:`~dr_dask.io.inputs.InputData` (None for sparse input); ``dtype`` is the outputs'.
    A precomputed input must be square (T, T). ``stage``: as
    :func:`~dr_dask.io.validation.check_input`'s.
    """
    check_params(est)
    if sp.issparse(X):
        values = validate_data(est, X, accept_sparse="csr", dtype=FLOAT_DTYPES, reset=True,
                               ensure_min_samples=2)
        dtype = output_dtype(values)
        values, inp = sp.csr_matrix(values, dtype=np.float64), None
    else:
        inp = check_input(est, X, reset=True, in_memory=in_memory, dtype=FLOAT_DTYPES,
                          min_samples=2, stage=stage)
        values = inp.values
        dtype = output_dtype(values if values is not None else inp.data)
        if values is not None:
            values = values.astype(np.float64, copy=False)
    if precomputed(est):
        if values is None:
            raise ValueError("metric='precomputed' takes an in-memory distance matrix or "
                             "sparse neighbour graph, not a stored input")
        shape = values.shape
        if shape[0] != shape[1]:
            raise ValueError(f"metric='precomputed' takes a square (T, T) distance matrix or "
                             f"neighbour graph, got shape {shape}")
        data = values.data if sp.issparse(values) else values
        if np.any(data < 0):
            raise ValueError("metric='precomputed': the distances must be non-negative")
    return values, inp, dtype


def query_input(est: Any, X: Any) -> Any:
    """Checked sparse input of ``transform`` (float64 CSR); None for any other input."""
    if not sp.issparse(X):
        return None
    checked = validate_data(est, X, accept_sparse="csr", dtype=FLOAT_DTYPES, reset=False)
    return sp.csr_matrix(checked, dtype=np.float64)


class SklearnIsomapTags:
    """scikit-learn's tags of its Isomap: CSR input, and with ``metric="precomputed"`` a
    pairwise input (float32 kept: every transformer's,
    :class:`dr_dask.methods.labelled.LabelledOutput`)."""

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()  # type: ignore[misc]
        tags.input_tags.sparse = True
        tags.input_tags.pairwise = precomputed(self)
        return tags


def nearest_neighbors(est: Any, fit_on: Any) -> NearestNeighbors:
    """scikit-learn's ``NearestNeighbors`` with the estimator's parameters, fitted on
    ``fit_on`` (the training rows, or the precomputed distances)."""
    return NearestNeighbors(n_neighbors=est.n_neighbors, radius=getattr(est, "radius", None),
                            algorithm=est.neighbors_algorithm, metric=est.metric, p=est.p,
                            metric_params=est.metric_params, n_jobs=est.n_jobs).fit(fit_on)


@dataclass
class Neighbours:
    """Picklable view of what finding the training neighbours of new points needs.

    ``training`` holds the training rows (dense or CSR), or with ``metric="precomputed"``
    ``fitted`` is the ``NearestNeighbors`` over the training distances and a query is a
    (Q, T) row block of distances to the training points.
    """

    training: Any
    n_neighbors: int | None
    radius: float | None
    metric: Metric
    fitted: NearestNeighbors | None = None

    def query(self, Xq: Any, client: Any = None, local: bool = False):
        """Distances and indices (Q, k) of the training neighbours of checked float64 points
        ``Xq``; radius rule: padded with ``inf`` and -1."""
        if self.radius is None:
            assert self.n_neighbors is not None  # fit checked that exactly one rule is given
            if self.fitted is not None:
                return self.fitted.kneighbors(Xq, self.n_neighbors)
            if local:
                return kneighbors_local(self.training, self.n_neighbors, Xq, self.metric)
            return kneighbors(self.training, self.n_neighbors, query=Xq, client=client,
                              metric=self.metric)
        nn = self.fitted or self.metric.nearest(radius=self.radius).fit(self.training)
        dist, idx = nn.radius_neighbors(Xq, radius=self.radius)
        counts = np.array([len(i) for i in idx])
        if (counts == 0).any():
            rows = np.flatnonzero(counts == 0)[:10].tolist()
            raise ValueError(f"rows {rows} of X have no training point within radius="
                             f"{self.radius}; their geodesics are undefined")
        return _padded(dist, idx)


def _padded(dist: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ragged neighbour lists (object arrays) as (Q, max count) arrays padded with inf, -1."""
    counts = np.array([len(i) for i in idx])
    D = np.full((len(idx), max(int(counts.max(initial=0)), 1)), np.inf)
    ind = np.full(D.shape, -1, dtype=np.int64)
    for r, (d, i) in enumerate(zip(dist, idx)):
        D[r, : len(d)], ind[r, : len(i)] = d, i
    return D, ind


def precomputed_graph(nn: NearestNeighbors, n_neighbors: int | None,
                      radius: float | None) -> sp.csr_matrix:
    """The symmetric neighbour graph of the training distances ``nn`` was fitted on (a dense
    matrix or a sparse graph: then only its stored entries are candidates, as in
    scikit-learn); a point is not its own neighbour."""
    if radius is None:
        dist, idx = nn.kneighbors(n_neighbors=n_neighbors)
    else:
        dist, idx = _padded(*nn.radius_neighbors(radius=radius))
    return graph_from_neighbors(idx, dist, nn.n_samples_fit_)


@dataclass
class KernelProjection:
    """Isomap's kernel PCA, as scikit-learn's ``Isomap.kernel_pca_`` holds it.

    scikit-learn fits ``KernelPCA(kernel="precomputed")`` on ``K = -1/2 D^2``; here the same
    eigenproblem is solved matrix-free (``-1/2 H D^2 H``, :func:`dr_dask.linalg.top_eigh`),
    so this keeps its result in KernelPCA's names without the T x T kernel.

    Attributes
    ----------
    n_components : int
    eigenvalues_ : ndarray of shape (d,)
        Top eigenvalues of the centred kernel.
    eigenvectors_ : ndarray of shape (T, d)
        Their unit eigenvectors.
    kernel_col_mean_ : ndarray of shape (T,)
        Means of the training kernel's columns, ``-1/2`` the squared geodesics' (what
        ``KernelCenterer`` centres new rows with).
    """

    n_components: int
    eigenvalues_: np.ndarray
    eigenvectors_: np.ndarray
    kernel_col_mean_: np.ndarray

    def transform(self, K: np.ndarray) -> np.ndarray:
        """Project kernel rows ``K = -1/2 g^2`` of shape (n, T) of new points: (n, d)."""
        sq_mean = -2.0 * self.kernel_col_mean_
        return project(-2.0 * np.asarray(K, dtype=np.float64), sq_mean, self.eigenvectors_,
                       self.eigenvalues_)


def project(g2: np.ndarray, sq_mean: np.ndarray, vectors: np.ndarray,
            values: np.ndarray) -> np.ndarray:
    """Out-of-sample classical MDS: squared geodesics (n, T) of new points, centred against the
    training means and projected with ``1/sqrt(lambda)`` (zero where lambda <= 0)."""
    f = double_centre(g2, col_mean=sq_mean, total=float(sq_mean.mean()))
    scale = np.where(values > 0, 1.0 / np.sqrt(np.where(values > 0, values, 1.0)), 0.0)
    return (f @ vectors) * scale


def reconstruction_error(sq_rows: Iterator[tuple[int, np.ndarray]], sq_mean: np.ndarray,
                         eigenvalues: np.ndarray) -> float:
    """scikit-learn's Isomap reconstruction error ``sqrt(||B||_F^2 - sum lambda^2) / T``
    (``B = -1/2 H D^2 H``), with B's row blocks centred one at a time.

    ``sq_rows`` yields ``(start, block)`` row blocks of the squared geodesics.
    """
    total = float(sq_mean.mean())
    frob = 0.0
    for start, block in sq_rows:
        B = double_centre(block, row_mean=sq_mean[start:start + len(block)], col_mean=sq_mean,
                          total=total)
        frob += float(np.einsum("ij,ij->", B, B))
    T = len(sq_mean)
    return float(np.sqrt(max(frob - float(np.sum(eigenvalues ** 2)), 0.0)) / T)


def row_blocks(read: Callable[[int, int], np.ndarray], T: int,
               step: int) -> Iterator[tuple[int, np.ndarray]]:
    """``(start, read(start, stop))`` over the rows of a T-row matrix, ``step`` at a time."""
    for s in range(0, T, step):
        yield s, read(s, min(s + step, T))
