"""Worker loss: a fit survives a SIGKILLed worker with the same result as an undisturbed run.

Each fit runs undisturbed twice on a 3-process LocalCluster (the reference result, then a count
of its tasks), then once for each moment on a cluster of the same size: the worker that
starts the fit's task early, midway or late (10%, 50%, 90% of the counted tasks) SIGKILLs
itself before running it (``_faults.Task``): the kill lands inside the fit whatever the
machine's load.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest
import zarr
from _faults import Fault, Task
from conftest import free_port, wait_port

pytestmark = pytest.mark.cluster

MOMENTS = (0.1, 0.5, 0.9)


@pytest.fixture
def clusters():
    """``clusters()``: a client of a 3-process cluster with all its workers up. The same
    cluster as the last call once its nanny has brought back the worker a kill took; a fresh
    one if that takes over a minute (on a loaded machine a restart can take minutes, or fail
    and leave every later moment short of a worker)."""
    from distributed import Client, LocalCluster

    opened: list = []

    def close() -> None:
        for c in opened:
            c.close()
            c.cluster.close()
        opened.clear()

    def ready() -> Client:
        if opened:
            try:
                opened[0].wait_for_workers(3, timeout=60)
                return opened[0]
            except TimeoutError:
                close()
        cluster = LocalCluster(n_workers=3, threads_per_worker=1, processes=True,
                               dashboard_address=None, memory_limit="2GB")
        c = Client(cluster, set_as_default=False)
        c.wait_for_workers(3, timeout=300)
        opened.append(c)
        return c

    yield ready
    close()


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    t = rng.uniform(0, 3 * np.pi, 240)
    h = rng.uniform(0, 5, 240)
    roll = np.c_[t * np.cos(t), h, t * np.sin(t)]
    lift = np.tanh(roll @ rng.normal(size=(3, 12)) / 4) + 0.01 * rng.normal(size=(240, 12))
    return roll, lift


def _survives(clusters, fit, atol: float, tmp_path) -> None:
    """``fit(client)`` with a worker killed at each moment returns the undisturbed result.

    Each moment runs on a cluster of the counting run's size: a fit's tasks depend on its
    workers (the geodesic strips are sized per worker thread), so the counted positions hold
    only on a cluster of the same size."""
    client = clusters()
    expected = np.asarray(fit(client))
    # the tasks of a fit like the ones below (a first fit may run more: results that later
    # fits find still held, e.g. shared inputs); n=0 counts them and kills nothing
    counter = Fault(tmp_path / "count", Task(0))
    counter.register(client)
    np.testing.assert_allclose(np.asarray(fit(client)), expected, atol=atol, rtol=1e-6)
    total = counter.count
    assert total >= 1
    # early, midway, late: the same task when a fit has only a few (LSDR's and GP-Isomap's
    # fits are one or two tasks on the cluster)
    for n in sorted({max(1, round(moment * total)) for moment in MOMENTS}):
        client = clusters()
        fault = Fault(tmp_path / f"kill-{n}", Task(n))
        fault.register(client)
        got = np.asarray(fit(client))
        fired = fault.fired
        assert fired is not None, f"no worker started task {fault.mark.n} of {total}"
        assert not _alive(fired["pid"]), "the worker that started the task still runs"
        np.testing.assert_allclose(got, expected, atol=atol, rtol=1e-6,
                                   err_msg=f"worker killed at {fired['key']} ({n}/{total})")


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("solver", ["full", "geodesic", "blockwise", "landmark"])
def test_ikd_survives_worker_loss(clusters, data, solver, tmp_path):
    from dr_dask.methods.ikd import IKD

    _, X = data
    kw = {"n_landmarks": 40, "solver": "geodesic"} if solver == "landmark" else {"solver": solver}
    if solver == "full":
        kw["tile_size"] = 80  # 6 tiles: a kill lands between and inside tile tasks
    _survives(clusters,
              lambda client: IKD(n_components=2, random_state=0, client=client,
                                 **kw).fit(X).embedding_,
              atol=1e-8, tmp_path=tmp_path)


@pytest.mark.parametrize("landmarks", [False, True])
def test_isomap_survives_worker_loss(clusters, data, landmarks, tmp_path):
    from dr_dask.methods.isomap import Isomap
    from dr_dask.methods.landmark_isomap import LandmarkIsomap

    roll, _ = data

    def fit(client):
        if landmarks:
            est = LandmarkIsomap(n_neighbors=10, n_landmarks=40, random_state=0, client=client,
                                 block_size=10)
        else:
            est = Isomap(n_neighbors=10, eigen_solver="lanczos", random_state=0, client=client,
                         block_size=30)
        return est.fit(roll).embedding_

    _survives(clusters, fit, atol=1e-8, tmp_path=tmp_path)


def test_lsdr_survives_worker_loss(clusters, data, tmp_path):
    from dr_dask.methods.lsdr import LSDR

    roll, _ = data
    _survives(clusters, lambda client: LSDR(n_components=2, random_state=0,
                                            client=client).fit(roll).embedding_,
              atol=1e-8, tmp_path=tmp_path)


def test_metrics_survive_worker_loss(clusters, data, tmp_path):
    from dr_dask.metrics import neighbourhood_scores

    roll, X = data

    def scores(client):
        out = neighbourhood_scores(X, roll[:, :2], 7, block_rows=30, client=client)
        return [out[k] for k in sorted(out)]

    _survives(clusters, scores, atol=1e-12, tmp_path=tmp_path)


def test_gp_isomap_survives_worker_loss(clusters, data, tmp_path):
    from dr_dask.methods.gp_isomap import GPIsomap

    roll, _ = data

    def fit(client):
        gp = GPIsomap(n_neighbors=10, random_state=0, client=client).fit(roll)
        mean, variance, _ = gp.map_points(roll[::4])
        return np.concatenate([gp.embedding_.ravel(), mean.ravel(), variance])

    _survives(clusters, fit, atol=1e-8, tmp_path=tmp_path)


def test_gone_cluster_stops_with_the_stage_to_resume(data, dr_config):
    """With every worker gone for good, a fit stops within a bounded time naming its stage."""
    from distributed import Client, LocalCluster

    from dr_dask.methods.ikd import IKD
    from dr_dask.runtime import cluster as dc

    dr_config({"cluster.wait-for-workers": 3.0})
    _, X = data
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                      dashboard_address=None, memory_limit="2GB") as lc, \
            Client(lc, set_as_default=False) as c:
        c.wait_for_workers(1)
        lc.scale(0)  # the cluster loses its only worker and gets no other
        t0 = time.perf_counter()
        # an in-memory input is validated in this process: the first stage on the cluster
        # is the distance tiles
        with pytest.raises(dc.ClusterLost, match=r"no worker joined the scheduler tcp://\S+ "
                           r"within 3 s .*Rerun to resume from stage 'distance'"):
            IKD(n_components=2, tile_size=60, client=c).fit(X)
        assert time.perf_counter() - t0 < 60


def test_cli_survives_worker_loss(tmp_path, data):
    """A worker killed during ``dr-dask embed ikd`` neither hangs the command nor changes the
    embedding. It is killed as it starts a product with the distance tiles (the eigen stage):
    the tiles it held are lost with it and recomputed."""
    from dr_dask.methods.ikd import IKD

    _, X = data
    np.save(tmp_path / "x.npy", X)
    out = str(tmp_path / "runs.zarr")
    fault = Fault(tmp_path / "fault", Task(2, prefix="tile_matmat"))
    proc = fault.cli("--workers", "2", "embed", "ikd", "--input", str(tmp_path / "x.npy"),
                     "--out", out, "-n", "2", "--tile-size", "60", "--name", "r")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err.decode()[-2000:]
    assert fault.fired is not None, "no worker started a second tile product"
    got = np.asarray(zarr.open_group(out, mode="r")["r"]["embedding"][...])
    want = IKD(n_components=2, tile_size=60, random_state=0).fit(X).embedding_
    np.testing.assert_allclose(got, want, atol=1e-8)


# ------------------------------------------------------------------- exit codes that mean something
def test_cluster_lost_in_the_first_seconds_exits_1_naming_where(tmp_path, data):
    """The scheduler dies as soon as the command has joined it, before any stage: exit 1 (a
    rerun resumes), a message that says where, and no traceback without -v."""
    _, X = data
    np.save(tmp_path / "x.npy", X)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path),
           "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT": "3s"}
    bindir = os.path.dirname(sys.executable)
    scheduler = subprocess.Popen([os.path.join(bindir, "dask"), "scheduler", "--host",
                                  "127.0.0.1", "--port", str(port), "--no-dashboard"],
                                 env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = None
    try:
        wait_port(port)
        worker = subprocess.Popen([os.path.join(bindir, "dask"), "worker",
                                   f"tcp://127.0.0.1:{port}", "--nthreads", "1",
                                   "--no-dashboard", "--memory-limit", "1GB"],
                                  env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc = subprocess.Popen(
            [sys.executable, "-m", "dr_dask.cli", "--scheduler", f"tcp://127.0.0.1:{port}",
             "embed", "ikd", "--input", str(tmp_path / "x.npy"), "--out",
             str(tmp_path / "o.zarr"), "-n", "2"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert proc.stderr is not None
        first = proc.stderr.readline().decode()
        assert first.startswith("dask cluster:"), first
        scheduler.kill()  # the moment the command has joined
        _, rest = proc.communicate(timeout=120)
    finally:
        for p in (scheduler, worker):
            if p is not None:
                p.kill()
                p.wait()
    err = rest.decode()
    assert proc.returncode == 1, err
    assert "Traceback" not in err and "internal error" not in err
    assert "the Dask cluster was lost before the first stage" in err or "stage '" in err, err
    assert "Rerun to resume" in err


def _hog(n: int) -> float:
    a = np.ones(n)  # every page touched: resident memory, as a real task's arrays
    time.sleep(5)
    return float(a.sum())


def test_worker_killed_for_memory_says_so(tmp_path):
    """A task that outgrows its worker's memory limit: the nanny restarts the worker, and the
    error names the memory limit and what to change instead of a bare KilledWorker (and is
    not retried as a lost worker: it would fail the same way)."""
    import dask
    from distributed import Client, LocalCluster

    from dr_dask.runtime.cluster import WorkerOutOfMemory, gather, run_stage

    with dask.config.set({"distributed.scheduler.allowed-failures": 0}), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                         dashboard_address=None, memory_limit="400MB") as lc, \
            Client(lc, set_as_default=False) as c:
        with pytest.raises(WorkerOutOfMemory, match=r"during stage 'hog'.*exceeding its memory "
                           r"limit.*of 0.40 GB.*--memory-limit.*--chunk-size"):
            run_stage("hog", lambda: gather([c.submit(_hog, 100_000_000)], c))


def test_cli_worker_killed_for_memory_exits_2(tmp_path):
    """Through the command line: exit 2 (rerunning unchanged fails again), the message names
    the memory limit, no traceback."""
    import dask
    from distributed import LocalCluster

    rng = np.random.default_rng(0)
    np.save(tmp_path / "x.npy", rng.normal(size=(4000, 30)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    # one 4000 x 4000 float64 tile (128 MB) and its temporaries outgrow a 230 MB worker; a
    # worker that paused near the limit (80%) instead would wait forever with its task done
    with dask.config.set({"distributed.scheduler.allowed-failures": 0,
                          "distributed.worker.memory.pause": False}), \
            LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                         dashboard_address=None, memory_limit="230MB") as lc:
        res = subprocess.run(
            [sys.executable, "-m", "dr_dask.cli", "--scheduler", lc.scheduler_address, "embed",
             "ikd", "--input", str(tmp_path / "x.npy"), "--out", str(tmp_path / "o.zarr"),
             "-n", "2", "--tile-size", "4000", "--tile-cache", "memory"],
            env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "exceeding its memory limit" in res.stderr and "--memory-limit" in res.stderr
    assert "Traceback" not in res.stderr
