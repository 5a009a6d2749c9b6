"""Landmark geodesics above the in-memory budget: written to the fit's scratch store without a
``geodesic_store`` argument, read from there by ``transform``, deleted with the estimator."""

from __future__ import annotations

import gc
import os

import dask
import numpy as np
import zarr
from conftest import noisy_curve


def _local_path(arr: zarr.Array) -> str:
    return os.path.join(str(arr.store.root), arr.path)


def test_landmark_isomap_keeps_its_geodesics_in_a_store_transform_reads():
    from dr_dask.methods.landmark_isomap import LandmarkIsomap

    X = noisy_curve(600, 10, seed=7)
    kw = dict(n_neighbors=8, n_components=1, n_landmarks=40, random_state=0)
    held = LandmarkIsomap(**kw).fit(X)
    assert isinstance(held.landmark_geodesics_, np.ndarray)
    with dask.config.set({"dr_dask.tiles.memory-bytes": 4 * 40 * 600 - 1}):
        stored = LandmarkIsomap(**kw).fit(X)
    assert isinstance(stored.landmark_geodesics_, zarr.Array)
    np.testing.assert_allclose(stored.embedding_, held.embedding_, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(stored.transform(X[:25]), held.transform(X[:25]), rtol=1e-6,
                               atol=1e-9)
    path = _local_path(stored.landmark_geodesics_)
    assert os.path.exists(path)
    del stored
    gc.collect()
    assert not os.path.exists(path)  # the store went with the estimator


def test_landmark_ikd_maps_new_points_from_stored_geodesics():
    from dr_dask.methods.ikd import IKD

    X = noisy_curve(600, 10, seed=8)
    kw = dict(n_components=1, solver="geodesic", n_neighbors=8, n_landmarks=40, random_state=0)
    held = IKD(**kw).fit(X)
    stored = IKD(tile_cache="disk", **kw).fit(X)  # the L x T rows in Zarr
    assert isinstance(stored.out_of_sample_.paths, zarr.Array)
    np.testing.assert_allclose(stored.embedding_, held.embedding_, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(stored.transform(X[:25]), held.transform(X[:25]), rtol=1e-6,
                               atol=1e-9)
