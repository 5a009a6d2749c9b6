"""Labelled in, labelled out: the one output wrapper of every transformer.

A notebook user hands an estimator an xarray DataArray with a time (or cell, or pixel)
coordinate, or a pandas DataFrame with an index, and expects the embedding back labelled the
same way, as scikit-learn's and xarray's own tools do:

- an xarray ``DataArray`` (or a ``Dataset`` with one 2-D variable) gives a ``DataArray`` of
  dims ``(sample_dim, "component")``: the input's sample dimension with its coordinate (and
  the other coordinates along it), a ``component`` coordinate 0..M-1, and the method and its
  parameters in ``attrs``. A dask-backed DataArray stays lazy where ``transform`` is lazy
  (its dask array is what the estimator maps, block by block);
- a pandas ``DataFrame`` gives a ``DataFrame`` with the same index and the columns of
  ``get_feature_names_out()``;
- NumPy and dask arrays, paths, stores: unchanged (NumPy, dask with the input's row chunks).

Every output is in the dtype the fit recorded: float32 input gives float32 output (as
scikit-learn's transformers keep it), anything else float64.

``set_output(transform="pandas" | "polars" | "default")`` and ``get_feature_names_out`` come
from scikit-learn's public mixins (``TransformerMixin``'s ``set_output`` API,
``ClassNamePrefixFeaturesOutMixin``): with ``"pandas"`` or ``"polars"`` the output is that
container whatever the input, as for scikit-learn's own transformers. ``"default"`` is this
module's labelled output.

Estimators opt in by listing :class:`LabelledOutput` before ``TransformerMixin`` in their
bases; ``transform`` and ``fit_transform`` defined by the class are wrapped once, at class
creation, outside scikit-learn's own wrapper.
"""

from __future__ import annotations

import functools
import json
import logging
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr
from sklearn.base import ClassNamePrefixFeaturesOutMixin

from dr_dask.io.inputs import _open_xarray

logger = logging.getLogger(__name__)

#: The values ``set_output(transform=...)`` accepts (None leaves the setting as it is).
OUTPUTS = ("default", "pandas", "polars")
#: Name of the embedding's second dimension in a DataArray output.
COMPONENT_DIM = "component"

__all__ = ["COMPONENT_DIM", "OUTPUTS", "LabelledOutput", "label_output"]


def _module(X: Any) -> str:
    return type(X).__module__.split(".")[0]


def _data_array(X: Any) -> Any:
    """The DataArray an xarray input stands for (a Dataset's one 2-D variable), else None."""
    if _module(X) != "xarray":
        return None
    if isinstance(X, xr.Dataset):
        _, _, variable = _open_xarray(X, None, None)  # the inputs' rule for the variable
        return X[variable]
    return X if isinstance(X, xr.DataArray) else None


def _params_json(estimator: Any) -> str:
    """The estimator's parameters as a JSON object (anything else as its repr): attrs that
    Zarr and netCDF can store."""
    params = {k: v for k, v in estimator.get_params(deep=False).items() if k != "client"}
    return json.dumps(params, default=repr, sort_keys=True)


def label_output(estimator: Any, X: Any, Y: Any) -> Any:
    """``Y`` (the estimator's NumPy or dask output for input ``X``) labelled like ``X``.

    Parameters
    ----------
    estimator : fitted transformer
        Gives the method name, parameters and ``get_feature_names_out``.
    X : any input kind
        The input of ``transform`` / ``fit_transform``.
    Y : ndarray or dask array of shape (T, M), or a tuple whose first item is one
        Anything else (a pandas or polars container made by ``set_output``) is returned as
        it is. A tuple's further items of shape (T,) (GP-Isomap's variance) are labelled
        along the same samples: a DataArray of the sample dimension, a Series with the
        index, named from the estimator's ``_output_names`` (after the embedding's).

    Returns
    -------
    xarray.DataArray, pandas.DataFrame, or ``Y`` unchanged
    """
    Y = _in_output_dtype(estimator, Y)
    if isinstance(Y, tuple):  # (embedding, variance, ...): each labelled along the samples
        names = getattr(estimator, "_output_names", ())
        return (label_output(estimator, X, Y[0]),
                *(_label_vector(estimator, X, y, names[i] if i < len(names) else f"output{i + 1}")
                  for i, y in enumerate(Y[1:])))
    if _module(Y) not in ("numpy", "dask"):
        return Y  # already a container of set_output's choosing
    arr = _data_array(X)
    if arr is not None:
        return _as_data_array(estimator, arr, Y)
    if _module(X) == "pandas" and hasattr(X, "index"):
        return pd.DataFrame(np.asarray(Y), index=X.index,
                            columns=estimator.get_feature_names_out())
    return Y


def _in_output_dtype(estimator: Any, Y: Any) -> Any:
    """NumPy and dask float outputs in the dtype the fit recorded (``_out_dtype``: float32
    input gives float32 output, :func:`dr_dask.io.validation.output_dtype`)."""
    dtype = getattr(estimator, "_out_dtype", None)
    if isinstance(Y, tuple):
        return tuple(_in_output_dtype(estimator, y) for y in Y)
    if dtype is None or _module(Y) not in ("numpy", "dask") or \
            getattr(Y, "dtype", None) is None or Y.dtype.kind != "f" or Y.dtype == dtype:
        return Y
    return Y.astype(dtype)


def _label_vector(estimator: Any, X: Any, y: Any, name: str) -> Any:
    """A per-sample output ``y`` of shape (T,) labelled like ``X`` (else unchanged)."""
    if _module(y) not in ("numpy", "dask") or getattr(y, "ndim", 0) != 1:
        return y
    arr = _data_array(X)
    if arr is not None:
        dim = arr.dims[0]
        coords = {key: c for key, c in arr.coords.items() if c.dims == (dim,)}
        attrs = {"method": type(estimator).__name__, "params": _params_json(estimator)}
        full = f"{arr.name}_{name}" if arr.name is not None else name
        return xr.DataArray(y, dims=(dim,), coords=coords, attrs=attrs, name=full)
    if _module(X) == "pandas" and hasattr(X, "index"):
        return pd.Series(np.asarray(y), index=X.index, name=name)
    return y


def _as_data_array(estimator: Any, arr: Any, Y: Any) -> Any:
    dim = arr.dims[0]
    if dim == COMPONENT_DIM:
        raise ValueError(f"the input's sample dimension is named {COMPONENT_DIM!r}, the name of "
                         "the output's component dimension; rename it (DataArray.rename)")
    # the sample coordinate and every other coordinate along the samples (labels, times)
    coords = {name: c for name, c in arr.coords.items() if c.dims == (dim,)}
    coords[COMPONENT_DIM] = np.arange(Y.shape[1])
    attrs = {"method": type(estimator).__name__, "params": _params_json(estimator)}
    name = f"{arr.name}_embedding" if arr.name is not None else "embedding"
    return xr.DataArray(Y, dims=(dim, COMPONENT_DIM), coords=coords, attrs=attrs, name=name)


def _unwrap(X: Any) -> Any:
    """What ``transform`` maps: a dask-backed DataArray's dask array (so that a lazy
    transform stays lazy), any other input itself."""
    arr = _data_array(X)
    if arr is not None and _module(arr.data) == "dask":
        return arr.data
    return X


def _labelled(method: Any, unwrap: bool) -> Any:
    @functools.wraps(method)
    def wrapped(self: Any, X: Any, *args: Any, **kwargs: Any) -> Any:
        Y = method(self, _unwrap(X) if unwrap else X, *args, **kwargs)
        return label_output(self, X, Y)

    return wrapped


class LabelledOutput(ClassNamePrefixFeaturesOutMixin):
    """Mixin: labelled output, ``set_output`` and ``get_feature_names_out`` (see the module).

    List it before ``TransformerMixin``: ``class Est(LabelledOutput, TransformerMixin,
    BaseEstimator)``. A fitted estimator's ``embedding_`` gives the number of output features
    (``ikd0``, ``ikd1``, ... for :class:`~dr_dask.IKD`).
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)  # scikit-learn's set_output wrapper goes first
        for name in ("transform", "fit_transform"):
            if name in cls.__dict__:
                # fit_transform sees the input itself: fit records its labels and kind
                setattr(cls, name, _labelled(cls.__dict__[name], unwrap=name == "transform"))

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        # float32 input gives float32 output (the fit records it; the outputs are cast here)
        tags.transformer_tags.preserves_dtype = ["float64", "float32"]
        return tags

    @property
    def _n_features_out(self) -> int:
        return int(self.embedding_.shape[1])

    def set_output(self, *, transform: str | None = None) -> Any:
        """Set the output container of ``transform`` and ``fit_transform``.

        Parameters
        ----------
        transform : {"default", "pandas", "polars"} or None
            ``"default"``: labelled like the input (see :mod:`dr_dask.methods.labelled`);
            ``"pandas"`` / ``"polars"``: a DataFrame of that library whatever the input;
            None: unchanged.

        Returns
        -------
        self
        """
        if transform is not None and transform not in OUTPUTS:
            raise ValueError(f"set_output(transform={transform!r}): transform must be one of "
                             f"{', '.join(map(repr, OUTPUTS))} or None")
        return super().set_output(transform=transform)
