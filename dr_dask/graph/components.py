"""Explicit repair (or refusal) of disconnected neighbour graphs: never silent infinities.

Bridging is Borůvka's minimum-spanning-tree step on the graph of components: every component
gets its shortest Euclidean edge to any other component, all those edges are added, and the
merged components repeat until one remains (at most log2(#components) rounds). This adds the
fewest, shortest edges that connect the graph, unlike joining every pair of components.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components

from dr_dask.graph.diagnostics import DisconnectedGraphWarning
from dr_dask.graph.knn import Metric
from dr_dask.graph.neighbour_graph import symmetric_graph

logger = logging.getLogger(__name__)

_MODES = ("bridge", "raise", "ignore")


def describe_components(labels: np.ndarray, n_components: int,
                        rows: Callable[[np.ndarray], np.ndarray] | None = None) -> str:
    """Human-readable summary: number, sizes, and some rows of the smallest components
    (``rows`` maps node numbers to the row indices to name, when they differ)."""
    sizes = np.bincount(labels, minlength=n_components)
    nodes = np.flatnonzero(labels == smallest_component(sizes))[:5]
    return component_summary(sizes, rows(nodes) if rows is not None else nodes)


def smallest_component(sizes: np.ndarray) -> int:
    """The component :func:`component_summary` names rows of."""
    return int(np.argsort(sizes)[0])


def component_summary(sizes: np.ndarray, named: np.ndarray) -> str:
    """:func:`describe_components` from the components' sizes and the first rows of the
    smallest (:func:`smallest_component`)."""
    order = np.argsort(sizes)[::-1]
    shown = ", ".join(str(int(s)) for s in sizes[order[:10]])
    more = ", ..." if len(sizes) > 10 else ""
    return (
        f"{len(sizes)} connected components of sizes [{shown}{more}]; "
        f"the smallest contains rows {np.asarray(named).tolist()}"
        f"{' ...' if sizes[smallest_component(sizes)] > 5 else ''}"
    )


def _closest_pair(A: Any, B: Any, metric: Metric) -> tuple[int, int, float]:
    """Indices (into A, into B) and distance of the closest pair between two point sets."""
    # build the tree on the smaller set and query it with the larger one
    if A.shape[0] <= B.shape[0]:
        d, j = metric.nearest(n_neighbors=1).fit(A).kneighbors(B)
        b = int(np.argmin(d[:, 0]))
        return int(j[b, 0]), b, float(d[b, 0])
    d, j = metric.nearest(n_neighbors=1).fit(B).kneighbors(A)
    a = int(np.argmin(d[:, 0]))
    return a, int(j[a, 0]), float(d[a, 0])


def _bridging_points(X: Any, n_nodes: int, precomputed: bool, n_comp: int,
                     summary: str) -> Any:
    """The points (or, ``precomputed``, the dense distances) that bridges are measured on."""
    if X is None:
        raise ValueError(f"cannot bridge a disconnected graph without the points X: {summary}")
    if not sp.issparse(X):
        X = np.asarray(X, dtype=np.float64)
    elif precomputed:
        raise RuntimeError(
            f"The number of connected components of the neighbors graph is {n_comp} > 1 "
            f"({summary}): a sparse precomputed graph holds no distances to bridge them. "
            "Increase the number of neighbors, or precompute the full distance matrix.")
    if X.shape[0] != n_nodes:
        raise ValueError(f"X has {X.shape[0]} rows but the graph has {n_nodes} nodes")
    return X


def connect_components(
    graph: sp.spmatrix,
    X: Any = None,
    *,
    on_disconnected: str = "bridge",
    bridge_weight: Callable[[np.ndarray], np.ndarray] | None = None,
    client: Any = None,
    metric: Metric | str | None = None,
) -> sp.csr_matrix:
    """Return a connected version of a symmetric graph, or refuse, as asked.

    Parameters
    ----------
    graph : sparse matrix of shape (T, T)
        Symmetric, non-negative edge weights.
    X : array-like or CSR matrix of shape (T, N), or (T, T) with ``metric="precomputed"``
        Points whose distances define the bridging edges (required for "bridge").
    on_disconnected : {"bridge", "raise", "ignore"}
        ``bridge``: add the shortest bridging edges (Borůvka over components) and warn with
        :class:`~dr_dask.graph.DisconnectedGraphWarning` naming the components; ``raise``:
        ValueError naming them; ``ignore``: return the graph unchanged (shortest paths will
        then refuse the infinite distances).
    bridge_weight : callable, optional
        Maps the Euclidean lengths of bridging edges to edge weights (default: identity).
        Lets graphs with other weights (e.g. ``-log s`` of correlations on standardised rows)
        reuse the same repair.
    client : distributed.Client, optional
        Unused today (bridging is cheap next to the graph); accepted for a uniform API.
    metric : Metric or "precomputed", optional
        The distance of the bridging edges (default Euclidean); ``"precomputed"``: X is the
        dense matrix of the distances between all points.

    Returns
    -------
    scipy.sparse.csr_matrix of shape (T, T)
    """
    if on_disconnected not in _MODES:
        raise ValueError(f"on_disconnected must be one of {_MODES}, got {on_disconnected!r}")
    graph = sp.csr_matrix(graph)
    n_comp, labels = connected_components(graph, directed=False)
    if n_comp == 1:
        return graph
    summary = describe_components(labels, n_comp)
    if on_disconnected == "raise":
        raise ValueError(
            f"the neighbour graph is disconnected (the number of connected components is "
            f"{n_comp} > 1): {summary}. Increase n_neighbors/radius or use "
            "on_disconnected='bridge'"
        )
    if on_disconnected == "ignore":
        logger.info("leaving disconnected graph as is: %s", summary)
        return graph
    precomputed = isinstance(metric, str) and metric == "precomputed"
    X = _bridging_points(X, graph.shape[0], precomputed, n_comp, summary)
    msg = (f"neighbour graph is disconnected (the number of connected components is {n_comp} "
           f"> 1: {summary}); adding shortest bridging edges")
    logger.warning(msg)

    warnings.warn(msg, DisconnectedGraphWarning, stacklevel=2)

    rows: list[int] = []
    cols: list[int] = []
    lens: list[float] = []
    while n_comp > 1:
        for c in range(n_comp):
            inside = np.flatnonzero(labels == c)
            outside = np.flatnonzero(labels != c)
            if precomputed:
                sub = X[np.ix_(inside, outside)]
                a, b = (int(i) for i in np.unravel_index(int(np.argmin(sub)), sub.shape))
                d = float(sub[a, b])
            else:
                a, b, d = _closest_pair(X[inside], X[outside],
                                        metric if isinstance(metric, Metric) else Metric())
            rows.append(inside[a])
            cols.append(outside[b])
            lens.append(d)
        bridges = sp.csr_matrix(
            (np.ones(len(rows)), (rows, cols)), shape=graph.shape
        )
        n_comp, labels = connected_components(graph + bridges, directed=False)
    lengths = np.asarray(lens)
    w = np.asarray(bridge_weight(lengths) if bridge_weight is not None else lengths,
                   dtype=np.float64)
    logger.info("added %d bridging edges (longest %.4g)", len(lengths), lengths.max())
    extra = symmetric_graph(np.asarray(rows), np.asarray(cols), w, graph.shape[0])
    # a bridge never duplicates an existing edge (its ends were in different components)
    return (graph + extra).tocsr()
