"""The partitioned search behind ``kneighbors(algorithm="ivf")``: inverted lists in Zarr.

An inverted-file index (Jégou, Douze & Schmid 2011, "Product quantization for nearest neighbor
search", §III-A; faiss's ``IndexIVFFlat``) over rows that never meet in one process:

1. **Coarse quantizer.** k-means centroids (``n_lists`` of them) trained on a seeded sample of
   rows, in this process (the sample and the centroids are all it holds). The lists are
   numbered in reverse Cuthill-McKee order of the centroids' kNN graph, so that consecutive
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

import dataclasses
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

from dr_dask.graph._ivf_quantizer import (
    TRAIN_BYTES,
    TRAIN_PER_LIST,
    default_n_lists,
    list_order,
    sample_rows,
    train_quantizer,
)
from dr_dask.graph._knn_cells import _centred
from dr_dask.graph.knn_tol import CALIBRATION_WIDTH, DEFAULT_KNN_TOL, distance_share
from dr_dask.graph.topk import (
    EXTRA,
    Mirror,
    brute_knn,
    check_finite,
    fold_knn,
    fold_knn_self,
    rerank_labelled,
)
from dr_dask.io.storage import Location, location, read_spans
from dr_dask.runtime import config
from dr_dask.runtime.blas import single_blas_thread
from dr_dask.runtime.cluster import compute

logger = logging.getLogger(__name__)

#: The adaptive search (``n_probe=None``): a row probes a list while its centroid gap (squared
#: distance to the list's centroid beyond that to the row's nearest centroid) is below a share
#: of the row's current k-th squared distance: the smallest share that holds the k-th
#: neighbour's distance of ``CALIBRATION_ROWS`` sampled rows within ``tol`` of the exact one
#: (:func:`calibrated`), whatever the data and however many lists there are. The exact
#: bound (a list's rows lie beyond the bisector of the two centroids, at least
#: gap / (2 ||c_u - c_1||) away) asks for ten times the lists on data whose neighbours noise
#: decides (docs/scaling.md, "The adaptive probe"). ``PROBE_GAP`` serves without calibration.
PROBE_GAP = 0.2
CALIBRATION_ROWS = 200
#: Lists the adaptive search's first round probes (each later round probes twice the last).
MIN_PROBE = 4


def _assign_block(block: np.ndarray, start: int, mean: np.ndarray, cent32: np.ndarray,
                  rows_arr: zarr.Array, ids_arr: zarr.Array) -> np.ndarray:
    """Sort one row block by list into its rows of the staging arrays; its counts per list."""
    check_finite(np.asarray(block), start, "X")
    x = _centred(block, mean)
    lists = _probe_order(x, cent32, 1)[1][:, 0]  # each row's nearest list
    order = np.argsort(lists, kind="stable")
    rows_arr[start:start + len(x)] = x[order]
    ids_arr[start:start + len(x)] = order + start
    return np.bincount(lists, minlength=len(cent32))


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
        rows = read_spans(src, spans)[order]
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
    follow the centroids' kNN graph, :func:`~dr_dask.graph._ivf_quantizer.list_order`), the
    order the stored graph keeps.
    """

    rows: zarr.Array
    ids: zarr.Array
    cent32: np.ndarray
    list_start: np.ndarray
    sizes: np.ndarray
    groups: tuple[tuple[int, int], ...]
    dest: np.ndarray
    label0: np.ndarray
    n_probe: int | None
    #: The adaptive probe's gap share (:func:`calibrated`); None: ``PROBE_GAP``.
    probe_gap: float | None = None

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


def _probe_order(q: np.ndarray, cent32: np.ndarray,
                 n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(m, n) each row's n nearest lists, nearest first, and their centroid gaps: the squared
    distance to the list's centroid minus that to the nearest centroid (float32). Ties go to
    the smaller list. Also (m,) each row's key to its nearest centroid (the squared distance
    less the row's squared norm), from which :func:`_wider_order` measures gaps.

    By :func:`~dr_dask.graph.topk.brute_knn`, whose GEMM tiles live in a buffer its thread
    keeps. A GEMM of all the centroids' keys and a partial sort takes 12 fresh bytes per row
    and list, fresh pages on distributed's workers (:mod:`dr_dask.runtime.buffers`), for no
    faster a selection.
    """
    keys, probes = brute_knn(q, cent32, min(n, len(cent32)))
    return (keys - keys[:, :1]).astype(np.float32), probes, keys[:, 0]


def _wider_order(q: np.ndarray, cent32: np.ndarray, nearest: np.ndarray, gaps: np.ndarray,
                 probes: np.ndarray, rows: np.ndarray, within: np.ndarray,
                 width: int) -> tuple[np.ndarray, np.ndarray]:
    """The adaptive search's probe order widened to ``width`` lists after its first round:
    for ``rows``, the first round's lists and then the nearest lists whose gap is below
    ``within`` (the gap share times the row's k-th squared distance so far); the other rows
    and the rest of the order are padding (gap inf, list -1).

    The k-th distance only falls as the search goes on, so these are all the lists a row can
    still probe. Selecting every row's ``width`` nearest lists up front inserted many of them
    one by one into sorted lists (a row's nearer centroids, numbered along the manifold, come
    one after another): 14 of the search's 65 s at T = 10^6 in one process. Bounded, most
    lists cost one comparison.
    """
    m, first = gaps.shape
    wide_gaps = np.full((m, width), np.inf, dtype=np.float32)
    wide_probes = np.full((m, width), -1, dtype=np.int64)
    wide_gaps[:, :first], wide_probes[:, :first] = gaps, probes
    if not len(rows):
        return wide_gaps, wide_probes
    near = nearest[rows]
    # a little wider than asked: a GEMM over other rows may round a key the other way
    slack = 1e-5 * (np.abs(near) + within)
    keys, wide = brute_knn(q[rows], cent32, width, bound=near + within + slack)
    wide_gaps[rows, first:] = np.where(wide[:, first:] >= 0, keys[:, first:] - near[:, None],
                                       np.inf)
    wide_probes[rows, first:] = wide[:, first:]
    # the first round's lists lead; where rounding reordered a near-tie, the rest follow them
    for i in np.flatnonzero((wide[:, :first] != probes[rows]).any(axis=1)):
        later = (wide[i] >= 0) & ~np.isin(wide[i], probes[rows[i]])
        n = min(int(later.sum()), width - first)
        wide_gaps[rows[i], first:] = np.inf
        wide_probes[rows[i], first:] = -1
        wide_gaps[rows[i], first:first + n] = (keys[i] - near[i])[later][:n]
        wide_probes[rows[i], first:first + n] = wide[i][later][:n]
    return wide_gaps, wide_probes


class _Candidates:
    """The rows a group's search folds into its running lists: each probed list read once,
    candidate c of list u being ``col0[u]`` plus its position, and the group's own lists its
    query rows.

    Among its own lists each pair of rows is multiplied once. When rows of list x probe list
    y of the group, the products that give them y's rows also give y's rows those rows as
    candidates: which rows of x have probed y is kept (``asked[x, y]``), a row of y that has
    not probed x holds exactly those, and the rows of y that probe x later need only x's
    others. On the noisy sinusoid at T = 10^6 that is a fifth fewer products, and rows hold
    candidates they would not have probed (docs/scaling.md, "Each pair of rows once"). Those
    only lower a row's running k-th distance toward its final one, so the adaptive probe's
    stopping rule still holds.
    """

    def __init__(self, lists: InvertedLists, g: int, q: np.ndarray, sq: np.ndarray,
                 kk: int) -> None:
        self.lists, self.q, self.sq = lists, q, sq
        self.first, last = lists.groups[g]
        self.col0 = np.full(len(lists.cent32), -1, dtype=np.int64)
        self.read: list[int] = []
        self.parts: list[np.ndarray] = []
        self.sqs: list[np.ndarray] = []
        self.n = 0
        self.at = np.concatenate([[0], np.cumsum(lists.sizes[self.first:last])])
        for u in range(self.first, last):
            self._take(u, q[self.at[u - self.first]:self.at[u - self.first + 1]],
                       sq[self.at[u - self.first]:self.at[u - self.first + 1]])
        self.asked: dict[tuple[int, int], np.ndarray] = {}
        # gathered queries, lists and rows, in buffers kept for the group: a fresh copy per
        # list was a third of a worker's page faults
        self.q_buf = np.empty_like(q)
        self.rows_buf = np.empty((int(np.diff(self.at).max(initial=0)), q.shape[1]), q.dtype)
        self.best_buf = np.empty((2, len(q), kk))
        self.idx_buf = np.empty((2, len(q), kk), dtype=np.int64)

    def _take(self, u: int, rows: np.ndarray, sq: np.ndarray) -> None:
        self.col0[u] = self.n
        self.n += len(rows)
        self.read.append(u)
        self.parts.append(rows)
        self.sqs.append(sq)

    def read_lists(self, us: np.ndarray) -> None:
        """Read the lists ``us`` not read yet."""
        for u in us[self.col0[us] < 0]:
            a = int(self.lists.list_start[u])
            rows = np.asarray(self.lists.rows[a:a + int(self.lists.sizes[u])])
            self._take(int(u), rows, np.einsum("ij,ij->i", rows, rows, dtype=np.float64))

    def own(self, u: int) -> bool:
        return 0 <= u - self.first < len(self.at) - 1

    def fold(self, x: int, y: int, rows_q: np.ndarray, best: np.ndarray,
             idx: np.ndarray) -> None:
        """Fold list y's rows into the running lists of the group rows ``rows_q`` (sorted),
        rows of list x (which matters when y is one of the group's own lists)."""
        if self.own(y):
            self._fold_own(x, y, rows_q, best, idx)
            return
        j = self.read.index(y)
        if not len(self.parts[j]):
            return
        q_best, q_idx = self._gather(0, rows_q, best, idx)
        q = np.take(self.q, rows_q, axis=0, out=self.q_buf[:len(rows_q)], mode="clip")
        fold_knn(q, self.parts[j], self.sqs[j], int(self.col0[y]), q_best, q_idx)
        best[rows_q], idx[rows_q] = q_best, q_idx

    def _gather(self, slot: int, rows: np.ndarray, best: np.ndarray,
                idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # "clip": the indices are valid, and numpy buffers ``out`` under the default "raise"
        return (np.take(best, rows, axis=0, out=self.best_buf[slot, :len(rows)], mode="clip"),
                np.take(idx, rows, axis=0, out=self.idx_buf[slot, :len(rows)], mode="clip"))

    def _asked(self, x: int, y: int) -> np.ndarray:
        if (x, y) not in self.asked:
            n = self.at[x - self.first + 1] - self.at[x - self.first]
            self.asked[x, y] = np.zeros(n, dtype=bool)
        return self.asked[x, y]

    def _fold_own(self, x: int, y: int, rows_q: np.ndarray, best: np.ndarray,
                  idx: np.ndarray) -> None:
        ox, oy = int(self.at[x - self.first]), int(self.at[y - self.first])
        mine, theirs = self._asked(x, y), self._asked(y, x)
        p = rows_q - ox
        if x == y and len(p) == len(mine) and not mine.any():  # a whole list against itself
            end = oy + len(mine)
            fold_knn_self(self.q[oy:end], self.sq[oy:end], self.col0[y] + np.arange(len(p)),
                          best[oy:end], idx[oy:end])
            mine[:] = True
            return
        # y's rows not holding these rows' products with them; those that are not these rows
        # (all, for another list) take these rows as candidates: they come first
        cols = np.flatnonzero(~theirs)
        if x == y:
            cols = np.concatenate([cols[~np.isin(cols, p)], cols[np.isin(cols, p)]])
        back = oy + cols[:len(cols) - len(p)] if x == y else oy + cols
        q_best, q_idx = self._gather(0, rows_q, best, idx)
        m_best, m_idx = self._gather(1, back, best, idx)
        q = np.take(self.q, rows_q, axis=0, out=self.q_buf[:len(rows_q)], mode="clip")
        data = (self.q[oy:oy + len(cols)] if len(cols) == len(theirs) and x != y else
                np.take(self.q, oy + cols, axis=0, out=self.rows_buf[:len(cols)], mode="clip"))
        fold_knn(q, data, self.sq[oy + cols], self.col0[y] + cols, q_best, q_idx,
                 mirror=Mirror(0, m_best, m_idx, self.sq[rows_q], self.col0[x] + p))
        best[rows_q], idx[rows_q] = q_best, q_idx
        best[back], idx[back] = m_best, m_idx
        mine[p] = True


def _search_group(lists: InvertedLists, g: int, k: int,
                  exclude_self: bool) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The k nearest neighbours of the rows of group ``g``, each searched in its nearest
    lists: the ``n_probe`` nearest, or with ``n_probe=None`` as many as the adaptive rule
    asks (``lists.probe_gap``, :func:`calibrated`).

    The adaptive search runs in rounds of probes, each round twice the last (``MIN_PROBE``
    lists, then as many again, ...): a row probes its next lists in centroid order while
    their gap (the squared distance to the list's centroid beyond that to its nearest
    centroid) is below the gap share times its current k-th squared distance; rows that stop
    leave the rounds. Within a round the (list, row) pairs are grouped by list, so each
    probed list meets the rows that probe it in one GEMM, as the fixed search does.

    Returns the group's row indices (m,), and per row the distances, the neighbours' labels
    (their positions in list order, :attr:`InvertedLists.label0`) and their row indices, each
    of shape (m, k) (padding: inf, -1, -1).
    """
    first, last = lists.groups[g]
    list_start, list_size = lists.list_start, lists.sizes
    s, e = int(list_start[first]), int(list_start[last - 1] + list_size[last - 1])
    q = np.asarray(lists.rows[s:s + (e - s)])
    own = np.asarray(lists.ids[s:e])
    m, n_lists = len(q), len(lists.cent32)
    adaptive = lists.n_probe is None
    share = PROBE_GAP if lists.probe_gap is None else lists.probe_gap
    width = min(max_probe(n_lists) if lists.n_probe is None else int(lists.n_probe), n_lists)
    step = min(MIN_PROBE, width) if adaptive else width
    gaps, probes, nearest = _probe_order(q, lists.cent32, step)  # the first round's lists
    sq_q = np.einsum("ij,ij->i", q, q, dtype=np.float64)
    kk = min(k + exclude_self + EXTRA, lists.n_rows)
    kth = min(k + exclude_self, kk) - 1  # the running list's k-th neighbour (self counted)
    best = np.full((m, kk), np.inf)
    idx = np.full((m, kk), -1, dtype=np.int64)
    cands = _Candidates(lists, g, q, sq_q, kk)
    src = np.repeat(np.arange(first, last), list_size[first:last])  # each row's own list
    done = np.zeros(m, dtype=np.int64)  # positions of each row's order probed so far
    active = np.arange(m)
    while len(active):
        hi = np.minimum(done[active] + step, width)
        if adaptive and done[active[0]] > 0:  # the first round probes unconditionally
            kth_sq = best[active, kth] + sq_q[active]
            allowed = (gaps[active] < share * kth_sq[:, None]).sum(axis=1)
            hi = np.minimum(hi, np.maximum(allowed, done[active]))
        lo = done[active]
        n_pairs = hi - lo
        pair_query = np.repeat(active, n_pairs)
        pos = np.arange(int(n_pairs.sum())) - np.repeat(np.cumsum(n_pairs) - n_pairs, n_pairs)
        pair_list = probes[pair_query, np.repeat(lo, n_pairs) + pos]
        done[active] = hi
        cands.read_lists(np.unique(pair_list))
        # the pairs by probed list, so that each list meets the rows that probe it in one
        # GEMM; a list of the group's own by the probing rows' list too
        own_list = (pair_list >= first) & (pair_list < last)
        key = pair_list * n_lists + np.where(own_list, src[pair_query], 0)
        order = np.argsort(key, kind="stable")
        key = key[order]
        for lo_b, hi_b in itertools.pairwise(np.flatnonzero(np.r_[True, key[1:] != key[:-1],
                                                                   True])):
            y, x = divmod(int(key[lo_b]), n_lists)
            cands.fold(x, y, pair_query[order[lo_b:hi_b]], best, idx)
        if not adaptive:
            break
        if gaps.shape[1] < width:  # after the first round: only rows whose next list may be
            within = share * (best[active, kth] + sq_q[active])  # within the gap go on
            go = gaps[active, -1] < within
            gaps, probes = _wider_order(q, lists.cent32, nearest, gaps, probes, active[go],
                                        within[go], width)
        more = done[active] < width
        if more.any():  # a row goes on while its next list is within the gap
            nxt = gaps[active[more], done[active[more]]]
            kth_sq = best[active[more], kth] + sq_q[active[more]]
            more[more] = nxt < share * kth_sq
        active = active[more]
        step *= 2
    read_arr = np.array(cands.read, dtype=np.int64)
    cand = np.concatenate(cands.parts) if cands.parts else np.empty((0, q.shape[1]), np.float32)
    spans = [(int(list_start[u]), int(list_start[u] + list_size[u])) for u in read_arr]
    cand_ids = read_spans(lists.ids, spans)
    labels = np.concatenate([np.arange(a, b) for a, b in spans] + [np.empty(0, np.int64)]) + (
        np.repeat(lists.label_shift[read_arr], list_size[read_arr]) if len(read_arr)
        else np.empty(0, np.int64))
    own_labels = np.arange(lists.label0[g], lists.label0[g + 1])
    d, lab = rerank_labelled(q.astype(np.float64), cand, idx, k, labels,
                             own_labels if exclude_self else own_labels[:0])
    by_label = np.argsort(labels)
    at = by_label[np.searchsorted(labels[by_label], np.maximum(lab, 0))] if len(labels) else lab
    ids = np.where(lab >= 0, cand_ids[at] if len(cand_ids) else -1, -1)
    logger.debug("IVF group %d: %d rows probed %.1f lists on average (%d read)", g, m,
                 done.mean() if m else 0.0, len(cands.read))
    return own, d, lab, ids


def _rows_at(lists: InvertedLists, labels: np.ndarray) -> np.ndarray:
    """The centred float32 rows of sorted labels (one read per row)."""
    g = np.searchsorted(lists.label0, labels, side="right") - 1
    pos = labels - lists.label0[g] + lists.dest[g]
    return read_spans(lists.rows, [(int(p), int(p) + 1) for p in pos])


def _group_nearest(lists: InvertedLists, g: int, queries: np.ndarray,
                   k: int) -> tuple[np.ndarray, np.ndarray]:
    """Keys (squared distance minus the query's squared norm) and labels (S, k) of each
    query's k nearest rows of group ``g`` (padding: inf, -1)."""
    s, n = int(lists.dest[g]), int(lists.label0[g + 1] - lists.label0[g])
    keys, idx = brute_knn(queries, np.asarray(lists.rows[s:s + n]), min(k, n))
    labels = np.where(idx >= 0, idx + lists.label0[g], -1)
    pad = k - keys.shape[1]
    return (np.pad(keys, ((0, 0), (0, pad)), constant_values=np.inf),
            np.pad(labels, ((0, 0), (0, pad)), constant_values=-1))


def calibrated(lists: InvertedLists, k: int, *, client: Any, random_state: Any = 0,
               tol: float = DEFAULT_KNN_TOL) -> InvertedLists:
    """``lists`` with the adaptive probe's gap share measured on them (unchanged with a fixed
    ``n_probe``).

    ``CALIBRATION_ROWS`` seeded rows are searched exactly (one task per group of lists over
    that group's rows, the way the partitioned search reads them: no process holds more than a
    group), ``CALIBRATION_WIDTH`` k neighbours each. The ratio of a neighbour's list's centroid
    gap to the row's k-th squared distance is the share that finds it; the search uses the
    smallest share that holds the mean k-th distance error within ``tol``
    (:func:`~dr_dask.graph.knn_tol.distance_share`). Its running k-th distance is never
    below the final one, so it probes at least those lists.
    """
    if lists.n_probe is not None:
        return lists
    from sklearn.utils import check_random_state  # lazy: not on workers (__init__)

    n = lists.n_rows
    labels = np.sort(check_random_state(random_state).choice(
        n, min(CALIBRATION_ROWS, n), replace=False))
    kq = min(CALIBRATION_WIDTH * k + 1, n)  # the row itself is among its nearest
    q = _rows_at(lists, labels)
    task = dask.delayed(_group_nearest, pure=True)
    shared = [dask.delayed(a, traverse=False) for a in (lists, q)]
    parts = compute(*[task(shared[0], g, shared[1], kq) for g in range(len(lists.groups))],
                    client=client)
    keys = np.hstack([p[0] for p in parts])
    found = np.hstack([p[1] for p in parts])
    keys = np.where(found == labels[:, None], np.inf, keys)  # not its own neighbour
    order = np.argsort(keys, axis=1, kind="stable")[:, :kq - 1]
    nb_keys = np.take_along_axis(keys, order, 1)
    nb = np.take_along_axis(found, order, 1)
    sq = np.einsum("ij,ij->i", q, q, dtype=np.float64)
    dist_sq = np.where(nb >= 0, np.maximum(nb_keys + sq[:, None], 0.0), np.inf)
    kth_sq = np.maximum(dist_sq[:, min(k, n - 1) - 1], np.finfo(np.float32).tiny)
    # each neighbour's list, and its gap from the row's nearest centroid
    starts = lists.list_start + lists.label_shift
    nb_list = np.searchsorted(starts, nb, side="right") - 1
    cent = lists.cent32
    c_keys = (np.einsum("ij,ij->i", cent, cent, dtype=np.float64)[None, :]
              - 2 * (q.astype(np.float64) @ cent.T.astype(np.float64)))
    gaps = np.take_along_axis(c_keys, nb_list, 1) - c_keys.min(axis=1)[:, None]
    ratio = np.where(nb >= 0, gaps / kth_sq[:, None], np.inf)
    share = distance_share(dist_sq, ratio, min(k, n - 1), tol) if len(nb) else PROBE_GAP
    return dataclasses.replace(lists, probe_gap=share)


def max_probe(n_lists: int) -> int:
    """The adaptive search's cap on the lists a row probes (``dr_dask.knn.max-probe``)."""
    return max(MIN_PROBE, min(n_lists, int(config.get("knn.max-probe"))))


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
                n_probe: int | None = None, random_state: Any = 0,
                tol: float = DEFAULT_KNN_TOL) -> InvertedLists:
    """Train the coarse quantizer and write X's rows into inverted lists at ``where``.

    Parameters as :func:`ivf_kneighbors`; ``where`` receives the lists (and, while they are
    written, a staging copy of the rows, deleted once the lists are complete).
    """
    from sklearn.utils import check_random_state  # lazy: not on workers (__init__)

    T, N = X.shape
    n_lists = min(int(n_lists or default_n_lists(T)), T)
    n_probe = n_lists if n_probe is None and tol == 0 else n_probe  # 0: every list, exact
    n_probe = None if n_probe is None else min(int(n_probe), n_lists)  # None: adaptive
    rng = check_random_state(random_state)
    n_train = min(T, max(TRAIN_PER_LIST * n_lists, 1),
                  max(n_lists, TRAIN_BYTES // (8 * N)))
    S = sample_rows(X, n_train, rng, client)
    S = S[np.isfinite(S).all(axis=1)]  # a non-finite row is named by the assignment
    mean = S.mean(axis=0)
    cent = train_quantizer(S - mean, n_lists, rng)
    del S
    order = list_order(cent)
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
    logger.info("IVF lists: T=%d in %d lists (%d to %d rows), %s probed, %d groups", T,
                n_lists, sizes.min(), sizes.max(), n_probe, len(groups))
    return InvertedLists(rows, ids, cent32, list_start, sizes, tuple(groups), dest,
                         np.concatenate([[0], np.cumsum(group_rows)]).astype(np.int64),
                         n_probe)


def ivf_kneighbors(X: Any, k: int, exclude_self: bool, *, client: Any,
                   n_lists: int | None = None, n_probe: int | None = None,
                   scratch: Any = None, random_state: Any = 0,
                   knn_tol: float = DEFAULT_KNN_TOL) -> tuple[np.ndarray, np.ndarray]:
    """k nearest neighbours of every row of X among its rows, by the inverted-list search.

    Parameters
    ----------
    X : ndarray or dask array of shape (T, N)
    k : int
    exclude_self : bool
        A row is not its own neighbour (``kneighbors`` without ``query``).
    client : distributed.Client or None
    n_lists : int, optional
        Lists of the coarse quantizer (default
        :func:`~dr_dask.graph._ivf_quantizer.default_n_lists`, about sqrt(T) / 2).
    n_probe : int, optional
        Lists each row searches; ``>= n_lists``: all, exact. Default: as many as the adaptive
        rule asks (:func:`calibrated`, at most ``dr_dask.knn.max-probe``; ``knn_tol``).
    scratch : str or Location, optional
        Where the lists are written (every worker must reach it); default a local temporary
        directory. Deleted before returning.
    random_state : int, RandomState or None
        Seeds the training sample and the k-means.
    knn_tol : float
        The adaptive probe's distance tolerance (:func:`calibrated`); 0: every list, exact.

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
                            random_state=random_state, tol=knn_tol)
        lists = calibrated(lists, k, client=client, random_state=random_state, tol=knn_tol)
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
