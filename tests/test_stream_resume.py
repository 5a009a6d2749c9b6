"""A resumed stream is the undisturbed stream, bit for bit: killed (SIGKILL, from inside the run at
a chosen write) at points spread over a run with two refits, in parallel mode, then resumed,
its rows (embedding, variance, first variance, status, version, manifold), its refit records
and its summary equal those of a run never interrupted. On local disk and on S3 (moto)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import _spawn
import numpy as np
import pytest
from _faults import Fault, RefitInFlight, Rows, Written
from conftest import free_port, wait_port

from dr_dask.datasets.swiss_roll import drift_scenario, write_scenario
from dr_dask.io.storage import Location
from dr_dask.methods.gp_isomap import GPIsomap
from dr_dask.methods.gp_isomap_io import load_gp_isomap, save_gp_isomap
from dr_dask.stream import StreamRunner, read_output

N_S = 30  # two refits over the drift scenario below (at rows 40 and 400)
ROWS = ("embedding", "variance", "first_variance", "status", "version", "manifold")


@pytest.fixture(scope="module")
def drift(tmp_path_factory):
    """A drifting stream of 25 chunks of 20 rows and its model (saved as a file): it ends one
    chunk after the second refit's publication (row 480), the last point a kill needs."""
    sc = drift_scenario(200, 500, random_state=3)
    root = tmp_path_factory.mktemp("resume")
    write_scenario(sc, str(root), kind="npy-dir", chunk_size=20)
    model = str(root / "model.zarr")
    save_gp_isomap(GPIsomap(n_neighbors=10, random_state=0).fit(sc.batch), model)
    return str(root / "stream"), model


def _run(out: str, source: str, model: str | None = None) -> dict:
    loaded = load_gp_isomap(Location(model))[0] if model else None
    return StreamRunner(out, source, loaded, n_s=N_S).run()


@pytest.fixture(scope="module")
def undisturbed(drift, tmp_path_factory):
    source, model = drift
    out = str(tmp_path_factory.mktemp("undisturbed") / "out")
    summary = _run(out, source, model)
    return summary, read_output(out)


def _same(resumed: tuple[dict, dict], undisturbed: tuple[dict, dict]) -> None:
    (s1, o1), (s0, o0) = resumed, undisturbed
    _same_output(o1, o0)
    assert s1 == s0


def _same_output(o1: dict, o0: dict) -> None:
    for name in ROWS:  # bit for bit
        assert np.array_equal(o1[name], o0[name], equal_nan=True), name
    c1, c0 = o1["checkpoint"], o0["checkpoint"]
    for key in ("n_rows", "n_chunks", "version", "buffer_len", "pending", "sigma_t", "refit"):
        assert c1[key] == c0[key], key

    def timeless(refits):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in refits]

    assert timeless(c1["refits"]) == timeless(c0["refits"])


def test_undisturbed_run_refits_twice(undisturbed):
    summary, o = undisturbed
    assert summary["n_refits"] == 2 and summary["n_rows"] == 500 == len(o["status"])
    refits = o["checkpoint"]["refits"]
    # each published refit-lag (4) chunks of 20 rows after the commit that started it
    assert [(r["trigger_row"], r["publish_row"]) for r in refits] == [(40, 120), (400, 480)]


#: Kill points spread over the run: commits before, during and after each refit, the moment a
#: refit is recorded, a refit in flight, buffered points written but not yet checkpointed, a
#: publication torn after its model or its rows were written, the last commit.
KILLS = [
    Rows(20),                            # the first commit
    Written(r"/buffer_points/c/", 1),    # buffered points written, their checkpoint not yet
    RefitInFlight(1),                    # refit 1 recorded as it starts
    RefitInFlight(3),                    # refit 1 in flight, two commits later
    Written(r"/models/v1/", 2),          # publication 1: model half written
    Written(r"/version/c/", 7),          # publication 1: rows' versions written, values not yet
    Written(r"/status/c/", 7),           # publication 1: rows re-mapped, checkpoint not yet
    Rows(200),                           # between the refits
    Written(r"/buffer_rows/c/", 12),     # buffer written, not checkpointed, before refit 2
    Written(r"/models/v2/", 3),          # publication 2: model written
    Rows(500),                           # the last commit, before the stream's end
]


@pytest.mark.parametrize("mark", KILLS, ids=[repr(m) for m in KILLS])
def test_killed_anywhere_resumes_to_the_undisturbed_output(mark, drift, undisturbed, tmp_path):
    source, model = drift
    out = str(tmp_path / "out")
    fault = Fault(tmp_path / "fault", mark)
    proc = fault.cli("--scheduler", "threads", "stream", "run", source, "--out", out,
                     "--model", model, "--n-s", str(N_S))
    assert proc.wait(timeout=300) == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert fault.fired is not None
    read_output(out)  # a reader of what the kill left finds no corruption in it
    _same((_run(out, source), read_output(out)), undisturbed)


@pytest.mark.slow
# the one kill point on S3 (about 20 s; the local kills cover the others)
def test_killed_on_s3_resumes_to_the_undisturbed_output(drift, undisturbed, s3_bucket,
                                                        tmp_path):
    """Source and output on S3 (moto server): killed with a refit in flight, resumed.

    On an object store every request is a round trip: each run opens each output array once
    (it made them, or opened them as it took the lease), not once per chunk written (a run
    reread every array's metadata 30 times, 480 of its 2,400 requests); counted on the moto
    server, which serves the killed run's requests and the resumed run's."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    source, model = drift
    src = Location(f"s3://{s3_bucket}/stream")
    for name in sorted(os.listdir(source)):
        with open(os.path.join(source, name), "rb") as fh:
            src.child(name).write_bytes(fh.read())
    reads: dict[str, int] = {}
    serve = DomainDispatcherApplication.__call__

    def counted(self, environ, start_response):
        path = environ.get("PATH_INFO", "")
        if environ["REQUEST_METHOD"] in ("GET", "HEAD") and path.endswith("/zarr.json"):
            reads[path] = reads.get(path, 0) + 1
        return serve(self, environ, start_response)

    out = f"s3://{s3_bucket}/out"
    # counted for the two runs only (not the bucket fixture's settings, which stay)
    with pytest.MonkeyPatch.context() as counting:
        counting.setattr(DomainDispatcherApplication, "__call__", counted)
        fault = Fault(tmp_path / "fault", RefitInFlight(3))
        proc = fault.cli("--scheduler", "threads", "stream", "run", src.url, "--out", out,
                         "--model", model, "--n-s", str(N_S))
        assert proc.wait(timeout=300) == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
        assert fault.fired is not None
        resumed = _run(out, src.url)
    arrays = {name: reads.get(f"/{s3_bucket}/out/{name}/zarr.json", 0) for name in ROWS}
    # an existence check and a read by the resumed run; none by the run that made them
    assert max(arrays.values()) <= 2, arrays
    _same((resumed, read_output(out)), undisturbed)
    assert not os.path.exists("s3:")  # nothing went to a local directory named like the URL


def test_holder_paused_inside_its_final_write_ends_as_undisturbed(drift, undisturbed, tmp_path):
    """A holder paused (SIGSTOP) inside its final checkpoint write, after that write's fence,
    past its lease's lifetime: the run that takes over ends with the undisturbed output, bit
    for bit, and the holder, woken, writes nothing (its write is a compare-and-swap on the
    checkpoint it last wrote) and exits 1 naming the taker."""
    from test_fencing import _take_over

    source, model = drift
    out = Location(str(tmp_path / "out"))
    final = dict(module="dr_dask.io.storage", cls="Location", method="swap_bytes", before=True,
                 when="self.url.endswith('checkpoint.json') "
                      "and json.loads(args[0]).get('n_rows') == 500")
    _take_over(("stream", "run", source, "--out", out.url, "--model", model, "--n-s",
                str(N_S)), final, out)
    o = read_output(out.url)
    assert o["checkpoint"]["lease"]["token"] == 2
    _same_output(o, undisturbed[1])


def _dask(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OPENBLAS_NUM_THREADS="1")
    return _spawn.Popen([sys.executable, "-m", "dask", *args],
                        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _cluster(port: int) -> list[subprocess.Popen]:
    """A scheduler on ``port`` and one single-threaded worker, each its own process."""
    scheduler = _dask("scheduler", "--host", "127.0.0.1", "--port", str(port),
                      "--no-dashboard")
    wait_port(port)
    worker = _dask("worker", f"tcp://127.0.0.1:{port}", "--nthreads", "1", "--no-dashboard",
                   "--no-nanny")
    return [scheduler, worker]


@pytest.mark.cluster
def test_scheduler_killed_under_a_running_stream(drift, undisturbed, tmp_path):
    """The scheduler SIGKILLed as the stream commits row 200: the command exits 1 (retry) in
    bounded time with one line naming what was lost; rerun against the restarted scheduler, it
    ends with the undisturbed output, bit for bit."""
    source, model = drift
    out = str(tmp_path / "out")
    port = free_port()
    procs = _cluster(port)
    try:
        args = ("--scheduler", f"tcp://127.0.0.1:{port}", "--wait-for-workers", "60s",
                "stream", "run", source, "--out", out, "--model", model, "--n-s", str(N_S))
        fault = Fault(tmp_path / "fault", Rows(200), pid=procs[0].pid)
        proc = fault.cli(*args, text=True)
        _, err = proc.communicate(timeout=300)
        assert fault.fired is not None and procs[0].wait(timeout=30) == -signal.SIGKILL
        assert proc.returncode == 1, err[-3000:]
        errors = [line for line in err.splitlines() if line.startswith("error:")]
        assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
        assert "rows committed" in errors[0] and "Rerun" in errors[0], errors[0]
        for p in procs:
            p.kill()
            p.wait()
        procs = _cluster(port)  # the scheduler restarted (same address), a worker joins it
        rerun = _spawn.run([sys.executable, "-m", "dr_dask.cli", *args], text=True,
                           capture_output=True, timeout=300,
                           env=dict(os.environ, PYTHONPATH=os.getcwd(),
                                    OPENBLAS_NUM_THREADS="1"))
        assert rerun.returncode == 0, rerun.stderr[-3000:]
        _same((json.loads(rerun.stdout), read_output(out)), undisturbed)
    finally:
        for p in procs:
            p.kill()
            p.wait()
