"""What both jobs share: parameter checking and the stored input they read."""

from __future__ import annotations

import datetime as _dt
import logging

from dr_dask.io.inputs import InputData, InputError, open_dataset
from dr_dask.io.storage import Location

logger = logging.getLogger(__name__)


class JobIncomplete(RuntimeError):
    """A job ended with source rows it did not process (transient: a rerun goes on from its
    watermark)."""


def job_params(job: str, defaults: dict, given: dict, positive: tuple[str, ...] = ()) -> dict:
    """``defaults`` updated with ``given``; an unknown name or a value out of range is an
    :class:`InputError` naming the job, the parameter and the valid names or range."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise InputError(f"{job}: unknown parameter(s) {unknown}; valid: {sorted(defaults)}")
    params = {**defaults, **given}
    for name in positive:
        value = params[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"{job}: {name} must be an integer >= 1, got {value!r}")
    return params


def open_stored(source: str, variable: str | None, storage_options: dict | None,
                job: str) -> tuple[InputData, Location]:
    """The stored input (InputError when it is not a 2-D Zarr array or group variable) and the
    location of its Zarr array (what a job polls for appended rows)."""
    inp = open_dataset(source, variable, storage_options)
    loc = inp.location
    if loc is None:
        raise InputError(f"{job} reads a stored Zarr array (a path or URL), not an in-memory one")
    var = inp.identity.get("variable")
    arr = loc.child(*var.split("/")) if var else loc
    if not (arr.child("zarr.json").exists() or arr.child(".zarray").exists()):
        raise InputError(f"{job} reads an appendable Zarr array; {source!r} is not one")
    return inp, arr


def now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
