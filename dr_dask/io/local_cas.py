"""Compare-and-swap of one object on a local disk: a complete temporary file renamed into place
under an exclusive lock of its directory (a reader or a kill never meets half an object)."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import time
import uuid
from typing import Any


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _flock(fh: Any, kind: int = fcntl.LOCK_EX, timeout: float = 30.0) -> None:
    """A lock on ``fh`` (exclusive by default); a holder keeps it for one small read and
    write, so waiting longer means that holder is paused (SIGSTOP): give up rather than wait
    with it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fh, kind | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{fh.name} stayed locked for {timeout:.0f} s") from None
            time.sleep(0.01)


@contextlib.contextmanager
def dir_lock(path: str) -> Any:
    """An exclusive lock on the directory holding ``path``: every compare-and-swap or
    compare-and-delete of a local object takes it (no lock file is left beside the object)."""
    directory = os.path.dirname(path) or "."
    fd = os.open(directory, os.O_RDONLY)
    try:
        _flock(_Fd(fd, directory))
        yield  # closing the descriptor releases the lock
    finally:
        os.close(fd)


class _Fd:
    """A bare descriptor (a directory's) as :func:`_flock` takes it."""

    def __init__(self, fd: int, name: str):
        self.fd, self.name = fd, name

    def fileno(self) -> int:
        return self.fd


def local_swap(path: str, data: bytes, version: str | None) -> str | None:
    if version is not None and not os.path.isfile(path):
        return None  # gone (its directory too, perhaps): nothing to swap, nothing to create
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with open(tmp, "wb") as out:
        out.write(data)
    try:
        if version is None:  # create: the name appears with its whole content, or not at all
            try:
                os.link(tmp, path)
            except FileExistsError:
                return None
            return digest(data)
        # compare, then replace by a rename: a reader, or a kill, never meets half an object
        with dir_lock(path):
            try:
                with open(path, "rb") as fh:
                    current = fh.read()
            except FileNotFoundError:
                return None
            if digest(current) != version:
                return None
            os.replace(tmp, path)
            return digest(data)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def local_delete_if(path: str, version: str) -> bool:
    """Delete ``path`` only if its content is still at ``version`` (under the directory's
    lock, as :func:`local_swap`); False when it changed (left alone) or is gone."""
    if not os.path.isdir(os.path.dirname(path) or "."):
        return False
    with dir_lock(path):
        try:
            with open(path, "rb") as fh:
                if digest(fh.read()) != version:
                    return False
        except FileNotFoundError:
            return False
        os.unlink(path)
    return True
