"""One writer at a time: a fenced lease object in the run store.

A lease alone is not safe: a holder can pause (a long GC, SIGSTOP, a suspended VM) past its
expiry, wake up still believing it holds the lease, and write beside the run that took it over.
So the lease is *fenced* (Kleppmann, "How to do distributed locking", 2016; the idea of
ZooKeeper's zxid and etcd's revision): every write of the lease object is a compare-and-swap on
the version its writer last saw (:meth:`dr_dask.io.storage.Location.swap_bytes`: ``If-Match`` on
S3), each acquisition increments a fencing token kept in the object, and a holder calls
:meth:`Lease.fence` before every commit it makes. The fence is itself a conditional renewal:
when it fails the lease was taken over, the holder raises :class:`LeaseLost` and writes
nothing more; the commit then carries the token.

What this guarantees: a commit made after a successful fence was made by the only holder of the
lease as of the fence's write, with at least ``ttl`` seconds of lease ahead (another run takes
the lease over only after ``expires``, which the fence just moved ``ttl`` seconds on). A writer
of many objects (the stream's arrays, a model version) checks before each one
(:meth:`Lease.check`, through :class:`FencedStore` for a Zarr store): a fence, unless one
succeeded less than ``ttl / 3`` ago by this process's monotonic clock, which runs on through a
pause (so at least two thirds of ``ttl`` of lease are ahead). The window that remains is a
holder that pauses for longer than that *between* a check and the one write that follows it
(microseconds apart): no object store can check a token kept in another object, so nothing but
the clock closes it. A pause anywhere else is caught at the next check.
"""

from __future__ import annotations

import asyncio
import datetime as _dt
import json
import logging
import os
import socket
import threading
import time
import uuid

import psutil
from zarr.abc.store import Store
from zarr.core.buffer import Buffer
from zarr.storage import WrapperStore

from dr_dask.io.storage import Location, StorageError
from dr_dask.runtime import config

logger = logging.getLogger(__name__)

class LeaseHeld(RuntimeError):
    """Another live run of the same job holds its lease (a transient condition: retry later)."""


class LeaseLost(RuntimeError):
    """This run's lease was taken over by another run (this one paused past the lease's
    lifetime): it stopped writing; the other run's output stands."""


class Lease:
    """One writer at a time: a lease object ``{owner, token, expires}`` in the run store.

    Taken with create-if-absent (token 1), or by a compare-and-swap over an expired or
    released lease (token + 1); renewed every ``ttl / 3`` seconds by a daemon thread while the
    job runs, each renewal a compare-and-swap on the version this holder last wrote. A holder
    on this host whose process is gone (a killed run, rerun at once) is taken over without
    waiting for expiry. Release marks the object expired (keeping the token, so tokens only
    grow). A second run of the same job while the lease is live raises :class:`LeaseHeld`;
    a holder whose renewal or :meth:`fence` finds the lease changed raises :class:`LeaseLost`
    naming the run that holds it now.

    Parameters
    ----------
    where : Location
        The lease object.
    ttl : float, optional
        Seconds a lease stays valid without renewal (default: dask config
        ``dr_dask.lease.ttl``, 60 s; e.g. ``DASK_DR_DASK__LEASE__TTL=30``).
    token_floor : int
        The largest token already used for ``where`` (recorded in the marks it fenced): a
        lease object deleted on release starts again above it.
    delete_on_release : bool
        Delete the object on release (if still this run's) rather than keep it expired: for a
        lease inside a Zarr group, whose readers would warn about a foreign object.
    """

    def __init__(self, where: Location, ttl: float | None = None, *, token_floor: int = 0,
                 delete_on_release: bool = False):
        self.where, self.token_floor = where, token_floor
        self.delete_on_release = delete_on_release
        self.ttl = float(ttl if ttl is not None else config.get_seconds("lease.ttl"))
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.token = 0
        self._version: str | None = None
        self._lost: str | None = None
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None
        #: When the last successful renewal was sent (this process's monotonic clock): the
        #: lease is this run's for ``ttl`` from then, whatever else happens.
        self._fenced_at = -float("inf")

    def _record(self, expires: float | None = None) -> bytes:
        return json.dumps({"owner": self.owner, "token": self.token,
                           "expires": time.time() + self.ttl if expires is None else expires}
                          ).encode()

    def acquire(self) -> Lease:
        version = None
        for _ in range(3):  # a lease released (deleted) between our two looks: look again
            self.token = self.token_floor + 1
            sent = time.monotonic()  # before the record's expiry is read off the clock
            version = self.where.swap_bytes(self._record(), None)
            if version is not None:
                break
            got = self.where.read_versioned()
            if got is None:
                continue
            held = _parse(got[0], self.where)
            if (held.get("owner") != self.owner and held.get("expires", 0) > time.time()
                    and not _dead_on_this_host(held.get("owner", ""))):
                until = _dt.datetime.fromtimestamp(held["expires"], _dt.UTC)
                raise LeaseHeld(
                    f"another run of this job ({held.get('owner')}) holds {self.where} until "
                    f"{until:%Y-%m-%d %H:%M:%S} UTC (renewed while it runs); retry later"
                )
            if held.get("expires", 0) > 0:
                logger.info("taking over the expired lease %s of %s", self.where,
                            held.get("owner"))
            self.token = max(int(held.get("token", 0)), self.token_floor) + 1
            # over the version read: a run that renewed or took it meanwhile makes this fail
            sent = time.monotonic()
            version = self.where.swap_bytes(self._record(), got[1])
            break
        if version is None:
            raise LeaseHeld(
                f"another run took over the lease {self.where} at the same moment; retry later"
            )
        self._version, self._lost = version, None
        self._fenced_at = sent
        self._stop = threading.Event()
        threading.Thread(target=self._renew_loop, daemon=True, name="dr-dask-lease").start()
        logger.debug("lease %s held by %s (token %d)", self.where, self.owner, self.token)
        return self

    def fence(self) -> int:
        """Renew the lease if this run still holds it, and return its fencing token; else
        raise :class:`LeaseLost`. Call before every commit (a mark, a checkpoint) and let the
        commit carry the token."""
        self._swap()
        return self.token

    def check(self) -> int:
        """Immediately before one write: the fencing token if this run still holds the lease,
        else :class:`LeaseLost`. A fence (a compare-and-swap of the lease) unless one
        succeeded less than a third of the lifetime ago by this process's monotonic clock,
        which runs on through a pause: a holder paused anywhere before this call fences again
        here and finds the lease taken. What remains is a pause between this call and the
        write it guards (see the module docstring)."""
        with self._lock:
            lost = self._lost
            fresh = time.monotonic() - self._fenced_at < self.ttl / 3
        return self.token if lost is None and fresh else self.fence()

    def _swap(self) -> None:
        with self._lock:
            if self._lost is None:
                sent = time.monotonic()  # before the record's expiry is read off the clock
                version = self.where.swap_bytes(self._record(), self._version)
                if version is not None:
                    self._version, self._fenced_at = version, sent
                    return
                now = self.where.read_json() or {}
                holder = (f"{now.get('owner')} (token {now.get('token')})" if now
                          else "another run, which has since released it")
                self._lost = (
                    f"the lease {self.where} was taken over by {holder} while this run "
                    f"({self.owner}, token {self.token}) was paused past its lifetime; this "
                    "run stopped writing and the other run's output stands"
                )
                logger.error("%s", self._lost)
            raise LeaseLost(self._lost)

    def _renew_loop(self) -> None:
        stop = self._stop
        assert stop is not None
        while not stop.wait(self.ttl / 3):
            try:
                self._swap()
            except LeaseLost:
                return  # the next fence raises it where the run can act on it
            except Exception:  # a blip: the next renewal (well before expiry) retries
                logger.warning("could not renew the lease %s", self.where, exc_info=True)

    def stamp(self) -> dict:
        """What a commit mark records of its lease, after a successful fence: ``{token,
        owner}``."""
        return {"token": self.fence(), "owner": self.owner}

    def release(self) -> None:
        """Mark the lease expired (if this run still holds it): the next run takes it at once
        with the next token."""
        if self._stop is None:
            return
        self._stop.set()
        self._stop = None
        with self._lock:
            if self._lost is not None:  # another run holds it: not ours to release
                return
            version = self.where.swap_bytes(self._record(expires=0), self._version)
            if version is not None and self.delete_on_release:
                self.where.delete_if(version)

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


class FencedStore(WrapperStore):
    """A Zarr store whose every write (an object set or deleted: chunks, metadata) is preceded
    by :meth:`Lease.check` of ``lease``: a writer that lost its lease while paused, even in the
    middle of writing an array, writes no further object of it."""

    def __init__(self, store: Store, lease: Lease):
        super().__init__(store)
        self.lease = lease

    def _with_store(self, store: Store) -> FencedStore:
        return type(self)(store, self.lease)

    async def _check(self) -> None:
        # a compare-and-swap on the lease's store: off the event loop zarr runs its I/O on
        await asyncio.to_thread(self.lease.check)

    async def set(self, key: str, value: Buffer) -> None:
        await self._check()
        await self._store.set(key, value)

    async def set_if_not_exists(self, key: str, value: Buffer) -> None:
        await self._check()
        await self._store.set_if_not_exists(key, value)

    async def delete(self, key: str) -> None:
        await self._check()
        await self._store.delete(key)

    async def delete_dir(self, prefix: str) -> None:
        await self._check()
        await self._store.delete_dir(prefix)


class LeaseCorrupt(StorageError):
    """The lease object holds something no run of dr_dask wrote (bad input: exit 2)."""


def _parse(data: bytes, where: Location) -> dict:
    """The lease record in ``data``; an empty object (a local in-place rewrite cut short by a
    kill) is no lease; anything else that is not a record is :class:`LeaseCorrupt`."""
    if not data.strip():
        logger.warning("the lease %s is empty (a write cut short): taking it over", where)
        return {}
    try:
        held = json.loads(data)
    except ValueError:
        held = None
    why = None
    if not isinstance(held, dict):
        why = "not a JSON object"
    # a field may be missing (a lease written before tokens: token 0, expired), never wrong
    elif not isinstance(held.get("owner", ""), str):
        why = f"its owner is {held.get('owner')!r}, not a string"
    elif isinstance(held.get("token", 0), bool) or not isinstance(held.get("token", 0), int) \
            or held.get("token", 0) < 0:
        why = f"its token is {held.get('token')!r}, not an integer >= 0"
    elif isinstance(held.get("expires", 0), bool) \
            or not isinstance(held.get("expires", 0), (int, float)):
        why = f"its expires is {held.get('expires')!r}, not a time in seconds"
    if why is not None:
        raise LeaseCorrupt(f"the lease {where} is not a dr_dask lease ({why}); if no run of this "
                           "job is live, delete it and rerun")
    assert isinstance(held, dict)  # why is None only for a dict
    return held


def _dead_on_this_host(owner: str) -> bool:
    """``owner`` ("host:pid:token") is a process of this host that no longer runs."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    return host == socket.gethostname() and pid.isdigit() and not psutil.pid_exists(int(pid))
