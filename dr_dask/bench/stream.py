"""``dr-dask bench stream``: GP-Isomap mapping throughput, refit latency, runner RSS, detection.

1. Mapping throughput (points/s, variance included) with a 2,000-point batch (the four Euler
   roll patches, 500 each) at D=3 and D=100 (the roll embedded isometrically in R^100):
   in-process, on dask's threads and on the command's cluster (model shared once with
   :func:`dr_dask.runtime.cluster.share`, chunks mapped with ``client.map``); baseline scikit-learn
   ``Isomap.transform`` fitted on the same batch and mapping the same points, same run (the
   faster of one call and the same chunks).
2. Refit latency for batch 2,000 + buffer 1,000 (the runner's refit task) and the peak RSS of
   the process tree while the runner streams the shift scenario with refits.
3. The drift-detection figures on generated Euler-roll layouts (separated, touching, unequal, noise;
   :func:`dr_dask.stream.evaluate.layout_figures`): per-patch disparity, share of stream
   points beside their own patch, flag rates, variance ratio, and after a refit the new
   patch's disparity and how far the old points moved.
4. Detection on the shift scenario at the paper's scale (1,000 train and test points per
   patch, n_s = 1000): precision and recall of flagged (buffered) points for the unseen patch,
   and the delay from its first point to the refit (rows and seconds).
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any

import numpy as np

from dr_dask.bench._common import bench_workdir, n_workers, write_report
from dr_dask.io.storage import read_array
from dr_dask.runtime.resources import PeakRSS, measure, timed

logger = logging.getLogger(__name__)

#: Sizes of a full run and of ``--quick`` (a smoke run; the tests shrink them further).
FULL = {"batch_per_patch": 500, "n_stream": 20_000, "layout_batch": 300, "layout_stream": 200,
        "refit_batch": 2000, "refit_buffer": 1000, "detect_per_patch": 1000, "detect_n_s": 1000}
QUICK = {**FULL, "n_stream": 4000, "layout_batch": 150, "layout_stream": 100,
         "refit_batch": 600, "refit_buffer": 300, "detect_per_patch": 300, "detect_n_s": 300}


def _map_all(model, S: np.ndarray, chunk: int) -> np.ndarray:
    out = [model.map_points(S[i : i + chunk])[1] for i in range(0, len(S), chunk)]
    return np.concatenate(out)


def _map_threads(model, S: np.ndarray, chunk: int) -> np.ndarray:
    import dask
    import dask.array as da

    emb, var = model.transform(da.from_array(S, chunks=(chunk, -1)), return_variance=True)
    return dask.compute(emb, var, scheduler="threads")[1]


def _map_cluster(client, model_handle, S: np.ndarray, chunk: int) -> np.ndarray:
    from dr_dask.runtime.cluster import gather
    from dr_dask.stream.models import map_chunk

    futs = client.map(map_chunk, [model_handle] * ((len(S) + chunk - 1) // chunk),
                      [S[i : i + chunk] for i in range(0, len(S), chunk)], pure=False)
    return np.concatenate([r[1] for r in gather(futs, client)])


def bench_throughput(ambient_dim: int, n_stream: int, repeats: int, client,
                     batch_per_patch: int = 500, chunk: int = 2000):
    from sklearn.manifold import Isomap as SkIsomap

    from dr_dask.datasets.swiss_roll import patch_points
    from dr_dask.methods.gp_isomap import GPIsomap

    Xb, S = patch_points(batch_per_patch, n_stream, ambient_dim, random_state=ambient_dim)
    res: dict = {"ambient_dim": ambient_dim, "batch": len(Xb), "points": len(S)}
    with timed(res, "fit_seconds"):
        model = GPIsomap(n_neighbors=10, random_state=0).fit(Xb)
    res["n_manifolds"] = model.n_manifolds_
    sk = SkIsomap(n_neighbors=10, n_components=2).fit(Xb)
    _map_all(model, S[:chunk], chunk)  # warm-up (imports, caches)
    # the baseline at its best: one call (sklearn builds an (m, k, n) temporary, 3.2 GB here,
    # whose page faults make it erratic) or the same 2,000-point chunks as ours
    t_sk_whole = measure(lambda: sk.transform(S), repeats, rss=False).seconds
    t_sk_chunks = measure(
        lambda: [sk.transform(S[i : i + chunk]) for i in range(0, len(S), chunk)], repeats,
        rss=False).seconds
    t_sk = min(t_sk_whole, t_sk_chunks)
    res["sklearn_one_call_pts_per_s"] = len(S) / t_sk_whole
    res["sklearn_chunked_pts_per_s"] = len(S) / t_sk_chunks
    t_gp = measure(lambda: _map_all(model, S, chunk), repeats, rss=False).seconds
    res["sklearn_transform_pts_per_s"] = len(S) / t_sk
    res["gp_inprocess_pts_per_s"] = len(S) / t_gp
    # what a user gets from `transform` of a dask array on the threaded scheduler: chunks in
    # parallel threads (the min-plus kernel and BLAS release the GIL)
    t_thr = measure(lambda: _map_threads(model, S, chunk), repeats, rss=False).seconds
    res["gp_threads_pts_per_s"] = len(S) / t_thr
    if client is not None:
        from dr_dask.runtime.cluster import share

        handle = share(model, client)  # as the stream runner does: recomputable, once a worker
        _map_cluster(client, handle, S[: 2 * chunk], chunk)
        t_cl = measure(lambda: _map_cluster(client, handle, S, chunk), repeats,
                       rss=False).seconds
        res["gp_cluster_pts_per_s"] = len(S) / t_cl
    best = max(v for k, v in res.items() if k.startswith("gp_") and k.endswith("pts_per_s"))
    res["best_gp_pts_per_s"] = best
    res["ratio_best_vs_sklearn"] = best / res["sklearn_transform_pts_per_s"]
    res["ratio_exact_inprocess_vs_sklearn"] = (res["gp_inprocess_pts_per_s"]
                                               / res["sklearn_transform_pts_per_s"])
    res["target_20k_pts_per_s_met"] = best >= 20_000
    res["target_3x_sklearn_met"] = res["ratio_best_vs_sklearn"] >= 3
    return res


def bench_refit(repeats: int, n_batch: int = 2000, n_buffer: int = 1000) -> dict:
    from dr_dask.datasets.swiss_roll import shift_scenario
    from dr_dask.methods.gp_isomap import GPIsomap
    from dr_dask.stream.models import refit_model, refit_params

    sc = shift_scenario(n_batch // 3 + 1, random_state=5)
    Xb = sc.batch[:n_batch]
    buf = sc.stream[sc.first_unseen:][:n_buffer]
    if len(buf) < n_buffer:  # top up with known-patch points
        buf = np.vstack([buf, sc.stream[: n_buffer - len(buf)]])
    model = GPIsomap(n_neighbors=10, random_state=0).fit(Xb)
    batch = np.vstack([Xb, buf])
    m = measure(lambda: refit_model(refit_params(model), batch, model.embedding_), repeats)
    return {"batch": len(Xb), "buffer": len(buf), "refit_seconds_median": m.seconds,
            "refit_peak_rss_gb": m.peak_rss_gb, "n_manifolds_after": m.result.n_manifolds_}


def bench_detection(n_per_patch: int, n_s: int, workdir: str, client) -> dict:
    import zarr

    from dr_dask.datasets.swiss_roll import shift_scenario
    from dr_dask.methods.gp_isomap import GPIsomap
    from dr_dask.stream import StreamRunner, read_output

    sc = shift_scenario(n_per_patch, random_state=7)
    with timed() as fit:
        model = GPIsomap(n_neighbors=10, random_state=0).fit(sc.batch)
    out = os.path.join(workdir, "detect")
    shutil.rmtree(out, ignore_errors=True)
    chunks = [sc.stream[i : i + 250] for i in range(0, len(sc.stream), 250)]
    with PeakRSS() as rss, timed() as run:
        summary = StreamRunner(out, chunks, model, n_s=n_s, client=client,
                               handle_signals=False).run()
    wall = run["seconds"]
    o = read_output(out)
    flagged_rows = read_array(zarr.open_group(out), "buffer_rows")
    refits = o["checkpoint"]["refits"]
    # points judged by the model that had not seen the new patch
    horizon = refits[0]["publish_row"] if refits else len(sc.stream)
    judged = np.arange(len(sc.stream)) < horizon
    unseen = np.arange(len(sc.stream)) >= sc.first_unseen
    flagged = np.zeros(len(sc.stream), bool)
    flagged[flagged_rows] = True
    tp = int(np.sum(flagged & unseen & judged))
    res = {
        "n_per_patch": n_per_patch, "n_s": n_s, "stream_rows": len(sc.stream),
        "fit_seconds": fit["seconds"], "sigma_t": model.sigma_t_,
        "precision": tp / max(int(np.sum(flagged & judged)), 1),
        "recall": tp / max(int(np.sum(unseen & judged)), 1),
        "known_false_alarm_rate": float(np.mean(flagged[~unseen])),
        "refits": refits, "runner_wall_seconds": wall,
        "runner_rows_per_s": len(sc.stream) / wall,
        "runner_peak_rss_gb": rss.peak_gb, "summary": summary,
    }
    if refits:
        res["delay_rows_first_unseen_to_trigger"] = refits[0]["trigger_row"] - sc.first_unseen
        res["delay_rows_first_unseen_to_publish"] = refits[0]["publish_row"] - sc.first_unseen
        res["refit_seconds_in_runner"] = refits[0]["seconds"]
    return res


#: The drift-detection targets, checked in the report.
LAYOUT_TARGETS = {"patch_disparity_max": 0.01, "beside_own_patch_min": 0.99,
                  "flagged_unseen_min": 0.95, "flagged_known_max": 0.02,
                  "variance_ratio_min": 3.0, "new_patch_disparity_max": 0.02,
                  "old_points_move_max": 0.01}


def bench_layouts(n_batch: int, n_stream: int, seeds) -> dict:
    """The drift-detection figures per layout and seed, with the targets met or not."""
    from dr_dask.datasets.roll_layouts import KINDS, patch_layout
    from dr_dask.methods.gp_isomap import GPIsomap
    from dr_dask.stream.evaluate import layout_figures

    rows = []
    for kind in KINDS:
        # unequal patches weigh 1, 2 and 4: the same unit keeps its total comparable
        nb = max(n_batch // 2, 60) if kind == "unequal" else n_batch
        for seed in seeds:
            sc = patch_layout(kind, nb, n_stream, random_state=seed)
            with timed() as fit:
                model = GPIsomap(n_neighbors=10, random_state=0).fit(sc.batch)
            f = {"kind": kind, "seed": seed, "batch": len(sc.batch),
                 "fit_seconds": fit["seconds"], **layout_figures(model, sc)}
            f["targets_met"] = bool(
                max(f["patch_disparity"]) <= LAYOUT_TARGETS["patch_disparity_max"]
                and f["beside_own_patch"] >= LAYOUT_TARGETS["beside_own_patch_min"]
                and f["flagged_unseen"] >= LAYOUT_TARGETS["flagged_unseen_min"]
                and f["flagged_known"] <= LAYOUT_TARGETS["flagged_known_max"]
                and f["variance_ratio"] >= LAYOUT_TARGETS["variance_ratio_min"]
                and f["new_patch_disparity"] <= LAYOUT_TARGETS["new_patch_disparity_max"]
                and f["old_points_move"] <= LAYOUT_TARGETS["old_points_move_max"])
            logger.info("layout %s seed %d: %s", kind, seed, f)
            rows.append(f)
    return {"targets": LAYOUT_TARGETS, "n_batch_per_patch": n_batch,
            "n_stream_per_patch": n_stream, "runs": rows,
            "all_targets_met": all(r["targets_met"] for r in rows),
            "n_runs_targets_met": sum(r["targets_met"] for r in rows)}


def run_benchmarks(client: Any = None, quick: bool = False, out: str | None = None,
                   workdir: str | None = None) -> str:
    """Run every stream benchmark and return the JSON report (also written to ``out``).

    ``client``: the cluster of the cluster-mapping case and of the stream runner; None (dask's
    threads) skips the cluster case and runs the stream on local threads.
    """
    repeats = 1 if quick else 3
    with bench_workdir(workdir, "stream") as workdir:
        q = QUICK if quick else FULL
        results: dict = {"quick": quick, "cpu_count": os.cpu_count(),
                         "workers": n_workers(client)}
        results["throughput"] = [bench_throughput(D, q["n_stream"], repeats, client,
                                                  q["batch_per_patch"]) for D in (3, 100)]
        results["layouts"] = bench_layouts(q["layout_batch"], q["layout_stream"],
                                           (1,) if quick else (1, 2, 3))
        results["refit"] = bench_refit(repeats, q["refit_batch"], q["refit_buffer"])
        results["detection"] = bench_detection(q["detect_per_patch"], q["detect_n_s"], workdir,
                                               client)
        return write_report(results, out)
