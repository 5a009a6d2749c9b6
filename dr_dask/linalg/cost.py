"""What a T x T stage costs, said before it starts: its bytes, their place, an order of its time.

:func:`quadratic_cost` is the call every T x T stage (IKD tiles, Isomap geodesics, GP-Isomap's
manifolds) makes first: it logs the cost, warns (:class:`QuadraticCostWarning`) past
``dr_dask.quadratic.warn-bytes`` and refuses (:class:`ScratchSpaceError`) a local scratch without
room before anything is written. :func:`over_memory_budget` is the budget that decides whether a
fit keeps an array in memory or in a store.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import os
import shutil
import warnings
from collections.abc import Sequence
from typing import Any

from dr_dask.io.storage import Location, StorageError
from dr_dask.runtime import config

logger = logging.getLogger(__name__)


def over_memory_budget(nbytes: float) -> bool:
    """Whether an array of ``nbytes`` is above ``dr_dask.tiles.memory-bytes``, the budget of
    what a fit keeps in worker (or this process's) memory rather than in a store."""
    return nbytes > config.get_bytes("tiles.memory-bytes")


class QuadraticCostWarning(UserWarning):
    """A fit is about to make a T x T matrix above ``dr_dask.quadratic.warn-bytes``: its
    memory or scratch grows with the square of the rows. Filter it like any warning
    (``warnings.filterwarnings("ignore", category=QuadraticCostWarning)``)."""


class ScratchSpaceError(StorageError):
    """A T x T stage's scratch would not fit in the free space of its location. Raised
    before anything is written; bad configuration (exit 2): a rerun fails the same way."""


#: Set inside a caller that announced its own, larger stage (GP-Isomap's batch announces its
#: manifolds; the Isomap fit of each must not warn again with advice meant for Isomap).
_announced: contextvars.ContextVar[bool] = contextvars.ContextVar("quadratic_announced",
                                                                  default=False)


@contextlib.contextmanager
def quadratic_announced():
    """Inner T x T stages log at DEBUG and neither warn nor check space (the caller did)."""
    token = _announced.set(True)
    try:
        yield
    finally:
        _announced.reset(token)


def memory_of(client: Any) -> str:
    """Where a T x T stage's in-memory tiles are held, for :func:`quadratic_cost`."""
    return "worker memory" if client is not None else "this process's memory"


def _size(nbytes: float) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{int(nbytes)} B"


def _duration(seconds: float) -> str:
    if seconds < 60:
        return "under a minute"
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.0f} days"


def _local_usage(path: str) -> tuple[int, int]:
    """(free bytes of the filesystem holding ``path``, bytes already under ``path``)."""
    probe = path
    while not os.path.exists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    written = 0
    if os.path.isdir(path):  # a rerun resumes: what its first attempt wrote needs no space
        for root, _, files in os.walk(path):
            for f in files:
                with contextlib.suppress(OSError):
                    written += os.path.getsize(os.path.join(root, f))
    return shutil.disk_usage(probe).free, written


def quadratic_cost(what: str, T: int, parts: Sequence[tuple[float, Any]], *, way_out: str,
                   stacklevel: int = 2) -> None:
    """Say what a T x T stage will cost before it starts; refuse one whose scratch cannot fit.

    Logs (INFO) the bytes, where they go and an order of the time (the bytes at
    ``dr_dask.quadratic.throughput-bytes`` a second: the time to make the matrix once; an
    eigensolver reads it again on every pass). Past ``dr_dask.quadratic.warn-bytes`` it warns
    (:class:`QuadraticCostWarning`) with ``way_out``, the estimator's linear alternative. A
    local location whose filesystem has less free space than its part (less what a
    resumed stage already wrote there) raises :class:`ScratchSpaceError` before anything is
    written; an object store's free space is not known, and is not checked (the log says so).

    Parameters
    ----------
    what : str
        The stage, as the message names it ("IKD distance tiles").
    T : int
        Rows of the matrix.
    parts : sequence of (nbytes, where)
        Each array the stage makes: its bytes and its place, a
        :class:`~dr_dask.io.storage.Location` (scratch, a run's store) or a string naming
        a memory ("worker memory", "this process's memory").
    way_out : str
        What to use instead (a noun phrase: "use ..." is put before it).
    stacklevel : int
        Of the warning, counted from the caller.

    Raises
    ------
    ScratchSpaceError
        A local location's free space is below its part's bytes.
    """
    total = float(sum(n for n, _ in parts))
    rate = config.get_bytes("quadratic.throughput-bytes")
    places = ", ".join(f"{_size(n)} in {w}" for n, w in parts)
    seconds = total / max(rate, 1)
    message = (f"{what}: T={T:,} rows make a T x T matrix of {_size(total)} ({places}); "
               f"of the order of {_duration(seconds)} to make it once")
    if _announced.get():
        logger.debug("%s", message)
        return
    unchecked = []
    for nbytes, where in parts:
        if not isinstance(where, Location):
            continue
        if not where.is_local:
            unchecked.append(where.url)
            continue
        free, written = _local_usage(where.path)
        if nbytes - written > free:
            raise ScratchSpaceError(
                f"{what}: T={T:,} rows need {_size(nbytes - written)} "
                f"({int(nbytes - written):,} bytes) of scratch at {where.url}, which has "
                f"{_size(free)} ({free:,} bytes) free; nothing was written. Give a location "
                f"with room (the estimator's scratch parameter; a run's own arrays go in its "
                f"output store) or use {way_out}")
    logger.info("%s%s", message, f" (free space of {', '.join(unchecked)} not checked: an "
                "object store's is not known)" if unchecked else "")
    if total > config.get_bytes("quadratic.warn-bytes"):
        warnings.warn(f"{message}, above dr_dask.quadratic.warn-bytes. It grows with T^2: "
                      f"use {way_out}", QuadraticCostWarning, stacklevel=stacklevel + 1)
