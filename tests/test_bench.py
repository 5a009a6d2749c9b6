"""Every ``dr-dask bench`` command runs on dask's threads (``--scheduler threads``; ``bench
geodesic``, which measures process trees, on LocalClusters), honours ``--workers`` and reports
its figures, at tiny sizes (the ``--quick`` sizes shrunk further)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import idle_rss_gb, noisy_curve, plausible_peak

from dr_dask.cli import main
from dr_dask.runtime.blas import single_blas_thread


def bench(*args: str) -> dict:
    # one BLAS thread: these runs check that every bench runs and reports, not its speed, and
    # the eigensolver's many small eigh calls run 20x slower with two BLAS threads on a loaded
    # 2-core machine (measured: IKD fit T=200 22 s vs 1.1 s)
    with single_blas_thread():
        res = CliRunner().invoke(
            main, ["--scheduler", "threads", "--workers", "1", "bench", *args])
    assert res.exit_code == 0, res.output
    assert "Traceback" not in res.output
    return json.loads(res.stdout)


def finite_positive(*values: float) -> bool:
    return all(math.isfinite(v) and v > 0 for v in values)


def test_bench_ikd(monkeypatch, tmp_path):
    from dr_dask.bench import ikd

    monkeypatch.setitem(ikd.QUICK, "similarity_T", 512)
    monkeypatch.setitem(ikd.QUICK, "incore_T", 300)
    monkeypatch.setitem(ikd.QUICK, "outofcore_T", 400)
    monkeypatch.setitem(ikd.QUICK, "N", 40)
    idle = idle_rss_gb()
    r = bench("ikd", "--quick", "--workdir", str(tmp_path))
    assert r["workers"] == 1
    for dtype in ("float32", "float64"):
        s = r[f"similarity_{dtype}"]
        assert s["workers"] == 1 and s["dtype"] == dtype
        assert finite_positive(s["throughput_ratio"], s["one_tile_ratio"],
                               s["bare_gemm_tiles_ratio"], s["numpy_gflops"])
    assert r["incore"]["r2_dr_dask"] > 0.5
    assert plausible_peak(r["incore"]["peak_rss_gb_dr_dask"], idle)
    assert plausible_peak(r["outofcore"]["peak_rss_gb_process_tree"], idle)
    assert set(r["outofcore"]["stage_seconds"]) >= {"distance", "eigen"}


def test_bench_isomap(monkeypatch, tmp_path):
    from dr_dask.bench import ikd_solvers, isomap

    for key, value in {"isomap_T": 300, "isomap_repeats": 1, "landmark_T": 600,
                       "landmark_L": 30}.items():
        monkeypatch.setitem(isomap.QUICK, key, value)
    for key, value in {"blockwise_T": 200, "geodesic_T": 400, "landmark_T": 600,
                       "landmark_L": 30}.items():
        monkeypatch.setitem(ikd_solvers.QUICK, key, value)
    idle = idle_rss_gb()
    r = bench("isomap", "--quick", "--workdir", str(tmp_path))
    assert r["workers"] == 1 and set(r) >= set(isomap.CASES)
    full = r["isomap_full"]
    assert full["T"] == 300 and full["disparity_vs_sklearn"] < 1e-2
    assert finite_positive(full["speedup_vs_sklearn"])
    assert plausible_peak(full["dr_dask_peak_rss_gb"], idle)
    assert plausible_peak(r["landmark_isomap"]["peak_rss_gb_process_tree"], idle)
    assert r["geodesic_ikd"]["T"] == 400 and r["landmark_ikd"]["T"] == 600


def test_bench_metrics(monkeypatch):
    from dr_dask.bench import metrics

    for key, value in {"T": 600, "T_base": 300, "lsdr_n": 400}.items():
        monkeypatch.setitem(metrics.QUICK, key, value)
    r = bench("metrics", "--quick")
    assert r["trustworthiness"]["baseline"]["values_agree"]
    assert r["trustworthiness"]["large"]["T"] == 600
    assert finite_positive(r["lsdr"]["spiral_2d"]["time_ratio_vs_baseline"])


def test_bench_stream(monkeypatch, tmp_path):
    from dr_dask.bench import stream

    for key, value in {"batch_per_patch": 80, "n_stream": 300, "layout_batch": 60,
                       "layout_stream": 40, "refit_batch": 240, "refit_buffer": 60,
                       "detect_per_patch": 80, "detect_n_s": 40}.items():
        monkeypatch.setitem(stream.QUICK, key, value)
    idle = idle_rss_gb()
    r = bench("stream", "--quick", "--workdir", str(tmp_path))
    assert r["workers"] == 1
    for t in r["throughput"]:
        assert "gp_cluster_pts_per_s" not in t  # no cluster under --scheduler threads
        assert finite_positive(t["gp_threads_pts_per_s"], t["ratio_best_vs_sklearn"])
    assert r["detection"]["stream_rows"] > 0
    assert plausible_peak(r["detection"]["runner_peak_rss_gb"], idle)
    assert r["refit"]["refit_seconds_median"] > 0


@pytest.mark.slow
def test_bench_io(s3_bucket):
    idle = idle_rss_gb()
    r = bench("io", "-T", "200", "-N", "20", "--repeats", "2", "--bucket", s3_bucket,
              "--checksum-rows", "20000")
    assert r["workers"] == 1 and r["same_embedding"]
    c = r["checksums"]
    assert c["local"]["bytes"] == c["s3"]["bytes"] == 200 * 2 * 4  # the float32 embedding
    assert c["local_20000_rows"]["bytes"] == 20000 * 2 * 8
    for side in ("local", "s3", "local_20000_rows"):
        assert finite_positive(c[side]["mark_seconds"], c[side]["verify_seconds"],
                               c[side]["read_seconds"])
    assert finite_positive(c["local_share_of_fit"], c["s3_share_of_fit"], c["hash_mb_per_s"])
    assert len(r["local_seconds"]) == len(r["s3_seconds"]) == 2
    assert r["local_seconds_median"] == pytest.approx(sum(r["local_seconds"]) / 2)  # of two
    assert finite_positive(r["ratio_s3_to_local"])
    assert plausible_peak(r["local_peak_rss_gb"], idle)
    assert plausible_peak(r["s3_peak_rss_gb"], idle)


@pytest.mark.cluster
def test_bench_geodesic(tmp_path):
    """On LocalClusters (one per method, each in its own process), each method's peak is its
    own tree's: at least that tree idle (interpreter, imports, one worker), and no method's
    figure includes another's; scikit-learn's time in the same run gives the ratios. Geodesic
    IKD only (``--only``): Isomap's row is the same code, and the as-user test below times it
    against scikit-learn's embedding."""
    with single_blas_thread():
        res = CliRunner().invoke(main, ["--workers", "1", "bench", "geodesic", "--T", "600",
                                        "--repeats", "1", "--full-T", "600", "--only",
                                        "geodesic_ikd", "--workdir", str(tmp_path)])
    assert res.exit_code == 0 and "Traceback" not in res.output, res.output
    r = json.loads(res.stdout)
    assert r["scheduler"] == "LocalCluster" and r["workers"] == 1 and r["T"] == 600
    assert "isomap" not in r
    for name in ("geodesic_ikd", "full_ikd_T600"):
        row = r[name]
        assert 0.1 < row["idle_process_tree_rss_gb"] <= row["peak_rss_gb_process_tree"] < 4
        assert finite_positive(row["seconds_median"])
    assert finite_positive(r["geodesic_ikd"]["ratio_to_sklearn"])
    assert set(r["geodesic_ikd"]["stage_seconds"]) >= {"graph", "shortest_paths", "eigen"}
    assert r["geodesic_ikd"]["r2_vs_latent"] > 0.8


def test_bench_geodesic_refuses_an_unknown_method():
    res = CliRunner().invoke(main, ["bench", "geodesic", "--only", "umap"])
    assert res.exit_code == 2 and "unknown method(s) ['umap']" in res.output, res.output


@pytest.mark.cluster
def test_bench_geodesic_as_user(tmp_path, monkeypatch):
    """--as-user times the user's calls, each in a fresh process, with no client and on a
    LocalCluster, against scikit-learn in the same run; the results are the methods' own."""
    from dr_dask.bench.geodesic import AS_USER_PATHS

    # the set-up's warm step fits on either side of the cell search's threshold: a lower one
    # (read by the spawned processes) warms the same kernels on fewer rows; the calls' 600
    # rows stay below it, on the exact search, as below the default
    monkeypatch.setenv("DASK_DR_DASK__KNN__CELLS_MIN_ROWS", "1000")
    # Isomap only: geodesic IKD's calls are the same code (its row is checked above)
    r = bench("geodesic", "--as-user", "--T", "600", "--repeats", "1", "--only", "isomap",
              "--workdir", str(tmp_path))
    assert r["mode"] == "as_user" and r["T"] == 600 and r["workers"] == 1
    assert finite_positive(r["sklearn_isomap"]["seconds_median"])
    assert "geodesic_ikd" not in r
    assert set(r["isomap"]) == set(AS_USER_PATHS)
    for path, row in r["isomap"].items():
        assert finite_positive(row["seconds_median"], row["ratio_to_sklearn"],
                               row["peak_rss_gb_process_tree"]), path
        assert len(row["seconds"]) == 1 and isinstance(row["meets_target"], bool)
        assert set(row["stage_seconds"]) >= {"graph", "shortest_paths", "eigen"}
        assert ("cluster_start_seconds_median" in row) == (path == "local_cluster")
        if path == "threads":
            # the first call compiled the kernels into an empty cache (its time against the
            # later calls' is the bench's figure, not a test's: a timing depends on the
            # machine's load); after the set-up command's warm step it compiles nothing
            assert finite_positive(row["first_call_ratio"])
            assert row["first_call_target"] == 1.5
            assert row["first_call_kernels_compiled"]
            assert row["first_call_after_setup_kernels_compiled"] == []
        # scikit-learn's Isomap on the same graph: the same embedding up to a rigid map
        assert row["disparity_vs_sklearn"] < 1e-8, path


def test_bench_dijkstra(tmp_path):
    r = bench("dijkstra", "--max-T", "2000", "--workdir", str(tmp_path))
    (row,) = r["rows"]
    assert row["T"] == 2000 and row["edges"] >= 2000 * 10  # k=10, symmetrised
    assert finite_positive(row["ms_per_source"], row["heap_ms_per_source"],
                           row["ratio_to_heap"], row["ns_per_T_log_T"],
                           row["bytes_touched_per_source_mb"])
    assert row["ratio_to_smallest_T"] == 1.0 and isinstance(row["sweeps_kept"], bool)


def test_bench_dijkstra_over_a_stored_graph_times_each_pass(tmp_path, s3_bucket):
    from dr_dask.graph.neighbour_graph import kneighbors_graph
    from dr_dask.graph.sssp import SearchGraph
    from dr_dask.graph.stored import StoredGraph

    X = noisy_curve(3000, 10)
    graph = SearchGraph.of(kneighbors_graph(X, 10).astype(np.float32))
    StoredGraph.write(graph, str(tmp_path / "graph"))
    r = bench("dijkstra", "--graph", str(tmp_path / "graph"), "--sources", "40")
    # the same graph from an object store (read and reordered there, where a local one-block
    # store is memory-mapped as stored): the same nodes and edges, the sweeps converged
    StoredGraph.write(graph, f"s3://{s3_bucket}/graph")
    remote = bench("dijkstra", "--graph", f"s3://{s3_bucket}/graph", "--sources", "40")
    assert (remote["nodes"], remote["edges"]) == (3000, r["edges"])
    assert remote["graph"] == f"s3://{s3_bucket}/graph"
    assert remote["batches"][0]["passes"][-1][0] == 0
    assert r["nodes"] == 3000 and r["edges"] >= 3000 * 10
    (batch,) = r["batches"]  # 40 sources: one batch of lanes, the first by the heap
    assert batch["sources"] == 40 and batch["heap_seconds"] > 0
    passes = batch["passes"]
    # forward and backward pairs; the first recomputes nodes, the last pair changes nothing
    assert len(passes) % 2 == 0 and len(passes) >= 4
    assert passes[0][0] > 0 and passes[-1][0] == passes[-2][0] == 0
    assert sum(s for _, s in passes) <= batch["seconds"] <= r["seconds"]
    assert finite_positive(r["open_seconds"], r["seconds_per_source"], r["peak_rss_gb"])


@pytest.mark.parametrize(("args", "message"), [
    (["bench", "dijkstra", "--graph", "no/such/graph"], "no/such/graph"),
    (["--scheduler", "tcp://127.0.0.1:1", "bench", "geodesic", "--T", "600"],
     "size it with --workers, not --scheduler"),
    (["bench", "dijkstra", "--max-T", "10"], "--max-T"),
    (["bench", "geodesic", "--as-user", "--full-T", "600"], "--full-T and --skip-sklearn"),
])
def test_bench_bad_options_are_refused(args, message):
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output
