"""`dr-dask run WORKFLOW.toml` on a remote scheduler address: steps run in order, resumably."""

from __future__ import annotations

import zarr
from click.testing import CliRunner

from dr_dask.cli import main


def _workflow(tmp_path, steps: str) -> str:
    path = tmp_path / "job.toml"
    path.write_text('[job]\nname = "test-job"\n' + steps)
    return str(path)


def test_workflow_runs_steps_on_a_remote_scheduler(tmp_path, cluster_client):
    data, runs = tmp_path / "d.zarr", tmp_path / "r.zarr"
    wf = _workflow(tmp_path, f"""
[[steps]]
name = "generate"
args = ["datasets", "make", "sinusoidal", "--out", "{data}", "-T", "300", "-N", "40", "--if-missing"]

[[steps]]
name = "embed"
args = ["embed", "ikd", "--input", "{data}:X", "--out", "{runs}", "-n", "1", "--name", "nightly"]
""")
    address = cluster_client.scheduler.address
    res = CliRunner().invoke(main, ["--scheduler", address, "run", wf])
    assert res.exit_code == 0, res.output
    run = zarr.open_group(runs, mode="r")["nightly"]
    assert run.attrs["complete"] and run["embedding"].shape == (300, 1)
    # the scheduler's workers did the work: the cluster saw tasks
    assert cluster_client.run_on_scheduler(lambda dask_scheduler: len(dask_scheduler.task_prefixes)) > 0
    # a rerun of the finished job is a no-op that succeeds (resumable, idempotent steps)
    before = run["embedding"][...]
    res = CliRunner().invoke(main, ["--scheduler", address, "run", wf])
    assert res.exit_code == 0 and "nothing to do" in res.output, res.output
    assert (zarr.open_group(runs, mode="r")["nightly"]["embedding"][...] == before).all()


def test_failing_step_stops_the_job_with_its_reason(tmp_path):
    wf = _workflow(tmp_path, f"""
[[steps]]
args = ["embed", "ikd", "--input", "{tmp_path}/missing.zarr:X", "--out", "{tmp_path}/o.zarr", "-n", "2"]

[[steps]]
name = "never"
args = ["datasets", "make", "gp", "--out", "{tmp_path}/never.zarr"]
""")
    res = CliRunner().invoke(main, ["--scheduler", "threads", "run", wf])
    assert res.exit_code != 0
    assert "does not exist" in res.output
    assert not (tmp_path / "never.zarr").exists()


def test_invalid_workflow_is_rejected(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[[steps]]\nname = 'x'\n")
    res = CliRunner().invoke(main, ["--scheduler", "threads", "run", str(bad)])
    assert res.exit_code == 2 and "args" in res.output
