"""Shared benchmark plumbing: medians of repeats, peak RSS of the whole process tree, reports.

Timings on a shared 2-core machine are noisy, so every benchmark reports the median of its
repeats and compares against a baseline measured in the same run (a ratio), never an absolute
figure alone.
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil

from dr_dask.report import plain_json

logger = logging.getLogger(__name__)


def tree_rss(proc: psutil.Process | None = None) -> int:
    """Resident set size in bytes of a process and all its descendants (e.g. dask workers)."""
    proc = proc or psutil.Process()
    total = 0
    for p in [proc, *proc.children(recursive=True)]:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total


@dataclass
class PeakRSS:
    """Samples :func:`tree_rss` in a background thread; ``peak`` is the maximum seen (bytes)."""

    interval: float = 0.05
    peak: int = 0
    _stop: threading.Event = field(default_factory=threading.Event)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, tree_rss())
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakRSS:
        self.peak = tree_rss()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, tree_rss())

    @property
    def peak_gb(self) -> float:
        return self.peak / 1e9


@contextlib.contextmanager
def timed() -> Iterator[dict]:
    """``with timed() as t: ...`` then ``t["seconds"]``."""
    out: dict = {}
    t0 = time.perf_counter()
    try:
        yield out
    finally:
        out["seconds"] = time.perf_counter() - t0


def median_time(fn: Callable[[], Any], repeats: int = 3) -> tuple[float, Any]:
    """Median wall time of ``repeats`` calls of ``fn`` and the last result."""
    times, result = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), result


def write_report(results: dict, path: str | None) -> str:
    """Render ``results`` as indented JSON, optionally write it to ``path``, and return it."""
    text = json.dumps(plain_json(results), indent=2)
    if path:
        with open(path, "w") as fh:
            fh.write(text + "\n")
    return text


def dataset_store(workdir: str, name: str, T: int, N: int,
                  **options: Any) -> tuple[str, np.ndarray]:
    """A chunked Zarr store of the generator in ``workdir`` (reused across cases): its
    ``STORE:X`` source and the latent."""
    import zarr

    from dr_dask.datasets import make_dataset

    path = os.path.join(workdir, f"{name}_T{T}_N{N}.zarr")
    if not os.path.exists(path):
        make_dataset(name, path, n_samples=T, n_features=N, random_state=0,
                     chunk_size=min(T, 50_000), **options)
    return path + ":X", np.asarray(zarr.open_group(path, mode="r")["latent"][...])


def timed_fits(make: Callable[[], Any], data: Any, repeats: int) -> tuple[float, float, Any]:
    """Median wall time, peak process-tree RSS (GB) and the last fitted estimator."""
    times, peak, est = [], 0.0, None
    for _ in range(repeats):
        gc.collect()
        est = make()
        with PeakRSS() as mem:
            t0 = time.perf_counter()
            est.fit(data)
            times.append(time.perf_counter() - t0)
        peak = max(peak, mem.peak_gb)
    return statistics.median(times), peak, est
