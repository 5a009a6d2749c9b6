"""Tuning knobs: dr_dask's entries of dask's configuration (defaults in ``dr_dask.yaml``).

Read them at the time of use (never into a module constant), so ``dask.config.set`` applies
to the next call, in tests as in a notebook.
"""

from __future__ import annotations

import math
import numbers
import pathlib
from typing import Any

import dask.config
import yaml
from dask.utils import parse_bytes, parse_timedelta

with open(pathlib.Path(__file__).with_name("dr_dask.yaml")) as _fh:
    _DEFAULTS = yaml.safe_load(_fh)
dask.config.update_defaults(_DEFAULTS)


def get(key: str) -> Any:
    """The value of ``dr_dask.<key>``, e.g. ``get("knn.cells-min-rows")``.

    A knob whose default is a number must be a number of the same kind (an integer where
    the default is one), non-negative and finite: else ValueError naming the key, at the
    first call that reads it.
    """
    value = dask.config.get(f"dr_dask.{key}")
    default = dask.config.get(key, config=_DEFAULTS["dr_dask"])
    if isinstance(default, numbers.Number) and not isinstance(default, bool):
        kind = numbers.Integral if isinstance(default, numbers.Integral) else numbers.Real
        if (not isinstance(value, kind) or isinstance(value, bool) or not math.isfinite(value)
                or value < 0):
            raise ValueError(f"dask configuration dr_dask.{key} = {value!r}: expected a "
                             f"non-negative {'integer' if kind is numbers.Integral else 'number'}"
                             f" (default {default!r})")
    return value


def get_bytes(key: str) -> int:
    """A size (an int, or a string such as ``"64 MiB"``) in bytes."""
    return _parsed(key, lambda value: int(parse_bytes(value)), "a size such as '64 MiB'")


def get_seconds(key: str) -> float:
    """A duration (a number of seconds, or a string such as ``"60s"``) in seconds."""
    return _parsed(key, _seconds, "a duration such as '60s'")


def _seconds(value: Any) -> float:
    seconds = parse_timedelta(value, default="seconds")
    return float("nan") if seconds is None else float(seconds)


def _parsed(key: str, parse: Any, expected: str) -> Any:
    value = get(key)
    try:
        parsed = parse(value)
    except (TypeError, ValueError, KeyError):
        parsed = -1
    if not parsed >= 0:  # NaN too
        raise ValueError(f"dask configuration dr_dask.{key} = {value!r}: expected {expected}")
    return parsed


def check() -> None:
    """Every knob read as its default's kind (:func:`get`, :func:`get_bytes` for the
    ``*-bytes`` sizes, :func:`get_seconds` for the other strings, all durations): a bad one
    raises ValueError naming it."""
    def leaves(tree: dict, prefix: str = "") -> Any:
        for name, value in tree.items():
            if isinstance(value, dict):
                yield from leaves(value, f"{prefix}{name}.")
            else:
                yield f"{prefix}{name}", value

    for key, default in leaves(_DEFAULTS["dr_dask"]):
        if not isinstance(default, str):
            get(key)
        elif key.endswith("bytes"):
            get_bytes(key)
        else:
            get_seconds(key)
