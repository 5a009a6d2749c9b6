"""Shortest paths' cost per source against T, on one thread (where the exact geodesic
methods stop growing as T^2 log T), and the sweeps against the heap.

The graphs are the kNN graphs (k=10) of the first T rows of one sinusoid (N=100), the graphs
the exact methods search. For each T, the median of three timed runs of the package's
search (:func:`dr_dask.graph.sssp.dijkstra_rows`' kernel, the graph prepared once and one
output buffer, as a strip task runs it: one heap search, then Bellman-Ford sweeps 64 sources
at a time) from ``n_sources`` spread sources, and of the heap alone from the same sources (the
baseline of the same run). Reported per T: ms per source for both and their ratio, whether
the sweeps kept the graph, ns per ``T ln T`` (flat while the search runs at one speed), that
figure as a ratio to the smallest T's, and the bytes the heap touches for every source: the
CSR graph (indptr, int32 indices, float64 weights), the distance array and the relabelling.

:func:`run_stored` times instead one whole-graph path task over a stored graph (as a fit's
scratch holds it): its opening, its heap search, each sweep pass (nodes recomputed, seconds)
and its peak memory. A pass's seconds on one graph compare machines, and commits on one
machine, where a fit's time alone cannot tell a slower memory system from more passes.
"""

from __future__ import annotations

import logging
import math
import resource
import time
from typing import TYPE_CHECKING, Any

import numpy as np

from dr_dask.bench._common import bench_workdir, dataset_arrays

if TYPE_CHECKING:
    from dr_dask.graph.stored import StoredGraph

logger = logging.getLogger(__name__)

#: Sizes of the ladder: dense around 20k-30k, where the exact methods' step was steepest.
SIZES = (5_000, 10_000, 15_000, 20_000, 25_000, 30_000, 40_000, 60_000, 100_000)


def run_dijkstra(sizes: tuple[int, ...] = SIZES, n_sources: int = 150, n_neighbors: int = 10,
                 workdir: str | None = None) -> dict:
    """Per-source Dijkstra cost at each of ``sizes`` (see the module).

    Parameters
    ----------
    sizes : tuple of int
        Node counts (prefixes of one sinusoid of ``max(sizes)`` rows).
    n_sources : int
        Sources per timed run.
    n_neighbors : int
        k of the graphs.
    workdir : str, optional
        Where the sinusoid's store is kept (default a temporary directory).

    Returns
    -------
    dict
        ``rows``: one dict per T.
    """

    from dr_dask.graph.neighbour_graph import kneighbors_graph
    from dr_dask.graph.sssp import SearchGraph, _heap_lanes, search_rows

    with bench_workdir(workdir, "dijkstra") as workdir:
        X, _ = dataset_arrays(workdir, "sinusoidal", max(sizes), 100)
        rows: list[dict[str, Any]] = []
        for T in sorted(sizes):
            graph = SearchGraph.of(kneighbors_graph(X[:T], n_neighbors))
            sources = np.linspace(0, T - 1, n_sources).astype(np.int64)
            out = np.empty((n_sources, T))
            # compiled, pages touched
            search_rows(graph, sources[:1], False, np.float64, out=out[:1])
            lanes = np.empty((T, n_sources))  # the heap's output, as the sweeps' (nodes x sources)
            runs, heap_runs = [], []
            for _ in range(3):
                t0 = time.perf_counter()
                search_rows(graph, sources, False, np.float64, out=out)
                runs.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                _heap_lanes(graph.indptr, graph.indices, graph.weights, graph.rank[sources],
                            lanes, 0)
                heap_runs.append(time.perf_counter() - t0)
            per_source = float(np.median(runs)) / n_sources
            heap = float(np.median(heap_runs)) / n_sources
            touched = (graph.indptr.nbytes + graph.indices.nbytes + graph.weights.nbytes
                       + graph.rank.nbytes + 8 * T)  # + the float64 distances
            row = {"T": T, "edges": int(graph.indices.size), "ms_per_source": 1e3 * per_source,
                   "heap_ms_per_source": 1e3 * heap, "ratio_to_heap": per_source / heap,
                   "sweeps_kept": not graph.hint.get("heap"),
                   "ns_per_T_log_T": 1e9 * per_source / (T * math.log(T)),
                   "bytes_touched_per_source_mb": touched / 1e6}
            rows.append(row)
            logger.info("T=%d: %.2f ms per source (heap %.2f)", T, row["ms_per_source"],
                        row["heap_ms_per_source"])
        base = rows[0]["ns_per_T_log_T"]
        for row in rows:
            row["ratio_to_smallest_T"] = row["ns_per_T_log_T"] / base
        return {"n_sources": n_sources, "n_neighbors": n_neighbors, "threads": 1, "rows": rows}


def run_stored(stored: StoredGraph, n_sources: int = 63, seed: int = 0) -> dict:
    """One whole-graph shortest-path task over ``stored``, on one thread.

    As a fit's path task runs it (:func:`dr_dask.graph.sssp.lane_batches` over the graph
    opened whole, float32 lanes, no rows written): ``n_sources`` seeded random sources in
    batches of up to 64 lanes, the first source by the heap.

    Returns
    -------
    dict
        ``open_seconds`` (reading and reordering the graph), per batch its ``sources``,
        ``heap_seconds`` (first batch), ``passes`` ([nodes recomputed, seconds] per sweep)
        and ``seconds``; ``seconds_per_source``, and ``peak_rss_gb`` of this process.
    """
    from dr_dask.graph.sssp import lane_batches, lanes_dtype

    started = time.perf_counter()
    graph = stored.open()
    opened = time.perf_counter() - started
    sources = np.random.RandomState(seed).choice(graph.n_nodes, min(n_sources, graph.n_nodes),
                                                 replace=False)
    dtype = lanes_dtype(graph.weights.dtype, np.float32)
    batches: list[dict[str, Any]] = []
    started = last = time.perf_counter()
    for _, m, _lanes in lane_batches(graph, sources, dtype, record=batches):
        now = time.perf_counter()
        batches[-1]["seconds"], last = now - last, now
        logger.info("%d sources in %.1f s, %d sweep passes", m, batches[-1]["seconds"],
                    len(batches[-1]["passes"]))
    total = time.perf_counter() - started
    return {"graph": stored.location.url, "nodes": graph.n_nodes, "edges": int(graph.indices.size),
            "open_seconds": opened, "batches": batches, "seconds": total,
            "seconds_per_source": total / max(len(sources), 1),
            "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6}
