"""Shortest paths over blocks of sources on the workers, and out-of-sample geodesics.

The graph (T*k edges, small) is sent to every worker once, as a task result dask can recompute; each task runs
``scipy.sparse.csgraph.dijkstra(indices=block)`` for a block of sources. The resulting row blocks
stay where they were computed (:class:`GeodesicRows`): on the workers as futures, in this
process, or in a Zarr array written by the workers. Callers then run reductions and products
over the blocks (:meth:`GeodesicRows.map`) without ever gathering a T x T matrix.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
import scipy.sparse as sp
import zarr
from scipy.sparse.csgraph import dijkstra

from dr_dask.cluster import active_client, gather, share, wait_for
from dr_dask.storage import location

logger = logging.getLogger(__name__)

#: Upper bound on one task's float64 Dijkstra output, which bounds worker memory per task.
_TASK_BYTES = 1 << 27


def _is_symmetric(graph: sp.csr_matrix) -> bool:
    diff = graph - graph.T
    return diff.nnz == 0 or bool(np.abs(diff.data).max() == 0)


def _dijkstra_block(
    graph: sp.csr_matrix, sources: np.ndarray, directed: bool, square: bool, dtype: Any
) -> np.ndarray:
    D = dijkstra(graph, directed=directed, indices=sources)
    unreachable = np.isinf(D)
    if unreachable.any():
        r = int(np.flatnonzero(unreachable.any(axis=1))[0])
        raise ValueError(
            f"the graph is disconnected: source node {int(sources[r])} cannot reach "
            f"{int(unreachable[r].sum())} of {D.shape[1]} nodes. Repair it first "
            "(dr_dask.graph.connect_components) or increase n_neighbors"
        )
    if square:
        np.multiply(D, D, out=D)
    return D.astype(dtype, copy=False)


def dijkstra_rows(graph: sp.csr_matrix, sources: np.ndarray, *, directed: bool = False,
                  square: bool = False, dtype: Any = np.float64) -> np.ndarray:
    """Geodesic rows of ``sources`` in this process, shape (len(sources), n_nodes).

    For a few rows next to the caller's data (e.g. a new point's neighbours); many rows go
    through :func:`shortest_paths` on the workers. ``square`` gives squared geodesics. Raises
    ``ValueError`` naming a source that cannot reach every node (a disconnected graph).
    """
    return _dijkstra_block(graph, np.asarray(sources), directed, square, dtype)


def _dijkstra_to_store(
    graph: sp.csr_matrix, sources: np.ndarray, directed: bool, square: bool, dtype: Any,
    store: zarr.Array, start: int,
) -> tuple:
    store[start : start + len(sources)] = _dijkstra_block(graph, sources, directed, square, dtype)
    return ("zarr", store, start, start + len(sources))


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


def _materialise(block: Any) -> np.ndarray:
    if isinstance(block, tuple) and block and block[0] == "zarr":
        _, store, s, e = block
        return read_stored(store, slice(s, e))
    return block


def _apply(block: Any, func: Callable, start: int, args: tuple) -> Any:
    return func(_materialise(block), start, *args)


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

    @classmethod
    def compute(
        cls,
        graph: sp.spmatrix,
        sources: np.ndarray | None = None,
        *,
        client: Any = None,
        block_size: int = 256,
        dtype: Any = np.float64,
        square: bool = False,
        out: Any = None,
    ) -> GeodesicRows:
        """Run Dijkstra from every source, blockwise, on the cluster.

        Parameters
        ----------
        graph : sparse matrix of shape (T, T)
            Non-negative weights; treated as undirected.
        sources : ndarray of shape (S,), optional
            Source nodes (default all T).
        client : distributed.Client, optional
        block_size : int
            Sources per task (capped so one task's float64 output stays near 128 MB; aligned
            to ``out``'s row chunks so that no two tasks write the same chunk).
        dtype : dtype
            Storage type of the rows (float32 halves memory for L x T landmark rows).
        square : bool
            Store squared distances (Isomap's D^2), squared in float64 before the cast.
        out : zarr.Array, str or Location, optional
            Zarr array, or local path / URL (a :class:`~dr_dask.storage.Location` carries
            storage options) of a new array, that the workers write the rows into.
        """
        graph = sp.csr_matrix(graph, dtype=np.float64)
        T = graph.shape[0]
        if graph.shape != (T, T):
            raise ValueError(f"graph must be square, got shape {graph.shape}")
        if graph.nnz and graph.data.min() < 0:
            raise ValueError("graph has negative edge weights; Dijkstra needs non-negative ones")
        sources = np.arange(T) if sources is None else np.asarray(sources, dtype=np.int64)
        if sources.ndim != 1 or (sources.size and (sources.min() < 0 or sources.max() >= T)):
            raise ValueError(f"sources must be node indices in [0, {T})")
        bs = max(1, min(int(block_size), _TASK_BYTES // (8 * T)))
        store = None
        if out is not None:
            store = _open_out(out, (len(sources), T), bs, dtype)
            c = store.chunks[0]
            bs = c * max(1, bs // c)
        # scipy symmetrises an undirected graph inside every call; ours are usually symmetric
        directed = _is_symmetric(graph)
        bounds = [*range(0, len(sources), bs), len(sources)]
        client = active_client(client)
        logger.info("Dijkstra from %d sources over %d nodes in %d blocks", len(sources), T,
                    len(bounds) - 1)
        if client is None:
            blocks = []
            for s, e in zip(bounds[:-1], bounds[1:]):
                if store is None:
                    blocks.append(_dijkstra_block(graph, sources[s:e], directed, square, dtype))
                else:
                    blocks.append(_dijkstra_to_store(graph, sources[s:e], directed, square,
                                                     dtype, store, s))
        else:
            g = share(graph, client)
            if store is None:
                blocks = [client.submit(_dijkstra_block, g, sources[s:e], directed, square, dtype)
                          for s, e in zip(bounds[:-1], bounds[1:])]
            else:
                blocks = [client.submit(_dijkstra_to_store, g, sources[s:e], directed, square,
                                        dtype, store, s)
                          for s, e in zip(bounds[:-1], bounds[1:])]
            # surface a disconnected graph (or any failure) now, not at first use; waits for all.
            # Row blocks held on the workers stay futures: recomputed from the graph if lost
            wait_for(blocks, client)
            for f in blocks:
                if f.status == "error":
                    f.result()
            if store is not None:
                blocks = gather(blocks, client)
                client = None  # the handles are plain Zarr slices now
        return cls((len(sources), T), bounds, blocks, client, store, dtype)

    def map(self, func: Callable, *args: Any) -> list:
        """``[func(block, start, *args) for each row block]``, run where the blocks live.

        ``func`` must be a picklable module-level function; large ``args`` are sent once.
        """
        spans = self.bounds[:-1]
        if self.client is None:
            return [_apply(b, func, s, args) for b, s in zip(self.blocks, spans)]
        shared = tuple(share(a, self.client) if isinstance(a, np.ndarray) and a.nbytes > 1 << 20
                       else a for a in args)
        futures = [self.client.submit(_apply, b, func, s, shared, pure=False)
                   for b, s in zip(self.blocks, spans)]
        return gather(futures, self.client)

    def gather(self, dtype: Any = None) -> np.ndarray:
        """All rows as one in-memory array (only for moderate sizes)."""
        out = np.empty(self.shape, dtype=dtype or self.dtype)
        for s, e, b in zip(self.bounds[:-1], self.bounds[1:], self.blocks):
            # one block at a time, and never waiting forever on a cluster that is gone
            out[s:e] = _materialise(gather([b], self.client)[0] if self.client else b)
        return out

    def release(self) -> None:
        """Drop the blocks (frees worker memory when they are futures)."""
        self.blocks = []


def shortest_paths(
    graph: sp.spmatrix,
    sources: np.ndarray | None = None,
    *,
    client: Any = None,
    block_size: int = 256,
    out: Any = None,
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
    return rows.store if out is not None else rows.gather(dtype)


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
