"""Progress bars where the user is: a widget in Jupyter, text on a terminal, nothing in a pipe.

An estimator's ``progress=True`` opens :func:`scope` around its fit; every computation of the
fit that goes through :func:`dr_dask.runtime.cluster.compute` /
:func:`~dr_dask.runtime.cluster.gather` then draws a bar, chosen by :func:`output`:

- ``"notebook"``: the process is a Jupyter kernel (IPython's shell runs under ``IPKernelApp``,
  the test tqdm's own ``tqdm.autonotebook`` makes): tqdm's notebook bar (``tqdm.auto``) for
  dask's threads, distributed's progress widget on a cluster;
- ``"terminal"``: stderr is a terminal: tqdm's text bar on stderr, or distributed's text bar
  redirected to stderr (stdout holds results only);
- ``None``: anything else (a pipe, a file, a CI log): nothing, so redirected output stays free
  of escape codes.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import sys
from collections.abc import Callable, Iterator
from typing import Any

from distributed import progress as dprogress

logger = logging.getLogger(__name__)

_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar("dr_dask_progress",
                                                                default=False)

__all__ = ["enabled", "in_notebook", "output", "scope", "shown_during"]


def in_notebook() -> bool:
    """True inside a Jupyter kernel (an IPython shell configured by ``IPKernelApp``)."""
    ipython = sys.modules.get("IPython")  # never imported here: a kernel has it already
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and "IPKernelApp" in getattr(shell, "config", {})


def output(stream: Any = None) -> str | None:
    """Where a bar would go: ``"notebook"``, ``"terminal"`` (``stream``, default stderr, is a
    terminal) or None (draw nothing)."""
    if in_notebook():
        return "notebook"
    stream = sys.stderr if stream is None else stream
    try:
        return "terminal" if stream.isatty() else None
    except (AttributeError, ValueError):  # no isatty, or closed
        return None


@contextlib.contextmanager
def scope(on: bool) -> Iterator[None]:
    """Bars on (``on``) or off for the computations inside (an estimator's fit)."""
    token = _ENABLED.set(bool(on))
    try:
        yield
    finally:
        _ENABLED.reset(token)


def shown_during(fit: Callable) -> Callable:
    """Decorator of an estimator's ``fit``: bars on while it runs if its ``progress`` is."""
    @functools.wraps(fit)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        with scope(getattr(self, "progress", False)):
            return fit(self, *args, **kwargs)

    return wrapped


def enabled(progress: bool | None = None) -> bool:
    """An explicit ``progress`` argument, else the enclosing :func:`scope`'s setting."""
    return _ENABLED.get() if progress is None else bool(progress)


@contextlib.contextmanager
def local_bar(progress: bool | None = None) -> Iterator[None]:
    """A tqdm bar over the dask tasks computed inside (threaded scheduler), where
    :func:`output` says; nothing otherwise."""
    where = output() if enabled(progress) else None
    if where is None:
        yield
        return
    from tqdm.auto import tqdm as auto_tqdm  # lazy: not on workers (__init__)
    from tqdm.dask import TqdmCallback  # lazy: not on workers (__init__)

    if where == "notebook":
        callback = TqdmCallback(tqdm_class=auto_tqdm, desc="dr-dask")
    else:
        callback = TqdmCallback(desc="dr-dask", file=sys.stderr)
    with callback:
        yield


def cluster_bar(futures: list, client: Any, progress: bool | None = None) -> None:
    """distributed's progress of ``futures`` where :func:`output` says: its widget in a
    notebook (returns at once), its text bar on stderr on a terminal (until they finish)."""
    where = output() if enabled(progress) else None
    if where is None:
        return
    with client.as_current():
        if where == "notebook":
            try:
                dprogress(futures, notebook=True)
                return
            except ImportError as exc:  # no ipywidgets: text in the cell's stderr instead
                logger.info("no progress widget (%s); drawing text", exc)
        with contextlib.redirect_stdout(sys.stderr):
            dprogress(futures, notebook=False)
