"""Labelled in, labelled out: xarray and pandas inputs keep their labels through every
transformer; set_output and get_feature_names_out as scikit-learn's; NumPy and dask unchanged."""

from __future__ import annotations

import json

import dask
import dask.array as da
import numpy as np
import pandas as pd
import pytest
import xarray as xr
from sklearn.datasets import make_swiss_roll
from sklearn.exceptions import NotFittedError

from dr_dask import IKD, LSDR, GPIsomap, Isomap, LandmarkIsomap

T = 150


def estimators():
    return [
        IKD(n_components=2, random_state=0),
        Isomap(n_neighbors=8),
        LandmarkIsomap(n_neighbors=8, n_landmarks=30, random_state=0),
        GPIsomap(n_neighbors=8, random_state=0),
        LSDR(n_components=2),
    ]


IDS = [type(e).__name__ for e in estimators()]


@pytest.fixture(autouse=True)
def _threads():
    with dask.config.set(scheduler="threads"):
        yield


@pytest.fixture(scope="module")
def roll():
    return np.ascontiguousarray(make_swiss_roll(T, random_state=0)[0])


def _array(X, coord=True):
    coords = {"label": ("time", np.arange(len(X)) % 3)}
    if coord:
        coords["time"] = pd.date_range("2024-01-01", periods=len(X), freq="h")
    return xr.DataArray(X, dims=("time", "feature"), coords=coords, name="x")


@pytest.mark.parametrize("est", estimators(), ids=IDS)
def test_dataarray_in_dataarray_out(est, roll):
    a = _array(roll)
    Y = est.fit_transform(a)
    assert isinstance(Y, xr.DataArray)
    assert Y.dims == ("time", "component")
    np.testing.assert_array_equal(Y["time"].values, a["time"].values)
    np.testing.assert_array_equal(Y["label"].values, a["label"].values)  # coords along time
    np.testing.assert_array_equal(Y["component"].values, [0, 1])
    np.testing.assert_allclose(Y.values, est.fit_transform(roll), rtol=1e-10, atol=1e-12)
    assert Y.attrs["method"] == type(est).__name__
    assert json.loads(Y.attrs["params"])["n_components"] == 2
    # transform of a Dataset's variable: the same labels, the same numbers as NumPy in
    ds = xr.Dataset({"x": a[:20]})
    Z = est.transform(ds)
    assert isinstance(Z, xr.DataArray) and Z.dims == ("time", "component")
    np.testing.assert_array_equal(Z["time"].values, a["time"].values[:20])
    np.testing.assert_allclose(Z.values, est.transform(roll[:20]), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("est", estimators(), ids=IDS)
def test_lazy_dataarray_stays_lazy(est, roll):
    est.fit(roll)
    a = _array(roll).chunk({"time": 50})
    Y = est.transform(a)
    assert isinstance(Y, xr.DataArray) and isinstance(Y.data, da.Array)
    assert Y.data.chunks[0] == (50, 50, 50)  # the input's row chunks
    np.testing.assert_allclose(Y.values, est.transform(roll), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("est", estimators(), ids=IDS)
def test_pandas_in_pandas_out_and_set_output(est, roll):
    index = pd.Index([f"cell{i}" for i in range(T)], name="cell")
    frame = pd.DataFrame(roll, index=index, columns=["a", "b", "c"])
    Y = est.fit_transform(frame)
    name = type(est).__name__.lower()
    assert isinstance(Y, pd.DataFrame)
    assert Y.index.equals(index)
    assert list(Y.columns) == [f"{name}0", f"{name}1"]
    np.testing.assert_array_equal(est.get_feature_names_out(), [f"{name}0", f"{name}1"])
    np.testing.assert_allclose(Y.to_numpy(), est.fit_transform(roll), rtol=1e-10, atol=1e-12)
    # NumPy in: NumPy out (as today); pandas whatever the input once asked for
    assert isinstance(est.fit_transform(roll), np.ndarray)
    assert isinstance(est.set_output(transform="pandas").fit_transform(roll), pd.DataFrame)
    assert isinstance(est.set_output(transform="default").fit_transform(roll), np.ndarray)


def test_polars_output(roll):
    pl = pytest.importorskip("polars", reason="polars is not installed")
    Y = Isomap(n_neighbors=8).set_output(transform="polars").fit_transform(roll)
    assert isinstance(Y, pl.DataFrame) and Y.columns == ["isomap0", "isomap1"]


def test_dask_in_dask_out(roll):
    est = Isomap(n_neighbors=8).fit(roll)
    Y = est.transform(da.from_array(roll, chunks=(40, 3)))
    assert isinstance(Y, da.Array) and Y.chunks[0] == (40, 40, 40, 30)


def test_set_output_unknown_value():
    with pytest.raises(ValueError, match="transform must be one of 'default', 'pandas', "
                                         "'polars'"):
        Isomap().set_output(transform="xarray")


@pytest.mark.parametrize("est", estimators(), ids=IDS)
def test_transform_and_feature_names_before_fit(est, roll):
    with pytest.raises(NotFittedError):
        est.get_feature_names_out()
    if hasattr(est, "transform"):
        with pytest.raises(NotFittedError):
            est.transform(_array(roll))


def test_dataarray_without_sample_coordinate(roll):
    """No coordinate on the sample dimension: the output has the dimension, without one
    (as xarray itself does), and the other coordinates along it."""
    Y = Isomap(n_neighbors=8).fit_transform(_array(roll, coord=False))
    assert Y.dims == ("time", "component") and "time" not in Y.coords
    np.testing.assert_array_equal(Y["label"].values, np.arange(T) % 3)


def test_dataarray_with_string_sample_coordinate(roll):
    """A non-numeric coordinate (cell barcodes) labels the rows as it is."""
    a = xr.DataArray(roll, dims=("cell", "gene"),
                     coords={"cell": [f"AC{i:04d}" for i in range(T)]})
    Y = Isomap(n_neighbors=8).fit_transform(a)
    assert Y.dims == ("cell", "component") and Y["cell"].values[3] == "AC0003"


def test_dataarray_with_non_numeric_values_refused(roll):
    a = xr.DataArray(roll.astype(str), dims=("time", "feature"))
    with pytest.raises(ValueError, match="numeric"):
        Isomap(n_neighbors=8).fit(a)


def test_dataarray_whose_sample_dim_is_component(roll):
    a = xr.DataArray(roll, dims=("component", "feature"))
    with pytest.raises(ValueError, match="rename it"):
        Isomap(n_neighbors=8).fit_transform(a)


def test_gp_isomap_variance_labelled_like_the_embedding(roll):
    """transform(..., return_variance=True): the variance carries the samples' labels too, a
    lazy input keeps it lazy."""
    est = GPIsomap(n_neighbors=8, random_state=0).fit(roll)
    a = _array(roll[:30])
    _, var = est.transform(a, return_variance=True)
    assert isinstance(var, xr.DataArray) and var.dims == ("time",) and var.name == "x_variance"
    np.testing.assert_array_equal(var["time"].values, a["time"].values)
    np.testing.assert_array_equal(var["label"].values, a["label"].values)
    np.testing.assert_allclose(var.values, est.predict_variance(roll[:30]), rtol=1e-12)
    _, lazy_var = est.transform(a.chunk({"time": 10}), return_variance=True)
    assert isinstance(lazy_var.data, da.Array) and lazy_var.dims == ("time",)
    np.testing.assert_allclose(lazy_var.values, var.values, rtol=1e-12)
    frame = pd.DataFrame(roll[:30], index=pd.RangeIndex(100, 130, name="cell"))
    _, series = est.transform(frame, return_variance=True)
    assert isinstance(series, pd.Series) and series.name == "variance"
    assert series.index.equals(frame.index)
