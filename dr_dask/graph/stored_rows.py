"""Rows the workers wrote to a store, read back: checked for chunks that never arrived
(:func:`read_stored`), a column slice at a time (:class:`StoredBlock`), or in the node order of
a store the block paths wrote in the graph's (:class:`NodeOrdered`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr


def read_stored(arr: zarr.Array, selection: Any) -> np.ndarray:
    """``arr[selection]`` of an array whose chunks the workers wrote (created with NaN fill by
    :func:`~dr_dask.graph.paths.path_rows_array`): a chunk that never reached the store reads
    as NaN and is an error, never a silent fill value (a worker that wrote to a disk the
    reader cannot see)."""
    values = np.asarray(arr[selection])
    if values.dtype.kind == "f" and np.isnan(values).any():
        raise RuntimeError(
            f"{arr.store}: rows {selection} of {arr.name or 'the array'} have chunks missing from "
            "the store (read as fill values): the workers wrote them somewhere this process "
            "cannot read; use a location every worker and the client share (a URL or a shared "
            "disk)"
        )
    return values


@dataclass(frozen=True)
class NodeOrdered:
    """Stored rows whose columns are in the graph's order (the block paths'), read in node
    order: ``view[:, nodes]`` reads columns ``order[nodes]`` (:attr:`GeodesicRows.order`), so
    an out-of-sample map reads them as it reads a store in node order."""

    store: zarr.Array
    order: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.store.shape)

    @property
    def dtype(self) -> np.dtype:
        return self.store.dtype

    @property
    def nbytes(self) -> int:
        return int(self.store.nbytes)

    def get_orthogonal_selection(self, key: tuple) -> np.ndarray:
        rows, nodes = key
        return read_stored_orthogonal(self.store, (rows, self.order[nodes]))

    def __getitem__(self, key: tuple) -> np.ndarray:
        return self.get_orthogonal_selection(key)


def read_stored_orthogonal(arr: zarr.Array, selection: tuple) -> np.ndarray:
    """``arr.get_orthogonal_selection(selection)``, checked as :func:`read_stored` checks."""
    values = np.asarray(arr.get_orthogonal_selection(selection))
    if values.dtype.kind == "f" and np.isnan(values).any():
        return read_stored(arr, selection)  # raises, naming the rows
    return values


@dataclass(frozen=True)
class StoredBlock:
    """Rows ``[start, stop)`` of a stored array, read a column slice at a time
    (``block[:, columns]``): a reduction over the block never holds all of it."""

    store: zarr.Array
    start: int
    stop: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.stop - self.start, int(self.store.shape[1])

    def __getitem__(self, key: tuple[slice, slice]) -> np.ndarray:
        rows, columns = key
        if rows != slice(None):
            raise IndexError("a stored block is read a column slice at a time")
        return read_stored(self.store, (slice(self.start, self.stop), columns))
