"""The neighbour graph built where the rows are: no process holds all rows or all edges.

Over the inverted lists of :mod:`dr_dask.graph._knn_ivf` (at the fit's scratch location):

1. **Edges** (one task per group of lists, on the workers): the group's rows find their k
   neighbours (:func:`~dr_dask.graph._knn_ivf._search_group`); each edge is kept in both
   directions, weighted, sorted by the *block* of its first end (blocks: consecutive label
   ranges of about ``dr_dask.graph.block-edges`` edges), and written to the group's own
   chunks of a staging array. Only the blocks they go to and their counts come back.
2. **Blocks** (one task per block): a block reads its edges from the slices of the groups
   that sent it some (the shuffle, through the store), merges duplicate edges by their
   maximum weight (as :func:`~dr_dask.graph.neighbour_graph.graph_from_neighbors`) into CSR
   rows, writes them as its block of the stored graph
   (:class:`~dr_dask.graph.stored.StoredGraph`: int32 columns, float32 weights, 8 bytes per
   directed edge, nodes numbered by label; its own chunks), and its components over its own
   edges (each node's root, to the store).
3. **Connectivity** (:mod:`dr_dask.graph.partitioned_components`; one task per block, then this
   process): each block reads its stored rows and the components of the later blocks its edges
   reach, and returns the pairs of components its edges join; this process joins them (union-find
   over the blocks' components, never a node per row nor the E edges). A disconnected
   graph is bridged by Borůvka's steps: every component but the largest gets its shortest edge
   to another component, found by one task per group over that group's rows for the rows
   outside the largest, each task reading its rows' components from the blocks'
   (:class:`~dr_dask.graph.partitioned_components.Components`); repeated until one component
   remains. Each such edge is the shortest across a cut, so the bridges are the minimum
   spanning tree over the components, the edges
   :func:`~dr_dask.graph.components.connect_components` adds (distinct lengths).
4. **Assembly**: the blocks' table and the bridges are recorded beside the blocks; no task
   ever holds the graph. The shortest-path tasks open it where they run, by blocks
   (:mod:`dr_dask.graph.block_paths`) or whole.

Every task writes only chunks no other task writes, and rewrites the same ones when it runs
again after a worker is lost.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dask
import numba
import numpy as np
import zarr

from dr_dask.graph._knn_ivf import (
    InvertedLists,
    _search_group,
    build_lists,
    calibrated,
)
from dr_dask.graph.knn import (
    RECALL_ROWS,
    knn_algorithm,
    report_recall,
    sampled_quality,
    search_seed,
)
from dr_dask.graph.knn_tol import DEFAULT_KNN_TOL
from dr_dask.graph.partitioned_components import (
    ZERO_EDGE32,
    Components,
    _block_links,
    _bridges,
    _joined,
    _roots,
    _union,
)
from dr_dask.graph.stored import StoredGraph
from dr_dask.io.storage import Location, read_spans
from dr_dask.io.validation import warn_duplicates
from dr_dask.runtime import config
from dr_dask.runtime.blas import single_blas_thread
from dr_dask.runtime.cluster import compute
from dr_dask.runtime.resources import timed

logger = logging.getLogger(__name__)

#: The modes of ``on_disconnected`` (as :func:`~dr_dask.graph.components.connect_components`).
_MODES = ("bridge", "raise", "ignore")


def _pad(n: int, chunk: int) -> int:
    return chunk * math.ceil(n / chunk)


def _offsets(sizes: Any, chunk: int) -> np.ndarray:
    """Chunk-aligned start of each region of ``sizes`` entries, and the total (len + 1)."""
    return np.concatenate([[0], np.cumsum([_pad(int(n), chunk) for n in sizes])]).astype(
        np.int64)


def distance_weight(d: np.ndarray, i: np.ndarray, j: np.ndarray) -> np.ndarray:
    """Isomap's edge weight: the Euclidean length (``i``, ``j``: the ends' row indices)."""
    return d


# ---------------------------------------------------------------------------------------------
# 1. edges


def _group_edges(lists: InvertedLists, g: int, k: int, weight: Callable,
                 block0: np.ndarray, edges: zarr.Array, start: int,
                 sample: np.ndarray) -> tuple:
    """Group ``g``'s directed edges, both ways, into ``edges[start:]`` sorted by block.

    Returns the blocks the edges go to with their counts (only those with edges: a group's
    rows have neighbours in a few blocks, and a dense table of every group against every
    block grows as T², 5 x 10⁸ entries at T = 10⁹), the neighbours (row indices) of the
    group's rows among ``sample``, and the pairs of row indices at distance zero (duplicates).
    """
    own, d, lab, ids = _search_group(lists, g, k, True)
    src = np.repeat(np.arange(lists.label0[g], lists.label0[g + 1]), k)
    keep = lab.ravel() >= 0
    w64 = np.asarray(weight(d, own[:, None], ids), dtype=np.float64).ravel()
    w = np.maximum(w64, ZERO_EDGE32).astype(np.float32)[keep]
    a, b = src[keep], lab.ravel()[keep]
    first, second = np.concatenate([a, b]), np.concatenate([b, a])
    block = np.searchsorted(block0, first, side="right") - 1
    order = np.argsort(block, kind="stable")
    triples = np.column_stack([first, second, np.tile(w, 2).view(np.int32)])
    edges[start:start + len(order)] = triples[order].astype(np.int32)
    hit = np.isin(own, sample)
    zero = (d == 0) & (lab >= 0)
    to, n = np.unique(block, return_counts=True)
    return ((to, n), (own[hit], ids[hit]), (np.repeat(own, k)[zero.ravel()], ids[zero]))


def block_spans(sent: Sequence[tuple[np.ndarray, np.ndarray]], at: np.ndarray,
                B: int) -> tuple[list[np.ndarray], np.ndarray]:
    """Each block's spans of the staged edges ((n, 2) starts and ends), and its edge count.

    ``sent[g]`` are the blocks group ``g``'s edges go to (ascending) and their counts; the
    group wrote them from ``at[g]``, sorted by block. A block's spans are those of the groups
    that sent it edges, in group order: O(blocks + spans) in this process and in the blocks'
    task specs, where one span per group and block was quadratic in T.
    """
    none = [np.empty(0, np.int64)]
    to = np.concatenate([t for t, _ in sent] + none).astype(np.int64)
    n = np.concatenate([c for _, c in sent] + none).astype(np.int64)
    # a group's spans follow one another from its slice's start, in block order
    start = np.concatenate([int(a) + np.cumsum(c) - c for a, (_, c) in zip(at, sent)] + none)
    order = np.argsort(to, kind="stable")  # by block, each block's spans in group order
    cuts = np.searchsorted(to[order], np.arange(1, B))
    # arrays, not tuples of ints: 16 bytes a span (about 2 million spans at T = 10^9)
    spans = np.split(np.column_stack([start, start + n])[order], cuts)
    return spans, np.bincount(to, weights=n, minlength=B).astype(np.int64)


# ---------------------------------------------------------------------------------------------
# 2. blocks


@numba.njit(cache=True, nogil=True)
def _csr_rows(first: np.ndarray, second: np.ndarray, w: np.ndarray, lo: int,
              m: int) -> tuple:
    """Rows ``lo`` to ``lo + m`` as CSR (degrees, columns, weights) from directed edges whose
    first end is in them: each row's columns sorted, duplicates merged by their maximum."""
    deg = np.zeros(m, dtype=np.int64)
    for e in range(len(first)):
        deg[first[e] - lo] += 1
    start = np.zeros(m + 1, dtype=np.int64)
    for i in range(m):
        start[i + 1] = start[i] + deg[i]
    fill = start[:-1].copy()
    col = np.empty(len(first), dtype=np.int32)
    wt = np.empty(len(first), dtype=np.float32)
    for e in range(len(first)):
        r = first[e] - lo
        col[fill[r]], wt[fill[r]] = second[e], w[e]
        fill[r] += 1
    out = 0
    for i in range(m):
        s, e = start[i], start[i + 1]
        order = np.argsort(col[s:e])
        c, v = col[s:e][order], wt[s:e][order]
        row0 = out
        for t in range(e - s):
            if out > row0 and col[out - 1] == c[t]:
                wt[out - 1] = max(wt[out - 1], v[t])
            else:
                col[out], wt[out] = c[t], v[t]
                out += 1
        deg[i] = out - row0
    return deg, col[:out].copy(), wt[:out].copy()


def _block_rows(edges: zarr.Array, spans: np.ndarray, lo: int, hi: int,
                graph: tuple[zarr.Array, ...], ptr_at: int, data_at: int, ids: zarr.Array,
                id_spans: list[tuple[int, int]], roots: zarr.Array) -> tuple:
    """Block ``[lo, hi)``'s CSR rows from its spans of the staging array, written as the stored
    graph's block (:class:`~dr_dask.graph.stored.StoredGraph`: its pointers and its rows'
    indices at ``ptr_at``, its edges at ``data_at``, chunks no other block writes); its entries
    and its components (:func:`_local_components`)."""
    indptr, row_ids, indices, weights = graph
    e = read_spans(edges, spans)
    deg, col, wt = _csr_rows(e[:, 0], e[:, 1], e[:, 2].view(np.float32), lo, hi - lo)
    indices[data_at:data_at + len(col)] = col
    weights[data_at:data_at + len(col)] = wt
    indptr[ptr_at:ptr_at + len(deg) + 1] = np.concatenate([[0], np.cumsum(deg)])
    row_ids[ptr_at:ptr_at + len(deg)] = read_spans(ids, id_spans)
    return (len(col), *_local_components(lo, hi, deg, col, roots, ptr_at))


def _local_components(lo: int, hi: int, deg: np.ndarray, col: np.ndarray, roots: zarr.Array,
                      at: int) -> tuple[np.ndarray, np.ndarray]:
    """The block's components over its own edges, written (each node's least joined label) to
    ``roots[at:]``: their roots and sizes."""
    m = hi - lo
    src = np.repeat(np.arange(lo, hi), deg)
    inside = (col >= lo) & (col < hi)
    parent = np.arange(m)
    _union(parent, src[inside] - lo, col[inside].astype(np.int64) - lo)
    mine = _roots(parent) + lo
    roots[at:at + m] = mine
    return np.unique(mine, return_counts=True)


# ---------------------------------------------------------------------------------------------


@dataclass
class PartitionedGraph:
    """:func:`partitioned_graph`'s result: the stored graph and what the fit reports."""

    graph: StoredGraph
    n_edges: int
    n_components: int
    sample: np.ndarray
    sample_neighbours: np.ndarray
    seconds: dict[str, float]
    recall: float = 1.0
    distance_error: float = 0.0


def partitioned_graph(X: Any, k: int, where: Location, *, client: Any,
                      weight: Callable = distance_weight, n_lists: int | None = None,
                      n_probe: int | None = None, on_disconnected: str = "bridge",
                      sample_rows: int = 0, random_state: Any = 0,
                      knn_tol: float = DEFAULT_KNN_TOL) -> PartitionedGraph:
    """The symmetric kNN graph of X's rows, built on the workers and stored at ``where``.

    Parameters
    ----------
    X : ndarray or dask array of shape (T, N)
    k : int
        Neighbours per row (edges: each row to its k nearest, symmetrised by the maximum
        weight, as :func:`~dr_dask.graph.neighbour_graph.graph_from_neighbors`).
    where : Location
        Reachable by every worker; receives the inverted lists, the staging arrays (deleted
        when done) and the graph (``where/graph``), which must outlive its readers.
    client : distributed.Client or None
    weight : callable
        ``weight(distances, i, j)``: edge weights of the distances between rows ``i`` and
        ``j`` (row indices; broadcast shapes). Picklable; default the distance.
    n_lists, n_probe, knn_tol : int, int, float, optional
        The search's lists, probes and distance tolerance (``tol`` of
        :func:`~dr_dask.graph._knn_ivf.ivf_kneighbors`).
    on_disconnected : {"bridge", "raise", "ignore"}
        As :func:`~dr_dask.graph.components.connect_components`.
    sample_rows : int
        Rows (seeded) whose neighbours are returned, to estimate the recall.
    random_state : int, RandomState or None
        Seeds the quantizer and the sample.

    Returns
    -------
    PartitionedGraph
        The graph (nodes in original row order through its ``rank``), its undirected edge
        count, the raw graph's component count, and the sample rows (S,) with their
        neighbours (S, k).
    """
    from sklearn.utils import check_random_state  # lazy: not on workers (__init__)

    if on_disconnected not in _MODES:
        raise ValueError(f"on_disconnected must be one of {_MODES}, got {on_disconnected!r}")
    rng = check_random_state(random_state)
    T = int(X.shape[0])
    seconds: dict[str, float] = {}
    with timed(seconds, "lists"):
        lists = build_lists(X, where.child("lists"), client=client, n_lists=n_lists,
                            n_probe=n_probe, random_state=rng, tol=knn_tol)
    with timed(seconds, "calibration"):
        lists = calibrated(lists, k, client=client, random_state=rng, tol=knn_tol)
    sample = np.sort(rng.choice(T, min(int(sample_rows), T), replace=False))
    # blocks: consecutive groups of about block-edges directed edges (both ways: 2k per row)
    rows_per_block = max(1, int(config.get("graph.block-edges")) // (2 * k))
    cuts = [0]
    for g in range(1, len(lists.groups)):
        if lists.label0[g] - lists.label0[cuts[-1]] >= rows_per_block:
            cuts.append(g)
    block0 = np.append(lists.label0[cuts], T)
    B = len(block0) - 1

    staging = where.child("edges").zarr_store()
    group_rows = np.diff(lists.label0)
    edge_chunk = int(config.get("graph.edge-chunk"))
    at = _offsets(2 * k * group_rows, edge_chunk)
    edges = zarr.create_array(staging, shape=(max(int(at[-1]), 1), 3), dtype=np.int32,
                              chunks=(edge_chunk, 3), compressors=None)
    lists_key = dask.delayed(lists, traverse=False)  # sent once per worker, not per task
    weight_key = dask.delayed(weight, traverse=False)
    task = dask.delayed(_group_edges, pure=True)
    with single_blas_thread(), timed(seconds, "search"):
        found = compute(*[task(lists_key, g, k, weight_key, block0, edges, int(at[g]), sample)
                          for g in range(len(lists.groups))], client=client)
    span, per_block = block_spans([f[0] for f in found], at, B)
    hits = sorted((int(i), n) for f in found for i, n in zip(*f[1]))
    zero = [f[2] for f in found if len(f[2][0])]
    logger.info("partitioned graph: %d directed edges found in %d groups, %d blocks",
                per_block.sum(), len(found), B)

    # 2. blocks: each reads its spans of the groups' slices and writes its block of the graph
    unit = int(config.get("graph.stored-chunk"))
    data_at = _offsets(per_block, unit)
    ptr_at = _offsets(np.diff(block0) + 1, unit)
    graph_loc = where.child("graph")
    root = StoredGraph.create(graph_loc, int(ptr_at[-1]), int(data_at[-1]), np.int32,
                              np.float32, unit)
    arrays = tuple(root[name] for name in ("indptr", "ids", "indices", "weights"))
    roots = zarr.create_array(where.child("roots").zarr_store(), shape=(int(ptr_at[-1]),),
                              chunks=(unit,), dtype=np.int64, compressors=None)
    cuts_end = [*cuts, len(lists.groups)]
    id_spans = [[(int(lists.dest[g]), int(lists.dest[g] + group_rows[g]))
                 for g in range(cuts_end[b], cuts_end[b + 1])] for b in range(B)]
    task = dask.delayed(_block_rows, pure=True)
    with timed(seconds, "blocks"):
        blocks = compute(*[task(edges, span[b], int(block0[b]), int(block0[b + 1]), arrays,
                                int(ptr_at[b]), int(data_at[b]), lists.ids, id_spans[b],
                                roots)
                           for b in range(B)], client=client)
    where.child("edges").delete()
    n_directed = sum(int(b[0]) for b in blocks)

    # 3. connectivity, from the blocks' components and the pairs of them their edges join
    with timed(seconds, "connectivity"):
        local = np.concatenate([b[1] for b in blocks])
        local_sizes = np.concatenate([b[2] for b in blocks])
        del blocks
        task = dask.delayed(_block_links, pure=True)
        tables = [dask.delayed(a, traverse=False) for a in (block0, ptr_at)]  # once a worker
        links = compute(*[task(arrays[0], arrays[2], roots, b, *tables, int(data_at[b]))
                          for b in range(B)], client=client)
        pairs = np.concatenate([*links, np.empty((0, 2), np.int64)])
        joined = _joined(local, pairs[:, 0], pairs[:, 1])
        del links
        n_components = len(np.unique(joined))
        bridges: tuple = (np.empty(0, np.int64),) * 2 + (np.empty(0, np.float32),)
        if n_components > 1 and on_disconnected != "ignore":
            comps = Components(roots, block0, ptr_at[:-1], local, joined, local_sizes)
            bridges = _bridges(lists, comps, weight, client, on_disconnected)
    where.child("roots").delete()

    # 4. the graph is complete once its blocks and bridges are recorded: no task holds it
    with timed(seconds, "assembly"):
        graph = StoredGraph.finish(graph_loc, block0, ptr_at[:-1], data_at[:-1], bridges)
    logger.info("partitioned graph: %d nodes, %d edges; seconds %s", T, n_directed // 2,
                {key: round(v, 1) for key, v in seconds.items()})
    where.child("lists").delete()
    if zero:
        first = np.arange(T)
        for i, j in zero:
            np.minimum.at(first, np.maximum(i, j), np.minimum(i, j))
        warn_duplicates(first, stacklevel=3)
    neighbours = np.array([n for _, n in hits]).reshape(len(hits), k)
    return PartitionedGraph(graph, (n_directed + 2 * len(bridges[0])) // 2, n_components,
                            np.array([i for i, _ in hits], dtype=np.int64), neighbours,
                            seconds)


def stored_neighbour_graph(X: Any, k: int, where: Location, *, knn: str,
                           n_probe: int | None, client: Any, weight: Callable = distance_weight,
                           on_disconnected: str = "bridge", random_state: Any = None,
                           knn_tol: float = DEFAULT_KNN_TOL) -> PartitionedGraph | None:
    """An estimator's graph built on the workers, when its ``knn`` mode takes the partitioned
    search (:func:`~dr_dask.graph.knn.knn_algorithm`); else None (the caller builds it in
    memory).

    One search: its recall and distance error, estimated on ``RECALL_ROWS`` seeded rows, are
    logged and warned on (:func:`~dr_dask.graph.knn.report_recall`), in every mode.
    """
    if knn_algorithm(knn, int(X.shape[0]), int(X.shape[1])) != "ivf":
        return None
    pg = partitioned_graph(X, k, where, client=client, weight=weight, n_probe=n_probe,
                           on_disconnected=on_disconnected, sample_rows=RECALL_ROWS,
                           random_state=search_seed(random_state), knn_tol=knn_tol)
    pg.recall, pg.distance_error, error_se = sampled_quality(X, pg.sample,
                                                             pg.sample_neighbours, client=client)
    report_recall(knn, n_probe, pg.recall, pg.distance_error, knn_tol, error_se)
    return pg
