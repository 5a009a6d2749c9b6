"""The plotting API at its public path: :mod:`dr_dask.report.plot` is where it lives."""

from dr_dask.report.plot import *  # noqa: F403  (the public path re-exports every name)
from dr_dask.report.plot import __all__  # noqa: F401  (and lists them for `import *`)
