"""Geodesic, blockwise and landmark IKD benchmarks.

Cases (``CASES`` maps a name to ``fn(client, quick, workdir) -> dict``, the signature of
:data:`dr_dask.bench.isomap.CASES`):

- ``blockwise_ikd``: T=1000 on sinusoidal data (N=100, N=400) and GP-mapping data (N=200,
  M=3): R^2 and median wall time on the cluster, against the same fit in this one process on
  dask's threads (the in-run baseline). The authors' single-process code is quoted, not rerun
  (it is not a dependency): we measured 15-190 s for these cases on this machine.
- ``geodesic_ikd``: sinusoidal T=30,000 (``quick``: 5,000), N=100, float32 tiles: wall time
  per stage, peak RSS of the process tree (target <= 6 GB), R^2, against the dense float64
  T x T matrix a NumPy implementation would need.
- ``landmark_ikd``: sinusoidal T=200,000 (``quick``: 20,000), N=100, L=1,000 (300): the same
  figures.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from functools import partial
from typing import Any

from dr_dask.bench._common import dataset_store, timed_fits
from dr_dask.runtime.resources import timed

logger = logging.getLogger(__name__)

#: Sizes of ``--quick`` (a smoke run; the tests shrink them further).
QUICK = {"blockwise_T": 1000, "geodesic_T": 5000, "landmark_T": 20_000, "landmark_L": 300}

#: The authors' single-process blockwise code on these cases (measured on the development machine).
AUTHORS_SECONDS_RANGE = (15.0, 190.0)


def bench_blockwise(client: Any, quick: bool, workdir: str) -> dict:
    """Blockwise IKD at T=1000: cluster vs one process, R^2 against the latent."""
    from dr_dask.io.inputs import open_dataset
    from dr_dask.methods.ikd import IKD
    from dr_dask.metrics import r2_affine

    T = QUICK["blockwise_T"] if quick else 1000
    repeats = 1 if quick else 3
    cases = [("sinusoidal", 100, 1, {}), ("sinusoidal", 400, 1, {}),
             ("gp", 200, 3, {"n_components": 3})]
    out: dict[str, Any] = {"authors_single_process_seconds_range": AUTHORS_SECONDS_RANGE}
    # one untimed small fit per mode: worker imports and numba's cache load are not the method
    src, _ = dataset_store(workdir, "gp", 200, 200, n_components=3)
    warm = open_dataset(src).data.compute()
    for c in (client, None):
        IKD(n_components=3, solver="blockwise", random_state=0, client=c).fit(warm)
    for name, N, M, options in cases:
        src, Z = dataset_store(workdir, name, T, N, **options)
        X = open_dataset(src).data.compute()  # in memory: time the method, not the reads
        row: dict[str, Any] = {"T": T, "N": N, "M": M}
        for label, c in (("cluster", client), ("one_process", None)):
            m = timed_fits(
                partial(IKD, n_components=M, solver="blockwise", random_state=0, client=c), X,
                repeats, client)
            secs, peak, est = m.seconds, m.peak_rss_gb, m.result
            row[f"{label}_seconds"] = secs
            row[f"{label}_peak_rss_gb"] = peak
            row[f"{label}_r2"] = r2_affine(Z, est.embedding_)
            row[f"{label}_stage_seconds"] = est.timings_
        row["clique_threshold"] = est.clique_threshold_
        row["n_cliques_used"] = len(est.cliques_)
        row["n_merges"] = len(est.merge_log_)
        row["speedup_cluster_vs_one_process"] = row["one_process_seconds"] / row["cluster_seconds"]
        row["speedup_vs_authors_lower_bound"] = AUTHORS_SECONDS_RANGE[0] / row["cluster_seconds"]
        out[f"{name}_N{N}"] = row
    return out


def _large(client: Any, workdir: str, T: int, **params: Any) -> dict:
    from dr_dask.io.inputs import open_dataset
    from dr_dask.methods.ikd import IKD
    from dr_dask.metrics import r2_affine

    N = 100
    with timed() as t:
        src, Z = dataset_store(workdir, "sinusoidal", T, N)
    generate = t["seconds"]
    inp = open_dataset(src)
    m = timed_fits(
        lambda: IKD(n_components=1, dtype="float32", random_state=0, client=client, tol=1e-6,
                    **params),
        inp, 1, client)
    secs, peak, est = m.seconds, m.peak_rss_gb, m.result
    return {
        "T": T, "N": N, **{k: v for k, v in params.items() if k != "solver"},
        "generate_seconds": generate,
        "fit_seconds": secs,
        "stage_seconds": est.timings_,
        "peak_rss_gb_process_tree": peak,
        "target_peak_rss_gb": 6.0,
        "dense_float64_T_by_T_gb": 8.0 * T * T / 1e9,
        "r2": r2_affine(Z, est.embedding_),
        "graph_components": getattr(est, "graph_components_", None),
        "explained_variance_ratio": est.explained_variance_ratio_,
    }


def bench_geodesic(client: Any, quick: bool, workdir: str) -> dict:
    """Geodesic IKD, sinusoidal T=30,000 (quick 5,000): RSS, time per stage, R^2."""
    return _large(client, workdir, QUICK["geodesic_T"] if quick else 30_000, solver="geodesic")


def bench_landmark(client: Any, quick: bool, workdir: str) -> dict:
    """Landmark IKD, sinusoidal T=200,000 (quick 20,000): RSS, time per stage, R^2."""
    return _large(client, workdir, QUICK["landmark_T"] if quick else 200_000, solver="geodesic",
                  n_landmarks=QUICK["landmark_L"] if quick else 1000)


CASES: dict[str, Callable[..., dict]] = {
    "blockwise_ikd": bench_blockwise,
    "geodesic_ikd": bench_geodesic,
    "landmark_ikd": bench_landmark,
}
