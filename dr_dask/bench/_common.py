"""Shared benchmark plumbing: reports, reusable dataset stores, fits measured.

Timings and memory come from :mod:`dr_dask.runtime.resources`. On a shared 2-core machine they are
noisy, so every benchmark reports the median of its repeats and compares against a baseline
measured in the same run (a ratio), never an absolute figure alone.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Self

import numpy as np
import psutil

from dr_dask.io.jsonio import plain_json
from dr_dask.io.storage import read_array
from dr_dask.runtime.cluster import run_on_workers
from dr_dask.runtime.resources import Measurement, PeakRSS, measure

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def bench_workdir(workdir: str | None, name: str) -> Iterator[str]:
    """Where a benchmark writes its datasets and stores: ``workdir`` (kept), else a temporary
    directory removed when the benchmark ends, also on failure."""
    if workdir is not None:
        os.makedirs(workdir, exist_ok=True)
        yield workdir
        return
    made = tempfile.mkdtemp(prefix=f"dr_dask_bench_{name}_")
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def n_workers(client: Any) -> int:
    """Workers of the cluster, or threads of dask's threaded scheduler (``client`` None)."""
    if client is not None:
        return len(client.nthreads())
    import dask

    return int(dask.config.get("num_workers", None) or os.cpu_count() or 1)


def write_report(results: dict, path: str | None) -> str:
    """Render ``results`` as indented JSON, optionally write it to ``path``, and return it."""
    text = json.dumps(plain_json(results), indent=2)
    if path:
        with open(path, "w") as fh:
            fh.write(text + "\n")
    return text


def dataset_store(workdir: str, name: str, T: int, N: int,
                  **options: Any) -> tuple[str, np.ndarray]:
    """A chunked Zarr store of the generator in ``workdir`` (reused across cases with the same
    options): its ``STORE:X`` source and the latent."""
    import zarr

    from dr_dask.datasets import make_dataset

    # the options name the store: the same generator at another noise is another dataset
    given = "".join(f"_{key}{value}" for key, value in sorted(options.items()))
    path = os.path.join(workdir, f"{name}_T{T}_N{N}{given}.zarr")
    if not os.path.exists(path):
        make_dataset(name, path, n_samples=T, n_features=N, random_state=0,
                     chunk_size=min(T, 50_000), **options)
    return path + ":X", read_array(zarr.open_group(path, mode="r"), "latent")


def dataset_arrays(workdir: str, name: str, T: int, N: int,
                   **options: Any) -> tuple[np.ndarray, np.ndarray]:
    """The rows and the latent of :func:`dataset_store`'s store, read into memory."""
    import zarr

    src, latent = dataset_store(workdir, name, T, N, **options)
    X = read_array(zarr.open_group(src.rsplit(":", 1)[0], mode="r"), "X")
    return X, latent


def release_memory(client: Any = None) -> None:
    """Give memory that earlier fits freed back to the OS, here and on every worker: a
    collection, then glibc's ``malloc_trim`` (distributed's advice for unmanaged memory).
    Without it a fit's peak RSS counts the heaps of the fits before it in the same run."""

    def trim() -> None:
        import ctypes
        import ctypes.util
        import gc

        gc.collect()
        libc = ctypes.util.find_library("c")
        if libc and hasattr(ctypes.CDLL(libc), "malloc_trim"):
            ctypes.CDLL(libc).malloc_trim(0)

    trim()
    if client is not None:
        run_on_workers(client, trim)


def timed_fits(make: Callable[[], Any], data: Any, repeats: int,
               client: Any = None) -> Measurement:
    """Median wall time, peak RSS (GB) of the process tree and of this process, of
    ``make().fit(data)``, and the last fitted estimator (a fresh estimator per repeat), after
    :func:`release_memory`."""
    release_memory(client)
    return measure(lambda: make().fit(data), repeats)


class PeakRSSEach(PeakRSS):
    """``with PeakRSSEach({"client": pid, ...}) as mem: ...`` then ``mem.start[name]`` and
    ``mem.peaks[name]`` (bytes): each named process's own resident set (not its children's)
    when the block began and its peak during it; ``mem.peak``: the peak of their sum.

    Where :class:`PeakRSS` measures a whole process tree, this tells the processes apart (the
    largest worker's peak, the client's), sampled as often.
    """

    def __init__(self, pids: Mapping[str, int], interval: float = 0.05):
        super().__init__(interval)
        self._procs = {name: psutil.Process(pid) for name, pid in pids.items()}
        self.start: dict[str, int] = {}
        self.peaks: dict[str, int] = {}

    def sample(self) -> None:
        now = {}
        for name, proc in self._procs.items():
            with contextlib.suppress(psutil.Error):  # a worker may exit while we look
                now[name] = proc.memory_info().rss
                self.peaks[name] = max(self.peaks.get(name, 0), now[name])
        self.peak = max(self.peak, sum(now.values()))

    def __enter__(self) -> Self:
        self.peaks = {}
        self.sample()
        self.start = dict(self.peaks)  # before the sampling thread starts
        return super().__enter__()
