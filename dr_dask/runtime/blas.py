"""BLAS thread control: one BLAS thread while small kernels run beside dask's own threads.

Dask already runs one task per core (threads, or worker processes); a multithreaded BLAS call
inside each task only makes the cores contend. :func:`single_blas_thread` limits BLAS to one thread
while any caller in this process is inside it, as a context manager or a decorator::

    with single_blas_thread():
        ...

    @single_blas_thread()
    def task(...): ...

The limit is process-wide (OpenBLAS's pthreads pool is shared by all threads), so it is
reference-counted: the first caller sets it, the last one out restores the previous count,
and callers that overlap (two dask threads) never see it lifted under them. A loop of many
short calls should hold one outer scope (the stream runner does, for its whole run): lifting
the limit wakes OpenBLAS's pool, whose threads then spin on the cores for a while.

Only threadpoolctl's public API is used. For OpenBLAS's pthreads pool threadpoolctl lets only
one "controlling" thread change the limit and silently ignores the others; here the first
and the last caller may be different dask threads, so each change takes control explicitly
(``OpenBLASController.clear_controlling_thread``) under this module's lock.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Iterator
from typing import Any

from threadpoolctl import OpenBLASController, ThreadpoolController

logger = logging.getLogger(__name__)

_LOCK = threading.Lock()
_USERS = 0
_LIMITER: Any = None


@functools.cache
def _controller() -> ThreadpoolController:
    # scanning the loaded libraries is not free: once per process
    return ThreadpoolController()


def _take_control() -> None:
    OpenBLASController.clear_controlling_thread(force=True)


@contextlib.contextmanager
def single_blas_thread() -> Iterator[None]:
    """Limit BLAS to one thread in this process while any caller is inside.

    Usable as ``with single_blas_thread():`` or as a decorator ``@single_blas_thread()``.
    """
    global _USERS, _LIMITER
    with _LOCK:
        if _USERS == 0:
            _take_control()
            _LIMITER = _controller().limit(limits=1, user_api="blas")
        _USERS += 1
    try:
        yield
    finally:
        with _LOCK:
            _USERS -= 1
            if _USERS == 0:
                _take_control()
                _LIMITER.restore_original_limits()
                _LIMITER = None


def blas_threads() -> list[int]:
    """The current thread count of every BLAS library loaded in this process."""
    return [lib.num_threads for lib in _controller().lib_controllers if lib.user_api == "blas"]
