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
kernels by an untimed fit of 300 rows, then runs the timed fits. Its peak is that process and
its workers, and nothing an earlier method left behind; scikit-learn's is its own process.
The data are read into memory before the clock starts: the methods are timed, not the reads.

``--as-user`` (:func:`run_as_user`) times instead exactly the calls a user makes, with no
warm-up: ``dr_dask.Isomap(n_neighbors=5, n_components=1).fit_transform(X)`` and
``dr_dask.IKD(n_components=1, solver="geodesic", n_neighbors=5).fit_transform(X)`` with a NumPy
``X`` in memory, each call in a fresh process, once with no client (dask's threads, as in a
notebook) and once beside a LocalCluster of ``n_workers`` processes started in that process
(its start is not timed, its workers' first tasks are). scikit-learn's ``Isomap`` runs the
same way in each repeat, so every ratio compares runs under the same load. Before the
repeats, each method's first call after install is timed (no client): a fresh process whose
``NUMBA_CACHE_DIR`` is empty compiles the kernels, as on a new machine, against the later
calls' median; and once more after the README's set-up command, whose last step
(:func:`~dr_dask.jobs.quickstart.warm_kernels`) compiles them into a cache of its own, which
the later calls (and their LocalClusters' workers) then read.
"""

from __future__ import annotations

import logging
import os
import tempfile
from typing import Any
from unittest import mock

from dr_dask.bench._common import bench_workdir, dataset_arrays, timed_fits
from dr_dask.bench.isomap import _sklearn_in_child
from dr_dask.runtime.resources import PeakRSS, timed, tree_rss

logger = logging.getLogger(__name__)

#: Targets, as ratios to scikit-learn's time in the same run, and GB.
TARGETS = {
    "geodesic_ikd_vs_sklearn": 0.5,
    "geodesic_ikd_peak_rss_gb": 1.5,
    "isomap_vs_sklearn": 0.4,
    "full_ikd_seconds_at_10000": 5.0,
    "full_ikd_peak_rss_gb_at_20000": 2.0,
}

#: Targets of ``--as-user``: each call's time as a ratio to scikit-learn's, on either path
#: (on a cluster no slower than threads, relative to scikit-learn).
AS_USER_TARGETS = {"isomap": 0.3, "geodesic_ikd": 0.35}
#: Target of ``--as-user``'s first call after install (compiling the kernels into an empty
#: cache) against the later calls' median, no client, import included.
FIRST_CALL_TARGET = 1.5
#: The two paths of ``--as-user``: no client (dask's threads), and a LocalCluster.
AS_USER_PATHS = ("threads", "local_cluster")
#: The methods timed against scikit-learn's Isomap (``--only`` picks some).
METHODS = ("isomap", "geodesic_ikd")


def _estimator(method: str, n_neighbors: int, client: Any) -> Any:
    from dr_dask.methods.ikd import IKD
    from dr_dask.methods.isomap import Isomap

    if method == "isomap":
        return Isomap(n_neighbors=n_neighbors, n_components=1, random_state=0, client=client)
    solver = "full" if method == "full_ikd" else "geodesic"
    return IKD(n_components=1, solver=solver, n_neighbors=n_neighbors, random_state=0,
               client=client)


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

            from dr_dask.runtime.cluster import local_cluster_kwargs

            cluster = stack.enter_context(LocalCluster(**local_cluster_kwargs(n_workers)))
            client = stack.enter_context(Client(cluster))
        # imports and compiled kernels: the kernels are typed, not sized, so few rows warm them
        _estimator(method, n_neighbors, client).fit(X[:300].copy())
        release_memory(client)
        idle_gb = tree_rss() / 1e9
        m = timed_fits(lambda: _estimator(method, n_neighbors, client), X, repeats, client)
        seconds, peak_gb, est = m.seconds, m.peak_rss_gb, m.result
    return {"seconds_median": seconds, "peak_rss_gb_process_tree": peak_gb,
            "idle_process_tree_rss_gb": idle_gb, "r2_vs_latent": r2_affine(latent, est.embedding_),
            "stage_seconds": est.timings_, "embedding": est.embedding_}


def _in_fresh_process(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` in a spawned process of its own (its imports, its caches)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
        return ex.submit(fn, *args, **kwargs).result()


def _fits_in_fresh_tree(method: str, T: int, **kwargs: Any) -> dict:
    row = _in_fresh_process(_fits, method, T, **kwargs)
    logger.info("%s at T=%d: %.1f s, %.2f GB", method, T, row["seconds_median"],
                row["peak_rss_gb_process_tree"])
    return row


def run_geodesic(n_workers: int = 2, *, threads: bool = False, T: int = 10_000, N: int = 1000,
                 n_neighbors: int = 5, repeats: int = 3,
                 full_sizes: tuple[int, ...] | None = None, skip_sklearn: bool = False,
                 methods: tuple[str, ...] = METHODS, workdir: str | None = None) -> dict:
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
    methods : tuple of str
        Which of :data:`METHODS` to time (default both).
    workdir : str, optional
        Where the generated data are kept (default a temporary directory).

    Returns
    -------
    dict
        One entry per method, the settings, the targets and the machine's load averages.
    """

    from dr_dask.linalg.align import procrustes_disparity

    with bench_workdir(workdir, "geodesic") as workdir:
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
        for method in methods:
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


def _as_user_call(method: str, path: str, T: int, N: int, n_neighbors: int, n_workers: int,
                  workdir: str) -> dict:
    """One user's call in the fresh process this runs in (see the module): the estimator
    exactly as a user builds it (no client, no seed), ``fit_transform`` on the NumPy rows."""
    import contextlib

    from numba.core.event import install_recorder

    from dr_dask.metrics import r2_affine

    X, latent = dataset_arrays(workdir, "sinusoidal", T, N)
    row: dict[str, Any] = {}
    with timed(row, "import_seconds"):  # what the first ``dr_dask.Isomap`` attribute loads
        import dr_dask

        make = dr_dask.Isomap if method == "isomap" else dr_dask.IKD
    with contextlib.ExitStack() as stack:
        if path == "local_cluster":
            from distributed import Client, LocalCluster

            from dr_dask.runtime.cluster import local_cluster_kwargs

            with timed(row, "cluster_start_seconds"):
                cluster = stack.enter_context(LocalCluster(**local_cluster_kwargs(n_workers)))
                stack.enter_context(Client(cluster))  # the default client: no client= given
        if method == "isomap":
            est = make(n_neighbors=n_neighbors, n_components=1)
        else:
            est = make(n_components=1, solver="geodesic", n_neighbors=n_neighbors)
        # numba's compilations in this process (not its workers'): none when the kernels
        # come from the cache
        with PeakRSS() as mem, timed(row, "seconds"), install_recorder(
                "numba:compile") as compiled:
            Y = est.fit_transform(X)
        row["peak_rss_gb_process_tree"] = mem.peak_gb
        # which kernels, by name and argument types: a cache that lacks one names it
        row["kernels_compiled"] = sorted(
            f"{e.data['dispatcher'].py_func.__qualname__}{tuple(map(str, e.data['args']))}"
            for _, e in compiled.buffer if e.is_end)
    row.update(stage_seconds=est.timings_, r2_vs_latent=r2_affine(latent, Y), embedding=Y)
    return row


def run_as_user(n_workers: int = 2, *, T: int = 10_000, N: int = 1000, n_neighbors: int = 5,
                repeats: int = 3, methods: tuple[str, ...] = METHODS,
                workdir: str | None = None) -> dict:
    """The user's calls of Isomap and geodesic IKD, no client and on a LocalCluster, against
    scikit-learn's Isomap, each repeat of each in a fresh process (see the module).

    Repeats are interleaved (scikit-learn, then every call, then again), so a change of load
    on a shared machine falls on all of them alike.

    Parameters
    ----------
    n_workers : int
        Worker processes of the LocalCluster path.
    T, N : int
        Rows and features of the sinusoid.
    n_neighbors : int
        k of every method's graph.
    repeats : int
        Fresh-process calls per method and path (the median is reported).
    methods : tuple of str
        Which of :data:`METHODS` to time (default both).
    workdir : str, optional
        Where the generated data are kept (default a temporary directory).

    Returns
    -------
    dict
        ``sklearn_isomap`` and, per method and path, the median seconds, every repeat's,
        the ratio to scikit-learn's median and its target, peak RSS of the process tree,
        the last call's stage seconds and its R^2 to the latent (Isomap: its Procrustes
        disparity to scikit-learn's embedding), the first call's seconds and ratio to the
        later ones' (from an empty cache and after the set-up's warm step, whose seconds are
        ``setup_warm_seconds``); the settings and the load averages.
    """
    import contextlib
    import statistics

    from dr_dask.bench.isomap import _sklearn_isomap
    from dr_dask.jobs.quickstart import warm_kernels
    from dr_dask.linalg.align import procrustes_disparity
    from dr_dask.metrics import r2_affine

    with bench_workdir(workdir, "as_user") as workdir, contextlib.ExitStack() as stack:
        X, latent = dataset_arrays(workdir, "sinusoidal", T, N)
        out: dict[str, Any] = {
            "T": T, "N": N, "n_neighbors": n_neighbors, "repeats": repeats, "workers": n_workers,
            "mode": "as_user", "load_average_before": os.getloadavg(),
            "targets": {f"{m}_vs_sklearn": r for m, r in AS_USER_TARGETS.items()},
        }
        sk_times: list[float] = []
        sk_peak, sk_emb = 0.0, None
        runs: dict[tuple[str, str], list[dict]] = {
            (m, p): [] for m in methods for p in AS_USER_PATHS}
        # the first call after install: numba compiles the kernels into an empty cache (a
        # fresh NUMBA_CACHE_DIR, which the spawned process reads), as on a new machine
        first: dict[str, dict] = {}
        for method in methods:
            with tempfile.TemporaryDirectory() as cache, \
                    mock.patch.dict(os.environ, {"NUMBA_CACHE_DIR": cache}):
                first[method] = _in_fresh_process(_as_user_call, method, "threads", T, N,
                                                  n_neighbors, n_workers, workdir)
        # and after the README's set-up command, whose last step (the quickstart's
        # warm_kernels) compiles the kernels of such calls into the cache; the "later" calls
        # read that cache too, as do the LocalCluster's workers (the environment is theirs):
        # on a new install a timed repeat would otherwise compile them
        after_setup: dict[str, dict] = {}
        cache = stack.enter_context(tempfile.TemporaryDirectory())
        stack.enter_context(mock.patch.dict(os.environ, {"NUMBA_CACHE_DIR": cache}))
        out["setup_warm_seconds"] = _in_fresh_process(warm_kernels)
        for method in methods:
            after_setup[method] = _in_fresh_process(_as_user_call, method, "threads", T, N,
                                                    n_neighbors, n_workers, workdir)
        for rep in range(repeats):
            sk_emb, seconds, peak = _in_fresh_process(_sklearn_isomap, X, n_neighbors, 1)
            sk_times.append(seconds)
            sk_peak = max(sk_peak, peak)
            for (method, path), rows in runs.items():
                rows.append(_in_fresh_process(_as_user_call, method, path, T, N, n_neighbors,
                                              n_workers, workdir))
                logger.info("as user, %s (%s) repeat %d: %.1f s", method, path, rep + 1,
                            rows[-1]["seconds"])
        assert sk_emb is not None  # repeats >= 1: scikit-learn ran at least once
        sk = statistics.median(sk_times)
        out["sklearn_isomap"] = {"seconds_median": sk, "seconds": sk_times,
                                 "peak_rss_gb_process_tree": sk_peak,
                                 "r2_vs_latent": r2_affine(latent, sk_emb)}
        for (method, path), rows in runs.items():
            last = rows[-1]
            seconds = statistics.median(r["seconds"] for r in rows)
            row = {
                "seconds_median": seconds, "seconds": [r["seconds"] for r in rows],
                "ratio_to_sklearn": seconds / sk, "target_ratio": AS_USER_TARGETS[method],
                "peak_rss_gb_process_tree": max(r["peak_rss_gb_process_tree"] for r in rows),
                "import_seconds_median": statistics.median(r["import_seconds"] for r in rows),
                "stage_seconds": last["stage_seconds"], "r2_vs_latent": last["r2_vs_latent"],
            }
            row["meets_target"] = row["ratio_to_sklearn"] <= row["target_ratio"]
            if path == "local_cluster":
                row["cluster_start_seconds_median"] = statistics.median(
                    r["cluster_start_seconds"] for r in rows)
            else:
                later = seconds + row["import_seconds_median"]
                for name, call in (("first_call", first), ("first_call_after_setup",
                                                           after_setup)):
                    once = call[method]["seconds"] + call[method]["import_seconds"]
                    row[f"{name}_seconds"], row[f"{name}_ratio"] = once, once / later
                    row[f"{name}_kernels_compiled"] = call[method]["kernels_compiled"]
                row["first_call_target"] = FIRST_CALL_TARGET
            if method == "isomap":
                row["disparity_vs_sklearn"] = procrustes_disparity(sk_emb, last["embedding"])
            out.setdefault(method, {})[path] = row
        out["load_average_after"] = os.getloadavg()
        return out
