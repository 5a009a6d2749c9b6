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
import logging
import os
import sys
from collections.abc import Iterator
from typing import Any

import dask
from dask.system import CPU_COUNT
from distributed import Client, LocalCluster, Security
from distributed.system import MEMORY_LIMIT

logger = logging.getLogger(__name__)

SCHEDULER_ENV = "DASK_SCHEDULER_ADDRESS"
SCHEDULER_FILE_ENV = "DASK_SCHEDULER_FILE"


class ClientParam:
    """Mixin for estimators whose ``client`` parameter holds a live ``distributed.Client``.

    A connection is neither state nor copyable: a pickled estimator (saved to disk, or sent
    to workers inside a task) carries ``client=None``, and ``sklearn.base.clone`` shares the
    client instead of deep-copying it (both would otherwise fail on the client's event loop).
    """

    def __getstate__(self) -> dict:
        state = super().__getstate__()  # type: ignore[misc]
        return {**state, "client": None} if "client" in state else state

    def __sklearn_clone__(self) -> Any:
        from sklearn.base import clone

        params = self.get_params(deep=False)  # type: ignore[attr-defined]
        client = params.pop("client", None)
        return type(self)(**{k: clone(v, safe=False) for k, v in params.items()}, client=client)


def active_client(client: Client | None = None) -> Client | None:
    """Return ``client``, else the process's default distributed client, else ``None``."""
    if client is not None:
        return client
    try:
        from distributed import default_client

        return default_client()
    except ValueError:
        return None


def local_cluster_kwargs(n_workers: int | None = None, memory_fraction: float = 0.8) -> dict:
    """Keyword arguments for a ``LocalCluster`` sized to this container.

    One process per core with one thread each (our tasks are GEMM- and scipy-bound and release
    the GIL, but BLAS already threads inside a task poorly at 2 cores), and a per-worker memory
    limit so that the whole cluster stays within ``memory_fraction`` of the memory available.
    Cores and memory are Dask's container-aware figures, as ``distributed`` sizes its own
    workers: ``dask.system.CPU_COUNT`` (CPU affinity and cgroup CPU quota) and
    ``distributed.system.MEMORY_LIMIT`` (cgroup memory limit and RLIMIT_RSS), not the host's.
    """
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
    """Context manager around :func:`connect` that closes what it started."""
    client = connect(scheduler, n_workers, scheduler_file=scheduler_file, security=security)
    try:
        yield client
    finally:
        cluster = client.cluster
        client.close()
        if cluster is not None:
            cluster.close()


def compute(*collections: Any, client: Client | None = None, progress: bool = False) -> tuple:
    """Compute dask collections on ``client`` (or the fallback) with an optional progress bar.

    One call computes everything given, so shared inputs are read once (dask-ml's rule).
    """
    client = active_client(client)
    if client is None:
        if progress and sys.stderr.isatty():
            from dask.diagnostics import ProgressBar

            with ProgressBar(out=sys.stderr):
                return dask.compute(*collections, scheduler="threads")
        return dask.compute(*collections, scheduler="threads")
    futures = client.compute(list(collections))
    if progress and sys.stderr.isatty():
        from distributed import progress as dprogress

        dprogress(futures)
    return tuple(client.gather(futures))
