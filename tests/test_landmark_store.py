"""Landmark geodesics above the in-memory budget: written to the fit's scratch store without a
``geodesic_store`` argument, read from there by ``transform``, deleted with the estimator."""

from __future__ import annotations

import gc
import os

import dask
import numpy as np
import pytest
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


@pytest.mark.cluster
@pytest.mark.parametrize("method", ["landmark_isomap", "landmark_ikd"])
def test_an_interrupted_fit_leaves_no_landmark_rows(method, cluster_client, tmp_path,
                                                    monkeypatch):
    """The rows a fit keeps for ``transform`` above the budget are written before the fit is
    done: interrupted after they were written (Ctrl-C in the landmark MDS), the fit deletes
    them at once, while its error is still held; nothing else would. A fit that completes
    keeps them in the same place."""
    import dr_dask.methods._ikd_geodesic as ikd_geodesic
    import dr_dask.methods.landmark_isomap as landmark_isomap
    from dr_dask.methods.ikd import IKD

    X = noisy_curve(600, 10, seed=8)
    kw = dict(n_components=1, n_neighbors=8, n_landmarks=40, random_state=0,
              scratch=str(tmp_path), client=cluster_client)
    module = landmark_isomap if method == "landmark_isomap" else ikd_geodesic

    def make():
        if method == "landmark_isomap":
            return landmark_isomap.LandmarkIsomap(**kw)
        return IKD(solver="geodesic", tile_cache="disk", **kw)

    def kept() -> list[str]:
        return sorted(p for p in os.listdir(tmp_path) if "landmark_geodesics" in p)

    written = []
    real = module.landmark_mds

    def interrupted(*args, **kwargs):
        written.append(kept())
        raise KeyboardInterrupt

    with dask.config.set({"dr_dask.tiles.memory-bytes": 4 * 40 * 600 - 1}):
        monkeypatch.setattr(module, "landmark_mds", interrupted)
        with pytest.raises(KeyboardInterrupt) as stopped:
            make().fit(X)
        assert len(written[0]) == 1 and stopped.value is not None  # the rows were there
        assert kept() == []
        monkeypatch.setattr(module, "landmark_mds", real)
        est = make().fit(X)
        assert len(kept()) == 1
        est.transform(X[:5])
