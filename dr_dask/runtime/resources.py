"""Resource measurement: wall time and peak resident memory of the process tree.

The one place that times and samples memory: the estimators' ``timings_`` (stage -> seconds),
``dr-dask evaluate``/``compare`` and every benchmark use it. Memory is the resident set of this
process *and its descendants*, because a LocalCluster's workers are child processes: the
driver's RSS alone would miss where an out-of-core fit actually holds its data.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Self

import psutil

from dr_dask.runtime import progress

logger = logging.getLogger(__name__)


def tree_rss(proc: psutil.Process | None = None) -> int:
    """Resident set size in bytes of a process (default this one) and all its descendants."""
    proc = proc or psutil.Process()
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):  # a child may exit while we look
            total += p.memory_info().rss
    return total


@dataclass
class PeakRSS:
    """``with PeakRSS() as mem: ...`` then ``mem.peak`` (bytes) / ``mem.peak_gb``.

    Samples :func:`tree_rss` every ``interval`` seconds in a background thread, and once on
    entry and on exit, so even a block shorter than the interval is measured.
    """

    interval: float = 0.05
    peak: int = 0
    #: This process alone (the client of a cluster whose workers are its children).
    own_peak: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def sample(self) -> None:
        """One sample (a subclass may sample other processes)."""
        self.peak = max(self.peak, tree_rss())
        self.own_peak = max(self.own_peak, psutil.Process().memory_info().rss)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.sample()

    def __enter__(self) -> Self:
        self._stop.clear()
        self.peak = self.own_peak = 0
        self.sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.sample()

    @property
    def peak_gb(self) -> float:
        return self.peak / 1e9


@contextlib.contextmanager
def timed(into: dict | None = None, key: str = "seconds") -> Iterator[dict]:
    """Wall time of a block: ``with timed(timings, "graph"): ...`` sets ``timings["graph"]``.

    Yields the dict it writes to (a new one when ``into`` is None), so ``with timed() as t``
    then ``t["seconds"]`` works too. The time is recorded even when the block raises.
    """
    out = {} if into is None else into
    if into is not None:
        progress.stage(key)  # a fit's stage: its bar names it
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        out[key] = time.perf_counter() - t0


@dataclass
class Measurement:
    """What :func:`measure` found: median seconds, every repeat's seconds, peak process-tree
    RSS over all repeats (GB; 0 when not sampled) and the last call's result."""

    seconds: float
    times: list[float]
    peak_rss_gb: float
    result: Any
    #: Of this process alone (the client, when the workers are its children).
    client_peak_gb: float = 0.0


def measure(fn: Callable[[], Any], repeats: int = 1, rss: bool = True) -> Measurement:
    """Call ``fn`` ``repeats`` times: the median wall time and the peak RSS of the process tree.

    Benchmarks on a shared machine are noisy: they report the median of repeats, against a
    baseline measured in the same run. ``rss=False`` skips the sampling thread (for timings of
    a few milliseconds, where it would perturb the figure).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    times: list[float] = []
    peak, own, result = 0.0, 0.0, None
    for _ in range(repeats):
        result = None  # the previous result must not count in this repeat's memory
        gc.collect()
        with PeakRSS() if rss else contextlib.nullcontext() as mem, timed() as t:
            result = fn()
        times.append(t["seconds"])
        if mem is not None:
            peak, own = max(peak, mem.peak_gb), max(own, mem.own_peak / 1e9)
    return Measurement(statistics.median(times), times, peak, result, own)
