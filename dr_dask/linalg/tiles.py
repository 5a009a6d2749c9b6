"""Symmetric T x T matrices as grids of tiles: built from row blocks, never held whole.

A :class:`TiledSymmetric` keeps only the upper-triangle tiles (i <= j) of a symmetric matrix,
either in worker memory (futures, or arrays with the threaded scheduler) or in a Zarr array
on disk. Products ``A @ V`` are one task per tile, each contributing ``A_ij V_j`` to block i and
``A_ij^T V_i`` to block j, summed per row block on the workers; only the thin (T, b) result
reaches the driver. Elementwise reductions over the whole matrix (norms, row maxima) are the
same pattern with another per-tile function.
"""

from __future__ import annotations

import contextlib
import io
import logging
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import dask
import numpy as np
import zarr

from dr_dask.io.storage import Location, location, raise_if_transient
from dr_dask.runtime import config
from dr_dask.runtime.buffers import thread_buffer
from dr_dask.runtime.cluster import active_client, compute, gather, local_threads, map_local, share

logger = logging.getLogger(__name__)


def even_width(n: int, most: int) -> int:
    """The width of the fewest equal pieces of at most ``most`` that cover ``n`` items (a thin
    last piece would run at the cost of a full one)."""
    return -(-n // -(-n // most)) if n else 0


@dataclass(frozen=True)
class TileGrid:
    """Row-block boundaries shared by both axes of a symmetric matrix."""

    bounds: tuple[int, ...]

    @classmethod
    def from_chunks(cls, chunks: Sequence[int]) -> TileGrid:
        return cls(tuple(int(x) for x in np.concatenate([[0], np.cumsum(chunks)])))

    @classmethod
    def regular(cls, size: int, block: int) -> TileGrid:
        """Blocks of ``block`` rows (the last may be shorter), aligned with Zarr chunks."""
        return cls((*range(0, size, max(1, block)), size))

    @property
    def size(self) -> int:
        return self.bounds[-1]

    @property
    def n_blocks(self) -> int:
        return len(self.bounds) - 1

    def block(self, i: int) -> slice:
        return slice(self.bounds[i], self.bounds[i + 1])

    def upper(self) -> list[tuple[int, int]]:
        return [(i, j) for i in range(self.n_blocks) for j in range(i, self.n_blocks)]

    @property
    def max_block(self) -> int:
        return int(np.diff(self.bounds).max())


def tile_chunk_rows(block: int) -> int:
    """Rows per Zarr chunk for tiles of ``block`` rows: the largest divisor of ``block`` that is
    at most ``dr_dask.tiles.chunk-rows``, or ``block`` itself when that divisor is small (a chunk
    must never straddle two tiles: tasks write whole tiles concurrently)."""
    most = int(config.get("tiles.chunk-rows"))
    if block <= most:
        return block
    best = max(d for d in range(1, most + 1) if block % d == 0)
    return best if best >= most // 4 else block


@dataclass(frozen=True)
class ZarrTile:
    """A reference to one tile of a Zarr array: pickles as a path and slices, loads on a worker."""

    path: Location
    rows: slice
    cols: slice

    def load(self) -> np.ndarray:
        arr = zarr.open_array(self.path.zarr_store(read_only=True), mode="r")
        return np.asarray(arr[self.rows, self.cols])

    def row_chunks(self):
        """``(offset, rows)`` of the tile chunk row by chunk row (the array's own chunks)."""
        arr = zarr.open_array(self.path.zarr_store(read_only=True), mode="r")
        step = arr.chunks[0]
        for a in range(self.rows.start, self.rows.stop, step):
            b = min(a + step, self.rows.stop)
            yield a - self.rows.start, np.asarray(arr[a:b, self.cols])


def _load(tile: Any) -> np.ndarray:
    return tile.load() if isinstance(tile, ZarrTile) else tile


def rows_per_chunk(n_cols: int, itemsize: int, nbytes: int) -> int:
    """Rows of a row chunk of at most ``nbytes`` (at least one row)."""
    return max(1, nbytes // max(1, n_cols * itemsize))


def _row_chunks(tile: Any):
    """``(offset, rows)`` of a tile by row chunks: a stored tile's own chunks, an in-memory
    tile's of ``dr_dask.tiles.product-chunk-bytes``."""
    if isinstance(tile, ZarrTile):
        yield from tile.row_chunks()
        return
    step = rows_per_chunk(tile.shape[1], tile.itemsize,
                          config.get_bytes("tiles.product-chunk-bytes"))
    for a in range(0, tile.shape[0], step):
        yield a, tile[a:a + step]


def _tile_matmat(tile: Any, V: np.ndarray, rows: slice, cols: slice, diag: bool,
                 fn: Callable | None = None, args: tuple = (), precision: Any = np.float32):
    """``A_ij V_j`` and ``A_ij^T V_i`` of one tile, and optionally ``fn`` of the same tile (so a
    reduction rides along with a product instead of costing its own pass over the tiles).

    The tile is taken by row chunks (:func:`_row_chunks`); ``fn`` sees each chunk (its
    ``rows`` narrowed to it) and its results are added: it must be a sum over rows. Products
    run in the wider of the tile's dtype and ``precision`` (a float32 tile multiplied in
    float64 is cast one chunk at a time, never whole).
    """
    top: Any = None
    low: Any = None
    extra: Any = None
    Vc: Any = None
    Vr: Any = None
    for a, A in _row_chunks(tile):
        if Vc is None:  # V in the products' precision, once
            dt = np.result_type(A.dtype, precision)
            Vc, Vr = V[cols].astype(dt, copy=False), V[rows].astype(dt, copy=False)
            top = np.empty((rows.stop - rows.start, V.shape[1]), dt)
            # A^T V_i sums over the chunks: accumulated in float64 whatever the tile's dtype
            low = None if diag else np.zeros((Vc.shape[0], V.shape[1]))
        n = A.shape[0]
        Ac = A
        if A.dtype != dt:  # cast into a kept buffer (see dr_dask.runtime.buffers)
            Ac = thread_buffer("tile_rows", A.shape, dt)
            np.copyto(Ac, A)
        np.matmul(Ac, Vc, out=top[a:a + n])
        if low is not None:
            low += Ac.T @ Vr[a:a + n]
        if fn is not None:
            e = fn(A, slice(rows.start + a, rows.start + a + n), cols, diag, *args)
            extra = e if extra is None else extra + e
    return top, low, extra


def _sum(*parts: np.ndarray) -> np.ndarray:
    out = np.zeros(parts[0].shape, dtype=np.float64)
    for p in parts:
        out += p
    return out


def _tile_reduce(fn: Callable, tile: Any, rows: slice, cols: slice, diag: bool, args: tuple):
    return fn(_load(tile), rows, cols, diag, *args)


class TiledSymmetric:
    """A symmetric (T, T) matrix given by its upper tiles; a :class:`SymmetricOperator`.

    Parameters
    ----------
    grid : TileGrid
    tiles : dict
        ``(i, j) -> tile`` for every i <= j, where a tile is an ndarray, a distributed
        Future or a :class:`ZarrTile`.
    client : distributed.Client, optional
    precision : dtype
        The least dtype of the products: float32 tiles multiply in float32 by default (half
        the traffic); float64 makes them exact to the stored values, for eigensolves whose
        tolerance is below float32 rounding (Isomap's 1e-10).
    """

    def __init__(self, grid: TileGrid, tiles: dict, client: Any = None,
                 precision: Any = np.float32):
        self.grid, self.tiles, self.client = grid, tiles, client
        self.precision = np.dtype(precision)
        self.shape = (grid.size, grid.size)
        self.n_passes = 0

    def _share(self, value: Any) -> Any:
        """Send an array to the workers once per pass rather than once per task."""
        return share(value, self.client) if isinstance(value, np.ndarray) else value

    def matmat(self, V: np.ndarray) -> np.ndarray:
        """``A @ V`` for V of shape (T, b): one pass over the tiles."""
        return self.matmat_reduce(V)[0]

    def matmat_reduce(self, V: np.ndarray, fn: Callable | None = None, *args: Any):
        """``A @ V`` and, in the same pass, ``fn(tile, rows, cols, is_diagonal, *args)`` of every
        upper tile (a list in ``grid.upper()`` order, or None without ``fn``).

        ``fn`` must be a sum over the tile's rows: a stored tile is streamed by chunk rows and
        ``fn``'s results for them (``rows`` narrowed to the chunk's) are added.
        """
        V = np.asarray(V)
        Vs = self._share(V)
        shared = tuple(self._share(a) for a in args)
        g = self.grid
        parts: dict[int, list] = {i: [] for i in range(g.n_blocks)}
        extras = []
        for (i, j) in g.upper():
            top, low, extra = dask.delayed(_tile_matmat, nout=3, pure=False)(
                self.tiles[(i, j)], Vs, g.block(i), g.block(j), i == j, fn, shared,
                self.precision,
            )
            parts[i].append(top)
            if i != j:
                parts[j].append(low)
            extras.append(extra)
        blocks = [dask.delayed(_sum, pure=False)(*parts[i]) for i in range(g.n_blocks)]
        self.n_passes += 1
        out = compute(*blocks, *(extras if fn else []), client=self.client)
        Y = np.concatenate(out[: g.n_blocks], axis=0)
        return Y, (list(out[g.n_blocks:]) if fn else None)

    def reduce(self, fn: Callable, *args: Any) -> list:
        """Apply ``fn(tile, rows, cols, is_diagonal, *args)`` to every upper tile.

        Returns the list of results in ``grid.upper()`` order; ``args`` (small arrays) are
        shared with the workers once.
        """
        shared = tuple(self._share(a) for a in args)
        tasks = [
            dask.delayed(_tile_reduce, pure=False)(
                fn, self.tiles[(i, j)], self.grid.block(i), self.grid.block(j), i == j, shared
            )
            for (i, j) in self.grid.upper()
        ]
        return list(compute(*tasks, client=self.client))


# --------------------------------------------------------------------------------------------
# tile statistics: what a reference point or a double centring needs of the whole matrix


def tile_stats(D: np.ndarray) -> tuple:
    """Row and column maxima and sums of one tile (the reference point needs them).

    Maxima are exact in the tile's dtype and sums accumulate in float64, so a float32 tile is
    never copied to float64 (a 32 MB temporary per 2048^2 tile). IKD's inverse kernel
    computes them in the same pass as its tile
    (:meth:`dr_dask.methods.ikd_core.InverseKernel.tile`).
    """
    return (D.max(axis=1).astype(np.float64), D.max(axis=0).astype(np.float64),
            D.sum(axis=1, dtype=np.float64), D.sum(axis=0, dtype=np.float64))


def band_stats(parts: list) -> tuple:
    """A tile's :func:`tile_stats` from those of its row bands, top to bottom."""
    return (np.concatenate([p[0] for p in parts]), np.max([p[1] for p in parts], axis=0),
            np.concatenate([p[2] for p in parts]), np.sum([p[3] for p in parts], axis=0))


def row_stats(grid: TileGrid, stats: list) -> tuple[np.ndarray, np.ndarray]:
    """Full-row maxima and sums of D from the upper tiles' row and column statistics."""
    rowmax = np.full(grid.size, -np.inf)
    rowsum = np.zeros(grid.size)
    for (i, j), (rmax, cmax, rsum, csum) in zip(grid.upper(), stats):
        bi, bj = grid.block(i), grid.block(j)
        rowmax[bi] = np.maximum(rowmax[bi], rmax)
        rowsum[bi] += rsum
        if i != j:
            rowmax[bj] = np.maximum(rowmax[bj], cmax)
            rowsum[bj] += csum
    return rowmax, rowsum


def build_tiles(
    grid: TileGrid,
    blocks: Sequence[Any],
    tile_fn: Callable,
    *,
    fn_args: tuple = (),
    store: Any = None,
    dtype: Any = np.float64,
    client: Any = None,
    progress: bool = False,
    band_stats: Callable | None = None,
) -> tuple[TiledSymmetric, list]:
    """Compute every upper tile ``tile_fn(blocks[i], blocks[j], is_diagonal, *fn_args)``.

    ``tile_fn`` returns ``(tile, stats)``. With ``store`` (a :class:`~dr_dask.io.storage.Location`
    or path/URL of a Zarr array) each task writes its tile there and only ``stats`` come back,
    so the matrix is stored and no process ever holds more than a tile; otherwise tiles stay
    in worker memory. With ``store`` and ``band_stats`` a task holds only one chunk row of
    its tile: ``tile_fn(rows of blocks[i], blocks[j], is_diagonal, *fn_args, row0=a)`` gives
    the band of rows from ``a``, and ``band_stats(list of the bands' stats)`` the tile's.

    Stored, the stage resumes tile by tile: after writing its tile a task writes one mark
    object with its stats, ``store/done/i_j.npz`` (inside the array's own prefix, so on an
    object store too); a rerun recomputes only the tiles without a mark.

    Returns
    -------
    (TiledSymmetric, list of stats in ``grid.upper()`` order)
    """
    client = active_client(client)
    done: dict = {}
    if store is not None:
        store = location(store)
        done = open_tile_store(store, grid, dtype)
    shared_args = tuple(share(a, client) for a in fn_args)
    todo = [ij for ij in grid.upper() if ij not in done]
    if done:
        logger.info("resuming tiles: %d of %d already written", len(done), len(grid.upper()))
    tasks = [
        dask.delayed(_make_tile, pure=False)(
            tile_fn, blocks[i], blocks[j], i == j, shared_args, store, (i, j), grid, band_stats
        )
        for (i, j) in todo
    ]
    if store is None and client is not None:
        # keep tiles on the workers: futures of (tile, stats), tiles never gathered. They are
        # computed results, not scattered data: a tile lost with its worker is recomputed
        futures = client.compute(tasks)
        tiles = {ij: client.submit(_first, f, pure=False) for ij, f in zip(grid.upper(), futures)}
        stats = gather([client.submit(_second, f, pure=False) for f in futures], client,
                       progress=progress)
        del futures
        return TiledSymmetric(grid, tiles, client), stats
    results = dict(zip(todo, compute(*tasks, client=client, progress=progress)))
    if store is not None:
        tiles = stored_tiles(store, grid)
        stats = [done[ij] if ij in done else results[ij][1] for ij in grid.upper()]
        return TiledSymmetric(grid, tiles, client), stats
    tiles = {ij: r[0] for ij, r in results.items()}
    return TiledSymmetric(grid, tiles, client), [results[ij][1] for ij in grid.upper()]


def _first(pair: tuple) -> Any:
    return pair[0]


def _second(pair: tuple) -> Any:
    return pair[1]


def _done_mark(store: Location, ij: tuple[int, int]) -> Location:
    return store.child("done", f"{ij[0]}_{ij[1]}.npz")


def _encode_stats(stats: tuple) -> bytes:
    """A tile's statistics (a tuple of arrays) as npz bytes: a mark read back runs no code."""
    buf = io.BytesIO()
    np.savez(buf, *[np.asarray(s) for s in stats])
    return buf.getvalue()


def _decode_stats(data: bytes) -> tuple:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return tuple(z[f"arr_{i}"] for i in range(len(z.files)))


def open_tile_store(store: Location, grid: TileGrid, dtype: Any) -> dict:
    """Create the tile array, or reopen it: ``(i, j) -> stats`` of the tiles already written
    (those with a done mark, see :func:`build_tiles`)."""
    if any(b % grid.max_block for b in grid.bounds[:-1]):
        raise ValueError("tile grid must be regular to align tiles with Zarr chunks")
    shape = (grid.size, grid.size)
    chunks = (tile_chunk_rows(grid.max_block), grid.max_block)
    try:
        arr = zarr.open_array(store.zarr_store(read_only=True), mode="r")
        fits = arr.shape == shape and arr.chunks == chunks and arr.dtype == np.dtype(dtype)
    except Exception as exc:
        # an unreachable, slow or throttling store says nothing about the tiles: keep every
        # finished one and exit 1 (a retry resumes); only absent or unreadable metadata is
        # no tile array
        raise_if_transient(exc, store)
        if not isinstance(exc, (FileNotFoundError, ValueError, KeyError)):
            raise
        fits = False
    if not fits:  # absent, or another grid's: start the stage afresh
        store.delete()
        zarr.create_array(
            store.zarr_store(), shape=shape, chunks=chunks, dtype=dtype, compressors=None,
            fill_value=0, overwrite=True, dimension_names=("sample", "sample_"),
        )
        return {}
    done = {}
    for ij in grid.upper():
        # no mark (or a torn local write): the tile is redone
        with contextlib.suppress(FileNotFoundError, EOFError, ValueError, OSError,
                                 zipfile.BadZipFile):
            done[ij] = _decode_stats(_done_mark(store, ij).read_bytes())
    return done


def _write_bands(store: Location, grid: TileGrid, ij: tuple[int, int], bands: Any) -> None:
    """Write tile ``ij`` into the array of :func:`open_tile_store` from ``bands``, its rows top
    to bottom in pieces of whole chunk rows (zarr copies what it is given: never the tile)."""
    arr = zarr.open_array(store.zarr_store(), mode="r+")
    a, cols = grid.block(ij[0]).start, grid.block(ij[1])
    for band in bands:
        arr[a:a + len(band), cols] = band
        a += len(band)


def write_tile(store: Location, grid: TileGrid, ij: tuple[int, int], tile: np.ndarray,
               stats: tuple) -> None:
    """Write tile ``ij`` into the array of :func:`open_tile_store`, then its done mark."""
    step = tile_chunk_rows(grid.max_block)  # the array's chunk rows
    _write_bands(store, grid, ij, (tile[a:a + step] for a in range(0, len(tile), step)))
    _mark_done(store, ij, stats)


def _mark_done(store: Location, ij: tuple[int, int], stats: tuple) -> None:
    # written only after the tile's chunks: a mark always vouches for a full tile
    _done_mark(store, ij).write_bytes(_encode_stats(stats))


def _write_tile_by_bands(tile_fn: Callable, Xi: Any, Xj: Any, diag: bool, args: tuple,
                         store: Location, ij: tuple[int, int], grid: TileGrid,
                         band_stats: Callable) -> tuple:
    """Tile ``ij`` computed and written one chunk row (band) at a time, then its done mark:
    the task holds a band, never the tile (16 MB against 128 MB at 4096^2 in float64)."""
    Xi = np.asarray(Xi)
    step = tile_chunk_rows(grid.max_block)
    parts = []

    def bands():
        for a in range(0, len(Xi), step):
            band, stats = tile_fn(Xi[a:a + step], Xj, diag, *args, row0=a)
            parts.append(stats)
            yield band

    _write_bands(store, grid, ij, bands())
    stats = band_stats(parts)
    _mark_done(store, ij, stats)
    return stats


def stored_tiles(store: Location, grid: TileGrid) -> dict:
    """``(i, j) -> ZarrTile`` of every upper tile of a tile array."""
    return {ij: ZarrTile(store, grid.block(ij[0]), grid.block(ij[1])) for ij in grid.upper()}


def _make_tile(tile_fn, Xi, Xj, diag, args, store, ij, grid, band_stats):
    if store is not None and band_stats is not None:
        return None, _write_tile_by_bands(tile_fn, Xi, Xj, diag, args, store, ij, grid,
                                          band_stats)
    tile, stats = tile_fn(Xi, Xj, diag, *args)
    if store is None:
        return tile, stats
    write_tile(store, grid, ij, tile, stats)
    return None, stats


# --------------------------------------------------------------------------------------------
# tiles from upper strips: one task computes block row i's tiles (i, j >= i) together


def strip_grid(T: int, client: Any = None, max_block: int | None = None) -> Any:
    """The tile grid of :func:`strip_tiles` for ``T`` nodes: equal blocks of at most
    ``min(max_block, dr_dask.tiles.strip-max-rows)``
    rows, a multiple of the worker threads in number (at
    least two each). Dijkstra costs the same per source, so equal strips in a multiple of the
    threads balance the workers (3 strips on 2 workers leave one idle for a third of the
    stage), and few strips keep the product passes cheap (each is one task per tile)."""
    client = active_client(client)
    threads = sum(client.nthreads().values()) if client is not None else local_threads()
    most = int(config.get("tiles.strip-max-rows"))
    rows = min(max_block or most, most)
    n = threads * max(2, -(-T // (threads * rows)))
    return TileGrid.regular(T, max(1, -(-T // n)))


def strip_tiles(strip_fn: Callable, shared: Any, grid: TileGrid, args: tuple, *,
                dtype: Any = np.float64, precision: Any = np.float32, client: Any = None,
                store: Any = None) -> tuple[TiledSymmetric, list]:
    """The upper tiles of a symmetric matrix made one block row (strip) per task.

    ``strip_fn(shared, grid.bounds, i, *args)`` returns ``(strip, stats)``: the rows of block
    ``i`` from its first column on, of shape (block rows, T - bounds[i]), and the statistics
    of its tiles ``(i, j >= i)`` in order. Computing a whole strip at once suits row-wise
    producers (Dijkstra from the block's sources). In memory, the tiles are views of their
    strip, held as futures recomputable from ``shared`` (shared once, never scattered: a
    strip lost with its worker is recomputed). With ``store`` each task writes its tiles
    there (:func:`write_tile`) and the stage resumes strip by strip: a rerun redoes only the
    strips with a tile missing its done mark.

    Parameters
    ----------
    strip_fn : callable
        Picklable; see above.
    shared : object
        The one large input of every strip (a search graph), shared with the workers once.
    grid : TileGrid
    args : tuple
        Further arguments of ``strip_fn``.
    dtype : dtype
        Storage type of the tiles.
    precision : dtype
        The least dtype of the products (:class:`TiledSymmetric`).
    client : distributed.Client, optional
    store : Location or str, optional
        Zarr tile array (local path or URL) to write the tiles into, reopened on a rerun.

    Returns
    -------
    (TiledSymmetric, list of stats in ``grid.upper()`` order)
    """
    client = active_client(client)
    bounds = tuple(grid.bounds)
    g = share(shared, client) if client is not None else shared
    stats: dict = {}
    tiles: dict = {}
    if store is not None:
        store = location(store)
        stats = open_tile_store(store, grid, dtype)
        todo = [i for i in range(grid.n_blocks)
                if any((i, j) not in stats for j in range(i, grid.n_blocks))]
        if len(todo) < grid.n_blocks:
            logger.info("resuming: %d of %d strips already written", grid.n_blocks - len(todo),
                        grid.n_blocks)
        if client is None:  # dask's threads (strip_fn releases the GIL: compiled Dijkstra)
            parts = map_local(lambda i: _strip_to_store(strip_fn, g, grid, i, args, store), todo)
        else:
            parts = gather([client.submit(_strip_to_store, strip_fn, g, grid, i, args, store,
                                          pure=False) for i in todo], client)
        for i, st in zip(todo, parts):
            stats.update(zip([(i, j) for j in range(i, grid.n_blocks)], st))
        return (TiledSymmetric(grid, stored_tiles(store, grid), client, precision),
                [stats[ij] for ij in grid.upper()])
    if client is None:
        strips = map_local(lambda i: strip_fn(g, bounds, i, *args), range(grid.n_blocks))
        for i, (strip, st) in enumerate(strips):
            for j, s in zip(range(i, grid.n_blocks), st):
                tiles[(i, j)] = _strip_tile((strip, None), bounds[j] - bounds[i],
                                            bounds[j + 1] - bounds[i])
                stats[(i, j)] = s
        return (TiledSymmetric(grid, tiles, None, precision),
                [stats[ij] for ij in grid.upper()])
    strips = [client.submit(strip_fn, g, bounds, i, *args, pure=False)
              for i in range(grid.n_blocks)]
    parts = gather([client.submit(_second, f, pure=False) for f in strips], client)
    for i, (f, st) in enumerate(zip(strips, parts)):
        for j, s in zip(range(i, grid.n_blocks), st):
            tiles[(i, j)] = client.submit(_strip_tile, f, bounds[j] - bounds[i],
                                          bounds[j + 1] - bounds[i], pure=False)
            stats[(i, j)] = s
    del strips  # the tile views keep each strip alive on its worker, once
    return TiledSymmetric(grid, tiles, client, precision), [stats[ij] for ij in grid.upper()]


def _strip_to_store(strip_fn: Callable, shared: Any, grid: TileGrid, i: int, args: tuple,
                    store: Location) -> list:
    """Strip ``i`` written tile by tile into ``store``; returns the stats only."""
    strip, stats = strip_fn(shared, tuple(grid.bounds), i, *args)
    s0 = grid.bounds[i]
    for j, st in zip(range(i, grid.n_blocks), stats):
        cols = grid.block(j)
        write_tile(store, grid, (i, j), strip[:, cols.start - s0 : cols.stop - s0], st)
    return stats


def _strip_tile(result: tuple, a: int, z: int) -> np.ndarray:
    return result[0][:, a:z]  # a view: the tiles of one strip share its memory
