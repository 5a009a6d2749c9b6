"""A NumPy input on a cluster reaches the workers outside the task graph (staged in a local
Zarr store the workers read), or in it for workers that do not see that store, and the fit
equals the threaded one."""

from __future__ import annotations

import logging
import os
import pickle
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import free_port, noisy_curve, wait_port


@pytest.mark.cluster
def test_numpy_input_on_a_cluster_travels_outside_the_graph(cluster_client, dr_config):
    from dr_dask.io.validation import check_input
    from dr_dask.methods.landmark_isomap import LandmarkIsomap

    dr_config({"input.stage-bytes": 1 << 14})
    X = noisy_curve(3000, 20, seed=9)
    est = LandmarkIsomap(n_neighbors=8, n_components=1, n_landmarks=40, random_state=0,
                         client=cluster_client)
    inp = check_input(est, X, reset=True, stage=True)
    graph_bytes = len(pickle.dumps(dict(inp.data.__dask_graph__())))
    assert inp.staged is not None
    assert graph_bytes < X.nbytes / 20  # the rows are not in the graph
    np.testing.assert_array_equal(inp.data.compute(), X)
    on_cluster = est.fit(X)
    threads = LandmarkIsomap(n_neighbors=8, n_components=1, n_landmarks=40,
                             random_state=0).fit(X)
    np.testing.assert_allclose(on_cluster.embedding_, threads.embedding_, rtol=1e-6,
                               atol=1e-9)


@pytest.mark.cluster
def test_the_neighbour_search_of_a_numpy_array_stages_it_too(cluster_client, dr_config,
                                                               monkeypatch):
    """``kneighbors`` of a NumPy array among itself on a cluster sends its rows outside the
    graph, as a fit does, finds what the threads find (the cell search exactly so: it projects
    the rows in this process, as the threads do), names a non-finite row, and leaves no staged
    store behind."""
    import os
    import tempfile

    from dr_dask.graph import knn

    dr_config({"input.stage-bytes": 1 << 14})
    X = noisy_curve(3000, 20, seed=9)
    made = []
    real = knn._rows_for_workers
    monkeypatch.setattr(knn, "_rows_for_workers",
                        lambda *a: made.append(real(*a)) or made[-1])  # counted
    for algorithm in ("exact", "ivf", "cells"):
        d, i = knn.kneighbors(X, 6, client=cluster_client, algorithm=algorithm, n_probe=64)
        d0, i0 = knn.kneighbors(X, 6, algorithm=algorithm, n_probe=64)
        np.testing.assert_array_equal(i, i0)
        np.testing.assert_allclose(d, d0, rtol=0 if algorithm == "cells" else 1e-12)
    assert [m[1] is None for m in made] == [False, True] * 3  # threads: as it is
    bad = X.copy()
    bad[2345, 7] = np.inf
    for algorithm in ("cells", "ivf"):  # refused here, and on the workers
        with pytest.raises(ValueError, match=r"NaN or infinite values in rows \[2345\]"):
            knn.kneighbors(bad, 6, client=cluster_client, algorithm=algorithm, n_probe=64)
    # gone when each search ended, though their inputs (and an error's traceback) live on
    staged = [m[1].staged.url for m in made if m[1] is not None]
    assert len(staged) == 5 and not any(os.path.exists(p) for p in staged), staged
    assert all(p.startswith(tempfile.gettempdir()) for p in staged)


@pytest.fixture
def staging(dr_config, monkeypatch) -> list:
    """Every in-memory input of a fit on a cluster staged (above 16 KiB, not 4 MiB), and the
    inputs the staging returned, in order."""
    from dr_dask.io import inputs

    dr_config({"input.stage-bytes": 1 << 14})
    made: list = []
    real = inputs.rows_for_workers
    monkeypatch.setattr(inputs, "rows_for_workers",
                        lambda inp, client: made.append(real(inp, client)) or made[-1])
    return made


@pytest.mark.cluster
def test_a_fit_writes_a_numpy_input_for_the_workers_once(cluster_client, staging):
    """Isomap hands its rows to the workers only through its neighbour search (which stages
    them), geodesic IKD through its staged input: either fit of a NumPy array on a cluster
    writes the rows once, not once for the input check and again for the search."""
    from dr_dask import IKD, Isomap

    X = noisy_curve(3000, 20, seed=9)
    made = staging
    for est in (Isomap(n_neighbors=8, n_components=1, client=cluster_client),
                IKD(n_components=1, solver="geodesic", n_neighbors=8, random_state=0,
                    client=cluster_client)):
        made.clear()
        est.fit(X)
        assert sum(m.staged is not None for m in made) == 1, type(est).__name__


@pytest.mark.cluster
def test_a_failed_or_interrupted_fit_leaves_no_staged_rows(cluster_client, staging,
                                                           monkeypatch, tmp_path):
    """A fit that fails after staging its NumPy input (a parameter that only the input's size
    refutes), or is interrupted mid-stage (Ctrl-C in a notebook) or while it writes the rows,
    deletes the staged rows at once, while its error is still held (IPython keeps the last
    one); a fit that succeeds keeps them for as long as the estimator may read them."""
    import dr_dask.methods.ikd as ikd_module
    from dr_dask import IKD, LandmarkIsomap
    from dr_dask.io import inputs

    X = noisy_curve(3000, 20, seed=9)

    def staged() -> list[bool]:
        return [os.path.exists(m.staged.url) for m in staging if m.staged is not None]

    with pytest.raises(ValueError, match="landmarks") as failed:
        LandmarkIsomap(n_neighbors=8, n_components=30, n_landmarks=20,
                       client=cluster_client).fit(X)
    assert staged() == [False] and failed.value is not None

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    est = IKD(n_components=1, solver="geodesic", n_neighbors=8, random_state=0,
              client=cluster_client)
    with monkeypatch.context() as m:
        m.setattr(ikd_module, "fit_geodesic", interrupted)
        with pytest.raises(KeyboardInterrupt) as stopped:
            est.fit(X)
    assert staged() == [False, False] and stopped.value is not None
    with monkeypatch.context() as m:
        m.setattr(tempfile, "tempdir", str(tmp_path))  # where this process stages
        m.setattr(inputs, "run_on_workers", interrupted)  # asked while the rows are written
        with pytest.raises(KeyboardInterrupt):
            est.fit(X)
    assert os.listdir(tmp_path) == []
    est.fit(X)  # its out-of-sample map, built at the first transform, reads the rows
    assert staged() == [False, False, True]
    est.transform(X[:5])


def _hiding(path: Path, *command: str) -> list[str]:
    """``command`` in a mount namespace of its own in which ``path`` is an empty tmpfs: a
    process that does not see what this one writes there, as on another machine."""
    return ["unshare", "-m", "--propagation", "private", "sh", "-c",
            f"mount -t tmpfs none {shlex.quote(str(path))} && exec {shlex.join(command)}"]


@pytest.mark.cluster
def test_workers_that_do_not_see_this_disk_get_the_rows_in_the_graph(dr_config, caplog,
                                                                     tmp_path, monkeypatch):
    """A worker that does not see the directory this process stages its input in (an empty
    tmpfs there, in a mount namespace of its own): the rows travel in the task graph instead,
    the staged store is removed, and the fit equals the threaded one."""
    from distributed import Client

    from dr_dask import Isomap

    staging = tmp_path / "staging"
    staging.mkdir()
    if subprocess.run(_hiding(staging, "true"), capture_output=True).returncode != 0:
        pytest.skip("needs a mount namespace of its own (unshare -m, as root)")
    monkeypatch.setattr(tempfile, "tempdir", str(staging))  # where this process stages
    dr_config({"input.stage-bytes": 1 << 14})
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OPENBLAS_NUM_THREADS="1")
    procs = [subprocess.Popen([sys.executable, "-m", "dask", "scheduler", "--host", "127.0.0.1",
                               "--port", str(port), "--no-dashboard"],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        wait_port(port)
        procs.append(subprocess.Popen(
            _hiding(staging, sys.executable, "-m", "dask", "worker", f"tcp://127.0.0.1:{port}",
                    "--nthreads", "1", "--no-dashboard", "--memory-limit", "1GB"),
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        X = noisy_curve(3000, 20, seed=9)
        with Client(f"tcp://127.0.0.1:{port}", timeout=60) as client, \
                caplog.at_level(logging.INFO, logger="dr_dask.io.inputs"):
            client.wait_for_workers(1, timeout=120)
            est = Isomap(n_neighbors=8, n_components=1, client=client).fit(X)
    finally:
        for p in reversed(procs):
            p.kill()
            p.wait()
    assert "the workers do not share this disk" in caplog.text, caplog.text
    assert not list(staging.iterdir())  # the store written while the worker looked is gone
    threads = Isomap(n_neighbors=8, n_components=1).fit(X)
    np.testing.assert_allclose(est.embedding_, threads.embedding_, rtol=1e-6, atol=1e-9)
