"""IKD's out-of-sample maps: what ``IKD.transform`` needs, built by each solver at the end of
its fit (geodesic IKD's at the first ``transform``, see :class:`DeferredTriangulation`), and the
mapping of new rows.

The papers give no out-of-sample mapping (Li & Wu 2024 embed a fixed set of T rows). The
maps below extend the fitted embedding by the same construction the fit used, so that a
training row maps onto its own embedding row:

**Full IKD: Nyström** (Williams & Seeger 2001; Bengio et al. 2004 for MDS-type kernels). The
fit's embedding is ``U~ = U Lambda^(1/2)`` with ``G U = U Lambda`` (Li & Wu 2024, §2.2, Eq. 5),
so ``U~ = G U~ Lambda^-1``. A new row x gets its similarities ``s_xj`` to the T training rows
(centred and scaled as the training rows were), its inverse-kernel distances
``d_xj = l^2 f^-1(s_xj / sigma^2)`` (Table 1, the same clipping), the row of g (Eq. 3 with the
fitted reference point r: ``g_xj = 1/2 (d_xr + d_rj - d_xj)``; with MDS centring the new row is
centred against the training means) and

    y(x) = g_x U~ Lambda^-1        (an M-vector; zero for a non-positive eigenvalue)

Cost: O(T N) per new row for the similarities, O(T M) for the product; memory: one block of
training rows at a time (the training rows are read by row blocks, so a dask array of them
never becomes one array, and no T x T matrix exists). ``transform(X_train)`` gives
``embedding_`` up to the eigensolver's residual and the clipped diagonal (``d_ii`` is
``f^-1(ceil)`` ~ 2e-5 for a new row, 0 in the fit).

**Geodesic and landmark IKD: landmark triangulation** (de Silva & Tenenbaum 2004,
"distance-based triangulation", the landmark solver's own step). With L landmark rows of the
embedding centred at their mean c, ``Y_L`` (L x M), the landmarks' IKD distances ``D_LL``
(``d = l^2 f^-1(s / sigma^2)`` of the geodesic similarity) and its row means ``delta_mean``,

    y(x) = c - 1/2 pinv(Y_L) (delta_x - delta_mean)

where ``delta_x`` are x's IKD distances to the landmarks, taken through the neighbour graph:
the geodesic of x to landmark l is ``min_n (w_xn + path_nl)`` over x's ``n_neighbors`` nearest
training rows n (edge weights ``w = -log(s / sigma^2)`` as in the fit, Li & Wu 2024 §2.4),
with the L x T landmark path lengths kept from the fit. Landmark IKD with ``solver="full"``
uses the direct similarities to its landmarks. For landmark IKD this is exactly the fit's own
triangulation (``pinv(Y_L)`` is its landmark MDS pseudo-inverse); geodesic IKD keeps a max-min
choice of ``min(T, TRANSFORM_LANDMARKS)`` landmarks, and builds its map only when it is first
needed (the landmarks' Dijkstra rows are work that most callers of ``fit_transform`` never
use). Cost per new row: a kNN query over the
training rows (O(T N) exact), O(k L) for the geodesics, O(L M) for the product; memory: the
L x T float32 path lengths (kept only within the in-memory tile budget,
``dr_dask.tiles.memory-bytes``).

**Blockwise IKD: local triangulation.** Blockwise IKD trusts only strong similarities (Li &
Wu 2024 §2.4, first bullet) and has no graph, so each new row is triangulated as above from
its ``LOCAL_ROWS (M + 1)`` most similar training rows, with their direct IKD distances: O(T N)
for the similarities plus O(K^2 N) per row.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, replace
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp

from dr_dask.graph import GeodesicRows, kneighbors
from dr_dask.graph.knn import kneighbors_local
from dr_dask.graph.landmarks import select_landmarks, triangulate
from dr_dask.graph.out_of_sample import geodesics_via_neighbors
from dr_dask.io.inputs import InputData
from dr_dask.linalg.cost import over_memory_budget
from dr_dask.methods.ikd_core import (
    GeodesicKernel,
    IKDConfig,
    InverseKernel,
    edge_weight,
    normalise_rows,
)
from dr_dask.runtime.cluster import active_client, compute

logger = logging.getLogger(__name__)

#: Landmarks of geodesic IKD's triangulation (landmark IKD uses its own).
TRANSFORM_LANDMARKS = 256
#: Rows per unit of M + 1 of blockwise IKD's local triangulation.
LOCAL_ROWS = 4
#: Bytes of the (new rows x training block) similarity temporaries of the Nyström map.
CHUNK_BYTES = 1 << 26


def training_rows(inp: InputData) -> Any:
    """The training rows a map keeps: the checked NumPy array of an in-memory input, else the
    input's lazy dask array (read block by block at transform time, never whole)."""
    return inp.values if inp.values is not None else inp.data


def _blocks(training: Any, rows: int):
    """``(start, block)`` of the training rows, NumPy blocks of at most ``rows`` rows."""
    if isinstance(training, da.Array):
        start = 0
        for block in training.rechunk({1: -1}).blocks:
            # a worker task reading its input: synchronously, wherever this runs
            values = np.asarray(block.compute(scheduler="sync"))
            for a in range(0, len(values), rows):
                yield start + a, values[a:a + rows]
            start += len(values)
    else:
        for a in range(0, len(training), rows):
            yield a, np.asarray(training[a:a + rows])


@dataclass
class NystromMap:
    """Full IKD's out-of-sample map (module docstring). Picklable: runs in worker tasks."""

    training: Any          # (T, N) raw rows: NumPy, or the input's dask array
    similarity: str
    inverse: InverseKernel
    weights: np.ndarray    # (T, M) U~ Lambda^-1
    reference_row: np.ndarray | None   # (N,) normalised row r (reference point), else None
    reference_dist: np.ndarray | None  # (T,) d_r (row r of D, d_rr = 0), else None
    row_mean: np.ndarray   # (T,) row means of D (MDS centring)

    def __call__(self, Xq: np.ndarray, client: Any = None, local: bool = True) -> np.ndarray:
        Q = normalise_rows(Xq, self.similarity, np.float64)
        n, M = len(Q), self.weights.shape[1]
        DA = np.zeros((n, M))
        dsum = np.zeros(n)
        step = max(1, CHUNK_BYTES // (8 * max(n, 1)))
        for a, block in _blocks(self.training, step):
            Xn = normalise_rows(block, self.similarity, np.float64)
            D = self.inverse(Q @ Xn.T)
            DA += D @ self.weights[a:a + len(block)]
            dsum += D.sum(axis=1)
        colsum = self.weights.sum(axis=0)
        if self.reference_row is not None:
            d_xr = self.inverse(Q @ self.reference_row[:, None])[:, 0]
            return 0.5 * (d_xr[:, None] * colsum + self.reference_dist @ self.weights - DA)
        # MDS centring of the new row against the training means (the centred eigenvectors
        # sum to zero, so the row's own mean only cancels rounding)
        T = len(self.row_mean)
        shift = dsum / T - self.row_mean.mean()
        return -0.5 * (DA - self.row_mean @ self.weights - shift[:, None] * colsum)


@dataclass
class TriangulationMap:
    """Geodesic, landmark and blockwise IKD's out-of-sample map (module docstring)."""

    training: Any          # (T, N) raw rows (the neighbour search of geodesic maps)
    similarity: str
    inverse: InverseKernel
    variance: float | None  # the user's sigma^2 (edge weights as the fit's graph)
    n_neighbors: int
    threshold: float | None
    landmark_rows: np.ndarray  # (L, N) normalised landmark rows
    paths: Any   # (L, T) float32 path lengths (ndarray or zarr.Array); None: direct similarities
    pinv: np.ndarray           # (M, L)
    sq_mean: np.ndarray        # (L,)
    centre: np.ndarray         # (M,)

    def distances(self, Xq: np.ndarray, client: Any = None, local: bool = True) -> np.ndarray:
        """IKD distances (Q, L) of new rows to the landmarks."""

        Q = normalise_rows(Xq, self.similarity, np.float64)
        S = Q @ self.landmark_rows.T
        if self.paths is None:
            return self.inverse(S)
        unit = _unit(Q)
        train = self.training
        if local and isinstance(train, da.Array):
            (train,) = dask.compute(train, scheduler="sync")
        Tu = (da.map_blocks(_unit_normalised, train, self.similarity, dtype=np.float64)
              if isinstance(train, da.Array)
              else _unit_normalised(train, self.similarity))
        if local:
            dist, idx = kneighbors_local(np.asarray(Tu), self.n_neighbors, unit)
        else:
            dist, idx = kneighbors(Tu, self.n_neighbors, query=unit, client=client)
        k = 1.0 - 0.5 * dist**2  # correlation of unit rows
        if self.similarity != "correlation" or self.variance is not None:
            norms = _norms(train, self.similarity)
            k = k * np.linalg.norm(Q, axis=1)[:, None] * norms[idx] / self.inverse.sigma2
        w = edge_weight(k, self.inverse.floor, self.inverse.ceil)
        U, local_idx = np.unique(idx, return_inverse=True)
        g = geodesics_via_neighbors(w, local_idx.reshape(idx.shape),
                                    self.paths[:, U].T.astype(np.float64))
        kernel = GeodesicKernel(self.inverse, self.threshold)
        return kernel(g, None if self.threshold is None else S * self.inverse.sigma2)

    def __call__(self, Xq: np.ndarray, client: Any = None, local: bool = True) -> np.ndarray:
        D = self.distances(Xq, client, local)
        return triangulate(self.pinv, D.T, self.sq_mean) + self.centre


@dataclass
class LocalTriangulationMap:
    """Blockwise IKD's out-of-sample map: triangulation from the ``n_local`` training rows
    most similar to each new row (module docstring)."""

    training: Any          # (T, N) raw rows
    similarity: str
    inverse: InverseKernel
    embedding: np.ndarray  # (T, M)
    n_local: int

    def __call__(self, Xq: np.ndarray, client: Any = None, local: bool = True) -> np.ndarray:
        Q = normalise_rows(Xq, self.similarity, np.float64)
        train = self.training
        if isinstance(train, da.Array):
            (train,) = dask.compute(train, scheduler="sync" if local else None)
        Xn = normalise_rows(np.asarray(train), self.similarity, np.float64)
        out = np.empty((len(Q), self.embedding.shape[1]))
        step = max(1, CHUNK_BYTES // (8 * len(Xn)))
        for a in range(0, len(Q), step):
            S = Q[a:a + step] @ Xn.T
            near = np.argpartition(-S, self.n_local - 1, axis=1)[:, :self.n_local]
            for i, idx in enumerate(near):
                D_KK = self.inverse(Xn[idx] @ Xn[idx].T, diagonal=True)
                d = self.inverse(S[i, idx][None, :])[0]
                Y = self.embedding[idx]
                c = Y.mean(axis=0)
                out[a + i] = triangulate(np.linalg.pinv(Y - c), d[:, None],
                                         D_KK.mean(axis=1))[0] + c
        return out


def _unit(X: np.ndarray) -> np.ndarray:
    return X / np.linalg.norm(X, axis=1, keepdims=True)


def _unit_normalised(block: np.ndarray, similarity: str) -> np.ndarray:
    return _unit(normalise_rows(block, similarity, np.float64))


def _row_norms(block: np.ndarray, similarity: str) -> np.ndarray:
    return np.linalg.norm(normalise_rows(block, similarity, np.float64), axis=1)


def _norms(train: Any, similarity: str) -> np.ndarray:
    if isinstance(train, da.Array):
        rows = da.map_blocks(_row_norms, train, similarity, drop_axis=1, dtype=np.float64)
        return np.asarray(rows.compute(scheduler="sync"))
    return _row_norms(train, similarity)


# --------------------------------------------------------------------------------------------
# built by the solvers


def nystrom_map(cfg: IKDConfig, inp: InputData, Xn: Any, sigma2: float, embedding: np.ndarray,
                eigenvalues: np.ndarray, r: int | None, d_ref: np.ndarray | None,
                row_mean: np.ndarray) -> NystromMap:
    """Full IKD's map from its fit: the eigenpairs, the reference row or the row means."""
    lam = np.asarray(eigenvalues, dtype=np.float64)
    inv_lam = np.where(lam > 0, 1.0 / np.where(lam > 0, lam, 1.0), 0.0)
    xr = None
    if r is not None:
        (xr,) = compute(Xn[r], client=cfg.client)
        xr = np.asarray(xr, dtype=np.float64)
    return NystromMap(training_rows(inp), cfg.similarity, cfg.inverse_kernel(sigma2),
                      embedding * inv_lam, xr, d_ref, np.asarray(row_mean, np.float64))


def local_map(cfg: IKDConfig, inp: InputData, sigma2: float,
              embedding: np.ndarray) -> LocalTriangulationMap:
    """Blockwise IKD's map: local triangulation (it trusts only strong similarities)."""
    return LocalTriangulationMap(training_rows(inp), cfg.similarity,
                                 cfg.inverse_kernel(sigma2), embedding,
                                 min(len(embedding), LOCAL_ROWS * (cfg.n_components + 1)))


def n_transform_landmarks(cfg: IKDConfig, T: int) -> int:
    """L of geodesic IKD's triangulation: ``min(T, 256)`` (at least M + 1)."""
    return min(T, max(TRANSFORM_LANDMARKS, cfg.n_components + 1))


def pick_landmarks(cfg: IKDConfig, inp: InputData) -> np.ndarray:
    """The triangulation's landmarks for geodesic IKD: max-min over the unit rows
    (correlation distance), as landmark IKD picks its own, ``min(T, 256)`` of them."""
    L = n_transform_landmarks(cfg, int(inp.data.shape[0]))
    unit = da.map_blocks(_unit_normalised, inp.data, cfg.similarity, dtype=np.float64)
    return select_landmarks(unit, L, method="maxmin", random_state=cfg.random_state,
                            client=active_client(cfg.client))


def _paths_over_budget(L: int, T: int) -> bool:
    """Whether (L, T) float32 landmark path lengths exceed the in-memory tile budget (then
    the fit has no map and ``transform`` says why)."""
    nbytes = 4 * L * T
    if not over_memory_budget(nbytes):
        return False
    logger.warning("IKD.transform unavailable: the %d x %d landmark path lengths (%.1f GB) "
                   "exceed the in-memory budget (dr_dask.tiles.memory-bytes)", L, T, nbytes / 1e9)
    return True


def triangulation_map(cfg: IKDConfig, inp: InputData, sigma2: float, embedding: np.ndarray,
                      landmarks: np.ndarray, paths: Any,
                      landmark_paths: np.ndarray | None = None, *,
                      pinv: np.ndarray | None = None) -> TriangulationMap | None:
    """The triangulation map from the fit's landmarks and, for a graph map, their (L, T)
    path lengths: in memory (None when they exceed the tile budget), or a Zarr array the map
    reads the columns it needs from. ``landmark_paths``, the (L, L) columns of the landmarks
    when the caller has them: else read from ``paths`` (from a store, scattered columns read
    every chunk: 4 GB at T=10^6). ``pinv``: landmark IKD's own triangulation (M, L), which
    made ``embedding`` (no centre added); else the pseudo-inverse of the landmarks' centred
    coordinates in ``embedding``."""
    if isinstance(paths, np.ndarray) and _paths_over_budget(*paths.shape):
        return None

    order = np.argsort(landmarks)
    (XL,) = compute(inp.data[landmarks[order]], client=cfg.client)
    XL = normalise_rows(np.asarray(XL)[np.argsort(order)], cfg.similarity, np.float64)
    inverse = cfg.inverse_kernel(sigma2)
    threshold = cfg.threshold if cfg.geodesic_rule == "threshold" else None
    S_LL = XL @ XL.T
    if paths is None:
        D_LL = inverse(S_LL, diagonal=True)
    else:
        if landmark_paths is None:
            landmark_paths = paths[:, landmarks]
        D_LL = GeodesicKernel(inverse, threshold)(landmark_paths, S_LL)
        D_LL = (D_LL + D_LL.T) / 2
        np.fill_diagonal(D_LL, 0.0)
    if pinv is None:
        Y = embedding[landmarks]
        centre = Y.mean(axis=0)
        pinv = np.linalg.pinv(Y - centre)
    else:
        centre = np.zeros(embedding.shape[1])
    return TriangulationMap(
        training_rows(inp), cfg.similarity, inverse, cfg.variance, cfg.n_neighbors, threshold,
        XL, paths, pinv, D_LL.mean(axis=1), centre)


class DeferredTriangulation:
    """Geodesic IKD's triangulation map, built when first asked for: the fit keeps what the
    build needs, so that the map's max-min landmarks and their Dijkstra rows over the graph
    are paid by the first ``transform``, not by every ``fit_transform``.

    :meth:`get` makes exactly the map an eager build at the end of the fit would (the same
    landmarks from the same random state, the same path lengths), keeps it and drops the
    graph. The estimator holds this object itself, so a ``transform`` leaves the estimator's
    ``__dict__`` as it was (scikit-learn's check). Picklable: it holds no client (the build
    runs on the caller's), and the graph (O(k T)) is smaller than the (L, T) path lengths
    the map keeps.

    Parameters
    ----------
    cfg : IKDConfig
        The fit's configuration.
    inp : InputData
        The training rows.
    sigma2 : float
    embedding : ndarray of shape (T, M)
    graph : csr_matrix of shape (T, T)
        The fit's connected neighbour graph.
    """

    def __init__(self, cfg: IKDConfig, inp: InputData, sigma2: float, embedding: np.ndarray,
                 graph: sp.csr_matrix):
        # a RandomState is copied as the fit leaves it: the landmarks are those an eager build
        # would draw, whatever the caller does with that RandomState before transforming
        rs = cfg.random_state
        rs = copy.deepcopy(rs) if isinstance(rs, np.random.RandomState) else rs
        self.cfg = replace(cfg, client=None, random_state=rs)
        self.inp, self.sigma2, self.embedding = inp, sigma2, embedding
        self.graph: sp.csr_matrix | None = graph
        self.built: TriangulationMap | None = None

    def get(self, client: Any = None) -> TriangulationMap | None:
        """The map, built on ``client`` (else dask's threads) the first time; None while its
        path lengths exceed the in-memory budget (checked before any work, at the budget in
        force now: a larger one builds it)."""
        if self.built is not None or self.graph is None:
            return self.built
        T = self.graph.shape[0]
        if _paths_over_budget(n_transform_landmarks(self.cfg, T), T):
            return None
        cfg = replace(self.cfg, client=client)
        landmarks = pick_landmarks(cfg, self.inp)
        paths = GeodesicRows.compute(self.graph, landmarks, client=client,
                                     dtype=np.float32).gather()
        self.built = triangulation_map(cfg, self.inp, self.sigma2, self.embedding, landmarks,
                                       paths)
        self.graph = None  # the map has what it needed
        return self.built
