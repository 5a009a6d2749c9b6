"""Faults injected from inside a run, at a chosen mark: deterministic whatever the machine's load.

A kill that fires after a sleep, at a fraction of an earlier run's time, or when a test polling
the store sees a mark, lands wherever the run has got to by then: on a loaded machine possibly
after the stage it was meant for, or after the run finished. Here the run itself triggers it:

- the process that writes the chosen mark SIGKILLs itself the moment the write returns
  (:class:`Stage`, :class:`Written`, :class:`Rows`: the objects a run writes, in the store layout
  docs/DEVELOPING.md describes; matched where every write passes, ``Location.write_bytes`` and
  the Zarr stores' ``set``, so the library has no test code path);
- the worker that is about to run the chosen task SIGKILLs itself (:class:`Task`, a worker
  plugin: registered by the test on its cluster, or preloaded into the workers of a CLI's own
  cluster).

A fault may kill another process instead (``pid``: a scheduler, killed as the run writes
its mark). A :class:`Fault` is a directory: what to trigger on, a counter shared by every
process (one file per event, created exclusively), and ``fired.json``, the record of the kill,
written just before it. A test asserts from that record and from the store that the kill
landed where it meant (during the fit, before the run was complete), then what a rerun
reused.

Use ``Fault.cli(*args)`` for a ``dr-dask`` command armed with the fault (the driver hooks, and
the preload for the workers of a cluster the command starts itself), or
``Fault.register(client)`` for the workers of a test's cluster.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import _spawn
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.utils import key_split

#: The environment variable naming the fault directory of an armed process.
ENV = "DR_DASK_TEST_FAULT"


# ----------------------------------------------------------------------------------- marks
@dataclass(frozen=True)
class Stage:
    """The run group's ``zarr.json`` once its ``stages`` record ``name`` (written by the
    process that runs the fit: the CLI)."""

    name: str

    def matches(self, key: str, data: bytes | None) -> bool:
        if not key.endswith("zarr.json") or data is None:
            return False
        attrs = json.loads(data).get("attributes", {})
        return isinstance(attrs.get("stages"), dict) and self.name in attrs["stages"]


@dataclass(frozen=True)
class Written:
    """The ``n``-th object written whose key matches the regular expression ``pattern`` (by
    this process or its threads: tile marks under ``--scheduler threads``)."""

    pattern: str
    n: int = 1

    def matches(self, key: str, data: bytes | None) -> bool:
        return re.search(self.pattern, key) is not None


def tile(n: int) -> Written:
    """The ``n``-th tile done mark ``done/i_j.npz`` of a stored tile array."""
    return Written(TILE_MARK, n)


#: A tile's done mark (:func:`dr_dask.linalg.tiles.build_tiles`).
TILE_MARK = r"/done/\d+_\d+\.npz$"


@dataclass(frozen=True)
class Rows:
    """A stream or job ``checkpoint.json`` committing at least ``rows`` rows."""

    rows: int

    def matches(self, key: str, data: bytes | None) -> bool:
        return key.endswith("checkpoint.json") and data is not None \
            and json.loads(data).get("n_rows", -1) >= self.rows


@dataclass(frozen=True)
class RefitInFlight:
    """The ``n``-th stream or job ``checkpoint.json`` written while a refit is in flight (the
    first: the one that records the refit's buffer as it starts)."""

    n: int = 1

    def matches(self, key: str, data: bytes | None) -> bool:
        return key.endswith("checkpoint.json") and data is not None \
            and bool(json.loads(data).get("refit"))


@dataclass(frozen=True)
class RunCreated:
    """The first ``zarr.json`` of a run group (a group whose attributes hold its ``params``):
    the fit has its group and has written nothing else."""

    def matches(self, key: str, data: bytes | None) -> bool:
        return key.endswith("zarr.json") and data is not None \
            and "params" in json.loads(data).get("attributes", {})


@dataclass(frozen=True)
class Task:
    """The ``n``-th task of dask's task prefix ``prefix`` (``key_split``: the function's name
    without leading underscores, e.g. ``tile_matmat``; every task when empty) to start on any
    worker: that worker is killed (the task and the results it held are lost with it). ``n=0``
    kills nothing and counts the tasks (:attr:`Fault.count`, their start times
    :attr:`Fault.times`). With ``at``, the kill waits until ``at`` seconds after the
    fault's :meth:`Fault.start` (the test's call of the fit), holding the task (and its
    worker) until then: a kill at a moment of the fit that always falls inside it, whatever
    the machine's speed (pick ``n`` from a counting run's :attr:`Fault.times`)."""

    n: int
    prefix: str = ""
    at: float = 0.0


MARKS = {cls.__name__: cls for cls in (Stage, Written, Rows, RefitInFlight, RunCreated, Task)}


# ----------------------------------------------------------------------------------- faults
class Fault:
    """A kill (or another signal: ``signum``) at ``mark``, shared through the directory
    ``path`` by every process it arms (``Fault(path)`` reads it back)."""

    def __init__(self, path: str | os.PathLike, mark: Any = None,
                 signum: int = signal.SIGKILL, pid: int | None = None):
        self.path = Path(path)
        if mark is not None:
            self.path.mkdir(parents=True, exist_ok=True)
            (self.path / "mark.json").write_text(json.dumps(
                {"kind": type(mark).__name__, **asdict(mark), "signum": int(signum),
                 "pid": pid}))
        spec = json.loads((self.path / "mark.json").read_text())
        self.signum = spec.pop("signum")
        #: The process the mark kills (None: the one that hits it), e.g. a scheduler.
        self.pid = spec.pop("pid", None)
        self.mark = MARKS[spec.pop("kind")](**spec)

    @property
    def fired(self) -> dict | None:
        """What the kill hit (``key``, ``pid``, ``count``), or None if it never fired."""
        try:
            return json.loads((self.path / "fired.json").read_text())
        except FileNotFoundError:
            return None

    def start(self) -> None:
        """Now is the start of the run (the time :class:`Task`'s ``at`` counts from)."""
        (self.path / "start.json").write_text(json.dumps(time.time()))

    @property
    def started(self) -> float | None:
        try:
            return float(json.loads((self.path / "start.json").read_text()))
        except FileNotFoundError:
            return None

    @property
    def times(self) -> list[float]:
        """When each matching event happened, in order (wall-clock seconds)."""
        return [float(p.read_text() or "nan") for p in sorted(self.path.glob("event-*"))]

    @property
    def count(self) -> int:
        """How many matching events the armed processes saw (a run with a mark past its end
        counts them all: :class:`Task` positions for a later run)."""
        return len(list(self.path.glob("event-*")))

    def env(self, base: dict | None = None) -> dict:
        """The environment of an armed child: this fault, the tests on the path, and the
        workers of any cluster the child starts preloading this module."""
        env = dict(os.environ if base is None else base)
        paths = [str(Path(__file__).parent), os.getcwd(), env.get("PYTHONPATH", "")]
        env.update({ENV: str(self.path), "PYTHONPATH": os.pathsep.join(p for p in paths if p),
                    "DASK_DISTRIBUTED__WORKER__PRELOAD": json.dumps([__file__])})
        return env

    def cli(self, *args: str, **kw: Any) -> subprocess.Popen:
        """``python -m dr_dask.cli ARGS`` armed with this fault."""
        return cli(*args, fault=self, **kw)

    def register(self, client: Any) -> None:
        """Arm the workers of ``client``'s cluster (and those that join it later) with this
        fault's :class:`Task` mark; registering another fault replaces it."""
        # a worker killed by the previous fault may still be listed while its nanny starts the
        # next one: the scheduler's broadcast to it fails, and a moment later it is gone
        for attempt in range(40):
            try:
                client.register_plugin(KillOnTask(str(self.path)), name="dr-dask-test-fault")
                return
            except OSError:  # distributed's CommClosedError
                if attempt == 39:
                    raise
                time.sleep(0.5)

    def _event(self, key: str, pid: int) -> bool:
        """Count one matching event; True (and ``fired.json`` written) when it is the one."""
        n = getattr(self.mark, "n", 1)  # the n-th match of Written and Task, else the first
        i = 1
        while True:  # claim the next free number: exclusive creation orders events across processes
            try:
                fd = os.open(self.path / f"event-{i:06d}", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
                os.write(fd, repr(time.time()).encode())
                os.close(fd)
                break
            except FileExistsError:
                i += 1
        if i != n:
            return False
        at, started = getattr(self.mark, "at", 0.0), self.started
        if at and started is not None:  # hold the task (the run cannot end) until the moment
            time.sleep(max(0.0, started + at - time.time()))
        (self.path / "fired.json").write_text(json.dumps(
            {"key": key, "pid": pid, "count": i, "time": time.time()}))
        return True


def _read_mark(path: Path) -> Any:
    spec = json.loads((path / "mark.json").read_text())
    return MARKS[spec.pop("kind")](**spec)


def cli(*args: str, fault: Fault | None = None, env: dict | None = None,
        text: bool = False) -> subprocess.Popen:
    """``python -m dr_dask.cli ARGS`` in a child process (one BLAS thread, this checkout on its
    path), armed with ``fault`` if given; stdout and stderr are pipes."""
    env = dict(os.environ if env is None else env, OPENBLAS_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.getcwd(), env.get("PYTHONPATH")) if p)
    code = "import sys; from dr_dask.cli import main; sys.exit(main())"
    if fault is not None:
        env = fault.env(env)
        code = "import _faults; _faults.arm(); " + code
    return _spawn.Popen([sys.executable, "-c", code, *args], env=env, text=text,
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE)


# --------------------------------------------------------------------- inside an armed process
def _kill_self(fault: Fault, key: str) -> None:
    if fault._event(key, os.getpid()):
        os.kill(fault.pid or os.getpid(), fault.signum)


def arm() -> None:
    """Hook this process's writes to the fault named by the environment (a child's first call).

    Every object a run writes passes through ``Location.write_bytes`` (marks),
    ``Location.swap_bytes`` (checkpoints, leases) or a Zarr store's ``set`` (group metadata:
    stage marks); after one whose path matches the mark,
    the writer kills itself. A path is the object's whole path or URL path (a Zarr store's root,
    then its key)."""
    import zarr.storage

    from dr_dask.io import storage

    fault = Fault(os.environ[ENV])
    if isinstance(fault.mark, Task):
        return  # a worker kill: armed in the workers (dask_setup below)

    def check(key: str, data: Any) -> None:
        if fault.mark.matches(key, data):
            _kill_self(fault, key)

    write_bytes = storage.Location.write_bytes

    def hooked_write_bytes(self: Any, data: bytes) -> None:
        write_bytes(self, data)
        check(self.url, bytes(data))

    storage.Location.write_bytes = hooked_write_bytes
    swap_bytes = storage.Location.swap_bytes

    def hooked_swap_bytes(self: Any, data: bytes, version: str | None) -> str | None:
        written = swap_bytes(self, data, version)
        if written is not None:  # a conditional write that took place (checkpoints, leases)
            check(self.url, bytes(data))
        return written

    storage.Location.swap_bytes = hooked_swap_bytes

    for cls in (zarr.storage.LocalStore, zarr.storage.FsspecStore):
        def hook(set_: Any) -> Any:
            async def hooked_set(self: Any, key: str, value: Any, *a: Any, **kw: Any) -> None:
                await set_(self, key, value, *a, **kw)
                # the object's whole path, as Location.url gives it: the store's root and key
                root = str(getattr(self, "root", None) or getattr(self, "path", ""))
                check(f"{root.rstrip('/')}/{key}",
                      value.to_bytes() if key.endswith(".json") else None)
            return hooked_set
        cls.set = hook(cls.set)


class KillOnTask(WorkerPlugin):
    """Kill this worker when the fault's :class:`Task` starts here (counted over all workers)."""

    def __init__(self, path: str):
        self.path = path

    def setup(self, worker: Any) -> None:
        self.fault = Fault(self.path)

    def transition(self, key: Any, start: str, finish: str, **kwargs: Any) -> None:
        mark = self.fault.mark
        if finish == "executing" and key_split(key).startswith(mark.prefix) \
                and not (Path(self.path) / "fired.json").exists():
            _kill_self(self.fault, str(key))


async def dask_setup(worker: Any) -> None:
    """Preload of a CLI's cluster workers (``Fault.env``): arm a :class:`Task` fault."""
    if ENV in os.environ and isinstance(Fault(os.environ[ENV]).mark, Task):
        await worker.plugin_add(KillOnTask(os.environ[ENV]), name="dr-dask-test-fault")
