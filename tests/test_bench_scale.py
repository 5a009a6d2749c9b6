"""``dr-dask bench scale``: the scaling table and plot, at tiny sizes."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from click.testing import CliRunner
from conftest import idle_rss_gb, plausible_peak

from dr_dask.bench import scale, search_memory
from dr_dask.bench._common import PeakRSSEach
from dr_dask.cli import main


def test_fitted_slope_recovers_a_power_law():
    T = [1000, 3000, 10_000]
    assert scale.fitted_slope(T, [2.0 * t**1.5 for t in T]) == pytest.approx(1.5)
    assert scale.fitted_slope([1000], [3.0]) is None


def test_bench_scale_table_and_plot(tmp_path, monkeypatch):
    monkeypatch.setattr(scale, "QUICK_SIZES", (800, 1600))
    out, png = tmp_path / "scale.json", tmp_path / "scale.png"
    idle = idle_rss_gb()
    result = CliRunner().invoke(main, [
        "--scheduler", "threads", "bench", "scale", "--quick", "--landmarks", "60",
        "--workdir", str(tmp_path / "data"), "--json", str(out), "--png", str(png)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    rows = report["rows"]
    assert [(r["method"], r["T"]) for r in rows] == [
        (m, T) for T in (800, 1600) for m in scale.METHODS]
    for r in rows:
        landmark = r["method"] in scale.LANDMARK_METHODS
        assert r["n_landmarks"] == (60 if landmark else None)
        assert r["seconds"] > 0 and plausible_peak(r["peak_rss_gb"], idle)
        assert r["stage_seconds"]
        # the geodesic methods recover the 1-D sinusoidal latent at every size; full IKD only
        # in part on these weakly correlated data (docs/guide.md: what to expect from it; 0.47-0.49
        # here), far above a chance embedding's ~0 (in-sample R^2 lies in [0, 1])
        assert (0.3 if r["method"] == "full_ikd" else 0.9) < r["r2"] <= 1
        # on 5,000 sampled rows (all of them here): the geodesic embeddings keep the rows'
        # neighbourhoods (0.99), full IKD's partial one less so (0.86)
        assert (0.8 if r["method"] == "full_ikd" else 0.95) < r["trustworthiness"] <= 1
    for method in scale.METHODS:
        assert np.isfinite(report["slopes"][method]["time"])
    assert [r["T"] for r in report["knn"]] == [800, 1600]
    assert all(r["recall"] == 1.0 for r in report["knn"])  # the exact search at this size
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert all(r["knn_recall"] == (None if r["method"] == "full_ikd" else 1.0) for r in rows)
    # --min-T and --max-T keep the sizes between them (one size: a long run alone); --knn ivf
    # reports the recall the fit estimated
    result = CliRunner().invoke(main, [
        "--scheduler", "threads", "bench", "scale", "--quick", "--min-T", "800", "--max-T", "1000",
        "--method", "landmark_isomap", "--landmarks", "40", "--workdir", str(tmp_path / "data"),
        "--json", str(out), "--png", str(png), "--knn", "ivf", "--n-probe", "1"])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert [r["T"] for r in report["rows"]] == [800]
    assert 0 < report["rows"][0]["knn_recall"] < 1 and report["knn"][0]["algorithm"] == "ivf"
    # --no-search-alone (the largest sizes): no separate kNN run, the fit's recall still there
    result = CliRunner().invoke(main, [
        "--scheduler", "threads", "bench", "scale", "--T", "800", "--method", "landmark_isomap",
        "--landmarks", "40", "--workdir", str(tmp_path / "data"), "--json", str(out),
        "--png", str(png), "--knn", "ivf", "--n-probe", "1", "--no-search-alone"])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert report["knn"] == [] and 0 < report["rows"][0]["knn_recall"] < 1


def test_size_ladders():
    # the landmark variants go to a million points, the exact O(T^2) methods to 30,000
    assert scale.size_ladder("landmark_ikd", False, None, None) == list(scale.SIZES)
    assert scale.size_ladder("isomap", False, None, None) == [10_000, 20_000, 30_000]
    assert scale.size_ladder("full_ikd", False, 20_000, None) == [20_000, 30_000]
    assert scale.size_ladder("geodesic_ikd", True, None, 5_000) == [2_000, 5_000]


def test_bench_scale_bad_input(tmp_path):
    out = tmp_path / "scale.json"
    result = CliRunner().invoke(main, [
        "--scheduler", "threads", "bench", "scale", "--max-T", "5000", "--json", str(out)])
    assert result.exit_code == 2
    assert ("no size of [10000, 20000, 30000, 100000, 300000, 1000000] is within --max-T 5000"
            in result.output)
    assert "Traceback" not in result.output and not out.exists()
    result = CliRunner().invoke(main, ["bench", "scale", "--max-T", "0"])
    assert result.exit_code == 2 and "--max-T" in result.output


@pytest.mark.slow  # umap-learn compiles its kernels first (10-15 s); skipped without it
def test_bench_scale_peer_umap(tmp_path, monkeypatch):
    pytest.importorskip("umap")
    monkeypatch.setattr(scale, "QUICK_SIZES", (1000,))
    report = scale.run_scale(None, quick=True, n_landmarks=50, methods=("landmark_isomap",),
                             workdir=str(tmp_path), peer="umap")
    ours, umap = report["rows"]
    assert (ours["method"], umap["method"]) == ("landmark_isomap", "umap")
    assert umap["seconds"] > 0 and umap["stage_seconds"]["read"] > 0
    # umap's 1-D layout is only partly affine in the latent at this size (R^2 0.4-0.8, unseeded),
    # but it keeps the rows' neighbourhoods as ours does (a random embedding's trust: ~0.5)
    assert 0 <= umap["r2"] <= 1 and 0.95 < umap["trustworthiness"] <= 1
    assert 0.95 < ours["trustworthiness"] <= 1
    assert report["peer_ratio"] == {"landmark_isomap": {1000: ours["seconds"] / umap["seconds"]}}


def test_bench_scale_peer_missing(tmp_path, monkeypatch):
    # None in sys.modules is how Python marks a module as not importable
    monkeypatch.setitem(sys.modules, "umap", None)
    out = tmp_path / "scale.json"
    result = CliRunner().invoke(main, ["--scheduler", "threads", "bench", "scale", "--quick",
                                       "--peer", "umap", "--json", str(out)])
    assert result.exit_code == 2
    assert "--peer umap needs umap-learn" in result.output and "pip install" in result.output
    assert "Traceback" not in result.output and not out.exists()


def test_peak_rss_each_tells_processes_apart():
    # a child that allocates (and writes) 300 MB while measured, then waits: its own peak
    # grows by that much, this process's does not
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.stdin.readline(); "
         "b = b'x' * (300 << 20); print('held', flush=True); time.sleep(5)"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        with PeakRSSEach({"child": child.pid, "me": os.getpid()}, interval=0.01) as mem:
            child.stdin.write("go\n")
            child.stdin.flush()
            assert child.stdout.readline().strip() == "held"
        assert mem.peaks["child"] - mem.start["child"] > 0.28e9
        assert mem.peaks["me"] - mem.start["me"] < 0.1e9
    finally:
        child.kill()
        child.wait()


@pytest.mark.cluster
def test_bench_search_memory(tmp_path, monkeypatch):
    monkeypatch.setattr(search_memory, "WORKERS", (1, 2))
    monkeypatch.setattr(search_memory, "WARM_ROWS", 1000)  # imports and kernels, at any size
    out = tmp_path / "search.json"
    result = CliRunner().invoke(main, ["bench", "search-memory", "--T", "10000",
                                       "--workdir", str(tmp_path), "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    one, two = report["rows"]
    assert (one["workers"], two["workers"]) == (1, 2) and len(two["worker_peaks_gb"]) == 2
    # one worker holds its imports, and the whole search's data on top of them
    assert one["largest_worker_peak_gb"] > one["largest_worker_idle_gb"]
    for r in (one, two):
        assert 0.05 < r["largest_worker_idle_gb"] <= r["largest_worker_peak_gb"] < 4
        assert r["largest_worker_peak_gb"] == max(r["worker_peaks_gb"])
        assert 0.05 < r["client_idle_gb"] <= r["client_peak_gb"] < 4 and r["seconds"] > 0
    assert one["peak_ratio"] == 1 and two["target_ratio"] == 0.5
    assert two["peak_ratio"] == pytest.approx(
        two["largest_worker_peak_gb"] / one["largest_worker_peak_gb"])


def test_bench_knn_reports_each_search_and_skips_a_missing_peer(tmp_path, monkeypatch):
    """Our two searches with their recall and distance error on each dataset; a peer that is
    not installed is skipped, named, and the others still run."""
    from dr_dask.bench import knn

    monkeypatch.setitem(sys.modules, "faiss", None)  # not importable: skipped, named
    monkeypatch.setattr(knn, "QUERIES", 200)
    report = knn.run_knn(None, sizes=(3000,), peers=("faiss-ivf",),
                         datasets=("sinusoid-0.1", "digits"), workdir=str(tmp_path))
    rows = {(r["dataset"], r["search"]): r for r in report["rows"]}
    for dataset in ("sinusoid-0.1", "digits"):
        assert "not installed" in rows[dataset, "faiss-ivf"]["skipped"]
        adaptive = rows[dataset, "dr_dask (adaptive probe)"]
        fixed = rows[dataset, "dr_dask (n_probe=6)"]
        assert 0.9 <= adaptive["recall"] <= 1 and 0 < fixed["recall"] <= 1
        assert 0 <= adaptive["distance_error"] <= 0.01
        assert adaptive["seconds"] > 0 and len(adaptive["load_average"]) == 2
    assert [s["peers"] for s in report["summary"]] == [{}, {}]


def test_bench_knn_raises_a_peers_knob_until_it_reaches_ours(monkeypatch):
    """A peer's knob is raised until it reaches our recall and our distance error; the
    summary gives its seconds at the first knob reaching each."""
    from dr_dask.bench import knn
    from dr_dask.graph.knn import kneighbors

    X = np.random.RandomState(0).standard_normal((2500, 5)).astype(np.float32)
    exact = kneighbors(X, 10, algorithm="exact")[1]

    def index(peer, X):  # a search that finds more true neighbours the larger its knob
        def search(knob, k):
            idx = exact.copy()
            idx[:, knob:] = (np.arange(len(X))[:, None] + 1 + np.arange(k - knob)) % len(X)
            return idx
        return search

    monkeypatch.setattr(knn, "_index", index)
    monkeypatch.setitem(knn.KNOBS, "hnswlib", (2, 5, 9, 10))
    sample = np.arange(0, 2500, 25)
    rows = knn._sweep("hnswlib", X, 10, sample, recall=0.5, error=0.0)
    assert [r["ef"] for r in rows] == [2, 5, 9, 10]
    assert [r["reaches"] for r in rows] == [[], ["recall"], ["recall"],
                                            ["recall", "distance_error"]]
    assert rows[0]["distance_error"] > rows[2]["distance_error"] > 0
    equal = knn._equal(rows, {"seconds": 2.0})["hnswlib"]
    assert equal["at_equal_recall"]["knob"] == 5 and equal["at_equal_distance_error"]["knob"] == 10
    assert equal["at_equal_recall"]["ratio_to_ours"] == rows[1]["seconds"] / 2.0


@pytest.mark.cluster
def test_the_faiss_peers_search_on_every_core(cluster_client):
    """A LocalCluster started in the bench's process leaves ``OMP_NUM_THREADS=1`` in its
    environment; faiss's indexes are still built and searched on every core, as hnswlib's
    are: a peer on one core would flatter our search."""
    faiss = pytest.importorskip("faiss")
    from dr_dask.bench import knn

    assert os.environ.get("OMP_NUM_THREADS") == "1"  # what the cluster's nannies left here
    X = np.random.RandomState(0).standard_normal((2000, 8)).astype(np.float32)
    for peer in ("faiss-ivf", "faiss-hnsw"):
        faiss.omp_set_num_threads(1)  # as a faiss first loaded after the cluster started has
        search = knn._index(peer, X)
        assert faiss.omp_get_max_threads() == (os.cpu_count() or 1)
        assert search(4, 5).shape == (2000, 5)


def test_bench_knn_and_as_user_bad_input():
    for args, name in ((["knn", "--k", "0"], "--k"), (["knn", "--T", "10"], "--T"),
                       (["knn", "--peer", "annoy"], "--peer"),
                       (["knn", "--dataset", "mnist"], "--dataset"),
                       (["knn-tol", "--T", "200000"], "--T"), (["knn-tol", "--tol", "0"], "--tol"),
                       (["knn-tol", "--dataset", "mnist"], "--dataset")):
        result = CliRunner().invoke(main, ["bench", *args])
        assert result.exit_code == 2 and name in result.output, result.output
    result = CliRunner().invoke(main, ["--scheduler", "threads", "bench", "scale", "--as-user",
                                       "--quick"])
    assert result.exit_code == 2 and "--as-user" in result.output
    assert "Traceback" not in result.output
    result = CliRunner().invoke(main, ["--scheduler", "threads", "bench", "scale", "--as-user",
                                       "--method", "isomap"])
    assert result.exit_code == 2 and "--as-user runs" in result.output


def test_knn_floor_scans_in_latent_order_and_allocates_by_error():
    """The oracle's error after m rows is that of the k nearest among the first m in latent
    order; the allocated scan meets the tolerance on the mean with no more rows than a common
    share, and both reach exactly the true neighbours at tolerance 0."""
    from dr_dask.bench.knn_floor import _allocated_share, _error_curve, _uniform_share

    d = np.array([np.inf, 5.0, 1.0, 4.0, 2.0, 3.0])  # row 0 is the query
    order = np.array([1, 3, 5, 4, 2, 0])  # latent order: the nearest rows come late
    np.testing.assert_allclose(_error_curve(d, order, 2, np.array([2, 3, 4, 5])),
                               [5 / 2 - 1, 4 / 2 - 1, 3 / 2 - 1, 0.0])
    # one row exact after 10 rows, the other after 100, each half as far off before
    grid = np.array([10, 50, 100])
    errors = np.array([[0.0, 0.0, 0.0], [0.4, 0.2, 0.0]])
    assert _uniform_share(errors, grid, 0.0, 1000) == pytest.approx(0.1)
    assert _allocated_share(errors, grid, 0.0, 1000) == pytest.approx(0.055)
    assert _allocated_share(errors, grid, 0.1, 1000) == pytest.approx(0.03)
    assert _uniform_share(errors, grid, 0.1, 1000) == pytest.approx(0.05)


def test_bench_knn_floor(tmp_path):
    out = tmp_path / "floor.json"
    result = CliRunner().invoke(main, ["bench", "knn-floor", "--T", "3000", "--queries", "40",
                                       "--tol", "0.003", "--tol", "0.03", "--json", str(out)])
    assert result.exit_code == 0, result.output
    r = json.loads(out.read_text())
    assert r["T"] == 3000 and r["N"] == 100 and r["gemm_gflops_float32"] > 0
    # the true neighbours lie in a latent window of a few percent of the rows
    assert 0.002 < r["window_share"] < 0.2
    tight, loose = r["tol_0.003"], r["tol_0.03"]
    for row in (tight, loose):
        assert 0 < row["allocated_share"] <= row["uniform_share"] <= 0.15
        assert row["floor_flops"] == pytest.approx(row["allocated_share"] * 3000**2 * 200)
    assert loose["allocated_share"] < tight["allocated_share"]
    for args, name in ((["--T", "3000", "--queries", "3000"], "--queries"),
                       (["--T", "3000", "--k", "450"], "--k"),
                       (["--tol", "0"], "--tol"),
                       (["--T", "10"], "--T")):
        result = CliRunner().invoke(main, ["bench", "knn-floor", *args])
        assert result.exit_code == 2 and name in result.output, result.output
        assert "Traceback" not in result.output
