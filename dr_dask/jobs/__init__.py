"""Scheduled jobs: the nightly incremental GP-Isomap job and the weekly full refit.

Both are plain functions returning a JSON-able summary (the CLI prints it, a Prefect or Airflow
task can return it): :func:`run_incremental` and :func:`run_refit`. What they write and their
semantics (watermark, ``latest`` pointer, exit codes) are in ``docs/workflows.md``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from dr_dask.jobs.incremental import run_incremental
    from dr_dask.jobs.refit import run_refit

# Imported when first asked for, as the package's public names are (dr_dask/__init__.py):
# `dr-dask run --check` reads dr_dask.jobs.workflow and loads no estimator.
_PUBLIC = {"run_incremental": "dr_dask.jobs.incremental", "run_refit": "dr_dask.jobs.refit"}

__all__ = ["run_incremental", "run_refit"]


def __getattr__(name: str) -> Any:
    if name in _PUBLIC:
        return getattr(importlib.import_module(_PUBLIC[name]), name)
    raise AttributeError(f"module 'dr_dask.jobs' has no attribute {name!r}")
