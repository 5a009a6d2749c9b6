"""Credentials given as storage options live as long as the run: after ``dr-dask job incremental``
against S3 (moto) on a real multi-process cluster, neither the scheduler (whose worker-plugin
registry any later client can read) nor the workers hold them, also after a failed run; and
no log line carries them at any verbosity (botocore's request signing included)."""

from __future__ import annotations

import contextlib
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import zarr
from click.testing import CliRunner

from dr_dask.cli import main
from dr_dask.datasets.swiss_roll import shift_scenario
from dr_dask.io.storage import Location

KEY_ID, SECRET = "AKIAOPTIONKEY00017", "opt-secret-4d1f0c2a9b8e7d6c5b4a"


def _scheduler_holds(client) -> list[str]:
    """What the scheduler keeps for workers that join later, where our secret shows."""

    def plugins(dask_scheduler):
        return {name: pickle.dumps(p) for name, p in dask_scheduler.worker_plugins.items()}

    return [name for name, blob in client.run_on_scheduler(plugins).items()
            if name.startswith("dr_dask-credentials") or SECRET.encode() in blob
            or KEY_ID.encode() in blob]


def _workers_hold(client) -> list:
    def registry():
        from dr_dask.runtime import credentials

        return [v for s in credentials._REGISTRY.values() for v in s.values()]

    return [v for got in client.run(registry).values() for v in got if v in (KEY_ID, SECRET)]


def _args(address: str, src: str, state: str) -> list[str]:
    return ["--scheduler", address, "--storage-option", f"key={KEY_ID}", "--storage-option",
            f"secret={SECRET}", "--storage-option",
            f"endpoint_url={os.environ['AWS_ENDPOINT_URL']}", "job", "incremental", f"{src}:X",
            "--state", state, "--n-batch", "120", "--chunk-size", "60", "--no-report"]


def _job(address: str, src: str, state: str, *extra: str) -> subprocess.CompletedProcess:
    """The command in its own process: its whole stderr, every logger's output included."""
    env = dict(os.environ, PYTHONPATH=os.getcwd(), OPENBLAS_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "dr_dask.cli", *extra,
                           *_args(address, src, state)],
                          env=env, capture_output=True, text=True, timeout=600)


@pytest.mark.cluster
def test_credentials_leave_the_scheduler_and_never_reach_a_log(s3_bucket, cluster_client):
    # the session's cluster: the other tests' runs on it must have withdrawn theirs too
    sc = shift_scenario(40, random_state=1)
    X = np.vstack([sc.batch, sc.stream])[:180]  # the first fit's 120 rows and one chunk
    src, state = f"s3://{s3_bucket}/land.zarr", f"s3://{s3_bucket}/state"
    g = zarr.open_group(store=Location(src).zarr_store(), mode="w")
    g.create_array("X", data=X, chunks=(60, 3))
    with contextlib.nullcontext(cluster_client) as client:
        address = client.scheduler.address
        done = _job(address, src, state, "-vvv")
        assert done.returncode == 0, done.stderr[-3000:]
        log = done.stderr
        # the most verbose log, the SDK's request signing included, and nothing of ours in it
        assert "botocore" in log and "[redacted]" in log, log[-2000:]
        assert KEY_ID not in log and SECRET not in log
        assert os.environ["AWS_SECRET_ACCESS_KEY"] not in log
        # a later client reads nothing from the scheduler or the workers
        assert _scheduler_holds(client) == [] and _workers_hold(client) == []
        # a failed run (its state follows another source: exit 2) withdraws them too
        Location(state).child("job.json").write_json({"source": "s3://elsewhere/X"})
        failed = CliRunner().invoke(main, _args(address, src, state))
        assert failed.exit_code == 2, failed.output
        assert _scheduler_holds(client) == [] and _workers_hold(client) == []
