"""One job at a time: a lease object in the run store."""

from __future__ import annotations

import datetime as _dt
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any

import psutil

from dr_dask.storage import Location

logger = logging.getLogger(__name__)


class LeaseHeld(RuntimeError):
    """Another live run of the same job holds its lease (a transient condition: retry later)."""


class Lease:
    """One job at a time: a lease object ``{owner, expires}`` in the run store.

    Taken with create-if-absent (:meth:`Location.create_bytes`: ``O_EXCL`` locally, a
    conditional PUT on S3), renewed every ``ttl / 3`` seconds by a daemon thread while the job
    runs, taken over once expired (a killed run's lease lapses after ``ttl``), deleted on
    release. A holder on this host whose process is gone (a killed run, rerun at once) is
    taken over without waiting for expiry. A second run of the same job while the lease is live
    raises :class:`LeaseHeld` (the CLI exits 1 with the holder and expiry: retry later) rather
    than redoing the work.

    Parameters
    ----------
    where : Location
        The lease object.
    ttl : float
        Seconds a lease stays valid without renewal.
    """

    def __init__(self, where: Location, ttl: float = 60.0):
        self.where, self.ttl = where, float(ttl)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stop: Any = None

    def _record(self) -> bytes:
        return json.dumps({"owner": self.owner, "expires": time.time() + self.ttl}).encode()

    def acquire(self) -> Lease:
        if not self.where.create_bytes(self._record()):
            held = self.where.read_json() or {}
            if (held.get("owner") != self.owner and held.get("expires", 0) > time.time()
                    and not _dead_on_this_host(held.get("owner", ""))):
                until = _dt.datetime.fromtimestamp(held["expires"], _dt.UTC)
                raise LeaseHeld(
                    f"another run of this job ({held.get('owner')}) holds {self.where} until "
                    f"{until:%Y-%m-%d %H:%M:%S} UTC (renewed while it runs); retry later"
                )
            logger.info("taking over the expired lease %s of %s", self.where, held.get("owner"))
            self.where.write_bytes(self._record())
            if (self.where.read_json() or {}).get("owner") != self.owner:  # lost a take-over race
                raise LeaseHeld(
                    f"another run took over the expired lease {self.where}; retry later"
                )
        self._stop = threading.Event()
        threading.Thread(target=self._renew, daemon=True, name="dr-dask-lease").start()
        return self

    def _renew(self) -> None:
        while not self._stop.wait(self.ttl / 3):
            try:
                self.where.write_bytes(self._record())
            except Exception:  # a blip: the next renewal (well before expiry) retries
                logger.warning("could not renew the lease %s", self.where, exc_info=True)

    def release(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None
            if (self.where.read_json() or {}).get("owner") == self.owner:
                self.where.delete()

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _dead_on_this_host(owner: str) -> bool:
    """``owner`` ("host:pid:token") is a process of this host that no longer runs."""
    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    return host == socket.gethostname() and pid.isdigit() and not psutil.pid_exists(int(pid))
