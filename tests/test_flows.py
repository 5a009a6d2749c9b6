"""The Prefect flows (optional extra) run the real jobs in Prefect's local mode (a temporary
API on a temporary SQLite database, no server installed) on the Dask cluster named by their
``scheduler`` parameter; what a Prefect user looks at is read back from that API: the flow
run's logs, its task runs' attempts and its artifacts."""

from __future__ import annotations

import base64
import json
import re
import time

import numpy as np
import pytest
import zarr

pytest.importorskip("prefect")

from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import (
    ArtifactFilter,
    ArtifactFilterFlowRunId,
    FlowRunFilter,
    FlowRunFilterId,
    LogFilter,
    LogFilterFlowRunId,
)
from prefect.logging.handlers import APILogWorker
from prefect.testing.utilities import prefect_test_harness

from dr_dask.datasets.swiss_roll import shift_scenario
from dr_dask.io.storage import Location
from dr_dask.jobs import flows

SMALL = {"n_batch": 300, "n_s": 40, "chunk_size": 50}


@pytest.fixture(scope="module")
def prefect_local():
    # the temporary API server starts in a subprocess: allow for a loaded machine
    with prefect_test_harness(server_startup_timeout=300):
        yield


def _land(path: str, rows: np.ndarray) -> None:
    g = zarr.open_group(path, mode="a")
    arr = g["X"] if "X" in g else g.create_array("X", shape=(0, rows.shape[1]),
                                                 chunks=(50, rows.shape[1]), dtype="f8")
    n = arr.shape[0]
    arr.resize((n + len(rows), rows.shape[1]))
    arr[n:] = rows


def _run(flow, **kwargs):
    """Run ``flow``; its summary (or exception), its run id."""
    state = flow(**kwargs, return_state=True)
    return state.result(raise_on_failure=False), state.state_details.flow_run_id


def _logs(run_id) -> list[str]:
    APILogWorker.drain_all(timeout=30)  # logs go to the API in batches
    with get_client(sync_client=True) as client:
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[run_id])))
    return [log.message for log in logs]


def _artifacts(run_id) -> dict[str, object]:
    with get_client(sync_client=True) as client:
        found = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[run_id])))
    return {a.key: a.data for a in found}


def _attempts(run_id) -> int:
    with get_client(sync_client=True) as client:
        (task_run,) = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run_id])))
    return task_run.run_count


def _table(data) -> list[dict]:
    return json.loads(data) if isinstance(data, str) else data  # stored as JSON text


def _inline_png(markdown: str) -> bytes:
    (data,) = re.findall(r"data:image/png;base64,([A-Za-z0-9+/=]+)\)", markdown)
    return base64.b64decode(data)


@pytest.mark.cluster
def test_flows_run_the_jobs_on_their_scheduler_with_logs_and_artifacts(prefect_local,
                                                                        cluster_client, tmp_path):
    sc = shift_scenario(100, random_state=3)
    src, state, runs = (str(tmp_path / p) for p in ("land.zarr", "state", "runs.zarr"))
    _land(src, np.vstack([sc.batch, sc.stream])[:400])
    address = cluster_client.scheduler.address

    def transitions():
        return cluster_client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.transition_counter)

    before = transitions()
    night, run_id = _run(flows.nightly_flow, source=f"{src}:X", state=state, params=SMALL,
                         scheduler=address)
    assert (night["status"], night["rows_mapped"], night["watermark_after"]) == ("done", 400, 400)
    assert transitions() > before  # the job's work went to the scheduler of the parameter
    # dr_dask's own log records are in the flow run's logs
    assert any("dr_dask.jobs.incremental: incremental done: rows 0..400" in m
               for m in _logs(run_id)), _logs(run_id)
    # the drift history and the report, as artifacts
    artifacts = _artifacts(run_id)
    history = Location(state).child("drift_history.json").read_json()
    table = _table(artifacts["dr-dask-nightly-drift-history"])
    assert [row["watermark_after"] for row in table] == [h["watermark_after"] for h in history]
    png = Location(night["report"]).read_bytes()
    assert _inline_png(artifacts["dr-dask-nightly-report"]) == png

    # a second run finds nothing new: the job's watermark, through the flow
    again, _ = _run(flows.nightly_flow, source=f"{src}:X", state=state, params=SMALL,
                    scheduler=address)
    assert again["status"] == "nothing to do"

    week, run_id = _run(flows.weekly_flow, source=f"{src}:X", runs=runs, method="isomap",
                        n_components=2, params={"eval_rows": 150, "tci_candidates": 4},
                        scheduler=address)
    assert week["status"] == "done" and week["n_samples"] == 400
    assert Location(runs).child("latest.json").read_json()["run"] == week["run"]
    artifacts = _artifacts(run_id)
    metrics = _table(artifacts["dr-dask-weekly-metrics"])
    assert {"metric": "trustworthiness", "value": week["metrics"]["trustworthiness"]} in metrics
    report_png = Location(week["report"].rsplit("/", 1)[0]).child("report.png").read_bytes()
    assert _inline_png(artifacts["dr-dask-weekly-report"]) == report_png


@pytest.mark.cluster
def test_transient_failures_are_retried_and_bad_input_is_not(prefect_local, cluster_client,
                                                              tmp_path, monkeypatch):
    # the shipped workflow's retries (2), without its 30 s wait between them
    monkeypatch.setattr(flows, "incremental_task",
                        flows.incremental_task.with_options(retry_delay_seconds=0))
    assert flows.incremental_task.retries == 2
    address = cluster_client.scheduler.address

    bad, run_id = _run(flows.nightly_flow, source=f"{tmp_path}/missing.zarr:X",
                       state=str(tmp_path / "s1"), params=SMALL, scheduler=address)
    assert isinstance(bad, flows.BAD_INPUT) and "does not exist" in str(bad)
    assert _attempts(run_id) == 1  # bad input: never retried

    sc = shift_scenario(100, random_state=3)
    src, state = str(tmp_path / "land.zarr"), str(tmp_path / "s2")
    _land(src, np.vstack([sc.batch, sc.stream])[:400])
    done, _ = _run(flows.nightly_flow, source=f"{src}:X", state=state, params=SMALL,
                   scheduler=address)
    assert done["status"] == "done"
    _land(src, np.vstack([sc.batch, sc.stream])[400:450])
    # another live run holds the job's lease: transient, retried, then the flow fails
    Location(state).child("lease.json").write_json({"owner": "elsewhere:1:abc",
                                                    "expires": time.time() + 600})
    held, run_id = _run(flows.nightly_flow, source=f"{src}:X", state=state, params=SMALL,
                        scheduler=address)
    assert type(held).__name__ == "LeaseHeld"
    assert _attempts(run_id) == 3  # 1 + the workflow's 2 retries


def test_deployments_carry_the_schedules_and_the_scheduler_as_a_parameter():
    nightly, weekly = flows.deployments(source="s3://lake/in.zarr:X", state="s3://lake/state",
                                        runs="s3://lake/runs.zarr", weekly_cron="0 4 * * 6",
                                        scheduler="tcp://dask-scheduler.dask:8786",
                                        weekly={"method": "ikd", "n_components": 3})
    assert nightly.name == "dr-dask-nightly" and weekly.name == "dr-dask-weekly"
    assert [s.schedule.cron for s in nightly.schedules] == [flows.NIGHTLY_CRON]
    assert [s.schedule.cron for s in weekly.schedules] == ["0 4 * * 6"]
    # a flow parameter: what a work pool's worker runs the flow with
    assert nightly.parameters == {"source": "s3://lake/in.zarr:X", "state": "s3://lake/state",
                                  "scheduler": "tcp://dask-scheduler.dask:8786"}
    assert weekly.parameters["scheduler"] == "tcp://dask-scheduler.dask:8786"
    assert weekly.parameters["n_components"] == 3 and weekly.parameters["method"] == "ikd"
    # the task limits are the shipped workflows'
    assert (flows.incremental_task.retries, flows.incremental_task.timeout_seconds) == (2, 7200)
    assert (flows.refit_task.retries, flows.refit_task.timeout_seconds) == (1, 12 * 3600)


def test_prefect_constraints_pin_this_environment():
    """deploy/constraints-prefect.txt (the Dockerfile's prefect stage) pins what these tests
    ran with (.ci/run installs the prefect extra with it)."""
    import importlib.util
    import os

    path = os.path.join(os.path.dirname(__file__), "..", "deploy", "make_constraints.py")
    spec = importlib.util.spec_from_file_location("make_constraints", path)
    make = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make)
    with open(os.path.join(os.path.dirname(path), "constraints-prefect.txt")) as fh:
        assert fh.read() == make.render(make.pins(extras=make.PREFECT_EXTRAS)), (
            "deploy/constraints-prefect.txt is stale: run `python deploy/make_constraints.py "
            "constraints-prefect.txt` where tests/test_flows.py passed")

