"""Object stores: every read and write against a real S3 server (moto, 127.0.0.1)."""

from __future__ import annotations

import gc
import io
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import numpy as np
import pytest
import zarr
from _faults import Fault, RunCreated, Stage, cli
from click.testing import CliRunner
from conftest import S3_SECRET, free_port, wait_port

from dr_dask.cli import main
from dr_dask.io.inputs import InputError, open_dataset
from dr_dask.io.storage import Location, StorageError
from dr_dask.runs.group import open_run

T, N = 240, 12


def _write_input(url: str, X: np.ndarray) -> None:
    g = zarr.open_group(store=Location(url).zarr_store(), mode="w")
    g.create_array("X", data=X, chunks=(80, N), dimension_names=("sample", "feature"))


@pytest.fixture
def data():
    rng = np.random.default_rng(0)
    z = rng.normal(size=(T, 2))
    W = rng.normal(size=(2, N))
    return np.tanh(z @ W) + 0.05 * rng.normal(size=(T, N))


def _embed(args: list[str]) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["--scheduler", "threads", "embed", *args])
    return res.exit_code, res.output


@pytest.mark.parametrize("method", [
    ["ikd", "-n", "2", "--tile-cache", "disk"],
    ["ikd", "-n", "2", "--solver", "geodesic", "--tile-cache", "disk"],
    ["isomap", "-n", "2", "--n-neighbors", "8"],
])
def test_fit_from_s3_to_s3_equals_local(s3_bucket, tmp_path, data, method):
    local_in, s3_in = str(tmp_path / "in.zarr"), f"s3://{s3_bucket}/in.zarr"
    _write_input(local_in, data)
    _write_input(s3_in, data)
    local_out, s3_out = str(tmp_path / "out.zarr"), f"s3://{s3_bucket}/out.zarr"
    code, out = _embed([*method, "--input", f"{local_in}:X", "--out", local_out, "--name", "r"])
    assert code == 0, out
    code, out = _embed([*method, "--input", f"{s3_in}:X", "--out", s3_out, "--name", "r"])
    assert code == 0, out
    a = np.asarray(open_run(local_out, "r")["embedding"][...])
    b = open_run(s3_out, "r")
    assert b.attrs["complete"] and b.metadata.consolidated_metadata is not None
    np.testing.assert_allclose(np.asarray(b["embedding"][...]), a, rtol=1e-6, atol=1e-8)
    # nothing leaked into a local directory named after the URL
    assert not os.path.exists("s3:")


def test_secret_never_written(s3_bucket, data, tmp_path):
    s3_in, out = f"s3://{s3_bucket}/in.zarr", f"s3://{s3_bucket}/out.zarr"
    _write_input(s3_in, data)
    code, output = _embed(["ikd", "-n", "2", "--input", f"{s3_in}:X", "--out", out,
                           "--tile-cache", "disk"])
    assert code == 0
    res = CliRunner().invoke(main, ["--scheduler", "threads", "--storage-option",
                                    "key=testing-key-id", "--storage-option",
                                    f"secret={S3_SECRET}", "evaluate", "--store", out,
                                    "--embedding", open_run_name(out)])
    assert res.exit_code == 0, res.output
    fs = Location(out).fs
    blobs = [fs.cat_file(p) for p in fs.find(f"{s3_bucket}")]
    assert blobs and not any(S3_SECRET.encode() in b for b in blobs)
    assert S3_SECRET not in output + res.output


def open_run_name(out: str) -> str:
    root = zarr.open_group(store=Location(out).zarr_store(read_only=True), mode="r")
    (name,) = [n for n in root.group_keys()]
    return name


def test_missing_chunk_is_an_error_naming_it(s3_bucket, data):
    url = f"s3://{s3_bucket}/in.zarr"
    _write_input(url, data)
    Location(url).child("X", "c", "1", "0").delete()
    with pytest.raises(InputError, match=r"in.zarr:X: chunk c/1/0 is missing"):
        open_dataset(url + ":X")


def test_corrupt_chunk_is_an_error_naming_it(tmp_path, data):
    path = str(tmp_path / "in.zarr")
    _write_input(path, data)
    Location(path).child("X", "c", "2", "0").write_bytes(b"garbage")
    inp = open_dataset(path + ":X")
    with pytest.raises(InputError, match=r"in.zarr:X: chunk c/2/0 cannot be read"):
        inp.data.compute(scheduler="threads")
    res = CliRunner().invoke(main, ["--scheduler", "threads", "embed", "ikd", "-n", "2",
                                    "--input", path + ":X", "--out", str(tmp_path / "o.zarr")])
    assert res.exit_code == 2 and "chunk c/2/0" in res.output
    # nothing is left for rejected input: no run group, not even the store it created
    assert not (tmp_path / "o.zarr").exists()


def test_changed_input_is_a_new_run_or_refused(tmp_path, data):
    path, out = str(tmp_path / "in.zarr"), str(tmp_path / "o.zarr")
    _write_input(path, data[:200])
    args = ["ikd", "-n", "2", "--input", path + ":X", "--out", out]
    assert _embed(args)[0] == 0
    _write_input(path, data)  # rows appended: other content
    code, output = _embed(args)
    assert code == 0
    root = zarr.open_group(out, mode="r", use_consolidated=False)
    assert len(list(root.group_keys())) == 2
    code, output = _embed([*args, "--name", "nightly"])
    _write_input(path, data[:200])
    code, output = _embed([*args, "--name", "nightly"])
    assert code == 2 and "other input" in output
    code, output = _embed([*args, "--name", "nightly", "--overwrite"])
    assert code == 0
    assert open_run(out, "nightly")["embedding"].shape == (200, 2)


class _Unwell:
    """A local HTTP server on 127.0.0.1 that speaks for an S3 endpoint in trouble (moto cannot
    be made to): "slowdown" answers every request 503 SlowDown (throttling), "unavailable" 503
    ServiceUnavailable, "silent" accepts connections and never answers (a timeout). With
    ``recover_after=n`` it answers the first n requests 503, then serves ``body`` to GETs."""

    def __init__(self, mode: str, recover_after: int | None = None, body: bytes = b""):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        state = self
        self.requests = 0

        class Handler(BaseHTTPRequestHandler):
            def _do(self) -> None:
                state.requests += 1
                if mode == "silent":
                    time.sleep(30)
                    return
                if recover_after is not None and state.requests > recover_after:
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(body)))
                    self.send_header("ETag", '"1"')
                    self.end_headers()
                    self.wfile.write(body if self.command == "GET" else b"")
                    return
                code, message = {"slowdown": ("SlowDown", "Please reduce your request rate."),
                                 }.get(mode, ("ServiceUnavailable", "Service is unable to "
                                                                    "handle request."))
                xml = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                       f"<Message>{message}</Message></Error>").encode()
                self.send_response(503)
                self.send_header("Content-Length", str(len(xml)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(xml)

            do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _do

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.server.block_on_close = False  # "silent" handlers sleep: do not wait for them
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


#: Each way an object store fails, and the exit code it must give: 1 transient (the workflow's
#: retries and the CronJob's backoff retry it), 2 bad input or configuration (never retried).
STORE_FAILURES = {"missing bucket": 2, "wrong credentials": 2, "unreachable endpoint": 1,
                  "throttled": 1, "server error": 1, "timeout": 1}


@pytest.mark.parametrize("case", list(STORE_FAILURES))
def test_storage_failures_are_classed_clear_and_fast(s3_bucket, tmp_path, data, monkeypatch,
                                                     dr_config, case):
    import s3fs

    path = str(tmp_path / "in.zarr")
    _write_input(path, data)
    out = f"s3://{s3_bucket}/out.zarr"
    proc = unwell = None
    options: list[str] = []
    if case == "missing bucket":
        out = "s3://no-such-bucket-dr-dask/out.zarr"
    elif case == "unreachable endpoint":  # connection refused: a closed port
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    elif case == "wrong credentials":  # a second S3 server that checks credentials
        port = free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            env={**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"},
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        wait_port(port)
        monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    else:
        unwell = _Unwell({"throttled": "slowdown", "server error": "unavailable",
                          "timeout": "silent"}[case])
        monkeypatch.setenv("AWS_ENDPOINT_URL", unwell.url)
        if case == "timeout":
            options = ["--storage-option",  # short and unretried by botocore: a quick test
                       'config_kwargs={"read_timeout": 1, "retries": {"max_attempts": 1}}']
    # a read retried (the other unwell cases show it) would only wait out more timeouts here;
    # s3fs's own call retries (each after botocore's, which back off up to a second or more)
    # once: the retries are shown by the requests counted, not by their number
    dr_config({"storage.read-backoff": 0.1, "storage.s3-call-retries": 1,
               "storage.read-attempts": 1 if case == "timeout" else 3})
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        res = CliRunner().invoke(main, ["--scheduler", "threads", *options, "embed", "ikd",
                                        "-n", "2", "--input", path + ":X", "--out", out])
    finally:
        if proc is not None:
            proc.kill()
            proc.wait()
        if unwell is not None:
            unwell.close()
    assert res.exit_code == STORE_FAILURES[case], res.output
    assert "Traceback" not in res.output and "out.zarr" in res.output
    if STORE_FAILURES[case] == 1:
        assert "transient: retry later" in res.output
    assert S3_SECRET not in res.output
    if unwell is not None and case != "timeout":
        assert unwell.requests > 1  # retried before giving up


def test_idempotent_reads_are_retried_with_backoff(monkeypatch, caplog, dr_config):
    """A store that answers 503 three times, then recovers: a read succeeds (the client's own
    retries alone would have given up), a backoff later; with no recovery it is a bounded
    number of attempts, then StorageUnavailable."""
    import s3fs

    from dr_dask.io import storage
    from dr_dask.runtime import config
    # s3fs's own call retries once, as below: botocore's attempts then the storage layer's
    dr_config({"storage.read-backoff": 0.2, "storage.s3-call-retries": 1})
    for key, value in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": S3_SECRET,
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    flaky = _Unwell("unavailable", recover_after=3, body=b'{"watermark": 700}')
    try:
        s3fs.S3FileSystem.clear_instance_cache()
        loc = Location("s3://lake/state/checkpoint.json", {"endpoint_url": flaky.url})
        t0 = time.perf_counter()
        assert loc.read_json() == {"watermark": 700}
        # the client gave up once (its own attempts), the storage layer read again after 0.2 s
        retries = [r for r in caplog.records if "reading again in 0.2s" in r.getMessage()]
        assert len(retries) == 1 and flaky.requests > 3 and time.perf_counter() - t0 >= 0.2
    finally:
        flaky.close()
    down = _Unwell("unavailable")
    try:
        s3fs.S3FileSystem.clear_instance_cache()
        loc = Location("s3://lake/state/checkpoint.json", {"endpoint_url": down.url})
        with pytest.raises(storage.StorageUnavailable, match="transient"):
            loc.read_json()
        assert 1 < down.requests <= 3 * config.get("storage.read-attempts")
    finally:
        down.close()


def test_missing_object_and_bad_data_are_bad_input(s3_bucket):
    with pytest.raises(InputError, match="does not exist"):
        open_dataset(f"s3://{s3_bucket}/nothing-here.zarr:X")
    Location(f"s3://{s3_bucket}/junk.zarr/zarr.json").write_bytes(b"not json")
    with pytest.raises(InputError, match="not a readable Zarr store"):
        open_dataset(f"s3://{s3_bucket}/junk.zarr")


def test_unreachable_store_while_opening_an_input_is_transient(monkeypatch, dr_config):
    import s3fs

    from dr_dask.io import storage

    dr_config({"storage.read-backoff": 0.1, "storage.s3-call-retries": 1})
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    for key, value in {"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": S3_SECRET,
                       "AWS_DEFAULT_REGION": "us-east-1"}.items():
        monkeypatch.setenv(key, value)
    s3fs.S3FileSystem.clear_instance_cache()
    with pytest.raises(storage.StorageUnavailable, match="transient"):
        open_dataset("s3://lake/in.zarr:X")


def test_unknown_scheme_names_the_package():
    with pytest.raises(StorageError, match="install gcsfs"):
        Location("gs://bucket/x.zarr").exists()


def test_npy_and_reports_on_s3(s3_bucket, data):
    url = f"s3://{s3_bucket}/x.npy"
    with Location(url).open("wb") as fh:
        np.save(fh, data)
    inp = open_dataset(url)
    np.testing.assert_array_equal(inp.data.compute(scheduler="threads"), data)
    assert inp.identity["path"] == url and inp.identity["fingerprint"]


def test_datasets_make_to_s3_and_interrupted_store_is_redone(s3_bucket):
    import xarray as xr

    url = f"s3://{s3_bucket}/gen.zarr"
    res = CliRunner().invoke(main, ["datasets", "make", "gp", "--out", url, "-T", "150",
                                    "-N", "8", "--chunk-size", "50"])
    assert res.exit_code == 0, res.output
    assert not os.path.exists("s3:")
    ds = xr.open_zarr(url, storage_options={"endpoint_url": os.environ["AWS_ENDPOINT_URL"]})
    assert ds.attrs["complete"] and ds.X.shape == (150, 8)
    # a killed `make` leaves a store marked incomplete: refused as input, redone by --if-missing
    meta = Location(url).child("zarr.json")
    doc = meta.read_json()
    doc["attributes"]["complete"] = False
    meta.write_json(doc)
    with pytest.raises(InputError, match="incomplete dataset"):
        open_dataset(url + ":X")
    res = CliRunner().invoke(main, ["datasets", "make", "gp", "--out", url, "-T", "150",
                                    "-N", "8", "--if-missing"])
    assert res.exit_code == 0 and "nothing to do" not in res.output
    assert open_dataset(url + ":X").data.shape == (150, 8)
    res = CliRunner().invoke(main, ["datasets", "make", "gp", "--out", url, "-T", "150",
                                    "-N", "8"])
    assert res.exit_code == 2 and "overwrite" in res.output


_KILL_ARGS = ["--scheduler", "threads", "embed", "ikd", "-n", "2", "--tile-cache", "disk",
              "--tile-size", "96", "--name", "r"]


@pytest.fixture(scope="module")
def kill_input(tmp_path_factory):
    """480 rows (5 row blocks, 15 tiles) and their uninterrupted local embedding."""
    rng = np.random.default_rng(1)
    z = rng.normal(size=(2 * T, 2))
    X = np.tanh(z @ rng.normal(size=(2, N))) + 0.05 * rng.normal(size=(2 * T, N))
    tmp = tmp_path_factory.mktemp("kill")
    local_in = str(tmp / "in.zarr")
    _write_input(local_in, X)
    proc = cli(*_KILL_ARGS, "--input", f"{local_in}:X", "--out", str(tmp / "o.zarr"))
    assert proc.wait(timeout=300) == 0
    return X, np.asarray(open_run(str(tmp / "o.zarr"), "r")["embedding"][...])


@pytest.mark.slow
@pytest.mark.parametrize("moment", ["early", "late"])  # 25 s each: the two ends of the run
def test_s3_run_killed_and_rerun_equals_local(s3_bucket, kill_input, moment, tmp_path):
    """Killed by its own write of the run group (early) or of the distance stage's mark
    (late); the rerun reuses the finished stage and equals the uninterrupted local run."""
    X, expected = kill_input
    s3_in = f"s3://{s3_bucket}/in.zarr"
    _write_input(s3_in, X)
    out = f"s3://{s3_bucket}/out.zarr"
    fault = Fault(tmp_path / "fault", RunCreated() if moment == "early" else Stage("distance"))
    proc = fault.cli(*_KILL_ARGS, "--input", f"{s3_in}:X", "--out", out)
    assert proc.wait(timeout=300) == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert fault.fired is not None
    run = Location(out).child("r")
    attrs = run.child("zarr.json").read_json()["attributes"]
    assert not attrs.get("complete")
    stages = attrs.get("stages", {})
    assert set(stages) == (set() if moment == "early" else {"distance"})
    rerun = cli(*_KILL_ARGS, "--input", f"{s3_in}:X", "--out", out)
    assert rerun.wait(timeout=300) == 0, rerun.stderr.read().decode()
    done = run.child("zarr.json").read_json()["attributes"]["stages"]
    assert set(done) == {"distance", "eigen"}
    assert {k: done[k] for k in stages} == stages, "a finished stage was redone"
    np.testing.assert_allclose(np.asarray(open_run(out, "r")["embedding"][...]), expected,
                               rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("where", ["local", "s3"])
def test_lease_one_job_at_a_time_and_expiry(s3_bucket, tmp_path, where):
    """Create-if-absent on local disk (O_EXCL) and on S3: moto honours the conditional PUT
    (If-None-Match: * -> 412), so the S3 case exercises the real precondition."""
    from dr_dask.runs.lease import Lease, LeaseHeld

    loc = (Location(str(tmp_path / "runs.zarr")) if where == "local"
           else Location(f"s3://{s3_bucket}/runs.zarr")).child("r", "lease.json")
    first = Lease(loc, ttl=30).acquire()
    with pytest.raises(LeaseHeld, match=r"holds .*lease.json until"):
        Lease(loc, ttl=30).acquire()
    first.release()  # marked expired, its token kept: the next run takes it at once
    assert loc.read_json()["expires"] == 0
    second = Lease(loc, ttl=30).acquire()
    assert second.token == first.token + 1
    second.release()
    killed = Lease(loc, ttl=0.5).acquire()
    killed._stop.set()  # the process dies: no renewal, no release
    time.sleep(0.8)
    taker = Lease(loc, ttl=30).acquire()  # expired: taken over
    assert loc.read_json()["owner"] == taker.owner
    taker.release()


def test_second_run_of_a_job_exits_1_while_the_first_holds_the_lease(tmp_path, data):
    path, out = str(tmp_path / "in.zarr"), str(tmp_path / "o.zarr")
    _write_input(path, data)
    from dr_dask.runs.lease import Lease

    holder = Lease(Location(out).child("r", "lease.json"), ttl=30).acquire()
    try:
        code, output = _embed(["ikd", "-n", "2", "--input", path + ":X", "--out", out,
                               "--name", "r"])
    finally:
        holder.release()
    assert code == 1 and "retry later" in output and "Traceback" not in output
    assert not open_run(out, "r").attrs["stages"]  # the second run did no work
    assert _embed(["ikd", "-n", "2", "--input", path + ":X", "--out", out, "--name", "r"])[0] == 0


def test_lease_of_a_dead_process_on_this_host_is_taken_at_once(tmp_path):
    import socket

    from dr_dask.runs.lease import Lease

    loc = Location(str(tmp_path / "lease.json"))
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    loc.write_json({"owner": f"{socket.gethostname()}:{proc.pid}:x", "expires": time.time() + 60})
    Lease(loc, ttl=30).acquire().release()


# ----------------------------------------------------------------- worker-written temporaries
def _s3_options(moto_endpoint: str) -> dict:
    """Explicit options: the session's cluster workers started before AWS_* were set."""
    return {"key": "testing-key-id", "secret": S3_SECRET, "endpoint_url": moto_endpoint}


def _spy_rows_out(monkeypatch) -> list:
    """Where each GeodesicRows.compute call was told to write (the real call still runs)."""
    import dr_dask.methods._ikd_geodesic as geo

    seen, real = [], geo.GeodesicRows.compute

    def compute(graph, sources=None, **kw):
        rows = real(graph, sources, **kw)
        if kw.get("out") is not None:
            loc = kw["out"]
            seen.append((loc.url, loc.exists(), rows.store.fill_value))
        return rows

    monkeypatch.setattr(geo.GeodesicRows, "compute", staticmethod(compute))
    return seen


@pytest.mark.cluster
def test_landmark_ikd_rows_in_the_run_store_from_s3_equal_local(
        s3_bucket, moto_endpoint, tmp_path, data, cluster_client, monkeypatch):
    """The L x T rows the workers write live in the run's S3 store (every worker reaches it,
    unlike the client's /tmp), are dropped after the stage, and the fit equals the local one."""
    from dr_dask.methods.ikd import IKD
    from dr_dask.runs.group import run_embedding

    opts = _s3_options(moto_endpoint)
    local_in, s3_in = str(tmp_path / "in.zarr"), f"s3://{s3_bucket}/in.zarr"
    _write_input(local_in, data)
    _write_input(s3_in, data)
    kw = {"solver": "geodesic", "n_neighbors": 8, "n_landmarks": 40, "tile_cache": "disk",
          "random_state": 0, "client": cluster_client}
    seen = _spy_rows_out(monkeypatch)
    local = run_embedding(IKD(n_components=2, **kw), local_in + ":X", str(tmp_path / "o.zarr"),
                          method="ikd", name="r")
    out = f"s3://{s3_bucket}/out.zarr"
    remote = run_embedding(IKD(n_components=2, **kw), s3_in + ":X", out, method="ikd", name="r",
                           storage_options=opts)
    assert seen[-1][0] == f"{out}/r/landmark_geodesics" and seen[-1][1]
    assert np.isnan(seen[-1][2])  # a chunk never written reads as NaN: detected
    # kept in the run (a cache of it) for the out-of-sample map, which reads it there
    assert "landmark_geodesics" in remote.group
    np.testing.assert_allclose(remote.read("embedding"), local.read("embedding"),
                               rtol=1e-6, atol=1e-8)


def test_scratch_location_without_a_run_is_used_and_emptied(s3_bucket, data, monkeypatch):
    from dr_dask.methods.ikd import IKD

    seen = _spy_rows_out(monkeypatch)
    scratch = f"s3://{s3_bucket}/scratch"
    kw = {"solver": "geodesic", "n_neighbors": 8, "n_landmarks": 40, "random_state": 0}
    on_s3 = IKD(n_components=2, tile_cache="disk", scratch=scratch, **kw).fit(data)
    assert seen[-1][0].startswith(scratch + "/dr_dask_landmark_geodesics_") and seen[-1][1]
    # the rows stay there for transform while the estimator lives, then go with it
    kept = on_s3.transform(data[:5])
    assert Location(scratch).find() != {}
    embedding = on_s3.embedding_
    del on_s3
    gc.collect()
    assert Location(scratch).find() == {}
    # a remote input without run or scratch: next to the input, in the input's bucket
    _write_input(f"s3://{s3_bucket}/in.zarr", data)
    IKD(n_components=2, tile_cache="disk", **kw).fit(open_dataset(f"s3://{s3_bucket}/in.zarr:X"))
    assert seen[-1][0].startswith(f"s3://{s3_bucket}/dr_dask_landmark_geodesics_")
    gc.collect()
    assert Location(f"s3://{s3_bucket}").listdir() == ["in.zarr"]
    in_memory = IKD(n_components=2, tile_cache="memory", **kw).fit(data)
    np.testing.assert_allclose(embedding, in_memory.embedding_, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(kept, in_memory.transform(data[:5]), rtol=1e-6, atol=1e-8)


def test_worker_written_chunk_missing_is_an_error(s3_bucket):
    """A chunk that never reached the store (a worker wrote to its own disk) raises, never
    reads as a fill value."""
    import scipy.sparse as sp

    from dr_dask.graph import GeodesicRows

    n = 50
    path = sp.diags([np.ones(n - 1)], [1], shape=(n, n)).tocsr()
    out = Location(f"s3://{s3_bucket}/rows")
    rows = GeodesicRows.compute(path + path.T, np.arange(8), block_size=4, out=out)
    np.testing.assert_array_equal(rows.gather()[:, 0], np.arange(8))
    out.child("c", "1", "0").delete()
    with pytest.raises(RuntimeError, match="chunks missing from the store"):
        rows.gather()


def test_geodesic_store_url_gets_the_storage_options(s3_bucket, moto_endpoint, tmp_path, data,
                                                     monkeypatch):
    """`--geodesic-store s3://…` is opened with the run's --storage-option values (here the
    endpoint exists only as an option) and equals a local geodesic store."""
    args = ["isomap", "-n", "2", "--n-neighbors", "8", "--landmarks", "30", "--name", "r"]
    local_in = str(tmp_path / "in.zarr")
    _write_input(local_in, data)
    code, out = _embed([*args, "--input", f"{local_in}:X", "--out", str(tmp_path / "o.zarr"),
                        "--geodesic-store", str(tmp_path / "g.zarr")])
    assert code == 0, out
    s3_in, store = f"s3://{s3_bucket}/in.zarr", f"s3://{s3_bucket}/geodesics.zarr"
    _write_input(s3_in, data)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    res = CliRunner().invoke(main, [
        "--scheduler", "threads", "--storage-option", f"endpoint_url={moto_endpoint}", "embed",
        *args, "--input", f"{s3_in}:X", "--out", f"s3://{s3_bucket}/o.zarr",
        "--geodesic-store", store])
    assert res.exit_code == 0, res.output
    opts = {"endpoint_url": moto_endpoint}
    rows = zarr.open_array(store=Location(store, opts).zarr_store(read_only=True), mode="r")
    np.testing.assert_allclose(rows[...], zarr.open_array(str(tmp_path / "g.zarr"))[...])
    assert rows.shape == (30, T)
    np.testing.assert_allclose(
        open_run(f"s3://{s3_bucket}/o.zarr", "r", storage_options=opts)["embedding"][...],
        open_run(str(tmp_path / "o.zarr"), "r")["embedding"][...], rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("kind", ["npy-dir", "zarr"])
def test_make_scenario_to_s3_equals_local(s3_bucket, tmp_path, kind):
    """`stream make-scenario s3://…` writes the batch, truths and stream source through the
    storage layer (not into a local ./s3: directory); they read back equal to a local write and
    the stream source opens from the URL."""
    from dr_dask.stream.sources import open_source

    args = ["stream", "make-scenario", "--scenario", "drift", "--n-batch", "60",
            "--n-stream", "90", "--kind", kind, "--chunk-size", "40"]
    url, local = f"s3://{s3_bucket}/sc", str(tmp_path / "sc")
    for out in (local, url):
        res = CliRunner().invoke(main, [*args, out])
        assert res.exit_code == 0, res.output
    meta = json.loads(Location(url).child("meta.json").read_bytes())
    assert meta["source"].startswith(url + "/stream") and meta["n_stream"] == 90
    for name in ("batch", "batch_truth", "stream_truth", "stream_labels"):
        got = np.load(io.BytesIO(Location(url).child(f"{name}.npy").read_bytes()))
        np.testing.assert_array_equal(got, np.load(os.path.join(local, f"{name}.npy")))
    source, rows = open_source(meta["source"], chunk_size=40), []
    offset = source.initial_offset
    while (chunk := source.read(offset)) is not None:
        rows.append(chunk.data)
        offset = chunk.offset
    assert np.vstack(rows).shape == (90, 3)
    assert not os.path.exists("s3:")


def test_quickstart_out_on_s3(s3_bucket, moto_endpoint, monkeypatch):
    """`dr-dask quickstart --out s3://…` (endpoint given as a --storage-option) puts the data,
    the run, the metrics and the plot in the bucket."""
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    out = f"s3://{s3_bucket}/qs"
    res = CliRunner().invoke(main, ["--scheduler", "threads", "--storage-option",
                                    f"endpoint_url={moto_endpoint}", "quickstart", "--out", out,
                                    "-T", "120", "-N", "40", "--no-warm"])
    assert res.exit_code == 0, res.output
    loc = Location(out, {"endpoint_url": moto_endpoint})
    assert {"data.zarr", "runs.zarr", "metrics.json", "embedding.png"} <= set(loc.listdir())
    metrics = json.loads(loc.child("metrics.json").read_bytes())
    assert metrics["ikd"]["run"].startswith(out + "/runs.zarr/") and metrics["ikd"]["r2"] > 0.5
    assert loc.child("embedding.png").read_bytes().startswith(b"\x89PNG")
    assert not os.path.exists("s3:")


def test_workflow_file_read_from_s3(s3_bucket, moto_endpoint, monkeypatch):
    wf = Location(f"s3://{s3_bucket}/jobs/nightly.toml")
    wf.write_bytes(b'[job]\nname = "from-s3"\n\n[[steps]]\nargs = ["datasets", "make", "gp", '
                   b'"--out", "s3://bucket/d.zarr", "-T", "100"]\n')
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    res = CliRunner().invoke(main, ["--storage-option", f"endpoint_url={moto_endpoint}", "run",
                                    wf.url, "--check"])
    assert res.exit_code == 0 and "workflow 'from-s3': 1 steps" in res.output, res.output
    res = CliRunner().invoke(main, ["--storage-option", f"endpoint_url={moto_endpoint}", "run",
                                    f"s3://{s3_bucket}/jobs/absent.toml", "--check"])
    assert res.exit_code == 2 and "cannot read" in res.output and "Traceback" not in res.output


# ------------------------------------------------------------------ no secrets in the graph
def _graph_scan(secret: str, bucket: str, dask_scheduler: Any = None) -> dict:
    """What the scheduler holds now: tasks, and which of them show the secret or the bucket."""
    from distributed.protocol.pickle import dumps

    found = {"tasks": 0, "leaks": [], "bucket": 0, "bucket_to_run": 0, "keys": []}
    for key, ts in list(dask_scheduler.tasks.items()):
        text = f"{key!r} {ts.run_spec!r} {ts!r}"
        try:
            blob = dumps(ts.run_spec)
        except Exception as exc:  # noqa: BLE001  (reported, so the scan cannot pass silently)
            blob = repr(exc).encode()
        found["tasks"] += 1
        found["keys"].append(str(key))
        if secret in text or secret.encode() in blob:
            found["leaks"].append(str(key))
        found["bucket"] += bucket.encode() in blob
        found["bucket_to_run"] += (bucket.encode() in blob and ts.state in
                                   ("waiting", "queued", "processing", "no-worker"))
    plugins = dumps(dict(dask_scheduler.worker_plugins))
    found["in_plugins"] = secret.encode() in plugins
    return found


@pytest.mark.cluster
def test_credentials_never_travel_in_the_task_graph(moto_endpoint, data, monkeypatch):
    """`--storage-option key=… secret=…` on a multi-process cluster whose workers have no
    credentials of their own: while the S3 run is in flight the secret is in no task's
    run_spec (pickled or printed), no task key and no dashboard page; it reaches the workers
    once, in the worker plugin the scheduler keeps (the channel TLS protects)."""
    import importlib.util
    import threading
    import urllib.error
    import urllib.parse
    import urllib.request
    import uuid

    import boto3
    import s3fs
    from distributed import Client, LocalCluster

    from dr_dask.methods.ikd import IKD
    from dr_dask.methods.landmark_isomap import LandmarkIsomap

    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_PROFILE",
                "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    s3fs.S3FileSystem.clear_instance_cache()
    opts = _s3_options(moto_endpoint)
    bucket = f"b-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id=opts["key"],
                 aws_secret_access_key=S3_SECRET).create_bucket(Bucket=bucket)
    s3_in, out = f"s3://{bucket}/in.zarr", f"s3://{bucket}/out.zarr"
    g = zarr.open_group(store=Location(s3_in, opts).zarr_store(), mode="w")
    g.create_array("X", data=data, chunks=(40, N), dimension_names=("sample", "feature"))
    bokeh = importlib.util.find_spec("bokeh") is not None
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, memory_limit="2GB",
                      dashboard_address="127.0.0.1:0" if bokeh else None) as cluster, \
            Client(cluster, set_as_default=False) as observer:
        result = {}

        def run():
            result["res"] = CliRunner().invoke(main, [
                "--scheduler", cluster.scheduler_address, "--storage-option", "key=testing-key-id",
                "--storage-option", f"secret={S3_SECRET}", "--storage-option",
                f"endpoint_url={moto_endpoint}", "embed", "ikd", "-n", "2", "--tile-cache",
                "disk", "--tile-size", "80", "--input", f"{s3_in}:X", "--out", out,
                "--name", "r"])

        th = threading.Thread(target=run)
        th.start()
        scans, pages, fetched = [], [], 0.0
        while th.is_alive():
            scan = observer.run_on_scheduler(_graph_scan, S3_SECRET, bucket)
            scans.append(scan)
            if bokeh and scan["keys"] and time.time() - fetched > 1:
                fetched = time.time()
                base = cluster.dashboard_link.rsplit("/", 1)[0]
                for path in ("/info/main/workers.html", "/json/counts.json",
                             *(f"/info/task/{urllib.parse.quote(k, safe='')}.html"
                               for k in scan["keys"][:3])):
                    try:
                        with urllib.request.urlopen(base + path, timeout=30) as resp:
                            pages.append((path, resp.read()))
                    except urllib.error.HTTPError as exc:
                        pages.append((path, exc.read()))
            time.sleep(0.05)
        th.join()
        after = observer.run_on_scheduler(_graph_scan, S3_SECRET, bucket)
        # the Python API on the same workers: an estimator's stored input, and a store given
        # as its parameter, bring them their credentials as the CLI's runs do (they failed
        # on "Unable to locate credentials")
        fitted = IKD(n_components=2, tile_size=80, client=observer).fit(
            open_dataset(Location(s3_in, opts), "X")).embedding_
        landmark = dict(n_neighbors=8, n_landmarks=30, knn="ivf", random_state=0)
        scratch_opts = {**opts, "key": "scratch-key-id"}  # a credential set of its own
        on_s3 = LandmarkIsomap(**landmark, client=observer,
                               scratch=Location(f"s3://{bucket}/scratch", scratch_opts)).fit(data)
    assert on_s3.graph_ is None  # the graph was built and kept on S3 by the workers
    np.testing.assert_allclose(on_s3.embedding_, LandmarkIsomap(**landmark).fit(data).embedding_,
                               atol=1e-8)
    res = result["res"]
    assert res.exit_code == 0, res.output
    cli_embedding = open_run(out, "r", storage_options=opts)["embedding"]
    assert cli_embedding.shape == (T, 2)
    np.testing.assert_allclose(fitted, cli_embedding, atol=1e-6)  # to the eigensolver's tol
    assert sum(s["tasks"] for s in scans) > 0, "no task was ever seen in flight"
    assert sum(s["bucket"] for s in scans) > 0  # Locations of the bucket were in the graph
    assert not [k for s in scans for k in s["leaks"]]
    # where it does travel: the plugin, registered before the first task reading the bucket
    # is submitted and withdrawn only when none is left to run (finished tasks the client
    # has not released yet may outlive it) ...
    assert any(s["bucket_to_run"] for s in scans), "no task reading the bucket seen to run"
    assert all(s["in_plugins"] for s in scans if s["bucket_to_run"])
    assert not after["in_plugins"]  # ... and withdrawn from the scheduler once the run ends
    if bokeh:
        assert any(p == "/info/main/workers.html" and b"<html" in body.lower()
                   for p, body in pages)
        assert not [p for p, body in pages if S3_SECRET.encode() in body]
    else:
        pytest.skip("bokeh is not installed: the dashboard pages were not checked")


def test_pickled_location_carries_a_reference_not_the_credentials():
    import pickle

    from dr_dask.runtime import credentials

    opts = {"key": "testing-key-id", "secret": S3_SECRET, "endpoint_url": "http://127.0.0.1:9",
            "client_kwargs": {"aws_session_token": S3_SECRET + "-token"}}
    loc = Location("s3://bucket/x.zarr", opts).child("X")
    blob = pickle.dumps(loc)
    assert S3_SECRET.encode() not in blob and b"http://127.0.0.1:9" in blob
    back = pickle.loads(blob)  # in this process (the client) the reference resolves
    assert back.storage_options == opts and back == loc
    # a process the credentials never reached (the scheduler) passes the reference on intact
    state = back.__getstate__()
    saved = credentials._REGISTRY.pop(state["credentials"])
    try:
        relay = pickle.loads(pickle.dumps(back))
        assert "secret" not in relay.storage_options
        assert pickle.loads(pickle.dumps(relay.child("c"))).__getstate__()["credentials"] == \
            state["credentials"]
    finally:
        credentials._REGISTRY[state["credentials"]] = saved


def test_unknown_storage_option_is_a_user_error(s3_bucket, data):
    _write_input(f"s3://{s3_bucket}/in.zarr", data)
    res = CliRunner().invoke(main, ["--scheduler", "threads", "--storage-option", "bogus=1",
                                    "embed", "ikd", "-n", "2", "--input",
                                    f"s3://{s3_bucket}/in.zarr:X", "--out",
                                    f"s3://{s3_bucket}/out.zarr"])
    assert res.exit_code == 2, res.output
    assert "not an option of any installed filesystem" in res.output and "'bogus'" in res.output
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1


def test_an_unreachable_tile_store_keeps_its_finished_tiles(s3_bucket, moto_endpoint, dr_config):
    """Resuming a stage whose tile store does not answer (503s) is transient, exit 1: the tile
    array and its done marks stay for the retry, which reopens them."""
    import s3fs

    from dr_dask.io import storage
    from dr_dask.linalg.tiles import TileGrid, open_tile_store, write_tile

    dr_config({"storage.read-backoff": 0.1, "storage.read-attempts": 2})
    grid = TileGrid.regular(8, 4)
    url = f"s3://{s3_bucket}/run.zarr/tiles"
    here = Location(url)
    assert open_tile_store(here, grid, np.float32) == {}
    write_tile(here, grid, (0, 1), np.ones((4, 4), np.float32), (np.arange(4.0),))
    down = _Unwell("unavailable")
    try:
        s3fs.S3FileSystem.clear_instance_cache()
        with pytest.raises(storage.StorageUnavailable, match="transient"):
            open_tile_store(Location(url, {"endpoint_url": down.url}), grid, np.float32)
    finally:
        down.close()
    s3fs.S3FileSystem.clear_instance_cache()
    (kept,) = open_tile_store(here, grid, np.float32).values()
    np.testing.assert_array_equal(kept[0], np.arange(4.0))
