"""Inputs: open a samples x features source read-only and say what it is.

Inputs are samples x features, samples along the first axis, from a Zarr array, a variable of
a Zarr group (xarray-written or not), a NetCDF file (through xarray) or a ``.npy`` file, or an
in-memory numpy / dask / zarr / xarray object. They are opened read-only and never modified.
Opening checks the structure (2-D, numeric) and that every stored chunk is present (the data
boundary: :mod:`dr_dask.io.boundary`, whose :class:`InputError` is importable from here), and
records the input's identity (location, variable, shape, dtype and a fingerprint of the stored
chunks' content), which names the runs made from it. The values are checked by
:func:`dr_dask.io.validation.check_values`.

Identity is content, not size and modification time (``cp -p``, ``rsync -t`` and in-memory
stores rewrite bytes and keep both): a stored object's fingerprint is the content tag its store
keeps (S3's checksums or ETag, GCS's md5/crc32c, any ETag: each changes whenever the bytes do),
else a hash of its bytes that the workers compute on demand (:meth:`InputData.identify`: one
read of every stored object without a tag, in pieces of ``HASH_PIECE`` bytes).
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import logging
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, cast

import dask
import dask.array as da
import numpy as np
import xarray as xr
import zarr

from dr_dask.io.boundary import (
    InputError,
    NpyRows,
    ZarrRows,
    _check_chunks,
    _current,
    check_claimed,
)
from dr_dask.io.checkpoint import deleted_on_failure
from dr_dask.io.storage import (
    Location,
    StorageError,
    StorageUnavailable,
    location,
    raise_if_transient,
)
from dr_dask.runtime import config
from dr_dask.runtime.cluster import active_client, compute, run_on_workers
from dr_dask.runtime.credential_delivery import deliver_credentials

logger = logging.getLogger(__name__)

@dataclass
class InputData:
    """A validated-on-demand view of a samples x features input.

    Attributes
    ----------
    data : dask.array.Array of shape (T, N)
        Row-chunked, lazily read.
    sample_ids : ndarray of shape (T,) or None
        The sample coordinate when the source has one.
    identity : dict
        Where the data came from and what it holds (location, variable, shape, chunks, dtype,
        and the content ``fingerprint`` once known: at open when the store keeps content
        tags, else after :meth:`identify`): recorded in, and part of the name of, every run.
    location : Location or None
        Where it is stored (None for in-memory inputs).
    values : ndarray of shape (T, N) or None
        The checked in-memory array, when there is one
        (:func:`dr_dask.io.validation.check_input`).
    """

    data: da.Array
    sample_ids: np.ndarray | None = None
    identity: dict = field(default_factory=dict)
    location: Location | None = None
    values: np.ndarray | None = None
    #: The stored objects (their prefix and listing) whose content is not hashed yet.
    stored: tuple[Location, dict[str, dict]] | None = field(default=None, repr=False)
    #: Where an in-memory array's rows were written for a cluster's workers
    #: (:func:`rows_for_workers`); ``data`` reads them there.
    staged: Location | None = field(default=None, repr=False)
    #: Deletes ``staged`` (once): when this object is collected, or at :meth:`discard`.
    _delete_staged: Callable[[], Any] | None = field(default=None, repr=False, compare=False)

    def identify(self, client: Any = None) -> dict:
        """:attr:`identity` with its content ``fingerprint``, hashing the content now when
        the store keeps no tag for it (the stored objects' bytes, or an in-memory array's
        blocks, on ``client``'s workers or dask's threads); computed once."""
        if "fingerprint" not in self.identity:
            self.identity["fingerprint"] = (
                stored_fingerprint(*self.stored, client=client) if self.stored is not None
                else values_fingerprint(self.data, client=client))
        return self.identity

    def discard(self) -> None:
        """Delete the rows staged for the workers now, not when this object is collected.

        For a search that used them, and for a fit that failed or was interrupted: its
        traceback holds this object for as long as the session keeps the error (IPython keeps
        the last one), and with it a temporary store the size of the input.
        """
        if self._delete_staged is not None:
            self._delete_staged()

    @property
    def path(self) -> str | None:
        return self.identity.get("path")

    @property
    def name(self) -> str:
        var = self.identity.get("variable")
        return f"{self.path}:{var}" if var else str(self.path or "array")


def parse_source(source: str, storage_options: dict | None = None) -> tuple[str, str | None]:
    """Split ``"STORE[:VAR]"`` into location and variable (an existing location is taken whole;
    the ``:`` of a URL scheme such as ``s3://`` is never a variable separator)."""
    if ":" not in source or location(source, storage_options).exists():
        return source, None
    path, var = source.rsplit(":", 1)
    if var.startswith("/"):  # the only ':' is the scheme's, as in s3://bucket/x.zarr
        return source, None
    return path, var or None


def _row_chunks(shape: tuple[int, ...], itemsize: int, native: int | None = None) -> int:
    n_cols = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    rows = max(256, config.get_bytes("input.chunk-bytes") // max(1, n_cols * itemsize))
    if native:  # align with the store's own chunks so no chunk is read twice
        rows = max(native, rows // native * native)
    return int(min(rows, max(1, shape[0])))


def _memory_rows(arr: np.ndarray, rows: int) -> da.Array:
    """A dask array whose blocks are views of ``arr``'s row blocks.

    ``da.from_array`` copies a NumPy array whole (against later mutation): one more copy of
    the input in this process for every fit (160 MB at T=20,000, N=1,000 in float64). The
    estimators read the input only while ``fit`` runs, so views are enough.
    """
    chunks = da.core.normalize_chunks((rows, -1), arr.shape, dtype=arr.dtype)
    name = "memory-rows-" + dask.base.tokenize(arr, chunks)
    bounds = np.cumsum((0, *chunks[0]))
    graph = {(name, i, 0): arr[bounds[i]:bounds[i + 1]] for i in range(len(chunks[0]))}
    return da.Array(graph, name, chunks, dtype=arr.dtype)


def memory_input(values: np.ndarray, client: Any) -> InputData:
    """An in-memory array as an input whose rows a cluster's workers can read
    (:func:`rows_for_workers`); ``values`` kept as the checked array."""
    inp = open_dataset(values)
    inp.values = values
    return rows_for_workers(inp, client)


def rows_for_workers(inp: InputData, client: Any) -> InputData:
    """``inp`` with an in-memory array's rows where a cluster's workers read them.

    A NumPy input is part of the task graph (:func:`_memory_rows`): on a cluster the whole
    array travels through the scheduler in the graph (dask's "Sending large graph" warning at
    T=10^6, N=100 float32: 381 MiB), once per computation that needs it. Above
    ``dr_dask.input.stage-bytes`` it is written instead to a local temporary Zarr store which
    the workers read where they run (a lost worker's blocks are read again); the store goes
    with ``inp``. Workers that cannot see this machine's disk (asked as for a stored input)
    get the array in the graph as before.
    """
    import tempfile
    import weakref

    arr = inp.values
    if (client is None or arr is None or inp.location is not None
            or arr.nbytes <= config.get_bytes("input.stage-bytes")):
        return inp
    loc = location(tempfile.mkdtemp(prefix="dr_dask_input_"))
    rows = inp.data.chunks[0][0]
    # the workers look for the store while this process fills it: on a fresh cluster the
    # question is their first task, which imports the modules (0.5 s at T = 10^4, N = 1,000,
    # as long as writing the 80 MB); interrupted (seconds at T = 10^6), it leaves nothing
    with deleted_on_failure(loc.delete), ThreadPoolExecutor(1) as pool:
        z = zarr.create_array(loc.zarr_store(), shape=arr.shape, chunks=(rows, arr.shape[1]),
                              dtype=arr.dtype, compressors=None)
        asked = pool.submit(contextvars.copy_context().run, run_on_workers, client, _can_read,
                            loc)
        for s in range(0, len(arr), rows):
            z[s:s + rows] = arr[s:s + rows]
        unreadable = any(asked.result().values())
    if unreadable:
        logger.info("the workers do not share this disk: the input travels in the graph")
        loc.delete()
        return inp
    staged = InputData(da.from_array(z, chunks=(rows, -1), asarray=True, inline_array=True),
                       inp.sample_ids, inp.identity, None, arr, inp.stored, loc)
    staged._delete_staged = weakref.finalize(staged, loc.delete)
    logger.info("input rows (%.0f MB) staged at %s for the workers", arr.nbytes / 1e6, loc)
    return staged


def _input_identity(loc: Location | None, variable: str | None, arr: Any,
                    content: dict) -> dict:
    """Where the input came from and what it holds: location (URL or absolute path, never
    credentials), variable, shape, chunks, dtype and a fingerprint of its stored bytes."""
    return {
        "path": loc.url if loc else None,
        "variable": variable,
        "shape": [int(s) for s in arr.shape],
        "dtype": str(arr.dtype),
        **content,
    }


#: Bytes per hashing task (a large object is hashed in pieces of this size, small ones are
#: grouped up to it).
HASH_PIECE = 64 * 2**20
#: Listing fields that change whenever an object's bytes do (S3 checksums and ETag, GCS's
#: md5/crc32c, any ETag); a modification time or a size does not qualify.
_CONTENT_TAGS = ("ChecksumSHA256", "ChecksumSHA1", "ChecksumCRC32C", "ChecksumCRC32",
                 "ChecksumCRC64NVME", "md5Hash", "crc32c", "ETag", "etag")


def content_tag(info: dict) -> str | None:
    """A tag of a stored object's content from its listing entry ``info`` (a checksum or
    an ETag the store computed, :data:`_CONTENT_TAGS`); None when the store gives none."""
    for key in _CONTENT_TAGS:
        if info.get(key):
            return f"{key}:{info[key]}"
    return None


def _fingerprint(items: list) -> str:
    return hashlib.sha1(json.dumps(items).encode()).hexdigest()[:16]


def listed_fingerprint(listing: dict[str, dict]) -> str | None:
    """The fingerprint of stored objects from their listing alone: (key, size, content tag)
    of each; None when one of them has no content tag (its bytes must be hashed)."""
    items = [(key, int(listing[key].get("size") or 0), content_tag(listing[key]))
             for key in sorted(listing)]
    if any(tag is None for _, _, tag in items):
        return None
    return _fingerprint(items)


def stored_fingerprint(base: Location, listing: dict[str, dict], client: Any = None) -> str:
    """The fingerprint of the objects ``listing`` names under ``base``: (key, size, content
    tag or hash of its bytes) of each. The bytes of the objects without a tag are read and
    hashed on the workers, in pieces of :data:`HASH_PIECE` (the pieces depend on the objects
    only, never on how the input is chunked for a fit)."""
    items: list[list[Any]] = []
    pieces: list[tuple[str, int, int]] = []
    for key in sorted(listing):
        size = int(listing[key].get("size") or 0)
        tag = content_tag(listing[key])
        items.append([key, size, tag])
        if tag is None:
            pieces += [(key, a, min(a + HASH_PIECE, size)) for a in range(0, size, HASH_PIECE)]
            pieces += [(key, 0, 0)] if size == 0 else []
    batches: list[list[tuple[str, int, int]]] = []
    filled = HASH_PIECE
    for piece in pieces:  # small objects (Zarr chunks) share a task up to HASH_PIECE bytes
        if filled + piece[2] - piece[1] > HASH_PIECE:
            batches.append([])
            filled = 0
        batches[-1].append(piece)
        filled += piece[2] - piece[1]
    results = compute(*[dask.delayed(_hash_pieces, pure=True)(base, batch)
                        for batch in batches], client=client)
    digests: dict[str, list[str]] = {}
    for batch, found in zip(batches, results):
        for (key, _, _), digest in zip(batch, found):
            digests.setdefault(key, []).append(digest)
    for item in items:
        if item[2] is None:
            item[2] = "sha1:" + ",".join(digests[item[0]])
    logger.debug("hashed %d bytes of %s", sum(b - a for _, a, b in pieces), base)
    return _fingerprint(items)


def _hash_pieces(base: Location, pieces: list[tuple[str, int, int]]) -> list[str]:
    """SHA-1 of each byte range ``(key, start, end)`` of the objects under ``base`` (a task)."""
    out = []
    for key, start, end in pieces:
        where = base.child(key) if key else base
        data = where.fs.cat_file(where.path, start=start, end=end) if end > start else b""
        out.append(hashlib.sha1(data, usedforsecurity=False).hexdigest())
    return out


def values_fingerprint(data: da.Array, client: Any = None) -> str:
    """The fingerprint of an in-memory input: SHA-1 of each block's values (dtype, shape and
    bytes), computed where the blocks are."""
    blocks = data.to_delayed().ravel()
    digests = compute(*[dask.delayed(hash_block, pure=True)(b) for b in blocks],
                      client=client)
    return _fingerprint([str(data.dtype), list(data.shape), list(digests)])


def hash_block(block: np.ndarray) -> str:
    """SHA-1 of a block of rows: its dtype, shape and values (a fingerprint of what was read,
    not a security measure)."""
    block = np.ascontiguousarray(block)
    h = hashlib.sha1(f"{block.dtype.str}{block.shape}".encode(), usedforsecurity=False)
    h.update(block.data)
    return h.hexdigest()


def _group_variable(node: zarr.Group, loc: Location,
                    variable: str | None) -> tuple[zarr.Array, np.ndarray | None, str]:
    """A group's 2-D variable (``variable``, else its one 2-D array), its sample ids (the
    coordinate named by its first dimension) and its name."""
    if node.attrs.get("complete") is False:  # a dataset store whose `make` was killed
        raise InputError(
            f"{loc} is an incomplete dataset (its generation was interrupted); rerun "
            "`dr-dask datasets make` to finish it"
        )
    names = sorted(node.array_keys())
    if variable is None:
        candidates = sorted(n for n, a in node.arrays() if a.ndim == 2)
        if len(candidates) != 1:
            raise InputError(
                f"{loc} is a Zarr group; name the variable as {loc}:VAR (2-D arrays: "
                f"{candidates})"
            )
        variable = candidates[0]
    try:
        found = node[variable]
    except KeyError:
        raise InputError(f"{loc} has no variable {variable!r}; it has {names}") from None
    if not isinstance(found, zarr.Array):
        raise InputError(f"{loc}:{variable} is a group, not an array")
    # the group's consolidated metadata found the array; its shape comes from the array's own
    # metadata: rows appended (zarr-python's append, xarray's append_dim) without
    # re-consolidating are in the array, not in the root's snapshot
    arr = _current(loc, variable)
    sample_ids = None
    dims = getattr(arr.metadata, "dimension_names", None)
    if dims and dims[0] and dims[0] in names and dims[0] != variable:
        coord = _current(loc, dims[0])
        if coord.ndim == 1 and coord.shape[0] == arr.shape[0]:
            sample_ids = np.asarray(coord[:])
    return arr, sample_ids, variable


def _open_zarr(
    loc: Location, variable: str | None
) -> tuple[Any, np.ndarray | None, str | None, dict]:
    if loc.url.endswith(".h5ad"):  # AnnData's HDF5 file, read as its Zarr store is (below)
        return _anndata().open_store(loc, variable)
    try:
        node = zarr.open(store=loc.zarr_store(read_only=True), mode="r")
    except StorageError:
        raise
    except Exception as exc:  # zarr raises several types for "not a zarr store"
        raise_if_transient(exc, loc)
        raise InputError(f"{loc} is not a readable Zarr store: {exc}") from exc
    if (anndata := _anndata()).is_anndata_group(node):
        return anndata.open_store(loc, variable, node)
    if isinstance(node, zarr.Array):
        if variable:
            raise InputError(f"{loc} is a single Zarr array; it has no variable {variable!r}")
        arr, array_loc, where = node, loc, str(loc)
        check_claimed(where, arr.shape, arr.dtype, arr.shards or arr.chunks)
        sample_ids = None
    else:
        arr, sample_ids, variable = _group_variable(node, loc, variable)
        array_loc, where = loc.child(*variable.split("/")), f"{loc}:{variable}"
    listing = array_loc.find()  # one listing: the missing-chunk check and the fingerprint
    if arr.ndim == 2:
        _check_chunks(arr, where, listing)
    content = {"chunks": [int(c) for c in arr.chunks], "stored": (array_loc, listing)}
    return ZarrRows.of(arr, where, array_loc), sample_ids, variable, content


def _open_xarray(obj: Any, variable: str | None, path: str | None) -> tuple[Any, Any, str | None]:

    if isinstance(obj, xr.Dataset):
        data_vars = list(obj.data_vars)
        if variable is None:
            two_d = [str(v) for v in data_vars if obj[v].ndim == 2]
            if len(two_d) != 1:
                raise InputError(f"{path or 'dataset'}: name the variable (2-D variables: {two_d})")
            variable = two_d[0]
        if variable not in obj.variables:
            raise InputError(
                f"{path or 'dataset'} has no variable {variable!r}; it has {data_vars}")
        obj = obj[variable]
    dim0 = obj.dims[0] if obj.dims else None
    sample_ids = np.asarray(obj[dim0].values) if dim0 is not None and dim0 in obj.coords else None
    return obj.data, sample_ids, variable


def _row_chunked(arr: Any) -> da.Array:
    """``arr`` as a dask array of whole rows (rows are the unit of work: never split a sample),
    chunked by ``input.chunk-bytes`` unless a dask array brings its own row chunks."""
    if isinstance(arr, da.Array):
        return arr if arr.numblocks[1] == 1 else arr.rechunk({0: arr.chunks[0][0], 1: -1})
    native = arr.chunks[0] if isinstance(arr, (zarr.Array, ZarrRows)) else None
    rows = _row_chunks(arr.shape, np.dtype(arr.dtype).itemsize, native)
    if isinstance(arr, np.ndarray):
        return _memory_rows(arr, rows)
    return da.from_array(arr, chunks=(rows, -1), asarray=True, inline_array=True)


def open_dataset(
    source: Any, variable: str | None = None, storage_options: dict | None = None
) -> InputData:
    """Open a samples x features input read-only as a row-chunked dask array.

    Parameters
    ----------
    source : str, Location or array-like
        ``"path.zarr"``, ``"path.zarr:VAR"``, ``"file.nc[:VAR]"``, ``"file.npy"`` (local paths
        or URLs such as ``s3://bucket/x.zarr:VAR``), an AnnData-Zarr store or ``.h5ad`` file
        (``"cells.zarr:obsm/X_pca"``: :mod:`dr_dask.io.anndata`), or an in-memory numpy array,
        dask array, zarr array, xarray DataArray or Dataset, or AnnData object.
    variable : str, optional
        Variable of a group, Dataset or NetCDF file (overrides a ``:VAR`` suffix).
    storage_options : dict, optional
        For the filesystem of a URL (credentials, ``endpoint_url``, ...).

    Returns
    -------
    InputData
        ``data`` has shape (T, N). Structure and chunk presence are checked here; call
        :func:`dr_dask.io.validation.check_values` for the values (it reads the data once).

    Raises
    ------
    InputError
        Missing location, variable or chunk, unreadable store, not 2-D, not numeric.
    """
    loc = None
    sample_ids = None
    content: dict = {}
    if isinstance(source, (str, os.PathLike, Location)):
        if isinstance(source, Location):
            loc = location(source, storage_options)
        else:
            url, var_in_source = parse_source(os.fspath(source), storage_options)
            variable = variable or var_in_source
            loc = location(url, storage_options)
        if not loc.exists():
            raise InputError(f"input {loc} does not exist")
        if loc.url.endswith(".npy"):
            arr: Any = NpyRows(loc)
            content = {"stored": (loc, {"": loc.fs.info(loc.path)})}
        elif loc.url.endswith((".nc", ".nc4", ".netcdf", ".h5")):
            ds = open_netcdf(loc, chunks={})
            arr, sample_ids, variable = _open_xarray(ds, variable, loc.url)
            content = {"stored": (loc, {"": loc.fs.info(loc.path)})}
        else:
            arr, sample_ids, variable, content = _open_zarr(loc, variable)
    elif _anndata().is_anndata(source):
        return _anndata().open_object(source, variable)
    else:
        arr = source
        if type(arr).__module__.startswith("xarray"):
            arr, sample_ids, variable = _open_xarray(arr, variable, None)
    where = loc.url if loc else None
    _check_structure(arr, where, variable)
    if isinstance(arr, np.ndarray):
        arr = np.ascontiguousarray(arr)
    data = _row_chunked(arr)
    stored = cast(tuple[Location, dict] | None, content.pop("stored", None))
    identity = _input_identity(loc, variable, arr, content)
    if stored is not None and (tagged := listed_fingerprint(stored[1])) is not None:
        identity["fingerprint"], stored = tagged, None  # the store keeps content tags
    return InputData(data, sample_ids, identity, loc, stored=stored)


def _anndata() -> Any:
    """:mod:`dr_dask.io.anndata` (imported here, not at the top: it builds on this module)."""
    from dr_dask.io import anndata

    return anndata


def open_netcdf(loc: Location, **kwargs: Any) -> Any:
    """An xarray Dataset of the NetCDF file at ``loc`` (local path or URL)."""

    try:
        return xr.open_dataset(loc.url if loc.is_local else loc.open("rb"), **kwargs)
    except Exception as exc:
        raise InputError(f"{loc} is not a readable NetCDF file: {exc}") from exc


def check_workers_can_read(inp: InputData, client: Any = None) -> None:
    """Ask every worker whether it can see the input; an InputError names the first that
    cannot and the location (a remote worker does not share the client's disk)."""
    client = active_client(client)
    if client is None or inp.location is None:
        return
    deliver_credentials(client, inp.location.storage_options)
    answers = run_on_workers(client, _can_read, inp.location)
    for worker, problem in sorted(answers.items()):
        if problem:
            raise InputError(f"worker {worker} cannot read the input {inp.location}: {problem}")


def _can_read(loc: Location) -> str | None:
    try:
        return None if loc.exists() else "it does not exist there"
    except StorageUnavailable:  # transient, not a worker that cannot see the input
        raise
    except Exception as exc:  # noqa: BLE001  (reported: what this worker cannot do)
        return f"{type(exc).__name__}: {exc}"


def _check_structure(arr: Any, path: str | None, variable: str | None) -> None:
    where = f"{path}:{variable}" if variable else (path or "input")
    if not hasattr(arr, "shape") or not hasattr(arr, "dtype"):
        raise InputError(f"{where} is not an array (got {type(arr).__name__})")
    if len(arr.shape) != 2:
        raise InputError(
            f"{where} must be 2-D (samples x features); it has shape {tuple(arr.shape)}"
        )
    kind = np.dtype(arr.dtype).kind
    if kind not in "fiu":
        raise InputError(f"{where} must be numeric (int or float); its dtype is {arr.dtype}")



def check_output_path(out: Any, inp: InputData | None) -> None:
    """Refuse an output store that is, contains, or lies inside the input."""
    if inp is None or inp.location is None:
        return
    out = location(out)
    if out.contains(inp.location) or inp.location.contains(out):
        raise InputError(
            f"output {out} would overwrite the input {inp.location}; choose another output path"
        )
