"""Geodesic methods against scikit-learn's Isomap on the same data, in one run.

The IKD paper's sinusoid (N=1,000 features, one latent dimension) at T=10,000 (``--T``), k=5:

- ``sklearn_isomap``: scikit-learn's ``Isomap`` (dense T x T Dijkstra + KernelPCA) in a child
  process (its Cython shortest paths hold the GIL), fit time alone;
- ``isomap``: :class:`dr_dask.methods.isomap.Isomap` on the cluster;
- ``geodesic_ikd``: :class:`dr_dask.methods.ikd.IKD` with ``solver="geodesic"``;
- ``full_ikd``: ``solver="full"`` at T and 2T (targets: 5 s at 10,000, 2 GB at 20,000).

Each row: median wall seconds over ``repeats``, peak RSS of the method's process tree, the
ratio to scikit-learn's median measured in the same run, and the stage seconds of the last fit
(where the time goes). Every method runs in a fresh process tree, as one job would: a spawned
process that starts its own LocalCluster (``n_workers`` processes, sized as ``dr-dask
--workers`` sizes them) or uses dask's threads, reads the data, loads its imports and compiled
kernels by an untimed fit of 600 rows, then runs the timed fits. Its peak is that process and
its workers, and nothing an earlier method left behind; scikit-learn's is its own process.
The data are read into memory before the clock starts: the methods are timed, not the reads.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from dr_dask.bench._common import dataset_arrays, timed_fits
from dr_dask.bench.isomap import _sklearn_in_child
from dr_dask.resources import tree_rss

logger = logging.getLogger(__name__)

#: Targets, as ratios to scikit-learn's time in the same run, and GB.
TARGETS = {
    "geodesic_ikd_vs_sklearn": 0.5,
    "geodesic_ikd_peak_rss_gb": 1.5,
    "isomap_vs_sklearn": 0.4,
    "full_ikd_seconds_at_10000": 5.0,
    "full_ikd_peak_rss_gb_at_20000": 2.0,
}


def _estimator(method: str, n_neighbors: int, client: Any) -> Any:
    from dr_dask.methods.ikd import IKD
    from dr_dask.methods.isomap import Isomap

    if method == "isomap":
        return Isomap(n_neighbors=n_neighbors, n_components=1, random_state=0, client=client)
    solver = "full" if method == "full_ikd" else "geodesic"
    return IKD(1, solver=solver, n_neighbors=n_neighbors, random_state=0, client=client)


def _fits(method: str, T: int, N: int, n_neighbors: int, repeats: int, workdir: str,
          n_workers: int, threads: bool) -> dict:
    """The timed fits of one method, in the fresh process this runs in (see the module)."""
    import contextlib

    from dr_dask.bench._common import release_memory
    from dr_dask.metrics import r2_affine

    X, latent = dataset_arrays(workdir, "sinusoidal", T, N)
    with contextlib.ExitStack() as stack:
        client = None
        if threads:
            import dask

            stack.enter_context(dask.config.set(num_workers=n_workers))
        else:
            from distributed import Client, LocalCluster

            from dr_dask.cluster import local_cluster_kwargs

            cluster = stack.enter_context(LocalCluster(**local_cluster_kwargs(n_workers)))
            client = stack.enter_context(Client(cluster))
        _estimator(method, n_neighbors, client).fit(X[:600].copy())
        release_memory(client)
        idle_gb = tree_rss() / 1e9
        seconds, peak_gb, est = timed_fits(lambda: _estimator(method, n_neighbors, client), X,
                                           repeats, client)
    return {"seconds_median": seconds, "peak_rss_gb_process_tree": peak_gb,
            "idle_process_tree_rss_gb": idle_gb, "r2_vs_latent": r2_affine(latent, est.embedding_),
            "stage_seconds": est.timings_, "embedding": est.embedding_}


def _fits_in_fresh_tree(method: str, T: int, **kwargs: Any) -> dict:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
        row = ex.submit(_fits, method, T, **kwargs).result()
    logger.info("%s at T=%d: %.1f s, %.2f GB", method, T, row["seconds_median"],
                row["peak_rss_gb_process_tree"])
    return row


def run_geodesic(n_workers: int = 2, *, threads: bool = False, T: int = 10_000, N: int = 1000,
                 n_neighbors: int = 5, repeats: int = 3,
                 full_sizes: tuple[int, ...] | None = None, skip_sklearn: bool = False,
                 workdir: str | None = None) -> dict:
    """scikit-learn Isomap, our Isomap and geodesic IKD at ``T``; full IKD at ``full_sizes``.

    Parameters
    ----------
    n_workers : int
        Worker processes of each method's LocalCluster (threads of dask's scheduler with
        ``threads``).
    threads : bool
        Run the methods on dask's threaded scheduler instead of a LocalCluster.
    T, N : int
        Rows and features of the sinusoid.
    n_neighbors : int
        k of every method's graph.
    repeats : int
        Timed fits per method (the median is reported).
    full_sizes : tuple of int, optional
        Sizes of the full-IKD rows (default ``(T, 2 T)``).
    skip_sklearn : bool
        Leave out the baseline (then no ratios).
    workdir : str, optional
        Where the generated data are kept (default a temporary directory).

    Returns
    -------
    dict
        One entry per method, the settings, the targets and the machine's load averages.
    """
    import tempfile

    from dr_dask.linalg.align import procrustes_disparity

    workdir = workdir or tempfile.mkdtemp(prefix="dr_dask_bench_geodesic_")
    out: dict[str, Any] = {
        "T": T, "N": N, "n_neighbors": n_neighbors, "repeats": repeats,
        "workers": n_workers, "scheduler": "threads" if threads else "LocalCluster",
        "load_average_before": os.getloadavg(), "targets": TARGETS,
    }
    kwargs = dict(N=N, n_neighbors=n_neighbors, repeats=repeats, workdir=workdir,
                  n_workers=n_workers, threads=threads)
    sk = sk_emb = None
    if not skip_sklearn:
        X, _ = dataset_arrays(workdir, "sinusoidal", T, N)
        sk, sk_gb, sk_emb = _sklearn_in_child(X, n_neighbors, repeats, n_components=1)
        del X
        out["sklearn_isomap"] = {"seconds_median": sk, "peak_rss_gb_process_tree": sk_gb}
    for method in ("isomap", "geodesic_ikd"):
        row = out[method] = _fits_in_fresh_tree(method, T, **kwargs)
        emb = row.pop("embedding")
        if sk:
            row["ratio_to_sklearn"] = row["seconds_median"] / sk
        if method == "isomap" and sk_emb is not None:
            row["disparity_vs_sklearn"] = procrustes_disparity(sk_emb, emb)
    for size in full_sizes or (T, 2 * T):
        row = out[f"full_ikd_T{size}"] = _fits_in_fresh_tree("full_ikd", size, **kwargs)
        row.pop("embedding")
    out["load_average_after"] = os.getloadavg()
    return out
