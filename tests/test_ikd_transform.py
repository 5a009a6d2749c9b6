"""IKD.transform: new rows land where a fit on all rows puts them, for every solver.

The data are the IKD paper's GP mapping (``dr-dask datasets make gp``): fit on 80% of the
rows, map the other 20%, and compare with the same rows of a fit on all of them (Procrustes
disparity, so the arbitrary rotation of each fit does not count).
"""

from __future__ import annotations

import warnings

import dask
import dask.array as da
import numpy as np
import pytest
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LinearRegression
from sklearn.pipeline import make_pipeline

from dr_dask import IKD
from dr_dask.datasets import make_dataset
from dr_dask.linalg.align import procrustes_disparity
from dr_dask.methods._ikd_transform import NystromMap


@pytest.fixture(autouse=True)
def _threads():
    with dask.config.set(scheduler="threads"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


@pytest.fixture(scope="module")
def gp():
    ds = make_dataset("gp", None, n_samples=1000, n_features=100, n_components=3,
                      random_state=0)
    X, Z = ds["X"].values, ds["latent"].values
    perm = np.random.default_rng(0).permutation(len(X))
    return X, Z, np.sort(perm[:800]), np.sort(perm[800:])


def _fits(gp, **params):
    X, _, train, test = gp
    whole = IKD(n_components=3, random_state=0, **params).fit(X)
    part = IKD(n_components=3, random_state=0, **params).fit(X[train])
    return whole, part


@pytest.mark.parametrize("reference", ["min_max", "center"])
def test_full_ikd_maps_held_out_rows_like_a_fit_on_all(gp, reference):
    X, _, train, test = gp
    whole, part = _fits(gp, reference=reference)
    mapped = part.transform(X[test])
    assert procrustes_disparity(whole.embedding_[test], mapped) < 0.02
    # the held-out rows in the frame of the training rows: the whole picture agrees too
    both = np.empty_like(whole.embedding_)
    both[train], both[test] = part.embedding_, mapped
    assert procrustes_disparity(whole.embedding_, both) < 0.02
    # and the training rows map onto their own embedding
    again = part.transform(X[train])
    rel = np.linalg.norm(again - part.embedding_) / np.linalg.norm(part.embedding_)
    assert rel < 1e-6


@pytest.mark.parametrize("params", [
    {"solver": "geodesic"},
    {"solver": "geodesic", "n_landmarks": 200},
    {"solver": "full", "n_landmarks": 200},
    {"solver": "blockwise"},
], ids=["geodesic", "landmark-geodesic", "landmark-full", "blockwise"])
def test_triangulated_solvers_map_held_out_rows(gp, params):
    """Held-out rows agree with the fit on all rows as well as the training rows of the two
    fits agree with each other (which bounds what any map can do)."""
    X, _, train, test = gp
    whole, part = _fits(gp, **params)
    trained = procrustes_disparity(whole.embedding_[train], part.embedding_)
    mapped = procrustes_disparity(whole.embedding_[test], part.transform(X[test]))
    assert mapped < 1.5 * trained + 0.01, (mapped, trained)
    if "n_landmarks" in params:  # the landmark solver's own triangulation, reproduced
        again = part.transform(X[train])
        rel = np.linalg.norm(again - part.embedding_) / np.linalg.norm(part.embedding_)
        assert rel < 1e-4


def test_ikd_inside_a_pipeline_before_another_step(gp):
    """IKD then a linear decoder of the true latent, fitted on the training rows: it
    predicts the latent of unseen rows as well as that of the rows it was fitted on."""
    X, Z, train, test = gp
    pipe = make_pipeline(IKD(n_components=3, random_state=0), LinearRegression())
    pipe.fit(X[train], Z[train])
    seen, unseen = pipe.score(X[train], Z[train]), pipe.score(X[test], Z[test])
    assert seen > 0.6 and unseen > seen - 0.05, (seen, unseen)


def test_dask_rows_in_dask_out_and_training_rows_stay_lazy(gp):
    X, _, train, test = gp
    Xd = da.from_array(X[train], chunks=(200, -1))
    est = IKD(n_components=3, random_state=0, tile_size=256).fit(Xd)
    assert isinstance(est.out_of_sample_, NystromMap)
    assert isinstance(est.out_of_sample_.training, da.Array)  # not a copy of the rows
    out = est.transform(da.from_array(X[test], chunks=(50, -1)))
    assert isinstance(out, da.Array) and out.chunks[0] == (50, 50, 50, 50)
    ref = IKD(n_components=3, random_state=0).fit(X[train]).transform(X[test])
    np.testing.assert_allclose(out.compute(), ref, rtol=1e-6, atol=1e-8)


def test_transform_before_fit_and_wrong_features(gp):
    X = gp[0]
    with pytest.raises(NotFittedError):
        IKD(n_components=3).transform(X[:10])
    est = IKD(n_components=3, random_state=0).fit(X[:300])
    with pytest.raises(ValueError, match="features"):
        est.transform(X[:10, :50])
