"""What an algorithm may ask of a run: its checkpoint interface, and scratch locations.

A solver resumes stage by stage through a :class:`Checkpoint` (a run group implements it:
:class:`dr_dask.runs.group.RunGroup`), never through the run group itself, so the algorithms do not
depend on how or where runs are stored. A stage writes its data first and calls
:meth:`Checkpoint.mark_done` last; a rerun skips the stages marked done.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import uuid
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from dr_dask.io.storage import Location, location

if TYPE_CHECKING:
    from dr_dask.io.inputs import InputData

logger = logging.getLogger(__name__)


class Checkpoint(Protocol):
    """The stages and small arrays of one resumable run."""

    @property
    def path(self) -> str:
        """Where the run is (for messages)."""
        ...

    def is_done(self, stage: str) -> bool:
        """Whether ``stage`` was marked done."""
        ...

    def mark_done(self, stage: str, **info: Any) -> None:
        """Record ``stage`` as done (with JSON-able ``info``); call after its data is written."""
        ...

    def stage_info(self, stage: str) -> dict:
        """The ``info`` recorded with ``stage``."""
        ...

    def write(self, name: str, values: np.ndarray, dims: tuple, attrs: dict | None = None) -> None:
        """Write a small array of the run in one go."""
        ...

    def read(self, name: str) -> np.ndarray:
        """Read a small array of the run."""
        ...

    def child(self, name: str) -> Location:
        """The location of the run's array ``name`` (written by the workers)."""
        ...

    def note_cache(self, name: str) -> None:
        """Record array ``name`` as a cache a rerun resumes from (dropped on request)."""
        ...


def _scratch_location(name: str, run: Checkpoint | None, where: Any, inp: InputData | None,
                      keep: bool) -> Location:
    """Where :func:`scratch` and :func:`kept_scratch` put the array ``name``."""
    unique = f"dr_dask_{name}_{uuid.uuid4().hex[:12]}"
    if run is not None:
        if keep:
            run.note_cache(name)
        return run.child(name)
    if where is not None:
        return location(where).child(unique)
    if inp is not None and inp.location is not None and not inp.location.is_local:
        parent = inp.location.url.rstrip("/").rsplit("/", 1)[0]
        return location(parent, inp.location.storage_options).child(unique)
    return location(tempfile.mkdtemp(prefix=f"{unique}_"))


def kept_scratch(name: str, run: Checkpoint | None = None, where: Any = None,
                 inp: InputData | None = None) -> Location:
    """A location as :func:`scratch` picks it, for an array the fitted estimator keeps
    reading (landmark geodesics above the in-memory budget, which ``transform`` needs).

    In a run it is the run's array ``name`` (a cache of the run). Elsewhere it lives as long
    as the object the caller ties it to with :func:`delete_with` (a copy of the estimator
    unpickled elsewhere reads it while the original lives).
    """
    loc = _scratch_location(name, run, where, inp, keep=True)
    logger.info("%s kept at %s for transform", name, loc)
    return loc


@contextlib.contextmanager
def deleted_on_failure(delete: Callable[[], Any] | None) -> Iterator[None]:
    """A fit's block after it made something of its own outside this process's memory (rows
    staged for its workers, an array its estimator will read): if the block raises (a
    KeyboardInterrupt too), ``delete`` (None: nothing) runs at once; if it returns, what it
    would delete is kept. A failed fit's traceback holds its frames for as long as the session
    keeps the error (IPython keeps the last one), and with them what the fit made: a temporary
    store up to the input's size, or 4 GB of landmark rows at T=10^6, which nothing else
    would delete."""
    try:
        yield
    except BaseException:
        if delete is not None:
            delete()
        raise


def unkept(loc: Location | None, run: Checkpoint | None = None) -> Callable[[], Any] | None:
    """What deletes a :func:`kept_scratch` location that a failed fit never handed to
    :func:`delete_with` (for :func:`deleted_on_failure`): nothing for no location or a run's
    array (the run keeps it, as there)."""
    return None if loc is None or run is not None else loc.delete


def delete_with(owner: Any, loc: Location, run: Checkpoint | None = None) -> None:
    """Delete ``loc`` once ``owner`` is garbage-collected (not a run's array: the run keeps
    it)."""
    if run is None:
        weakref.finalize(owner, loc.delete)


@contextlib.contextmanager
def scratch(name: str, run: Checkpoint | None = None, where: Any = None,
            inp: InputData | None = None, *, keep: bool = False) -> Iterator[Location]:
    """The location of a stage's worker-written Zarr array, deleted when the stage ends.

    It must be reachable by every worker, not only by this process: the run's array ``name``
    when there is a run (kept with ``keep``: a cache a rerun resumes from), else a unique
    location under ``where`` (an estimator's ``scratch`` parameter), else next to a remote
    input (the workers read it, so they reach its bucket), else a local temporary directory
    (client and workers share this machine's disk).

    Parameters
    ----------
    name : str
        The array's name in the run (part of the temporary name otherwise).
    run : Checkpoint, optional
    where : str or Location, optional
    inp : InputData, optional
    keep : bool
        Keep the run's array after the stage, noted as a cache of the run.
    """
    loc = _scratch_location(name, run, where, inp, keep)
    logger.debug("scratch for %s: %s", name, loc)
    try:
        yield loc
    finally:
        if not (keep and run is not None):
            loc.delete()
