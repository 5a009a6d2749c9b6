"""Storage credentials delivered to a cluster's workers, and their lifetime there.

:mod:`dr_dask.runtime.credentials` keeps secrets out of task graphs; this module gets them to
the workers that need them and away again: :func:`deliver_credentials` gives every worker of a
client (now and later) a credential set through a ``distributed`` worker plugin
(:class:`CredentialsPlugin`), :func:`credentials_delivered` (the scope of every run) withdraws
it when the run ends, and the scheduler's :class:`CredentialsLifetime` removes it when its
client leaves or stops renewing it (``dr_dask.credentials.lifetime``), as a lease expires.

The plugins are pickled by this module's path: client, scheduler and workers run the same
dr_dask.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

from distributed import Client
from distributed.comm.core import CommClosedError
from distributed.diagnostics.plugin import SchedulerPlugin, WorkerPlugin
from tornado.ioloop import PeriodicCallback

from dr_dask.runtime import config, credentials
from dr_dask.runtime.cluster import run_on_workers

logger = logging.getLogger(__name__)


class CredentialsPlugin(WorkerPlugin):
    """Puts credential sets into each worker's registry (:mod:`dr_dask.runtime.credentials`),
    and takes them out again when it is unregistered (by the run's end, or by
    :class:`CredentialsLifetime` when their client is gone or stopped renewing them).

    With a ``lifetime`` the worker also asks the scheduler every quarter of it whether the
    sets are still held there, and forgets them when it says no or has not said yes for a
    whole lifetime: a worker that missed their removal (unreachable then) keeps no copy."""

    def __init__(self, sets: dict[str, dict], lifetime: float | None = None):
        self.sets, self.lifetime = sets, lifetime
        self._check: PeriodicCallback | None = None

    def setup(self, worker: Any) -> None:
        credentials.register(self.sets)
        if self.lifetime:
            self._confirmed = time.monotonic()
            self._check = PeriodicCallback(lambda: self._confirm(worker),
                                           self.lifetime * 1000 / 4)
            self._check.start()

    async def _confirm(self, worker: Any) -> None:
        try:
            held = await worker.scheduler.dr_dask_credentials_held(refs=list(self.sets))
        except Exception:  # noqa: BLE001  (no answer: only the lifetime decides)
            held = None
        if held:
            self._confirmed = time.monotonic()
        if held is False or time.monotonic() - self._confirmed > (self.lifetime or 0):
            logger.info("storage credentials %s forgotten: %s", list(self.sets),
                        "the scheduler no longer holds them" if held is False else
                        f"no answer from the scheduler for {self.lifetime} s")
            self.teardown(worker)

    def teardown(self, worker: Any) -> None:
        if self._check is not None:
            self._check.stop()
            self._check = None
        credentials.unregister(list(self.sets))
        self.sets = {}  # the worker may keep this object a while: no copy of the secret in it


class CredentialsLifetime(SchedulerPlugin):
    """On the scheduler: the client that delivered each credentials plugin and when it
    expires. The plugin (the secret, kept on the scheduler for workers that join later) is
    removed from the scheduler and the workers as soon as its client leaves the scheduler
    (closed, or killed: ``remove_client``), or when its lifetime ends without a renewal
    (a client that hangs, or a disconnection the scheduler has not seen yet).

    The live client renews its sets every third of ``dr_dask.credentials.lifetime``
    (:func:`deliver_credentials`), as a lease is renewed, so a run outlives the lifetime and
    nothing outlives the run by more than it."""

    name = "dr_dask-credentials-lifetime"
    #: One per scheduler, registered by every client that delivers credentials: a second
    #: registration keeps the first (and what it holds).
    idempotent = True

    def __init__(self) -> None:
        #: reference -> (client id, deadline on the scheduler's monotonic clock)
        self.held: dict[str, tuple[str, float]] = {}
        #: references whose plugin the scheduler has held: one missing from its registry
        #: after that was withdrawn; before, it is claimed and its registration on the way
        self.registered: set[str] = set()
        self.scheduler: Any = None

    async def start(self, scheduler: Any) -> None:
        self.scheduler = scheduler
        scheduler.handlers["dr_dask_credentials_held"] = self.still_held
        check = PeriodicCallback(self.expire, 250)
        scheduler.periodic_callbacks[self.name] = check
        check.start()

    async def close(self) -> None:
        if self.scheduler is not None:
            check = self.scheduler.periodic_callbacks.pop(self.name, None)
            if check is not None:
                check.stop()

    def renew(self, refs: list[str], client: str, lifetime: float) -> list[str]:
        """Move the deadline of ``refs`` (delivered by ``client``) on; returns those the
        scheduler no longer holds (dropped: deliver them again)."""
        deadline = time.monotonic() + lifetime
        for ref in refs:
            self.held[ref] = (client, deadline)
        return [ref for ref in refs if ref not in self.scheduler.worker_plugins]

    def still_held(self, refs: list[str]) -> bool:
        """For a worker's :class:`CredentialsPlugin`: ``refs`` are all claimed and held."""
        return all(ref in self.held and ref in self.scheduler.worker_plugins for ref in refs)

    def remove_client(self, scheduler: Any, client: str) -> None:
        for ref, (owner, _) in list(self.held.items()):
            if owner == client:
                logger.info("client %s left: removing its storage credentials %s", client, ref)
                self.drop(ref)

    def expire(self) -> None:
        now = time.monotonic()
        for ref, (owner, deadline) in list(self.held.items()):
            if ref in self.scheduler.worker_plugins:
                self.registered.add(ref)
            elif ref in self.registered:  # withdrawn by its run: forget the claim
                self.drop(ref)
                continue
            if deadline < now or owner not in self.scheduler.clients:
                logger.info("storage credentials %s expired (client %s): removing them", ref,
                            owner)
                self.drop(ref)

    def drop(self, ref: str) -> None:
        self.held.pop(ref, None)
        self.registered.discard(ref)
        if self.scheduler.worker_plugins.pop(ref, None) is not None:
            # a worker that died meanwhile answers with an error: nothing left there to remove
            self.scheduler._ongoing_background_tasks.call_soon(
                self.scheduler.broadcast, msg=dict(op="plugin-remove", name=ref),
                on_error="return")


def _renew_on_scheduler(refs: list[str], client: str, lifetime: float,
                        dask_scheduler: Any = None) -> list[str]:
    """On the scheduler: :meth:`CredentialsLifetime.renew` (every ref when it has no such
    plugin)."""
    guard = dask_scheduler.plugins.get(CredentialsLifetime.name)
    return list(refs) if guard is None else guard.renew(refs, client, lifetime)


#: (client id, reference) pairs delivered and not yet withdrawn: each client registers a set once.
_DELIVERED: set[tuple[str, str]] = set()
#: What this process renews: (client, reference) -> the secret (to deliver it again).
_LIVE: dict[tuple[Client, str], dict] = {}
_LIVE_LOCK = threading.Lock()
_RENEWER: list[threading.Thread] = []
#: Clients whose scheduler has no :class:`CredentialsLifetime` (it could not load it).
_UNGUARDED: set[str] = set()


class _Scope(threading.local):
    """This thread's open run scope (:func:`credentials_delivered`): what was delivered inside
    it, to withdraw (per thread: runs in other threads keep their own)."""

    def __init__(self) -> None:
        self.stack: list[list[tuple[Client, str]]] = []


_SCOPE = _Scope()


def _lifetime() -> float:
    return config.get_seconds("credentials.lifetime")


def _register(client: Client, ref: str, secret: dict) -> None:
    """Claim ``ref`` for ``client`` on the scheduler (with its lifetime), then deliver the
    plugin: claimed first, a client killed in between leaves nothing unowned."""
    _renew_on(client, [ref])
    for attempt in range(1, 4):
        try:
            # the one message that carries the secret (and the scheduler's copy for workers
            # that join later): a TLS cluster protects it
            lifetime = None if str(client.id) in _UNGUARDED else _lifetime()
            client.register_plugin(CredentialsPlugin({ref: secret}, lifetime), name=ref)
            return
        except (CommClosedError, OSError) as exc:
            # a worker died under the broadcast: the scheduler holds the plugin already and
            # gives it to the workers that remain when it is registered again
            if attempt == 3:
                raise
            logger.info("a worker left while the credentials were delivered (%r): again", exc)


def _renew_on(client: Client, refs: list[str]) -> list[str]:
    """Renew ``refs`` of ``client`` on its scheduler; those it no longer holds."""
    if str(client.id) in _UNGUARDED:
        return []
    return list(client.run_on_scheduler(_renew_on_scheduler, refs, str(client.id), _lifetime()))


def _renew_loop() -> None:
    """Renew every live set of this process every third of its lifetime (one thread)."""
    while True:
        time.sleep(max(0.05, _lifetime() / 3))
        with _LIVE_LOCK:
            live = dict(_LIVE)
        by_client: dict[Client, list[str]] = {}
        for (client, ref) in live:
            by_client.setdefault(client, []).append(ref)
        for client, refs in by_client.items():
            if client.status not in ("running", "connecting"):
                with _LIVE_LOCK:
                    for ref in refs:
                        _LIVE.pop((client, ref), None)
                continue
            try:
                for ref in _renew_on(client, refs):  # dropped (a reconnection): again
                    with _LIVE_LOCK:
                        secret = _LIVE.get((client, ref))
                    if secret is not None:
                        _register(client, ref, secret)
            except Exception as exc:  # noqa: BLE001  (a blip: the next round renews)
                logger.warning("could not renew the storage credentials on the scheduler "
                               "(%s: %s)", type(exc).__name__, exc)


def deliver_credentials(client: Client | None, storage_options: dict | None) -> None:
    """Give every worker of ``client``, now and later, the credentials among
    ``storage_options``, so that the Locations in task graphs carry only a reference to them
    (:mod:`dr_dask.runtime.credentials`). Once per client and credential set; nothing to do
    without a client or without credentials. Inside :func:`credentials_delivered` (every run),
    the set is withdrawn when the run ends; in any case the scheduler removes it when the
    client leaves, or ``dr_dask.credentials.lifetime`` after this process stops renewing it
    (:class:`CredentialsLifetime`).
    """
    _, secret = credentials.split(storage_options or {})
    if client is None or not secret:
        return
    ref = credentials.reference(secret)
    key = (str(client.id), ref)
    if key in _DELIVERED:
        return
    try:
        client.register_plugin(CredentialsLifetime(), name=CredentialsLifetime.name)
    except (CommClosedError, OSError):
        raise
    except Exception as exc:  # noqa: BLE001  (a scheduler that cannot load dr_dask's plugin)
        _UNGUARDED.add(str(client.id))
        logger.warning("the scheduler did not take dr_dask's credentials plugin (%s: %s): "
                       "storage credentials stay on it until the run ends", type(exc).__name__,
                       exc)
    _register(client, ref, secret)
    _DELIVERED.add(key)
    with _LIVE_LOCK:
        _LIVE[(client, ref)] = secret
        if not _RENEWER:
            _RENEWER.append(threading.Thread(target=_renew_loop, daemon=True,
                                             name="dr-dask-credentials"))
            _RENEWER[0].start()
    if _SCOPE.stack:
        _SCOPE.stack[0].append((client, ref))
    logger.debug("storage credentials delivered to the workers as %s", ref)


def withdraw_credentials(client: Client, ref: str) -> None:
    """Remove the credentials plugin ``ref`` from the scheduler (which keeps every plugin for
    workers that join later, where any client could read it) and from the workers."""
    _DELIVERED.discard((str(client.id), ref))
    with _LIVE_LOCK:
        _LIVE.pop((client, ref), None)
    try:
        client.unregister_worker_plugin(ref)
    except (CommClosedError, OSError):
        # a worker died under the broadcast: the scheduler has dropped its copy already,
        # the workers that remain forget theirs here
        run_on_workers(client, credentials.unregister, [ref])
    except Exception as exc:  # noqa: BLE001  (a cluster already gone holds nothing any more)
        logger.warning("could not withdraw the storage credentials %s from the scheduler "
                       "(%s: %s); it keeps them until it stops", ref, type(exc).__name__, exc)
    else:
        logger.debug("storage credentials %s withdrawn from the scheduler", ref)


@contextlib.contextmanager
def credentials_delivered(client: Client | None = None,
                          storage_options: dict | None = None) -> Iterator[None]:
    """The scope of a run: :func:`deliver_credentials` of ``storage_options`` (if given), and
    every set delivered inside the scope is withdrawn from the scheduler when the outermost
    scope ends, also on failure."""
    outer = not _SCOPE.stack
    if outer:
        _SCOPE.stack.append([])
    try:
        deliver_credentials(client, storage_options)
        yield
    finally:
        if outer:
            for delivered, ref in _SCOPE.stack.pop():
                withdraw_credentials(delivered, ref)
