"""``dr-dask bench search-memory``: the partitioned neighbour search's memory per worker.

The inverted-list search (``kneighbors(algorithm="ivf")``; ``docs/scaling.md``) is built so
that no process holds all rows: a worker holds the lists it searches and the queries routed to
them. Its largest worker's memory should then fall about as 1/W with W workers. This bench
runs it on the sinusoid (N=100, k=10, read from a chunked Zarr store) on LocalClusters of 1, 2
and 4 worker processes of one thread each, samples every worker's resident set (and the
client's, which holds the scheduler and receives the T x k result) during the search, and
reports the largest worker's peak and its ratio to the peak at W=1, both as measured and above
the workers' idle RSS (what a worker holds after imports and a warm-up search).
"""

from __future__ import annotations

import logging
import os

from dr_dask.bench._common import PeakRSSEach, bench_workdir, dataset_store, release_memory
from dr_dask.bench.scale import N_FEATURES, N_NEIGHBORS
from dr_dask.runtime.cluster import run_on_workers
from dr_dask.runtime.resources import timed

logger = logging.getLogger(__name__)

WORKERS = (1, 2, 4)
#: The figure the partitioned search is judged by: 2 x 10^6 rows (a 0.8 GB float32 store).
DEFAULT_T = 2_000_000
#: Rows of the warm-up search (imports, compiled kernels) before the measured one.
WARM_ROWS = 5000


def search_at(source: str, n_workers: int) -> dict:
    """One IVF search of the store's rows on a fresh LocalCluster of ``n_workers`` processes
    of one thread: seconds, and each process's idle and peak RSS (GB)."""
    from distributed import Client, LocalCluster

    from dr_dask.graph.knn import kneighbors
    from dr_dask.io.inputs import open_dataset
    from dr_dask.runtime.cluster import local_cluster_kwargs

    kwargs = {**local_cluster_kwargs(n_workers), "threads_per_worker": 1}
    with LocalCluster(**kwargs) as cluster, Client(cluster) as client:
        X = open_dataset(source).data
        kneighbors(X[:WARM_ROWS], N_NEIGHBORS, algorithm="ivf", client=client)
        release_memory(client)
        workers = run_on_workers(client, os.getpid)
        with PeakRSSEach({**workers, "client": os.getpid()}) as mem, timed() as t:
            kneighbors(X, N_NEIGHBORS, algorithm="ivf", client=client)
    largest = max(workers, key=lambda w: mem.peaks[w])
    return {
        "workers": n_workers, "seconds": t["seconds"],
        "largest_worker_peak_gb": mem.peaks[largest] / 1e9,
        "largest_worker_idle_gb": mem.start[largest] / 1e9,
        "worker_peaks_gb": sorted(mem.peaks[w] / 1e9 for w in workers),
        "client_peak_gb": mem.peaks["client"] / 1e9,
        "client_idle_gb": mem.start["client"] / 1e9,
    }


def run_search_memory(T: int = DEFAULT_T, workers: tuple[int, ...] | None = None,
                      workdir: str | None = None) -> dict:
    """The IVF search at each worker count; per count the ratios of the largest worker's peak
    (``peak_ratio``) and of its growth above idle (``growth_ratio``) to the first count's
    (target: about ``workers[0] / W``).

    Parameters
    ----------
    T : int
        Rows of the sinusoid (N=100).
    workers : tuple of int, optional
        Worker processes of each LocalCluster, one thread each (default ``WORKERS``); the
        first is the reference.
    workdir : str, optional
        Where the dataset goes (reused across runs); default a temporary directory.

    Returns
    -------
    dict
        ``rows`` (one per worker count: seconds, the largest worker's peak and idle RSS, every
        worker's peak, the client's peak and idle, the ratios) and the settings.
    """
    with bench_workdir(workdir, "search") as workdir:
        load_before = os.getloadavg()
        source, _ = dataset_store(workdir, "sinusoidal", T, N_FEATURES)
        rows = []
        for W in workers or WORKERS:
            logger.info("search-memory: T=%d on %d workers", T, W)
            rows.append(search_at(source, W))
    ref = rows[0]

    def growth(r: dict) -> float:
        return r["largest_worker_peak_gb"] - r["largest_worker_idle_gb"]

    for r in rows:
        r["peak_ratio"] = r["largest_worker_peak_gb"] / ref["largest_worker_peak_gb"]
        r["growth_ratio"] = growth(r) / growth(ref)
        r["target_ratio"] = ref["workers"] / r["workers"]
    return {"dataset": "sinusoidal", "T": T, "N": N_FEATURES, "n_neighbors": N_NEIGHBORS,
            "algorithm": "ivf", "threads_per_worker": 1,
            "load_average": {"before": load_before, "after": os.getloadavg()}, "rows": rows}
