"""Scratch buffers that a thread keeps from call to call.

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
