"""The memory of the largest task of each stage, measured inside the workers.

:class:`TaskMemory`, a worker plugin: while a task executes, a thread samples the worker's
resident set every 20 ms, and when it ends its rise above the RSS at its start is kept under
its prefix (dask's ``key_split``), the largest per prefix. On workers of one thread (the
benches' clusters) that rise is the task's own working set: what a stage needs of one worker
whatever the number of workers. With several threads a rise counts the tasks running beside
it too, so it is an upper bound.
"""

from __future__ import annotations

import threading
from typing import Any

import psutil
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.utils import key_split

from dr_dask.runtime.cluster import run_on_workers

#: Seconds between two samples of a worker's RSS.
INTERVAL = 0.02


class TaskMemory(WorkerPlugin):
    """``largest`` (prefix -> bytes): the largest rise of this worker's RSS during one task."""

    name = "dr-dask-task-memory"

    def __init__(self) -> None:
        self.largest: dict[str, int] = {}

    def setup(self, worker: Any) -> None:  # on the worker: what cannot be pickled
        self._running: dict[Any, list[int]] = {}  # key -> [RSS at its start, peak]
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._proc = psutil.Process()
        threading.Thread(target=self._sample, name=self.name, daemon=True).start()

    def teardown(self, worker: Any) -> None:
        self._stop.set()

    def _rss(self) -> int:
        rss = self._proc.memory_info().rss
        with self._lock:
            for seen in self._running.values():
                seen[1] = max(seen[1], rss)
        return rss

    def _sample(self) -> None:
        while not self._stop.wait(INTERVAL):
            self._rss()

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        if finish == "executing":
            rss = self._rss()
            with self._lock:
                self._running[key] = [rss, rss]
        elif start == "executing":
            self._rss()
            with self._lock:
                seen = self._running.pop(key, None)
                if seen is not None:
                    prefix = key_split(key)
                    self.largest[prefix] = max(self.largest.get(prefix, 0), seen[1] - seen[0])


def take_task_memory(client: Any) -> dict[str, int]:
    """The largest task's rise per prefix over ``client``'s workers since the last call,
    reset (the plugin is registered on the workers that lack it, which had nothing to
    report)."""

    def take(dask_worker: Any) -> dict[str, int] | None:
        plugin = dask_worker.plugins.get(TaskMemory.name)
        if plugin is None:
            return None
        out, plugin.largest = plugin.largest, {}
        return out

    parts = list(run_on_workers(client, take).values())
    if any(p is None for p in parts):
        client.register_plugin(TaskMemory())
    out: dict[str, int] = {}
    for part in parts:
        for prefix, n in (part or {}).items():
            out[prefix] = max(out.get(prefix, 0), n)
    return out
