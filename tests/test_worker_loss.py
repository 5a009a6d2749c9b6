"""Worker loss: a fit survives a SIGKILLed worker with the same result as an undisturbed run.

Each fit runs undisturbed once on a 2-process LocalCluster (the reference result, and the start
time of each of its tasks), then once for each moment, a quarter and three quarters of the way
through the reference run's task starts, on the same cluster (its nanny has brought back the
worker the last kill took): the worker that starts the task the reference run started at that
moment holds it until the moment, then SIGKILLs itself (``_faults.Task(n, at=...)``): the kill
lands early and late inside the fit whatever the machine's speed and load, and the fit cannot
have ended before it. In-memory inputs are staged for the workers (``dr_dask.input.stage-bytes``
low), so every fit also asks every worker with a broadcast, which a killed worker must not fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import _spawn
import numpy as np
import psutil
import pytest
import zarr
from _faults import Fault, Task
from conftest import free_port, wait_port

pytestmark = pytest.mark.cluster

#: How far through the undisturbed fit's task starts a worker is killed (shares of the time
#: from the fit's start to its last task's start: early and late, however fast the machine).
MOMENTS = (0.25, 0.75)
#: Every fit that lost a worker: the moment, the task it was starting and the largest
#: difference from the undisturbed result (printed when the module ends, with ``-s``).
RECORD: list[tuple[str, float, str, float]] = []


@pytest.fixture(scope="module")
def clusters():
    """``clusters()``: the client of the module's 2-process cluster once both its workers are
    up (the nanny restarts a killed worker's process); a fresh cluster if that takes over 10 s
    (a restart that failed, as it does once or twice a suite under load: a restart takes under
    a second here, a fresh cluster a few)."""
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
                opened[0].wait_for_workers(2, timeout=10)
                return opened[0]
            except TimeoutError:
                close()
        cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                               dashboard_address=None, memory_limit="2GB")
        c = Client(cluster, set_as_default=False)
        c.wait_for_workers(2, timeout=300)
        opened.append(c)
        return c

    yield ready
    close()
    for name, at, key, diff in RECORD:
        print(f"{name}: worker killed at {at:.2f} s ({key}): largest difference {diff:.1e}")


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    t = rng.uniform(0, 3 * np.pi, 240)
    h = rng.uniform(0, 5, 240)
    roll = np.c_[t * np.cos(t), h, t * np.sin(t)]
    lift = np.tanh(roll @ rng.normal(size=(3, 12)) / 4) + 0.01 * rng.normal(size=(240, 12))
    return roll, lift


@pytest.fixture
def staged(dr_config):
    """In-memory inputs go to the workers through a staged store, as above 4 MiB: the staging
    asks every worker whether it sees it (a broadcast a dead worker used to fail)."""
    dr_config({"input.stage-bytes": "1 KiB"})


def _survives(clusters, fit, tmp_path, name: str, atol: float = 1e-10) -> None:
    """``fit(client)`` with a worker killed at each of :data:`MOMENTS` returns the undisturbed
    result (to ``atol``)."""
    client = clusters()
    counter = Fault(tmp_path / "count", Task(0))
    counter.register(client)
    counter.start()
    expected = np.asarray(fit(client))
    starts = [t - (counter.started or 0.0) for t in counter.times]
    assert starts, "the fit ran no task on the cluster"
    for share in MOMENTS:
        # the first task the undisturbed fit started at the moment, held until then
        at = share * starts[-1]
        n = next(i for i, t in enumerate(starts, 1) if t >= at)
        client = clusters()
        fault = Fault(tmp_path / f"kill-{share}", Task(n, at=at))
        fault.register(client)
        fault.start()
        got = np.asarray(fit(client))
        fired = fault.fired
        assert fired is not None, f"no worker started task {n} of {len(starts)}"
        assert fired["time"] - (fault.started or 0.0) >= at - 0.05
        assert not _alive(fired["pid"]), "the worker that started the task still runs"
        diff = float(np.max(np.abs(got - expected))) if got.size else 0.0
        RECORD.append((name, at, str(fired["key"]), diff))
        # the same result: to rounding, since a recomputed task may sum in another order
        np.testing.assert_allclose(got, expected, atol=atol, rtol=0.0,
                                   err_msg=f"worker killed at {at:.2f} s, {fired['key']}")


def _alive(pid: int, grace: float = 5.0) -> bool:
    """Whether ``pid`` still runs ``grace`` seconds on: a SIGKILLed worker's exit is still
    under way when its connections close, which is when the scheduler gives up on it (a CI
    run saw it running right after the broadcast's answers were in)."""
    end = time.monotonic() + grace
    while True:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            return False
        if time.monotonic() > end:
            return True
        time.sleep(0.05)


def _die_if(pid: int) -> int:
    """On a worker: SIGKILL this process if it is ``pid`` (mid-broadcast), else its pid."""
    if os.getpid() == pid:
        os.kill(pid, signal.SIGKILL)
        time.sleep(60)  # never answers: the kill lands before
    return os.getpid()


def test_broadcast_survives_a_worker_dying_under_it(clusters):
    """A worker that dies while a broadcast asks it (SIGKILLed inside the call) is left out:
    the others' answers come back, where ``client.run`` raised the scheduler's
    CommClosedError; what the function raises on a worker is still raised."""
    from dr_dask.runtime.cluster import run_on_workers

    client = clusters()
    pids = client.run(os.getpid)
    victim, survivor = sorted(pids)
    answers = run_on_workers(client, _die_if, pids[victim])
    assert answers == {survivor: pids[survivor]}
    assert not _alive(pids[victim])
    client = clusters()  # its nanny restarted the victim
    with pytest.raises(ZeroDivisionError):
        run_on_workers(client, divmod, 1, 0)


@pytest.mark.parametrize("solver", ["full", "geodesic", "blockwise", "landmark"])
def test_ikd_survives_worker_loss(staged, clusters, data, solver, tmp_path):
    from dr_dask.methods.ikd import IKD

    _, X = data
    kw = {"n_landmarks": 40, "solver": "geodesic"} if solver == "landmark" else {"solver": solver}
    if solver == "full":
        kw["tile_size"] = 80  # 6 tiles: a kill lands between and inside tile tasks
    _survives(clusters,
              lambda client: IKD(n_components=2, random_state=0, client=client,
                                 **kw).fit(X).embedding_,
              tmp_path=tmp_path, name=f"IKD {solver}")


@pytest.mark.parametrize("landmarks", [False, True])
def test_isomap_survives_worker_loss(staged, clusters, data, landmarks, tmp_path):
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

    _survives(clusters, fit, tmp_path=tmp_path,
              name="LandmarkIsomap" if landmarks else "Isomap")


def test_lsdr_survives_worker_loss(staged, clusters, data, tmp_path):
    from dr_dask.methods.lsdr import LSDR

    roll, _ = data
    _survives(clusters, lambda client: LSDR(n_components=2, random_state=0,
                                            client=client).fit(roll).embedding_,
              tmp_path=tmp_path, name="LSDR")


def test_metrics_survive_worker_loss(staged, clusters, data, tmp_path):
    from dr_dask.metrics import neighbourhood_scores

    roll, X = data

    def scores(client):
        out = neighbourhood_scores(X, roll[:, :2], 7, block_rows=30, client=client)
        return [out[k] for k in sorted(out)]

    _survives(clusters, scores, tmp_path=tmp_path, name="neighbourhood_scores")


def test_gp_isomap_survives_worker_loss(staged, clusters, data, tmp_path):
    from dr_dask.methods.gp_isomap import GPIsomap

    roll, _ = data

    def fit(client):
        gp = GPIsomap(n_neighbors=10, random_state=0, client=client).fit(roll)
        mean, variance, _ = gp.map_points(roll[::4])
        return np.concatenate([gp.embedding_.ravel(), mean.ravel(), variance])

    _survives(clusters, fit, tmp_path=tmp_path, name="GPIsomap")


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
    scheduler = _spawn.Popen([sys.executable, "-m", "dask", "scheduler", "--host",
                              "127.0.0.1", "--port", str(port), "--no-dashboard"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    worker = None
    try:
        wait_port(port)
        worker = _spawn.Popen([sys.executable, "-m", "dask", "worker",
                               f"tcp://127.0.0.1:{port}", "--nthreads", "1",
                               "--no-dashboard", "--memory-limit", "1GB"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        from distributed import Client

        with Client(f"tcp://127.0.0.1:{port}", timeout=60) as c:  # the worker has joined
            c.wait_for_workers(1, timeout=120)
        proc = _spawn.Popen(
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
        res = _spawn.run(
            [sys.executable, "-m", "dr_dask.cli", "--scheduler", lc.scheduler_address, "embed",
             "ikd", "--input", str(tmp_path / "x.npy"), "--out", str(tmp_path / "o.zarr"),
             "-n", "2", "--tile-size", "4000", "--tile-cache", "memory"],
            env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "exceeding its memory limit" in res.stderr and "--memory-limit" in res.stderr
    assert "Traceback" not in res.stderr
