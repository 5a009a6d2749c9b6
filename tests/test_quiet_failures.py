"""No traceback without -v: a command whose object store goes away in the middle of a run says
what happened in one ``error:`` line and exits 1 (transient); the noise the store's client
leaves at shutdown (zarr's FsspecStore coroutines) goes to the debug log; -v shows it."""

from __future__ import annotations

import logging
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
    the FsspecStore's "Exception ignored" lines."""
    fault = Fault(tmp_path / "fault", tile(1), pid=s3_server.pid)
    done = _embed_to_s3(fault)
    assert fault.fired is not None and fault.fired["key"].endswith(".npz")  # mid-stage
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "transient" in errors[0] and "quiet" in errors[0], done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert "Exception ignored" not in done.stderr, done.stderr
    assert "internal error" not in done.stderr


def test_what_python_can_only_ignore_goes_to_the_debug_log(monkeypatch, capsys, caplog):
    """Without -v (the hook ``main`` installs then), an exception raised where Python can only
    ignore it reaches the debug log, traceback included, and not the terminal; a hook someone
    else installed is left alone. (Whether the store's coroutines are collected before the
    process exits is the garbage collector's choice: tested here on one that is.)"""
    from dr_dask.cli._app import _unraisable_to_debug, quiet_unraisable

    def other(unraisable: object) -> None:
        pass

    monkeypatch.setattr(sys, "unraisablehook", other)
    quiet_unraisable()
    assert sys.unraisablehook is other
    monkeypatch.setattr(sys, "unraisablehook", sys.__unraisablehook__)
    quiet_unraisable()
    assert sys.unraisablehook is _unraisable_to_debug

    class Leaky:
        def __del__(self) -> None:
            raise ConnectionError("the store went away")

    with caplog.at_level(logging.DEBUG, logger="dr_dask.cli._app"):
        Leaky()  # collected at once: its __del__ raises where nothing can catch it
    assert "the store went away" in caplog.text and "Traceback" in caplog.text
    assert capsys.readouterr().err == ""


#: A task of a store's client whose exception nobody awaits (aiohttp writing a request body to
#: a connection the killed server closed), collected as the process ends: asyncio logs it at
#: ERROR with its traceback.
_NEVER_RETRIEVED = """
import asyncio, logging, sys
logging.basicConfig(level=logging.WARNING)
if sys.argv[1] == "quiet":
    from dr_dask.cli._app import quiet_unraisable
    quiet_unraisable()
async def write_bytes():
    raise ConnectionResetError("Cannot write to closing transport")
async def main():
    asyncio.get_running_loop().create_task(write_bytes())
    await asyncio.sleep(0.05)
    logging.getLogger("asyncio").error("an asyncio error of another kind")
asyncio.run(main())
"""


@pytest.mark.parametrize("mode", ["quiet", "verbose"])
def test_a_task_exception_nobody_awaits_goes_to_the_debug_log(mode):
    """Without -v asyncio's "Task exception was never retrieved" (seen once in a loaded suite
    after the store went away) leaves no traceback on the terminal; asyncio's other errors,
    and with -v that one too, still reach it."""
    done = subprocess.run([sys.executable, "-c", _NEVER_RETRIEVED, mode], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "an asyncio error of another kind" in done.stderr
    never = "Task exception was never retrieved" in done.stderr
    assert never == (mode == "verbose") and ("Traceback" in done.stderr) == never, done.stderr
