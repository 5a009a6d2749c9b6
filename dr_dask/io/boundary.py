"""The data boundary: what a stored array claims is bounded before it is believed, and every
chunk is read whole or refused by name.

An input's metadata (a ``zarr.json``, ``.zarray`` or ``.npy`` header) can claim any shape:
:func:`check_claimed` bounds it by the ``dr_dask.input.max-*`` limits before anything lists,
enumerates or allocates by it. Chunk presence is counted from one listing
(:func:`_check_chunks`: a missing chunk would read as the fill value), and the row readers
(:class:`NpyRows`, :class:`ZarrRows`) turn a truncated file or a chunk that cannot be decoded
into an :class:`InputError` naming the array and the chunk key. :func:`read_values` reads the
arrays beside an input (labels, latents, colours) through the same checks.
:mod:`dr_dask.io.inputs` opens inputs through this module.
"""

from __future__ import annotations

import io
import logging
from typing import Any

import numpy as np
import zarr

from dr_dask.io.storage import Location, raise_if_transient
from dr_dask.runtime import config

logger = logging.getLogger(__name__)


class InputError(ValueError):
    """The input data or a path is unusable; the message says what and where."""


class NpyRows:
    """Array-like over a ``.npy`` file at any location: reads only the byte range of the rows
    asked for, and pickles as its location (workers read it themselves)."""

    def __init__(self, loc: Location, numeric: bool = True):
        self.loc = loc
        fmt = np.lib.format
        try:
            with loc.open("rb") as fh:
                version = fmt.read_magic(fh)
                read = (fmt.read_array_header_1_0 if version == (1, 0)
                        else fmt.read_array_header_2_0)
                shape, fortran, dtype = read(fh)
                self.offset = fh.tell()
        except ValueError as exc:  # not a .npy, or its header is cut short
            raise InputError(f"{loc} is not a readable .npy file: {exc}") from None
        if fortran and len(shape) > 1:
            raise InputError(f"{loc} is a Fortran-ordered .npy; save it in C order")
        check_claimed(str(loc), shape, dtype, numeric=numeric)
        if np.dtype(dtype).hasobject:
            raise InputError(f"{loc} holds Python objects (a pickled .npy); save an array of "
                             "numbers or strings")
        self.shape, self.dtype, self.ndim = tuple(shape), np.dtype(dtype), len(shape)
        self.chunks = None
        size, claimed = int(loc.fs.info(loc.path)["size"]), self.offset + self.nbytes
        if size != claimed:
            raise InputError(
                f"{loc} holds {size:,} bytes but its header says {claimed:,} (shape "
                f"{self.shape}, {self.dtype}): {'truncated' if size < claimed else 'corrupt'}; "
                "write it again")

    @property
    def nbytes(self) -> int:
        return _product(self.shape) * self.dtype.itemsize

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


class ZarrRows:
    """A Zarr array read so that a chunk that cannot be decoded is an :class:`InputError`
    naming the array and the chunk key (not a bare codec traceback from a worker).

    Pickled (into a task graph) as its :class:`Location`, never as the store: a store's
    filesystem would carry the credentials in the graph (see :mod:`dr_dask.runtime.credentials`).
    """

    def __init__(self, arr: zarr.Array | None, where: str, loc: Location, meta: tuple):
        self._arr, self.where, self.loc = arr, where, loc
        self.shape, self.dtype, self.ndim, self.chunks = meta

    @classmethod
    def of(cls, arr: zarr.Array, where: str, loc: Location) -> ZarrRows:
        return cls(arr, where, loc, (arr.shape, arr.dtype, arr.ndim, arr.chunks))

    @property
    def arr(self) -> zarr.Array:
        # opened where it is read: the scheduler unpickles task graphs and must not open stores
        if self._arr is None:
            self._arr = zarr.open_array(store=self.loc.zarr_store(read_only=True), mode="r")
        return self._arr

    def __getstate__(self) -> dict:
        return {"where": self.where, "loc": self.loc,
                "meta": (self.shape, self.dtype, self.ndim, self.chunks)}

    def __setstate__(self, state: dict) -> None:
        self.__init__(None, state["where"], state["loc"], state["meta"])  # type: ignore[misc]

    def __getitem__(self, key: Any) -> np.ndarray:
        try:
            return np.asarray(self.arr[key])
        except Exception as exc:  # noqa: BLE001  (a codec raises any type for a bad chunk)
            raise_if_transient(exc, self.where)  # an unreachable store is not a bad chunk
            raise InputError(
                f"{self.where}: chunk {self._bad_chunk(key)} cannot be read "
                f"({type(exc).__name__}: {exc})"
            ) from None

    def read_rows(self, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop``, every chunk they touch present and decoded whole.

        For an array read as it grows (the stream, the nightly job), whose chunks were not
        listed when it was opened: a missing chunk would read as the fill value, so each key
        is looked up first (one existence check per chunk touched)."""
        grid = self.arr.shards or self.arr.chunks
        cols = [-(-s // c) for s, c in zip(self.shape[1:], grid[1:])]
        for i in range(start // grid[0], max(start, stop - 1) // grid[0] + 1):
            for rest in np.ndindex(*cols):
                key = self.arr.metadata.encode_chunk_key((i, *rest))
                if not self.loc.child(*key.split("/")).exists():
                    raise InputError(
                        f"{self.where}: chunk {key} (rows {i * grid[0]}:"
                        f"{min(self.shape[0], (i + 1) * grid[0])}) is missing from the store"
                    )
        return self[start:stop]

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
                except Exception:  # noqa: BLE001  (the one that fails is the one to name)
                    return self.arr.metadata.encode_chunk_key(coords)
        return f"in rows {start}:{stop}"


def check_claimed(where: str, shape: tuple[int, ...], dtype: Any,
                  grid: tuple[int, ...] | None = None, numeric: bool = True) -> None:
    """Refuse metadata beyond the ``dr_dask.input.max-*`` limits before it is believed.

    A ``zarr.json``, ``.zarray`` or ``.npy`` header can claim any shape: nothing may list,
    enumerate or allocate by it before these checks (rows, features, a numeric dtype, and for
    a chunked array the number of chunks of its grid and one chunk's size).

    ``numeric=False`` leaves the dtype to the caller (the stream quarantines a chunk of
    another dtype with its rows).

    Raises
    ------
    InputError
        Naming ``where``, the claimed value and the knob that bounds it.
    """
    dtype = np.dtype(dtype)
    if numeric and (dtype.kind not in "fiu" or dtype.itemsize > 8):
        raise InputError(f"{where} must be numeric (int or float); its dtype is {dtype}")
    shape = tuple(int(s) for s in shape)
    if any(s < 0 for s in shape):
        raise InputError(f"{where} claims a negative shape {shape}")
    limits = (("rows", shape[0] if shape else 1, "input.max-rows"),
              ("features", _product(shape[1:]), "input.max-features"))
    for what, value, knob in limits:
        if value > int(config.get(knob)):
            raise InputError(
                f"{where} claims {value:,} {what} (shape {shape}), more than "
                f"dr_dask.{knob} = {int(config.get(knob)):,}; raise it if the input is "
                "really that large")
    if grid is None:
        return
    grid = tuple(int(g) for g in grid)
    if len(grid) != len(shape) or any(g < 1 for g in grid):
        raise InputError(f"{where} claims chunks {grid} for shape {shape}")
    n_chunks = _product(-(-s // g) for s, g in zip(shape, grid))
    if n_chunks > int(config.get("input.max-chunks")):
        raise InputError(
            f"{where} claims {n_chunks:,} chunks (shape {shape}, chunks {grid}), more than "
            f"dr_dask.input.max-chunks = {int(config.get('input.max-chunks')):,}")
    chunk_bytes = _product(grid) * dtype.itemsize
    if chunk_bytes > config.get_bytes("input.max-chunk-bytes"):
        raise InputError(
            f"{where} claims chunks of {grid} ({chunk_bytes:,} bytes each), more than "
            f"dr_dask.input.max-chunk-bytes")


def _product(values: Any) -> int:
    out = 1
    for v in values:  # Python ints: a claimed product never overflows
        out *= int(v)
    return out


def _check_chunks(arr: zarr.Array, where: str, listing: dict[str, dict]) -> None:
    """Every chunk of ``arr`` is stored (a missing chunk would read as the fill value), and
    an uncompressed chunk has its size.

    The stored keys are parsed from the listing and counted against the grid's size
    (bounded first by :func:`check_claimed`): the claimed grid is never walked key by key."""
    grid = tuple(arr.shards or arr.chunks)
    counts = tuple(-(-s // c) for s, c in zip(arr.shape, grid))
    n_chunks = _product(counts)
    encode = arr.metadata.encode_chunk_key
    first = encode((0,) * arr.ndim)
    prefix = first[:2] if first.startswith("c") and arr.ndim else ""
    sep = first[len(prefix) + 1] if arr.ndim > 1 else None
    coords, keys = [], []
    for key in listing:
        if not key.startswith(prefix):
            continue
        parts = key[len(prefix):].split(sep) if sep else [key[len(prefix):]]
        if len(parts) == arr.ndim and all(p.isdigit() for p in parts):
            coords.append([int(p) for p in parts])
            keys.append(key)
    found = np.asarray(coords, dtype=np.int64).reshape(-1, arr.ndim)
    inside = np.asarray((found < np.asarray(counts, dtype=np.int64)).all(axis=1))
    present = np.zeros(n_chunks, dtype=bool)
    if inside.any():
        present[np.ravel_multi_index(tuple(found[inside].T), counts)] = True
    if not present.all():
        key = encode(tuple(int(i) for i in np.unravel_index(int(np.argmin(present)), counts)))
        raise InputError(
            f"{where}: chunk {key} is missing from the store ({int(present.sum()):,} of "
            f"{n_chunks:,} chunks stored; it would read as the fill value {arr.fill_value}); "
            "rewrite the array with write_empty_chunks=True if that chunk is meant to be all "
            "fill values"
        )
    if arr.shards is None and not arr.compressors and not arr.filters:
        # stored as raw bytes: a chunk of another size is truncated or overwritten
        size = _product(grid) * arr.dtype.itemsize
        for key, ok in zip(keys, [bool(b) for b in inside]):
            if ok and int(listing[key].get("size") or 0) != size:
                raise InputError(
                    f"{where}: chunk {key} holds {int(listing[key].get('size') or 0):,} bytes, "
                    f"not the {size:,} of its uncompressed chunk shape {grid} (truncated or "
                    "overwritten); restore it and rerun")


def _current(loc: Location, path: str, numeric: bool = True) -> zarr.Array:
    """The array at ``path`` of the group at ``loc`` as its own metadata says now (one read:
    never the root's consolidated snapshot, which may predate rows appended since)."""
    where = f"{loc}:{path}" if path else str(loc)
    try:
        arr = zarr.open_array(store=loc.zarr_store(read_only=True), path=path, mode="r")
    except Exception as exc:  # zarr raises several types for a node that is not an array
        raise_if_transient(exc, loc)
        raise InputError(f"{where} is not a readable Zarr array: {exc}") from exc
    check_claimed(where, arr.shape, arr.dtype, arr.shards or arr.chunks, numeric)
    return arr


def read_values(loc: Location, variable: str | None = None) -> np.ndarray:
    """A whole stored array beside an input (labels, a latent, colours: ``.npy`` or a Zarr
    array, or a variable of a Zarr group) read through the same boundary as the input: its
    metadata bounded (:func:`check_claimed`, any dtype but Python objects), every chunk
    present and decoded whole, else an :class:`InputError` naming the array and chunk key.
    """
    if loc.url.endswith(".npy"):
        npy = NpyRows(loc, numeric=False)
        return npy[0:npy.shape[0]] if npy.ndim else np.load(io.BytesIO(loc.read_bytes()))
    arr = _current(loc, variable or "", numeric=False)
    array_loc = loc.child(*variable.split("/")) if variable else loc
    where = f"{loc}:{variable}" if variable else str(loc)
    if not arr.ndim:
        return np.asarray(arr[...])
    _check_chunks(arr, where, array_loc.find())
    return ZarrRows.of(arr, where, array_loc)[0:arr.shape[0]]
