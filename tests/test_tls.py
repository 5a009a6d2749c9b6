"""TLS between the CLI, the scheduler and the workers: a real TLS cluster on 127.0.0.1."""

from __future__ import annotations

import gc

import dask
import numpy as np
import pytest
import zarr
from click.testing import CliRunner
from conftest import tls_files

from dr_dask.cli import main
from dr_dask.runtime.cluster import tls_security


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """A private CA and one certificate it signed (as distributed's Security.temporary())."""
    return tls_files(tmp_path_factory.mktemp("tls"))


@pytest.mark.cluster
def test_workflow_runs_through_a_tls_only_cluster(tmp_path, certs):
    from distributed import Client, LocalCluster

    security = tls_security(certs["ca_file"], certs["cert"], certs["key"])
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, security=security,
                      dashboard_address=None, memory_limit="2GB") as cluster:
        address = cluster.scheduler_address
        assert address.startswith("tls://127.0.0.1:")
        # the scheduler refuses a client without the certificates (the failed Client leaves
        # dask's global scheduler set to "dask.distributed": the config context restores it)
        with dask.config.set(scheduler="threads"), pytest.raises((TypeError, OSError)):
            Client(address, timeout="3s")
        # finalise the failed Client here: collected later in the bootstrap of a thread that a
        # new Client's loop starts, its __del__ waits for distributed's class-wide LoopRunner
        # lock, which the starting Client holds while it waits for that thread (a deadlock
        # seen in a full run)
        gc.collect()

        data, runs = tmp_path / "d.zarr", tmp_path / "r.zarr"
        wf = tmp_path / "job.toml"
        wf.write_text(f"""
[job]
name = "tls-job"

[tls]
ca_file = "{certs['ca_file']}"
cert = "{certs['cert']}"
key = "{certs['key']}"

[[steps]]
name = "generate"
args = ["datasets", "make", "sinusoidal", "--out", "{data}", "-T", 120, "-N", 20]

[[steps]]
name = "embed"
args = ["embed", "ikd", "--input", "{data}:X", "--out", "{runs}", "-n", 1, "--name", "tls"]
""")
        # the certificate options from the workflow's [tls] table
        res = CliRunner().invoke(main, ["--scheduler", address, "run", str(wf)])
        assert res.exit_code == 0, res.output
        embedding = zarr.open_group(runs, mode="r")["tls"]["embedding"][...]
        assert embedding.shape == (120, 1)
        with Client(address, security=security) as client:  # the work went through this cluster
            assert client.run_on_scheduler(
                lambda dask_scheduler: len(dask_scheduler.task_prefixes)) > 0

        # and from the command line, which a plain command takes too
        res = CliRunner().invoke(main, [
            "--scheduler", address, "--tls-ca-file", certs["ca_file"], "--tls-cert",
            certs["cert"], "--tls-key", certs["key"], "embed", "ikd", "--input", f"{data}:X",
            "--out", str(runs), "-n", "1", "--name", "tls2"])
        assert res.exit_code == 0, res.output
        again = zarr.open_group(runs, mode="r")["tls2"]["embedding"][...]
        np.testing.assert_allclose(np.abs(again), np.abs(embedding), rtol=1e-6, atol=1e-9)


def test_partial_tls_options_are_rejected(certs, tmp_path):
    res = CliRunner().invoke(main, ["--tls-ca-file", certs["ca_file"], "embed", "ikd", "--input",
                                    f"{tmp_path}/d.zarr:X", "--out", str(tmp_path / "o.zarr"),
                                    "-n", "1"])
    assert res.exit_code == 2 and "missing --tls-cert, --tls-key" in res.output, res.output
    res = CliRunner().invoke(main, ["--tls-ca-file", str(tmp_path / "nope.pem"), "run", "x"])
    assert res.exit_code == 2 and "nope.pem" in res.output and "does not exist" in res.output
    wf = tmp_path / "job.toml"
    wf.write_text(f"[tls]\nca_file = '{certs['ca_file']}'\ncert = '{tmp_path}/gone.pem'\n"
                  f"key = '{certs['key']}'\n[[steps]]\nargs = ['datasets', 'make', 'gp', "
                  f"'--out', '{tmp_path}/d.zarr']\n")
    res = CliRunner().invoke(main, ["run", str(wf)])
    assert res.exit_code == 2 and "[tls] cert = " in res.output and "gone.pem" in res.output
    assert not (tmp_path / "d.zarr").exists()


def test_tls_address_without_tls_options_is_a_user_error(tmp_path):
    res = CliRunner().invoke(main, ["--scheduler", "tls://127.0.0.1:1", "embed", "ikd",
                                    "--input", f"{tmp_path}/d.zarr:X", "--out",
                                    str(tmp_path / "o.zarr"), "-n", "1"])
    assert res.exit_code == 2, res.output
    assert "--tls-ca-file, --tls-cert and --tls-key" in res.output
    assert "Traceback" not in res.output and not (tmp_path / "o.zarr").exists()
