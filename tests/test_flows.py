"""The Prefect flows (optional extra) run the real jobs in Prefect's local mode (a temporary
API on a temporary SQLite database, no server installed), their task on the flow's Dask cluster
and the job's own Dask work on that same cluster."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

pytest.importorskip("prefect")
pytest.importorskip("prefect_dask")

from distributed import get_task_stream
from prefect.testing.utilities import prefect_test_harness

from dr_dask import flows
from dr_dask.datasets.swiss_roll import shift_scenario
from dr_dask.storage import Location

SMALL = {"n_batch": 300, "n_s": 40, "chunk_size": 50}


@pytest.fixture(scope="module")
def prefect_local():
    # the temporary API server starts in a subprocess: allow for a loaded machine
    with prefect_test_harness(server_startup_timeout=300):
        yield


def _land(path: str, rows: np.ndarray) -> None:
    g = zarr.open_group(path, mode="a")
    arr = g.require_array("X", shape=(0, rows.shape[1]), chunks=(50, rows.shape[1]), dtype="f8")
    n = arr.shape[0]
    arr.resize((n + len(rows), rows.shape[1]))
    arr[n:] = rows


@pytest.mark.cluster
def test_nightly_and_weekly_flows_run_the_jobs_on_the_flows_cluster(prefect_local,
                                                                    cluster_client, tmp_path):
    sc = shift_scenario(100, random_state=3)
    src, state, runs = (str(tmp_path / p) for p in ("land.zarr", "state", "runs.zarr"))
    _land(src, np.vstack([sc.batch, sc.stream])[:400])
    runner = flows.task_runner(cluster_client.scheduler.address)

    with get_task_stream(cluster_client) as ts:
        night = flows.nightly_flow.with_options(task_runner=runner)(
            source=f"{src}:X", state=state, params=SMALL)
    assert (night["status"], night["rows_mapped"], night["watermark_after"]) == ("done", 400, 400)
    # the flow's task ran on the cluster, and so did the job's mapping tasks it submitted
    names = [t["key"] if isinstance(t["key"], str) else t["key"][0] for t in ts.data]
    assert any("incremental" in n for n in names), names
    assert len(names) > 400 // SMALL["chunk_size"]
    # a second run finds nothing new: the job's watermark, through the flow
    again = flows.nightly_flow.with_options(task_runner=runner)(
        source=f"{src}:X", state=state, params=SMALL)
    assert again["status"] == "nothing to do"

    week = flows.weekly_flow.with_options(task_runner=runner)(
        source=f"{src}:X", runs=runs, method="isomap", n_components=2,
        params={"eval_rows": 150, "tci_candidates": 4})
    assert week["status"] == "done" and week["n_samples"] == 400
    assert Location(runs).child("latest.json").read_json()["run"] == week["run"]


def test_deployments_carry_the_cron_schedules_and_parameters():
    nightly, weekly = flows.deployments(source="s3://lake/in.zarr:X", state="s3://lake/state",
                                        runs="s3://lake/runs.zarr", weekly_cron="0 4 * * 6",
                                        weekly={"method": "ikd", "n_components": 3})
    assert nightly.name == "dr-dask-nightly" and weekly.name == "dr-dask-weekly"
    assert [s.schedule.cron for s in nightly.schedules] == [flows.NIGHTLY_CRON]
    assert [s.schedule.cron for s in weekly.schedules] == ["0 4 * * 6"]
    assert nightly.parameters == {"source": "s3://lake/in.zarr:X", "state": "s3://lake/state"}
    assert weekly.parameters["n_components"] == 3 and weekly.parameters["method"] == "ikd"
