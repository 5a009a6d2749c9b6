"""The ``dr-dask`` command line. See ``dr-dask --help``."""

from dr_dask.cli import (  # noqa: F401  (register)
    datasets,
    evaluate,
    ikd,
    isomap,
    jobs,
    report,
    scale,
    stream,
    workflow,
)
from dr_dask.cli._app import main

__all__ = ["main"]
