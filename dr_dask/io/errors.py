"""The storage boundary's two failures: bad input (:class:`StorageError`, exit 2) and a store
that does not answer now (:class:`StorageUnavailable`, exit 1), and the rule that tells a
transient failure from the others (:func:`is_transient`) for the handlers that must."""

from __future__ import annotations

import errno
import os
import shutil
from typing import Any

from dr_dask.runtime import credentials

#: Answers of an object store that mean "not now": throttling, and the server's own failures.
_TRANSIENT_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                    "TooManyRequests", "RequestTimeout", "ServiceUnavailable", "InternalError",
                    "OperationAborted"}
#: errno values s3fs gives those answers (SlowDown/503 -> EBUSY, 500 -> EREMOTEIO) and the
#: network's own.
_TRANSIENT_ERRNOS = {errno.EBUSY, getattr(errno, "EREMOTEIO", errno.EIO), errno.EAGAIN,
                     errno.ETIMEDOUT, errno.ECONNREFUSED, errno.ECONNRESET, errno.ECONNABORTED,
                     errno.EHOSTUNREACH, errno.ENETUNREACH}


#: ``memory://`` filesystems live in this process: one lock makes their swaps atomic.


class StorageError(ValueError):
    """A location is unusable as given: unknown scheme, missing bucket, refused credentials.
    Bad input or configuration (exit 2): a retry fails the same way."""


#: errno values of a local location that cannot be written: no permission, a read-only
#: filesystem, no room (a full disk, a quota, a file-size limit), a parent that cannot hold
#: files (``/proc``, a file where a directory should be: ENOTDIR, or EEXIST from makedirs).
NOT_WRITABLE = {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                errno.EFBIG, errno.ENOENT, errno.ENOTDIR, errno.EEXIST}
_NO_ROOM = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


def unwritable(path: str, exc: OSError) -> str:
    """The one line that says why local ``path`` cannot be written, and the fix (a full disk
    with its free bytes)."""
    why = exc.strerror or type(exc).__name__
    if exc.errno in _NO_ROOM:
        here = path
        while here and not os.path.exists(here) and os.path.dirname(here) != here:
            here = os.path.dirname(here)
        try:
            free = f"{shutil.disk_usage(here).free:,} bytes free there"
        except OSError:
            free = "its free space unknown"
        limit = (" or this process's file-size limit (ulimit -f)"
                 if exc.errno == errno.EFBIG else "")
        return (f"cannot write {path}: {why} ({free}); free space on its filesystem{limit}, "
                "or choose another location")
    if exc.errno == errno.EROFS:
        return f"cannot write {path}: {why}; choose a location on a writable filesystem"
    if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EEXIST):
        return (f"cannot write {path}: {why}; its parent is not a directory that can hold "
                "files (/proc, /sys, a file): choose a directory you can write to")
    return (f"cannot write {path}: {why}; choose a location you can write to (or fix its "
            "permissions)")


class StorageUnavailable(ConnectionError):
    """The store did not answer (connection refused, timeout) or answered "not now"
    (throttling, 5xx). Transient (exit 1): a rerun later resumes."""


def _chain(exc: BaseException) -> list[BaseException]:
    """``exc`` and its causes (s3fs raises an OSError caused by botocore's ClientError)."""
    seen: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and e not in seen:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of a botocore ClientError in ``exc``'s chain, if any."""
    for e in _chain(exc):
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
            if status:
                return int(status)
    return None


def is_transient(exc: BaseException) -> bool:
    """``exc`` says the store is unreachable or asks to come back later: a connection refused
    or reset, a timeout, throttling (SlowDown, 429) or a server error (5xx). Refused
    credentials, a missing bucket or object and bad data are not transient."""
    for e in _chain(exc):
        if isinstance(e, (PermissionError, FileNotFoundError)):
            return False
        if isinstance(e, (ConnectionError, TimeoutError)):
            return True
        if isinstance(e, OSError) and e.errno in _TRANSIENT_ERRNOS:
            return True
        name = type(e).__name__  # botocore / aiohttp, which fsspec does not translate
        if any(s in name for s in ("EndpointConnection", "ConnectTimeout", "ReadTimeout",
                                   "ConnectionClosed", "ServerDisconnected", "Throttl")):
            return True
        response = getattr(e, "response", None)
        if isinstance(response, dict):
            code = response.get("Error", {}).get("Code")
            status = response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0
            if code in _TRANSIENT_CODES or int(status) >= 500 or int(status) == 429:
                return True
    return False


def raise_if_transient(exc: BaseException, loc: Any) -> None:
    """Raise :class:`StorageUnavailable` naming ``loc`` when ``exc`` is transient
    (:func:`is_transient`); for the few places that turn any other failure into bad input."""
    if is_transient(exc):
        located = hasattr(loc, "storage_options")  # a Location (this module is below it)
        where = loc.url if located else str(loc)
        text = scrub(exc, loc) if located else str(exc)
        raise StorageUnavailable(f"cannot reach {where} now (transient: retry later): "
                                 f"{type(exc).__name__}: {text}") from None


def scrub(exc: BaseException, loc: Any) -> str:
    """The exception text with any storage-option value that looks secret removed."""
    text = str(exc)
    for key, value in loc.storage_options.items():
        if isinstance(value, str) and len(value) >= 8 and credentials.secret_name(key):
            text = text.replace(value, "***")
    for var in ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_KEY"):
        if len(os.environ.get(var, "")) >= 8:
            text = text.replace(os.environ[var], "***")
    return text


#: Options every fsspec filesystem takes (``AbstractFileSystem``'s own).
