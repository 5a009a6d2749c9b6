"""Tuning knobs: dr_dask's entries of dask's configuration (defaults in ``dr_dask.yaml``).

Read them at the time of use (never into a module constant), so ``dask.config.set`` applies
to the next call, in tests as in a notebook.
"""

from __future__ import annotations

import pathlib
from typing import Any

import dask.config
import yaml
from dask.utils import parse_bytes, parse_timedelta

with open(pathlib.Path(__file__).with_name("dr_dask.yaml")) as _fh:
    dask.config.update_defaults(yaml.safe_load(_fh))


def get(key: str) -> Any:
    """The value of ``dr_dask.<key>``, e.g. ``get("knn.cells-min-rows")``."""
    return dask.config.get(f"dr_dask.{key}")


def get_bytes(key: str) -> int:
    """A size (an int, or a string such as ``"64 MiB"``) in bytes."""
    return int(parse_bytes(get(key)))


def get_seconds(key: str) -> float:
    """A duration (a number of seconds, or a string such as ``"60s"``) in seconds."""
    return float(parse_timedelta(get(key), default="seconds"))
