"""The components of the partitioned graph (:mod:`dr_dask.graph.partitioned`, step 3): the
blocks' components joined through their boundaries, and Borůvka's bridges between them.

Each block's own components are a union-find over its own edges (:func:`_union`,
:func:`_roots`); one task per block then returns the pairs of components its edges to later
blocks join (:func:`_block_links`), and this process joins them (:func:`_joined`: a
union-find over the components, never a node per row nor the edges). :class:`Components`
holds the result, about a number per block. A disconnected graph is bridged by Borůvka's
steps (:func:`_bridges`): every component but the largest gets its shortest edge to another
component, found by one task per group of lists over that group's rows; each such edge is the
shortest across a cut, so the bridges are the minimum spanning tree over the components, the
edges :func:`~dr_dask.graph.components.connect_components` adds.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import dask
import numba
import numpy as np
import zarr

from dr_dask.graph._knn_ivf import InvertedLists
from dr_dask.graph.components import component_summary, smallest_component
from dr_dask.graph.diagnostics import DisconnectedGraphWarning
from dr_dask.io.storage import read_spans
from dr_dask.runtime import config
from dr_dask.runtime.cluster import compute

logger = logging.getLogger(__name__)

#: The weight of a zero-length edge in float32 (an explicit zero vanishes in sparse arithmetic).
ZERO_EDGE32 = np.finfo(np.float32).tiny


@numba.njit(cache=True, nogil=True)
def _find(parent: np.ndarray, x: int) -> int:
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


@numba.njit(cache=True, nogil=True)
def _union(parent: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Join the edges (a, b) into the union-find forest ``parent`` (the least node of a set is
    its root); which edges joined two sets."""
    joined = np.zeros(len(a), dtype=np.bool_)
    for e in range(len(a)):
        x, y = _find(parent, a[e]), _find(parent, b[e])
        if x != y:
            parent[max(x, y)] = min(x, y)
            joined[e] = True
    return joined


@numba.njit(cache=True, nogil=True)
def _roots(parent: np.ndarray) -> np.ndarray:
    out = np.empty(len(parent), dtype=np.int64)
    for x in range(len(parent)):
        out[x] = _find(parent, x)
    return out


# ---------------------------------------------------------------------------------------------
# 3. connectivity


def _block_links(indptr: zarr.Array, indices: zarr.Array, roots: zarr.Array, b: int,
                 block0: np.ndarray, ptr_at: np.ndarray, data_at: int) -> np.ndarray:
    """The pairs of components, (P, 2) block-local roots, each pair once and the smaller
    first, that block ``b``'s edges to later blocks join (an edge between two blocks is in
    both; the earlier counts it).

    Read from the stored block and the roots of the blocks its edges reach (each block's
    components are known only once every block has run, hence a pass of its own). A block
    connected inside joins each block it reaches once: a few pairs per block, where its edges
    out, which the client took before, are most of its edges on data whose neighbourhoods are
    wider than a block (docs/scaling.md, "Measurements behind the code's thresholds").
    """
    lo, hi, at = int(block0[b]), int(block0[b + 1]), int(ptr_at[b])
    ptr = np.asarray(indptr[at:at + hi - lo + 1], np.int64)
    col = np.asarray(indices[data_at:data_at + int(ptr[-1])]).astype(np.int64)
    later = col >= hi
    own = np.asarray(roots[at:at + hi - lo])[np.repeat(np.arange(hi - lo), np.diff(ptr))[later]]
    col = col[later]
    order = np.argsort(col, kind="stable")
    col, own = col[order], own[order]
    other = np.empty_like(col)
    cuts = np.searchsorted(col, block0)  # the edges into each block, by its labels
    for c in np.flatnonzero(np.diff(cuts)):
        a, z = int(cuts[c]), int(cuts[c + 1])
        first = int(col[a])
        start = int(ptr_at[c]) + first - int(block0[c])
        other[a:z] = np.asarray(roots[start:start + int(col[z - 1]) - first + 1])[
            col[a:z] - first]
    return np.unique(np.column_stack([own, other]), axis=0)


def _joined(ids: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """For each of the components ``ids`` (their least labels, ascending), the least label of
    the component it is in once ``a[e]`` and ``b[e]`` are joined: a union-find over the
    components, never a node per row nor the edges."""
    parent = np.arange(len(ids))
    _union(parent, np.searchsorted(ids, a), np.searchsorted(ids, b))
    return ids[_roots(parent)]  # the least label: ids ascend, union keeps the least


@dataclass(frozen=True)
class Components:
    """The component of every label, read where it is needed: never a table of T labels.

    The blocks' own components (their roots ``local``, ascending, and ``sizes``) and the
    component each has joined (``joined``: the least label in it); each label's block-local
    root is stored in ``roots``, block ``b``'s labels from ``block0[b]`` at ``ptr_at[b]``.
    A connected block is one entry, so this holds about a number per block.
    """

    roots: zarr.Array
    block0: np.ndarray
    ptr_at: np.ndarray
    local: np.ndarray
    joined: np.ndarray
    sizes: np.ndarray

    def of(self, lo: int, hi: int) -> np.ndarray:
        """The components of the labels ``[lo, hi)``, which lie in one block (a group's)."""
        b = int(np.searchsorted(self.block0, lo, side="right")) - 1
        at = int(self.ptr_at[b]) + lo - int(self.block0[b])
        return self.joined[np.searchsorted(self.local, np.asarray(self.roots[at:at + hi - lo]))]

    def block_labels(self, b: int, comps: np.ndarray, inside: bool,
                     limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Block ``b``'s labels whose component is (``inside``) or is not among ``comps``, the
        first ``limit`` of them, and their components."""
        lo, hi = int(self.block0[b]), int(self.block0[b + 1])
        comp = self.of(lo, hi)
        keep = np.flatnonzero(np.isin(comp, comps) == inside)[:limit]
        return keep + lo, comp[keep]

    def merged(self, a: np.ndarray, b: np.ndarray) -> Components:
        """These components after joining the components ``a[e]`` and ``b[e]``."""
        ids = np.unique(self.joined)
        root = _joined(ids, a, b)
        return dataclasses.replace(self, joined=root[np.searchsorted(ids, self.joined)])


def _nearest_outside(lists: InvertedLists, g: int, queries: np.ndarray, q_comp: np.ndarray,
                     comps: Components) -> tuple:
    """For each query row, its nearest row of group ``g`` in another component: distances,
    labels, row indices and components (inf, -1, -1, -1 when the group has none)."""
    s, n = int(lists.dest[g]), int(lists.label0[g + 1] - lists.label0[g])
    rows = np.asarray(lists.rows[s:s + n]).astype(np.float64)
    labels = np.arange(lists.label0[g], lists.label0[g + 1])
    comp = comps.of(int(lists.label0[g]), int(lists.label0[g + 1]))
    d2 = (np.einsum("ij,ij->i", queries, queries)[:, None] - 2 * queries @ rows.T
          + np.einsum("ij,ij->i", rows, rows)[None, :])
    d2[q_comp[:, None] == comp[None, :]] = np.inf
    j = np.argmin(d2, axis=1)
    best = d2[np.arange(len(queries)), j]
    found = np.isfinite(best)
    ids = np.asarray(lists.ids[s:s + n])
    return (np.where(found, np.sqrt(np.maximum(best, 0)), np.inf),
            np.where(found, labels[j], -1), np.where(found, ids[j], -1),
            np.where(found, comp[j], -1))


def _labels_of(comps: Components, wanted: np.ndarray, inside: bool, client: Any,
               limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The labels (ascending) whose component is (or is not) among ``wanted``, the first
    ``limit`` of them, and their components: one task per block reads its roots."""
    task = dask.delayed(Components.block_labels, pure=True)
    shared = dask.delayed(comps, traverse=False)
    parts = compute(*[task(shared, b, wanted, inside, limit)
                      for b in range(len(comps.block0) - 1)], client=client)
    labels = np.concatenate([p[0] for p in parts])[:limit]
    return labels, np.concatenate([p[1] for p in parts])[:limit]


def _bridges(lists: InvertedLists, comps: Components, weight: Callable, client: Any,
             on_disconnected: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Borůvka's bridging edges (labels a, b and weights) that connect every component.

    This process holds the components' table (:class:`Components`) and the rows outside the
    largest component (at most ``dr_dask.graph.bridge-max-rows``), never a label per row.
    """
    a_all: list[np.ndarray] = []
    b_all: list[np.ndarray] = []
    w_all: list[np.ndarray] = []
    while True:
        ids, at = np.unique(comps.joined, return_inverse=True)
        sizes = np.bincount(at, weights=comps.sizes, minlength=len(ids)).astype(np.int64)
        if len(ids) == 1:
            break
        largest = ids[np.argmax(sizes)]
        limit = int(config.get("graph.bridge-max-rows"))
        n_outside = int(sizes.sum() - sizes.max())
        if not a_all or n_outside > limit:  # name the components
            named, _ = _labels_of(comps, ids[[smallest_component(sizes)]], True, client, 5)
            summary = component_summary(sizes, np.sort(_rows_of(lists, named)[1]))
        if on_disconnected == "raise":
            raise ValueError(f"the neighbour graph is disconnected: {summary}. Increase "
                             "n_neighbors or n_probe, or use on_disconnected='bridge'")
        if not a_all:
            msg = (f"neighbour graph is disconnected ({summary}); adding shortest bridging "
                   "edges")
            logger.warning(msg)
            warnings.warn(msg, DisconnectedGraphWarning, stacklevel=4)
        if n_outside > limit:
            raise ValueError(
                f"the neighbour graph is disconnected ({summary}) and its components other "
                f"than the largest hold {n_outside} rows, more than "
                f"dr_dask.graph.bridge-max-rows={limit} to bridge: increase n_neighbors or "
                "n_probe")
        outside, q_comp = _labels_of(comps, np.array([largest]), False, client)
        queries, q_ids = _rows_of(lists, outside)
        task = dask.delayed(_nearest_outside, pure=True)
        # sent once per worker, not per task
        shared = [dask.delayed(a, traverse=False) for a in (lists, queries, q_comp, comps)]
        parts = compute(*[task(shared[0], g, *shared[1:])
                          for g in range(len(lists.groups))], client=client)
        dist = np.stack([p[0] for p in parts])
        best = np.argmin(dist, axis=0)
        pick = np.arange(len(outside))
        d, lab, ids_found, to = (np.stack([p[n] for p in parts])[best, pick]
                                 for n in range(4))
        # each component's shortest edge to another one
        order = np.lexsort((d, q_comp))
        first = order[np.r_[True, q_comp[order][1:] != q_comp[order][:-1]]]
        w = np.asarray(weight(d[first], q_ids[first], ids_found[first]), dtype=np.float64)
        a_all.append(outside[first])
        b_all.append(lab[first])
        w_all.append(np.maximum(w, ZERO_EDGE32).astype(np.float32))
        comps = comps.merged(q_comp[first], to[first])
    if not a_all:
        return np.empty(0, np.int64), np.empty(0, np.int64), np.empty(0, np.float32)
    a, b, w = np.concatenate(a_all), np.concatenate(b_all), np.concatenate(w_all)
    # two components whose shortest edges are each other's found it twice
    _, once = np.unique(np.column_stack([np.minimum(a, b), np.maximum(a, b)]), axis=0,
                        return_index=True)
    once = np.sort(once)
    a, b, w = a[once], b[once], w[once]
    logger.info("added %d bridging edges (longest weight %.4g)", len(a), w.max())
    return a, b, w


def _rows_of(lists: InvertedLists, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (centred float32, as float64) rows and row indices of sorted labels."""
    g = np.searchsorted(lists.label0, labels, side="right") - 1
    pos = labels - lists.label0[g] + lists.dest[g]
    spans = [(int(p), int(p) + 1) for p in pos]
    return (read_spans(lists.rows, spans).astype(np.float64), read_spans(lists.ids, spans))
