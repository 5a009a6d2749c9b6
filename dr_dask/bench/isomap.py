"""Isomap benchmarks, each against a baseline measured in the same run.

Cases (``CASES`` maps a name to ``fn(client, quick, workdir) -> dict``; the geodesic and
blockwise IKD cases of the same issue are meant to be added to it):

- ``isomap_full``: swiss roll T=20,000 (``--quick``: 3,000), scikit-learn's ``Isomap`` (dense
  T x T float64 + KernelPCA/ARPACK, in one child process; its time is the fit alone) vs ours
  (Dijkstra over source blocks on the workers, matrix-free block Lanczos): median wall times,
  their ratio, Procrustes disparity between the two embeddings and against the isometric
  ground truth, peak RSS of the process tree for each.
- ``landmark_isomap``: swiss roll T=200,000, L=2,000 (``--quick``: 20,000 and 500): wall time
  per stage, peak RSS of the process tree (target <= 6 GB), disparity against the ground truth.
"""

from __future__ import annotations

import logging
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from dr_dask.bench._common import bench_workdir, n_workers
from dr_dask.bench.ikd_solvers import CASES as IKD_SOLVER_CASES
from dr_dask.datasets.toy import isometric_swiss_roll
from dr_dask.runtime.resources import PeakRSS, measure, timed, tree_rss

logger = logging.getLogger(__name__)

#: Sizes of ``--quick`` (a smoke run; the tests shrink them further).
QUICK = {"isomap_T": 3000, "isomap_repeats": 3, "landmark_T": 20_000, "landmark_L": 500}


def _sklearn_isomap(X: np.ndarray, n_neighbors: int,
                    n_components: int = 2) -> tuple[np.ndarray, float, float]:
    from sklearn.manifold import Isomap as SkIsomap

    with timed() as t, PeakRSS() as mem:
        emb = SkIsomap(n_neighbors=n_neighbors, n_components=n_components).fit(X).embedding_
    return emb, t["seconds"], mem.peak_gb


def _sklearn_in_child(X: np.ndarray, n_neighbors: int, repeats: int,
                      n_components: int = 2) -> tuple[float, float, Any]:
    """scikit-learn's Isomap in a child process: median fit seconds, peak tree RSS, embedding.

    A child, because its Cython shortest paths hold the GIL for minutes: in this process they
    would starve the LocalCluster's scheduler (workers miss heartbeats and are restarted).
    The peak is the child's own (measured in it: scikit-learn's process tree is that one
    process), never this process's or its workers'.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    times, peaks, emb = [], [], None
    for _ in range(repeats):
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
            emb, seconds, peak_gb = ex.submit(_sklearn_isomap, X, n_neighbors,
                                              n_components).result()
        times.append(seconds)
        peaks.append(peak_gb)
    return statistics.median(times), max(peaks), emb


def bench_isomap_full(client: Any, quick: bool, workdir: str, repeats: int | None = None,
                      n_samples: int | None = None) -> dict:
    from dr_dask.linalg.align import procrustes_disparity
    from dr_dask.methods.isomap import Isomap

    T = n_samples or (QUICK["isomap_T"] if quick else 20_000)
    repeats = repeats or (QUICK["isomap_repeats"] if quick else 1)
    X, truth = isometric_swiss_roll(T)
    idle_gb = tree_rss() / 1e9
    sk_s, sk_gb, sk_emb = _sklearn_in_child(X, 10, repeats)
    m = measure(
        lambda: Isomap(n_neighbors=10, n_components=2, random_state=0, client=client).fit(X),
        repeats,
    )
    ours_s, ours_gb, ours = m.seconds, m.peak_rss_gb, m.result
    return {
        "T": T,
        "n_neighbors": 10,
        "repeats": repeats,
        "idle_process_tree_rss_gb": idle_gb,
        "sklearn_seconds_median": sk_s,
        "dr_dask_seconds_median": ours_s,
        "speedup_vs_sklearn": sk_s / ours_s,
        "target_speedup": 2.0,
        "sklearn_peak_rss_gb": sk_gb,
        "dr_dask_peak_rss_gb": ours_gb,
        "disparity_vs_sklearn": procrustes_disparity(sk_emb, ours.embedding_),
        "target_disparity": 1e-3,
        "disparity_vs_truth_sklearn": procrustes_disparity(truth, sk_emb),
        "disparity_vs_truth_dr_dask": procrustes_disparity(truth, ours.embedding_),
        "dr_dask_stage_seconds": ours.timings_,
    }


def bench_landmark_isomap(client: Any, quick: bool, workdir: str, n_samples: int | None = None,
                          n_landmarks: int | None = None) -> dict:
    from dr_dask.linalg.align import procrustes_disparity
    from dr_dask.methods.landmark_isomap import LandmarkIsomap

    T = n_samples or (QUICK["landmark_T"] if quick else 200_000)
    L = n_landmarks or (QUICK["landmark_L"] if quick else 2000)
    X, truth = isometric_swiss_roll(T)
    Xnew, truth_new = isometric_swiss_roll(2000, random_state=1)
    est = LandmarkIsomap(n_neighbors=10, n_components=2, n_landmarks=L, random_state=0,
                         client=client)
    fit = measure(lambda: est.fit(X))
    seconds, peak_gb = fit.seconds, fit.peak_rss_gb
    with timed() as t:
        emb_new = est.transform(Xnew)
    assert isinstance(emb_new, np.ndarray)  # an in-memory input maps to an in-memory embedding
    transform_s = t["seconds"]
    return {
        "T": T,
        "n_landmarks": L,
        "n_neighbors": 10,
        "fit_seconds": seconds,
        "stage_seconds": est.timings_,
        "peak_rss_gb_process_tree": peak_gb,
        "target_peak_rss_gb": 6.0,
        "dense_float64_T_by_T_gb": 8 * T * T / 1e9,
        "landmark_geodesics_gb": est.landmark_geodesics_.nbytes / 1e9,
        "disparity_vs_truth": procrustes_disparity(truth, est.embedding_),
        "transform_2000_points_seconds": transform_s,
        "transform_disparity_vs_truth": procrustes_disparity(truth_new, emb_new),
    }


#: Named cases: ``fn(client, quick, workdir) -> dict``: Isomap's, and the geodesic, blockwise
#: and landmark IKD cases, which run on the same graph machinery.
CASES: dict[str, Callable[..., dict]] = {
    "isomap_full": bench_isomap_full,
    "landmark_isomap": bench_landmark_isomap,
    **IKD_SOLVER_CASES,
}


def run_bench(client: Any, *, quick: bool = False, only: set | None = None,
              workdir: str | None = None) -> dict:
    """Run the selected cases (default all) and return their results keyed by case name."""
    with bench_workdir(workdir, "isomap") as workdir:
        unknown = set(only or ()) - set(CASES)
        if unknown:
            raise ValueError(f"unknown benchmark cases {sorted(unknown)}; known: {sorted(CASES)}")
        results: dict[str, Any] = {
            "workers": n_workers(client),
            "quick": quick,
        }
        for name, fn in CASES.items():
            if only and name not in only:
                continue
            logger.info("benchmark case %s", name)
            results[name] = fn(client, quick, workdir)
    return results
