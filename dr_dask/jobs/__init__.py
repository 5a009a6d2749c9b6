"""Scheduled jobs: the nightly incremental GP-Isomap job and the weekly full refit.

Both are plain functions returning a JSON-able summary (the CLI prints it, a Prefect or Airflow
task can return it): :func:`run_incremental` and :func:`run_refit`. What they write and their
semantics (watermark, ``latest`` pointer, exit codes) are in ``docs/workflows.md``.
"""

from dr_dask.jobs.incremental import run_incremental
from dr_dask.jobs.refit import run_refit

__all__ = ["run_incremental", "run_refit"]
