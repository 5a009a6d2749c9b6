"""One cluster abstraction: get a ``distributed.Client`` or fall back to dask's threads.

Library functions take ``client=None``. They never start a cluster themselves: with no client
they use the client already active in the process (``distributed.default_client``) if there is
one, and otherwise dask's local threaded scheduler. Starting clusters is the application's job;
the CLI does it through :func:`connect`, which honours ``--scheduler`` /
``DASK_SCHEDULER_ADDRESS``, then ``--scheduler-file`` / ``DASK_SCHEDULER_FILE`` (how
dask-jobqueue and dask-mpi clusters are joined), and otherwise starts a ``LocalCluster`` sized
to the container it runs in.
"""

from __future__ import annotations

import contextlib
import contextvars
import gc
import logging
import os
import time
import traceback
import warnings
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import CancelledError, ThreadPoolExecutor
from typing import Any, TypeVar

import dask
from dask.system import CPU_COUNT
from distributed import Client, LocalCluster, Security, default_client, wait
from distributed.comm.core import CommClosedError
from distributed.scheduler import KilledWorker
from distributed.system import MEMORY_LIMIT
from distributed.utils import has_keyword
from distributed.worker import thread_state

from dr_dask.runtime import config
from dr_dask.runtime.blas import single_blas_thread
from dr_dask.runtime.progress import cluster_bar, local_bar

logger = logging.getLogger(__name__)

SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
SCHEDULER_FILE_ENV = "DASK_SCHEDULER_FILE"


#: The stage running in this context, named in errors that tell the user where to resume.
_STAGE: contextvars.ContextVar[str] = contextvars.ContextVar("dr_dask_stage", default="fit")

T = TypeVar("T")


#: The stage last entered in this process and whether it finished: where a failure raised
#: outside any stage happened ("before the first stage", "after stage 'x'").
_LAST_STAGE: dict[str, Any] = {"name": None, "finished": False}


def where_now() -> str:
    """Where this process is in its stages, for messages about failures outside a stage."""
    name = _LAST_STAGE["name"]
    if name is None:
        return "before the first stage (while connecting or opening the input)"
    return f"{'after' if _LAST_STAGE['finished'] else 'during'} stage {name!r}"


class ClusterLost(RuntimeError):
    """The cluster went away (or kept losing workers) under a stage; rerun to resume from it."""

    def __init__(self, stage: str, why: str):
        super().__init__(f"stage {stage!r} could not finish: {why}. Rerun to resume from stage "
                         f"{stage!r} (completed stages of a run are kept)")
        self.stage = stage


class WorkerOutOfMemory(RuntimeError):
    """A task's workers were restarted by their nanny for exceeding their memory limit: rerun
    unchanged, it would fail again."""

    def __init__(self, task: Any, worker: str, limit: float, rss: float, attempts: int):
        gb = 1e9
        super().__init__(
            f"{where_now()}: task {task!r} ran on {attempts} worker(s) and each died; the last, "
            f"{worker}, was restarted for exceeding its memory limit ({rss / gb:.2f} GB used of "
            f"{limit / gb:.2f} GB). Give each worker more memory (dask worker --memory-limit, or "
            "fewer worker processes per machine: --workers) or make the work smaller (smaller "
            "chunks or tiles: --chunk-size, --tile-size)")
        self.task, self.worker = task, worker


def memory_killed(exc: KilledWorker, client: Client | None) -> WorkerOutOfMemory | None:
    """The memory error behind ``exc`` when its last worker was restarted for memory (the
    nanny's ``worker-restart-memory`` event on the scheduler), else None."""
    if client is None:
        return None
    worker = exc.last_worker.address
    for _ in range(5):  # the nanny's event and the worker's removal race to the scheduler
        try:
            events = client.get_events("worker-restart-memory")
        except Exception:  # noqa: BLE001  (no answer: no explanation, the caller's error stands)
            return None
        found = [e for _, e in events if e.get("worker") == worker]
        if found:
            return WorkerOutOfMemory(exc.task, worker, exc.last_worker.memory_limit or 0,
                                     found[-1].get("rss", 0), exc.allowed_failures + 1)
        time.sleep(0.2)
    return None


def cluster_gone(exc: BaseException) -> bool:
    """``exc`` says the cluster (scheduler or workers) went away, not that the work is wrong:
    a lost-worker error, a connection error raised by distributed's comm layer, or the
    RuntimeError of distributed's connection pool cancelling a connection twice as the
    scheduler goes (its cancel scope is already expiring when the second removal comes)."""
    if isinstance(exc, _lost_worker_errors()):
        return True
    if not isinstance(exc, (RuntimeError, OSError, TimeoutError)):
        return False
    frames = [(f.f_code.co_filename, f.f_code.co_name)
              for f, _ in traceback.walk_tb(exc.__traceback__)]
    if isinstance(exc, RuntimeError):
        return any(name == "cancel_timeout_cb" and f"{os.sep}distributed{os.sep}" in file
                   for file, name in frames)
    where = frames[-1][0] if frames else ""
    return f"{os.sep}distributed{os.sep}" in where or f"{os.sep}tornado{os.sep}" in where


def _lost_worker_errors() -> tuple[type[BaseException], ...]:
    """What a computation raises when a worker dies under it (results forgotten, connection
    closed, a task that killed its workers too often)."""

    return (CancelledError, CommClosedError, KilledWorker)


def run_stage(name: str, fn: Callable[[], T], attempts: int | None = None) -> T:
    """Run ``fn()`` as stage ``name``, rerun from its start when workers are lost under it.

    Lost results that dask can recompute from lineage never get here (the scheduler reruns
    them); this catches what cannot be recovered inside the stage (futures forgotten, closed
    connections, ``KilledWorker``) and runs the whole stage again, at most ``attempts`` times,
    then raises :class:`ClusterLost` naming the stage (``attempts`` defaults to
    ``dr_dask.cluster.stage-attempts``).
    """
    attempts = attempts or int(config.get("cluster.stage-attempts"))
    token = _STAGE.set(name)
    _LAST_STAGE.update(name=name, finished=False)
    try:
        for attempt in range(1, attempts + 1):
            try:
                result = fn()
                _LAST_STAGE.update(name=name, finished=True)
                return result
            except ClusterLost:
                raise
            except _lost_worker_errors() as exc:
                if attempt == attempts:
                    raise ClusterLost(name, f"workers lost {attempts} times ({exc!r})") from exc
                logger.warning("stage %r lost workers (%r); running it again (%d of %d)",
                               name, exc, attempt + 1, attempts)
        raise AssertionError("unreachable")
    finally:
        _STAGE.reset(token)


def _answer(fn: Callable[..., Any], args: tuple, kwargs: dict,
            dask_worker: Any = None) -> tuple[bool, Any]:
    """``(True, fn(*args, **kwargs))``, or ``(False, error)`` when ``fn`` raised: on the
    worker, so that what ``fn`` raises is told apart from a worker that never answered.
    ``fn`` gets the worker as ``dask_worker`` when it takes one (as ``client.run`` does)."""
    try:
        if has_keyword(fn, "dask_worker"):
            kwargs = {**kwargs, "dask_worker": dask_worker}
        return True, fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001  (handed back to the caller, who raises it)
        return False, exc


def run_on_workers(client: Client, fn: Callable[..., T], *args: Any,
                   **kwargs: Any) -> dict[str, T]:
    """``fn(*args, **kwargs)`` on every worker of ``client`` (``client.run``), answers by
    worker address, tolerating workers that die under the call.

    A worker that is gone (killed, restarted by its nanny) before it answers is left out:
    the scheduler's broadcast still lists it until it notices, and a plain ``client.run``
    raises its ``CommClosedError``. A call that no worker answered is made again over the
    workers there are then (:func:`wait_for_workers`), up to ``dr_dask.cluster.stage-attempts``
    times, then :class:`ClusterLost` names the stage. What ``fn`` raises on a worker is
    raised here.
    """
    attempts = int(config.get("cluster.stage-attempts"))
    for attempt in range(1, attempts + 1):
        answers = client.run(_answer, fn, args, kwargs, on_error="return")
        done: dict[str, T] = {}
        for worker, answer in sorted(answers.items()):
            if isinstance(answer, BaseException):  # the worker did not answer
                logger.info("worker %s did not answer (%s: %s): left out", worker,
                            type(answer).__name__, answer)
                continue
            ok, value = answer
            if not ok:
                raise value
            done[worker] = value
        if done:
            return done
        logger.warning("no worker answered %s (%d of %d); asking again",
                       getattr(fn, "__name__", fn), attempt, attempts)
        try:
            wait_for_workers(client)
        except NoWorkers as exc:  # as a computation's wait_for says it: the stage to rerun
            raise ClusterLost(_STAGE.get(), str(exc)) from exc
    raise ClusterLost(_STAGE.get(), f"no worker answered {attempts} times")


def _held(value: Any) -> Any:
    """A task returning ``value``: its future holds it, recomputable from the graph."""
    return value


def share(value: Any, client: Client | None = None) -> Any:
    """A handle on ``value`` for many tasks, sent to each worker once and recomputable.

    With a client: the future of a task that returns ``value``. Unlike ``client.scatter``
    the value then lives in the task graph on the scheduler, so when the worker holding it
    dies, dask recomputes it instead of failing every task that needs it. Without a client
    the value itself.
    """
    client = active_client(client)
    if client is None:
        return value
    with warnings.catch_warnings():  # the value is in the graph on purpose, once
        warnings.filterwarnings("ignore", message=".*large graph", category=UserWarning)
        return client.submit(_held, value, pure=False)


def gather(futures: list, client: Client, progress: bool | None = None) -> list:
    """``client.gather(futures)``, but never waiting forever on a cluster that is gone
    (see :func:`wait_for`). ``progress``: draw a bar (default: the estimator's
    :func:`dr_dask.runtime.progress.scope`)."""
    wait_for(futures, client, progress)
    try:
        return client.gather(futures)
    except KilledWorker as exc:  # for memory, a rerun of the stage would fail the same way
        oom = memory_killed(exc, client)
        if oom is None:
            raise
        raise oom from exc


class NoWorkers(RuntimeError):
    """No worker joined the scheduler within the wait (a transient condition: retry later)."""


def scheduler_address(client: Client) -> str:
    """The address of ``client``'s scheduler, for messages."""
    try:
        return str(client.scheduler.address)  # type: ignore[union-attr]
    except AttributeError:  # a client that never connected
        return "the Dask scheduler"


class _WorkerWait:
    """The one rule for waiting on workers: up to ``dr_dask.cluster.wait-for-workers``
    (``--wait-for-workers``; an autoscaler that starts nodes or queues batch jobs needs
    minutes), a progress line every ``progress`` seconds while waiting."""

    def __init__(self, client: Client, progress: float = 30.0):
        self.client, self.progress = client, progress
        self.limit = config.get_seconds("cluster.wait-for-workers")
        self.since: float | None = None
        self.said = 0.0

    def expired(self, n_workers: int) -> bool:
        """Record ``n_workers`` seen now; True when there has been none for the whole wait."""
        now = time.monotonic()
        if n_workers:
            self.since = None
            return False
        if self.since is None:
            self.since = self.said = now
            logger.warning("no worker on the scheduler %s: waiting up to %.0f s for one "
                           "(--wait-for-workers)", scheduler_address(self.client), self.limit)
        elif now - self.said >= self.progress:
            self.said = now
            logger.warning("still no worker on the scheduler %s after %.0f s (waiting up to "
                           "%.0f s)", scheduler_address(self.client), now - self.since,
                           self.limit)
        return now - self.since > self.limit

    def why(self) -> str:
        return (f"no worker joined the scheduler {scheduler_address(self.client)} within "
                f"{self.limit:.0f} s (--wait-for-workers, dr_dask.cluster.wait-for-workers): "
                "check that its workers start (the node pool, the batch queue), or wait longer")


def wait_for_workers(client: Client | None, progress: float = 30.0) -> None:
    """Return once ``client``'s scheduler has a worker; raise :class:`NoWorkers` naming the
    scheduler when none joins within ``dr_dask.cluster.wait-for-workers``. Nothing to wait for
    without a client."""
    if client is None:
        return
    rule = _WorkerWait(client, progress)
    while True:
        try:
            n_workers = len(client.nthreads(callback_timeout=30))
        except (OSError, TimeoutError) as exc:
            raise ClusterLost(_STAGE.get(), f"the scheduler {scheduler_address(client)} is "
                              f"unreachable ({exc!r})") from exc
        if rule.expired(n_workers):
            raise NoWorkers(rule.why())
        if n_workers:
            return
        time.sleep(min(1.0, max(rule.limit, 0.1)))


def wait_for(futures: list, client: Client, progress: bool | None = None) -> None:
    """Wait until ``futures`` are finished (or failed), never forever on a cluster that is gone.

    Raises :class:`ClusterLost` (naming the current stage) when the scheduler is unreachable
    or has had no worker for ``dr_dask.cluster.wait-for-workers`` (see
    :func:`wait_for_workers`).
    """
    cluster_bar(futures, client, progress)
    rule = _WorkerWait(client)
    timed_out = False
    while True:
        try:
            with client.as_current():  # wait() acts on the current client, not the futures'
                wait(futures, timeout=2.0)
            break
        except TimeoutError:
            timed_out = True
        try:
            if client.status not in ("running", "connecting"):
                raise OSError(f"client is {client.status}")
            n_workers = len(client.nthreads(callback_timeout=30))
        except (OSError, TimeoutError) as exc:
            raise ClusterLost(_STAGE.get(), f"the scheduler is unreachable ({exc!r})") from exc
        if rule.expired(n_workers):
            raise ClusterLost(_STAGE.get(), rule.why())
    if timed_out:
        # a timed-out wait leaves reference cycles (tracebacks in the event loop's thread)
        # that hold the futures: without a collection their results stay on the workers and
        # in the scheduler after the caller drops them
        gc.collect()


class ClientParam:
    """Mixin for estimators whose ``client`` parameter holds a live ``distributed.Client``.

    A connection is neither state nor copyable: a pickled estimator (saved to disk, or sent
    to workers inside a task) carries ``client=None``, and ``sklearn.base.clone`` shares the
    client instead of deep-copying it (both would otherwise fail on the client's event loop).
    """

    def __getstate__(self) -> dict:
        state = super().__getstate__()
        # the host estimator's (BaseEstimator's) state is a dict, not object's opaque state
        assert isinstance(state, dict), type(state)
        return {**state, "client": None} if "client" in state else state

    def __sklearn_clone__(self) -> Any:
        from sklearn.base import clone  # lazy: not on workers (__init__)
        params = self.get_params(deep=False)  # type: ignore[attr-defined]
        client = params.pop("client", None)
        # the host estimator's class: its __init__ takes these params (the mixin's is object's)
        estimator: Callable[..., Any] = type(self)
        return estimator(**{k: clone(v, safe=False) for k, v in params.items()}, client=client)


def active_client(client: Client | None = None) -> Client | None:
    """Return ``client``, else the process's default distributed client, else ``None``.

    Inside a task on a worker there is no default: a worker process's default client is the
    worker's own (any ``get_client()`` there sets it, e.g. prefect-dask's), and work submitted
    through it from a task that holds a worker thread can wait forever for that thread. A
    task's ``client=None`` estimator runs in its task.
    """
    if client is not None:
        return client

    if getattr(thread_state, "key", None) is not None:
        return None
    try:

        return default_client()
    except ValueError:
        return None


def local_threads() -> int:
    """Threads of dask's threaded scheduler in this process (``num_workers`` in dask's config,
    else the container's cores, as dask sizes its pool); 1 inside a task on a distributed
    worker, whose thread is the task's share of its worker (see :func:`active_client`)."""
    if getattr(thread_state, "key", None) is not None:
        return 1
    return max(1, int(dask.config.get("num_workers", None) or CPU_COUNT))


def thread_memory(client: Client | None = None) -> int:
    """Bytes of memory one task may count on: the smallest worker's memory limit over its
    threads with a client (the container's memory over its cores for a worker without a limit),
    else this process's container memory over :func:`local_threads`."""
    if client is None:
        return int(MEMORY_LIMIT // local_threads())
    # asked of the scheduler here, not through Client.scheduler_info(): the client's periodic
    # refresh swaps its cached identity for one that lists no worker, and a call can return
    # that one (seen under load: a task sized to the container's memory, not the worker's)
    scheduler = client.scheduler
    identity = (client.sync(scheduler.identity) if scheduler is not None
                else client.scheduler_info())  # a closed client: its last word
    workers = identity["workers"].values()
    return int(min(((w.get("memory_limit") or MEMORY_LIMIT) // max(1, w["nthreads"])
                    for w in workers), default=MEMORY_LIMIT // CPU_COUNT))


def map_local(fn: Callable[[Any], T], items: Sequence[Any]) -> list[T]:
    """``[fn(x) for x in items]`` on :func:`local_threads` threads, in order: the no-client
    counterpart of one task per item, for kernels that release the GIL (compiled ``nogil``
    loops, BLAS). Run one after another, the Dijkstra blocks of a T=10,000 Isomap left one of
    two cores idle for half the fit. The first error is raised."""
    n = min(local_threads(), len(items))
    if n <= 1:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(n, thread_name_prefix="dr_dask-local") as pool:
        return list(pool.map(fn, items))


def local_cluster_kwargs(n_workers: int | None = None, memory_fraction: float = 0.8) -> dict:
    """Keyword arguments for a ``LocalCluster`` sized to this container.

    One process per core with one thread each (our tasks are GEMM- and scipy-bound and release
    the GIL, but BLAS already threads inside a task poorly at 2 cores), and a per-worker memory
    limit so that the whole cluster stays within ``memory_fraction`` of the memory available.
    Cores and memory are Dask's container-aware figures, as ``distributed`` sizes its own
    workers: ``dask.system.CPU_COUNT`` (CPU affinity and cgroup CPU quota) and
    ``distributed.system.MEMORY_LIMIT`` (cgroup memory limit and RLIMIT_RSS), not the host's.
    """
    if n_workers is not None and (not isinstance(n_workers, int) or n_workers < 1):
        raise ValueError(f"n_workers must be a positive integer, got {n_workers!r}")
    cores = max(1, int(CPU_COUNT))
    n_workers = n_workers or cores
    total = MEMORY_LIMIT
    return dict(
        n_workers=n_workers,
        threads_per_worker=max(1, cores // n_workers),
        processes=True,
        memory_limit=int(total * memory_fraction / n_workers),
        dashboard_address=":0",  # a free port: never collide with another cluster's dashboard
    )


def tls_security(ca_file: str, cert: str, key: str) -> Security:
    """TLS for every connection: one certificate for client, scheduler and workers.

    Distributed's TLS is mutual: each side presents a certificate signed by the CA in
    ``ca_file`` and checks the other's. One certificate for all three roles is what
    ``Security.temporary()`` does too; a platform with per-role certificates sets the
    ``distributed.comm.tls.*`` dask config instead (``Client`` reads it when given no security).
    """
    return Security(
        require_encryption=True, tls_ca_file=ca_file,
        tls_client_cert=cert, tls_client_key=key,
        tls_scheduler_cert=cert, tls_scheduler_key=key,
        tls_worker_cert=cert, tls_worker_key=key,
    )


def connect(
    scheduler: str | None = None,
    n_workers: int | None = None,
    processes: bool = True,
    scheduler_file: str | None = None,
    security: Security | None = None,
) -> Client:
    """Connect to ``scheduler`` (or ``$DASK_SCHEDULER_ADDRESS``), else to the cluster of
    ``scheduler_file`` (or ``$DASK_SCHEDULER_FILE``), else start a LocalCluster.

    Parameters
    ----------
    scheduler : str, optional
        Address such as ``tcp://10.0.0.5:8786`` (``tls://...`` with ``security``).
    scheduler_file : str, optional
        JSON file written by ``dask scheduler --scheduler-file``, dask-jobqueue or dask-mpi.
    n_workers : int, optional
        Worker processes for a new LocalCluster (default: one per core).
    processes : bool
        ``False`` gives a threaded LocalCluster (useful in notebooks).
    security : distributed.Security, optional
        TLS settings (:func:`tls_security`); default: the ``distributed.comm.tls.*`` config.
        A LocalCluster started here then talks TLS too.
    """
    address = scheduler or os.environ.get(SCHEDULER_ENV)
    if address:
        if address.startswith("tls://") and security is None \
                and not dask.config.get("distributed.comm.tls.ca-file", None):
            raise ValueError(f"{address} is a TLS scheduler: pass --tls-ca-file, --tls-cert and "
                             "--tls-key (or set distributed.comm.tls.* in the dask config)")
        logger.info("connecting to scheduler %s", address)
        return Client(address, security=security)
    scheduler_file = scheduler_file or os.environ.get(SCHEDULER_FILE_ENV)
    if scheduler_file:
        if not os.path.exists(scheduler_file):
            raise ValueError(f"scheduler file {scheduler_file} does not exist")
        logger.info("connecting to the scheduler of %s", scheduler_file)
        return Client(scheduler_file=scheduler_file, timeout="30s", security=security)
    kwargs = local_cluster_kwargs(n_workers)
    kwargs["processes"] = processes
    cluster = LocalCluster(**kwargs, security=security)
    logger.info(
        "started LocalCluster: %d workers, %.1f GB memory limit each",
        kwargs["n_workers"],
        kwargs["memory_limit"] / 1e9,
    )
    return Client(cluster)


@contextlib.contextmanager
def session(
    scheduler: str | None = None,
    n_workers: int | None = None,
    scheduler_file: str | None = None,
    security: Security | None = None,
) -> Iterator[Client]:
    """Context manager around :func:`connect` that closes what it started, once the cluster
    has a worker (:func:`wait_for_workers`: the one rule for every command, job and flow)."""
    client = connect(scheduler, n_workers, scheduler_file=scheduler_file, security=security)
    try:
        wait_for_workers(client)
        yield client
    finally:
        cluster = client.cluster
        client.close()
        if cluster is not None:
            cluster.close()


def compute(*collections: Any, client: Client | None = None,
            progress: bool | None = None) -> tuple:
    """Compute dask collections on ``client`` (or the fallback) with an optional progress bar
    (default: the estimator's :func:`dr_dask.runtime.progress.scope`; drawn where
    :func:`dr_dask.runtime.progress.output` says).

    One call computes everything given, so shared inputs are read once (dask-ml's rule).
    When a task fails, the call returns (raises) only once the tasks already running have
    ended: a caller that then deletes what they write (a scratch array) is not raced.
    """
    client = active_client(client)
    if client is None:
        # one BLAS thread per task, as on a LocalCluster's workers: the scheduler's threads
        # already fill the cores, and more BLAS threads per task only make them contend
        with single_blas_thread(), local_bar(progress), \
                ThreadPoolExecutor(local_threads()) as pool:  # its exit waits for running tasks
            return dask.compute(*collections, scheduler="threads", pool=pool)
    futures = client.compute(list(collections))
    try:
        return tuple(gather(futures, client, progress=progress))
    except Exception:
        with contextlib.suppress(Exception):
            client.cancel(futures)  # those not started; running ones end on their own
            wait(futures, timeout=config.get_seconds("cluster.settle-timeout"))
        raise
