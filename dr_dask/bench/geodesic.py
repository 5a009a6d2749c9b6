"""Geodesic methods against scikit-learn's Isomap on the same data, in one run (issue 15).

The IKD paper's sinusoid (N=1,000 features, one latent dimension) at T=10,000 (``--T``), k=5:

- ``sklearn_isomap``: scikit-learn's ``Isomap`` (dense T x T Dijkstra + KernelPCA) in a child
  process (its Cython shortest paths hold the GIL), fit time alone;
- ``isomap``: :class:`dr_dask.methods.isomap.Isomap` on the cluster;
- ``geodesic_ikd``: :class:`dr_dask.methods.ikd.IKD` with ``solver="geodesic"``;
- ``full_ikd``: ``solver="full"`` at T and 2T (targets: 5 s at 10,000, 2 GB at 20,000).

Each row: median wall seconds over ``repeats``, peak RSS of the whole process tree (the
workers too), the ratio to scikit-learn's median measured in the same run, and the stage
seconds of the last fit (where the time goes). An untimed small fit of every method first
loads the workers' imports and compiled kernels (not the method's cost); methods run in the
order listed on the same workers, each after the memory earlier fits freed is given back to
the OS (:func:`~dr_dask.bench._common.release_memory`). The data are generated once, in
memory: the methods are timed, not the reads.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from dr_dask.bench._common import dataset_store, n_workers, timed_fits
from dr_dask.bench.isomap import _sklearn_in_child
from dr_dask.resources import tree_rss

logger = logging.getLogger(__name__)

#: Targets of issue 15, as ratios to scikit-learn's time in the same run, and GB.
TARGETS = {
    "geodesic_ikd_vs_sklearn": 0.5,
    "geodesic_ikd_peak_rss_gb": 1.5,
    "isomap_vs_sklearn": 0.4,
    "full_ikd_seconds_at_10000": 5.0,
    "full_ikd_peak_rss_gb_at_20000": 2.0,
}


def _data(workdir: str, T: int, N: int) -> tuple[np.ndarray, np.ndarray]:
    import zarr

    src, latent = dataset_store(workdir, "sinusoidal", T, N)
    path = src.rsplit(":", 1)[0]
    return np.asarray(zarr.open_group(path, mode="r")["X"][...]), latent


def _row(seconds: float, peak_gb: float, est: Any, latent: np.ndarray, sk_seconds: float | None,
         stages: dict) -> dict:
    from dr_dask.metrics import r2_affine

    row = {"seconds_median": seconds, "peak_rss_gb_process_tree": peak_gb,
           "r2_vs_latent": r2_affine(latent, est.embedding_), "stage_seconds": stages}
    if sk_seconds:
        row["ratio_to_sklearn"] = seconds / sk_seconds
    return row


def run_geodesic(client: Any, *, T: int = 10_000, N: int = 1000, n_neighbors: int = 5,
                 repeats: int = 3, full_sizes: tuple[int, ...] | None = None,
                 skip_sklearn: bool = False, workdir: str | None = None) -> dict:
    """scikit-learn Isomap, our Isomap and geodesic IKD at ``T``; full IKD at ``full_sizes``.

    Parameters
    ----------
    client : distributed.Client or None
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
    from dr_dask.methods.ikd import IKD
    from dr_dask.methods.isomap import Isomap

    workdir = workdir or tempfile.mkdtemp(prefix="dr_dask_bench_geodesic_")
    X, latent = _data(workdir, T, N)
    out: dict[str, Any] = {
        "T": T, "N": N, "n_neighbors": n_neighbors, "repeats": repeats,
        "workers": n_workers(client),
        "load_average_before": os.getloadavg(), "targets": TARGETS,
        "idle_process_tree_rss_gb": tree_rss() / 1e9,
    }
    small = X[:600].copy()

    def warm_up() -> None:
        # an untimed small fit of every method loads the workers' imports and compiled
        # kernels (once per process, not the method's cost). Workers are not restarted
        # between methods (a restart can take minutes on a loaded machine): the memory earlier
        # fits freed is given back to the OS before each method instead (timed_fits)
        Isomap(n_neighbors=n_neighbors, n_components=1, client=client).fit(small)
        IKD(1, solver="geodesic", n_neighbors=n_neighbors, client=client).fit(small)
        IKD(1, solver="full", client=client).fit(small)

    warm_up()
    sk = sk_emb = None
    if not skip_sklearn:
        # the baseline first, so that memory our workers keep cannot inflate its figure
        sk, sk_gb, sk_emb = _sklearn_in_child(X, n_neighbors, repeats, n_components=1)
        out["sklearn_isomap"] = {"seconds_median": sk, "peak_rss_gb_process_tree": sk_gb}
    fits = {
        "isomap": lambda: Isomap(n_neighbors=n_neighbors, n_components=1, random_state=0,
                                 client=client),
        "geodesic_ikd": lambda: IKD(1, solver="geodesic", n_neighbors=n_neighbors,
                                    random_state=0, client=client),
    }
    for name, make in fits.items():
        secs, peak, est = timed_fits(make, X, repeats, client)
        out[name] = _row(secs, peak, est, latent, sk, est.timings_)
        if name == "isomap" and sk_emb is not None:
            out[name]["disparity_vs_sklearn"] = procrustes_disparity(sk_emb, est.embedding_)
        logger.info("%s: %.1f s, %.2f GB", name, secs, peak)
        # the next method's peak must not include this one's fitted state (Isomap keeps the
        # 0.8 GB dist_matrix_ at T=10,000)
        est = None
    del X
    for size in full_sizes or (T, 2 * T):
        Xf, lat = _data(workdir, size, N)
        secs, peak, est = timed_fits(lambda: IKD(1, solver="full", random_state=0,
                                                 client=client), Xf, repeats, client)
        out[f"full_ikd_T{size}"] = _row(secs, peak, est, lat, None, est.timings_)
        del Xf
    out["load_average_after"] = os.getloadavg()
    return out
