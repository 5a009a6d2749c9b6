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

import _spawn
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
    return _spawn.run([sys.executable, "-m", "dr_dask.cli", *extra,
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


_DELIVERING_CLIENT = """
import sys
from distributed import Client
from dr_dask.runtime import credential_delivery

client = Client(sys.argv[1])
credential_delivery.deliver_credentials(client, {"key": sys.argv[2], "secret": sys.argv[3]})
print("delivered", flush=True)
sys.stdin.read()  # held open until the test kills or stops it
"""


def _held_anywhere(client) -> list[str]:
    """Where the secret still is: the scheduler's plugin registry, a worker's credentials
    registry or a worker's plugins (each plugin object pickled whole)."""

    def on_workers(dask_worker):
        from dr_dask.runtime import credentials
        from dr_dask.runtime.credential_delivery import CredentialsPlugin

        return (any(SECRET in v for s in credentials._REGISTRY.values() for v in s.values())
                or any(isinstance(p, CredentialsPlugin) and SECRET.encode() in pickle.dumps(p)
                       for p in dask_worker.plugins.values()))

    return _scheduler_holds(client) + [w for w, held in client.run(on_workers).items() if held]


@pytest.mark.cluster
@pytest.mark.parametrize("signum", ["SIGKILL", "SIGSTOP"])
def test_no_secret_outlives_a_client_killed_or_hung(cluster_client, signum):
    """A client that delivered credentials, then was SIGKILLed (the scheduler sees it leave)
    or SIGSTOPped (connected but silent: it renews nothing): within the credentials' lifetime
    neither the scheduler nor any worker holds them; while it lived they outlived the lifetime
    (renewed)."""
    import signal
    import time

    lifetime = 2.0
    env = dict(os.environ, PYTHONPATH=os.getcwd(),
               DASK_DR_DASK__CREDENTIALS__LIFETIME=f"{lifetime}s")
    proc = _spawn.Popen([sys.executable, "-c", _DELIVERING_CLIENT,
                         cluster_client.scheduler.address, KEY_ID, SECRET],
                        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "delivered\n"
        held = _held_anywhere(cluster_client)
        assert len(held) == 3, held  # the scheduler's copy and both workers'
        time.sleep(2 * lifetime)  # renewed by the live client past its lifetime
        assert len(_held_anywhere(cluster_client)) == 3
        proc.send_signal(getattr(signal, signum))
        stopped = time.monotonic()
        while _held_anywhere(cluster_client) and time.monotonic() - stopped < 3 * lifetime:
            time.sleep(0.1)
        gone_after = time.monotonic() - stopped
        assert _held_anywhere(cluster_client) == []
        # a hung client is seen only by its lifetime; the scheduler's check runs every 0.25 s
        assert gone_after <= (1.0 if signum == "SIGKILL" else lifetime + 1.0), gone_after
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.cluster
def test_a_worker_forgets_credentials_the_scheduler_does_not_hold(cluster_client):
    """A worker's copy lives only while the scheduler vouches for it: credentials that no
    client claimed on the scheduler (as if their removal never reached this worker) are
    forgotten by every worker within their lifetime, though the scheduler still lists the
    plugin."""
    import time

    from dr_dask.runtime.credential_delivery import CredentialsLifetime, CredentialsPlugin

    lifetime, ref = 1.0, "dr_dask-credentials-unclaimed"
    cluster_client.register_plugin(CredentialsLifetime())
    cluster_client.register_plugin(CredentialsPlugin({ref: {"secret": SECRET}}, lifetime),
                                   name=ref)
    try:
        registered = time.monotonic()
        while _held_anywhere(cluster_client) != [ref] and time.monotonic() - registered < 5:
            time.sleep(0.1)
        assert _held_anywhere(cluster_client) == [ref]  # the scheduler's copy only
        assert time.monotonic() - registered <= lifetime + 1.0
    finally:
        cluster_client.unregister_worker_plugin(ref)


@pytest.mark.cluster
def test_a_claim_whose_registration_is_still_on_its_way_is_kept(cluster_client):
    """A client claims its set on the scheduler, then registers the plugin (a second
    message): the scheduler's check, which runs every 0.25 s, must not take a claim whose
    plugin has not arrived yet for a withdrawn one, or every worker forgets the credentials
    the run is about to need (under load that window is wide)."""
    import time

    from dr_dask.runtime.credential_delivery import (
        CredentialsLifetime,
        CredentialsPlugin,
        _renew_on_scheduler,
    )

    lifetime, ref = 2.0, "dr_dask-credentials-claimed-early"
    cluster_client.register_plugin(CredentialsLifetime())
    cluster_client.run_on_scheduler(_renew_on_scheduler, [ref], str(cluster_client.id), 60.0)
    time.sleep(0.6)  # the scheduler's check runs twice before the plugin arrives
    cluster_client.register_plugin(CredentialsPlugin({ref: {"secret": SECRET}}, lifetime),
                                   name=ref)
    try:
        time.sleep(lifetime)  # each worker asks the scheduler every quarter of it
        assert len(_held_anywhere(cluster_client)) == 3  # the scheduler's copy and both workers'
    finally:
        cluster_client.unregister_worker_plugin(ref)
    assert _held_anywhere(cluster_client) == []
