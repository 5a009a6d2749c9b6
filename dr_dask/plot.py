"""The plotting API at its public path: :mod:`dr_dask.report.plot` is where it lives, and
``interactive`` (the Bokeh scatter) in :mod:`dr_dask.report.interactive`, imported on first use."""

from typing import Any

from dr_dask.report.plot import *  # noqa: F403  (the public path re-exports every name)
from dr_dask.report.plot import __all__ as _drawn

__all__ = [*_drawn, "interactive"]  # noqa: F405  (module __getattr__ below)


def __getattr__(name: str) -> Any:
    # Bokeh and the report's page are loaded only by the call that needs them
    if name == "interactive":
        from dr_dask.report.interactive import interactive

        return interactive
    raise AttributeError(f"module 'dr_dask.plot' has no attribute {name!r}")
