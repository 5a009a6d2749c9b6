"""The storage boundary: a *location* (local path or URL + ``storage_options``) as a Zarr store
and an fsspec filesystem. Nothing else in the package touches a user's location directly.

Why FsspecStore (and zarr's LocalStore for plain paths), not obstore's ObjectStore: fsspec is
already how xarray, dask and zarr users reach S3/GCS/Azure (``s3fs``, ``gcsfs``, ``adlfs``), it
reads credentials and endpoints from the usual places (``AWS_*`` including
``AWS_ENDPOINT_URL``, config files) and takes the same ``storage_options`` users pass to
``xarray.open_zarr``; the non-Zarr objects (marks, reports, checkpoints) go through the very same
filesystem object. zarr marks ``ObjectStore`` experimental and obstore would be a second
credential system. Local paths use ``LocalStore`` (zarr's native store; it creates directories
and avoids the async wrapper), but every commit rule below is written against the filesystem
API and so is one code path for local disk, ``memory://`` and ``s3://``.

Commit rule (object stores have no rename): write the data objects, then one small mark object
(:meth:`Location.write_json`). Readers trust marks only. A single PUT is atomic on object
stores; on local disk :meth:`Location.write_bytes` gives the same guarantee with a temporary
name and ``os.replace`` (the one place a rename is used, invisible to callers).

Local paths are made absolute when a :class:`Location` is built (on the client), so a worker
whose working directory differs reads the same files. A pickled Location (in a task graph)
carries its non-secret ``storage_options`` and only a reference to its credentials, which
reach the workers once by another path (:mod:`dr_dask.runtime.credentials`). Neither appears in its
``str``/``repr``: only :attr:`url` is ever recorded or printed.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import posixpath
import threading
import time
from collections.abc import Sequence
from typing import Any

import fsspec
import numpy as np
import zarr
from fsspec.asyn import sync
from zarr.core.buffer import default_buffer_prototype

from dr_dask.io.errors import (  # the boundary's errors, imported from here by its callers
    NOT_WRITABLE,
    StorageError,
    StorageUnavailable,
    http_status,
    raise_if_transient,
    scrub,
    unwritable,
)
from dr_dask.io.local_cas import digest, local_delete_if, local_swap
from dr_dask.runtime import config, credentials

logger = logging.getLogger(__name__)

#: Which package gives fsspec each common protocol (for the "install X" error).
_PACKAGES = {
    "s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "az": "adlfs", "abfs": "adlfs",
    "abfss": "adlfs", "adl": "adlfs", "http": "aiohttp", "https": "aiohttp",
}

#: Bounded timeouts/retries for S3 so an unreachable endpoint fails in seconds, not minutes
#: (botocore defaults: 60 s connect timeout, several retries). botocore's "standard" retry mode
#: retries throttling, 5xx and connection errors with jittered exponential backoff; s3fs retries
#: each call again (``dr_dask.storage.s3-call-retries``), and idempotent reads are retried once
#: more here (``read-attempts``, ``read-backoff``; writes are left to the clients). Users may
#: override the botocore settings.
#: ``max_concurrency=1``: s3fs otherwise asks every whole object's size (a HEAD) before its GET,
#: to split objects over its block size (50 MiB) into concurrent ranged reads; a chunk or a
#: metadata document is far smaller, and the workers already read many chunks at once, so the
#: HEAD was a wasted round trip on every read (a third of a nightly job's requests).
_S3_DEFAULTS: dict[str, Any] = {
    "max_concurrency": 1,
    "config_kwargs": {"connect_timeout": 5, "read_timeout": 60,
                      "retries": {"max_attempts": 2, "mode": "standard"}},
}

_MEMORY_LOCK = threading.Lock()


def _split_scheme(url: str) -> tuple[str, str]:
    if "://" in url:
        scheme, rest = url.split("://", 1)
        return scheme.lower(), rest
    return "", url


class Location:
    """A local path or URL plus ``storage_options``.

    Parameters
    ----------
    url : str or os.PathLike or Location
        ``/abs/path``, ``rel/path``, ``file:///path``, ``s3://bucket/key``, ``gs://…``,
        ``az://…``, ``memory://…``.
    storage_options : dict, optional
        Passed to the fsspec filesystem (``key``, ``secret``, ``endpoint_url``, ``anon``, …).
    """

    def __init__(self, url: Any, storage_options: dict | None = None):
        if isinstance(url, Location):
            storage_options = {**url.storage_options, **(storage_options or {})}
            url = url.url
        url = os.fspath(url)
        scheme, rest = _split_scheme(url)
        if scheme in ("", "file", "local"):
            url = os.path.abspath(os.path.expanduser(rest if scheme else url))
            scheme = ""
        self.url: str = url.rstrip("/") if scheme else url
        self.scheme = scheme
        self.storage_options: dict = dict(storage_options or {})
        self._fs: Any = None
        #: The reference to this Location's credentials it was unpickled with (if any).
        self._credentials: str | None = None

    # ------------------------------------------------------------------ identity
    def __repr__(self) -> str:
        return f"Location({self.url!r})"

    def __str__(self) -> str:
        return self.url

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Location) and other.url == self.url

    def __hash__(self) -> int:
        return hash(self.url)

    def __getstate__(self) -> dict:
        # credentials never travel in a pickle (a task graph): a reference to them does. The
        # reference a Location arrived with is kept: the scheduler unpickles and re-pickles
        # task graphs without holding the credentials themselves
        public, secret = credentials.split(self.storage_options)
        state = {"url": self.url, "scheme": self.scheme, "storage_options": public}
        ref = self._credentials or (credentials.reference(secret) if secret else None)
        if ref is not None:
            state["credentials"] = ref
        return state

    def __setstate__(self, state: dict) -> None:
        state = dict(state)
        ref = state.pop("credentials", None)
        if ref is not None:  # {} where they were never delivered: this process's own
            state["storage_options"] = {**state["storage_options"],
                                        **credentials.resolve(ref)}
        self.__dict__.update(state, _fs=None, _credentials=ref)

    def _backend_options(self) -> dict:
        """The storage options a filesystem or store is built with here (saying so when the
        credentials this Location was sent with never reached this process)."""
        if self._credentials is not None and not credentials.resolve(self._credentials):
            credentials.warn_missing(self._credentials, self.url)
        return self.storage_options

    @property
    def is_local(self) -> bool:
        return self.scheme == ""

    @property
    def name(self) -> str:
        return posixpath.basename(self.url.rstrip("/"))

    def child(self, *parts: str) -> Location:
        """The location ``self/part/...`` with the same storage options."""
        sep = os.sep if self.is_local else "/"
        out = Location.__new__(Location)
        out.__setstate__({"url": sep.join([self.url.rstrip(sep), *parts]), "scheme": self.scheme,
                          "storage_options": self.storage_options})
        out._credentials = self._credentials
        return out

    def contains(self, other: Location) -> bool:
        """``other`` is this location or lies inside it."""
        a, b = self.url.rstrip("/"), other.url.rstrip("/")
        if self.is_local:
            a, b = os.path.realpath(a), os.path.realpath(b)
        sep = os.sep if self.is_local else "/"
        return a == b or b.startswith(a + sep)

    # ------------------------------------------------------------------ backends
    @property
    def fs(self) -> Any:
        """The fsspec filesystem (created on first use, in the process that uses it)."""
        if self._fs is None:
            self._fs = filesystem(self.scheme, self._backend_options())
        return self._fs

    @property
    def path(self) -> str:
        """The path inside :attr:`fs` (bucket/key for object stores)."""
        return self.url if self.is_local else self.fs._strip_protocol(self.url)

    def zarr_store(self, read_only: bool = False) -> Any:
        """A zarr 3 store rooted here."""

        if self.is_local:
            return _LocalStore(self.url, read_only=read_only)
        return zarr.storage.FsspecStore.from_url(
            self.url, storage_options=_options(self.scheme, self._backend_options()),
            read_only=read_only,
        )

    # ------------------------------------------------------------------ objects
    def exists(self) -> bool:
        """An object or a prefix (directory) is here."""
        return bool(_read(self, self.fs.exists, self.path))

    def check(self) -> None:
        """Fail early and clearly (StorageError) when the store behind this location cannot be
        used: unreachable endpoint, refused credentials, missing bucket/container; a local
        output where nothing can be created (no permission, a read-only filesystem, /proc)."""
        if self.is_local:
            _check_writable(self.url)
            return
        root = self.path.split("/", 1)[0]
        try:
            _read(self, self.fs.ls, root, detail=False)
        except FileNotFoundError:
            raise StorageError(f"{self.url}: bucket/container {root!r} does not exist") from None

    def read_bytes(self) -> bytes:
        return _read(self, self.fs.cat_file, self.path)

    def write_bytes(self, data: bytes) -> None:
        """Write one object (a single PUT on object stores)."""
        if self.is_local:  # a local file appears whole too: temporary name, then rename
            tmp = f"{self.url}.tmp-{os.getpid()}"
            try:
                os.makedirs(os.path.dirname(self.url), exist_ok=True)
                with open(tmp, "wb") as fh:
                    fh.write(data)
                os.replace(tmp, self.url)
            except OSError as exc:  # the user's location, named (not the temporary file)
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                if exc.errno not in NOT_WRITABLE:
                    raise
                raise StorageError(unwritable(self.url, exc)) from None
            return
        _guard(self, self.fs.pipe_file, self.path, data)

    def write_npy(self, array: Any) -> None:
        """Write ``array`` as one ``.npy`` object (no pickled objects)."""


        buf = io.BytesIO()
        np.save(buf, np.asarray(array), allow_pickle=False)
        self.write_bytes(buf.getvalue())

    def create_bytes(self, data: bytes) -> bool:
        """Write the object only if absent (create-if-absent); False when it already exists.

        Atomic where the backend offers it: a hard link of a complete temporary file on local
        disk, a conditional PUT (``If-None-Match: *``) on S3, a lock on ``memory://``. Other
        filesystems check, then write (a small race).
        """
        return self.swap_bytes(data, None) is not None

    def read_versioned(self) -> tuple[bytes, str] | None:
        """The object's bytes and version (None when absent), for :meth:`swap_bytes`.

        The version is the ETag on S3 (from the same GET as the bytes), else a hash of the
        bytes (a local swap renames a complete file into place: a read never sees half of it).
        """
        try:
            if self.is_local:
                with open(self.url, "rb") as fh:  # swaps rename: never half an object
                    data = fh.read()
                return data, digest(data)
            if self.scheme in ("s3", "s3a"):
                bucket, key, _ = self.fs.split_path(self.path)
                return _guard(self, sync, self.fs.loop, _s3_get, self.fs, bucket, key)
            data = self.read_bytes()
        except FileNotFoundError:
            return None
        return data, digest(data)

    def swap_bytes(self, data: bytes, version: str | None) -> str | None:
        """Compare-and-swap: write ``data`` only if the object is still at ``version`` (from
        :meth:`read_versioned` or a previous swap; None: only if absent). Returns the new
        version, or None when the object changed or appeared meanwhile (nothing written).

        S3: a conditional PUT (``If-Match: <ETag>``, ``If-None-Match: *``); local disk: the
        comparison and a rename of a complete temporary file under an exclusive ``flock`` of
        the directory (creation: a hard link of a complete temporary file, which fails if the
        name exists); ``memory://``: under a
        process lock (the filesystem lives in this process). Other filesystems compare, then
        write: two requests, a small race.
        """
        if self.is_local:
            return local_swap(self.url, data, version)
        if self.scheme in ("s3", "s3a"):
            match = {"mode": "create"} if version is None else {"IfMatch": version}

            def put() -> Any:
                try:
                    return self.fs.pipe_file(self.path, data, **match)
                except OSError as exc:  # 412 on If-Match, which s3fs reports as EINVAL
                    if _precondition_failed(exc):
                        raise FileExistsError(self.url) from None
                    raise

            try:
                return str(_guard(self, put)["ETag"])
            except (FileExistsError, FileNotFoundError):
                return None
        with _MEMORY_LOCK if self.scheme == "memory" else contextlib.nullcontext():
            got = self.read_versioned()
            if (got is None) != (version is None) or (got is not None and got[1] != version):
                return None
            self.write_bytes(data)
            return digest(data)

    def delete_if(self, version: str) -> bool:
        """Delete the object only if it is still at ``version`` (compare-and-delete, as
        :meth:`swap_bytes`); False when it changed (left alone) or is gone."""
        if self.is_local:
            return local_delete_if(self.url, version)
        if self.scheme in ("s3", "s3a"):
            bucket, key, _ = self.fs.split_path(self.path)

            def delete() -> None:
                try:
                    self.fs.call_s3("delete_object", Bucket=bucket, Key=key, IfMatch=version)
                except OSError as exc:
                    if _precondition_failed(exc):
                        raise FileExistsError(self.url) from None
                    raise
                self.fs.invalidate_cache(self.path)

            try:
                _guard(self, delete)
            except (FileExistsError, FileNotFoundError):
                return False
            return True
        with _MEMORY_LOCK if self.scheme == "memory" else contextlib.nullcontext():
            got = self.read_versioned()
            if got is None or got[1] != version:
                return False
            self.delete()
            return True

    def read_json(self, default: Any = None) -> Any:
        """The JSON object here, or ``default`` when absent or unparsable (a torn local write)."""
        try:
            return json.loads(self.read_bytes())
        except (FileNotFoundError, ValueError):
            return default

    def write_json(self, obj: Any) -> None:
        """Write one small JSON object (a mark, a checkpoint): a single PUT."""
        self.write_bytes(json.dumps(obj).encode())

    def open(self, mode: str = "rb") -> Any:
        if self.is_local and "w" in mode:
            os.makedirs(os.path.dirname(self.url), exist_ok=True)
        return _guard(self, self.fs.open, self.path, mode)

    def delete(self) -> None:
        """Remove the object or everything under this prefix (absent is fine)."""
        try:
            if self.fs.exists(self.path):
                self.fs.rm(self.path, recursive=True)
        except FileNotFoundError:
            pass

    def listdir(self) -> list[str]:
        """Names directly under this prefix (sorted; [] when absent). Never used to decide
        whether something is complete: marks do that."""
        try:
            entries = _read(self, self.fs.ls, self.path, detail=False)
        except FileNotFoundError:
            return []
        return sorted(posixpath.basename(e.rstrip("/")) for e in entries)

    def find(self) -> dict[str, dict]:
        """Every object under this prefix, relative key -> info (size, ETag or mtime): one
        listing (paged on object stores)."""
        base = self.path.rstrip("/") + "/"
        try:
            found = _read(self, self.fs.find, self.path, detail=True)
        except FileNotFoundError:
            return {}
        return {k[len(base):] if k.startswith(base) else k: v for k, v in found.items()}

    def digests(self) -> dict[str, str]:
        """The content of every object under this prefix but its ``zarr.json`` (a Zarr array's
        chunks, as stored: encoded bytes), relative key -> SHA-256: one listing and one
        concurrent read. What a completion mark records, and a reader compares, to know that a
        result still holds what was written (a chunk overwritten or truncated since differs)."""
        keys = sorted(k for k in self.find() if posixpath.basename(k) != "zarr.json")
        if not keys:
            return {}
        base = self.path.rstrip("/")
        paths = [f"{base}/{k}" for k in keys]
        data = _read(self, self.fs.cat, paths, on_error="raise")
        # fsspec answers under each path as it strips it: look them up the same way
        return {k: digest(data[self.fs._strip_protocol(p)]) for k, p in zip(keys, paths)}


async def _s3_get(fs: Any, bucket: str, key: str) -> tuple[bytes, str]:
    """Bytes and ETag of one object from one GET (a HEAD then a GET could pair other
    versions)."""
    resp = await fs._call_s3("get_object", Bucket=bucket, Key=key)
    try:
        return await resp["Body"].read(), str(resp["ETag"])
    finally:
        resp["Body"].close()


def _precondition_failed(exc: BaseException) -> bool:
    response = getattr(exc.__cause__, "response", None) or {}
    return response.get("Error", {}).get("Code") in ("PreconditionFailed", "412")


class _LocalStore(zarr.storage.LocalStore):
    """zarr's LocalStore, whose failed writes name the file: a full disk raises ENOSPC from a
    write, which names none, and the user must be told where."""

    async def set(self, key: str, value: Any) -> None:
        try:
            await super().set(key, value)
        except OSError as exc:
            if exc.filename or exc.errno not in NOT_WRITABLE:
                raise
            raise OSError(exc.errno, exc.strerror, f"{str(self.root).rstrip('/')}/{key}") \
                from exc


def _check_writable(path: str) -> None:
    """A StorageError, naming ``path`` and the fix, unless a directory can be created where
    local output ``path`` goes: probed by creating and removing one (a permission bit, a
    read-only mount, ``/proc`` each answer only to a write)."""
    here = path
    while not os.path.exists(here) and os.path.dirname(here) != here:
        here = os.path.dirname(here)
    probe = os.path.join(here, f".dr-dask-probe-{os.getpid()}-{threading.get_ident()}")
    try:
        os.mkdir(probe)
        os.rmdir(probe)
    except OSError as exc:
        if exc.errno not in NOT_WRITABLE:
            raise
        raise StorageError(unwritable(path, exc)) from None


def location(url: Any, storage_options: dict | None = None) -> Location:
    """``url`` as a :class:`Location` (a Location is returned with options merged)."""
    if isinstance(url, Location) and not storage_options:
        return url
    return Location(url, storage_options)


def read_array(group: zarr.Group, name: str) -> np.ndarray:
    """The array ``name`` of ``group``, read into memory (a :class:`StorageError` if ``name``
    is a subgroup: ``group[name]`` may be either)."""
    node = group[name]
    if not isinstance(node, zarr.Array):
        raise StorageError(f"{name!r} in the Zarr group is a group, not an array")
    return np.asarray(node[...])


def read_spans(arr: zarr.Array,
               spans: Sequence[tuple[int, int]] | np.ndarray) -> np.ndarray:
    """``arr``'s rows of the spans, in order, in one array: adjacent spans read at once, each
    run decoded straight into its place (joining runs read apart held everything twice)."""
    runs: list[list[int]] = []
    for s, e in spans:
        if e <= s:
            continue
        if runs and runs[-1][1] == s:
            runs[-1][1] = e
        else:
            runs.append([s, e])
    out = np.empty((sum(e - s for s, e in runs), *arr.shape[1:]), dtype=arr.dtype)
    at = 0
    for s, e in runs:
        view = out[at:at + e - s]
        arr.get_basic_selection(slice(s, e), out=default_buffer_prototype().nd_buffer
                                .from_numpy_array(view))
        at += e - s
    return out


def filesystem(scheme: str, storage_options: dict | None = None) -> Any:
    """The fsspec filesystem for ``scheme`` ('' = local), or a StorageError naming the package."""

    if scheme == "":
        return fsspec.filesystem("file", auto_mkdir=True, **(storage_options or {}))
    try:
        cls = fsspec.get_filesystem_class(scheme)
    except ImportError:
        pkg = _PACKAGES.get(scheme, f"the fsspec implementation for {scheme}://")
        raise StorageError(
            f"no installed filesystem handles {scheme}:// URLs; install {pkg} "
            f"(pip install {pkg})"
        ) from None
    except ValueError:
        raise StorageError(f"unknown URL scheme {scheme}:// (no fsspec filesystem)") from None
    fs = cls(**_options(scheme, storage_options))
    if scheme in ("s3", "s3a"):  # not a constructor argument of s3fs: an attribute it reads
        fs.retries = int(config.get("storage.s3-call-retries"))
    return fs


def _options(scheme: str, storage_options: dict | None) -> dict:
    """``storage_options`` over our defaults for ``scheme`` (bounded S3 timeouts)."""
    options = dict(storage_options or {})
    if scheme in ("s3", "s3a"):
        config = {**_S3_DEFAULTS["config_kwargs"], **options.pop("config_kwargs", {})}
        options = {**_S3_DEFAULTS, **options, "config_kwargs": config}
    return options


def _guard(loc: Location, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call ``fn``; turn a store's failure into a :class:`StorageUnavailable` (transient) or a
    :class:`StorageError` (refused credentials, a missing bucket, a bad request) naming the
    location (never the credentials)."""
    try:
        return fn(*args, **kwargs)
    except (FileNotFoundError, FileExistsError):  # answers, not failures: callers handle them
        raise
    except TypeError as exc:  # an option the filesystem (or its client session) does not take
        if "unexpected keyword argument" not in str(exc):
            raise
        raise StorageError(f"{loc.url}: a --storage-option is not an option of its filesystem "
                           f"({scrub(exc, loc)}); remove it or check its name") from None
    except Exception as exc:
        raise_if_transient(exc, loc)
        if isinstance(exc, PermissionError) or http_status(exc) in (401, 403):
            raise StorageError(f"access to {loc.url} was refused (check credentials): "
                               f"{scrub(exc, loc)}") from None
        name = type(exc).__name__
        if isinstance(exc, OSError) or any(s in name for s in ("Credential", "ClientError",
                                                                "Endpoint")):
            raise StorageError(f"cannot use {loc.url}: {name}: {scrub(exc, loc)}") from None
        raise


def _read(loc: Location, fn: Any, *args: Any, **kwargs: Any) -> Any:
    """:func:`_guard` for an idempotent read, tried ``dr_dask.storage.read-attempts`` times with
    backoff while the store fails transiently."""
    attempts = int(config.get("storage.read-attempts"))
    for attempt in range(1, attempts + 1):
        try:
            return _guard(loc, fn, *args, **kwargs)
        except StorageUnavailable as exc:
            if attempt == attempts:
                raise
            wait = config.get_seconds("storage.read-backoff") * 2 ** (attempt - 1)
            logger.warning("%s; reading again in %gs (attempt %d of %d)", exc, wait,
                           attempt + 1, attempts)
            time.sleep(wait)
    raise AssertionError("unreachable")
