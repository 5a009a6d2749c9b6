"""The ``dr-dask`` command line. See ``dr-dask --help``."""

import importlib

from dr_dask.cli._app import main

# Each module attaches its commands to the groups in _app.
for _name in ("datasets", "ikd", "isomap", "stream", "evaluate", "workflow"):
    try:
        importlib.import_module(f"dr_dask.cli.{_name}")
    except ModuleNotFoundError as exc:  # pragma: no cover - only while a module is absent
        if exc.name != f"dr_dask.cli.{_name}":
            raise

__all__ = ["main"]
