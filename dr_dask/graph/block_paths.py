"""Shortest paths over a stored graph partitioned by row block: no task holds the graph.

The nodes of a :class:`~dr_dask.graph.stored.StoredGraph` (numbered along the data's
neighbourhoods, as the partitioned graph and the reverse Cuthill-McKee order number them) are
cut into blocks of ``dr_dask.graph.paths-block-nodes`` consecutive nodes. A block's task reads
its rows of the graph once (:func:`_open_block`, held on a worker as a future: its internal
edges as a :class:`~dr_dask.graph.sssp.SearchGraph`, its edges to other blocks apart) and holds
the distances of its nodes from a batch of sources, one lane per source.

A *round* runs one task per block that has new input: the block lowers its lanes by its
neighbours' boundary distances plus the edges that cross (``d(v) + w(u, v)``), runs Dijkstra in
each lane from the nodes that fell (:func:`~dr_dask.graph.sssp.seeded_lanes`), and sends each
neighbouring block the distances of the nodes next to it, if any fell. The rounds stop when no
block sends anything. This is the block-synchronous scheme of distributed shortest paths
(Bertsekas & Tsitsiklis 1989, "Parallel and Distributed Computation", Section 4.1, with
Dijkstra inside each block): each round settles every block that a wave of distances entered,
so the rounds number about the diameter of the *block* graph (blocks joined by an edge), not
the hop diameter of the neighbour graph (millions of hops on a long 1-D manifold). The result
is the fixed point of ``d(u) = min(d(u), d(v) + w)`` under rounded addition, which is monotone:
the same least rounded path sums as single-process Dijkstra, bit for bit.

Boundary distances travel as futures between the workers (never through this process); a
worker lost in a round loses its blocks' lanes, which dask recomputes from their lineage (the
rounds before it are deterministic). Sources run in batches of
``dr_dask.graph.paths-batch-bytes`` of lanes per block; each batch's lanes are written to the
rows' Zarr array (sources x nodes, in node order: column chunks are blocks, so no two tasks
write one chunk) and dropped.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numba
import numpy as np
import scipy.sparse as sp
import zarr

from dr_dask.graph.sssp import (
    MIN_LANES,
    SearchGraph,
    disconnected,
    lanes_dtype,
    seeded_lanes,
    seeded_sweeps,
)
from dr_dask.graph.stored import StoredGraph
from dr_dask.runtime import config
from dr_dask.runtime.cluster import active_client, gather
from dr_dask.runtime.cluster import map_local as _map_local

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Block:
    """One block's share of the graph: nodes ``lo`` to ``hi``.

    ``graph`` holds the edges between its nodes (its ``rank``: node ``lo + i``'s label there);
    the edges that leave it are grouped by ``neighbours`` (ascending block numbers), those to
    ``neighbours[j]`` at ``cross_at[j]:cross_at[j + 1]``: ``cross_to`` (label of the inner end),
    ``cross_from`` (position of the outer end among the nodes of that block next to this one,
    ascending), ``cross_w``. ``send[send_at[j]:send_at[j + 1]]`` are the labels of this
    block's nodes next to ``neighbours[j]``, in node order: what that block reads as its
    ``cross_from`` positions.
    """

    lo: int
    hi: int
    graph: SearchGraph
    neighbours: np.ndarray
    cross_at: np.ndarray
    cross_to: np.ndarray
    cross_from: np.ndarray
    cross_w: np.ndarray
    send_at: np.ndarray
    send: np.ndarray

    @property
    def nbytes(self) -> int:
        g = self.graph
        return sum(a.nbytes for a in (g.indptr, g.indices, g.weights, g.rank, self.cross_to,
                                      self.cross_from, self.cross_w, self.send))

    def __sizeof__(self) -> int:
        # what dask's sizeof reads: without it a block counted as an object of a few hundred
        # bytes, so the scheduler moved rounds to the other worker at no cost it could see,
        # and with each move the block, until every worker held most of them
        return object.__sizeof__(self) + self.nbytes


def _open_block(stored: StoredGraph, lo: int, hi: int, size: int) -> Block:
    """Block ``[lo, hi)`` of ``stored`` (blocks of ``size`` nodes), read from the store.

    The rows read are turned into the block's graph in place (the edges that leave it taken
    out first, the inner ones packed to the front), so that a task holds the rows read and
    the block's reordered graph at most: this peak is a worker's cost whatever the number of
    workers (99 MB for a 45 MB block of 262,144 nodes; it was six times the block)."""
    ptr, cols, w = stored.rows(lo, hi)
    n = hi - lo
    out = np.flatnonzero((cols < lo) | (cols >= hi))  # few: the edges that leave the block
    u = np.searchsorted(ptr, out, side="right") - 1
    v, wv = cols[out].astype(np.int64), w[out]
    del out
    inner_ptr = np.empty(n + 1, np.int64)
    m = _pack_inner(ptr, cols, w, lo, hi, inner_ptr)
    inner = sp.csr_matrix((w[:m], cols[:m], inner_ptr), shape=(n, n))  # views, no copy
    del cols, w
    graph = SearchGraph.of(inner, symmetric=True)  # a stored graph holds every edge both ways
    del inner
    order = np.lexsort((u, v))  # by outer end: by its block, then within it
    u, v, wv = u[order], v[order], wv[order]
    halo, cross_from = np.unique(v, return_inverse=True)
    halo_block = halo // size
    neighbours, halo_at = np.unique(halo_block, return_index=True)
    halo_at = np.append(halo_at, len(halo))
    nb_of_edge = v // size
    cross_at = np.searchsorted(nb_of_edge, np.append(neighbours, np.iinfo(np.int64).max))
    cross_from = cross_from - np.repeat(halo_at[:-1], np.diff(cross_at))
    # this block's nodes next to each neighbour, in node order (the neighbour's halo order)
    pairs = np.unique(nb_of_edge * n + u)
    send_nb, send_u = pairs // n, pairs % n
    send_at = np.searchsorted(send_nb, np.append(neighbours, np.iinfo(np.int64).max))
    return Block(lo, hi, graph, neighbours.astype(np.int64), cross_at.astype(np.int64),
                 graph.rank[u], cross_from.astype(np.int64), wv, send_at.astype(np.int64),
                 graph.rank[send_u])


@numba.njit(cache=True, nogil=True)
def _pack_inner(ptr: np.ndarray, cols: np.ndarray, w: np.ndarray, lo: int, hi: int,
                inner_ptr: np.ndarray) -> int:
    """Move the edges of rows ``ptr`` between nodes ``lo`` to ``hi`` to the front of ``cols``
    and ``w``, in row order, numbered from ``lo``, and their row pointers into ``inner_ptr``.
    Returns how many. In place: each entry is read before anything is written over it."""
    m = 0
    inner_ptr[0] = 0
    for r in range(len(ptr) - 1):
        for e in range(ptr[r], ptr[r + 1]):
            c = cols[e]
            if lo <= c < hi:
                cols[m], w[m] = c - lo, w[e]
                m += 1
        inner_ptr[r + 1] = m
    return m


@numba.njit(cache=True, nogil=True)
def _lower(lanes: np.ndarray, seeded: np.ndarray, to: np.ndarray, frm: np.ndarray,
           w: np.ndarray, values: np.ndarray) -> None:
    """Lower ``lanes[to]`` by ``values[frm] + w`` (the edges from a neighbour's nodes), marking
    the entries that fell as seeds."""
    S = lanes.shape[1]
    for e in range(len(to)):
        u, h, we = to[e], frm[e], w[e]
        for c in range(S):
            d = values[h, c] + we
            if d < lanes[u, c]:
                lanes[u, c] = d
                seeded[u, c] = True


@numba.njit(cache=True, nogil=True)
def _lowers(lanes: np.ndarray, moved: np.ndarray, to: np.ndarray, frm: np.ndarray,
            w: np.ndarray, values: np.ndarray) -> bool:
    """Whether a node that fell, ``lanes[to[e]]``, lowers across an edge what the neighbour
    sent (``values[frm[e]]``; inf: it sent nothing there). Looped: as array expressions the
    test held four (crossing edges x lanes) temporaries, up to 100 MB a round."""
    for e in range(len(to)):
        u = to[e]
        if not moved[u]:
            continue
        for c in range(lanes.shape[1]):
            got = values[frm[e], c]
            if np.isinf(got) or lanes[u, c] + w[e] < got:
                return True
    return False


def _round(block: Block, lanes: np.ndarray | None, seeds: np.ndarray | None,
           inbox: list[tuple[int, tuple]], width: int, dtype: Any) -> tuple:
    """One round of ``block``: its lanes (n, width) lowered by ``seeds`` (node positions and
    lanes at distance zero) and the ``inbox`` (neighbour, its boundary distances), closed by
    Dijkstra. Returns the new lanes (the input is left as it was: a rerun sees the same), for
    each neighbour next to a node that fell the distances of those nodes (their positions
    among the nodes next to it, and their lanes), and the round's figures (nodes settled,
    neighbours sent to, bytes sent)."""
    n = block.hi - block.lo
    lanes = np.full((n, width), np.inf, dtype) if lanes is None else lanes.copy()
    seeded = np.zeros((n, width), dtype=np.bool_)
    if seeds is not None:
        at = block.graph.rank[seeds[0]]
        lanes[at, seeds[1]] = 0.0
        seeded[at, seeds[1]] = True
    heard = {}
    for c, (idx, vals) in inbox:
        a, z = _cross(block, c)
        # the neighbour sent the nodes next to this block whose lanes fell (the others it sent
        # before, and this block took them then): inf elsewhere
        values = np.full((int(block.cross_from[a:z].max()) + 1, width), np.inf, lanes.dtype)
        values[idx] = vals
        heard[c] = values
        _lower(lanes, seeded, block.cross_to[a:z], block.cross_from[a:z], block.cross_w[a:z],
               values)
    moved = np.zeros(n, dtype=np.bool_)
    g = block.graph
    # many lanes: swept together, each node's lanes at once (faster than a heap per lane, also
    # for the corrections of later rounds); a few: the heap, whose work follows what changes
    if int(seeded.any(axis=0).sum()) >= MIN_LANES:
        work = seeded_sweeps(g, lanes, seeded, moved)
    else:
        work = seeded_lanes(g.indptr, g.indices, g.weights, lanes, seeded, moved)
    boxes: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for j, c in enumerate(block.neighbours):
        nodes = block.send[block.send_at[j]:block.send_at[j + 1]]
        fell = np.flatnonzero(moved[nodes])
        if not len(fell):
            continue
        if int(c) in heard:  # nothing to send where it would not lower what c just sent
            a, z = _cross(block, int(c))
            if not _lowers(lanes, moved, block.cross_to[a:z], block.cross_from[a:z],
                           block.cross_w[a:z], heard[int(c)]):
                continue
        boxes[int(c)] = fell.astype(np.int32), lanes[nodes[fell]]
    sent = sum(i.nbytes + v.nbytes for i, v in boxes.values())
    return lanes, boxes, (int(work), sorted(boxes), sent)


def _cross(block: Block, c: int) -> tuple[int, int]:
    """Where ``block``'s edges to block ``c`` are."""
    j = int(np.searchsorted(block.neighbours, c))
    return int(block.cross_at[j]), int(block.cross_at[j + 1])


def _write(block: Block, lanes: np.ndarray | None, out: zarr.Array, start: int,
           width: int, square: bool, kept: np.ndarray) -> tuple:
    """The batch's rows ``[start, start + width)`` of ``out`` over the block's columns (whole
    chunks: a chunk's columns divide a block), a column chunk at a time. Returns the unreached
    nodes per lane and the lanes' values at the node positions ``kept`` (the landmark columns
    in this block)."""
    n = block.hi - block.lo
    if lanes is None:  # no source reached the block
        return np.full(width, n), np.full((width, len(kept)), np.inf)
    at = np.asarray(lanes[block.graph.rank[kept - block.lo]], dtype=np.float64).T
    missing = np.zeros(width, dtype=np.int64)
    rows = slice(start, min(start + width, out.shape[0]))
    step = int(out.chunks[1])
    for c in range(0, n, step):
        part = np.asarray(lanes[block.graph.rank[c:c + step]], dtype=np.float64).T
        missing += np.isinf(part).sum(axis=1)
        if square:
            part *= part
        out[rows, block.lo + c:block.lo + c + part.shape[1]] = part[:rows.stop - start]
    return missing, at


class _Runner:
    """Tasks on a client as futures, or on dask's threads as values (no client).

    On a client, block ``b``'s tasks are placed on one worker, the workers taking the blocks
    in turn (loosely: another worker runs them if that one is gone). Left to the scheduler,
    the blocks were opened unevenly (up to 7 of 8 on one of two workers) and rounds moved
    to idle workers with their blocks, so that memory per worker barely fell with W."""

    def __init__(self, client: Any):
        self.client = client
        self.homes = sorted(client.nthreads()) if client is not None else []

    def map(self, fn: Callable, calls: list[tuple], blocks: list[int]) -> list:
        """``fn(*call)`` for each call; ``blocks``: the block each call works on."""
        if self.client is None:
            return _map_local(lambda args: fn(*args), calls)
        if not self.homes:  # no worker yet (a cluster scaling up): the scheduler places them
            return [self.client.submit(fn, *args, pure=False) for args in calls]
        return [self.client.submit(fn, *args, pure=False, allow_other_workers=True,
                                   workers=[self.homes[b % len(self.homes)]])
                for b, args in zip(blocks, calls)]

    def pick(self, items: list, *key: Any) -> list:
        if self.client is None:
            return [_item(x, *key) for x in items]
        return [self.client.submit(_item, x, *key, pure=False) for x in items]

    def values(self, items: list) -> list:
        return items if self.client is None else gather(items, self.client)


def _item(x: Any, *key: Any) -> Any:
    for k in key:
        x = x[k]
    return x


def batch_width(n_sources: int, dtype: Any) -> int:
    """Sources per batch: ``dr_dask.graph.paths-batch-bytes`` of lanes per block."""
    size = int(config.get("graph.paths-block-nodes"))
    per = config.get_bytes("graph.paths-batch-bytes") // (size * np.dtype(dtype).itemsize)
    if per > _CHUNK_ROWS:  # whole row chunks of the rows
        per -= per % _CHUNK_ROWS
    return max(1, min(n_sources, per))


#: The rows' chunks: at most this many rows, and this many columns where a block is a multiple
#: of it (a batch and a block then write whole chunks; a chunk of a batch of 500 rows by a
#: block of 10^6 nodes would be 2 GB).
_CHUNK_ROWS, _CHUNK_COLUMNS = 64, 1 << 16


def out_chunks(width: int, size: int) -> tuple[int, int]:
    """The chunks of the rows' array for batches of ``width`` and blocks of ``size``."""
    rows = _CHUNK_ROWS if width > _CHUNK_ROWS else width
    return rows, _CHUNK_COLUMNS if size % _CHUNK_COLUMNS == 0 else size


def _check_chunks(out: zarr.Array, width: int, size: int, n_sources: int) -> None:
    """``out``'s chunks divide the batches of ``width`` sources and the blocks of ``size``
    nodes (a graph smaller than a block may have one chunk of columns)."""
    T = out.shape[1]
    one_chunk = out.chunks[1] >= T and size >= T
    batches = not width % out.chunks[0] or n_sources <= width
    blocks = not size % out.chunks[1] or one_chunk
    if not (batches and blocks):
        raise ValueError(f"out's chunks {out.chunks} must divide the batches of {width} "
                         f"sources and the blocks of {size} nodes")


def block_paths(stored: StoredGraph, sources: np.ndarray, out: zarr.Array, width: int, *,
                client: Any = None, square: bool = False,
                columns: np.ndarray | None = None) -> tuple[np.ndarray | None, dict,
                                                            np.ndarray]:
    """Shortest paths from ``sources`` (row indices) over ``stored``, by blocks, into ``out``.

    Parameters
    ----------
    stored : StoredGraph
    sources : ndarray of shape (S,)
        Row indices (the stored graph maps them to its nodes).
    out : zarr.Array of shape (S, T)
        Receives the lengths, columns in the stored graph's node order, in chunks that divide
        the batches and the blocks (``dr_dask.graph.paths-block-nodes``): :func:`out_chunks`.
    width : int
        Sources per batch (:func:`batch_width`).
    client : distributed.Client, optional
    square : bool
        Write squared lengths (squared in float64 before the cast).
    columns : ndarray of shape (C,), optional
        Row indices whose lengths are returned, as the tasks hold them.

    Returns
    -------
    (ndarray of shape (S, C) or None, report, ndarray of shape (T,))
        The ``columns``' lengths (not squared); what the rounds did: ``rounds`` per batch,
        ``bytes`` exchanged per round, ``settled`` nodes per round, ``blocks``, ``width``;
        and the node of each row index (its column in ``out``).

    Raises
    ------
    ValueError
        If a source cannot reach every node (the graph is disconnected).
    """
    client = active_client(client)
    T, size = stored.n_nodes, int(config.get("graph.paths-block-nodes"))
    B = -(-T // size)
    _check_chunks(out, width, size, len(sources))
    dt = lanes_dtype(stored.weights_dtype, out.dtype)
    # the node of every row index (T of them, read once here: the caller's results are put
    # back in row order with them)
    rank = stored.labels()
    src = rank[np.asarray(sources, np.int64)]
    kept = None if columns is None else rank[np.asarray(columns, np.int64)]
    run = _Runner(client)
    blocks = run.map(_open_block, [(stored, b * size, min(T, (b + 1) * size), size)
                                   for b in range(B)], list(range(B)))
    report: dict[str, Any] = {"blocks": B, "width": width, "rounds": [], "bytes": [],
                              "settled": []}
    kept_rows = None if kept is None else np.empty((len(sources), len(kept)))
    for s0 in range(0, len(sources), width):
        batch = src[s0:s0 + width]
        seeds: dict[int, list[tuple[int, int]]] = {}
        for lane, node in enumerate(batch):
            seeds.setdefault(int(node // size), []).append((int(node % size), lane))
        seed_arr = {b: np.array(v, dtype=np.int64).T for b, v in seeds.items()}
        lanes: list[Any] = [None] * B
        inbox: dict[int, list] = {b: [] for b in seed_arr}
        rounds = 0
        while inbox:
            active = sorted(inbox)
            res = run.map(_round, [(blocks[b], lanes[b], seed_arr.get(b) if not rounds else None,
                                    inbox[b], width, dt) for b in active], active)
            for b, lane in zip(active, run.pick(res, 0)):
                lanes[b] = lane
            stats = run.values(run.pick(res, 2))
            nxt: dict[int, list] = {}
            for b, r, (_, sent, _) in zip(active, res, stats):
                for c in sent:  # a future of the boundary alone, on the sender's worker
                    nxt.setdefault(c, []).append((b, run.pick([r], 1, c)[0]))
            del res
            report["bytes"].append(int(sum(s[2] for s in stats)))
            report["settled"].append(int(sum(s[0] for s in stats)))
            inbox, rounds = nxt, rounds + 1
        report["rounds"].append(rounds)
        m = min(width, len(sources) - s0)
        kcols = (np.empty(0, np.int64),) * B if kept is None else tuple(
            kept[(kept >= b * size) & (kept < (b + 1) * size)] for b in range(B))
        done = run.values(run.map(_write, [(blocks[b], lanes[b], out, s0, width, square,
                                            kcols[b]) for b in range(B)], list(range(B))))
        del lanes
        missing = np.sum([d[0] for d in done], axis=0)[:m]
        if missing.any():
            bad = int(np.flatnonzero(missing)[0])
            raise disconnected(int(sources[s0 + bad]), int(missing[bad]), T)
        if kept_rows is not None and kept is not None:
            vals = np.empty((width, len(kept)))
            for b in range(B):
                vals[:, np.flatnonzero((kept >= b * size) & (kept < (b + 1) * size))] = done[b][1]
            kept_rows[s0:s0 + m] = vals[:m]
        logger.info("block paths: sources %d-%d over %d blocks in %d rounds, %.1f MB "
                    "exchanged", s0, s0 + m, B, rounds,
                    sum(report["bytes"][-rounds:]) / 1e6 if rounds else 0.0)
    return kept_rows, report, rank
