"""AnnData in and out: ``.h5ad`` files, AnnData-Zarr stores and AnnData objects as inputs,
and an embedding written back to ``obsm``.

Single-cell data live in AnnData's on-disk format (anndata's "on-disk format" specification,
encoding version 0.1.0 of the root, 0.2.0 of arrays and data frames). This module reads that
format itself, with zarr and h5py: the anndata package is never imported (it pins pandas < 3,
which this package does not), and an in-memory AnnData object is recognised by what it has
(``X``, ``layers``, ``obsm``, ``obs_names``, ``n_obs``), whatever its class.

Inputs. An element of an AnnData is named as a variable, ``STORE[:ELEMENT]`` on the command
line (``cells.zarr:obsm/X_pca``, ``cells.h5ad:layers/counts``) and ``variable=`` in the API:
``X`` (the default), ``layers/NAME`` or ``obsm/NAME``. The samples are the cells; their names
(``obs_names``) are the input's sample ids, which name the rows of an error and the ``sample``
coordinate of a run's embedding. Reading is by row blocks, out of core wherever the store is
chunked:

- a dense element of an AnnData-Zarr store is a Zarr array, read like any other
  (:func:`dr_dask.io.inputs.open_dataset`: its chunks, checked present, give the row blocks);
- a dense element of a ``.h5ad`` file is an HDF5 dataset, read a row block at a time;
- a sparse element (``encoding-type`` ``csr_matrix`` or ``csc_matrix``: arrays ``data``,
  ``indices``, ``indptr``) is read a row block at a time into a **dense** block, because every
  estimator of this package works on dense rows. A CSR block reads its slice of ``indptr``
  and the entries of its rows only; a CSC block reads every stored entry (the rows of a column
  are scattered along ``indices``): store a large matrix as CSR (anndata writes scanpy's
  ``X`` as CSR) or select highly variable genes first, since dense rows cost ``N`` values each.

An AnnData object gives its element: a NumPy array as a NumPy array (checked like one), a
SciPy sparse matrix by dense row blocks as above, a dask array as it is; the ``X`` of a
backed object (``adata.isbacked``) is read from its file, as a ``.h5ad`` path is. Its
``fit_transform`` output is a NumPy array in the order of ``obs_names`` (what scanpy puts in
``obsm``), written back by :func:`write_obsm`.

Output. :func:`write_obsm` puts an embedding into ``obsm[key]`` of an AnnData object, an
AnnData-Zarr store (format 2 or 3, as the store is; its consolidated metadata rewritten) or a
local ``.h5ad`` file, with anndata's array encoding. It is an explicit action of the user's:
nothing in this package writes into an input store.
"""

from __future__ import annotations

import contextlib
import logging
import os
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dask
import dask.array as da
import numpy as np
import zarr

from dr_dask.io.boundary import _check_chunks
from dr_dask.io.inputs import (
    InputData,
    InputError,
    _open_zarr,
    _row_chunks,
    open_dataset,
)
from dr_dask.io.storage import Location, location, raise_if_transient

logger = logging.getLogger(__name__)

__all__ = ["ELEMENTS", "element", "is_anndata", "is_anndata_group", "open_object",
           "open_store", "read_obs_names", "write_obsm"]

#: The elements of an AnnData that are samples x features arrays (``NAME`` is a key).
ELEMENTS = ("X", "layers/NAME", "obsm/NAME")
#: The encoding anndata writes for a dense array (``encoding-type``, ``encoding-version``).
ARRAY_ENCODING = {"encoding-type": "array", "encoding-version": "0.2.0"}
_DICT_ENCODING = {"encoding-type": "dict", "encoding-version": "0.1.0"}
_SPARSE = {"csr_matrix": "csr", "csc_matrix": "csc"}
_H5AD = ".h5ad"


def is_anndata(obj: Any) -> bool:
    """Whether ``obj`` is an AnnData object (by what it has: the anndata package is not
    imported; see the module)."""
    if isinstance(obj, (str, os.PathLike, Location, InputData, np.ndarray)):
        return False
    return all(hasattr(obj, a) for a in ("X", "layers", "obsm", "obs_names", "n_obs"))


def is_anndata_group(node: Any) -> bool:
    """Whether a Zarr group is the root of an AnnData-Zarr store."""
    return isinstance(node, zarr.Group) and node.attrs.get("encoding-type") == "anndata"


def _element_key(key: str | None, where: str) -> str:
    """``key`` checked as the name of one of :data:`ELEMENTS` (None: ``X``)."""
    key = (key or "X").strip("/")
    parts = key.split("/")
    if key == "X" or (len(parts) == 2 and parts[0] in ("layers", "obsm") and parts[1]):
        return key
    raise InputError(f"{where}: {key!r} is not an element of an AnnData; name "
                     f"{', '.join(ELEMENTS)}")


def _missing(where: str, key: str, available: list[str]) -> InputError:
    return InputError(f"{where} has no element {key!r}; it has {', '.join(available) or 'none'}")


# ---------------------------------------------------------------------------------------------
# reading stored elements


class _Stored:
    """The arrays of one element of a ``.h5ad`` file or an AnnData-Zarr store, opened where
    they are read. Pickled (into a task graph) as its location and path only: a worker opens
    the file or store itself, and a store's credentials never travel in the graph."""

    def __init__(self, loc: Location, path: str, h5: bool):
        self.loc, self.path, self.h5 = loc, path, h5

    @contextmanager
    def arrays(self) -> Iterator[Any]:
        """``get(part)``: the HDF5 dataset or Zarr array ``part`` of the element (``""``: the
        element itself). A ``.h5ad`` file is open only inside: HDF5 refuses to open a file
        for writing (:func:`write_obsm`) in a process that holds it open for reading."""
        if not self.h5:
            store = self.loc.zarr_store(read_only=True)
            yield lambda part="": zarr.open_array(store=store, path=self._path(part), mode="r")
            return
        with _open_h5(self.loc) as f:
            yield lambda part="": f[self._path(part)]

    def _path(self, part: str) -> str:
        return f"{self.path}/{part}" if part else self.path


@contextmanager
def _open_h5(loc: Location, mode: str = "r") -> Iterator[Any]:
    """The ``.h5ad`` file at ``loc`` as an h5py File (a URL through its filesystem's file
    object, closed with it)."""
    import h5py  # here: only .h5ad files need it (an optional dependency: the netcdf extra)

    with contextlib.ExitStack() as stack:
        try:
            raw = loc.url if loc.is_local else stack.enter_context(loc.open("rb"))
            f = stack.enter_context(h5py.File(raw, mode))
        except OSError as exc:
            raise_if_transient(exc, loc)
            doing = "read" if mode == "r" else "written"
            raise InputError(f"{loc} cannot be {doing} as a .h5ad (HDF5) file: {exc}") from None
        yield f


class _Rows:
    """Array-like over a stored element, read a row block at a time (what ``dask.array``'s
    ``from_array`` asks of it): a dense HDF5 dataset's rows, or a sparse matrix's rows as a
    dense block. A block that cannot be read is an :class:`InputError` naming the element."""

    ndim = 2
    chunks = None

    def __init__(self, stored: _Stored | _Memory, where: str, shape: tuple[int, int], dtype: Any,
                 sparse: str | None):
        self.stored, self.where, self.sparse = stored, where, sparse
        self.shape, self.dtype = shape, np.dtype(dtype)

    def __getitem__(self, key: Any) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key, slice(None))
        start, stop, step = key[0].indices(self.shape[0])
        try:
            with self.stored.arrays() as get:
                block = (np.asarray(get()[start:stop]) if self.sparse is None else
                         _dense_rows(get, self.sparse, start, stop, self.shape[1], self.dtype))
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001  (h5py and the codecs raise many types)
            raise_if_transient(exc, self.where)
            raise InputError(f"{self.where}: rows {start}:{stop} cannot be read "
                             f"({type(exc).__name__}: {exc})") from None
        return block[::step][(slice(None), *key[1:])]


def _dense_rows(get: Any, kind: str, start: int, stop: int, n_cols: int,
                dtype: np.dtype) -> np.ndarray:
    """Rows ``start:stop`` of a CSR or CSC matrix (its arrays ``get("data")``, ...) as a
    dense array."""
    out = np.zeros((stop - start, n_cols), dtype=dtype)
    if stop <= start:
        return out
    if kind == "csr":  # this block's slice of indptr, then only its rows' entries
        indptr = np.asarray(get("indptr")[start:stop + 1], dtype=np.int64)
        a, b = int(indptr[0]), int(indptr[-1])
        cols = np.asarray(get("indices")[a:b])
        values = np.asarray(get("data")[a:b])
        rows = np.repeat(np.arange(stop - start), np.diff(indptr))
    else:  # CSC: a column's rows lie anywhere along indices, so every entry is read
        indptr = np.asarray(get("indptr")[:], dtype=np.int64)
        all_rows = np.asarray(get("indices")[:])
        keep = (all_rows >= start) & (all_rows < stop)
        rows = all_rows[keep] - start
        cols = np.repeat(np.arange(n_cols), np.diff(indptr))[keep]
        values = np.asarray(get("data")[:])[keep]
    out[rows, cols] = values
    return out


class _Memory:
    """The arrays of an in-memory SciPy sparse matrix, in :class:`_Stored`'s shape (so one
    reader serves both)."""

    def __init__(self, matrix: Any):
        self.parts = {"data": matrix.data, "indices": matrix.indices, "indptr": matrix.indptr}

    @contextmanager
    def arrays(self) -> Iterator[Any]:
        yield self.parts.__getitem__


def _attrs(node: Any) -> dict:
    return dict(node.attrs)


def _element_names(root: Any) -> list[str]:
    """The names of the elements of a stored AnnData (``X``, ``layers/...``, ``obsm/...``)."""
    names = ["X"] if "X" in root and _attrs(root["X"]).get("encoding-type") != "null" else []
    for group in ("layers", "obsm"):
        if group in root:
            names += [f"{group}/{k}" for k in sorted(root[group].keys())]
    return names


def read_obs_names(root: Any, h5: bool | None = None) -> np.ndarray | None:
    """The cell names (``obs_names``) of a stored AnnData's root group (a Zarr group or an
    h5py File), or None when its ``obs`` is not a data frame of anndata's encoding."""
    h5 = not isinstance(root, zarr.Group) if h5 is None else h5
    if "obs" not in root or not hasattr(root["obs"], "keys"):
        return None
    obs = root["obs"]
    index = _attrs(obs).get("_index")
    if index is None or index not in obs:
        return None
    column = obs[index]
    return _names(column.asstr()[:] if h5 and column.dtype.kind == "O" else column[:])


def _names(values: Any) -> np.ndarray:
    """Cell names as a NumPy array: integers as they are, anything else as fixed-width
    strings (Zarr reads strings as NumPy's StringDType, h5py as objects, pandas as objects)."""
    values = np.asarray(values)
    return values if values.dtype.kind in "iu" else np.array(values.tolist(), dtype=str)


def open_store(loc: Location, variable: str | None,
               root: Any = None) -> tuple[Any, np.ndarray | None, str, dict]:
    """An element of a ``.h5ad`` file or AnnData-Zarr store at ``loc``, for
    :func:`dr_dask.io.inputs.open_dataset`: (row-readable array, cell names, element name,
    identity content with the stored objects to fingerprint).

    Parameters
    ----------
    loc : Location
        The ``.h5ad`` file or the AnnData-Zarr store.
    variable : str or None
        ``X`` (None), ``layers/NAME`` or ``obsm/NAME``.
    root : zarr.Group, optional
        The store's root group when the caller has opened it.

    Returns
    -------
    tuple
        As the Zarr and NetCDF openers of :mod:`dr_dask.io.inputs` return them.

    Raises
    ------
    InputError
        Not an element name; no such element (the message lists those the store has); an
        element that is not an array (a data frame in ``obsm``); an unreadable file.
    """
    where = loc.url
    key = _element_key(variable, where)
    if loc.url.endswith(_H5AD):
        with _open_h5(loc) as root:
            return _open_element(loc, root, key, True)
    if root is None:
        root = zarr.open_group(store=loc.zarr_store(read_only=True), mode="r")
    return _open_element(loc, root, key, False)


def _open_element(loc: Location, root: Any, key: str,
                  h5: bool) -> tuple[Any, np.ndarray | None, str, dict]:
    names = _element_names(root)
    if key not in names:
        raise _missing(loc.url, key, names)
    node = root[key]
    encoding = _attrs(node).get("encoding-type")
    element = f"{loc.url}:{key}"
    if hasattr(node, "keys"):  # a group: a sparse matrix, or something that is no array
        if encoding not in _SPARSE:
            raise InputError(f"{element} is not an array (its encoding-type is {encoding!r}); "
                             f"the arrays of this AnnData: {', '.join(_arrays(root, names))}")
        shape = tuple(int(s) for s in _attrs(node)["shape"])
        arr: Any = _Rows(_Stored(loc, key, h5), element, (shape[0], shape[1]),
                         node["data"].dtype, _SPARSE[encoding])
        content = _stored_content(loc, key, h5, node)
    elif h5:
        arr = _Rows(_Stored(loc, key, True), element, tuple(node.shape), node.dtype, None)
        content = {"stored": (loc, {"": loc.fs.info(loc.path)})}
    else:  # a dense Zarr array, opened where it is: read, checked and fingerprinted as
        # every Zarr input is
        arr, _, _, content = _open_zarr(loc.child(*key.split("/")), None)
    obs_names = read_obs_names(root, h5)
    if obs_names is not None and arr.shape[0] != len(obs_names):
        raise InputError(f"{element} has {arr.shape[0]} rows but the AnnData has "
                         f"{len(obs_names)} cells (obs_names)")
    logger.debug("AnnData element %s: shape %s, %s", element, arr.shape, encoding or "dense")
    return arr, obs_names, key, content


def _arrays(root: Any, names: list[str]) -> list[str]:
    """The names among ``names`` that are arrays (dense or sparse)."""
    return [n for n in names if not hasattr(root[n], "keys")
            or _attrs(root[n]).get("encoding-type") in _SPARSE]


def _stored_content(loc: Location, key: str, h5: bool, node: Any) -> dict:
    """A sparse element's identity content: the objects to fingerprint (the whole ``.h5ad``
    file; the Zarr group's objects, every chunk of its three arrays checked present)."""
    if h5:
        return {"stored": (loc, {"": loc.fs.info(loc.path)})}
    group = loc.child(*key.split("/"))
    listing = group.find()
    for part in ("data", "indices", "indptr"):
        prefix = part + "/"
        _check_chunks(node[part], f"{loc.url}:{key}/{part}",
                      {k[len(prefix):]: v for k, v in listing.items() if k.startswith(prefix)})
    return {"stored": (group, listing)}


# ---------------------------------------------------------------------------------------------
# AnnData objects


def _obs_names(adata: Any) -> np.ndarray:
    return _names(adata.obs_names)


def _object_element(adata: Any, key: str) -> Any:
    """The object ``key`` names in ``adata`` (its ``X``, a layer, an ``obsm`` entry)."""
    where = f"AnnData object ({adata.n_obs} cells)"
    names = (["X"] if adata.X is not None else []) + [
        f"{g}/{k}" for g in ("layers", "obsm") for k in sorted(getattr(adata, g).keys())]
    if key not in names:
        raise _missing(where, key, names)
    if key == "X":
        return adata.X
    group, name = key.split("/")
    return getattr(adata, group)[name]


def _rows_of(element: Any, key: str) -> Any:
    """An element of an AnnData object as an input: NumPy and dask arrays as they are, a SciPy
    sparse matrix by dense row blocks, a backed sparse element read into memory first, a data
    frame (``obsm``) as its values."""
    if hasattr(element, "to_memory"):  # anndata's backed sparse dataset (of a view)
        element = element.to_memory()
    if hasattr(element, "tocsr"):  # SciPy sparse: CSR and CSC as they are, others as CSR
        if getattr(element, "format", None) not in ("csr", "csc"):
            element = element.tocsr()
        fmt = element.format
        shape = (int(element.shape[0]), int(element.shape[1]))
        rows = _Rows(_Memory(element), key, shape, element.dtype, fmt)
        n = _row_chunks(shape, np.dtype(element.dtype).itemsize)
        token = dask.base.tokenize(element.data, element.indices, element.indptr, shape, fmt)
        # not inlined: the matrix is one object of the graph, not one copy per block's task
        return da.from_array(rows, chunks=(n, -1), asarray=True, inline_array=False,
                             name=f"anndata-{fmt}-{token}")
    if hasattr(element, "to_numpy") and hasattr(element, "columns"):  # a data frame
        kinds = {np.dtype(t).kind for t in element.dtypes}
        if not kinds <= set("fiub"):
            raise InputError(f"{key} is a data frame with non-numeric columns; it is not a "
                             "samples x features array")
        return element.to_numpy()
    if type(element).__module__.split(".")[0] in ("numpy", "dask"):
        return element
    return np.asarray(element)


def element(adata: Any, variable: str | None) -> tuple[Any, np.ndarray]:
    """An AnnData object's element ``variable`` (``X``, ``layers/NAME``, ``obsm/NAME``) as
    an input, and its cell names.

    Returns
    -------
    rows : ndarray, dask array or InputData
        NumPy (in memory), a dask array (sparse by dense row blocks, or the object's own dask
        array), or an opened input for a backed object's X (read from its file).
    obs_names : ndarray of shape (T,)
    """
    key = _element_key(variable, "AnnData object")
    ids = _obs_names(adata)
    backed = getattr(adata, "isbacked", False) and not getattr(adata, "is_view", False)
    if key == "X" and backed:
        # a backed object's X is its file's (its layers and obsm are in memory, maybe newer
        # than the file's): read by row blocks there, by this process or the workers
        return open_dataset(location(os.fspath(adata.filename)), key), ids
    return _rows_of(_object_element(adata, key), key), ids


def open_object(adata: Any, variable: str | None) -> InputData:
    """An AnnData object's element as an opened input, its rows named by ``obs_names``
    (:func:`dr_dask.io.inputs.open_dataset` of an AnnData object)."""
    rows, ids = element(adata, variable)
    inp = rows if isinstance(rows, InputData) else open_dataset(rows)
    if len(ids) != inp.data.shape[0]:
        raise InputError(f"{variable or 'X'} has {inp.data.shape[0]} rows but the AnnData "
                         f"object has {len(ids)} cells")
    inp.sample_ids = ids
    inp.identity["variable"] = _element_key(variable, "AnnData object")
    return inp


# ---------------------------------------------------------------------------------------------
# writing obsm


def _labelled_values(Y: Any) -> tuple[Any, np.ndarray | None]:
    """``Y``'s values (NumPy or dask) and its sample labels when it carries them (a pandas
    DataFrame's index, a DataArray's first coordinate)."""
    if hasattr(Y, "index") and hasattr(Y, "to_numpy"):
        return Y.to_numpy(), np.asarray(Y.index)
    if hasattr(Y, "dims") and hasattr(Y, "coords") and hasattr(Y, "data"):
        dim = Y.dims[0]
        labels = np.asarray(Y[dim].values) if dim in Y.coords else None
        return Y.data, labels
    return (Y if isinstance(Y, da.Array) else np.asarray(Y)), None


def _stored_obs_names(root: Any, loc: Location) -> np.ndarray:
    names = read_obs_names(root)
    if names is None:
        raise InputError(f"{loc} has no cell names (obs/_index): not an AnnData of anndata's "
                         "encoding (anndata 0.7 or later)")
    return names


def _check_embedding(values: Any, labels: np.ndarray | None, obs_names: np.ndarray,
                     where: str) -> None:
    """An embedding fits ``where``'s cells: one row each, numbers, and when labelled, the
    cells' names in their order."""
    if values.ndim != 2 or values.shape[0] != len(obs_names):
        raise InputError(f"the embedding has shape {tuple(values.shape)}; {where} needs "
                         f"({len(obs_names)}, M): one row per cell")
    if np.dtype(values.dtype).kind not in "fiu":
        raise InputError(f"the embedding's dtype is {values.dtype}; obsm takes numbers")
    if labels is not None:
        have, want = _names(labels).astype(str).tolist(), obs_names.astype(str).tolist()
        if have != want:
            bad = [i for i, (a, b) in enumerate(zip(have, want)) if a != b]
            raise InputError(
                f"the embedding's rows are not {where}'s cells in order: row {bad[0]} is "
                f"{have[bad[0]]!r}, the cell there is {want[bad[0]]!r} ({len(bad)} "
                "rows differ); reorder it (DataFrame.loc[obs_names])")


def _obsm_key(key: str) -> str:
    if not key or "/" in key or key.strip() != key:
        raise InputError(f"obsm key {key!r}: name it with no '/' and no spaces at its ends "
                         "(scanpy's names are X_pca, X_umap, ...)")
    return key


def write_obsm(target: Any, key: str, Y: Any, *, overwrite: bool = False,
               storage_options: dict | None = None) -> None:
    """Write an embedding into ``obsm[key]`` of an AnnData (object, AnnData-Zarr store or
    local ``.h5ad`` file), as scanpy writes ``obsm["X_umap"]``.

    The one place this package writes into a user's data: only when called. Everything is
    checked before anything is written.

    Parameters
    ----------
    target : AnnData, str, os.PathLike or Location
        An AnnData object (``target.obsm[key] = Y``; a backed object's file is written by
        anndata's own ``write``), an AnnData-Zarr store (local or URL: the array is written
        in the store's Zarr format, with anndata's encoding attributes, and the store's
        consolidated metadata rewritten) or a local ``.h5ad`` file (opened for writing with
        h5py: no other process may have it open).
    key : str
        The ``obsm`` key, e.g. ``"X_ikd"``.
    Y : array-like of shape (n_obs, M)
        The embedding: NumPy or dask (written by row blocks), or labelled (a pandas DataFrame
        or an xarray DataArray such as a run's ``embedding``), whose labels must be the
        target's ``obs_names`` in order.
    overwrite : bool, default=False
        Replace an existing ``obsm[key]``; without it, an existing key is an error.
    storage_options : dict, optional
        For the filesystem of a URL.

    Raises
    ------
    InputError
        Not an AnnData; a remote ``.h5ad``; an embedding of the wrong number of rows, labelled
        with other cells or in another order; an existing key without ``overwrite``.

    See Also
    --------
    dr_dask.open_dataset : AnnData elements as inputs (``"cells.zarr:obsm/X_pca"``).

    Examples
    --------
    >>> import dr_dask
    >>> Y = dr_dask.Isomap(n_neighbors=15).fit_transform("cells.zarr:obsm/X_pca")  # doctest: +SKIP
    >>> dr_dask.write_obsm("cells.zarr", "X_isomap", Y)  # doctest: +SKIP

    On the command line, a run's embedding: ``dr-dask write-obsm runs.zarr/isomap-... cells.zarr``.
    """
    key = _obsm_key(key)
    values, labels = _labelled_values(Y)
    if is_anndata(target):
        ids = _obs_names(target)
        _check_embedding(values, labels, ids, "the AnnData object")
        if key in target.obsm and not overwrite:
            raise InputError(f"obsm[{key!r}] exists; pass overwrite=True to replace it")
        target.obsm[key] = np.asarray(values)
        return
    loc = location(target, storage_options)
    if loc.url.endswith(_H5AD):
        _write_h5ad(loc, key, values, labels, overwrite)
    else:
        _write_zarr(loc, key, values, labels, overwrite)
    logger.info("wrote obsm[%r] (%s) into %s", key, tuple(values.shape), loc)


def _existing(where: str, key: str, obsm: Any, overwrite: bool) -> None:
    if obsm is not None and key in obsm and not overwrite:
        raise InputError(f"{where}: obsm[{key!r}] exists; pass overwrite=True (--overwrite) "
                         "to replace it")


def _store_rows(values: Any, arr: Any) -> None:
    """Write ``values`` into the new array ``arr``: a dask array by row blocks."""
    if isinstance(values, da.Array):
        da.store(values, arr, lock=True)
    else:
        arr[...] = np.asarray(values)


def _write_zarr(loc: Location, key: str, values: Any, labels: np.ndarray | None,
                overwrite: bool) -> None:
    try:
        root = zarr.open_group(store=loc.zarr_store(), mode="r+")
    except Exception as exc:  # noqa: BLE001  (zarr raises many types for "no group here")
        raise_if_transient(exc, loc)
        raise InputError(f"{loc} is not an AnnData-Zarr store nor a .h5ad file") from None
    if not is_anndata_group(root):
        raise InputError(f"{loc} is a Zarr group but not an AnnData store (its root has no "
                         "encoding-type 'anndata')")
    _check_embedding(values, labels, _stored_obs_names(root, loc), str(loc))
    obsm = root.get("obsm")
    _existing(str(loc), key, obsm, overwrite)
    consolidated = root.metadata.consolidated_metadata is not None
    if obsm is None:
        obsm = root.create_group("obsm")
        obsm.attrs.update(_DICT_ENCODING)
    assert isinstance(obsm, zarr.Group)  # anndata's obsm is a group (checked by the reader)
    # chunked as inputs are read (dr_dask.input.chunk-bytes): the embedding is an input too
    rows = _row_chunks(values.shape, np.dtype(values.dtype).itemsize)
    arr = obsm.create_array(key, shape=values.shape, dtype=values.dtype,
                            chunks=(rows, values.shape[1]), overwrite=overwrite)
    arr.attrs.update(ARRAY_ENCODING)
    _store_rows(values, arr)
    if consolidated:  # anndata opens a store through its consolidated metadata: keep it whole
        with warnings.catch_warnings():  # zarr's note that format 3 has no consolidation spec
            warnings.simplefilter("ignore", UserWarning)
            zarr.consolidate_metadata(loc.zarr_store())


def _write_h5ad(loc: Location, key: str, values: Any, labels: np.ndarray | None,
                overwrite: bool) -> None:
    if not loc.is_local:
        raise InputError(f"{loc}: a .h5ad file is written in place on a local disk only; copy "
                         "it here, or write the embedding into an AnnData-Zarr store")
    if not os.path.exists(loc.url):
        raise InputError(f"{loc} does not exist")
    with _open_h5(loc, "r+") as f:
        _check_embedding(values, labels, _stored_obs_names(f, loc), str(loc))
        obsm = f.get("obsm")
        _existing(str(loc), key, obsm, overwrite)
        if obsm is None:
            obsm = f.create_group("obsm")
            obsm.attrs.update(_DICT_ENCODING)
        if key in obsm:
            del obsm[key]
        arr = obsm.create_dataset(key, shape=values.shape, dtype=values.dtype)
        arr.attrs.update(ARRAY_ENCODING)
        _store_rows(values, arr)
