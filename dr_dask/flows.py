"""Prefect flows of the scheduled jobs (the optional extra: ``pip install dr-dask[prefect]``).

``nightly_flow`` runs :func:`dr_dask.jobs.incremental.run_incremental` and ``weekly_flow`` runs
:func:`dr_dask.jobs.refit.run_refit`, each as one Prefect task on the flow's Dask cluster: the
flow's task runner is prefect-dask's ``DaskTaskRunner`` (a container-sized LocalCluster, or the
scheduler at ``$DASK_SCHEDULER_ADDRESS``), and the task hands the job a client of that same
cluster (``get_dask_client``), so the job's own Dask work is spread over the cluster rather
than run inside the one worker thread that holds the task. :func:`deployments` gives both flows
with cron schedules; :func:`serve` runs them on this machine (``prefect.serve``), or register
them with a work pool as for any Prefect flow.

A failed run is simply run again: the jobs resume from their own marks (watermark, stage
marks) and hold a lease, so Prefect retries or an overlapping schedule cannot double-write.

Airflow and Dagster users call the same jobs through the CLI or the Python API
(``docs/workflows.md``).
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from typing import Any

from distributed import rejoin, secede
from distributed.worker import thread_state
from prefect import flow, task
from prefect import serve as prefect_serve
from prefect.task_runners import TaskRunner
from prefect_dask import DaskTaskRunner, get_dask_client

from dr_dask.cluster import SCHEDULER_ENV, local_cluster_kwargs
from dr_dask.jobs.incremental import run_incremental
from dr_dask.jobs.refit import run_refit

logger = logging.getLogger(__name__)

#: Default schedules (cron, the scheduler's time zone): nightly at 02:00, weekly Sunday 03:00.
NIGHTLY_CRON = "0 2 * * *"
WEEKLY_CRON = "0 3 * * 0"


# Typed as prefect's TaskRunner[Any]: prefect-dask subclasses a bare `TaskRunner`, which the type
# variable's default makes a TaskRunner[PrefectConcurrentFuture] that `flow` does not accept.
def task_runner(scheduler: str | None = None, n_workers: int | None = None) -> TaskRunner[Any]:
    """The flows' task runner: the Dask scheduler at ``scheduler`` (default
    ``$DASK_SCHEDULER_ADDRESS``), else a LocalCluster sized to this container, started for the
    flow run and closed after it.

    Parameters
    ----------
    scheduler : str, optional
        Address such as ``tcp://10.0.0.5:8786``.
    n_workers : int, optional
        Worker processes of the LocalCluster (default: one per core).

    Returns
    -------
    prefect_dask.DaskTaskRunner
    """
    address = scheduler or os.environ.get(SCHEDULER_ENV)
    if address:
        return DaskTaskRunner(address=address)
    return DaskTaskRunner(cluster_class="distributed.LocalCluster",
                          cluster_kwargs=local_cluster_kwargs(n_workers))


@contextlib.contextmanager
def cluster_client() -> Iterator[Any]:
    """Inside a task of these flows: a client of the flow's cluster.

    The task's worker thread leaves the worker's thread pool while the job runs (``secede``,
    as ``distributed.worker_client`` does), so the job's tasks can use that thread too: with
    one thread per worker the job would otherwise wait on its own worker. The client is given
    to the job explicitly and never becomes the worker process's default.
    """

    on_worker = getattr(thread_state, "key", None) is not None
    # not the process's default client: other tasks on this worker (a job's own tasks whose
    # estimators have client=None) would find it and wait on the cluster from a worker thread
    # prefect-dask annotates **client_kwargs as Dict[str, Any] (each kwarg a dict): a stub
    # error (unused where prefect is not installed, e.g. CI's type check)
    with get_dask_client(
            set_as_default=False,  # type: ignore[arg-type, unused-ignore]
    ) as client:
        if on_worker:
            secede()
        try:
            yield client
        finally:
            if on_worker:
                rejoin()


@task(name="dr-dask incremental job")
def incremental_task(source: str, state: str, variable: str | None,
                     storage_options: dict | None, params: dict) -> dict:
    """:func:`~dr_dask.jobs.incremental.run_incremental` with the flow's cluster."""

    with cluster_client() as client:
        return run_incremental(source, state, variable=variable,
                               storage_options=storage_options, client=client, **params)


@task(name="dr-dask refit job")
def refit_task(source: str, runs: str, method: str, n_components: int, variable: str | None,
               storage_options: dict | None, params: dict) -> dict:
    """:func:`~dr_dask.jobs.refit.run_refit` with the flow's cluster."""

    with cluster_client() as client:
        return run_refit(source, runs, method=method, n_components=n_components,
                         variable=variable, storage_options=storage_options, client=client,
                         **params)


@flow(name="dr-dask-nightly", task_runner=task_runner(), log_prints=True)
def nightly_flow(source: str, state: str, variable: str | None = None,
                 storage_options: dict | None = None, params: dict | None = None) -> dict:
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

    Returns
    -------
    dict
        The job's summary.
    """
    return incremental_task.submit(source, state, variable, storage_options,
                                   params or {}).result()


@flow(name="dr-dask-weekly", task_runner=task_runner(), log_prints=True)
def weekly_flow(source: str, runs: str, method: str = "ikd", n_components: int = 2,
                variable: str | None = None, storage_options: dict | None = None,
                params: dict | None = None) -> dict:
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
        The job's parameters (``dr_dask.jobs.refit``).

    Returns
    -------
    dict
        The job's summary.
    """
    return refit_task.submit(source, runs, method, n_components, variable, storage_options,
                             params or {}).result()


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
        Dask scheduler address both flows run on (default: see :func:`task_runner`).
    nightly, weekly : dict, optional
        Further flow parameters (``variable``, ``storage_options``, ``params``; for the weekly
        flow also ``method`` and ``n_components``).

    Returns
    -------
    list of prefect deployments
        For :func:`serve` / ``prefect.serve`` or ``.deploy`` to a work pool.
    """
    runner = task_runner(scheduler)
    return [
        nightly_flow.with_options(task_runner=runner).to_deployment(
            name="dr-dask-nightly", cron=nightly_cron,
            parameters={"source": source, "state": state, **(nightly or {})}),
        weekly_flow.with_options(task_runner=runner).to_deployment(
            name="dr-dask-weekly", cron=weekly_cron,
            parameters={"source": source, "runs": runs, **(weekly or {})}),
    ]


def serve(**kwargs: Any) -> None:
    """Serve :func:`deployments` (same arguments) from this process until interrupted."""
    prefect_serve(*deployments(**kwargs))
