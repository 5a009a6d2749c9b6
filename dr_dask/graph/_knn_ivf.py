"""The partitioned search behind ``kneighbors(algorithm="ivf")``: inverted lists in Zarr.

An inverted-file index (Jégou, Douze & Schmid 2011, "Product quantization for nearest neighbor
search", §III-A; faiss's ``IndexIVFFlat``) over rows that never meet in one process:

1. **Coarse quantizer.** k-means centroids (``n_lists`` of them) trained on a seeded sample of
   rows, in this process (the sample and the centroids are all it holds). The lists are
   numbered in the order of the leaves of a k-d tree over the centroids, so that consecutive
   lists are near each other and a task's lists probe overlapping lists.
2. **Assignment** (one task per row block, on the workers): every row goes to its nearest
   centroid; the block's centred float32 rows, sorted by list, and their row indices are
   written to the block's own rows of a staging Zarr array. Only the per-list counts of each
   block come back.
3. **Lists** (one task per group of consecutive lists): a group's rows are read from every
   block's slice of the staging array and written to the group's own chunks of the lists
   array. Both arrays are at the fit's scratch location (a local disk or an object store), so a
   task lost with its worker re-reads them.
4. **Search** (one task per group): the group's rows are the queries; each probes its
   ``n_probe`` nearest lists, whose rows the task reads; float32 GEMM tiles are folded into
   running top ``k + EXTRA`` lists by the brute-force kernel and re-ranked by float64
   distances, as the exact searches do. A worker holds its group's rows and the lists they
   probe, never all rows. :func:`ivf_kneighbors` gathers the neighbour lists;
   :mod:`dr_dask.graph.partitioned` turns them into graph edges where they are found.

With ``n_probe >= n_lists`` every list is probed and the result is the exact kNN of the centred
float32 rows (as the cell search's). Below, it is approximate: a neighbour is missed when it
lies in a list none of the query's ``n_probe`` nearest centroids own. The callers estimate the
recall on sampled rows (:func:`dr_dask.graph.knn.estimate_recall`).
"""

from __future__ import annotations

import itertools
import logging
import math
import tempfile
import uuid
from dataclasses import dataclass
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr

from dr_dask.graph._knn_cells import _cells, _centred
from dr_dask.graph.topk import EXTRA, brute_knn, check_finite, fold_knn, rerank_labelled
from dr_dask.io.storage import Location, location
from dr_dask.runtime import config
from dr_dask.runtime.blas import single_blas_thread
from dr_dask.runtime.cluster import compute

logger = logging.getLogger(__name__)

#: Training rows per centroid (faiss warns below 39) and the sample's byte cap (float32).
TRAIN_PER_LIST = 64
TRAIN_BYTES = 128 << 20
#: Lloyd iterations of the coarse quantizer (faiss's default is 10 or 20).
KMEANS_ITER = 15
#: ``n_probe`` when not given. The search costs about n_probe. On the noisy sinusoid (N=100,
#: k=10, T=10^6, 1,000 lists) 6 probes find 0.62-0.65 of the true neighbours and 12 find 0.84,
#: and landmark IKD's R^2 is the same (0.9727 with 6, 0.9713 with 12; search 27 s against 42 s
#: on 2 workers): there the noise picks the true neighbours (docs/scaling.md, "The partitioned
#: neighbour search"); on data whose manifold decides them a few probes find nearly all.
#: Raise it (or ``knn="exact"``) where the recall warning matters.
DEFAULT_N_PROBE = 6


def default_n_lists(T: int) -> int:
    """Lists when not given: about sqrt(T) rows each (faiss's guidance of 4-16 sqrt(T) lists
    balances the quantizer against the scan for one-off queries; a self-join of T queries
    scans T n_probe T / n_lists rows, so fewer, larger lists cost little more and lose less
    recall at the list boundaries)."""
    return max(1, round(math.sqrt(T)))


def _sample_rows(X: Any, n: int, rng: np.random.RandomState, client: Any) -> np.ndarray:
    rows = np.sort(rng.choice(X.shape[0], n, replace=False))
    S = X[rows]
    if isinstance(S, da.Array):
        (S,) = compute(S, client=client)
    return np.asarray(S, dtype=np.float64)


def train_quantizer(S: np.ndarray, n_lists: int, random_state: Any) -> np.ndarray:
    """(n_lists, N) k-means centroids of the sample rows ``S`` (Lloyd, seeded)."""
    from sklearn.cluster import KMeans  # lazy: not on workers (__init__)

    # k-means++ seeds (Arthur & Vassilvitskii 2007, with scikit-learn's greedy trials): from
    # random seeds, 10% of the sinusoid's lists at T=10^7 ended up empty and the search, which
    # costs the sum of the probed lists' sizes, paid 1.41 times what equal lists cost; from
    # k-means++ seeds 1.15 (the fit of 3,162 lists to 202,368 rows: 100 s against 30 s; seeds
    # with 1 or 3 trials: 1.39 and 1.23)
    km = KMeans(n_clusters=n_lists, init="k-means++", n_init=1, max_iter=KMEANS_ITER,
                random_state=random_state).fit(S)
    return np.asarray(km.cluster_centers_, dtype=np.float64)


def _nearest_lists(rows32: np.ndarray, cent32: np.ndarray, n: int) -> np.ndarray:
    """(m, n) the n nearest centroids of each row (ties to the smaller list)."""
    return brute_knn(rows32, cent32, min(n, len(cent32)))[1]


def _assign_block(block: np.ndarray, start: int, mean: np.ndarray, cent32: np.ndarray,
                  rows_arr: zarr.Array, ids_arr: zarr.Array) -> np.ndarray:
    """Sort one row block by list into its rows of the staging arrays; its counts per list."""
    check_finite(np.asarray(block), start, "X")
    x = _centred(block, mean)
    lists = _nearest_lists(x, cent32, 1)[:, 0]
    order = np.argsort(lists, kind="stable")
    rows_arr[start:start + len(x)] = x[order]
    ids_arr[start:start + len(x)] = order + start
    return np.bincount(lists, minlength=len(cent32))


def _read_runs(arr: zarr.Array, spans: list[tuple[int, int]]) -> np.ndarray:
    """``arr``'s rows of the spans, in order, adjacent spans read at once."""
    runs: list[list[int]] = []
    for s, e in spans:
        if e <= s:
            continue
        if runs and runs[-1][1] == s:
            runs[-1][1] = e
        else:
            runs.append([s, e])
    if not runs:
        return np.empty((0, *arr.shape[1:]), dtype=arr.dtype)
    return np.concatenate([np.asarray(arr[s:e]) for s, e in runs])


def _gather_groups(staging: tuple, lists: tuple, block_starts: np.ndarray,
                   offsets: zarr.Array, groups: list[tuple[int, int]],
                   dests: list[int]) -> int:
    """Copy the consecutive ``groups`` (their lists ``[first, last)``) from every block's
    staging slice to the lists arrays, group ``g`` at ``dests[g]`` (a chunk boundary: no other
    task writes these chunks), list after list.

    ``offsets`` (blocks, n_lists + 1) are the blocks' list offsets, in the store: the task
    reads its lists' columns (in every task's spec they were 122 MB a task at T=10^8).
    Each block's slice holds its rows of these lists one list after another: read block after
    block (one read each, of the run of all the groups: a run spans chunks, so the reads decode
    little beyond it), the rows are put in list order by a stable sort, so a list's rows are
    contiguous (where :attr:`InvertedLists.list_start` says) and keep their block order.
    """
    first = groups[0][0]
    block_offsets = np.asarray(offsets[:, first:groups[-1][1] + 1])
    spans = [(int(b + o[0]), int(b + o[-1])) for b, o in zip(block_starts, block_offsets)]
    per_block = np.diff(block_offsets, axis=1)  # (blocks, lists) rows
    n_lists = per_block.shape[1]
    list_of = np.repeat(np.tile(np.arange(n_lists), len(per_block)), per_block.ravel())
    order = np.argsort(list_of, kind="stable")
    # where each group's rows start among the sorted rows
    cut = np.concatenate([[0], np.cumsum(per_block.sum(axis=0))])
    for src, dst in zip(staging, lists):
        rows = _read_runs(src, spans)[order]
        for (a, b), at in zip(groups, dests):
            part = rows[cut[a - first]:cut[b - first]]
            dst[at:at + len(part)] = part
    return len(order)


def _runs_of_groups(group_rows: list[int], n_blocks: int, chunk: int,
                    row_bytes: int) -> list[tuple[int, int]]:
    """Consecutive groups per list-building task (``[g0, g1)`` ranges): enough rows that each
    block's span of them is about a staging chunk or more (the reads then decode at most about
    twice what they use), up to ``knn.ivf-gather-bytes`` of rows."""
    cap = max(1, config.get_bytes("knn.ivf-gather-bytes") // max(1, row_bytes))
    return _groups(np.asarray(group_rows), min(n_blocks * chunk, cap))


@dataclass(frozen=True)
class InvertedLists:
    """Rows in inverted lists at a scratch location: what a search task needs to open them.

    ``rows`` (float32, centred) and ``ids`` (their row indices) hold the lists in order, each
    group of consecutive lists (``groups``: ``(first, last)`` list numbers) from a chunk
    boundary ``dest[g]``; list ``u`` starts at ``list_start[u]`` with ``sizes[u]`` rows. A
    row's *label* is its rank in that order, padding left out: group ``g`` holds labels
    ``label0[g]`` to ``label0[g + 1]``. Neighbours in lists are near in label order (the lists
    follow a k-d tree of the centroids), which is the order the stored graph keeps.
    """

    rows: zarr.Array
    ids: zarr.Array
    cent32: np.ndarray
    list_start: np.ndarray
    sizes: np.ndarray
    groups: tuple[tuple[int, int], ...]
    dest: np.ndarray
    label0: np.ndarray
    n_probe: int

    @property
    def n_rows(self) -> int:
        return int(self.label0[-1])

    @property
    def label_shift(self) -> np.ndarray:
        """Per list: its rows' label minus their position."""
        group_of = np.repeat(np.arange(len(self.groups)), [b - a for a, b in self.groups])
        return (self.label0[:-1] - self.dest[:-1])[group_of]

    def group_ids(self, g: int) -> np.ndarray:
        """The row indices of group ``g``'s rows, in label order."""
        s = int(self.dest[g])
        return np.asarray(self.ids[s:s + int(self.label0[g + 1] - self.label0[g])])


def _search_group(lists: InvertedLists, g: int, k: int,
                  exclude_self: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The k nearest neighbours of the rows of group ``g``, each searched in its ``n_probe``
    nearest lists.

    Returns the group's row indices (m,), and per row the distances, the neighbours' labels
    (their positions in list order, :attr:`InvertedLists.label0`) and their row indices, each
    of shape (m, k) (padding: inf, -1, -1).
    """
    first, last = lists.groups[g]
    list_start, list_size = lists.list_start, lists.sizes
    s, e = int(list_start[first]), int(list_start[last - 1] + list_size[last - 1])
    q = np.asarray(lists.rows[s:e])
    own = np.asarray(lists.ids[s:e])
    m = len(q)
    probes = _nearest_lists(q, lists.cent32, lists.n_probe)
    # the rows of every probed list, read once: candidate c is cand[c], label labels[c]
    probed = np.unique(probes)
    spans = [(int(list_start[u]), int(list_start[u] + list_size[u])) for u in probed]
    cand = _read_runs(lists.rows, spans)
    cand_ids = _read_runs(lists.ids, spans)
    labels = np.concatenate([np.arange(a, b) for a, b in spans]) + np.repeat(
        lists.label_shift[probed], list_size[probed])  # ascending: lists are in label order
    col0 = np.concatenate([[0], np.cumsum(list_size[probed])])
    sq = np.einsum("ij,ij->i", cand, cand, dtype=np.float64)
    kk = min(k + exclude_self + EXTRA, lists.n_rows)
    best = np.full((m, kk), np.inf)
    idx = np.full((m, kk), -1, dtype=np.int64)
    # (list, query) pairs grouped by list: each probed list meets the queries that probe it
    pair_list = np.searchsorted(probed, probes.ravel())
    pair_query = np.repeat(np.arange(m), probes.shape[1])
    order = np.argsort(pair_list, kind="stable")
    bounds = np.searchsorted(pair_list[order], np.arange(len(probed) + 1))
    for j, (a, b) in enumerate(itertools.pairwise(bounds)):
        rows = pair_query[order[a:b]]
        c, f = int(col0[j]), int(col0[j + 1])
        if not len(rows) or f == c:
            continue
        part_best, part_idx = best[rows], idx[rows]
        fold_knn(q[rows], cand[c:f], sq[c:f], c, part_best, part_idx)
        best[rows], idx[rows] = part_best, part_idx
    own_labels = np.arange(lists.label0[g], lists.label0[g + 1])
    d, lab = rerank_labelled(q.astype(np.float64), cand, idx, k, labels,
                             own_labels if exclude_self else own_labels[:0])
    ids = np.where(lab >= 0, cand_ids[np.searchsorted(labels, lab)], -1)
    return own, d, lab, ids


def _zarr_pair(loc: Location, name: str, T: int, N: int,
               chunk: int) -> tuple[zarr.Array, zarr.Array]:
    """Rows (T, N) float32 and their row indices (T,) int64, in chunks of ``chunk`` rows."""
    store = loc.child(name).zarr_store()
    root = zarr.open_group(store, mode="w")
    rows = root.create_array("rows", shape=(T, N), chunks=(chunk, N), dtype=np.float32,
                             compressors=None)
    ids = root.create_array("ids", shape=(T,), chunks=(chunk,), dtype=np.int64,
                            compressors=None, fill_value=-1)
    return rows, ids


def _groups(sizes: np.ndarray, target: int) -> list[tuple[int, int]]:
    """Consecutive lists grouped to about ``target`` rows each."""
    out, first, acc = [], 0, 0
    for j, n in enumerate(sizes):
        acc += int(n)
        if acc >= target:
            out.append((first, j + 1))
            first, acc = j + 1, 0
    if first < len(sizes):
        out.append((first, len(sizes)))
    return out


def build_lists(X: Any, where: Location, *, client: Any, n_lists: int | None = None,
                n_probe: int | None = None, random_state: Any = 0) -> InvertedLists:
    """Train the coarse quantizer and write X's rows into inverted lists at ``where``.

    Parameters as :func:`ivf_kneighbors`; ``where`` receives the lists (and, while they are
    written, a staging copy of the rows, deleted once the lists are complete).
    """
    from sklearn.utils import check_random_state  # lazy: not on workers (__init__)

    T, N = X.shape
    n_lists = min(int(n_lists or default_n_lists(T)), T)
    n_probe = min(int(n_probe or DEFAULT_N_PROBE), n_lists)
    rng = check_random_state(random_state)
    n_train = min(T, max(TRAIN_PER_LIST * n_lists, 1),
                  max(n_lists, TRAIN_BYTES // (8 * N)))
    S = _sample_rows(X, n_train, rng, client)
    S = S[np.isfinite(S).all(axis=1)]  # a non-finite row is named by the assignment
    mean = S.mean(axis=0)
    cent = train_quantizer(S - mean, n_lists, rng)
    del S
    # number the lists along a k-d tree of the centroids: a group of consecutive lists is a
    # compact region, whose rows probe overlapping lists
    order, _ = _cells(cent, 1)
    cent32 = np.ascontiguousarray(cent[order], dtype=np.float32)

    chunk = int(config.get("knn.ivf-chunk-rows"))
    block_rows = int(config.get("knn.ivf-block-rows"))
    if not isinstance(X, da.Array):
        X = da.from_array(X, chunks=(block_rows, -1))
    # row blocks on chunk boundaries: each assignment task writes chunks no other one writes.
    # At least block_rows each: every group task reads one span per block, so blocks as small
    # as the input's chunks (4,096 rows in IKD's persisted rows) would make the lists stage
    # read each staging chunk for a handful of rows, T / 4,096 times per group (2,442 reads
    # of 1,024-row chunks per group at T=10^7)
    block = chunk * max(1, round(max(*X.chunks[0], block_rows) / chunk))
    X = X.rechunk((block, -1))
    starts = np.array([0, *np.cumsum(X.chunks[0])])

    staging = _zarr_pair(where, "staging", T, N, chunk)
    assign = dask.delayed(_assign_block, pure=True)
    # sent to each worker once, not in every task's spec (4 MB at T=10^8, 1,526 tasks)
    mean_key, cent_key = (dask.delayed(a, traverse=False) for a in (mean, cent32))
    with single_blas_thread():
        counts = np.array(compute(*[
            assign(b, int(s), mean_key, cent_key, *staging)
            for b, s in zip(X.to_delayed().ravel(), starts[:-1])], client=client))
    sizes = counts.sum(axis=0)
    block_offsets = np.concatenate([np.zeros((len(counts), 1), np.int64),
                                    np.cumsum(counts, axis=1)], axis=1)
    groups = _groups(sizes, int(config.get("knn.ivf-task-rows")))
    # each group starts on a chunk boundary of the lists arrays
    group_rows = [int(sizes[a:b].sum()) for a, b in groups]
    padded = [chunk * math.ceil(n / chunk) for n in group_rows]
    dest = np.concatenate([[0], np.cumsum(padded)]).astype(np.int64)
    rows, ids = _zarr_pair(where, "lists", int(dest[-1]), N, chunk)
    gather = dask.delayed(_gather_groups, pure=True)
    runs = _runs_of_groups(group_rows, len(starts) - 1, chunk, 4 * N + 8)
    offsets = zarr.create_array(where.child("offsets").zarr_store(), shape=block_offsets.shape,
                                chunks=(len(block_offsets), 64), dtype=np.int64,
                                compressors=None)
    offsets[...] = block_offsets
    compute(*[gather(staging, (rows, ids), starts[:-1], offsets, groups[g0:g1],
                     [int(d) for d in dest[g0:g1]])
              for g0, g1 in runs], client=client)
    where.child("offsets").delete()
    where.child("staging").delete()
    list_start = np.empty(n_lists, dtype=np.int64)
    for g, (a, b) in enumerate(groups):
        list_start[a:b] = dest[g] + np.concatenate([[0], np.cumsum(sizes[a:b - 1])])
    logger.info("IVF lists: T=%d in %d lists (%d to %d rows), %d probed, %d groups", T,
                n_lists, sizes.min(), sizes.max(), n_probe, len(groups))
    return InvertedLists(rows, ids, cent32, list_start, sizes, tuple(groups), dest,
                         np.concatenate([[0], np.cumsum(group_rows)]).astype(np.int64),
                         n_probe)


def ivf_kneighbors(X: Any, k: int, exclude_self: bool, *, client: Any,
                   n_lists: int | None = None, n_probe: int | None = None,
                   scratch: Any = None,
                   random_state: Any = 0) -> tuple[np.ndarray, np.ndarray]:
    """k nearest neighbours of every row of X among its rows, by the inverted-list search.

    Parameters
    ----------
    X : ndarray or dask array of shape (T, N)
    k : int
    exclude_self : bool
        A row is not its own neighbour (``kneighbors`` without ``query``).
    client : distributed.Client or None
    n_lists : int, optional
        Lists of the coarse quantizer (default :func:`default_n_lists`, about sqrt(T)).
    n_probe : int, optional
        Lists each row searches (default ``DEFAULT_N_PROBE``); ``>= n_lists``: all, exact.
    scratch : str or Location, optional
        Where the lists are written (every worker must reach it); default a local temporary
        directory. Deleted before returning.
    random_state : int, RandomState or None
        Seeds the training sample and the k-means.

    Returns
    -------
    distances, indices : ndarrays of shape (T, k)
        As :func:`dr_dask.graph.knn.kneighbors`; distances between the centred rows rounded
        to float32.
    """
    T = X.shape[0]
    own_tmp = scratch is None
    base = location(tempfile.mkdtemp(prefix="dr_dask_ivf_")) if own_tmp else location(scratch)
    loc = base.child(f"ivf_{uuid.uuid4().hex[:12]}")
    try:
        lists = build_lists(X, loc, client=client, n_lists=n_lists, n_probe=n_probe,
                            random_state=random_state)
        search = dask.delayed(_search_group, pure=True)
        lists_key = dask.delayed(lists, traverse=False)  # sent once per worker, not per task
        with single_blas_thread():
            parts = compute(*[search(lists_key, g, k, exclude_self)
                              for g in range(len(lists.groups))], client=client)
    finally:
        (base if own_tmp else loc).delete()
    dist = np.empty((T, k))
    idx = np.empty((T, k), dtype=np.int64)
    for own, d, _, i in parts:
        dist[own], idx[own] = d, i
    return dist, idx
