"""The coarse quantizer of the IVF search (:mod:`dr_dask.graph._knn_ivf`, step 1): k-means
centroids trained on a seeded sample of rows in the client, and the lists' numbering.

The centroids are seeded by k-means++ (Arthur & Vassilvitskii 2007), refined by Lloyd's
iterations, and numbered in reverse Cuthill-McKee order of their kNN graph, so that
consecutive lists are near each other: a task's lists probe overlapping lists, and the graph
stored in list order cuts into blocks with short boundaries. Nothing here runs on a worker.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import dask.array as da
import numpy as np

from dr_dask.graph.topk import brute_knn
from dr_dask.runtime.cluster import compute

logger = logging.getLogger(__name__)

#: Training rows per centroid (faiss warns below 39) and the sample's byte cap (float32).
TRAIN_PER_LIST = 64
TRAIN_BYTES = 128 << 20
#: Lloyd iterations of the coarse quantizer (faiss's default is 10 or 20).
KMEANS_ITER = 15


def default_n_lists(T: int) -> int:
    """Lists when not given: about sqrt(T) / 2, of about 2 sqrt(T) rows each.

    faiss's guidance of 4-16 sqrt(T) lists balances the quantizer against the scan for
    one-off queries; a self-join of T queries scans T n_probe T / n_lists rows, so fewer,
    larger lists cost little more to scan and lose less at the list boundaries, while the
    quantizer's k-means++ seeding (lists squared) and the assignment (T lists) shrink. Against
    sqrt(T) lists, measured: lists and search 48 s against 56 s at T = 10^6 on the noisy sinusoid,
    2.8 s against 3.9 s on augmented digits at 10^5, each at a lower distance error
    (docs/scaling.md, "Measurements behind the code's thresholds").
    """
    return max(1, round(math.sqrt(T) / 2))


def sample_rows(X: Any, n: int, rng: np.random.RandomState, client: Any) -> np.ndarray:
    """(n, N) float64 rows of X drawn without replacement by ``rng``, in row order: the
    quantizer's training sample."""
    rows = np.sort(rng.choice(X.shape[0], n, replace=False))
    S = X[rows]
    if isinstance(S, da.Array):
        (S,) = compute(S, client=client)
    return np.asarray(S, dtype=np.float64)


def train_quantizer(S: np.ndarray, n_lists: int, random_state: Any) -> np.ndarray:
    """(n_lists, N) k-means centroids of the centred sample rows ``S`` (Lloyd, seeded).

    In float32, seeds (:func:`kmeans_plusplus`) and Lloyd alike: it runs in the client, on
    the whole sample, so its time is the fit's own (docs/scaling.md, "Measurements behind the
    code's thresholds").
    """
    from sklearn.cluster import KMeans  # lazy: not on workers (__init__)
    from sklearn.utils import check_random_state

    rng = check_random_state(random_state)
    S32 = np.ascontiguousarray(S, dtype=np.float32)
    km = KMeans(n_clusters=n_lists, init=kmeans_plusplus(S32, n_lists, rng), n_init=1,
                max_iter=KMEANS_ITER, random_state=rng).fit(S32)
    return np.asarray(km.cluster_centers_, dtype=np.float64)


def kmeans_plusplus(S: np.ndarray, k: int, rng: np.random.RandomState) -> np.ndarray:
    """(k, N) k-means++ seeds among the rows of ``S`` (float32, centred).

    D² sampling (Arthur & Vassilvitskii 2007, "k-means++: the advantages of careful
    seeding", §2.2) with greedy trials as scikit-learn draws them: 2 + ln k candidates per
    seed, the one that lowers the potential most is kept. Random seeds leave lists empty and
    others large, and the search costs the sum of the probed lists' sizes. One float32 GEMM of
    the candidates against the rows per seed, rather than scikit-learn's float64 seeding
    (``kmeans_plusplus``): faster, and the lists come out as even (docs/scaling.md,
    "Measurements behind the code's thresholds").
    """
    n = len(S)
    sq = np.einsum("ij,ij->i", S, S)
    trials = 2 + int(np.log(k))
    seeds = np.empty(k, dtype=np.int64)
    seeds[0] = rng.randint(n)
    closest = np.maximum(sq - 2 * (S @ S[seeds[0]]) + sq[seeds[0]], 0)
    potential = closest.sum(dtype=np.float64)
    for c in range(1, k):
        drawn = np.searchsorted(np.cumsum(closest, dtype=np.float64),
                                rng.uniform(size=trials) * potential)
        drawn = np.minimum(drawn, n - 1)
        d = sq[drawn][:, None] - 2 * (S[drawn] @ S.T) + sq[None, :]
        np.minimum(closest, np.maximum(d, 0, out=d), out=d)
        potentials = d.sum(axis=1, dtype=np.float64)
        best = int(np.argmin(potentials))
        seeds[c], potential, closest = drawn[best], potentials[best], d[best]
    return S[seeds]


def list_order(cent: np.ndarray, k: int = 10) -> np.ndarray:
    """The lists' numbering: reverse Cuthill-McKee over the centroids' kNN graph, which walks
    the manifold the centroids sample, so that a run of consecutive lists is a compact region
    (a group's rows probe overlapping lists) and the graph, stored in list order, cuts into
    blocks with short boundaries: the block paths exchange fewer bytes in fewer rounds than
    with the leaves of a k-d tree over the centroids, which in many dimensions split along
    single coordinates (docs/scaling.md, "Measurements behind the code's thresholds")."""
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import reverse_cuthill_mckee

    n = cent.shape[0]
    k = min(k + 1, n)
    _, idx = brute_knn(cent, cent, k)
    g = csr_matrix((np.ones(n * k), (np.repeat(np.arange(n), k), idx.ravel())), shape=(n, n))
    return np.asarray(reverse_cuthill_mckee((g + g.T).tocsr(), symmetric_mode=True), np.int64)
