"""The search graph in a Zarr store, opened by the shortest-path tasks where they run.

Stored by blocks of consecutive nodes, so that the tasks that write it (one per block of the
partitioned graph) and the tasks that read it (one per block of the paths) each touch their
own chunks: block ``b`` holds nodes ``node0[b]`` to ``node0[b + 1]``, its row pointers (from 0)
and its nodes' row indices at ``ptr_at[b]`` of ``indptr`` and ``ids``, its edges at
``data_at[b]`` of ``indices`` (node numbers) and ``weights``. Regions start on chunk
boundaries. The few edges that bridge components are kept apart (``bridges``: node pairs and
weights, one direction) and joined to the rows as they are read.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import zarr

from dr_dask.graph.sssp import SearchGraph
from dr_dask.io.storage import Location, location, read_spans

#: Per node (``indptr`` has one more per block), and per edge.
_NODE_ARRAYS = ("indptr", "ids")
_EDGE_ARRAYS = ("indices", "weights")


@dataclass(frozen=True)
class StoredGraph:
    """A search graph in Zarr (see the module), which the shortest-path tasks open where they
    run, so that it reaches the workers from the store rather than from the client, and a task
    rerun after a worker loss reopens it. One block in one chunk (:meth:`write`, an in-memory
    graph) is memory-mapped from a local store: the workers of one machine share one copy in
    the page cache."""

    location: Location
    n_nodes: int
    node0: tuple[int, ...] = ()
    ptr_at: tuple[int, ...] = ()
    data_at: tuple[int, ...] = ()

    @classmethod
    def write(cls, graph: SearchGraph, where: Any) -> StoredGraph:
        """Store a prepared graph in one block of single chunks (its nodes keep its labels)."""
        loc = location(where)
        T = graph.n_nodes
        ids = np.empty(T, dtype=np.int64)
        ids[graph.rank] = np.arange(T)  # label -> row index
        arrays = {"indptr": np.asarray(graph.indptr, np.int64), "ids": ids,
                  "indices": graph.indices, "weights": graph.weights}
        root = cls.create(loc, T + 1, len(graph.indices), graph.indices.dtype,
                          graph.weights.dtype, None)
        for name, a in arrays.items():
            arr = root[name]
            assert isinstance(arr, zarr.Array)  # create made every name an array
            arr[:len(a)] = np.ascontiguousarray(a)
        return cls.finish(loc, [0, T], [0], [0], _no_bridges(graph.weights.dtype))

    @staticmethod
    def create(loc: Location, n_ptr: int, n_edges: int, index_dtype: Any, weight_dtype: Any,
               chunk: int | None) -> zarr.Group:
        """The empty arrays of a graph at ``loc``: ``n_ptr`` entries of pointers and ids (each
        block's pointers count its nodes plus one), ``n_edges`` edges; one chunk each, or
        chunks of ``chunk`` entries (the unit the writers' regions start on)."""
        root = zarr.open_group(loc.zarr_store(), mode="w")
        for name, n, dtype in (("indptr", n_ptr, np.int64), ("ids", n_ptr, np.int64),
                               ("indices", n_edges, index_dtype),
                               ("weights", n_edges, weight_dtype)):
            n = max(1, n)
            root.create_array(name, shape=(n,), dtype=dtype, compressors=None,
                              chunks=(min(n, chunk or n),))
        return root

    @classmethod
    def finish(cls, loc: Location, node0: Any, ptr_at: Any, data_at: Any,
               bridges: tuple[np.ndarray, np.ndarray, np.ndarray]) -> StoredGraph:
        """Record the blocks and the bridges (last: the graph is complete)."""
        a, b, w = bridges
        root = zarr.open_group(loc.zarr_store(), mode="a")
        root.create_array("bridges", data=np.column_stack(
            [a.astype(np.float64), b.astype(np.float64), w.astype(np.float64)]).reshape(-1, 3),
            overwrite=True)
        g = cls(loc, int(node0[-1]), tuple(int(x) for x in node0),
                tuple(int(x) for x in ptr_at), tuple(int(x) for x in data_at))
        root.attrs.update({"node0": list(g.node0), "ptr_at": list(g.ptr_at),
                           "data_at": list(g.data_at), "bridge_dtype": str(w.dtype)})
        return g

    @classmethod
    def at(cls, where: Any) -> StoredGraph:
        """The complete graph stored at ``where`` (its blocks, from the store)."""
        loc = location(where)
        attrs = dict(zarr.open_group(loc.zarr_store(read_only=True), mode="r").attrs)
        if "node0" not in attrs:
            raise ValueError(f"{loc}: no complete stored graph there")
        tables = [np.asarray(attrs[k], dtype=np.int64).tolist()
                  for k in ("node0", "ptr_at", "data_at")]
        node0, ptr_at, data_at = tables
        return cls(loc, node0[-1], tuple(node0), tuple(ptr_at), tuple(data_at))

    def _array(self, name: str) -> zarr.Array:
        return zarr.open_array(self.location.child(name).zarr_store(read_only=True), mode="r")

    @property
    def nbytes(self) -> int:
        """Bytes of the graph's arrays, from the store's metadata (nothing else is read)."""
        return sum(self._array(n).nbytes for n in (*_NODE_ARRAYS, *_EDGE_ARRAYS))

    @property
    def weights_dtype(self) -> np.dtype:
        """The weights' dtype, from the store's metadata (nothing else is read)."""
        return self._array("weights").dtype

    def bridges(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The bridging edges: node pairs (a, b) and weights, one direction."""
        e = np.asarray(self._array("bridges")[...]).reshape(-1, 3)
        return e[:, 0].astype(np.int64), e[:, 1].astype(np.int64), e[:, 2].astype(
            self.weights_dtype)

    def _spans(self, lo: int, hi: int) -> list[tuple[int, int, int]]:
        """The stored blocks under nodes ``[lo, hi)``: (block, first node, stop node)."""
        node0 = np.asarray(self.node0)
        first = int(np.searchsorted(node0, lo, side="right")) - 1
        out = []
        for b in range(first, len(node0) - 1):
            s, e = max(lo, node0[b]), min(hi, node0[b + 1])
            if s >= hi:
                break
            if e > s:
                out.append((b, int(s), int(e)))
        return out

    def rows(self, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows ``lo`` to ``hi`` (node numbers), bridges joined: their pointers from 0
        (hi - lo + 1), columns and weights, read from the store (about their own chunks)."""
        indptr, indices, weights = (self._array(n) for n in ("indptr", "indices", "weights"))
        ptrs, spans = [np.zeros(1, np.int64)], []
        for b, s, e in self._spans(lo, hi):
            p0 = self.ptr_at[b] + s - self.node0[b]
            ptr = np.asarray(indptr[p0:p0 + e - s + 1], np.int64)
            spans.append((self.data_at[b] + int(ptr[0]), self.data_at[b] + int(ptr[-1])))
            ptrs.append(ptr[1:] - ptr[0] + ptrs[-1][-1])
        ptr = np.concatenate(ptrs)
        col, wt = read_spans(indices, spans), read_spans(weights, spans)
        return _with_bridges(ptr, col, wt, lo, self.bridges())

    def labels(self, nodes: np.ndarray | None = None) -> np.ndarray:
        """The node number of row indices ``nodes``, or of every row (reads every block's
        row indices: T of them)."""
        ids = self._array("ids")
        rank = np.empty(self.n_nodes, dtype=np.int64)
        for b, s, e in self._spans(0, self.n_nodes):
            rank[np.asarray(ids[self.ptr_at[b]:self.ptr_at[b] + e - s])] = np.arange(s, e)
        return rank if nodes is None else rank[np.asarray(nodes, np.int64)]

    def to_csr(self) -> sp.csr_matrix:
        """The graph in memory, in the original node order (for inspection; large)."""
        g = self.open()
        labelled = sp.csr_matrix((np.asarray(g.weights, np.float64), np.asarray(g.indices),
                                  np.asarray(g.indptr)), shape=(self.n_nodes, self.n_nodes))
        return labelled[g.rank][:, g.rank].tocsr()  # node i is label rank[i]

    def open(self) -> SearchGraph:
        """The whole graph in this process (cached: one graph per process at a time)."""
        return _open_stored(self)


def _no_bridges(dtype: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, dtype)


def _with_bridges(ptr: np.ndarray, col: np.ndarray, wt: np.ndarray, lo: int,
                  bridges: tuple[np.ndarray, np.ndarray, np.ndarray]) -> tuple:
    """Rows from node ``lo`` (CSR ``ptr``, ``col``, ``wt``) with the bridges at their nodes
    appended to each row, both ways."""
    a, b, w = bridges
    n = len(ptr) - 1
    first, second = np.concatenate([a, b]), np.concatenate([b, a])
    mine = (first >= lo) & (first < lo + n)
    if not mine.any():
        return ptr, col, wt
    row = np.concatenate([np.repeat(np.arange(n), np.diff(ptr)), first[mine] - lo])
    order = np.argsort(row, kind="stable")
    col = np.concatenate([col, second[mine].astype(col.dtype)])[order]
    wt = np.concatenate([wt, np.concatenate([w, w])[mine].astype(wt.dtype)])[order]
    ptr = np.concatenate([[0], np.cumsum(np.bincount(row, minlength=n))])
    return ptr, col, wt


@functools.lru_cache(maxsize=1)  # one graph per process at a time: every task of a stage
def _open_stored(graph: StoredGraph) -> SearchGraph:
    loc = graph.location
    if len(graph.node0) == 2 and not len(graph.bridges()[0]):
        one = _mapped(loc, graph.n_nodes)
        if one is not None:
            return one
    ptr, col, wt = graph.rows(0, graph.n_nodes)
    csr = sp.csr_matrix((wt, col, ptr), shape=(graph.n_nodes,) * 2)
    g = SearchGraph.of(csr)  # relabelled for locality, from the stored node order
    rank = g.rank[graph.labels()]  # row index -> node -> label
    return SearchGraph(g.indptr, g.indices, g.weights, rank)


def _mapped(loc: Location, T: int) -> SearchGraph | None:
    """A graph of one block in single uncompressed chunks, memory-mapped from a local store
    (its nodes are its labels); None where it cannot be."""
    if not loc.is_local:
        return None
    arrays: dict[str, np.ndarray] = {}
    root = zarr.open_group(loc.zarr_store(read_only=True), mode="r")
    for name in (*_NODE_ARRAYS, *_EDGE_ARRAYS):
        arr = root[name]
        assert isinstance(arr, zarr.Array)
        chunk = os.path.join(loc.url, name, "c", "0")
        if not (os.path.exists(chunk) and os.path.getsize(chunk) == arr.nbytes
                and arr.dtype.byteorder in "<=|"):
            return None
        # the one chunk of an uncompressed array is its raw little-endian bytes
        arrays[name] = np.memmap(chunk, dtype=arr.dtype, mode="r", shape=arr.shape)
    rank = np.empty(T, dtype=np.int64)
    rank[arrays["ids"][:T]] = np.arange(T)
    indptr = arrays["indptr"][:T + 1]  # the one block's region (from 0) of padded arrays
    E = int(indptr[-1])
    return SearchGraph(indptr, arrays["indices"][:E], arrays["weights"][:E], rank)


def opened(graph: SearchGraph | StoredGraph) -> SearchGraph:
    return graph.open() if isinstance(graph, StoredGraph) else graph
