"""The one exact k-nearest-neighbour search of the package, blockwise and distributed.

The data are split in row blocks. One task finds, for a block of query rows, the nearest rows of
one data block through a :class:`NeighbourIndex`: a KD-tree (scikit-learn's) up to
``dr_dask.knn.kd-tree-max-dim`` features, above that brute force, cache-sized float32 GEMM tiles
folded into running top-k lists by a compiled kernel, certified against float64 (see the class); a
merge task per query block keeps the k best candidates over all data blocks by a partial sort.
Distances of the kept pairs are recomputed directly (``||q - x||``) so that they do not carry
the rounding and cancellation error of the GEMM expansion. An index built once serves the
repeated searches of new points (GP-Isomap's mapping).
"""

from __future__ import annotations

import itertools
import logging
import math
import warnings
from dataclasses import dataclass, field
from numbers import Integral, Real
from typing import Any, NamedTuple

import dask
import dask.array as da
import numpy as np
import scipy.sparse as sp

from dr_dask.graph import knn_backends
from dr_dask.graph.diagnostics import LowRecallWarning
from dr_dask.graph.knn_tol import DEFAULT_KNN_TOL, distance_error
from dr_dask.graph.topk import EXTRA, brute_knn, check_finite, rerank
from dr_dask.io.validation import Interval, Options, check_array_like, positive
from dr_dask.runtime import config
from dr_dask.runtime.cluster import active_client, compute, share

logger = logging.getLogger(__name__)

#: ``kneighbors``' ``algorithm`` and the estimators' ``knn`` modes: the backends' table
#: (:mod:`dr_dask.graph.knn_backends`).
ALGORITHMS = knn_backends.ALGORITHMS
KNN_MODES = knn_backends.MODES
#: The ``knn``, ``n_probe`` and ``knn_tol`` parameters of every estimator that builds a
#: neighbour graph (merged into its ``_parameter_constraints``).
KNN_CONSTRAINTS: dict = {"knn": [Options(set(KNN_MODES))], "n_probe": [positive(Integral), None],
                         # 0 (the exact search) up to, not including, 1
                         "knn_tol": [Interval(Real, 0, 1, closed="left")]}
#: Rows whose neighbours an approximate search checks against an exact search of them.
RECALL_ROWS = 200
#: Below this estimated recall a search with no distance error estimated warns
#: (:class:`dr_dask.graph.LowRecallWarning`).
RECALL_WARN = 0.9



@dataclass(frozen=True)
class Metric:
    """The distance of a neighbour search, in scikit-learn's vocabulary.

    The package's own searches (KD-trees, float32 GEMM tiles, cells, IVF) measure Euclidean
    distances; any other metric is searched exactly, block by block, by scikit-learn's
    ``NearestNeighbors`` with these parameters (which accepts every metric it knows and
    callables). ``algorithm`` is its ``algorithm`` there; the Euclidean searches are exact
    whatever it says.
    """

    metric: Any = "euclidean"
    p: float = 2
    params: dict | None = field(default=None, hash=False, compare=False)
    algorithm: str = "auto"

    @property
    def euclidean(self) -> bool:
        """True when the distance is the Euclidean one the package's searches compute."""
        if callable(self.metric) or self.params:
            return False
        return self.metric in ("euclidean", "l2") or (self.metric == "minkowski"
                                                      and self.p == 2)

    @property
    def name(self) -> str:
        """The metric as a message names it."""
        if callable(self.metric):
            return f"callable {getattr(self.metric, '__name__', type(self.metric).__name__)}"
        return f"{self.metric!r}" + (f" (p={self.p})" if self.metric == "minkowski" else "")

    def nearest(self, **kwargs: Any) -> Any:
        """An unfitted scikit-learn ``NearestNeighbors`` measuring this distance."""
        from sklearn.neighbors import NearestNeighbors  # lazy: not on workers (__init__)

        return NearestNeighbors(metric=self.metric, p=self.p, metric_params=self.params,
                                algorithm=self.algorithm, **kwargs)

    def refuse(self, search: str) -> None:
        """Refuse a search that measures Euclidean distances only, naming the metric."""
        if not self.euclidean:
            raise ValueError(f"metric={self.name}: the {search} neighbour search measures "
                             "Euclidean distances only; use knn='exact' (an exact search in "
                             "that metric)")


def count_rows(X: Any) -> int:
    return int(X.shape[0])


def dense_block(block: Any) -> np.ndarray:
    """A row block as a dense float64 array (sparse input is searched block by block)."""
    if sp.issparse(block):
        block = block.toarray()
    return np.ascontiguousarray(block, dtype=np.float64)


def check_2d(X: Any, name: str) -> Any:
    if X is None:
        return None
    if not isinstance(X, da.Array):
        # the values are checked block by block, where the rows can be named (topk.check_finite)
        X = check_array_like(X, name, ensure_all_finite=False, accept_sparse="csr")
        return X.tocsr() if sp.issparse(X) else X
    if X.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n_samples, n_features), got shape {X.shape}")
    if X.shape[0] == 0:
        raise ValueError(f"{name} has no rows")
    return X


def default_block(n: int) -> int:
    # four blocks give both workers work while each KD-tree is still large enough to be efficient
    return max(5000, math.ceil(n / 4))


def row_blocks(X: Any, block_size: int, client: Any) -> tuple[list[int], list[Any]]:
    """Row offsets and blocks of X: dask delayed blocks, shared futures or in-memory arrays."""
    if isinstance(X, da.Array):
        X = X.astype(np.float64).rechunk((block_size, -1))
        offsets = [0, *np.cumsum(X.chunks[0]).tolist()]
        return offsets, list(X.to_delayed().ravel())
    n = X.shape[0]
    offsets = [*range(0, n, block_size), n]
    blocks = [X[s:e] for s, e in itertools.pairwise(offsets)]
    if client is not None:
        # recomputable futures (not scattered data): a block lost with its worker is sent again
        blocks = [share(b, client) for b in blocks]
    return offsets, blocks


class NeighbourIndex:
    """Data rows prepared once for exact k-NN searches of new points (the mapping hot path).

    Up to ``dr_dask.knn.kd-tree-max-dim`` features a KD-tree (scikit-learn's), built once. Above,
    brute force in float32: the rows are centred on their mean and rounded to float32 once; float32
    GEMM tiles select ``k + EXTRA`` candidates per query row, which are re-ranked by float64
    distances to the original rows. A rounding bound then certifies each row: every
    non-candidate is provably farther than the k-th neighbour found. Rows it cannot certify
    (near-ties within float32 error) are searched again in float64. The result is the
    float64 brute-force result at half the GEMM cost.

    Parameters
    ----------
    data : ndarray of shape (n, N)
        Finite rows (not validated here: see :func:`kneighbors_local`).
    """

    def __init__(self, data: np.ndarray):
        self.data = np.ascontiguousarray(data, dtype=np.float64)
        self._tree = None
        if self.data.shape[1] <= config.get("knn.kd-tree-max-dim"):
            from sklearn.neighbors import NearestNeighbors  # lazy: not on workers (__init__)

            self._tree = NearestNeighbors().fit(self.data)
            return
        self._mean = self.data.mean(axis=0)
        centred = self.data - self._mean
        self._data32 = centred.astype(np.float32)
        self._sq = np.einsum("ij,ij->i", self._data32, self._data32, dtype=np.float64)
        self._norm = float(np.sqrt(np.einsum("ij,ij->i", centred, centred).max()))
        self._norm32 = float(np.sqrt(self._sq.max()))

    @property
    def n_rows(self) -> int:
        return self.data.shape[0]

    def kneighbors(self, query: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Distances and indices (Q, min(k, n)), ordered by (distance, index).

        ``query``: (Q, N) finite float64 rows (validated by the caller).
        """
        query = np.ascontiguousarray(query, dtype=np.float64)
        k = min(int(k), self.n_rows)
        if not len(query):
            return np.empty((0, k)), np.empty((0, k), dtype=np.int64)
        if self._tree is not None:
            _, idx = self._tree.kneighbors(query, n_neighbors=k)
            return rerank(query, self.data, idx, k)
        kk = min(k + EXTRA, self.n_rows)
        centred = query - self._mean
        keys, idx = brute_knn(centred.astype(np.float32), self._data32, kk, self._sq)
        dist, idx = rerank(query, self.data, idx, k)
        if kk < self.n_rows:
            redo = ~self._certified(centred, keys[:, -1], dist[:, -1])
            if redo.any():
                logger.debug("float32 kNN: %d of %d rows re-searched in float64",
                             redo.sum(), len(redo))
                q = query[redo]
                _, i64 = brute_knn(q, self.data, kk)
                dist[redo], idx[redo] = rerank(q, self.data, i64, k)
        return dist, idx

    def _certified(self, centred: np.ndarray, last_key: np.ndarray,
                   kth: np.ndarray) -> np.ndarray:
        """Rows whose every non-candidate is provably farther than their k-th neighbour.

        A non-candidate's float32 key is at least the last candidate's. Standard rounding
        bounds (unit roundoff u = 2^-24): the GEMM errs by at most ``N u / (1 - N u)``
        ``||q|| ||x||`` per inner product, and rounding the centred rows to float32 moves a
        distance by at most ``u (||q|| + ||x||)``.
        """
        u = float(np.finfo(np.float32).eps) / 2
        nu = centred.shape[1] * u
        qn = np.sqrt(np.einsum("ij,ij->i", centred, centred))
        gemm_err = 2 * nu / (1 - nu) * (qn * (1 + u)) * self._norm32
        lower32 = np.sqrt(np.maximum(last_key + (qn * (1 - u)) ** 2 - gemm_err, 0.0))
        lower = lower32 - u * (qn + self._norm)
        # the margin covers the float64 rounding of the re-ranked distances
        return lower > kth * (1 + 4 * centred.shape[1] * np.finfo(np.float64).eps)


def _block_knn(
    query: np.ndarray, data: np.ndarray, k: int, q0: int, d0: int, metric: Metric | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """k nearest rows of one data block for one query block, with global data indices
    (Euclidean, or in ``metric`` by scikit-learn's search)."""
    query, data = dense_block(query), dense_block(data)
    check_finite(query, q0, "query")
    check_finite(data, d0, "X")
    if metric is not None and not metric.euclidean:
        k = min(int(k), data.shape[0])
        dist, idx = metric.nearest(n_neighbors=k).fit(data).kneighbors(query)
        return dist, idx + d0
    dist, idx = NeighbourIndex(data).kneighbors(query, k)
    return dist, idx + d0


def _merge(k: int, own: np.ndarray | None, *parts: tuple) -> tuple[np.ndarray, np.ndarray]:
    """Keep the k best of all blocks' candidates, ordered by (distance, index).

    ``own`` (Q,): each query row's own index, excluded from its neighbours (None: keep all).
    """
    dist = np.hstack([p[0] for p in parts])
    idx = np.hstack([p[1] for p in parts])
    if own is not None:
        dist = np.where(idx == np.asarray(own)[:, None], np.inf, dist)
    order = np.lexsort((idx, dist), axis=-1)[:, :k]
    return np.take_along_axis(dist, order, 1), np.take_along_axis(idx, order, 1)


def kneighbors(
    X: Any,
    n_neighbors: int,
    *,
    query: Any = None,
    client: Any = None,
    block_size: int | None = None,
    algorithm: str = "auto",
    n_probe: int | None = None,
    n_lists: int | None = None,
    scratch: Any = None,
    random_state: Any = 0,
    metric: Metric | None = None,
    knn_tol: float = DEFAULT_KNN_TOL,
) -> tuple[np.ndarray, np.ndarray]:
    """k nearest neighbours (Euclidean, or ``metric``), blockwise over rows, distributed on
    ``client``.

    Parameters
    ----------
    X : ndarray, CSR matrix or dask array of shape (T, N)
        Data points (dask arrays are re-chunked to full rows; sparse rows are made dense one
        block at a time).
    n_neighbors : int
        k. Without ``query`` a point is not its own neighbour, so k < T; with ``query`` k <= T.
    query : ndarray or dask array of shape (Q, N), optional
        Query points; default X itself (then each row's own index is excluded, while exact
        duplicates of it are kept as neighbours at distance 0).
    client : distributed.Client, optional
        Resolved by :func:`dr_dask.runtime.cluster.active_client`; None means dask's threads.
    block_size : int, optional
        Rows per block of the exact search (default ``max(5000, ceil(T / 4))``; with
        ``query``, X's blocks at most ``dr_dask.knn.query-block-rows``).
    algorithm : {"auto", "exact", "cells", "ivf"}
        ``"exact"``: every query block against every data block (KD-trees up to
        ``dr_dask.knn.kd-tree-max-dim`` features, else brute-force GEMM): T^2 N work above that
        dimension.
        ``"cells"`` (only without ``query``): the pruned float32 cell search of
        :mod:`dr_dask.graph._knn_cells`, exact for the centred rows rounded to float32, with
        the float32 copy of X held by every worker; far less work on data near a manifold.
        ``"ivf"`` (only without ``query``): the partitioned approximate search of
        :mod:`dr_dask.graph._knn_ivf` (inverted lists in Zarr at ``scratch``; no process holds
        all rows), about ``T n_probe T / n_lists`` row pairs.
        ``"auto"``: cells without ``query`` from ``dr_dask.knn.cells-min-rows`` rows and
        above ``dr_dask.knn.kd-tree-max-dim`` features, else exact (never the approximate
        search).
    n_probe, n_lists : int, optional
        ``"ivf"``: lists each row searches (``>= n_lists``: all, the exact result) and lists
        of the coarse quantizer (default about sqrt(T) / 2); see
        :func:`dr_dask.graph._knn_ivf.ivf_kneighbors`.
    scratch : str or Location, optional
        ``"ivf"``: where the lists are written, reachable by every worker (default a local
        temporary directory); deleted afterwards.
    random_state : int, RandomState or None
        ``"ivf"``: seeds the quantizer's training sample and k-means.
    metric : Metric, optional
        The distance (default Euclidean). Any other is searched exactly in that metric
        (``"auto"`` and ``"exact"``); ``"cells"`` and ``"ivf"`` refuse it, naming it.
    knn_tol : float
        ``"ivf"`` with ``n_probe=None``: the adaptive probe's target, the mean relative error
        of the k-th neighbour's distance (:mod:`dr_dask.graph.knn_tol`); 0 probes every list.

    Returns
    -------
    distances : ndarray of shape (Q, k)
        Ascending; ties are broken by the smaller index.
    indices : ndarray of shape (Q, k)
        Row indices into X.
    """
    chosen = None if algorithm == "auto" else knn_backends.backend(algorithm)
    X = check_2d(X, "X")
    exclude_self = query is None
    query = X if exclude_self else check_2d(query, "query")
    if query.shape[1] != X.shape[1]:
        raise ValueError(f"query has {query.shape[1]} features but X has {X.shape[1]}")
    n = count_rows(X)
    k = int(n_neighbors)
    k_max = n - 1 if exclude_self else n
    if not 1 <= k <= k_max:
        raise ValueError(
            f"n_neighbors={n_neighbors} must be in [1, {k_max}] for X with {n} rows"
            + (" (a point is not its own neighbour)" if exclude_self else "")
        )
    if chosen is not None and not chosen.takes_query and not exclude_self:
        raise ValueError(f"algorithm={algorithm!r} searches X among itself: give no query "
                         "(use algorithm='exact' for new points)")
    other = metric is not None and not metric.euclidean
    if other and chosen is not None and not chosen.takes_metric:
        assert metric is not None  # other implies it
        metric.refuse(algorithm)
    client = active_client(client)
    X, staged = _rows_for_workers(X, client, exclude_self)
    if chosen is None:  # auto: the cell search where it pays, else the exact one
        chosen = knn_backends.backend(
            "cells" if (exclude_self and not other and not sp.issparse(X)
                        and n >= config.get("knn.cells-min-rows")
                        and X.shape[1] > config.get("knn.kd-tree-max-dim")) else "exact")
    given = {"query": None if exclude_self else query, "block_size": block_size,
             "metric": metric if other else None, "n_lists": n_lists, "n_probe": n_probe,
             "scratch": scratch, "random_state": random_state, "knn_tol": knn_tol,
             "in_memory": None if staged is None else staged.values}
    try:
        return chosen.load()(X, k, exclude_self, client=client,
                             **{key: v for key, v in given.items() if key in chosen.options})
    finally:
        if staged is not None:
            staged.discard()


def exact_kneighbors(X: Any, k: int, exclude_self: bool, *, client: Any, query: Any = None,
                     block_size: int | None = None,
                     metric: Metric | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The exact search of :func:`kneighbors` (its arguments checked there): every block of
    ``query`` (X itself when None, ``exclude_self``) against every block of X, one task a
    pair, a merge task per query block; ``metric``: a non-Euclidean distance, else None."""
    n = count_rows(X)
    if exclude_self:
        d_off, d_blocks = row_blocks(X, int(block_size or default_block(n)), client)
        q_off, q_blocks = d_off, d_blocks
    else:
        d_off, d_blocks = row_blocks(X, int(block_size or min(
            default_block(n), config.get("knn.query-block-rows"))), client)
        q_off, q_blocks = row_blocks(query, int(block_size or default_block(count_rows(query))),
                                      client)
    kk = k + exclude_self
    block_knn = dask.delayed(_block_knn, pure=True)
    merge = dask.delayed(_merge, pure=True)
    merged = []
    for qi, qb in enumerate(q_blocks):
        parts = [block_knn(qb, db, kk, q_off[qi], d_off[di], metric)
                 for di, db in enumerate(d_blocks)]
        own = np.arange(q_off[qi], q_off[qi + 1]) if exclude_self else None
        merged.append(merge(k, own, *parts))
    logger.debug("kneighbors: %d query x %d data blocks, k=%d", len(q_blocks), len(d_blocks), k)
    results = compute(*merged, client=client)
    return np.vstack([r[0] for r in results]), np.vstack([r[1] for r in results])


def _rows_for_workers(X: Any, client: Any, among_itself: bool) -> tuple[Any, Any]:
    """``X`` and None, or, for the search of a NumPy ``X`` among itself on a cluster, X
    staged where the workers read it, as the estimators' inputs are
    (:func:`dr_dask.io.inputs.rows_for_workers`), rather than sent in the search's task
    graph, and the staged input, whose store the search discards when it ends."""
    from dr_dask.io.inputs import memory_input

    if client is None or not among_itself or not isinstance(X, np.ndarray):
        return X, None
    staged = memory_input(X, client)
    return (staged.data, staged) if staged.staged is not None else (X, None)


def knn_algorithm(knn: str, n_rows: int, n_features: int,
                  metric: Metric | None = None) -> str:
    """The :func:`kneighbors` algorithm of an estimator's ``knn`` mode (see ``KNN_MODES``).

    The partitioned search measures Euclidean distances only: another ``metric`` with
    ``knn="ivf"``, or with ``"auto"`` where it would take the partitioned search (an exact
    search in the metric at that size would cost T^2 distances), is refused by name.
    """
    chosen = knn_backends.mode_backend(knn)
    if chosen is None and n_rows >= config.get("knn.ivf-min-rows") \
            and n_features > config.get("knn.kd-tree-max-dim"):
        chosen = knn_backends.backend("ivf")
    if chosen is None:
        return "auto"
    if metric is not None and not chosen.takes_metric:
        metric.refuse(f"{chosen.name} (knn={knn!r}, {n_rows} rows)")
    return chosen.mode_algorithm or chosen.name


def estimate_recall(X: Any, indices: np.ndarray, *, n_rows: int = RECALL_ROWS,
                    random_state: Any = 0, client: Any = None) -> float:
    """Share of the true k nearest neighbours found, on a seeded sample of rows.

    ``indices`` (T, k) are the neighbours an (approximate) search found for every row of X
    (without themselves); the sampled rows' neighbours are searched exactly
    (``algorithm="exact"``: n_rows x T distances, rows read block by block) and compared as
    sets. Exact duplicates make the comparison ambiguous only at equal distances.
    """
    return estimate_quality(X, indices, n_rows=n_rows, random_state=random_state,
                            client=client).recall


def estimate_quality(X: Any, indices: np.ndarray, *, n_rows: int = RECALL_ROWS,
                     random_state: Any = 0, client: Any = None) -> Quality:
    """:func:`estimate_recall`'s rows, their recall and distance error
    (:func:`sampled_quality`)."""
    rows = recall_rows(count_rows(X), n_rows, random_state)
    return sampled_quality(X, rows, indices[rows], client=client)


def recall_rows(T: int, n_rows: int, random_state: Any = 0) -> np.ndarray:
    """(min(n_rows, T),) sorted rows on which a search's recall is measured, seeded by the
    search's own ``random_state`` but not its first draws: with that stream itself the sample
    began with the quantizer's training rows (:mod:`dr_dask.graph._knn_ivf` draws them
    first), and a training row sits nearer its own centroid (it pulled it by a 64th of its
    noise), so its neighbours in other lists are found less often: on the sinusoid at
    T = 10^6, 0.955 of them against 0.979 over all rows, and the estimate understated."""
    from sklearn.utils import check_random_state  # lazy: not on workers (__init__)

    rng = np.random.RandomState(check_random_state(random_state).randint(2**31 - 1))
    return np.sort(rng.choice(T, min(int(n_rows), T), replace=False))


class Quality(NamedTuple):
    """A search's quality estimated on sampled rows (:func:`sampled_quality`)."""

    recall: float
    distance_error: float
    distance_error_se: float


def sampled_quality(X: Any, rows: np.ndarray, found: np.ndarray, *,
                    client: Any = None) -> Quality:
    """The recall and the distance error of a search on ``rows`` (S,), whose neighbours it
    found as ``found`` (S, k) (without themselves), from one exact search of the rows
    (S x T distances, X read block by block).

    Returns
    -------
    recall : float
        Share of the true k nearest neighbours among the found ones (compared as sets).
    distance_error, distance_error_se : float
        The mean relative excess of the k-th found neighbour's distance over the exact k-th
        distance, both in float64, and its standard error over the rows
        (:func:`dr_dask.graph.knn_tol.distance_error`).
    """
    X = check_2d(X, "X")
    T, k = count_rows(X), found.shape[1]
    rows = np.asarray(rows)
    found = np.asarray(found)
    # the sampled rows and the rows found for them, read in one pass (-1: none found)
    wanted, at = np.unique(np.concatenate([rows, found[found >= 0]]), return_inverse=True)
    got = X[wanted]
    if isinstance(got, da.Array):
        (got,) = compute(got, client=client)
    got = dense_block(got)
    Xq = got[at[:len(rows)]]
    exact_d, exact = kneighbors(X, min(k + 1, T), query=Xq, client=client, algorithm="exact")
    hits = [len(set(e[e != r][:k].tolist()) & set(i.tolist()))
            for r, e, i in zip(rows, exact, found)]
    recall = float(np.sum(hits) / (k * len(rows))) if len(rows) else 1.0
    # the exact k-th distance without the row itself (a duplicate of it counts, at 0)
    own = exact == rows[:, None]
    kth = np.array([d[~o][:k][-1] for d, o in zip(exact_d, own)] or np.empty(0))
    found_rows = np.full((*found.shape, X.shape[1]), np.inf)
    ok = found >= 0
    found_rows[ok] = got[at[len(rows):]]
    return Quality(recall, *distance_error(Xq, found_rows, kth))


def check_recall(recall: float, what: str, distance_error: float | None = None,
                 knn_tol: float = DEFAULT_KNN_TOL, distance_error_se: float = 0.0) -> None:
    """Warn (and log) when an approximate search's neighbours are estimated too far: a
    distance error (:mod:`dr_dask.graph.knn_tol`) above ``knn_tol`` by more than twice its
    standard error (the adaptive probe holds it below on its calibration rows, and the
    estimate's rows are another sample of about as many: within that, the two samples differ;
    beyond it, the probe's cap, or a fixed ``n_probe``, stopped the search short), or,
    without a distance error, a recall below ``RECALL_WARN``."""
    if distance_error is None:
        low = recall < RECALL_WARN
        found = f"found an estimated {recall:.3f} of the true neighbours (below {RECALL_WARN})"
    else:
        low = distance_error - 2 * distance_error_se > knn_tol
        found = (f"found neighbours an estimated {distance_error:.2%} (± "
                 f"{distance_error_se:.2%}) farther than the true ones at the k-th (above "
                 f"knn_tol={knn_tol:g}; recall {recall:.3f})")
    if low:
        msg = (f"{what}: the approximate neighbour search {found}; leave n_probe unset (the "
               "adaptive probe) or raise it, lower knn_tol, or use knn='exact'")
        logger.warning(msg)
        warnings.warn(msg, LowRecallWarning, stacklevel=3)


def search_neighbours(X: Any, n_neighbors: int, *, knn: str = "auto",
                      n_probe: int | None = None, client: Any = None, scratch: Any = None,
                      random_state: Any = None, metric: Metric | None = None,
                      knn_tol: float = DEFAULT_KNN_TOL,
                      ) -> tuple[np.ndarray, np.ndarray, float, float]:
    """An estimator's neighbour search: :func:`kneighbors` of X among itself in the mode
    ``knn`` (see ``KNN_MODES``), with its recall and distance error. One search, run once.

    Returns
    -------
    distances, indices : ndarrays of shape (T, k)
    recall, distance_error : float
        1.0 and 0.0 for the exact searches; for the IVF search the recall and the mean
        relative error of the k-th neighbour's distance (:mod:`dr_dask.graph.knn_tol`),
        estimated on ``RECALL_ROWS`` seeded rows (:func:`estimate_quality`), logged, with a
        :class:`~dr_dask.graph.LowRecallWarning` when the neighbours are too far
        (:func:`check_recall`). ``knn="auto"`` takes the IVF search with its adaptive probe
        (which holds the distance error within ``knn_tol`` as T grows) and keeps it: an exact
        search again would hold every row on every worker and cost T^2.
    """
    algorithm = knn_algorithm(knn, count_rows(X), int(X.shape[1]), metric)
    seed = search_seed(random_state)
    dist, idx = kneighbors(X, n_neighbors, client=client, algorithm=algorithm,
                           n_probe=n_probe, scratch=scratch, random_state=seed, metric=metric,
                           knn_tol=knn_tol)
    if algorithm == "auto" or not knn_backends.backend(algorithm).approximate:
        logger.info("knn=%r: exact search of %d rows", knn, count_rows(X))
        return dist, idx, 1.0, 0.0
    recall, error, error_se = estimate_quality(X, idx, random_state=seed, client=client)
    report_recall(knn, n_probe, recall, error, knn_tol, error_se)
    return dist, idx, recall, error


def search_seed(random_state: Any) -> int:
    """One seed for an approximate search's quantizer and its recall sample, drawn from the
    estimator's ``random_state``."""
    from sklearn.utils import check_random_state  # lazy: not on workers (__init__)

    return int(check_random_state(random_state).randint(2**31 - 1))


def report_recall(knn: str, n_probe: int | None, recall: float,
                  distance_error: float | None = None, knn_tol: float = DEFAULT_KNN_TOL,
                  distance_error_se: float = 0.0) -> None:
    """Log the IVF search an estimator's mode ``knn`` took, its estimated recall and distance
    error, and warn when its neighbours are too far (:func:`check_recall`)."""
    logger.info("knn=%r: the IVF search (%s), estimated recall %.3f, k-th distance error %s",
                knn, f"adaptive probe, knn_tol={knn_tol:g}" if n_probe is None
                else f"n_probe={n_probe}", recall,
                "-" if distance_error is None else f"{distance_error:.3%}")
    check_recall(recall, "kNN", distance_error, knn_tol, distance_error_se)


def estimator_neighbours(X: Any, n_neighbors: int, search: dict | None, *, client: Any = None,
                         **exact: Any) -> tuple[np.ndarray, np.ndarray]:
    """:func:`search_neighbours` with an estimator's options ``search`` (``knn``, ``n_probe``,
    ``knn_tol``, ``scratch``, ``random_state``; the recall and the distance error are stored
    back under ``"recall"`` and ``"distance_error"``), or without them :func:`kneighbors`
    with the options ``exact``."""
    if search is None:
        return kneighbors(X, n_neighbors, client=client, **exact)
    options = {key: v for key, v in search.items() if key not in ("recall", "distance_error")}
    dist, idx, search["recall"], search["distance_error"] = search_neighbours(
        X, n_neighbors, client=client, **options)
    return dist, idx


def kneighbors_local(
    X: np.ndarray, n_neighbors: int, query: np.ndarray, metric: Metric | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Single-process :func:`kneighbors` of new points (for use inside worker tasks)."""
    query = check_2d(query, "query")
    if query.shape[1] != X.shape[1]:
        raise ValueError(f"query has {query.shape[1]} features but the data have {X.shape[1]}")
    return _block_knn(query, X, n_neighbors, 0, 0, metric)
