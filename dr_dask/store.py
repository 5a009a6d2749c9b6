"""The storage boundary: open and validate inputs, and write runs that resume and never lie.

Inputs are samples x features, samples along the first axis, from a Zarr array, a variable of
a Zarr group (xarray-written or not), a NetCDF file (through xarray) or a ``.npy`` file, or an
in-memory numpy / dask / zarr / xarray object. They are opened read-only and never modified.

Each run writes into its own Zarr group (:class:`RunGroup`). A stage marks itself complete in
the group's attributes only after its arrays are fully written, and the run as a whole is marked
complete last, so a rerun after a crash redoes exactly the unfinished stages and nothing
half-written is ever reported as a result.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import hashlib
import json
import logging
import os
import tempfile
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, cast

import dask
import dask.array as da
import numpy as np
import zarr

from dr_dask.storage import Location, StorageError, location

logger = logging.getLogger(__name__)

#: Target bytes per row chunk of an input (rows are never split across features).
CHUNK_BYTES = 64 * 2**20


class InputError(ValueError):
    """The input data or a path is unusable; the message says what and where."""


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
        fingerprint of the stored chunks): recorded in, and part of the name of, every run.
    location : Location or None
        Where it is stored (None for in-memory inputs).
    values : ndarray of shape (T, N) or None
        The checked in-memory array, when there is one
        (:func:`dr_dask.validation.check_input`).
    """

    data: da.Array
    sample_ids: np.ndarray | None = None
    identity: dict = field(default_factory=dict)
    location: Location | None = None
    values: np.ndarray | None = None

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
    if "/" in var:  # the only ':' is the scheme's, as in s3://bucket/x.zarr
        return source, None
    return path, var or None


class _NpyRows:
    """Array-like over a ``.npy`` file at any location: reads only the byte range of the rows
    asked for, and pickles as its location (workers read it themselves)."""

    def __init__(self, loc: Location):
        self.loc = loc
        fmt = np.lib.format
        with loc.open("rb") as fh:
            version = fmt.read_magic(fh)
            read = fmt.read_array_header_1_0 if version == (1, 0) else fmt.read_array_header_2_0
            shape, fortran, dtype = read(fh)
            self.offset = fh.tell()
        if fortran and len(shape) > 1:
            raise InputError(f"{loc} is a Fortran-ordered .npy; save it in C order")
        self.shape, self.dtype, self.ndim = tuple(shape), np.dtype(dtype), len(shape)
        self.chunks = None

    def __getitem__(self, key: Any) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        start, stop, step = key[0].indices(self.shape[0])
        row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        raw = self.loc.fs.cat_file(
            self.loc.path, start=self.offset + start * row_bytes,
            end=self.offset + max(start, stop) * row_bytes,
        )
        rows = np.frombuffer(raw, self.dtype).reshape(-1, *self.shape[1:])[::step]
        return np.array(rows[(slice(None), *key[1:])])


class _ZarrRows:
    """A Zarr array read so that a chunk that cannot be decoded is an :class:`InputError`
    naming the array and the chunk key (not a bare codec traceback from a worker)."""

    def __init__(self, arr: zarr.Array, where: str):
        self.arr, self.where = arr, where
        self.shape, self.dtype, self.ndim, self.chunks = arr.shape, arr.dtype, arr.ndim, arr.chunks

    def __getitem__(self, key: Any) -> np.ndarray:
        try:
            return np.asarray(self.arr[key])
        except Exception as exc:
            raise InputError(
                f"{self.where}: chunk {self._bad_chunk(key)} cannot be read "
                f"({type(exc).__name__}: {exc})"
            ) from None

    def _bad_chunk(self, key: Any) -> str:
        """The key of the first stored chunk of the rows in ``key`` that fails to decode."""
        rows = key[0] if isinstance(key, tuple) else key
        start, stop, _ = rows.indices(self.shape[0]) if isinstance(rows, slice) else (0, 0, 1)
        grid = self.arr.shards or self.arr.chunks
        for i in range(start // grid[0], max(start, stop - 1) // grid[0] + 1):
            for cols in np.ndindex(*[-(-s // c) for s, c in zip(self.shape[1:], grid[1:])]):
                coords = (i, *cols)
                try:
                    self.arr[tuple(slice(c * g, (c + 1) * g) for c, g in zip(coords, grid))]
                except Exception:  # the one that fails is the one to name
                    return self.arr.metadata.encode_chunk_key(coords)
        return f"in rows {start}:{stop}"


def _row_chunks(shape: tuple[int, ...], itemsize: int, native: int | None = None) -> int:
    n_cols = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    rows = max(256, CHUNK_BYTES // max(1, n_cols * itemsize))
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


def _identity(loc: Location | None, variable: str | None, arr: Any, content: dict) -> dict:
    """Where the input came from and what it holds: location (URL or absolute path, never
    credentials), variable, shape, chunks, dtype and a fingerprint of its stored bytes."""
    return {
        "path": loc.url if loc else None,
        "variable": variable,
        "shape": [int(s) for s in arr.shape],
        "dtype": str(arr.dtype),
        **content,
    }


def _fingerprint(listing: dict[str, dict]) -> str:
    """Hash of (key, size, ETag or mtime) of every stored object: appending rows or rewriting a
    chunk changes it; reopening the same bytes does not."""
    items = []
    for key in sorted(listing):
        info = listing[key]
        tag = info.get("ETag") or info.get("etag") or info.get("mtime") or info.get("LastModified")
        items.append((key, int(info.get("size") or 0), str(tag)))
    return hashlib.sha1(json.dumps(items).encode()).hexdigest()[:16]


def _check_chunks(arr: zarr.Array, where: str, listing: dict[str, dict]) -> None:
    """Every chunk of ``arr`` is stored: a missing chunk would read as the fill value."""
    grid = arr.shards or arr.chunks
    counts = [-(-s // c) for s, c in zip(arr.shape, grid)]
    for coords in np.ndindex(*counts):
        key = arr.metadata.encode_chunk_key(coords)
        if key not in listing:
            raise InputError(
                f"{where}: chunk {key} is missing from the store (it would read as the fill "
                f"value {arr.fill_value}); rewrite the array with write_empty_chunks=True if "
                "that chunk is meant to be all fill values"
            )


def _open_zarr(
    loc: Location, variable: str | None
) -> tuple[Any, np.ndarray | None, str | None, dict]:
    try:
        node = zarr.open(store=loc.zarr_store(read_only=True), mode="r")
    except StorageError:
        raise
    except Exception as exc:  # zarr raises several types for "not a zarr store"
        raise InputError(f"{loc} is not a readable Zarr store: {exc}") from exc
    if isinstance(node, zarr.Array):
        if variable:
            raise InputError(f"{loc} is a single Zarr array; it has no variable {variable!r}")
        arr, array_loc, where = node, loc, str(loc)
        sample_ids = None
    else:
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
        arr = found
        array_loc, where = loc.child(*variable.split("/")), f"{loc}:{variable}"
        sample_ids = None
        dims = getattr(arr.metadata, "dimension_names", None)
        if dims and dims[0] and dims[0] in names and dims[0] != variable:
            coord = node[dims[0]]
            if isinstance(coord, zarr.Array) and coord.ndim == 1 and coord.shape[0] == arr.shape[0]:
                sample_ids = np.asarray(coord[:])
    listing = array_loc.find()  # one listing: the missing-chunk check and the fingerprint
    if arr.ndim == 2:
        _check_chunks(arr, where, listing)
    content = {"chunks": [int(c) for c in arr.chunks], "fingerprint": _fingerprint(listing)}
    return _ZarrRows(arr, where), sample_ids, variable, content


def _open_xarray(obj: Any, variable: str | None, path: str | None) -> tuple[Any, Any, str | None]:
    import xarray as xr

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


def open_dataset(
    source: Any, variable: str | None = None, storage_options: dict | None = None
) -> InputData:
    """Open a samples x features input read-only as a row-chunked dask array.

    Parameters
    ----------
    source : str, Location or array-like
        ``"path.zarr"``, ``"path.zarr:VAR"``, ``"file.nc[:VAR]"``, ``"file.npy"`` (local paths
        or URLs such as ``s3://bucket/x.zarr:VAR``), or an in-memory numpy array, dask array,
        zarr array, xarray DataArray or Dataset.
    variable : str, optional
        Variable of a group, Dataset or NetCDF file (overrides a ``:VAR`` suffix).
    storage_options : dict, optional
        For the filesystem of a URL (credentials, ``endpoint_url``, ...).

    Returns
    -------
    InputData
        ``data`` has shape (T, N). Structure and chunk presence are checked here; call
        :func:`validate` for the values (it reads the data once).

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
            arr: Any = _NpyRows(loc)
            content = {"fingerprint": _fingerprint({"": loc.fs.info(loc.path)})}
        elif loc.url.endswith((".nc", ".nc4", ".netcdf", ".h5")):
            ds = open_netcdf(loc, chunks={})
            arr, sample_ids, variable = _open_xarray(ds, variable, loc.url)
            content = {"fingerprint": _fingerprint({"": loc.fs.info(loc.path)})}
        else:
            arr, sample_ids, variable, content = _open_zarr(loc, variable)
    else:
        arr = source
        if type(arr).__module__.startswith("xarray"):
            arr, sample_ids, variable = _open_xarray(arr, variable, None)
    where = loc.url if loc else None
    _check_structure(arr, where, variable)
    if isinstance(arr, da.Array):
        data = arr
        if data.numblocks[1] != 1:  # rows are the unit of work: never split a sample
            data = data.rechunk({0: data.chunks[0][0], 1: -1})
    else:
        native = arr.chunks[0] if isinstance(arr, (zarr.Array, _ZarrRows)) else None
        rows = _row_chunks(arr.shape, np.dtype(arr.dtype).itemsize, native)
        if isinstance(arr, np.ndarray):
            arr = np.ascontiguousarray(arr)
            data = _memory_rows(arr, rows)
        else:
            data = da.from_array(arr, chunks=(rows, -1), asarray=True, inline_array=True)
    return InputData(data, sample_ids, _identity(loc, variable, arr, content), loc)


def open_netcdf(loc: Location, **kwargs: Any) -> Any:
    """An xarray Dataset of the NetCDF file at ``loc`` (local path or URL)."""
    import xarray as xr

    try:
        return xr.open_dataset(loc.url if loc.is_local else loc.open("rb"), **kwargs)
    except Exception as exc:
        raise InputError(f"{loc} is not a readable NetCDF file: {exc}") from exc


def check_workers_can_read(inp: InputData, client: Any = None) -> None:
    """Ask every worker whether it can see the input; an InputError names the first that
    cannot and the location (a remote worker does not share the client's disk)."""
    from dr_dask.cluster import active_client

    client = active_client(client)
    if client is None or inp.location is None:
        return
    answers = client.run(_can_read, inp.location)
    for worker, problem in sorted(answers.items()):
        if problem:
            raise InputError(f"worker {worker} cannot read the input {inp.location}: {problem}")


def _can_read(loc: Location) -> str | None:
    try:
        return None if loc.exists() else "it does not exist there"
    except Exception as exc:
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


def _row_flags(block: np.ndarray, check_constant: bool) -> np.ndarray:
    bad = ~np.isfinite(block).all(axis=1)
    const = np.zeros(len(block), bool)
    if check_constant and block.shape[1]:
        const = np.ptp(np.where(np.isfinite(block), block, 0), axis=1) == 0
    return np.stack([bad, const], axis=1)


def _describe_rows(rows: np.ndarray, ids: np.ndarray | None, limit: int = 10) -> str:
    shown = rows[:limit] if ids is None else ids[rows[:limit]]
    more = f" and {len(rows) - limit} more" if len(rows) > limit else ""
    return f"{len(rows)} row(s): {', '.join(str(x) for x in shown)}{more}"


def validate(
    inp: InputData,
    *,
    min_samples: int = 2,
    constant_rows: bool = False,
    client: Any = None,
) -> None:
    """Check the values of an input; one pass over the data.

    Parameters
    ----------
    inp : InputData
    min_samples : int
        Fewest rows accepted (IKD needs n_components + 2).
    constant_rows : bool
        Reject rows with a single repeated value (their correlation is undefined).
    client : distributed.Client, optional

    Raises
    ------
    InputError
        Naming the offending rows (by sample id when the input has them).
    """
    from dr_dask.cluster import compute

    T, N = inp.data.shape
    if T < min_samples:
        raise InputError(f"{inp.name} has {T} samples; at least {min_samples} are needed")
    if N < 2 and constant_rows:
        raise InputError(f"{inp.name} has {N} feature(s); a correlation needs at least 2")
    flags = da.map_blocks(
        _row_flags, inp.data, constant_rows, dtype=bool, chunks=(inp.data.chunks[0], (2,))
    )
    # an array already in this process (``values``) is checked here: on a cluster the whole
    # array would travel in the graph to the workers for a check that reads it once
    if inp.values is not None:
        (flags,) = dask.compute(flags, scheduler="threads")
    else:
        (flags,) = compute(flags, client=client)
    bad = np.flatnonzero(flags[:, 0])
    if bad.size:
        raise InputError(
            f"{inp.name} has NaN or infinite values in {_describe_rows(bad, inp.sample_ids)}"
        )
    const = np.flatnonzero(flags[:, 1])
    if const.size:
        raise InputError(
            f"{inp.name} has constant rows (zero variance, undefined correlation) in "
            f"{_describe_rows(const, inp.sample_ids)}; use similarity='covariance' or drop them"
        )


def check_output_path(out: Any, inp: InputData | None) -> None:
    """Refuse an output store that is, contains, or lies inside the input."""
    if inp is None or inp.location is None:
        return
    out = location(out)
    if out.contains(inp.location) or inp.location.contains(out):
        raise InputError(
            f"output {out} would overwrite the input {inp.location}; choose another output path"
        )


def _versions() -> dict:
    import scipy
    import xarray

    import dr_dask

    return {
        "dr_dask": dr_dask.__version__,
        "dask": dask.__version__,
        "numpy": np.__version__,
        "scipy": scipy.__version__,
        "zarr": zarr.__version__,
        "xarray": xarray.__version__,
    }


def run_name(method: str, params: dict, identity: dict) -> str:
    """Deterministic run name: the same method, parameters and input give the same group."""
    key = json.dumps({"params": params, "input": identity}, sort_keys=True, default=str)
    return f"{method}-{hashlib.sha1(key.encode()).hexdigest()[:10]}"


class RunGroup:
    """One run's Zarr group: arrays, provenance and stage-completion marks.

    Marks live in the group's attributes, i.e. its one small ``zarr.json`` object, rewritten
    (one PUT) only after the arrays a stage vouches for are fully written. A complete group is
    consolidated, so ``xarray.open_zarr(store, group=name)`` reads its metadata in one request.

    Parameters
    ----------
    store : str or Location
        Output Zarr store, local path or URL (created if absent).
    name : str
        Group name of this run inside the store.
    params : dict
        Method parameters (JSON-serialisable); a rerun with other parameters, or of other input,
        under the same name is refused unless ``overwrite``.
    identity : dict
        Input provenance and content (:attr:`InputData.identity`).
    overwrite : bool
        Discard an existing run of this name.
    storage_options : dict, optional
        For the filesystem of a URL.
    """

    def __init__(
        self,
        store: Any,
        name: str,
        *,
        params: dict,
        identity: dict,
        overwrite: bool = False,
        storage_options: dict | None = None,
    ):
        self.location = location(store, storage_options)
        self.location.check()
        self.store, self.name = self.location.url, name
        self.created = False
        root = self._root()
        if name in root and overwrite:
            self.location.child(name).delete()
            root = self._root()
        params = json.loads(json.dumps(params, default=str))
        identity = json.loads(json.dumps(identity, default=str))
        self.group: zarr.Group
        if name in root:
            existing = root[name]
            if not isinstance(existing, zarr.Group):
                raise InputError(f"{self.path} is an array, not a run; choose another run name")
            self.group = existing
            old = self.group.attrs.get("params")
            if old is not None and old != params:
                raise InputError(
                    f"{self.path} holds a run with other parameters; pass overwrite=True "
                    "(--overwrite) or choose another run name"
                )
            old_input = self.group.attrs.get("input")
            if old_input is not None and identity and old_input != identity:
                raise InputError(
                    f"{self.path} holds a run of other input (recorded {_describe(old_input)}, "
                    f"now {_describe(identity)}); pass overwrite=True (--overwrite) to replace it "
                    "or choose another run name"
                )
            logger.info("resuming run %s (stages done: %s)", self.path, self.done_stages)
        else:
            self.created = True
            self.group = root.create_group(name)
            self.group.attrs.update(
                {
                    "params": params,
                    "input": identity,
                    "versions": _versions(),
                    "created": _dt.datetime.now(_dt.UTC).isoformat(),
                    "stages": {},
                    "complete": False,
                }
            )

    def refresh(self) -> None:
        """Re-read the group's marks (another process may have written them)."""
        self.group = zarr.open_group(store=self.location.zarr_store(), path=self.name, mode="r+",
                                     use_consolidated=False)

    def _root(self) -> zarr.Group:
        # never through the root's consolidated metadata: it is a snapshot that may predate
        # other runs of the store (use it to read, not to decide what exists)
        return zarr.open_group(store=self.location.zarr_store(), mode="a", use_consolidated=False)

    @property
    def path(self) -> str:
        return f"{self.store.rstrip('/')}/{self.name}"

    def child(self, name: str) -> Location:
        """Location of array ``name`` of this run (tile caches, path matrices)."""
        return self.location.child(self.name, name)

    def _attr_dict(self, key: str) -> dict[str, Any]:
        # zarr types an attribute as any JSON value; these keys hold the objects this class writes
        return cast(dict[str, Any], self.group.attrs.get(key) or {})

    @property
    def _stages(self) -> dict[str, Any]:
        return self._attr_dict("stages")

    @property
    def summary(self) -> dict[str, Any]:
        """The run's summary (written by :meth:`mark_complete`; empty until then)."""
        return self._attr_dict("summary")

    @property
    def done_stages(self) -> list[str]:
        return sorted(self._stages)

    @property
    def complete(self) -> bool:
        return bool(self.group.attrs.get("complete", False))

    def is_done(self, stage: str) -> bool:
        return stage in self._stages

    def mark_done(self, stage: str, **info: Any) -> None:
        """Record ``stage`` as complete; call only after its arrays are fully written."""
        stages = dict(self._stages)
        stages[stage] = {
            "finished": _dt.datetime.now(_dt.UTC).isoformat(),
            **json.loads(json.dumps(info, default=float)),
        }
        self.group.attrs["stages"] = stages

    def stage_info(self, stage: str) -> dict:
        return dict(self._stages.get(stage, {}))

    def mark_complete(self, **summary: Any) -> None:
        """The last writes of a run: the completion mark, then consolidated metadata of the run
        group and of the store's root (what ``xarray.open_zarr(store, group=name)`` reads)."""
        self.group.attrs.update(
            {"complete": True, "summary": json.loads(json.dumps(summary, default=float))}
        )
        self.consolidate()

    def consolidate(self) -> None:
        with warnings.catch_warnings():  # "not part of the v3 spec": xarray and zarr read it
            warnings.simplefilter("ignore", UserWarning)
            zarr.consolidate_metadata(self.location.zarr_store(), path=self.name)
            zarr.consolidate_metadata(self.location.zarr_store())

    def drop(self, *names: str) -> None:
        """Delete intermediate arrays (a tile cache) that the result no longer needs."""
        present = [n for n in names if n in self.group]
        for name in present:
            self.child(name).delete()
        if present and self.complete:
            self.consolidate()

    def create(self, name: str, shape: tuple, dtype: Any, chunks: tuple, dims: tuple) -> zarr.Array:
        """(Re)create an array of this run; a stage rewrites its arrays from scratch."""
        return self.group.create_array(
            name, shape=shape, dtype=dtype, chunks=chunks, dimension_names=dims,
            compressors=None, fill_value=0, overwrite=True,
        )

    def write(self, name: str, values: np.ndarray, dims: tuple, attrs: dict | None = None) -> None:
        """Write a small in-memory array in one go."""
        values = np.asarray(values)
        arr = self.create(name, values.shape, values.dtype, values.shape, dims)
        arr[...] = values
        if attrs:
            arr.attrs.update(json.loads(json.dumps(attrs, default=float)))

    def read(self, name: str) -> np.ndarray:
        arr = self.group[name]
        assert isinstance(arr, zarr.Array), f"{self.path}/{name} is a group"
        return np.asarray(arr[...])


@contextlib.contextmanager
def scratch(name: str, run: RunGroup | None = None, where: Any = None,
            inp: InputData | None = None, *, keep: bool = False) -> Iterator[Location]:
    """The location of a stage's worker-written Zarr array, deleted when the stage ends.

    It must be reachable by every worker, not only by this process: the run's array ``name``
    when there is a run (kept with ``keep``: a cache a rerun resumes from), else a unique
    location under ``where`` (an estimator's ``scratch`` parameter), else next to a remote
    input (the workers read it, so they reach its bucket), else a local temporary directory
    (client and workers share this machine's disk).

    Parameters
    ----------
    name : str
        The array's name in the run (part of the temporary name otherwise).
    run : RunGroup, optional
    where : str or Location, optional
    inp : InputData, optional
    keep : bool
        Keep the run's array after the stage.
    """
    unique = f"dr_dask_{name}_{uuid.uuid4().hex[:12]}"
    if run is not None:
        loc = run.child(name)
    elif where is not None:
        loc = location(where).child(unique)
    elif inp is not None and inp.location is not None and not inp.location.is_local:
        parent = inp.location.url.rstrip("/").rsplit("/", 1)[0]
        loc = location(parent, inp.location.storage_options).child(unique)
    else:
        loc = location(tempfile.mkdtemp(prefix=f"{unique}_"))
    logger.debug("scratch for %s: %s", name, loc)
    try:
        yield loc
    finally:
        if not (keep and run is not None):
            loc.delete()


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
        import socket
        import uuid

        self.where, self.ttl = where, float(ttl)
        self.owner = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self._stop: Any = None

    def _record(self) -> bytes:
        import time

        return json.dumps({"owner": self.owner, "expires": time.time() + self.ttl}).encode()

    def acquire(self) -> Lease:
        import threading
        import time

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
    import socket

    import psutil

    host, _, rest = owner.partition(":")
    pid = rest.partition(":")[0]
    return host == socket.gethostname() and pid.isdigit() and not psutil.pid_exists(int(pid))


def open_run(store: Any, name: str, storage_options: dict | None = None) -> zarr.Group:
    """A run group for reading (consolidated metadata when the run is complete)."""
    loc = location(store, storage_options)
    try:
        return zarr.open_group(store=loc.zarr_store(read_only=True), path=name, mode="r")
    except StorageError:
        raise
    except Exception as exc:
        raise InputError(f"{loc}/{name} is not a readable run group: {exc}") from None


def _describe(identity: Any) -> str:
    return f"shape {identity.get('shape')}, fingerprint {identity.get('fingerprint')}"
