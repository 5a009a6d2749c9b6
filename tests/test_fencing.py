"""One writer: a holder paused past its lease's lifetime (SIGSTOP) loses it to a second run, and
when it resumes (SIGCONT) it writes nothing more and exits 1 naming the run that took over.

Real processes and signals: ``dr-dask embed``, ``dr-dask stream run`` and
``dr-dask job incremental`` on local disk, and the job, whose run holds the stream's writes and
the job's, on S3 (moto); the lease itself on every store (the tests at the end). The first run
stops itself right after its first commit (a stage mark, a checkpoint of one chunk), so the
pause falls at the same point every time; the lease lives 3 s (``DASK_DR_DASK__LEASE__TTL``).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import _spawn
import dask
import numpy as np
import psutil
import pytest
import zarr
from click.testing import CliRunner

from dr_dask.cli import main
from dr_dask.datasets.swiss_roll import shift_scenario, write_scenario
from dr_dask.io.storage import Location
from dr_dask.methods.gp_isomap import GPIsomap
from dr_dask.methods.gp_isomap_io import save_gp_isomap
from dr_dask.runs.group import open_run
from dr_dask.stream import StreamStore, read_output

TTL = 3.0

#: Run the CLI with ``CLASS.METHOD`` wrapped so that the process stops itself (SIGSTOP) right
#: after (or, with ``before``, right before) the first call for which ``WHEN`` holds: a holder
#: paused after its first commit, or inside its final write.
_PAUSING_CLI = """
import json, os, signal, sys
import {module} as m

real, paused = m.{cls}.{method}, []

def pausing(self, *args, **kwargs):
    if {before} and not paused and ({when}):
        paused.append(True)
        os.kill(os.getpid(), signal.SIGSTOP)
    out = real(self, *args, **kwargs)
    if not {before} and not paused and ({when}):
        paused.append(True)
        os.kill(os.getpid(), signal.SIGSTOP)
    return out

m.{cls}.{method} = pausing
from dr_dask.cli import main
sys.exit(main())
"""

_RUNS = dict(module="dr_dask.runs.group", cls="RunGroup", method="mark_done", when="True")
_STREAM = dict(module="dr_dask.stream.store", cls="StreamStore", method="write_checkpoint",
               when="args[0]['n_chunks'] >= 1")


#: A run started before it may run: it loads what the commands fit with, then waits for a line
#: on stdin (the taker, started with the zombie, imports while the zombie runs and its lease
#: lapses, instead of after).
_WAITING_CLI = """
import sys
import dr_dask.jobs.incremental, dr_dask.methods.ikd, dr_dask.runs.group, dr_dask.stream
from dr_dask.cli import main
sys.stdin.readline()
sys.exit(main())
"""


def _cli(*args: str, pause: dict | None = None, wait: bool = False,
         env: dict | None = None) -> subprocess.Popen:
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", PYTHONPATH=os.getcwd(),
               DASK_DR_DASK__LEASE__TTL=str(TTL), **(env or {}))
    code = (_PAUSING_CLI.format(**{"before": False, **pause}) if pause else
            _WAITING_CLI if wait else
            "import sys; from dr_dask.cli import main; sys.exit(main())")
    return _spawn.Popen([sys.executable, "-c", code, "--scheduler", "threads", *args],
                        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        stdin=subprocess.PIPE if wait else None)


def _snapshot(where: Location, stamps: bool = False) -> dict[str, Any]:
    """Every object under ``where`` and its bytes; with ``stamps``, also its modification time
    and inode (local) or last-modified time (S3): a rewrite with the same bytes shows too (a
    resumed writer rewrites what the run that took over wrote, with the same values)."""

    def stamp(obj: Location) -> tuple:
        info = obj.fs.info(obj.path)
        return (info.get("mtime"), info.get("ino"), str(info.get("LastModified")))

    return {key: (where.child(key).read_bytes(), stamp(where.child(key)) if stamps else None)
            for key in sorted(where.find())}


def _take_over(args: tuple[str, ...], pause: dict, out: Location,
               env: dict | None = None, stamps: bool = False) -> tuple[dict, str]:
    """Run A until it pauses after its first commit, let its lease lapse, run B to the end,
    then wake A: A must exit 1 naming B and leave the output exactly as B left it. Returns
    B's output (a snapshot) and A's stderr."""
    zombie = _cli(*args, pause=pause, env=env)
    taker = _cli(*args, wait=True, env=env)
    try:
        t0 = time.time()
        while psutil.Process(zombie.pid).status() != psutil.STATUS_STOPPED:
            assert zombie.poll() is None, zombie.communicate()[1].decode()[-2000:]
            assert time.time() - t0 < 120, "the first run never reached its first commit"
            time.sleep(0.02)
        time.sleep(TTL + 1.0)  # the paused holder's lease lapses
        _, err = taker.communicate(b"run\n", timeout=300)
        assert taker.returncode == 0, err.decode()[-3000:]
        after_taker = _snapshot(out, stamps)
    finally:
        zombie.send_signal(signal.SIGCONT)
        if taker.returncode is None:  # never told to run (the zombie failed first)
            taker.kill()
            taker.communicate()
    _, zerr = zombie.communicate(timeout=300)
    message = zerr.decode()
    assert zombie.returncode == 1, message[-3000:]
    assert "taken over" in message and f":{taker.pid}:" in message, message[-3000:]
    assert "Traceback" not in message
    # the zombie wrote nothing after it woke: the output is exactly the taker's
    assert _snapshot(out, stamps) == after_taker
    return after_taker, message


def _where(kind: str, tmp_path, bucket: str | None, name: str) -> Location:
    return (Location(str(tmp_path / name)) if kind == "local"
            else Location(f"s3://{bucket}/{name}"))


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.slow)])
def place(request, tmp_path):
    """(kind, bucket): local disk, or a fresh bucket of the moto server."""
    if request.param == "local":
        return "local", None
    return "s3", request.getfixturevalue("s3_bucket")


# ------------------------------------------------------------------------------------- embed
def test_embed_zombie_cannot_publish(tmp_path):
    rng = np.random.default_rng(1)
    X = np.tanh(rng.normal(size=(240, 2)) @ rng.normal(size=(2, 12)))
    X += 0.05 * rng.normal(size=X.shape)
    src = Location(str(tmp_path / "in.zarr"))
    zarr.open_group(store=src.zarr_store(), mode="w").create_array("X", data=X, chunks=(80, 12))
    out = Location(str(tmp_path / "out.zarr"))
    args = ("embed", "ikd", "-n", "2", "--tile-cache", "disk", "--tile-size", "96", "--name",
            "r", "--input", f"{src.url}:X", "--out", out.url)
    _, message = _take_over(args, _RUNS, out)
    run = open_run(out.url, "r")
    assert run.attrs["complete"] and np.isfinite(np.asarray(run["embedding"][...])).all()
    # the first stage was committed by the paused holder before it lost the lease; the rest,
    # and the completion, by the run that took over, under the next token
    stages = run.attrs["stages"]
    assert stages["distance"]["lease"]["token"] == 1
    assert stages["eigen"]["lease"]["token"] == run.attrs["lease"]["token"] == 2
    assert run.attrs["lease"]["owner"] in message
    assert not out.child("r", "lease.json").exists()  # released by the taker


# ------------------------------------------------------------------------------------ stream
@pytest.fixture(scope="module")
def stream_scenario(tmp_path_factory):
    """A shift scenario of 12 chunks of 20 rows, and its model saved as a file."""
    sc = shift_scenario(60, random_state=3)
    root = tmp_path_factory.mktemp("fencing_stream")
    write_scenario(sc, str(root), kind="npy-dir", chunk_size=20)
    model = str(root / "model.zarr")
    save_gp_isomap(GPIsomap(n_neighbors=10, random_state=0).fit(sc.batch), model)
    return str(root / "stream"), model, len(sc.stream)


def test_stream_zombie_cannot_publish(tmp_path, stream_scenario):
    source_dir, model, n = stream_scenario
    out = Location(str(tmp_path / "out"))
    args = ("stream", "run", source_dir, "--out", out.url,
            "--model", model, "--n-s", "100000", "--max-in-flight", "1")
    _take_over(args, _STREAM, out)
    o = read_output(out.url)
    assert o["checkpoint"]["n_rows"] == n == len(o["status"])  # every row, once
    assert o["checkpoint"]["lease"]["token"] == 2
    assert np.isfinite(o["embedding"]).all()


#: Where a stream's writer pauses around its refit (the stream refits once, on the rows of an
#: unseen patch, two chunks before its end): before the refit starts (after its first
#: commit); with the refit in flight (after the next chunk's commit: the refit's result
#: arrives after the pause); in the middle of the refit's publication (right after the fence
#: of its rewrite of the buffered rows, before any of their arrays is written: the window a
#: fence per group of writes left open); after the publication (its checkpoint written, two
#: chunks still to come).
_AROUND_REFIT = {
    "before": dict(_STREAM, when="args[0]['n_chunks'] >= 1 and not args[0]['refit']"),
    "in flight": dict(_STREAM, when="args[0]['refit'] and args[0]['n_chunks'] > "
                      "args[0]['refit']['trigger_seq']"),
    "publishing": dict(_STREAM, method="fence",
                       when="sys._getframe(1).f_code.co_name == 'update_rows'"),
    "after": dict(_STREAM, when="len(args[0]['refits']) >= 1"),
}


@pytest.fixture(scope="module")
def refit_scenario(tmp_path_factory):
    """The shift scenario in 24 chunks of 10 rows, its model, and the output of an undisturbed
    run that refits once (``n_s`` 20, published one chunk after it starts)."""
    sc = shift_scenario(60, random_state=3)
    root = tmp_path_factory.mktemp("fencing_refit")
    write_scenario(sc, str(root), kind="npy-dir", chunk_size=10)
    model = str(root / "model.zarr")
    save_gp_isomap(GPIsomap(n_neighbors=10, random_state=0).fit(sc.batch), model)
    args = ("stream", "run", str(root / "stream"), "--model", model, "--n-s", "20",
            "--max-in-flight", "1")
    env = {"DASK_DR_DASK__STREAM__REFIT_LAG": "1"}
    # the reference in this process (the zombie and the taker are the processes under test):
    # the same command, with the same refit lag
    with dask.config.set({"dr_dask.stream.refit-lag": 1}):
        ref = CliRunner().invoke(main, ["--scheduler", "threads", *args,
                                        "--out", str(root / "undisturbed")])
    assert ref.exit_code == 0, ref.output[-3000:]
    return args, env, read_output(str(root / "undisturbed"))


@pytest.mark.parametrize("moment", list(_AROUND_REFIT))
def test_stream_zombie_writes_nothing_around_a_refit(tmp_path, refit_scenario, moment):
    """A stream writer paused (SIGSTOP) before, during or after its refit, whose lease another
    run takes over and finishes with: woken (SIGCONT), it writes no object (every byte of the
    output is the taker's), drops the refit it had in flight, and exits 1 (LeaseLost); the
    output is the undisturbed run's."""
    args, env, undisturbed = refit_scenario
    out = Location(str(tmp_path / "out"))
    _take_over((*args, "--out", out.url), _AROUND_REFIT[moment], out, env=env, stamps=True)
    o = read_output(out.url)
    assert len(o["checkpoint"]["refits"]) == 1 and o["checkpoint"]["lease"]["token"] == 2
    for name in ("embedding", "variance", "manifold", "version", "status"):
        np.testing.assert_array_equal(o[name], undisturbed[name], err_msg=name)


# ------------------------------------------------------------------------------- incremental
def test_incremental_job_zombie_cannot_publish(place, tmp_path):
    kind, bucket = place
    sc = shift_scenario(60, random_state=3)
    X = np.vstack([sc.batch, sc.stream])[:300]  # the batch and four chunks of 30
    src = _where(kind, tmp_path, bucket, "land.zarr")
    zarr.open_group(store=src.zarr_store(), mode="w").create_array("X", data=X, chunks=(30, 3))
    state = _where(kind, tmp_path, bucket, "state")
    args = ("job", "incremental", f"{src.url}:X", "--state", state.url, "--n-batch", "180",
            "--n-s", "100000", "--chunk-size", "30", "--max-in-flight", "1", "--no-report")
    _take_over(args, _STREAM, state)
    ck = StreamStore(state).read_checkpoint()
    assert ck["n_rows"] == len(X) and ck["lease"]["token"] == 2
    (entry,) = state.child("drift_history.json").read_json()  # one entry: the taker's
    assert entry["watermark_after"] == len(X) and entry["lease"]["token"] == 2


# ------------------------------------------------------------------------- the lease itself
@pytest.fixture(params=["local", "memory", "s3"])
def lease_at(request, tmp_path):
    if request.param == "local":
        yield Location(str(tmp_path / "run" / "lease.json"))
    elif request.param == "memory":
        loc = Location(f"memory://fencing-{os.getpid()}-{time.time_ns()}/lease.json")
        yield loc
        loc.delete()
    else:
        yield Location(f"s3://{request.getfixturevalue('s3_bucket')}/run/lease.json")


def test_a_paused_holder_is_fenced_off(lease_at):
    from dr_dask.runs.lease import Lease, LeaseLost

    paused = Lease(lease_at, ttl=0.5).acquire()
    paused._stop.set()  # its renewals stop, as in a paused process
    time.sleep(0.8)
    taker = Lease(lease_at, ttl=30).acquire()
    assert taker.token == paused.token + 1
    with pytest.raises(LeaseLost, match=taker.owner):
        paused.fence()
    with pytest.raises(LeaseLost):  # and for good
        paused.fence()
    paused.release()  # not its lease any more: left alone
    assert lease_at.read_json()["owner"] == taker.owner
    assert taker.fence() == taker.token
    taker.release()


def test_one_of_many_simultaneous_takers_wins(lease_at):
    from concurrent.futures import ThreadPoolExecutor

    from dr_dask.runs.lease import Lease, LeaseHeld

    expired = Lease(lease_at, ttl=0.3).acquire()
    expired._stop.set()
    time.sleep(0.5)

    def take(_):
        try:
            return Lease(lease_at, ttl=30).acquire()
        except LeaseHeld:
            return None

    with ThreadPoolExecutor(8) as pool:
        won = [lease for lease in pool.map(take, range(8)) if lease is not None]
    assert len(won) == 1 and lease_at.read_json()["owner"] == won[0].owner
    won[0].release()
