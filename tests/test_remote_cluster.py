"""A cluster joined by scheduler file whose workers run in another working directory."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import _spawn
import numpy as np
import pytest
import zarr

from dr_dask.io.inputs import InputError, open_dataset
from dr_dask.runs.group import open_run


@pytest.fixture(scope="module")
def remote_cluster(tmp_path_factory):
    """``dask scheduler`` + ``dask worker`` processes started in their own directory."""
    where = tmp_path_factory.mktemp("worker_cwd")
    sched_file = str(where / "scheduler.json")
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OPENBLAS_NUM_THREADS="1")
    procs = [_spawn.Popen(
        [sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file", sched_file,
         "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0"],
        cwd=where, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    t0 = time.time()
    while not os.path.exists(sched_file) and time.time() - t0 < 60:
        time.sleep(0.1)
    procs.append(_spawn.Popen(
        [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", sched_file,
         "--nworkers", "2", "--nthreads", "1", "--no-dashboard", "--memory-limit", "2GB"],
        cwd=where, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    from distributed import Client

    with Client(scheduler_file=sched_file, timeout="60s") as c:
        c.wait_for_workers(2, timeout=60)
    yield sched_file
    for p in reversed(procs):
        p.terminate()
        p.wait(timeout=30)


@pytest.mark.cluster
def test_relative_paths_reach_workers_in_another_directory(remote_cluster, tmp_path,
                                                           monkeypatch):
    rng = np.random.default_rng(0)
    z = rng.normal(size=(200, 2))
    X = np.tanh(z @ rng.normal(size=(2, 10))) + 0.05 * rng.normal(size=(200, 10))
    g = zarr.open_group(str(tmp_path / "data.zarr"), mode="w")
    g.create_array("X", data=X, chunks=(50, 10))
    env = dict(os.environ, PYTHONPATH=os.getcwd(), DASK_SCHEDULER_FILE=remote_cluster)
    env.pop("DASK_SCHEDULER_ADDRESS", None)
    cmd = [sys.executable, "-m", "dr_dask.cli", "embed", "isomap", "-n", "2",
           "--n-neighbors", "8", "--input", "data.zarr:X", "--out", "out.zarr", "--name", "r"]
    res = _spawn.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    ref = _spawn.run([*cmd[:3], "--scheduler", "threads", *cmd[3:-4], "--out", "ref.zarr",
                      "--name", "r"], cwd=tmp_path, env=env, capture_output=True, text=True,
                     timeout=300)
    assert ref.returncode == 0, ref.stderr
    np.testing.assert_allclose(
        np.asarray(open_run(str(tmp_path / "out.zarr"), "r")["embedding"][...]),
        np.asarray(open_run(str(tmp_path / "ref.zarr"), "r")["embedding"][...]),
        rtol=1e-6, atol=1e-8,
    )


@pytest.mark.cluster
def test_input_the_workers_cannot_read_names_worker_and_path(remote_cluster):
    from distributed import Client

    from dr_dask.methods.isomap import Isomap
    from dr_dask.runs.group import run_embedding

    # memory:// lives in one process: the client sees it, the workers do not
    g = zarr.open_group("memory://only-here/data.zarr", mode="w")
    g.create_array("X", data=np.random.default_rng(0).normal(size=(60, 4)), chunks=(30, 4))
    inp = open_dataset("memory://only-here/data.zarr:X")
    with Client(scheduler_file=remote_cluster) as client:
        with pytest.raises(InputError, match=r"worker tcp://127\.0\.0\.1:\d+ cannot read the "
                                             r"input memory://only-here/data\.zarr"):
            run_embedding(Isomap(n_components=2, client=client), inp,
                          "memory://only-here/out.zarr", method="isomap")
