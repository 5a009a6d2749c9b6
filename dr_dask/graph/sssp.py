"""Shortest paths in one process: the compiled kernels every shortest-path task runs.

A graph is prepared once (:class:`SearchGraph`: both directions of every edge, nodes relabelled
in reverse Cuthill-McKee order); :func:`lane_batches` then runs Dijkstra's heap search for the
first source and Gauss-Seidel Bellman-Ford sweeps carrying many sources at once for the rest.
:func:`dijkstra_rows` is the public entry point: equal to
``scipy.sparse.csgraph.dijkstra(graph, directed=False, indices=sources)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numba
import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import reverse_cuthill_mckee

from dr_dask.linalg.tiles import even_width
from dr_dask.runtime.buffers import thread_buffer

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SearchGraph:
    """An undirected graph prepared for :func:`lane_batches`: CSR arrays whose out-edges are
    all its edges, nodes relabelled in reverse Cuthill-McKee order (neighbours get nearby
    labels, so a search touches nearby memory, faster on kNN graphs), and ``rank``
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
    def of(cls, graph: sp.csr_matrix, symmetric: bool = False) -> SearchGraph:
        """``graph``'s search arrays; ``symmetric``: the caller knows that every edge is in
        it both ways with one weight (a stored graph's rows), so the check, which builds the
        transpose and the difference, is skipped."""
        if not symmetric and not _symmetric(graph):
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
        # relabelled in place, a slice at a time: take buffers an output that overlaps its
        # input, and a whole-array buffer was a copy of every edge's column at the peak
        labels, step = rank.astype(g.indices.dtype), 1 << 20
        for a in range(0, len(g.indices), step):
            np.take(labels, g.indices[a:a + step], out=g.indices[a:a + step], mode="clip")
        return cls(g.indptr, g.indices, g.data, rank)


def _symmetric(graph: sp.csr_matrix) -> bool:
    """Every edge of ``graph`` is in it both ways, with one weight, and none is zero."""
    diff = graph - graph.T  # blind to explicit zeros, whose mirror may be missing
    return not (diff.nnz and np.abs(diff.data).max()) and bool(graph.data.all())


@numba.njit(cache=True, nogil=True)
def _search(indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray, source: int,
            dist: np.ndarray, keys: np.ndarray, nodes: np.ndarray) -> int:
    """Dijkstra from ``source`` into ``dist`` (relabelled nodes), the heap in ``keys`` and
    ``nodes``. Returns the number of nodes reached, or -1 when the heap is full (the arrays
    are never reallocated here: growing them in this loop made it slower)."""
    dist[:] = np.inf
    dist[source] = 0.0
    keys[0], nodes[0] = 0.0, source
    return _drain(indptr, indices, weights, dist, keys, nodes, 1)


@numba.njit(cache=True, nogil=True)
def _push(keys: np.ndarray, nodes: np.ndarray, n: int, key: float, v: int) -> None:
    """Put ``(key, v)`` into the 4-ary heap of ``n`` entries (room for one more)."""
    i = n
    while i:
        parent = (i - 1) >> 2
        if keys[parent] <= key:
            break
        keys[i], nodes[i], i = keys[parent], nodes[parent], parent
    keys[i], nodes[i] = key, v


@numba.njit(cache=True, nogil=True)  # one compiled loop on purpose
def _drain(  # noqa: C901  (the heap's pop, sift and relax inlined: one compiled loop)
        indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray, dist: np.ndarray,
        keys: np.ndarray, nodes: np.ndarray, n: int) -> int:
    """Dijkstra from the ``n`` entries of the heap (``dist`` holds upper bounds, the heap's
    entries among them): pops until the heap is empty, relaxing edges. Returns the nodes
    settled, or -1 when the heap is full."""
    reached = 0
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
                _push(keys, nodes, n, nd, v)
                n += 1
    return reached


@numba.njit(cache=True, nogil=True)  # one compiled loop on purpose
def seeded_lanes(  # noqa: C901  (every lane's heap inlined: one compiled loop)
                 indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray,
                 lanes: np.ndarray, seeded: np.ndarray, moved: np.ndarray) -> int:
    """Dijkstra in every lane of ``lanes`` (n, S) from the nodes ``seeded`` (n, S) there,
    whose values were lowered since ``lanes`` was last closed under the edges (a closed lane
    stays closed elsewhere): afterwards no edge shortens any lane. ``moved[u]`` is set where a
    lane of ``u`` fell (the seeds included). Returns the nodes settled, over all lanes.

    The searches of a partitioned graph's blocks (:mod:`dr_dask.graph.block_paths`): the
    heap starts with the seeds only, so a round's work follows what changed in it.
    """
    n_nodes, S = lanes.shape
    dist = np.empty(n_nodes, lanes.dtype)
    before = np.empty(n_nodes, lanes.dtype)
    size = n_nodes + 1
    keys = np.empty(size, lanes.dtype)
    nodes = np.empty(size, dtype=np.int64)
    work = 0
    for c in range(S):
        n = 0
        for u in range(n_nodes):
            n += seeded[u, c]
        if not n:
            continue
        for u in range(n_nodes):
            before[u] = lanes[u, c]
        while True:
            if len(keys) < n + 1:
                keys = np.empty(2 * (n + 1), lanes.dtype)
                nodes = np.empty(2 * (n + 1), dtype=np.int64)
            for u in range(n_nodes):  # element-wise: see _heap_lanes
                dist[u] = before[u]
            m = 0
            for u in range(n_nodes):
                if seeded[u, c]:
                    _push(keys, nodes, m, dist[u], u)
                    m += 1
            settled = _drain(indptr, indices, weights, dist, keys, nodes, m)
            if settled >= 0:
                break
            keys = np.empty(2 * len(keys), lanes.dtype)
            nodes = np.empty(2 * len(nodes), dtype=np.int64)
        work += settled
        for u in range(n_nodes):
            if seeded[u, c] or dist[u] < before[u]:
                moved[u] = True
            lanes[u, c] = dist[u]
    return work


@numba.njit(cache=True, nogil=True)
def _heap_lanes(indptr: np.ndarray, indices: np.ndarray, weights: np.ndarray,
                labels: np.ndarray, lanes: np.ndarray, first_lane: int) -> tuple:
    """Dijkstra from each source (by its label) into its column of ``lanes`` (T, S) from
    ``first_lane`` on, nodes in label order, summed in ``lanes``' dtype. ``lanes`` is a whole
    batch, never a column slice of one: a slice is typed by whether it happens to be
    contiguous, and each layout is a kernel of its own to compile.

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
        # element-wise: an array assigned to a slice makes numba compile its shape check's
        # error message (string formatting), a second or two on the first call after install
        for v in range(T):
            lanes[v, first_lane + r] = dist[v]
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


#: Nodes whose lanes :func:`_lanes_to_rows` gathers at once: a block of 2 MB at 64 float64
#: lanes, which stays in cache while it is transposed into the rows.
GATHER_NODES = 4096


def _lanes_to_rows(lanes: np.ndarray, m: int, rank: np.ndarray, out: np.ndarray,
                   square: bool) -> None:
    """``out[r, i]`` = lane r < m of node ``rank[i]`` (squared in float64 if ``square``).

    The nodes' lanes are gathered a block at a time (``np.take`` copies each node's lanes
    with many reads in flight) and the block transposed into ``out``: faster than a compiled
    loop reading one node's lanes after another, whose random reads wait on memory one at a
    time (docs/scaling.md, "Measurements behind the code's thresholds"). ``lanes``
    must be C-contiguous (all its padded lanes, of which the first m count): ``np.take``
    copies a strided array whole before each gather, 2.5 GB a call at T = 10^7 with 63 of 64
    lanes, which made writing a task's rows take half an hour instead of seconds.
    """
    assert lanes.flags.c_contiguous  # else np.take copies it whole at every call
    for a in range(0, len(rank), GATHER_NODES):
        nodes = rank[a:a + GATHER_NODES]
        # mode="clip" (the labels are in range): with the default "raise" numpy buffers ``out``
        block = np.take(lanes, nodes, axis=0, mode="clip",
                        out=thread_buffer("gathered_lanes", (len(nodes), lanes.shape[1]),
                                          lanes.dtype))[:, :m]
        if square:
            block = block.astype(np.float64)
            np.multiply(block, block, out=block)
        out[:, a:a + len(block)] = block.T


def seeded_sweeps(graph: SearchGraph, lanes: np.ndarray, seeded: np.ndarray,
                  moved: np.ndarray) -> int:
    """:func:`seeded_lanes` by Gauss-Seidel sweeps over all lanes at once (as
    :func:`_sweep_lanes`, from the seeds' current values rather than from sources): the nodes
    next to a seed are recomputed first, then whatever changed spreads until a pair of passes
    changes nothing. Returns the nodes recomputed."""
    n = lanes.shape[0]
    stamp = np.zeros(n, dtype=np.int64)
    seen = np.zeros(n, dtype=np.int64)
    stamp[seeded.any(axis=1)] = now = 1
    work = 0
    while True:
        forward, now = _sweep(graph.indptr, graph.indices, graph.weights, lanes, stamp, seen,
                              now, False)
        backward, now = _sweep(graph.indptr, graph.indices, graph.weights, lanes, stamp, seen,
                               now, True)
        work += forward + backward
        if not forward + backward:
            moved |= stamp > 0
            return work


#: Sources one sweep search carries (at most): each node holds a row of up to LANES distances,
#: read whole for each of its neighbours (fewer lanes pay the passes' fixed costs for less: at
#: 16 they beat the heap on the sinusoid by 1.7x, at 8 they lose).
LANES = 64
MIN_LANES = 16
#: The clock of that comparison: this thread's CPU time, so that the time the OS gives to other
#: threads and processes (dask's other thread, a LocalCluster's other worker, the client) is
#: charged to neither side. On wall-clock time a preempted pass lost to the heap at random and
#: left the rest of its graph's searches on the heap: in 2 of 8 all-pairs calls at T = 10^4 on
#: the sinusoid (2 threads on 2 cores), in none of 8 on CPU time.
_clock = time.thread_time
#: The sweeps are abandoned for the heap once they have cost as much as the heap searches they
#: replace (then, for the rest of that graph's searches in this process). Not less: on large
#: graphs they cost a large share of the heap's time and converge in passes whose last ones
#: change almost nothing, so a smaller budget stops them just before the end.
SWEEP_BUDGET = 1.0



def _sweep_lanes(graph: SearchGraph, labels: np.ndarray, lanes: np.ndarray, first: int,
                 deadline: float, passes: list[tuple[int, float]]) -> bool:
    """Shortest paths from every source at once by Gauss-Seidel Bellman-Ford sweeps
    (Bertsekas 1998, "Network Optimization", Section 2.3): forward and backward passes over the
    nodes in their reverse Cuthill-McKee order until a pair of passes changes nothing. Exact,
    and bit for bit Dijkstra's distances (both give the least rounded path sum). Lanes before
    ``first`` hold final distances already. Returns False, with ``lanes`` incomplete, when
    past ``deadline``. Appends each pass's nodes recomputed and seconds to ``passes`` (on
    :data:`_clock`, as the heap's time they are weighed against): what tells a slower machine
    from more passes (``dr-dask bench dijkstra --graph``)."""
    T = graph.n_nodes
    lanes[:, first:] = np.inf
    lanes[labels[first:], np.arange(first, len(labels))] = 0.0
    stamp = np.zeros(T, dtype=np.int64)  # when a node's distances last fell
    seen = np.zeros(T, dtype=np.int64)  # when a node was last recomputed
    stamp[labels[first:]] = now = 1
    while True:
        work = 0
        for backward in (False, True):
            started = _clock()
            nodes, now = _sweep(graph.indptr, graph.indices, graph.weights, lanes, stamp, seen,
                                now, backward)
            work += nodes
            passes.append((int(nodes), _clock() - started))
        if not work:
            return True
        if _clock() > deadline:
            return False


def _heap(graph: SearchGraph, sources: np.ndarray, labels: np.ndarray,
          lanes: np.ndarray, first_lane: int) -> None:
    bad, missing = _heap_lanes(graph.indptr, graph.indices, graph.weights, labels, lanes,
                               first_lane)
    if bad >= 0:
        raise disconnected(int(sources[bad]), missing, graph.n_nodes)


def disconnected(source: int, missing: int, n_nodes: int) -> ValueError:
    """The error of a source that cannot reach ``missing`` of the ``n_nodes`` nodes."""
    return ValueError(
        f"the graph is disconnected: source node {source} cannot reach {missing} of "
        f"{n_nodes} nodes. Repair it first (dr_dask.graph.connect_components) or increase "
        "n_neighbors"
    )


def lane_batches(graph: SearchGraph, sources: np.ndarray, dtype: Any, kept: bool = False,
                 record: list | None = None) -> Iterator[tuple[int, int, np.ndarray]]:
    """Shortest paths from ``sources``, in batches of up to ``LANES`` of equal width: yields
    ``(offset, n, lanes)``, the distances from ``sources[offset:offset + n]`` as the first n
    columns of ``lanes`` (T, n or more: padded to whole cache lines, C-contiguous), nodes in
    label order. With ``kept``, every batch's lanes are this thread's kept buffer
    (:mod:`dr_dask.runtime.buffers`), valid until the next batch: for a caller that is done
    with a batch before it takes the next. With ``record``, each batch appends what it cost:
    ``{"sources", "heap_seconds" (the first source's, None after), "passes"}`` (each sweep
    pass's nodes recomputed and seconds), all on :data:`_clock`.

    The first source runs Dijkstra's heap search, which also proves the graph connected and
    times a search; the rest run as :func:`_sweep_lanes`, which on kNN graphs whose node order
    follows the manifold converge in a few pairs of passes, faster than the heap per source,
    but on others may need dozens, slower (docs/scaling.md, "Measurements behind the code's
    thresholds"), so they give up at ``SWEEP_BUDGET`` of the heap's
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
        lanes = _lanes(graph.n_nodes, m, dtype, whole_lines=sweeps, kept=kept)
        done = 0
        passes: list[tuple[int, float]] = []
        if first:
            started = _clock()
            _heap(graph, sources[:1], batch[:1], lanes, 0)
            per_source, done = _clock() - started, 1
        if record is not None:
            record.append({"sources": m, "heap_seconds": per_source if first else None,
                           "passes": passes})
        if sweeps:
            # the padding lanes repeat the last source
            padded = np.concatenate([batch, np.repeat(batch[-1], lanes.shape[1] - m)])
            deadline = _clock() + SWEEP_BUDGET * per_source * (m - done)
            if _sweep_lanes(graph, padded, lanes, done, deadline, passes):
                done = m
            else:
                graph.hint["heap"] = True
                logger.info("shortest paths: the sweeps lost to the heap on this graph")
        if done < m:
            _heap(graph, sources[a + done:a + m], batch[done:], lanes, done)
        yield a, m, lanes


def _lanes(T: int, m: int, dtype: Any, whole_lines: bool, kept: bool = False) -> np.ndarray:
    """An uninitialised (T, m) lanes array (in this thread's kept buffer if ``kept``); with
    ``whole_lines``, m padded to whole 64-byte cache lines and each node's lanes starting on
    one. A sweep reads a neighbour's lanes for every edge, from memory once T is large: 31
    float32 lanes (124 bytes, from anywhere in a line) span 2.9 lines on average, 32 lanes
    from a line's start span 2."""
    def empty(size: int) -> np.ndarray:
        return thread_buffer("lanes", (size,), dtype) if kept else np.empty(size, dtype)

    if not whole_lines:
        return empty(T * m).reshape(T, m)
    per_line = 64 // np.dtype(dtype).itemsize
    width = -(-m // per_line) * per_line
    buf = empty(T * width + per_line)
    skip = (-buf.ctypes.data // buf.itemsize) % per_line  # buffers are itemsize-aligned
    return buf[skip:skip + T * width].reshape(T, width)


def lanes_dtype(weights: Any, dtype: Any) -> np.dtype:
    """The lanes' dtype for ``weights`` (the graph's weights dtype) and rows of ``dtype``: sums
    in float32 when both are float32 (a stored graph's landmark rows), else in float64."""
    return np.result_type(weights, dtype)



def dijkstra_rows(graph: sp.spmatrix, sources: np.ndarray, *, square: bool = False,
                  dtype: Any = np.float64) -> np.ndarray:
    """Shortest-path lengths from ``sources`` to every node of an undirected graph.

    The single-process kernel under :class:`GeodesicRows`: equal to
    ``scipy.sparse.csgraph.dijkstra(graph, directed=False, indices=sources)`` (every stored
    entry is an edge, explicit zeros too), faster (a 4-ary heap, not a Fibonacci heap, and
    sweeps over many sources at once, :func:`lane_batches`, over nodes relabelled for
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
    graph = as_csr(graph)
    sources = np.asarray(sources, dtype=np.int64).ravel()
    if sources.size and (sources.min() < 0 or sources.max() >= graph.shape[0]):
        raise ValueError(f"sources must be node indices in [0, {graph.shape[0]})")
    return search_rows(SearchGraph.of(graph), sources, square, dtype)



def search_rows(graph: SearchGraph, sources: np.ndarray, square: bool, dtype: Any,
                out: np.ndarray | None = None) -> np.ndarray:
    """:func:`dijkstra_rows` over a prepared graph, into ``out`` (of shape (S, T)) if given."""
    if out is None:
        out = np.empty((len(sources), graph.n_nodes), dtype=dtype)
    batches = lane_batches(graph, np.asarray(sources, dtype=np.int64),
                           lanes_dtype(graph.weights.dtype, out.dtype), kept=True)
    return batches_to_rows(batches, graph.rank, out, square)


def batches_to_rows(batches: Iterable[tuple[int, int, np.ndarray]], rank: np.ndarray,
                     out: np.ndarray, square: bool) -> np.ndarray:
    """``out`` (S, len(rank)): the distances of :func:`lane_batches`' ``batches`` to the nodes
    of label ``rank``, in that order."""
    for a, m, lanes in batches:
        _lanes_to_rows(lanes, m, rank, out[a:a + m], square)
    return out



def as_csr(graph: sp.spmatrix) -> sp.csr_matrix:
    graph = sp.csr_matrix(graph, dtype=np.float64)
    if graph.shape[0] != graph.shape[1]:
        raise ValueError(f"graph must be square, got shape {graph.shape}")
    if graph.nnz and not graph.data.min() >= 0:  # also refuses NaN
        raise ValueError("graph has negative or NaN edge weights; Dijkstra needs non-negative "
                         "ones")
    return graph
