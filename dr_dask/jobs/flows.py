"""Prefect flows of the scheduled jobs (the optional extra: ``pip install dr-dask[prefect]``).

``nightly_flow`` runs :func:`dr_dask.jobs.incremental.run_incremental` and ``weekly_flow`` runs
:func:`dr_dask.jobs.refit.run_refit`, each as one Prefect task holding a client of a Dask
cluster: the scheduler given as the flow's ``scheduler`` parameter (so that a deployment to a
work pool carries it), else ``$DASK_SCHEDULER_ADDRESS``, else a LocalCluster started for the run
(:func:`dr_dask.runtime.cluster.session`). The job's own Dask work runs on that cluster; the task is
only the call that drives it, so it runs in the flow run's process (a Dask task runner would fix the
address when the flow is imported, and a work pool's worker imports it with its own
environment).

What Prefect sees:

- **logs**: dr_dask's log records (``logging.getLogger("dr_dask...")``) during the job go to the
  task run's logger, so they are in the flow run's logs;
- **retries and timeouts** from the shipped workflow files (``nightly-gp-isomap``,
  ``weekly-refit``: one source for both ways of scheduling the jobs); a bad-input failure
  (:class:`~dr_dask.io.inputs.InputError`, :class:`~dr_dask.io.storage.StorageError`: exit 2 on the
  command line) is never retried; a transient one (a lost cluster, a held lease, an unreachable
  store) is;
- **artifacts**: the nightly drift history (a table) and report (the PNG, inline), the weekly
  metrics (a table) and report page.

:func:`deployments` gives both flows with cron schedules and their parameters; :func:`serve`
runs them from this process (``prefect.serve``); ``deployment.deploy(work_pool_name=...)``
registers them with a work pool. A failed run is simply run again: the jobs resume from their
own marks and hold a lease, so retries and overlapping schedules cannot double-write.

Airflow and Dagster users call the same jobs through the CLI or the Python API
(``docs/workflows.md``).
"""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

from prefect import flow, get_run_logger, task
from prefect import serve as prefect_serve
from prefect.artifacts import create_markdown_artifact, create_table_artifact

from dr_dask.io.inputs import InputError
from dr_dask.io.storage import StorageError, location
from dr_dask.jobs.incremental import run_incremental
from dr_dask.jobs.refit import run_refit
from dr_dask.jobs.workflow import Step, load
from dr_dask.runtime.cluster import session

logger = logging.getLogger(__name__)

#: Default schedules (cron, the scheduler's time zone): nightly at 02:00, weekly Sunday 03:00.
NIGHTLY_CRON = "0 2 * * *"
WEEKLY_CRON = "0 3 * * 0"
#: Exceptions that mean bad input or configuration: never retried (exit 2 on the command line).
BAD_INPUT = (InputError, StorageError)


def _limits(workflow: str) -> dict[str, Any]:
    """The retries, delay and timeout of the shipped ``workflow``'s (only) step, as task
    options."""
    step: Step = load(workflow).steps[0]
    return {"retries": step.retries, "retry_delay_seconds": step.retry_delay,
            "timeout_seconds": step.timeout}


def retry_unless_bad_input(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's retry condition: retry anything but bad input (its exception is in the
    failed ``state``)."""
    exc = state.result(raise_on_failure=False)
    return not isinstance(exc, BAD_INPUT)


class _ToRunLogger(logging.Handler):
    """Hands dr_dask's records to a Prefect run logger (which sends them to the API)."""

    def __init__(self, run_logger: Any):
        super().__init__()
        self.run_logger = run_logger

    def emit(self, record: logging.LogRecord) -> None:
        self.run_logger.log(record.levelno, "%s: %s", record.name, record.getMessage())


@contextlib.contextmanager
def run_logs(level: int = logging.INFO) -> Iterator[None]:
    """Inside a task: dr_dask's log records at ``level`` and above reach the task run's logs."""
    handler = _ToRunLogger(get_run_logger())
    handler.setLevel(level)
    package = logging.getLogger("dr_dask")
    previous = package.level
    package.addHandler(handler)
    if package.getEffectiveLevel() > level:
        package.setLevel(level)
    try:
        yield
    finally:
        package.removeHandler(handler)
        package.setLevel(previous)


@task(name="dr-dask incremental job", retry_condition_fn=retry_unless_bad_input,
      **_limits("nightly-gp-isomap"))
def incremental_task(source: str, state: str, variable: str | None,
                     storage_options: dict | None, params: dict,
                     scheduler: str | None) -> dict:
    """:func:`~dr_dask.jobs.incremental.run_incremental` on the cluster at ``scheduler``."""
    with run_logs(), session(scheduler) as client:
        return run_incremental(source, state, variable=variable,
                               storage_options=storage_options, client=client, **params)


@task(name="dr-dask refit job", retry_condition_fn=retry_unless_bad_input,
      **_limits("weekly-refit"))
def refit_task(source: str, runs: str, method: str, n_components: int, variable: str | None,
               storage_options: dict | None, params: dict, scheduler: str | None) -> dict:
    """:func:`~dr_dask.jobs.refit.run_refit` on the cluster at ``scheduler``."""
    with run_logs(), session(scheduler) as client:
        return run_refit(source, runs, method=method, n_components=n_components,
                         variable=variable, storage_options=storage_options, client=client,
                         **params)


def _png_markdown(title: str, png: bytes, lines: list[str]) -> str:
    """A markdown page with the PNG inline (a data URI: the report may sit on storage the
    Prefect UI cannot reach)."""
    image = base64.b64encode(png).decode()
    return "\n".join([f"# {title}", "", *lines, "", f"![{title}](data:image/png;base64,{image})"])


def publish_nightly(summary: dict, state: str, storage_options: dict | None) -> None:
    """The drift history (a table) and, when drawn, the report (PNG inline) as artifacts."""
    history = location(state, storage_options).child("drift_history.json").read_json(default=[])
    create_table_artifact(key="dr-dask-nightly-drift-history", table=history,
                          description=f"drift history of {summary['state']}")
    if summary.get("report"):
        png = location(summary["report"], storage_options).read_bytes()
        lines = [f"- status: {summary['status']}",
                 f"- rows {summary['watermark_before']}..{summary['watermark_after']}, "
                 f"model v{summary['model_version']}, refit: {summary['refit']}",
                 f"- drift statistic: {summary['drift_statistic']}", f"- {summary['report']}"]
        create_markdown_artifact(key="dr-dask-nightly-report",
                                 markdown=_png_markdown("nightly GP-Isomap", png, lines),
                                 description="report.png of the nightly job")


def publish_weekly(summary: dict, storage_options: dict | None) -> None:
    """The refit's metrics (a table) and report page (PNG inline) as artifacts."""
    if summary.get("status") != "done":
        return
    metrics = [{"metric": k, "value": v} for k, v in summary["metrics"].items()]
    create_table_artifact(key="dr-dask-weekly-metrics", table=metrics,
                          description=f"{summary['run']} on {summary['n_samples']} rows")
    # report.png beside report.json (RUNS/NAME.report/)
    png_loc = location(summary["report"].rsplit("/", 1)[0], storage_options).child("report.png")
    lines = [f"- run: {summary['run']} ({summary['method']}, {summary['n_components']} "
             f"components)", f"- previous: {summary['previous']}", f"- {summary['report']}"]
    create_markdown_artifact(key="dr-dask-weekly-report",
                             markdown=_png_markdown("weekly refit", png_loc.read_bytes(), lines),
                             description="report.png of the weekly refit")


@flow(name="dr-dask-nightly", log_prints=True)
def nightly_flow(source: str, state: str, variable: str | None = None,
                 storage_options: dict | None = None, params: dict | None = None,
                 scheduler: str | None = None) -> dict:
    """Map the rows appended to ``source`` since the last run; refit GP-Isomap on drift.

    Parameters
    ----------
    source : str
        Appendable Zarr array (``STORE:VAR``), local path or URL.
    state : str
        The job's state location (stream store, models, drift history).
    variable : str, optional
    storage_options : dict, optional
    params : dict, optional
        The job's parameters (``dr_dask.jobs.incremental.DEFAULTS``).
    scheduler : str, optional
        Dask scheduler address (default ``$DASK_SCHEDULER_ADDRESS``, else a LocalCluster).

    Returns
    -------
    dict
        The job's summary.
    """
    summary = incremental_task(source, state, variable, storage_options, params or {},
                               scheduler)
    publish_nightly(summary, state, storage_options)
    return summary


@flow(name="dr-dask-weekly", log_prints=True)
def weekly_flow(source: str, runs: str, method: str = "ikd", n_components: int = 2,
                variable: str | None = None, storage_options: dict | None = None,
                params: dict | None = None, scheduler: str | None = None) -> dict:
    """Refit ``method`` on all of ``source``, evaluate it and move ``latest`` when it is good.

    Parameters
    ----------
    source : str
        Zarr input (``STORE:VAR``), local path or URL.
    runs : str
        The runs store (one run group per refit, the ``latest`` pointer).
    method : str
    n_components : int
    variable : str, optional
    storage_options : dict, optional
    params : dict, optional
        The job's parameters (``dr_dask.jobs.refit.DEFAULTS``).
    scheduler : str, optional
        Dask scheduler address (default ``$DASK_SCHEDULER_ADDRESS``, else a LocalCluster).

    Returns
    -------
    dict
        The job's summary.
    """
    summary = refit_task(source, runs, method, n_components, variable, storage_options,
                         params or {}, scheduler)
    publish_weekly(summary, storage_options)
    return summary


def deployments(*, source: str, state: str, runs: str, nightly_cron: str = NIGHTLY_CRON,
                weekly_cron: str = WEEKLY_CRON, scheduler: str | None = None,
                nightly: dict | None = None, weekly: dict | None = None) -> list:
    """The two flows as Prefect deployments on cron schedules.

    Parameters
    ----------
    source : str
        The input both jobs read.
    state : str
        The nightly job's state location.
    runs : str
        The weekly job's runs store.
    nightly_cron, weekly_cron : str
        Cron expressions.
    scheduler : str, optional
        Dask scheduler address both flows run on: a flow parameter of both deployments, so it
        reaches a work pool's runs too (default: see :func:`dr_dask.runtime.cluster.connect`).
    nightly, weekly : dict, optional
        Further flow parameters (``variable``, ``storage_options``, ``params``; for the weekly
        flow also ``method`` and ``n_components``).

    Returns
    -------
    list of prefect deployments
        For :func:`serve` / ``prefect.serve``, or ``.deploy(work_pool_name=..., image=...)``.
    """
    common = {"scheduler": scheduler} if scheduler else {}
    return [
        nightly_flow.to_deployment(
            name="dr-dask-nightly", cron=nightly_cron,
            parameters={"source": source, "state": state, **common, **(nightly or {})}),
        weekly_flow.to_deployment(
            name="dr-dask-weekly", cron=weekly_cron,
            parameters={"source": source, "runs": runs, **common, **(weekly or {})}),
    ]


def serve(**kwargs: Any) -> None:
    """Serve :func:`deployments` (same arguments) from this process until interrupted."""
    prefect_serve(*deployments(**kwargs))
