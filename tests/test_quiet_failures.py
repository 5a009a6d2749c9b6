"""No traceback without -v: a command whose object store goes away in the middle of a run says
what happened in one ``error:`` line and exits 1 (transient); the noise the store's client
leaves at shutdown (zarr's FsspecStore, aiohttp's sessions) is not shown; -v shows it all."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
import zarr
from _faults import Fault, tile
from conftest import S3_SECRET, free_port, wait_port


@pytest.fixture
def s3_server(monkeypatch):
    """A moto S3 server of this test's own, in a process the test may kill, with one bucket;
    AWS_* set for the commands the test starts."""
    import boto3

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                             str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_port(port)
        endpoint = f"http://127.0.0.1:{port}"
        env = {"AWS_ACCESS_KEY_ID": "testing-key-id", "AWS_SECRET_ACCESS_KEY": S3_SECRET,
               "AWS_ENDPOINT_URL": endpoint, "AWS_DEFAULT_REGION": "us-east-1"}
        for k, v in env.items():
            monkeypatch.setenv(k, v)
        monkeypatch.delenv("AWS_PROFILE", raising=False)
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="quiet")
        yield proc
    finally:
        proc.kill()
        proc.wait()


@pytest.fixture
def source(tmp_path):
    rng = np.random.default_rng(0)
    X = np.tanh(rng.normal(size=(96, 2)) @ rng.normal(size=(2, 6)))
    path = str(tmp_path / "in.zarr")
    zarr.open_group(path, mode="w").create_array("X", data=X, chunks=(32, 6))
    return path


def _embed_to_s3(fault: Fault, *verbose: str) -> subprocess.CompletedProcess:
    """``embed ikd`` of the local input into s3://quiet, its tiles in the run store (small
    tiles: several done marks), armed with ``fault``."""
    env = {**os.environ, "DASK_DR_DASK__TILES__MEMORY_BYTES": "0",
           "DASK_DR_DASK__STORAGE__READ_ATTEMPTS": "1"}
    proc = fault.cli(*verbose, "--scheduler", "threads", "embed", "ikd", "-n", "2",
                     "--tile-size", "32", "--tile-cache", "disk", "--input",
                     f"{fault.path.parent}/in.zarr:X", "--out", "s3://quiet/out.zarr",
                     env=env, text=True)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


@pytest.mark.slow
def test_the_store_gone_mid_tile_stage_is_one_line_and_exit_1(s3_server, source, tmp_path):
    """The S3 server is killed as the first tile's done mark is written: the next request is
    refused. Exit 1 (a rerun resumes), one error line naming the store, no traceback, none of
    the FsspecStore's "Exception ignored" lines; with -v the traceback is there to read."""
    fault = Fault(tmp_path / "fault", tile(1), pid=s3_server.pid)
    done = _embed_to_s3(fault)
    assert fault.fired is not None and fault.fired["key"].endswith(".npz")  # mid-stage
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "transient" in errors[0] and "quiet" in errors[0], done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    assert "internal error" not in done.stderr


@pytest.mark.slow
def test_with_v_the_traceback_is_shown(s3_server, source, tmp_path):
    fault = Fault(tmp_path / "fault", tile(1), pid=s3_server.pid)
    done = _embed_to_s3(fault, "-v")
    assert done.returncode == 1, done.stderr
    assert "Traceback" in done.stderr
