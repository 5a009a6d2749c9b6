"""``dr-dask bench paths-memory``: the graph stages' traffic and the shortest paths' memory.

The partitioned graph (:mod:`dr_dask.graph.partitioned`) is built once on the sinusoid (N=100,
k=10, from a chunked Zarr store) on a LocalCluster of two worker processes, counting what each
stage ships through the scheduler (task specs, :class:`~dr_dask.bench.traffic.SpecBytes`) and
reads from the store (requests and bytes per array, :func:`~dr_dask.bench.traffic.count_reads`).
Then the landmark shortest paths over it run by row blocks
(:mod:`dr_dask.graph.block_paths`) on fresh LocalClusters of 1, 2 and 4 worker processes of one
thread: every worker's resident set is sampled during the paths, and the largest worker's peak
above its idle RSS is compared with the one at W=1 (target: about 1/W), beside the rounds, the
bytes exchanged per round and the store's requests. ``--whole`` adds the same paths with every
task opening the whole graph, for comparison.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import dask
import numpy as np
import scipy.sparse as sp

from dr_dask.bench._common import PeakRSSEach, bench_workdir, dataset_store, release_memory
from dr_dask.bench.scale import N_FEATURES, N_NEIGHBORS
from dr_dask.graph.sssp import SearchGraph
from dr_dask.graph.stored import StoredGraph
from dr_dask.runtime.cluster import run_on_workers
from dr_dask.runtime.resources import timed

logger = logging.getLogger(__name__)

WORKERS = (1, 2, 4)
DEFAULT_T = 2_000_000
#: Landmarks (sources): two batches of 64 float32 lanes at the default batch bytes.
DEFAULT_LANDMARKS = 128


def _cluster(n_workers: int) -> tuple[Any, Any]:
    from distributed import Client, LocalCluster

    from dr_dask.runtime.cluster import local_cluster_kwargs

    cluster = LocalCluster(**{**local_cluster_kwargs(n_workers), "threads_per_worker": 1})
    return cluster, Client(cluster)


def build_graph(source: str, where: str) -> tuple[Any, dict]:
    """The partitioned graph of the store's rows at ``where``, with each stage's seconds,
    scheduler bytes (prefix -> [tasks, bytes, largest]) and store reads (array -> [requests,
    bytes])."""
    from dr_dask.bench.traffic import SpecBytes, count_reads, spec_bytes
    from dr_dask.graph.partitioned import partitioned_graph
    from dr_dask.io.inputs import open_dataset
    from dr_dask.io.storage import location

    cluster, client = _cluster(2)
    try:
        client.register_plugin(SpecBytes())
        X = open_dataset(source).data
        with count_reads(client) as reads:
            pg = partitioned_graph(X, N_NEIGHBORS, location(where), client=client,
                                   random_state=0)
        specs = spec_bytes(client)
    finally:
        client.close()
        cluster.close()
    return pg, {"seconds": pg.seconds, "scheduler": specs, "reads": reads,
                "edges": pg.n_edges, "input_bytes": int(X.nbytes)}


def paths_at(graph: Any, landmarks: np.ndarray, n_workers: int, out: str,
             blocks: bool) -> dict:
    """The landmark paths over ``graph`` on a fresh cluster of ``n_workers``: seconds, the
    largest worker's peak and idle RSS (GB), the rounds and what they exchanged, the
    scheduler's bytes and the store's reads."""
    from dr_dask.bench.traffic import SpecBytes, count_reads, spec_bytes
    from dr_dask.graph.paths import GeodesicRows

    cluster, client = _cluster(n_workers)
    try:
        client.register_plugin(SpecBytes())
        # warm-up on a small chain (imports, the compiled kernels' caches in every worker),
        # so that the measured run starts without the graph in any worker: float32 weights
        # and blocks that exchange distances, as in the measured run, else its first tasks
        # load (or compile) kernels for those types: 65 MB of a worker's peak at W = 4
        chain = sp.diags([np.ones(999, np.float32)], [1], shape=(1000, 1000), format="csr")
        warm = StoredGraph.write(SearchGraph.of(chain), out + "_warm_graph")
        with dask.config.set({"dr_dask.graph.paths-block-nodes": 250}):
            GeodesicRows.compute(warm, np.arange(0, 1000, 50), client=client,
                                 dtype=np.float32, out=out + "_warm", blocks=blocks)
        release_memory(client)
        spec_bytes(client)
        workers = run_on_workers(client, os.getpid)
        with count_reads(client) as reads, PeakRSSEach(
                {**workers, "client": os.getpid()}) as mem, timed() as t:
            rows = GeodesicRows.compute(graph, landmarks, client=client, dtype=np.float32,
                                        out=out, blocks=blocks)
        specs = spec_bytes(client)
    finally:
        client.close()
        cluster.close()
    largest = max(workers, key=lambda w: mem.peaks[w] - mem.start[w])
    rep = rows.report
    return {
        "workers": n_workers, "blocks": blocks, "seconds": t["seconds"],
        "largest_worker_peak_gb": mem.peaks[largest] / 1e9,
        "largest_worker_idle_gb": mem.start[largest] / 1e9,
        "largest_worker_growth_gb": (mem.peaks[largest] - mem.start[largest]) / 1e9,
        "client_peak_gb": mem.peaks["client"] / 1e9,
        "rounds": rep.get("rounds"), "path_blocks": rep.get("blocks"),
        "exchanged_mb_per_round": [b / 1e6 for b in rep.get("bytes", [])],
        "scheduler": specs, "reads": reads,
    }


def run_paths_memory(T: int = DEFAULT_T, workers: tuple[int, ...] | None = None,
                     n_landmarks: int = DEFAULT_LANDMARKS, whole: bool = False,
                     workdir: str | None = None) -> dict:
    """The graph's build (traffic per stage) and the paths at each worker count; per count the
    ratio of the largest worker's growth above idle to the first count's (``growth_ratio``;
    target about ``workers[0] / W``).

    Parameters
    ----------
    T : int
        Rows of the sinusoid (N=100).
    workers : tuple of int, optional
        Worker processes of each LocalCluster (default ``WORKERS``); the first is the
        reference.
    n_landmarks : int
        Sources of the paths (seeded).
    whole : bool
        Also run the paths with every task opening the whole graph.
    workdir : str, optional
        Where the dataset and the graph go; default a temporary directory (deleted).
    """
    with bench_workdir(workdir, "paths") as workdir:
        load_before = os.getloadavg()
        source, _ = dataset_store(workdir, "sinusoidal", T, N_FEATURES)
        graph_dir = os.path.join(workdir, f"graph_T{T}")
        try:  # a graph built by an earlier run in this workdir is reused (not measured again)
            graph, build = StoredGraph.at(os.path.join(graph_dir, "graph")), None
        except (ValueError, FileNotFoundError):
            pg, build = build_graph(source, graph_dir)
            graph = pg.graph
        landmarks = np.sort(np.random.default_rng(0).choice(T, n_landmarks, replace=False))
        rows = []
        for blocks in (True, False) if whole else (True,):
            for W in workers or WORKERS:
                logger.info("paths-memory: T=%d on %d workers (blocks=%s)", T, W, blocks)
                rows.append(paths_at(graph, landmarks, W,
                                     os.path.join(workdir, f"paths_{W}_{blocks}"), blocks))
                with open(os.path.join(workdir, "paths_memory_partial.json"), "w") as f:
                    json.dump(rows, f, default=str)  # a long run's rows so far
    for r in rows:
        ref = next(x for x in rows if x["blocks"] == r["blocks"])
        r["growth_ratio"] = r["largest_worker_growth_gb"] / ref["largest_worker_growth_gb"]
        r["target_ratio"] = ref["workers"] / r["workers"]
    return {"dataset": "sinusoidal", "T": T, "N": N_FEATURES, "n_neighbors": N_NEIGHBORS,
            "n_landmarks": n_landmarks, "build": build, "rows": rows,
            "load_average": {"before": load_before, "after": os.getloadavg()}}
