"""Shortest paths over blocks of sources on the workers, and out-of-sample geodesics.

The graph (T*k edges) reaches every worker once: from a store (:class:`StoredGraph`, as the
partitioned graph of :mod:`dr_dask.graph.partitioned` is written, memory-mapped when local) or
as a task result dask can recompute; each task runs :func:`dijkstra_rows` (a compiled
Dijkstra for its first source, then Bellman-Ford sweeps carrying up to 64 sources at once;
equal to ``scipy.sparse.csgraph.dijkstra``) for a block of sources. The resulting
row blocks stay where they were computed (:class:`GeodesicRows`): on the workers as futures, in this
process, or in a Zarr array written by the workers. Callers then run reductions and products
over the blocks (:meth:`GeodesicRows.map`) without ever gathering a T x T matrix.
"""

from __future__ import annotations

import functools
import itertools
import logging
import operator
import os
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, overload

import numba
import numpy as np
import scipy.sparse as sp
import zarr
from distributed import Future
from scipy.sparse.csgraph import reverse_cuthill_mckee

from dr_dask import config
from dr_dask.blas import single_blas_thread
from dr_dask.cluster import active_client, gather, map_local, share, thread_memory, wait_for
from dr_dask.linalg.tiles import even_width, strip_tiles
from dr_dask.storage import Location, location

logger = logging.getLogger(__name__)

#: Upper bound on one task's rows plus its sweeps' lanes, which bounds worker memory per task:
#: 64 sources a task at T=10^6 in float32, the sweeps' best lane count. Past that T, see
#: ``_sources_per_task``.
_TASK_BYTES = 1 << 29


@dataclass(frozen=True)
class _SearchGraph:
    """An undirected graph prepared for :func:`_lane_batches`: CSR arrays whose out-edges are
    all its edges, nodes relabelled in reverse Cuthill-McKee order (neighbours get nearby
    labels, so a search touches nearby memory: 1.5-2x faster on kNN graphs), and ``rank``
    (``rank[node]`` is its label)."""

    indptr: np.ndarray
    indices: np.ndarray
    weights: np.ndarray
    rank: np.ndarray
    #: What this process learnt of the graph (``"heap"``: the sweeps lost to the heap here)
    hint: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def n_nodes(self) -> int:
        return len(self.rank)

    @classmethod
    def of(cls, graph: sp.csr_matrix) -> _SearchGraph:
        diff = graph - graph.T  # blind to explicit zeros, whose mirror may be missing
        if (diff.nnz and np.abs(diff.data).max()) or not graph.data.all():
            # every edge in both directions; duplicate (i, j) entries are kept, not summed
            # (built directly: the csr constructor would sum them), and Dijkstra relaxes both,
            # which is the undirected minimum
            coo = graph.tocoo()
            rows = np.concatenate([coo.row, coo.col])
            order = np.argsort(rows, kind="stable")
            sym = sp.csr_matrix(graph.shape, dtype=np.float64)
            sym.indptr = np.concatenate([[0], np.cumsum(np.bincount(rows, minlength=len(
                graph.indptr) - 1))])
            sym.indices = np.concatenate([coo.col, coo.row])[order]
            sym.data = np.concatenate([coo.data, coo.data])[order]
            graph = sym
        if graph.nnz < 2**31:  # scipy's reordering takes 32-bit indices only
            graph.indptr = graph.indptr.astype(np.int32, copy=False)
            graph.indices = graph.indices.astype(np.int32, copy=False)
            perm = reverse_cuthill_mckee(graph, symmetric_mode=True)
        else:
            perm = np.arange(graph.shape[0])
        rank = np.empty_like(perm, dtype=np.int64)
        rank[perm] = np.arange(len(perm))
        g = graph[perm]  # row slicing keeps duplicate entries and explicit zeros
        return cls(g.indptr, rank[g.indices].astype(g.indices.dtype), g.data, rank)


#: The arrays of a stored search graph (the fields of :class:`_SearchGraph`).
_GRAPH_ARRAYS = ("indptr", "indices", "weights", "rank")


@dataclass(frozen=True)
class StoredGraph:
    """A prepared search graph in Zarr, which the shortest-path tasks open where they run.

    Written once by :meth:`write` (one uncompressed chunk per array), so that the graph
    reaches the workers from the store rather than from the client, and a task rerun after a
    worker loss reopens it. From a local store the arrays are memory-mapped: the workers of
    one machine share one copy in the page cache instead of holding one each.
    """

    location: Location
    n_nodes: int

    @classmethod
    def write(cls, graph: _SearchGraph, where: Any) -> StoredGraph:
        return cls.write_arrays({name: getattr(graph, name) for name in _GRAPH_ARRAYS}, where)

    @classmethod
    def write_arrays(cls, arrays: dict[str, np.ndarray], where: Any) -> StoredGraph:
        """Store the arrays of a search graph (``_GRAPH_ARRAYS``; any index and weight
        dtypes: the partitioned graph keeps int32 columns and float32 weights)."""
        loc = location(where)
        root = zarr.open_group(loc.zarr_store(), mode="w")
        for name in _GRAPH_ARRAYS:
            a = np.ascontiguousarray(arrays[name])
            arr = root.create_array(name, shape=a.shape, dtype=a.dtype,
                                    chunks=(max(1, a.shape[0]),), compressors=None)
            arr[...] = a
        return cls(loc, len(arrays["rank"]))

    def to_csr(self) -> sp.csr_matrix:
        """The graph in memory, in the original node order (for inspection; large)."""
        g = self.open()
        labelled = sp.csr_matrix((np.asarray(g.weights, np.float64), np.asarray(g.indices),
                                  np.asarray(g.indptr)), shape=(self.n_nodes, self.n_nodes))
        return labelled[g.rank][:, g.rank].tocsr()  # node i is label rank[i]

    def open(self) -> _SearchGraph:
        return _open_stored(self.location)

    @property
    def weights_dtype(self) -> np.dtype:
        """The weights' dtype, from the store's metadata (nothing else is read)."""
        return zarr.open_array(self.location.child("weights").zarr_store(read_only=True),
                               mode="r").dtype


@functools.lru_cache(maxsize=1)  # one graph per process at a time: every task of a stage
def _open_stored(loc: Location) -> _SearchGraph:
    root = zarr.open_group(loc.zarr_store(read_only=True), mode="r")
    arrays: dict[str, np.ndarray] = {}
    for name in _GRAPH_ARRAYS:
        arr = root[name]
        assert isinstance(arr, zarr.Array)
        chunk = os.path.join(loc.url, name, "c", "0") if loc.is_local else None
        if (chunk is not None and os.path.exists(chunk)
                and os.path.getsize(chunk) == arr.nbytes and arr.dtype.byteorder in "<=|"):
            # the one chunk of an uncompressed array is its raw little-endian bytes
            arrays[name] = np.memmap(chunk, dtype=arr.dtype, mode="r", shape=arr.shape)
        else:
            arrays[name] = np.asarray(arr[...])
    return _SearchGraph(arrays["indptr"], arrays["indices"], arrays["weights"], arrays["rank"])


def _opened(graph: _SearchGraph | StoredGraph) -> _SearchGraph:
    return graph.open() if isinstance(graph, StoredGraph) else graph


@numba.njit(cache=True, nogil=True)
def _search(indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray, source: int,
            dist: np.ndarray, keys: np.ndarray, nodes: np.ndarray) -> int:
    """Dijkstra from ``source`` into ``dist`` (relabelled nodes), the heap in ``keys`` and
    ``nodes``. Returns the number of nodes reached, or -1 when the heap is full (the arrays
    are never reallocated here: growing them in this loop made it 2x slower)."""
    dist[:] = np.inf
    dist[source] = 0.0
    keys[0], nodes[0], n, reached = 0.0, source, 1, 0
    while n:
        d, u = keys[0], nodes[0]
        n -= 1
        if n:  # move the last entry to the root and sift it down
            k, v, i = keys[n], nodes[n], 0
            while True:
                c = 4 * i + 1
                if c >= n:
                    break
                m, km = c, keys[c]
                for j in range(c + 1, min(c + 4, n)):  # the smallest of <= 4 children
                    if keys[j] < km:
                        m, km = j, keys[j]
                if km >= k:
                    break
                keys[i], nodes[i], i = km, nodes[m], m
            keys[i], nodes[i] = k, v
        if d > dist[u]:
            continue  # stale: u was reached by a shorter path since this push
        reached += 1
        for p in range(indptr[u], indptr[u + 1]):
            v, nd = indices[p], d + weights[p]
            if nd < dist[v]:
                if n == len(keys):
                    return -1
                dist[v] = nd
                i = n  # push, sifting up
                n += 1
                while i:
                    parent = (i - 1) >> 2
                    if keys[parent] <= nd:
                        break
                    keys[i], nodes[i], i = keys[parent], nodes[parent], parent
                keys[i], nodes[i] = nd, v
    return reached


@numba.njit(cache=True, nogil=True)
def _heap_lanes(indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray,
                labels: np.ndarray, lanes: np.ndarray) -> tuple:
    """Dijkstra from each source (by its label) into its column of ``lanes`` (T, S), nodes in
    label order, summed in ``lanes``' dtype.

    A 4-ary heap (half the depth of a binary one, and its children share a cache line: 1.4x
    faster than binary here) with lazy deletion (a node is pushed again when its distance
    drops; stale entries are skipped when popped) in flat arrays shared by all sources. At most
    one push per edge, but the heap starts at T entries, and a search that fills it runs again
    with twice as many: sized for every edge it would take 16 bytes per edge (320 MB per task
    at T=10^6, k=10), where a search of the sinusoid's kNN graph at T=10^5 (1.7 million
    edges) never held more than 7,000.
    Returns ``(-1, 0)``, or ``(r, n)`` for the first source ``r`` that cannot reach ``n``
    nodes (then ``lanes`` is incomplete).
    """
    T = len(indptr) - 1
    dist = np.empty(T, lanes.dtype)
    keys = np.empty(T + 1, lanes.dtype)
    nodes = np.empty(T + 1, dtype=np.int64)
    for r in range(len(labels)):
        while True:
            reached = _search(indptr, indices, weights, labels[r], dist, keys, nodes)
            if reached >= 0:
                break
            keys = np.empty(2 * len(keys), lanes.dtype)
            nodes = np.empty(2 * len(nodes), dtype=np.int64)
        if reached < T:
            return r, T - reached
        lanes[:, r] = dist
    return -1, 0


@numba.njit(cache=True, nogil=True)
def _sweep(indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray, dist: np.ndarray,
           stamp: np.ndarray, seen: np.ndarray, now: int, backward: bool) -> tuple:
    """One pass over the nodes in label order (or its reverse): each node whose neighbours
    changed since it was last visited takes, in every lane, the least of its distance and
    theirs plus the edge. Returns ``(nodes recomputed, clock)``."""
    T, K = dist.shape
    best = np.empty(K, dist.dtype)
    work = 0
    for step in range(T):
        u = T - 1 - step if backward else step
        now += 1
        first, stop = indptr[u], indptr[u + 1]
        newest = 0
        for p in range(first, stop):
            newest = max(newest, stamp[indices[p]])
        if newest <= seen[u]:
            continue  # nothing it depends on moved: its distances still hold
        seen[u] = now
        work += 1
        for c in range(K):
            best[c] = dist[u, c]
        for p in range(first, stop):
            v, w = indices[p], weights[p]
            for c in range(K):  # contiguous lanes: vectorised
                best[c] = min(best[c], dist[v, c] + w)
        changed = False
        for c in range(K):
            if best[c] < dist[u, c]:
                dist[u, c] = best[c]
                changed = True
        if changed:
            stamp[u] = now
    return work, now


@numba.njit(cache=True, nogil=True)
def _lanes_to_rows(lanes: np.ndarray, rank: np.ndarray, out: np.ndarray, square: bool) -> None:
    """``out[r, i]`` = lane r of node ``rank[i]`` (squared in float64 if ``square``)."""
    for i in range(len(rank)):  # each node's lanes read at once: one random read per node
        row = lanes[rank[i]]
        for r in range(len(row)):
            d = np.float64(row[r])
            out[r, i] = d * d if square else d


#: Sources one sweep search carries (at most): each node holds a row of up to LANES distances,
#: read whole for each of its neighbours (fewer lanes pay the passes' fixed costs for less: at
#: 16 they beat the heap on the sinusoid by 1.7x, at 8 they lose).
LANES = 64
MIN_LANES = 16
#: The sweeps are abandoned for the heap once they have cost as much as the heap searches they
#: replace (then, for the rest of that graph's searches in this process). Not less: at T=10^7
#: they take 0.6-0.8 of the heap's time, converging in 8 pairs of passes whose last four change
#: almost nothing, and a budget of 0.75 stopped them a pass before the end.
SWEEP_BUDGET = 1.0


def _sweep_lanes(graph: _SearchGraph, labels: np.ndarray, lanes: np.ndarray, first: int,
                 deadline: float) -> bool:
    """Shortest paths from every source at once by Gauss-Seidel Bellman-Ford sweeps
    (Bertsekas 1998, "Network Optimization", Section 2.3): forward and backward passes over the
    nodes in their reverse Cuthill-McKee order until a pair of passes changes nothing. Exact,
    and bit for bit Dijkstra's distances (both give the least rounded path sum). Lanes before
    ``first`` hold final distances already. Returns False, with ``lanes`` incomplete, when
    past ``deadline`` (``time.perf_counter``)."""
    T = graph.n_nodes
    lanes[:, first:] = np.inf
    lanes[labels[first:], np.arange(first, len(labels))] = 0.0
    stamp = np.zeros(T, dtype=np.int64)  # when a node's distances last fell
    seen = np.zeros(T, dtype=np.int64)  # when a node was last recomputed
    stamp[labels[first:]] = now = 1
    while True:
        forward, now = _sweep(graph.indptr, graph.indices, graph.weights, lanes, stamp, seen,
                              now, False)
        backward, now = _sweep(graph.indptr, graph.indices, graph.weights, lanes, stamp, seen,
                               now, True)
        if not forward + backward:
            return True
        if time.perf_counter() > deadline:
            return False


def _heap(graph: _SearchGraph, sources: np.ndarray, labels: np.ndarray,
          lanes: np.ndarray) -> None:
    bad, missing = _heap_lanes(graph.indptr, graph.indices, graph.weights, labels, lanes)
    if bad >= 0:
        raise ValueError(
            f"the graph is disconnected: source node {int(sources[bad])} cannot reach "
            f"{missing} of {graph.n_nodes} nodes. Repair it first "
            "(dr_dask.graph.connect_components) or increase n_neighbors"
        )


def _lane_batches(graph: _SearchGraph, sources: np.ndarray,
                  dtype: Any) -> Iterator[tuple[int, np.ndarray]]:
    """Shortest paths from ``sources``, in batches of up to ``LANES`` of equal width: yields
    ``(offset, lanes)``, the distances from ``sources[offset:offset + n]`` as ``lanes`` (T, n),
    nodes in label order.

    The first source runs Dijkstra's heap search, which also proves the graph connected and
    times a search; the rest run as :func:`_sweep_lanes`, which on kNN graphs whose node order
    follows the manifold converge in a few pairs of passes (5 on the sinusoid at T=10^6: 3-4x
    faster than the heap per source, 2.6x on 10-d Gaussian data), but on others may need dozens
    (a swiss roll at T=10^5: 42, 2x slower), so they give up at ``SWEEP_BUDGET`` of the heap's
    time and the heap takes over.
    """
    n = len(sources)
    if not n:
        return
    width = even_width(n, LANES)  # a narrow batch pays the passes for less
    labels = graph.rank[sources]
    per_source = 0.0
    for a in range(0, n, width):
        batch = labels[a:a + width]
        m = len(batch)
        first = int(a == 0)  # the first source runs the heap
        sweeps = m - first >= MIN_LANES and not graph.hint.get("heap")
        lanes = _lanes(graph.n_nodes, m, dtype, whole_lines=sweeps)
        done = 0
        if first:
            started = time.perf_counter()
            _heap(graph, sources[:1], batch[:1], lanes[:, :1])
            per_source, done = time.perf_counter() - started, 1
        if sweeps:
            # the padding lanes repeat the last source
            padded = np.concatenate([batch, np.repeat(batch[-1], lanes.shape[1] - m)])
            deadline = time.perf_counter() + SWEEP_BUDGET * per_source * (m - done)
            if _sweep_lanes(graph, padded, lanes, done, deadline):
                done = m
            else:
                graph.hint["heap"] = True
                logger.info("shortest paths: the sweeps lost to the heap on this graph")
        if done < m:
            _heap(graph, sources[a + done:a + m], batch[done:], lanes[:, done:m])
        yield a, lanes[:, :m]


def _lanes(T: int, m: int, dtype: Any, whole_lines: bool) -> np.ndarray:
    """An uninitialised (T, m) lanes array; with ``whole_lines``, m padded to whole 64-byte
    cache lines and each node's lanes starting on one. A sweep reads a neighbour's lanes for
    every edge, from memory once T is large: 31 float32 lanes (124 bytes, from anywhere in a
    line) span 2.9 lines on average, 32 lanes from a line's start span 2."""
    if not whole_lines:
        return np.empty((T, m), dtype=dtype)
    per_line = 64 // np.dtype(dtype).itemsize
    width = -(-m // per_line) * per_line
    buf = np.empty(T * width + per_line, dtype=dtype)
    skip = (-buf.ctypes.data // buf.itemsize) % per_line  # buffers are itemsize-aligned
    return buf[skip:skip + T * width].reshape(T, width)


def _precision(weights: Any, dtype: Any) -> np.dtype:
    """The lanes' dtype for ``weights`` (the graph's weights dtype) and rows of ``dtype``: sums
    in float32 when both are float32 (a stored graph's landmark rows), else in float64."""
    return np.result_type(weights, dtype)


def dijkstra_rows(graph: sp.spmatrix, sources: np.ndarray, *, square: bool = False,
                  dtype: Any = np.float64) -> np.ndarray:
    """Shortest-path lengths from ``sources`` to every node of an undirected graph.

    The single-process kernel under :class:`GeodesicRows`: equal to
    ``scipy.sparse.csgraph.dijkstra(graph, directed=False, indices=sources)`` (every stored
    entry is an edge, explicit zeros too), faster (a 4-ary heap, not a Fibonacci heap, and
    sweeps over many sources at once, :func:`_lane_batches`, over nodes relabelled for
    locality).

    Parameters
    ----------
    graph : sparse matrix of shape (T, T)
        Non-negative edge weights, treated as undirected.
    sources : ndarray of shape (S,)
        Source nodes.
    square : bool
        Return squared lengths (Isomap's D^2), squared in float64 before the cast.
    dtype : dtype
        Output dtype; lengths are accumulated in float64 either way.

    Returns
    -------
    ndarray of shape (S, T)

    Raises
    ------
    ValueError
        If a source cannot reach every node (the graph is disconnected).
    """
    graph = _as_csr(graph)
    sources = np.asarray(sources, dtype=np.int64).ravel()
    if sources.size and (sources.min() < 0 or sources.max() >= graph.shape[0]):
        raise ValueError(f"sources must be node indices in [0, {graph.shape[0]})")
    return _rows(_SearchGraph.of(graph), sources, square, dtype)


def _rows(graph: _SearchGraph | StoredGraph, sources: np.ndarray, square: bool, dtype: Any,
          out: np.ndarray | None = None) -> np.ndarray:
    """:func:`dijkstra_rows` over a prepared (or stored) graph, into ``out`` (of shape (S, T))
    if given."""
    graph = _opened(graph)
    if out is None:
        out = np.empty((len(sources), graph.n_nodes), dtype=dtype)
    batches = _lane_batches(graph, np.asarray(sources, dtype=np.int64),
                            _precision(graph.weights.dtype, out.dtype))
    return _batches_to_rows(batches, graph.rank, out, square)


def _batches_to_rows(batches: Iterable[tuple[int, np.ndarray]], rank: np.ndarray,
                     out: np.ndarray, square: bool) -> np.ndarray:
    """``out`` (S, len(rank)): the distances of :func:`_lane_batches`' ``batches`` to the nodes
    of label ``rank``, in that order."""
    for a, lanes in batches:
        _lanes_to_rows(lanes, rank, out[a:a + lanes.shape[1]], square)
    return out


def _as_csr(graph: sp.spmatrix) -> sp.csr_matrix:
    graph = sp.csr_matrix(graph, dtype=np.float64)
    if graph.shape[0] != graph.shape[1]:
        raise ValueError(f"graph must be square, got shape {graph.shape}")
    if graph.nnz and not graph.data.min() >= 0:  # also refuses NaN
        raise ValueError("graph has negative or NaN edge weights; Dijkstra needs non-negative "
                         "ones")
    return graph


def _rows_to_store(graph: _SearchGraph | StoredGraph, sources: np.ndarray, square: bool, dtype: Any,
                   store: zarr.Array, start: int, columns: np.ndarray | None) -> tuple:
    """The rows from ``sources`` written to ``store[start:]`` a column chunk at a time, straight
    from the lanes: the task holds its lanes and one chunk, never a second copy of its rows.
    Returns the block's handle and its ``columns`` (None without), as stored."""
    graph = _opened(graph)
    batches = list(_lane_batches(graph, np.asarray(sources, dtype=np.int64),
                                 _precision(graph.weights.dtype, dtype)))

    def columns_of(nodes: np.ndarray) -> np.ndarray:
        return _batches_to_rows(batches, graph.rank[nodes],
                                np.empty((len(sources), len(nodes)), dtype=store.dtype), square)

    step = store.chunks[1]
    for c in range(0, graph.n_nodes, step):
        store[start:start + len(sources), c:c + step] = columns_of(
            np.arange(c, min(c + step, graph.n_nodes)))
    return (("zarr", store, start, start + len(sources)),
            None if columns is None else columns_of(columns))


def read_stored(arr: zarr.Array, selection: Any) -> np.ndarray:
    """``arr[selection]`` of an array whose chunks the workers wrote (created with NaN fill by
    :func:`_open_out`): a chunk that never reached the store reads as NaN and is an error,
    never a silent fill value (a worker that wrote to a disk the reader cannot see)."""
    values = np.asarray(arr[selection])
    if values.dtype.kind == "f" and np.isnan(values).any():
        raise RuntimeError(
            f"{arr.store}: rows {selection} of {arr.name or 'the array'} have chunks missing from "
            "the store (read as fill values): the workers wrote them somewhere this process "
            "cannot read; use a location every worker and the client share (a URL or a shared "
            "disk)"
        )
    return values


@dataclass(frozen=True)
class _StoredBlock:
    """Rows ``[start, stop)`` of a stored array, read a column slice at a time
    (``block[:, columns]``): a reduction over the block never holds all of it."""

    store: zarr.Array
    start: int
    stop: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.stop - self.start, int(self.store.shape[1])

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        rows, columns = key
        if rows != slice(None):
            raise IndexError("a stored block is read a column slice at a time")
        return read_stored(self.store, (slice(self.start, self.stop), columns))


def _materialise(block: Any, by_columns: bool = False) -> Any:
    if isinstance(block, tuple) and block and block[0] == "zarr":
        _, store, s, e = block
        return _StoredBlock(store, s, e) if by_columns else read_stored(store, slice(s, e))
    return block


def _columns(block: np.ndarray, start: int, columns: np.ndarray) -> np.ndarray:
    return block[:, columns]


def _apply(block: Any, func: Callable, start: int, args: tuple, by_columns: bool = False) -> Any:
    return func(_materialise(block, by_columns), start, *args)


def _sources_per_task(T: int, per_node: int, client: Any, one_batch: bool) -> int:
    """Sources per task such that what a task holds per source (``per_node`` bytes a node: its
    lanes, and its row unless written to a store) fits ``_TASK_BYTES``; where that is under
    ``LANES``, as many as a quarter of a worker thread's memory holds, up to ``LANES``: below
    ``MIN_LANES`` sources a task runs the heap alone, 3-4x slower (T=10^7, float32 lanes, rows
    to a store: 63 sources a task on 2 workers of 10.1 GB, not 12). A task that writes a store
    holds all its lanes until it writes them: ``one_batch`` keeps it to one batch."""
    per_source = per_node * T
    n = _TASK_BYTES // per_source
    if n < LANES:
        n = max(n, min(LANES, thread_memory(client) // (4 * per_source)))
    return int(min(n, LANES) if one_batch else n)


def _open_out(out: Any, shape: tuple[int, int], rows_per_chunk: int, dtype: Any) -> zarr.Array:
    if isinstance(out, zarr.Array):
        if tuple(out.shape) != shape:
            raise ValueError(f"out has shape {out.shape}, expected {shape}")
        return out
    return zarr.create_array(  # NaN fill: a chunk never written is detected (read_stored)
        store=location(out).zarr_store(), shape=shape, dtype=dtype, overwrite=True,
        chunks=(rows_per_chunk, min(shape[1], 1 << 16)), fill_value=np.nan,
    )


class GeodesicRows:
    """Row blocks of a shortest-path matrix, held on the workers, in memory, or in Zarr.

    Build with :meth:`compute`. Attributes: ``shape`` (n_sources, T), ``bounds`` (block row
    offsets), ``blocks`` (futures, ndarrays or Zarr handles), ``client``, ``store`` (the Zarr
    array or None), ``dtype``.
    """

    def __init__(self, shape: tuple[int, int], bounds: list[int], blocks: list, client: Any,
                 store: zarr.Array | None = None, dtype: Any = np.float64):
        self.shape = shape
        self.dtype = np.dtype(dtype)
        self.bounds = bounds
        self.blocks = blocks
        self.client = client
        self.store = store
        self._whole: np.ndarray | None = None  # the blocks' one array, when they are its views
        self._kept: tuple[np.ndarray, np.ndarray] | None = None  # columns, and their values

    @classmethod
    def compute(
        cls,
        graph: sp.spmatrix | StoredGraph,
        sources: np.ndarray | None = None,
        *,
        client: Any = None,
        block_size: int = 256,
        dtype: Any = np.float64,
        square: bool = False,
        out: Any = None,
        wait: bool = True,
        graph_store: Any = None,
        columns: np.ndarray | None = None,
    ) -> GeodesicRows:
        """Run Dijkstra from every source, blockwise, on the cluster.

        Parameters
        ----------
        graph : sparse matrix of shape (T, T), or StoredGraph
            Non-negative weights; treated as undirected. A stored graph (as
            :func:`~dr_dask.graph.partitioned.partitioned_graph` writes it) is opened by the
            tasks where they run.
        sources : ndarray of shape (S,), optional
            Source nodes (default all T).
        client : distributed.Client, optional
        block_size : int
            Sources per task (capped so that one task's rows and its sweeps' lanes stay near
            512 MB, or a quarter of a worker thread's memory where 512 MB hold too few sources
            for the sweeps; aligned to ``out``'s row chunks so that no two tasks write the same
            chunk).
        dtype : dtype
            Storage type of the rows (float32 halves memory for L x T landmark rows).
        square : bool
            Store squared distances (Isomap's D^2), squared in float64 before the cast.
        out : zarr.Array, str or Location, optional
            Zarr array, or local path / URL (a :class:`~dr_dask.storage.Location` carries
            storage options) of a new array, that the workers write the rows into.
        wait : bool
            Wait for every block (a failure such as a disconnected graph surfaces here).
            ``False`` (held blocks only) returns at once, so that :meth:`gather` copies blocks
            while later ones are computed; a failure then surfaces there.
        graph_store : str or Location, optional
            With a client: where the prepared graph is written once (:class:`StoredGraph`)
            for the tasks to open, memory-mapped when local, instead of being sent from this
            process to every worker. It must outlive the rows (a lost block is recomputed
            from it).
        columns : ndarray of shape (C,), optional
            Columns (nodes) that :meth:`columns` returns: taken by the tasks as they write
            ``out`` (the landmark columns: else read back from every stored chunk, the whole
            L x T array, 40 GB at T=10^7).
        """
        if isinstance(graph, StoredGraph):
            stored, T = graph, graph.n_nodes
        else:
            stored, csr = None, _as_csr(graph)
            T = csr.shape[0]
        sources = np.arange(T) if sources is None else np.asarray(sources, dtype=np.int64)
        if sources.ndim != 1 or (sources.size and (sources.min() < 0 or sources.max() >= T)):
            raise ValueError(f"sources must be node indices in [0, {T})")
        client = active_client(client)
        weights = stored.weights_dtype if stored is not None else np.float64
        per_node = (_precision(weights, dtype).itemsize  # the lanes, and the rows if held
                    + (np.dtype(dtype).itemsize if out is None else 0))
        bs = max(1, min(int(block_size), _sources_per_task(T, per_node, client,
                                                           one_batch=out is not None)))
        store = None
        if out is not None:
            store = _open_out(out, (len(sources), T), bs, dtype)
            c = store.chunks[0]
            bs = c * max(1, bs // c)
        # once here, not in every task (a stored graph is opened where the tasks run)
        search = stored if stored is not None else _SearchGraph.of(csr)
        bounds = [*range(0, len(sources), bs), len(sources)]
        logger.info("Dijkstra from %d sources over %d nodes in %d blocks", len(sources), T,
                    len(bounds) - 1)
        kept = None if store is None or columns is None else np.asarray(columns, np.int64)
        tasks = [(_rows, sources[s:e], square, dtype) if store is None else
                 (_rows_to_store, sources[s:e], square, dtype, store, s, kept)
                 for s, e in itertools.pairwise(bounds)]
        if client is None and store is None:
            # dask's threads (Dijkstra releases the GIL), each block written in place into one
            # array: gather(release=True) hands it over without a second T x S copy
            whole = np.empty((len(sources), T), dtype=dtype)
            map_local(lambda se: _rows(search, sources[se[0]:se[1]], square, dtype,
                                       out=whole[se[0]:se[1]]), list(itertools.pairwise(bounds)))
            rows = cls((len(sources), T), bounds,
                       [whole[s:e] for s, e in itertools.pairwise(bounds)], None, None, dtype)
            rows._whole = whole
            return rows
        if client is None:  # the rows to the store, on dask's threads
            results = map_local(lambda t: t[0](search, *t[1:]), tasks)
        else:
            g = (search if isinstance(search, StoredGraph)
                 else StoredGraph.write(search, graph_store) if graph_store is not None
                 else share(search, client))
            blocks = [client.submit(fn, g, *args) for fn, *args in tasks]
            if not wait and store is None:
                return cls((len(sources), T), bounds, blocks, client, store, dtype)
            # surface a disconnected graph (or any failure) now, not at first use; waits for all.
            # Row blocks held on the workers stay futures: recomputed from the graph if lost
            wait_for(blocks, client)
            for f in blocks:
                if f.status == "error":
                    f.result()
            if store is None:
                return cls((len(sources), T), bounds, blocks, client, store, dtype)
            results = gather(blocks, client)
        # Zarr slice handles, read where the blocks are used, and the columns kept
        rows = cls((len(sources), T), bounds, [h for h, _ in results], client, store, dtype)
        if kept is not None:
            rows._kept = kept, np.vstack([c for _, c in results])
        return rows

    def columns(self, columns: np.ndarray) -> np.ndarray:
        """The rows' ``columns``, of shape (S, C): as the tasks kept them (:meth:`compute`'s
        ``columns``), else read from the blocks where they are."""
        columns = np.asarray(columns, np.int64)
        if self._kept is not None and np.array_equal(self._kept[0], columns):
            return self._kept[1]
        return np.vstack(self.map(_columns, columns))

    def _submit(self, func: Callable, args: tuple, by_columns: bool = False) -> list:
        """Futures (or, without a client, values) of ``func(block, start, *args)`` per block."""
        spans = self.bounds[:-1]
        if self.client is None:
            # dask's threads, one BLAS thread each (see dr_dask.blas): products over row blocks
            # in memory are bound by memory traffic, which BLAS's own threads do not add to
            with single_blas_thread():
                return map_local(lambda bs: _apply(bs[0], func, bs[1], args, by_columns),
                                 list(zip(self.blocks, spans)))
        shared = tuple(share(a, self.client) if isinstance(a, np.ndarray) and a.nbytes > 1 << 20
                       else a for a in args)
        return [self.client.submit(_apply, b, func, s, shared, by_columns, pure=False)
                for b, s in zip(self.blocks, spans)]

    def map(self, func: Callable, *args: Any) -> list:
        """``[func(block, start, *args) for each row block]``, run where the blocks live (on
        the workers when there is a client, also for blocks in Zarr).

        ``func`` must be a picklable module-level function; large ``args`` are sent once.
        """
        parts = self._submit(func, args)
        return parts if self.client is None else gather(parts, self.client)

    def map_sum(self, func: Callable, *args: Any) -> Any:
        """``sum(func(block, start, *args) for each row block)``, summed pairwise on the
        workers: this process receives one term, not one per block (at T=10^6 the landmark
        triangulation's terms are 8 MB per output dimension each, for 63 blocks).

        ``func`` takes a block in Zarr as a :class:`_StoredBlock` (its ``shape``, and
        ``block[:, columns]`` reads), so that it can read a column slice at a time.
        """
        parts = self._submit(func, args, by_columns=True)
        if self.client is None:
            return sum(parts[1:], parts[0])
        while len(parts) > 1:
            pairs = [self.client.submit(operator.add, a, b, pure=False)
                     for a, b in zip(parts[0::2], parts[1::2])]
            parts = pairs + parts[len(pairs) * 2:]
        return gather(parts, self.client)[0]

    def gather(self, dtype: Any = None, release: bool = False) -> np.ndarray:
        """All rows as one in-memory array (only for moderate sizes).

        Blocks are copied one at a time, in order (tasks run roughly in submission order, so
        with ``compute(wait=False)`` the copies overlap the later blocks' Dijkstra);
        ``release`` drops each block once copied (the workers never hold all rows).
        """
        if release and self._whole is not None and self._whole.dtype == np.dtype(
                dtype or self.dtype):
            out, self._whole, self.blocks = self._whole, None, []
            return out
        out = np.empty(self.shape, dtype=dtype or self.dtype)
        for n, (s, e) in enumerate(zip(self.bounds[:-1], self.bounds[1:])):
            b = self.blocks[n]
            # never waiting forever on a cluster that is gone
            out[s:e] = _materialise(gather([b], self.client)[0] if isinstance(b, Future) else b)
            if release:
                self.blocks[n] = None
        if release:
            self.blocks = []
        return out

    def release(self) -> None:
        """Drop the blocks (frees worker memory when they are futures)."""
        self.blocks = []
        self._whole = None


def _upper_strip(graph: _SearchGraph, bounds: tuple[int, ...], i: int, square: bool,
                 transform: Callable, args: tuple, stats_fn: Callable, dtype: Any) -> tuple:
    """Row block ``i`` of the transformed path matrix, columns from the block's start on (the
    upper tiles of block row ``i``), and each tile's ``stats_fn``.

    Sources run ``dr_dask.tiles.strip-sub-rows`` at a time into one float64 buffer, allocated
    once, which the transform may overwrite (IKD's does), and each slice is transformed into the
    strip at once: the task holds that buffer and its strip, no more (IKD's transform made four
    buffer-sized temporaries: 250 MB a task at T=30,000). The diagonal tile is
    symmetrised (Dijkstra from i and from j may differ in the last bit), so the upper tiles
    describe one symmetric matrix, and its diagonal set to zero.
    """
    start, stop = bounds[i], bounds[i + 1]
    strip = np.empty((stop - start, graph.n_nodes - start), dtype=dtype)
    sub = int(config.get("tiles.strip-sub-rows"))
    buffer = np.empty((min(sub, stop - start), graph.n_nodes))
    for s in range(start, stop, sub):
        e = min(s + sub, stop)
        P = _rows(graph, np.arange(s, e), square, np.float64, out=buffer[: e - s])
        strip[s - start : e - start] = transform(P[:, start:], *args)
    diag = strip[:, : stop - start]
    diag[...] = 0.5 * (diag + diag.T)  # a new array on the right: no aliasing
    np.fill_diagonal(diag, 0.0)  # a point's distance to itself, whatever the transform
    spans = [(bounds[j] - start, bounds[j + 1] - start) for j in range(i, len(bounds) - 1)]
    return strip, [stats_fn(strip[:, a:z]) for a, z in spans]


def geodesic_tiles(graph: sp.spmatrix, grid: Any, transform: Callable, *,
                   fn_args: tuple = (), stats_fn: Callable, square: bool = False,
                   dtype: Any = np.float64, precision: Any = np.float32,
                   client: Any = None, store: Any = None) -> tuple[Any, list]:
    """The upper tiles of ``transform(path lengths)``, computed straight from Dijkstra into
    worker memory or a tile array: no T x T path-length array is written or read back, and
    no process holds more than a strip.

    One task per block row ``i`` of ``grid`` runs Dijkstra from its sources and keeps only
    columns from the block's start on (the tiles ``(i, j >= i)``, half of the matrix), in
    ``dtype``; :func:`~dr_dask.linalg.tiles.strip_tiles` holds the strips' tiles in worker
    memory or writes them to ``store``, resumable strip by strip.

    Parameters
    ----------
    graph : sparse matrix of shape (T, T)
        Non-negative weights; treated as undirected.
    grid : TileGrid
        Blocks of both axes (``grid.size == T``); :func:`~dr_dask.linalg.tiles.strip_grid`
        balances them over the workers.
    transform : callable
        ``transform(P, *fn_args)``: float64 path lengths (or squares) of shape (s, m) to the
        tile values (elementwise; cast to ``dtype``). ``P`` is a view of the task's buffer:
        the transform may overwrite it and return it. Picklable.
    stats_fn : callable
        ``stats_fn(tile)`` of every upper tile, returned in ``grid.upper()`` order.
    square : bool
        Give ``transform`` squared lengths (squared in float64).
    dtype : dtype
        Storage type of the tiles.
    precision : dtype
        The least dtype of the products (:class:`~dr_dask.linalg.tiles.TiledSymmetric`).
    client : distributed.Client, optional
    store : Location or str, optional
        Zarr tile array (local path or URL) to write the tiles into, reopened on a rerun.

    Returns
    -------
    (TiledSymmetric, list of stats in ``grid.upper()`` order)

    Raises
    ------
    ValueError
        If the graph is disconnected.
    """
    graph = _as_csr(graph)
    if graph.shape[0] != grid.size:
        raise ValueError(f"graph has {graph.shape[0]} nodes but the grid {grid.size}")
    logger.info("Dijkstra into %d upper strips over %d nodes", grid.n_blocks, grid.size)
    return strip_tiles(_upper_strip, _SearchGraph.of(graph), grid,
                       (square, transform, fn_args, stats_fn, np.dtype(dtype)), dtype=dtype,
                       precision=precision, client=client, store=store)


@overload
def shortest_paths(graph: sp.spmatrix, sources: np.ndarray | None = None, *, client: Any = None,
                   block_size: int = 256, out: None = None,
                   dtype: Any = np.float64) -> np.ndarray: ...
@overload
def shortest_paths(graph: sp.spmatrix, sources: np.ndarray | None = None, *, client: Any = None,
                   block_size: int = 256, out: zarr.Array | str | Location,
                   dtype: Any = np.float64) -> zarr.Array: ...
def shortest_paths(
    graph: sp.spmatrix,
    sources: np.ndarray | None = None,
    *,
    client: Any = None,
    block_size: int = 256,
    out: zarr.Array | str | Location | None = None,
    dtype: Any = np.float64,
) -> np.ndarray | zarr.Array:
    """Shortest-path distances from ``sources`` to every node, Dijkstra over source blocks.

    Parameters
    ----------
    graph : sparse matrix of shape (T, T)
        Non-negative edge weights, treated as undirected.
    sources : ndarray of shape (S,), optional
        Source nodes (default: all, giving the T x T geodesic matrix).
    client : distributed.Client, optional
        The graph is sent once to each worker; each task handles one block of sources.
    block_size : int
        Sources per task.
    out : zarr.Array, str or Location, optional
        Write the rows block by block into this Zarr array (or a new one at this path or URL)
        from the workers; nothing S x T is held in the driver.
    dtype : dtype
        Output dtype.

    Returns
    -------
    ndarray of shape (S, T), or the zarr.Array when ``out`` is given.

    Raises
    ------
    ValueError
        If some node is unreachable (the graph is disconnected): never silent infinities.
    """
    rows = GeodesicRows.compute(graph, sources, client=client, block_size=block_size,
                                dtype=dtype, out=out)
    if out is None:
        return rows.gather(dtype)
    assert rows.store is not None  # compute opened (or created) it from `out`
    return rows.store


def geodesics_via_neighbors(
    dist_to_nbrs: np.ndarray,
    nbr_idx: np.ndarray,
    geodesic_rows: np.ndarray,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Geodesics of new points through their graph neighbours.

    ``g[q, i] = min_j (dist_to_nbrs[q, j] + geodesic_rows[nbr_idx[q, j], i])``.

    Parameters
    ----------
    dist_to_nbrs : ndarray of shape (Q, k)
        Distances (or edge weights) from each new point to its neighbours; ``inf`` marks padding.
    nbr_idx : ndarray of shape (Q, k)
        Row indices into ``geodesic_rows`` (a batch of rows, e.g. the unique neighbours).
    geodesic_rows : ndarray of shape (n_batch, n_cols)
        Geodesics from those neighbours to the n_cols targets.
    out : ndarray of shape (Q, n_cols), float64, C-contiguous, optional
        Where to write the result: hot loops reuse one buffer instead of allocating per call.

    Returns
    -------
    ndarray of shape (Q, n_cols), float64
    """
    dist_to_nbrs = np.asarray(dist_to_nbrs, dtype=np.float64)
    nbr_idx = np.asarray(nbr_idx)
    if dist_to_nbrs.shape != nbr_idx.shape or dist_to_nbrs.ndim != 2:
        raise ValueError(f"dist_to_nbrs {dist_to_nbrs.shape} and nbr_idx {nbr_idx.shape} must "
                         "be equal (Q, k)")
    rows = np.ascontiguousarray(geodesic_rows)
    shape = (dist_to_nbrs.shape[0], rows.shape[1])
    if out is None:
        out = np.empty(shape, dtype=np.float64)
    elif out.shape != shape or out.dtype != np.float64 or not out.flags.c_contiguous:
        raise ValueError(f"out must be a C-contiguous float64 array of shape {shape}")
    _min_plus(dist_to_nbrs, nbr_idx.astype(np.int64, copy=False), rows, out)
    return out


@numba.njit(cache=True, nogil=True)
def _min_plus(dist: np.ndarray, idx: np.ndarray, rows: np.ndarray, out: np.ndarray) -> None:
    """The min-plus product of the mapping hot path, fused: no (Q, k, n) temporary, one sweep
    over each neighbour row. Serial on purpose: dask already runs chunks in parallel, and
    numba's parallel layer must not be entered from several dask threads at once."""
    n = rows.shape[1]
    for q in range(dist.shape[0]):
        o = out[q]
        o[:] = np.inf
        for j in range(dist.shape[1]):
            d, r = dist[q, j], idx[q, j]
            if r < 0 or not np.isfinite(d):
                continue  # padding
            row = rows[r]
            for i in range(n):  # branch-free so it vectorises
                o[i] = min(o[i], d + row[i])
