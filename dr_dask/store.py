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

import datetime as _dt
import hashlib
import json
import logging
import os
import shutil
from dataclasses import dataclass, field
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr

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
        Where the data came from (path, variable, shape, dtype, modification time): recorded
        in the provenance of every run.
    """

    data: da.Array
    sample_ids: np.ndarray | None = None
    identity: dict = field(default_factory=dict)

    @property
    def path(self) -> str | None:
        return self.identity.get("path")

    @property
    def name(self) -> str:
        var = self.identity.get("variable")
        return f"{self.path}:{var}" if var else str(self.path or "array")


def parse_source(source: str) -> tuple[str, str | None]:
    """Split ``"STORE[:VAR]"`` into path and variable (an existing path is taken whole)."""
    if os.path.exists(source) or ":" not in source:
        return source, None
    path, var = source.rsplit(":", 1)
    if "/" in var and not os.path.exists(path):  # a URL such as s3://bucket/x.zarr
        return source, None
    return path, var or None


class _NpyRows:
    """Array-like over a ``.npy`` file that pickles as its path (workers memory-map it)."""

    def __init__(self, path: str):
        self.path = path
        mm = np.load(path, mmap_mode="r")
        self.shape, self.dtype, self.ndim = mm.shape, mm.dtype, mm.ndim

    def __getitem__(self, key: Any) -> np.ndarray:
        return np.asarray(np.load(self.path, mmap_mode="r")[key])


def _row_chunks(shape: tuple[int, ...], itemsize: int, native: int | None = None) -> int:
    n_cols = int(np.prod(shape[1:])) if len(shape) > 1 else 1
    rows = max(256, CHUNK_BYTES // max(1, n_cols * itemsize))
    if native:  # align with the store's own chunks so no chunk is read twice
        rows = max(native, rows // native * native)
    return int(min(rows, max(1, shape[0])))


def _identity(path: str | None, variable: str | None, arr: Any) -> dict:
    ident = {
        "path": os.path.abspath(path) if path else None,
        "variable": variable,
        "shape": [int(s) for s in arr.shape],
        "dtype": str(arr.dtype),
    }
    if path and os.path.exists(path):
        ident["modified"] = os.path.getmtime(path)
    return ident


def _open_zarr(path: str, variable: str | None) -> tuple[Any, np.ndarray | None, str | None]:
    store = zarr.storage.LocalStore(path, read_only=True)
    try:
        node = zarr.open(store=store, mode="r")
    except Exception as exc:  # zarr raises several types for "not a zarr store"
        raise InputError(f"{path} is not a readable Zarr store: {exc}") from exc
    if isinstance(node, zarr.Array):
        if variable:
            raise InputError(f"{path} is a single Zarr array; it has no variable {variable!r}")
        return node, None, None
    names = sorted(node.array_keys())
    if variable is None:
        candidates = [n for n in names if node[n].ndim == 2]
        if len(candidates) != 1:
            raise InputError(
                f"{path} is a Zarr group; name the variable as {path}:VAR (2-D arrays: {candidates})"
            )
        variable = candidates[0]
    try:
        arr = node[variable]
    except KeyError:
        raise InputError(f"{path} has no variable {variable!r}; it has {names}") from None
    if not isinstance(arr, zarr.Array):
        raise InputError(f"{path}:{variable} is a group, not an array")
    sample_ids = None
    dims = getattr(arr.metadata, "dimension_names", None)
    if dims and dims[0] and dims[0] in names and dims[0] != variable:
        coord = node[dims[0]]
        if coord.ndim == 1 and coord.shape[0] == arr.shape[0]:
            sample_ids = np.asarray(coord[:])
    return arr, sample_ids, variable


def _open_xarray(obj: Any, variable: str | None, path: str | None) -> tuple[Any, Any, str | None]:
    import xarray as xr

    if isinstance(obj, xr.Dataset):
        data_vars = list(obj.data_vars)
        if variable is None:
            two_d = [v for v in data_vars if obj[v].ndim == 2]
            if len(two_d) != 1:
                raise InputError(f"{path or 'dataset'}: name the variable (2-D variables: {two_d})")
            variable = two_d[0]
        if variable not in obj.variables:
            raise InputError(f"{path or 'dataset'} has no variable {variable!r}; it has {data_vars}")
        obj = obj[variable]
    dim0 = obj.dims[0] if obj.dims else None
    sample_ids = np.asarray(obj[dim0].values) if dim0 is not None and dim0 in obj.coords else None
    return obj.data, sample_ids, variable


def open_dataset(source: Any, variable: str | None = None) -> InputData:
    """Open a samples x features input read-only as a row-chunked dask array.

    Parameters
    ----------
    source : str or array-like
        ``"path.zarr"``, ``"path.zarr:VAR"``, ``"file.nc[:VAR]"``, ``"file.npy"``, or an in-memory
        numpy array, dask array, zarr array, xarray DataArray or Dataset.
    variable : str, optional
        Variable of a group, Dataset or NetCDF file (overrides a ``:VAR`` suffix).

    Returns
    -------
    InputData
        ``data`` has shape (T, N). Only structure is checked here; call :func:`validate` for
        the values (it reads the data once).

    Raises
    ------
    InputError
        Missing path or variable, unreadable store, not 2-D, not numeric.
    """
    path = None
    sample_ids = None
    if isinstance(source, (str, os.PathLike)):
        path, var_in_source = parse_source(os.fspath(source))
        variable = variable or var_in_source
        if not os.path.exists(path):
            raise InputError(f"input {path} does not exist")
        if path.endswith(".npy"):
            arr: Any = _NpyRows(path)
        elif path.endswith((".nc", ".nc4", ".netcdf", ".h5")):
            import xarray as xr

            try:
                ds = xr.open_dataset(path, chunks={})
            except Exception as exc:
                raise InputError(f"{path} is not a readable NetCDF file: {exc}") from exc
            arr, sample_ids, variable = _open_xarray(ds, variable, path)
        else:
            arr, sample_ids, variable = _open_zarr(path, variable)
    else:
        arr = source
        if type(arr).__module__.startswith("xarray"):
            arr, sample_ids, variable = _open_xarray(arr, variable, None)
    _check_structure(arr, path, variable)
    if isinstance(arr, da.Array):
        data = arr
        if data.numblocks[1] != 1:  # rows are the unit of work: never split a sample
            data = data.rechunk({0: data.chunks[0][0], 1: -1})
    else:
        native = arr.chunks[0] if isinstance(arr, zarr.Array) else None
        rows = _row_chunks(arr.shape, np.dtype(arr.dtype).itemsize, native)
        if isinstance(arr, np.ndarray):
            arr = np.ascontiguousarray(arr)
        data = da.from_array(arr, chunks=(rows, -1), asarray=True, inline_array=True)
    return InputData(data, sample_ids, _identity(path, variable, arr))


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
    flags = inp.data.map_blocks(
        _row_flags, constant_rows, dtype=bool, chunks=(inp.data.chunks[0], (2,))
    )
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


def check_output_path(out: str, inp: InputData | None) -> None:
    """Refuse an output store that is, contains, or lies inside the input."""
    if inp is None or not inp.path:
        return
    a, b = os.path.realpath(out), os.path.realpath(inp.path)
    if a == b or a.startswith(b + os.sep) or b.startswith(a + os.sep):
        raise InputError(
            f"output {out} would overwrite the input {inp.path}; choose another output path"
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

    Parameters
    ----------
    store : str
        Path of the output Zarr store (created if absent).
    name : str
        Group name of this run inside the store.
    params : dict
        Method parameters (JSON-serialisable); a rerun with other parameters under the same
        name is refused unless ``overwrite``.
    identity : dict
        Input provenance (:attr:`InputData.identity`).
    overwrite : bool
        Discard an existing run of this name.
    """

    def __init__(
        self, store: str, name: str, *, params: dict, identity: dict, overwrite: bool = False
    ):
        self.store, self.name = store, name
        root = zarr.open_group(store, mode="a")
        if name in root and overwrite:
            shutil.rmtree(os.path.join(store, name), ignore_errors=True)
            root = zarr.open_group(store, mode="a")
        params = json.loads(json.dumps(params, default=str))
        if name in root:
            self.group = root[name]
            old = self.group.attrs.get("params")
            if old is not None and old != params:
                raise InputError(
                    f"{store}/{name} holds a run with other parameters; pass overwrite=True "
                    "or choose another run name"
                )
            logger.info("resuming run %s/%s (stages done: %s)", store, name, self.done_stages)
        else:
            self.group = root.create_group(name)
            self.group.attrs.update(
                {
                    "params": params,
                    "input": json.loads(json.dumps(identity, default=str)),
                    "versions": _versions(),
                    "created": _dt.datetime.now(_dt.timezone.utc).isoformat(),
                    "stages": {},
                    "complete": False,
                }
            )

    @property
    def path(self) -> str:
        return os.path.join(self.store, self.name)

    @property
    def done_stages(self) -> list[str]:
        return sorted(self.group.attrs.get("stages", {}))

    @property
    def complete(self) -> bool:
        return bool(self.group.attrs.get("complete", False))

    def is_done(self, stage: str) -> bool:
        return stage in self.group.attrs.get("stages", {})

    def mark_done(self, stage: str, **info: Any) -> None:
        """Record ``stage`` as complete; call only after its arrays are fully written."""
        stages = dict(self.group.attrs.get("stages", {}))
        stages[stage] = {
            "finished": _dt.datetime.now(_dt.timezone.utc).isoformat(),
            **json.loads(json.dumps(info, default=float)),
        }
        self.group.attrs["stages"] = stages

    def stage_info(self, stage: str) -> dict:
        return dict(self.group.attrs.get("stages", {}).get(stage, {}))

    def mark_complete(self, **summary: Any) -> None:
        self.group.attrs.update(
            {"complete": True, "summary": json.loads(json.dumps(summary, default=float))}
        )

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
        return np.asarray(self.group[name][...])
