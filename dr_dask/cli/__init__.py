"""The ``dr-dask`` command line. See ``dr-dask --help``."""

from dr_dask.cli import datasets, evaluate, ikd, isomap, stream, workflow  # noqa: F401  (register)
from dr_dask.cli._app import main

__all__ = ["main"]
