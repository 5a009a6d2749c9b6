"""What a run moves: the bytes of task specs the scheduler ships, and the store's requests.

Two counters for the benches and the cluster tests, each installed on a real cluster:

- :class:`SpecBytes`, a scheduler plugin: every task that starts processing has its spec
  (``run_spec``: the function and its arguments, arrays inlined in it included) pickled and
  counted under its prefix (dask's ``key_split``). A large input shared as one key
  (``dask.delayed(value, traverse=False)``, a future) is counted once, in its own task; inlined
  in the specs it is counted once per task.
- :class:`StoreReads`, a worker plugin (and :func:`count_reads` in this process): every read of
  a local Zarr store (``LocalStore.get``) is counted under the name of the array it reads, with
  its bytes, so that a stage's reads can be compared with the bytes it uses and extrapolated to
  an object store's request rates.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin
from distributed.protocol.pickle import dumps
from distributed.utils import key_split

from dr_dask.runtime.cluster import run_on_workers

logger = logging.getLogger(__name__)

#: Array names counted apart (the last of these in a chunk's path names it).
ARRAYS = ("staging", "offsets", "lists", "edges", "roots", "graph", "paths", "X")


class SpecBytes(SchedulerPlugin):
    """Pickled bytes of every task spec the scheduler sends, per task prefix: ``totals``
    (prefix -> [tasks, bytes, largest])."""

    name = "dr-dask-spec-bytes"

    def __init__(self) -> None:
        self.totals: dict[str, list[int]] = {}
        self.scheduler: Any = None

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        if finish != "processing":
            return
        ts = self.scheduler.tasks.get(key)
        if ts is None or ts.run_spec is None:
            return
        n = len(dumps(ts.run_spec))
        t = self.totals.setdefault(key_split(key), [0, 0, 0])
        t[0], t[1], t[2] = t[0] + 1, t[1] + n, max(t[2], n)

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler


def spec_bytes(client: Any) -> dict[str, list[int]]:
    """The counts of the :class:`SpecBytes` registered on ``client``'s scheduler, reset."""

    def take(dask_scheduler: Any) -> dict:
        plugin = dask_scheduler.plugins[SpecBytes.name]
        out, plugin.totals = plugin.totals, {}
        return out

    return client.run_on_scheduler(take)


_LOCK = threading.Lock()
_READS: dict[str, list[int]] = defaultdict(lambda: [0, 0])


def _array_of(path: str) -> str:
    parts = path.replace("\\", "/").split("/")
    for p in reversed(parts):
        if p in ARRAYS:
            return p
    return "other"


def _install() -> None:
    """Count every ``LocalStore.get`` of this process (once)."""
    import zarr.storage

    store = zarr.storage.LocalStore
    if getattr(store.get, "_dr_dask_counted", False):
        return
    original = store.get

    async def get(self: Any, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
        buf = await original(self, key, prototype, byte_range)
        if buf is not None and "/c/" in f"/{key}":  # chunks, not metadata
            with _LOCK:
                r = _READS[_array_of(f"{self.root}/{key}")]
                r[0] += 1
                r[1] += len(buf)
        return buf

    get._dr_dask_counted = True  # type: ignore[attr-defined]
    store.get = get  # type: ignore[method-assign]


def take_reads() -> dict[str, list[int]]:
    """This process's counted reads (array -> [requests, bytes]), reset."""
    with _LOCK:
        out = {k: list(v) for k, v in _READS.items()}
        _READS.clear()
    return out


class StoreReads(WorkerPlugin):
    """Counts a worker's reads of local Zarr stores (:func:`take_reads` there)."""

    name = "dr-dask-store-reads"

    def setup(self, worker: Any) -> None:
        _install()


@contextlib.contextmanager
def count_reads(client: Any = None) -> Iterator[dict[str, list[int]]]:
    """Count the reads of local Zarr stores inside the block, in this process and on
    ``client``'s workers; the dict is filled as the block exits."""
    _install()
    take_reads()
    if client is not None:
        client.register_plugin(StoreReads())
        run_on_workers(client, take_reads)
    out: dict[str, list[int]] = {}
    try:
        yield out
    finally:
        parts = [take_reads()]
        if client is not None:
            parts += list(run_on_workers(client, take_reads).values())
        for part in parts:
            for k, (n, b) in part.items():
                r = out.setdefault(k, [0, 0])
                r[0] += n
                r[1] += b
