"""The prepared search graph in a Zarr store, opened by the shortest-path tasks where they run."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse as sp
import zarr

from dr_dask.graph.sssp import SearchGraph
from dr_dask.io.storage import Location, location

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
    def write(cls, graph: SearchGraph, where: Any) -> StoredGraph:
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

    def open(self) -> SearchGraph:
        return _open_stored(self.location)

    @property
    def weights_dtype(self) -> np.dtype:
        """The weights' dtype, from the store's metadata (nothing else is read)."""
        return zarr.open_array(self.location.child("weights").zarr_store(read_only=True),
                               mode="r").dtype


@functools.lru_cache(maxsize=1)  # one graph per process at a time: every task of a stage
def _open_stored(loc: Location) -> SearchGraph:
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
    return SearchGraph(arrays["indptr"], arrays["indices"], arrays["weights"], arrays["rank"])


def opened(graph: SearchGraph | StoredGraph) -> SearchGraph:
    return graph.open() if isinstance(graph, StoredGraph) else graph
