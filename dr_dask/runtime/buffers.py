"""Scratch buffers that a thread keeps from call to call, and large results mapped in at once.

distributed's nannies start workers with ``MALLOC_TRIM_THRESHOLD_`` set, and setting it also
fixes glibc's mmap threshold at its 128 KiB floor: on a worker every larger temporary is
fresh pages from the system, zeroed on first touch and handed back when freed. A loop that
makes one per chunk spends its time in page faults (the eigensolver's passes over in-memory
tiles and the Dijkstra strips ran slower on a LocalCluster's workers than on dask's threads:
docs/scaling.md, "Measurements behind the code's thresholds"). Hot loops over chunks take a
buffer of their thread's instead.

What a thread keeps is bounded by :data:`KEEP_BYTES` per name (a handful of names, most far
smaller: a row chunk, a tile of inner products); threads that end take theirs with them, as
the pool of each computation on dask's threads does.
"""

from __future__ import annotations

import math
import mmap
import threading
from typing import Any

import numpy as np

#: Largest buffer a thread keeps: a larger one would hold its memory into later stages, and
#: the page faults of an array that size are small against the work that fills it.
KEEP_BYTES = 64 << 20

_local = threading.local()


def thread_buffer(name: str, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised array of ``shape`` and ``dtype`` in this thread's buffer ``name``.

    The buffer grows to the largest request up to :data:`KEEP_BYTES` (beyond, each request
    gets a fresh array) and is kept; the array is valid until the same thread asks for
    ``name`` again, so a caller never lets it escape its loop.
    """
    size = math.prod(shape)
    if size * np.dtype(dtype).itemsize > KEEP_BYTES:
        return np.empty(shape, dtype)
    buf = getattr(_local, name, None)
    if buf is None or buf.dtype != dtype or buf.size < size:
        buf = np.empty(size, dtype)
        setattr(_local, name, buf)
    return buf[:size].reshape(shape)


def populated(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A new uninitialised array of ``shape`` and ``dtype`` whose pages are mapped in one
    system call (Linux's ``MAP_POPULATE``; elsewhere ``np.empty``), for a large result that is
    then written whole, in pieces: a T x T matrix mirrored block by block.

    ``np.empty`` asks for transparent huge pages above 4 MB, and the kernel then maps each one
    on first touch: filling 800 MB took 0.26-1.5 s from run to run (a 2-core VM) against 0.23-0.25 s
    populated (in 4 KiB pages, which the writes that follow do not notice); and at T=10^4 on
    a LocalCluster the copies of the shortest paths into that array took 1.9-2.4 s against
    0.21-0.27 s. The memory is freed with the array, as ``np.empty``'s.
    """
    size = math.prod(shape) * np.dtype(dtype).itemsize
    flag = getattr(mmap, "MAP_POPULATE", None)
    if flag is None or size == 0:
        return np.empty(shape, dtype)
    try:
        pages = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | flag)
    except OSError as exc:  # as np.empty says it
        raise MemoryError(f"cannot allocate {size / 1e9:.2f} GB for an array of shape "
                          f"{shape}") from exc
    return np.frombuffer(pages, dtype).reshape(shape)
