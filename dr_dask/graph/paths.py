"""Shortest paths over blocks of sources on the workers.

The graph (T*k edges) reaches every worker once: from a store (:class:`StoredGraph`, as the
partitioned graph of :mod:`dr_dask.graph.partitioned` is written, memory-mapped when local) or
as a task result dask can recompute; each task runs the compiled kernels of
:mod:`dr_dask.graph.sssp` for a block of sources. The resulting row blocks stay where they were
computed (:class:`GeodesicRows`): on the workers as futures, in this process, or in a Zarr array
written by the workers. Callers then run reductions and products over the blocks
(:meth:`GeodesicRows.map`) without ever gathering a T x T matrix.
"""

from __future__ import annotations

import itertools
import logging
import operator
from collections.abc import Callable
from typing import Any, overload

import numpy as np
import scipy.sparse as sp
import zarr
from distributed import Future

from dr_dask.graph.block_paths import batch_width, block_paths, out_chunks
from dr_dask.graph.sssp import (
    LANES,
    SearchGraph,
    as_csr,
    batches_to_rows,
    lane_batches,
    lanes_dtype,
    search_rows,
)
from dr_dask.graph.stored import StoredGraph, opened
from dr_dask.graph.stored_rows import NodeOrdered, StoredBlock, read_stored
from dr_dask.io.storage import Location, location
from dr_dask.linalg.tiles import strip_tiles
from dr_dask.runtime import config
from dr_dask.runtime.blas import single_blas_thread
from dr_dask.runtime.buffers import populated
from dr_dask.runtime.cluster import active_client, gather, map_local, share, thread_memory, wait_for

logger = logging.getLogger(__name__)
#: Upper bound on one task's rows plus its sweeps' lanes, which bounds worker memory per task:
#: a full batch of sweep lanes (``LANES``) up to a million float32 nodes. Past that, see
#: ``_sources_per_task``.
_TASK_BYTES = 1 << 29



def _rows(graph: SearchGraph | StoredGraph, sources: np.ndarray, square: bool, dtype: Any,
          out: np.ndarray | None = None) -> np.ndarray:
    """:func:`~dr_dask.graph.sssp.dijkstra_rows` over a prepared or stored graph (a task's
    work), into ``out`` (of shape (S, T)) if given."""
    return search_rows(opened(graph), sources, square, dtype, out)


def _rows_to_store(graph: SearchGraph | StoredGraph, sources: np.ndarray, square: bool, dtype: Any,
                   store: zarr.Array, start: int, columns: np.ndarray | None) -> tuple:
    """The rows from ``sources`` written to ``store[start:]`` a column chunk at a time, straight
    from the lanes: the task holds its lanes and one chunk, never a second copy of its rows.
    Returns the block's handle and its ``columns`` (None without), as stored."""
    graph = opened(graph)
    batches = list(lane_batches(graph, np.asarray(sources, dtype=np.int64),
                                 lanes_dtype(graph.weights.dtype, dtype)))

    def columns_of(nodes: np.ndarray) -> np.ndarray:
        return batches_to_rows(batches, graph.rank[nodes],
                                np.empty((len(sources), len(nodes)), dtype=store.dtype), square)

    step = store.chunks[1]
    for c in range(0, graph.n_nodes, step):
        store[start:start + len(sources), c:c + step] = columns_of(
            np.arange(c, min(c + step, graph.n_nodes)))
    return (("zarr", store, start, start + len(sources)),
            None if columns is None else columns_of(columns))



def _materialise(block: Any, by_columns: bool = False) -> Any:
    if isinstance(block, tuple) and block and block[0] == "zarr":
        _, store, s, e = block
        return StoredBlock(store, s, e) if by_columns else read_stored(store, slice(s, e))
    return block


def _columns(block: np.ndarray, start: int, columns: np.ndarray) -> np.ndarray:
    return block[:, columns]


def _apply(block: Any, func: Callable, start: int, args: tuple, by_columns: bool = False) -> Any:
    return func(_materialise(block, by_columns), start, *args)


def _sources_per_task(T: int, per_node: int, client: Any, one_batch: bool) -> int:
    """Sources per task such that what a task holds per source (``per_node`` bytes a node: its
    lanes, and its row unless written to a store) fits ``_TASK_BYTES``; where that is under
    ``LANES``, as many as a quarter of a worker thread's memory holds, up to ``LANES``: below
    ``MIN_LANES`` sources a task runs the heap alone, several times slower (docs/scaling.md,
    "Measurements behind the code's thresholds"). A task that writes a store holds all its
    lanes until it writes them: ``one_batch`` keeps it to one batch."""
    per_source = per_node * T
    n = _TASK_BYTES // per_source
    if n < LANES:
        n = max(n, min(LANES, thread_memory(client) // (4 * per_source)))
    return int(min(n, LANES) if one_batch else n)


def path_rows_array(out: Any, shape: tuple[int, int], rows_per_chunk: int,
                    columns_per_chunk: int, dtype: Any) -> zarr.Array:
    """The Zarr array of path rows at ``out`` (a location, made afresh), or ``out`` itself
    (a zarr array of that shape)."""
    if isinstance(out, zarr.Array):
        if tuple(out.shape) != shape:
            raise ValueError(f"out has shape {out.shape}, expected {shape}")
        return out
    # NaN fill: a chunk never written is detected (read_stored). Path lengths are never all
    # NaN, so zarr's check of each written chunk against the fill value would only cost the
    # workers' time (write_empty_chunks skips it), as compressing them would (float32 lengths
    # that zstd shrinks by about a tenth); docs/scaling.md has what each cost
    return zarr.create_array(
        store=location(out).zarr_store(), shape=shape, dtype=dtype, overwrite=True,
        chunks=(rows_per_chunk, min(shape[1], columns_per_chunk)), fill_value=np.nan,
        compressors=None, config={"write_empty_chunks": True},
        dimension_names=("sample", "sample_"),
    )


def by_blocks(graph: Any, choice: bool | None = None, client: Any = None) -> bool:
    """Whether the paths over ``graph`` run by row blocks (:mod:`dr_dask.graph.block_paths`):
    a stored graph that a task opening it whole could not hold, that is whose arrays and
    per-node search state (a heap and clocks, 32 bytes a node) pass
    ``dr_dask.graph.paths-graph-share`` of the memory a task may count on
    (:func:`~dr_dask.runtime.cluster.thread_memory`), or ``choice``. Below, a task opening
    the whole graph is faster (one search per source, no rounds)."""
    if not isinstance(graph, StoredGraph):
        return False
    if choice is not None:
        return bool(choice)
    whole = graph.nbytes + 32 * graph.n_nodes
    return whole > float(config.get("graph.paths-graph-share")) * thread_memory(client)


def _task_sources(T: int, weights: Any, dtype: Any, to_store: bool, block_size: int,
                  client: Any) -> int:
    """Sources per task: at most ``block_size``, and what :func:`_sources_per_task` allows for
    the task's lanes and, unless they go to a store, its rows."""
    per_node = (lanes_dtype(weights, dtype).itemsize
                + (0 if to_store else np.dtype(dtype).itemsize))
    return max(1, min(int(block_size), _sources_per_task(T, per_node, client,
                                                         one_batch=to_store)))


def _n_nodes(graph: sp.spmatrix | StoredGraph) -> int:
    return graph.n_nodes if isinstance(graph, StoredGraph) else int(graph.shape[0])


def _checked_sources(sources: np.ndarray | None, T: int) -> np.ndarray:
    """The sources as int64 node indices (None: every node)."""
    sources = np.arange(T) if sources is None else np.asarray(sources, dtype=np.int64)
    if sources.ndim != 1 or (sources.size and (sources.min() < 0 or sources.max() >= T)):
        raise ValueError(f"sources must be node indices in [0, {T})")
    return sources


class GeodesicRows:
    """Row blocks of a shortest-path matrix, held on the workers, in memory, or in Zarr.

    Build with :meth:`compute`. Attributes: ``shape`` (n_sources, T), ``bounds`` (block row
    offsets), ``blocks`` (futures, ndarrays or Zarr handles), ``client``, ``store`` (the Zarr
    array or None), ``dtype``, ``report`` (the rounds of paths run by blocks).

    Rows computed by blocks (:func:`by_blocks`) hold their columns in the stored graph's node
    order (``order``: node ``i`` is column ``order[i]``): :meth:`columns`, :meth:`map_sum`
    (whose terms are per column, first axis) and :meth:`gather` return them in node order;
    :meth:`map`'s ``func`` and ``store`` see the stored order.
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
        self.report: dict = {}
        self._order: np.ndarray | None = None

    @property
    def order(self) -> np.ndarray | None:
        """The column of each node (None: the columns are the nodes)."""
        return self._order

    def stored(self) -> zarr.Array | NodeOrdered:
        """The rows' store, read in node order (a :class:`NodeOrdered` view of the block
        paths' store)."""
        assert self.store is not None  # rows computed into a store
        return self.store if self._order is None else NodeOrdered(self.store, self._order)

    @classmethod
    def _in_memory(cls, search: SearchGraph | StoredGraph, sources: np.ndarray,
                   bounds: list[int], square: bool, dtype: Any) -> GeodesicRows:
        """The rows in this process: on dask's threads (Dijkstra releases the GIL), each block
        written in place into one array, which ``gather(release=True)`` hands over without a
        second T x S copy."""
        T = search.n_nodes
        whole = populated((len(sources), T), dtype)
        map_local(lambda se: _rows(search, sources[se[0]:se[1]], square, dtype,
                                   out=whole[se[0]:se[1]]), list(itertools.pairwise(bounds)))
        rows = cls((len(sources), T), bounds,
                   [whole[s:e] for s, e in itertools.pairwise(bounds)], None, None, dtype)
        rows._whole = whole
        return rows

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
        graph_store: Any = None,
        columns: np.ndarray | None = None,
        blocks: bool | None = None,
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
            Zarr array, or local path / URL (a :class:`~dr_dask.io.storage.Location` carries
            storage options) of a new array, that the workers write the rows into.
        graph_store : str or Location, optional
            With a client: where the prepared graph is written once (:class:`StoredGraph`)
            for the tasks to open, memory-mapped when local, instead of being sent from this
            process to every worker. It must outlive the rows (a lost block is recomputed
            from it).
        columns : ndarray of shape (C,), optional
            Columns (nodes) that :meth:`columns` returns: taken by the tasks as they write
            ``out`` (the landmark columns: else read back from every stored chunk, the whole
            L x T array, 40 GB at T=10^7).
        blocks : bool, optional
            Partition the graph by row blocks (:func:`by_blocks`: by default for a stored
            graph larger than a share of a task's memory): no task holds the
            graph; the rows go to ``out``, else next to the stored graph, columns in its node
            order (``order``).
        """
        stored = graph if isinstance(graph, StoredGraph) else None
        csr = None if stored is not None else as_csr(graph)
        T = _n_nodes(graph)
        sources = _checked_sources(sources, T)
        client = active_client(client)
        if stored is not None and by_blocks(stored, blocks, client):
            return cls._by_blocks(stored, sources, client, dtype, square, out, columns)
        weights = stored.weights_dtype if stored is not None else np.float64
        bs = _task_sources(T, weights, dtype, out is not None, block_size, client)
        store = None
        if out is not None:
            store = path_rows_array(out, (len(sources), T), bs, 1 << 16, dtype)
            c = store.chunks[0]
            bs = c * max(1, bs // c)
        # once here, not in every task (a stored graph is opened where the tasks run)
        search = stored if stored is not None else SearchGraph.of(csr)
        bounds = [*range(0, len(sources), bs), len(sources)]
        logger.info("Dijkstra from %d sources over %d nodes in %d blocks", len(sources), T,
                    len(bounds) - 1)
        kept = None if store is None or columns is None else np.asarray(columns, np.int64)
        tasks = [(_rows, sources[s:e], square, dtype) if store is None else
                 (_rows_to_store, sources[s:e], square, dtype, store, s, kept)
                 for s, e in itertools.pairwise(bounds)]
        if client is None and store is None:
            return cls._in_memory(search, sources, bounds, square, dtype)
        if client is None:  # the rows to the store, on dask's threads
            results = map_local(lambda t: t[0](search, *t[1:]), tasks)
        else:
            g = (search if isinstance(search, StoredGraph)
                 else StoredGraph.write(search, graph_store) if graph_store is not None
                 else share(search, client))
            futures = [client.submit(fn, g, *args) for fn, *args in tasks]
            # surface a disconnected graph (or any failure) now, not at first use; waits for all.
            # Row blocks held on the workers stay futures: recomputed from the graph if lost
            wait_for(futures, client)
            for f in futures:
                if f.status == "error":
                    f.result()
            if store is None:
                return cls((len(sources), T), bounds, futures, client, store, dtype)
            results = gather(futures, client)
        # Zarr slice handles, read where the blocks are used, and the columns kept
        rows = cls((len(sources), T), bounds, [h for h, _ in results], client, store, dtype)
        if kept is not None:
            rows._kept = kept, np.vstack([c for _, c in results])
        return rows

    @classmethod
    def _by_blocks(cls, graph: StoredGraph, sources: np.ndarray, client: Any, dtype: Any,
                   square: bool, out: Any, columns: np.ndarray | None) -> GeodesicRows:
        S, T = len(sources), graph.n_nodes
        width = batch_width(S, lanes_dtype(graph.weights_dtype, dtype))
        chunks = out_chunks(width, int(config.get("graph.paths-block-nodes")))
        store = path_rows_array(graph.location.child("paths") if out is None else out, (S, T),
                          *chunks, dtype)
        kept, report, rank = block_paths(graph, sources, store, width, client=client,
                                         square=square, columns=columns)
        bounds = [*range(0, S, width), S]
        rows = cls((S, T), bounds, [("zarr", store, s, e) for s, e in itertools.pairwise(bounds)],
                   client, store, dtype)
        rows._order, rows.report = rank, report
        if kept is not None:
            rows._kept = np.asarray(columns, np.int64), kept
        return rows

    def columns(self, columns: np.ndarray) -> np.ndarray:
        """The rows' ``columns``, of shape (S, C): as the tasks kept them (:meth:`compute`'s
        ``columns``), else read from the blocks where they are."""
        columns = np.asarray(columns, np.int64)
        if self._kept is not None and np.array_equal(self._kept[0], columns):
            return self._kept[1]
        order = self.order
        return np.vstack(self.map(_columns, columns if order is None else order[columns]))

    def _submit(self, func: Callable, args: tuple, by_columns: bool = False) -> list:
        """Futures (or, without a client, values) of ``func(block, start, *args)`` per block."""
        spans = self.bounds[:-1]
        if self.client is None:
            # dask's threads, one BLAS thread each (see dr_dask.runtime.blas): products over row
            # blocks in memory are bound by memory traffic, which BLAS's own threads do not add to
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
            total = sum(parts[1:], parts[0])
        else:
            while len(parts) > 1:
                pairs = [self.client.submit(operator.add, a, b, pure=False)
                         for a, b in zip(parts[0::2], parts[1::2])]
                parts = pairs + parts[len(pairs) * 2:]
            total = gather(parts, self.client)[0]
        order = self.order
        return total if order is None else total[order]

    def gather(self, dtype: Any = None, release: bool = False) -> np.ndarray:
        """All rows as one in-memory array (only for moderate sizes), the blocks copied one
        at a time; ``release`` drops them after (rows computed in this process are then
        handed over without a copy)."""
        if release and self._whole is not None and self._whole.dtype == np.dtype(
                dtype or self.dtype):
            out, self._whole, self.blocks = self._whole, None, []
            return out
        out = np.empty(self.shape, dtype=dtype or self.dtype)
        order = self.order
        for n, (s, e) in enumerate(zip(self.bounds[:-1], self.bounds[1:])):
            b = self.blocks[n]
            # never waiting forever on a cluster that is gone
            block = _materialise(gather([b], self.client)[0] if isinstance(b, Future) else b)
            out[s:e] = block if order is None else block[:, order]
        if release:
            self.release()
        return out

    def release(self) -> None:
        """Drop the blocks (frees worker memory when they are futures)."""
        self.blocks = []
        self._whole = None


def _upper_rows(graph: SearchGraph | StoredGraph, start: int, stop: int, square: bool,
                dtype: Any, first: int | None = None, out: np.ndarray | None = None
                ) -> np.ndarray:
    """Rows ``start:stop`` of the all-pairs matrix, columns from ``first`` (default ``start``)
    on, into ``out`` if given: the earlier columns are earlier rows, transposed, in a
    symmetric matrix (:func:`all_pairs`' tasks, :func:`_upper_strip`'s slices)."""
    graph = opened(graph)
    first = start if first is None else first
    if out is None:
        out = np.empty((stop - start, graph.n_nodes - first), dtype)
    batches = lane_batches(graph, np.arange(start, stop, dtype=np.int64),
                           lanes_dtype(graph.weights.dtype, out.dtype), kept=True)
    return batches_to_rows(batches, graph.rank[first:], out, square)


def all_pairs(graph: sp.spmatrix, *, client: Any = None, square: bool = False,
              block_size: int = 256, dtype: Any = np.float64) -> tuple[np.ndarray, list[int]]:
    """The whole T x T path matrix (squared with ``square``) in this process, and the row
    offsets of the blocks it was computed in.

    With a client, each task sends its block's columns from the block's first source on and
    this process mirrors them into the columns of the later rows as the blocks arrive: the
    matrix is symmetric, so half of its bytes need not travel (at T = 10^4, 400 MB of the 800),
    and the copies here overlap the later blocks' Dijkstra. A later row's entry in an earlier
    block's columns is then the earlier source's distance to it, which may differ from its own
    search's in the last bit.
    """
    csr = as_csr(graph)
    T = int(csr.shape[0])
    client = active_client(client)
    bs = _task_sources(T, np.float64, dtype, False, block_size, client)
    bounds = [*range(0, T, bs), T]
    search = SearchGraph.of(csr)
    if client is None:
        rows = GeodesicRows._in_memory(search, np.arange(T), bounds, square, dtype)
        return rows.gather(release=True), bounds
    g = share(search, client)
    futures = [client.submit(_upper_rows, g, s, e, square, dtype)
               for s, e in itertools.pairwise(bounds)]
    out = populated((T, T), dtype)
    for n, (s, e) in enumerate(itertools.pairwise(bounds)):
        # in submission order, roughly the order they finish; never waiting forever on a
        # cluster that is gone
        (strip,) = gather([futures[n]], client)
        futures[n] = None
        out[s:e, s:] = strip
        out[e:, s:e] = strip[:, e - s:].T
    return out, bounds


def _upper_strip(graph: SearchGraph, bounds: tuple[int, ...], i: int, square: bool,
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
    buffer = np.empty((min(sub, stop - start), graph.n_nodes - start))
    for s in range(start, stop, sub):
        e = min(s + sub, stop)
        P = _upper_rows(graph, s, e, square, np.float64, first=start, out=buffer[: e - s])
        strip[s - start : e - start] = transform(P, *args)
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
    graph = as_csr(graph)
    if graph.shape[0] != grid.size:
        raise ValueError(f"graph has {graph.shape[0]} nodes but the grid {grid.size}")
    logger.info("Dijkstra into %d upper strips over %d nodes", grid.n_blocks, grid.size)
    return strip_tiles(_upper_strip, SearchGraph.of(graph), grid,
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
    if sources is None and out is None:
        return all_pairs(graph, client=client, block_size=block_size, dtype=dtype)[0]
    rows = GeodesicRows.compute(graph, sources, client=client, block_size=block_size,
                                dtype=dtype, out=out)
    if out is None:
        return rows.gather(dtype)
    assert rows.store is not None  # compute opened (or created) it from `out`
    return rows.store
