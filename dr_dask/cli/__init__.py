"""The ``dr-dask`` command line. See ``dr-dask --help``.

The command modules import what a command runs (the estimators, distributed, the benchmarks in
:mod:`dr_dask.bench`) inside the command, the one exception to imports at the top of a module:
``main`` configures logging before distributed is imported (else distributed installs its own
handlers and its INFO lines reach stderr without ``-v``), and ``dr-dask --help`` or a mistyped
option answers without loading scikit-learn, matplotlib and the cluster stack.
"""

from dr_dask.cli import (  # noqa: F401  (register)
    anndata,
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
