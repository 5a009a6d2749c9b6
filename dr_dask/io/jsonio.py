"""JSON reports: what a report's table shows, as values a script can read back.

The pictures are drawn by :mod:`dr_dask.report.plot`.
"""

from __future__ import annotations

import json
import logging
import math
from typing import Any

import numpy as np

from dr_dask.io.storage import location

logger = logging.getLogger(__name__)


def write_json(results: dict, path: Any) -> str:
    """Write ``results`` as indented JSON (NumPy values converted) to ``path`` (a local path,
    URL or :class:`~dr_dask.io.storage.Location`) and return where it went."""
    loc = location(path)
    loc.write_bytes((json.dumps(plain_json(results), indent=2) + "\n").encode())
    return loc.url


def plain_json(obj: Any) -> Any:
    """``obj`` with NumPy scalars and arrays as Python values, non-finite floats as None, dict
    keys as strings and any other object as its ``str``: what ``json`` can write and read back
    unchanged (run attributes, reports)."""
    if isinstance(obj, dict):
        return {str(k): plain_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain_json(v) for v in obj]
    if isinstance(obj, np.ndarray):
        return plain_json(obj.tolist())
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None  # JSON has no NaN/inf
    if obj is None or isinstance(obj, (str, bool, int, float)):
        return obj
    return str(obj)
