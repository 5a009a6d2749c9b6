"""Progress bars where the user is: a widget in Jupyter, text on a terminal, nothing in a pipe.

An estimator's ``progress=True`` opens one bar for its whole fit (:func:`shown_during`), named
after the estimator and the stage it is in (``dr-dask IKD: tiles``: each ``resources.timed``
stage renames it, :func:`stage`). Every computation of the fit that goes through
:func:`dr_dask.runtime.cluster.compute` / :func:`~dr_dask.runtime.cluster.gather` adds its work to
that bar: its tasks on dask's threads, its futures on a cluster (distributed reports the finished
futures it gathers, not their inner tasks). A fit run inside another (GP-Isomap's Isomap per
manifold) feeds the outer fit's bar. Outside a fit, ``progress=True`` on a computation draws a
bar of its own. Where bars go is :func:`output`'s choice:

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

__all__ = ["enabled", "in_notebook", "output", "scope", "shown_during", "stage"]


class FitBar:
    """The one bar of a fit: its total grows with each computation's work, its description
    names the estimator and the current stage."""

    def __init__(self, name: str, where: str):
        if where == "notebook":
            from tqdm.auto import tqdm as bar_class  # lazy: not on workers (__init__)

            self.bar = bar_class(total=0, desc=f"dr-dask {name}", unit="task")
        else:
            from tqdm import tqdm  # lazy: not on workers (__init__)

            self.bar = tqdm(total=0, desc=f"dr-dask {name}", unit="task", file=sys.stderr)
        self.name = name

    def stage(self, name: str) -> None:
        self.bar.set_description(f"dr-dask {self.name}: {name}", refresh=True)

    def add(self, n: int) -> None:
        """More work to do."""
        self.bar.total += int(n)
        self.bar.refresh()

    def done(self, n: int = 1) -> None:
        self.bar.update(int(n))

    def close(self) -> None:
        self.bar.close()


_BAR: contextvars.ContextVar[FitBar | None] = contextvars.ContextVar("dr_dask_fit_bar",
                                                                     default=None)


def stage(name: str) -> None:
    """Name the stage the running fit is in on its bar (nothing without one)."""
    bar = _BAR.get()
    if bar is not None:
        bar.stage(name)


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
    """Decorator of an estimator's ``fit``: one bar for the whole fit if its ``progress`` is
    on (and :func:`output` has somewhere to draw it); a fit inside another's feeds that one."""
    @functools.wraps(fit)
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _BAR.get() is not None:  # inside a fit with a bar: its work goes there
            return fit(self, *args, **kwargs)
        on = bool(getattr(self, "progress", False))
        where = output() if on else None
        with scope(on):
            if where is None:
                return fit(self, *args, **kwargs)
            bar = FitBar(type(self).__name__, where)
            token = _BAR.set(bar)
            try:
                return fit(self, *args, **kwargs)
            finally:
                _BAR.reset(token)
                bar.close()

    return wrapped


def enabled(progress: bool | None = None) -> bool:
    """An explicit ``progress`` argument, else the enclosing :func:`scope`'s setting."""
    return _ENABLED.get() if progress is None else bool(progress)


@contextlib.contextmanager
def local_bar(progress: bool | None = None) -> Iterator[None]:
    """A tqdm bar over the dask tasks computed inside (threaded scheduler), where
    :func:`output` says; nothing otherwise."""
    bar = _BAR.get()
    if bar is not None and progress is not False:
        with _feed(bar):
            yield
        return
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


def _feed(bar: FitBar) -> Any:
    """A dask callback adding a threaded computation's tasks to the fit's bar."""
    from dask.callbacks import Callback  # lazy: not on workers (__init__)

    class Feed(Callback):
        def _start_state(self, dsk: Any, state: dict) -> None:
            bar.add(sum(len(state[k]) for k in ("ready", "waiting", "running", "finished")))

        def _posttask(self, *args: Any) -> None:
            bar.done()

    return Feed()


def cluster_bar(futures: list, client: Any, progress: bool | None = None) -> None:
    """Progress of ``futures``: inside a fit with a bar, added to it (each counted as it
    finishes); else distributed's progress where :func:`output` says: its widget in a
    notebook (returns at once), its text bar on stderr on a terminal (until they finish)."""
    bar = _BAR.get()
    if bar is not None and progress is not False:
        bar.add(len(futures))
        for future in futures:
            future.add_done_callback(lambda _: bar.done())
        return
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
