"""``dr-dask bench scale``: the scaling table.

The IKD paper's sinusoidal data with N=100 are written to a chunked Zarr store and read from
it by each method, one fit per size: the landmark variants (landmark IKD, geodesic; Landmark
Isomap) at T = 10k, 30k, 100k, 300k, 1M, and the exact methods (full IKD, geodesic IKD,
Isomap: O(T^2) work, tiles or rows on disk past the memory budget) at T = 10k, 20k, 30k
(``--quick``: 2k, 5k, 10k for every method; ``min_T``/``max_T`` bound them). Per fit: wall
time, peak RSS of the whole process tree (driver + workers) and of the driver alone, R^2 of
the 1-D embedding on the latent after affine alignment, and the stage seconds; per method the
fitted slope of log time (and log memory) against log T. Per T also the kNN alone (the search
the methods run on the raw rows: time, and recall on 1,000 sampled rows against their
brute-force neighbours).
The slopes are the point of the table: 1 is linear scaling, 2 is the quadratic cost of the
exact methods.

Every fit also reports its trustworthiness (Venna & Kaski 2001, as scikit-learn computes it,
k=10) on a seeded sample of 5,000 rows. ``peer="umap"`` fits umap-learn (McInnes et al. 2018)
on the same rows at every size, timed the same way (its read of the store included), and
reports each method's time as a ratio to umap's at the same T.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from functools import partial
from typing import Any

import numpy as np

from dr_dask.bench._common import bench_workdir, dataset_store, n_workers, timed_fits
from dr_dask.bench.knn import QUERIES
from dr_dask.bench.task_memory import take_task_memory
from dr_dask.graph.knn_tol import DEFAULT_KNN_TOL
from dr_dask.runtime.resources import timed

logger = logging.getLogger(__name__)

SIZES = (10_000, 30_000, 100_000, 300_000, 1_000_000)
#: The exact methods' sizes: T^2 work and T x T tiles or rows (3.6 GB of float64 tiles at 30k).
EXACT_SIZES = (10_000, 20_000, 30_000)
QUICK_SIZES = (2_000, 5_000, 10_000)
N_FEATURES = 100
N_NEIGHBORS = 10
LANDMARK_METHODS = ("landmark_ikd", "landmark_isomap")
EXACT_METHODS = ("full_ikd", "geodesic_ikd", "isomap")
METHODS = LANDMARK_METHODS + EXACT_METHODS
#: Rows of the seeded sample the trustworthiness is computed on (scikit-learn's is T^2).
TRUST_ROWS = 5000
#: Embeddings fitted beside ours for comparison (``peer=``; each an optional extra).
PEERS = ("umap",)


def _estimator(method: str, n_landmarks: int | None, client: Any, search: dict) -> Any:
    """A fresh estimator of ``method`` (``n_landmarks``: None for the exact methods)."""
    from dr_dask.methods.ikd import IKD
    from dr_dask.methods.isomap import Isomap
    from dr_dask.methods.landmark_isomap import LandmarkIsomap

    if method == "full_ikd":
        return IKD(n_components=1, solver="full", random_state=0, client=client)
    if method == "geodesic_ikd":
        return IKD(n_components=1, solver="geodesic", n_neighbors=N_NEIGHBORS, random_state=0,
                   client=client, **search)
    if method == "isomap":
        return Isomap(n_neighbors=N_NEIGHBORS, n_components=1, random_state=0, client=client,
                      **search)
    if method == "landmark_ikd":
        # tile_cache="auto" puts the L x T rows in Zarr above the tile budget
        return IKD(n_components=1, solver="geodesic", n_landmarks=n_landmarks,
                   n_neighbors=N_NEIGHBORS, dtype="float32", random_state=0, client=client,
                   **search)
    assert n_landmarks is not None  # run_scale gives the landmark methods their L
    # as a user calls it: above the in-memory budget the L x T rows go to the fit's scratch
    # (deleted with the estimator), as landmark IKD's do
    return LandmarkIsomap(n_neighbors=N_NEIGHBORS, n_components=1, n_landmarks=n_landmarks,
                          random_state=0, client=client, **search)


def _umap() -> Any:
    """umap-learn as its documentation recommends for speed: no seed, so that its layout
    optimisation runs on every core (a ``random_state`` forces one thread); its defaults
    otherwise (spectral initialisation, min_dist=0.1, its approximate neighbour search)."""
    import umap  # lazy: an optional extra

    return umap.UMAP(n_components=1, n_neighbors=N_NEIGHBORS, n_jobs=-1)


class _FromStore:
    """A peer estimator fitted on the rows of a :func:`dataset_store` source, read inside
    ``fit`` as our estimators read the store inside theirs (the read is in the fit's time)."""

    def __init__(self, estimator: Any):
        self.estimator = estimator

    def fit(self, source: str) -> _FromStore:
        import zarr

        from dr_dask.io.storage import read_array

        self.timings_: dict = {}
        with timed(self.timings_, "read"):
            X = read_array(zarr.open_group(source.rsplit(":", 1)[0], mode="r"), "X")
        with timed(self.timings_, "fit"):
            self.embedding_ = self.estimator.fit_transform(X)
        return self


def trust_sample(X: Any, T: int, n_rows: int = TRUST_ROWS, seed: int = 0) -> tuple[np.ndarray,
                                                                                   np.ndarray]:
    """A seeded sample of at most ``n_rows`` rows of X: their sorted indices and the rows."""
    idx = np.sort(np.random.default_rng(seed).choice(T, min(T, n_rows), replace=False))
    return idx, np.asarray(X[idx])


def size_ladder(method: str, quick: bool, min_T: int | None, max_T: int | None,
                sizes: tuple[int, ...] = ()) -> list[int]:
    """The sizes ``method`` runs at: ``sizes`` if given, else its ladder, within
    ``[min_T, max_T]``."""
    ladder = sizes or (QUICK_SIZES if quick else
                       (SIZES if method in LANDMARK_METHODS else EXACT_SIZES))
    return [T for T in ladder if (min_T is None or min_T <= T) and (max_T is None or max_T >= T)]


def fitted_slope(T: list[int], values: list[float]) -> float | None:
    """Least-squares slope of log(value) against log(T); None below two sizes."""
    if len(T) < 2:
        return None
    return float(np.polyfit(np.log(T), np.log(values), 1)[0])


def knn_recall(X: Any, k: int, n_queries: int, client: Any, knn: str = "exact",
               n_probe: int | None = None, seed: int = 0,
               knn_tol: float = DEFAULT_KNN_TOL) -> dict:
    """Time of the package's kNN in the estimators' mode ``knn`` on X, and its recall and
    distance error on sampled rows against the exact (brute-force) neighbours of those rows."""
    from dr_dask.graph.knn import estimate_quality, kneighbors, knn_algorithm

    algorithm = knn_algorithm(knn, X.shape[0], X.shape[1])
    with timed() as t:
        _, idx = kneighbors(X, k, client=client, algorithm=algorithm, n_probe=n_probe,
                            random_state=seed, knn_tol=knn_tol)
    recall, error, _ = estimate_quality(X, idx, n_rows=n_queries, random_state=seed,
                                        client=client)
    return {"seconds": t["seconds"], "recall": recall, "distance_error": error,
            "n_queries": n_queries, "k": k, "algorithm": algorithm}


def _ladders(methods: tuple[str, ...], peer: str | None, quick: bool, min_T: int | None,
             max_T: int | None, sizes: Any) -> dict[str, list[int]]:
    """Each method's sizes, the arguments checked (an unknown method or peer, or no size in
    range, is a ValueError naming it)."""
    unknown = set(methods) - set(METHODS)
    if unknown:
        raise ValueError(f"unknown method(s) {sorted(unknown)}; choose from {list(METHODS)}")
    if peer is not None and peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}; choose from {list(PEERS)}")
    ladders = {m: size_ladder(m, quick, min_T, max_T, sizes) for m in methods}
    if not set().union(*ladders.values()):
        raise ValueError(f"no size of {sorted(set(SIZES) | set(EXACT_SIZES))} is in "
                         f"[min_T={min_T}, max_T={max_T}]")
    return ladders


def run_scale(client: Any, *, quick: bool = False, min_T: int | None = None,
              max_T: int | None = None, n_landmarks: int = 500, methods: tuple[str, ...] = METHODS,
              workdir: str | None = None, knn: str = "exact",
              n_probe: int | None = None, peer: str | None = None,
              sizes: tuple[int, ...] = (), search_alone: bool = True,
              knn_tol: float = DEFAULT_KNN_TOL) -> dict:
    """Fit each method at each size; return the table rows and the fitted slopes.

    Parameters
    ----------
    client : distributed.Client or None
    quick : bool
        Sizes ``QUICK_SIZES`` for every method instead of ``SIZES`` (landmark variants) and
        ``EXACT_SIZES`` (exact methods).
    min_T, max_T : int, optional
        Skip sizes below / above these (one size alone: a long run on its own).
    n_landmarks : int
        L (capped at T / 10 for the small sizes).
    methods : tuple of str
        A subset of ``METHODS``.
    workdir : str, optional
        Where the datasets go (reused across runs); default a temporary directory.
    knn, n_probe, knn_tol : the estimators' neighbour search (every method but full IKD,
        which builds no graph) and the timed kNN's.
    peer : {"umap"}, optional
        Also fit this method (one of ``PEERS``; its package must be installed) at every size
        any of ``methods`` runs at.
    search_alone : bool
        Also time the kNN search alone at each size (``knn`` rows). Off for the largest sizes,
        where it costs as much as a fit's own search and every fit reports its estimated
        recall anyway.

    Returns
    -------
    dict
        ``rows`` (one per method and T, the peer's included: seconds, peak RSS, R^2,
        trustworthiness on ``TRUST_ROWS`` sampled rows, the estimated kNN recall, stage
        seconds), ``slopes`` (per method, of time and of peak RSS), ``knn`` (per T: seconds,
        recall), with a peer ``peer_ratio`` (per method and T: its seconds over the peer's) and
        the settings.
    """
    from sklearn.manifold import trustworthiness

    from dr_dask.io.inputs import open_dataset
    from dr_dask.metrics import r2_affine

    ladders = _ladders(methods, peer, quick, min_T, max_T, sizes)
    all_sizes = sorted(set().union(*ladders.values()))
    with bench_workdir(workdir, "scale") as workdir:
        rows, knn_rows = [], []
        search = {"knn": knn, "n_probe": n_probe, "knn_tol": knn_tol}
        load_before = os.getloadavg()
        if peer is not None:
            # its first fit in a process compiles its kernels for float32 rows (10-15 s; 30-45 s
            # for its approximate neighbour search, which it uses from 4,096 rows): not part of
            # any size's figures
            for n in sorted({1000 if T < 4096 else 5000 for T in all_sizes}):
                rows_n = np.random.default_rng(0).normal(size=(n, N_FEATURES))
                _umap().fit(rows_n.astype(np.float32))
        for T in all_sizes:
            src, Z = dataset_store(workdir, "sinusoidal", T, N_FEATURES)
            inp = open_dataset(src)
            if search_alone:
                knn_rows.append({"T": T, **knn_recall(inp.data, N_NEIGHBORS,
                                                      min(T, QUERIES), client, knn, n_probe,
                                                      knn_tol=knn_tol)})
            idx, X_sample = trust_sample(inp.data, T)
            # (method, L, a fresh estimator, what it fits)
            fits: list[tuple[str, int | None, Callable[[], Any], Any]] = []
            for name in (m for m in methods if T in ladders[m]):
                L = min(n_landmarks, T // 10) if name in LANDMARK_METHODS else None
                fits.append((name, L, partial(_estimator, name, L, client,
                                              {} if name == "full_ikd" else search),
                             # the IKD solvers read the store themselves (chunks, identity)
                             inp if name.endswith("_ikd") else inp.data))
            if peer is not None:
                fits.append((peer, None, lambda: _FromStore(_umap()), src))
            for method, L, make, data in fits:
                logger.info("scale: %s at T=%d, L=%s", method, T, L)
                if client is not None:
                    take_task_memory(client)  # from here on, this fit's tasks
                m = timed_fits(make, data, 1, client)
                est, emb = m.result, np.asarray(m.result.embedding_)
                tasks = take_task_memory(client) if client is not None else {}
                rows.append({
                    "method": method, "T": T, "n_landmarks": L, "seconds": m.seconds,
                    "peak_rss_gb": m.peak_rss_gb, "client_peak_gb": m.client_peak_gb,
                    "r2": r2_affine(Z, emb),
                    "trustworthiness": float(trustworthiness(X_sample, emb[idx],
                                                             n_neighbors=N_NEIGHBORS)),
                    "knn_recall": getattr(est, "knn_recall_", None),
                    "knn_distance_error": getattr(est, "knn_distance_error_", None),
                    "stage_seconds": est.timings_,
                    # the largest rise of a worker's RSS during one task, per task prefix
                    "largest_task_gb": {p: round(n / 1e9, 3) for p, n in sorted(
                        tasks.items(), key=lambda t: -t[1])},
                })
                del est, m  # a landmark fit's rows in its scratch go with it
    slopes = method_slopes(rows, (*methods, *([peer] if peer else [])))
    results = {
        "dataset": "sinusoidal", "N": N_FEATURES, "n_neighbors": N_NEIGHBORS,
        "workers": n_workers(client), "trust_rows": TRUST_ROWS,
        "knn_mode": knn, "n_probe": n_probe, "knn_tol": knn_tol,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "rows": rows, "slopes": slopes, "knn": knn_rows,
    }
    if peer is not None:
        results["peer"] = peer
        results["peer_ratio"] = peer_ratios(rows, peer)
    return results


def method_slopes(rows: list[dict], methods: tuple[str, ...]) -> dict:
    """Per method, the fitted slopes of log time and of log peak RSS against log T."""
    slopes = {}
    for method in methods:
        mine = [r for r in rows if r["method"] == method]
        Ts = [r["T"] for r in mine]
        slopes[method] = {
            "time": fitted_slope(Ts, [r["seconds"] for r in mine]),
            "peak_rss": fitted_slope(Ts, [r["peak_rss_gb"] for r in mine]),
        }
    return slopes


def peer_ratios(rows: list[dict], peer: str) -> dict:
    """Each method's time over the peer's at the same T: ``{method: {T: ratio}}`` (below 1:
    faster than the peer)."""
    theirs = {r["T"]: r["seconds"] for r in rows if r["method"] == peer}
    out: dict = {}
    for r in rows:
        if r["method"] != peer:
            out.setdefault(r["method"], {})[r["T"]] = r["seconds"] / theirs[r["T"]]
    return out


def plot_scale(results: dict, path: str) -> str:
    """Log-log time and peak RSS against T per method beside a table of the fitted slopes, as
    PNG (:func:`dr_dask.report.plot.report_page`)."""
    from dr_dask.report import plot

    panels = []
    for key, label in (("seconds", "wall time (s)"),
                       ("peak_rss_gb", "peak RSS, process tree (GB)")):
        series = {}
        for method in results["slopes"]:
            mine = [r for r in results["rows"] if r["method"] == method]
            series[method] = ([r["T"] for r in mine], [r[key] for r in mine])
        panels.append(plot.loglog(series, xlabel="T (points)", ylabel=label,
                                    title=f"{label.split(',')[0]} against T"))
    table = {m: {"time slope": s["time"], "peak RSS slope": s["peak_rss"],
                 **{f"time / {results.get('peer')} at T={T}": ratio
                    for T, ratio in results.get("peer_ratio", {}).get(m, {}).items()}}
             for m, s in results["slopes"].items()}
    return plot.report_page(path, panels, table, title=(
        f"{results['dataset']} N={results['N']}, k={results['n_neighbors']}, "
        f"{results['workers']} workers"))


#: ``--as-user``: the calls of the scaling targets, each as a user makes it.
AS_USER_METHODS = ("landmark_ikd", "landmark_isomap")
AS_USER_PATHS = ("no_client", "local_cluster")


def _as_user_call(method: str, path: str, T: int, n_landmarks: int, n_workers: int,
                  workdir: str) -> dict:
    """One user's call in the fresh process this runs in: the NumPy float32 rows of the
    sinusoid (N=100), the estimator with its defaults and a seed, ``fit_transform``; with no
    client, or on ``Client()`` over a LocalCluster of ``n_workers`` processes (the default
    client: no ``client=``). Records dask's "large graph" warnings."""
    import contextlib
    import warnings

    from dr_dask.bench._common import dataset_arrays
    from dr_dask.metrics import r2_affine
    from dr_dask.runtime.resources import PeakRSS

    X, latent = dataset_arrays(workdir, "sinusoidal", T, N_FEATURES)
    X = np.ascontiguousarray(X, dtype=np.float32)
    row: dict[str, Any] = {"method": method, "path": path, "T": T}
    import dr_dask

    with contextlib.ExitStack() as stack:
        if path == "local_cluster":
            from distributed import Client, LocalCluster

            from dr_dask.runtime.cluster import local_cluster_kwargs

            cluster = stack.enter_context(LocalCluster(**local_cluster_kwargs(n_workers)))
            stack.enter_context(Client(cluster))
        if method == "landmark_ikd":
            est = dr_dask.IKD(n_components=1, solver="geodesic", n_landmarks=n_landmarks,
                              random_state=0)
        else:
            est = dr_dask.LandmarkIsomap(n_components=1, n_landmarks=n_landmarks,
                                         random_state=0)
        with warnings.catch_warnings(record=True) as caught, PeakRSS() as mem, \
                timed(row, "seconds"):
            warnings.simplefilter("always")
            Y = est.fit_transform(X)
        row["peak_rss_gb_process_tree"] = mem.peak_gb
    row.update(stage_seconds=est.timings_, r2_vs_latent=r2_affine(latent, Y),
               knn_recall=getattr(est, "knn_recall_", None),
               knn_distance_error=getattr(est, "knn_distance_error_", None),
               large_graph_warnings=[str(w.message)[:120] for w in caught
                                     if "large graph" in str(w.message)])
    return row


def run_scale_as_user(client_workers: int = 2, *, sizes: tuple[int, ...] = (1_000_000,),
                      n_landmarks: int = 500, methods: tuple[str, ...] = AS_USER_METHODS,
                      workdir: str | None = None) -> dict:
    """The scaling targets' calls exactly as a user makes them (see :func:`_as_user_call`),
    each in a fresh process: seconds, peak RSS of the process tree, R^2 to the latent, the
    estimated recall and dask's large-graph warnings, with the load averages."""
    from dr_dask.bench.geodesic import _in_fresh_process

    with bench_workdir(workdir, "scale_as_user") as workdir:
        rows = []
        for T in sizes:
            for method in methods:
                for path in AS_USER_PATHS:
                    load = os.getloadavg()
                    row = _in_fresh_process(_as_user_call, method, path, T, n_landmarks,
                                            client_workers, workdir)
                    row["load_average"] = [load, os.getloadavg()]
                    logger.info("as user: %s (%s) T=%d: %.1f s, recall %s, distance error %s, "
                                "R^2 %.4f", method, path, T, row["seconds"], row["knn_recall"],
                                row["knn_distance_error"], row["r2_vs_latent"])
                    rows.append(row)
        return {"mode": "as_user", "dataset": "sinusoidal", "N": N_FEATURES, "dtype": "float32",
                "n_landmarks": n_landmarks, "workers": client_workers, "rows": rows}
