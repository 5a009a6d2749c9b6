"""Conventions every estimator of the package keeps beyond scikit-learn's checks
(tests/test_sklearn_checks.py): a client parameter, refusals that need the data."""

import pickle
import warnings

import dask.array as da
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import make_swiss_roll

from dr_dask import IKD, LSDR, GPIsomap, Isomap, LandmarkIsomap
from dr_dask.io.validation import DuplicatePointsWarning

ESTIMATORS = {
    "IKD": lambda **kw: IKD(n_components=2, random_state=0, **kw),
    "Isomap": lambda **kw: Isomap(n_neighbors=8, **kw),
    "LandmarkIsomap": lambda **kw: LandmarkIsomap(n_neighbors=8, n_landmarks=40, random_state=0,
                                                  **kw),
    "LSDR": lambda **kw: LSDR(**kw),
    "GPIsomap": lambda **kw: GPIsomap(n_neighbors=8, random_state=0, **kw),
}


@pytest.fixture(scope="module")
def roll() -> np.ndarray:
    return make_swiss_roll(300, random_state=0)[0]


@pytest.mark.cluster
@pytest.mark.parametrize("name", ESTIMATORS)
def test_live_client_neither_pickled_nor_copied(name, roll, cluster_client):
    """A fitted estimator holding a client pickles (to disk, to workers) without it, maps the
    same after the round trip, and clones share the client instead of failing to copy it."""
    est = ESTIMATORS[name](client=cluster_client).fit(roll)
    assert est.client is cluster_client
    assert clone(est).client is cluster_client
    back = pickle.loads(pickle.dumps(est))
    assert back.client is None and est.client is cluster_client
    if hasattr(est, "transform"):  # IKD defines no out-of-sample map
        Xnew = roll[:20] + 0.01
        np.testing.assert_allclose(back.transform(Xnew), est.transform(Xnew), atol=1e-9)


def test_ikd_components_clamped_to_the_features_with_a_warning():
    """IKD's samples span N - 1 dimensions: more components are clamped with a warning (as
    n_landmarks is to the samples), so the defaults fit data of few features."""
    X = np.random.default_rng(0).normal(size=(50, 3))
    before = X.copy()
    with pytest.warns(UserWarning, match="n_components=5 is more than the data supports: 3 "
                      "features give at most 2 components.*uses n_components=2"):
        est = IKD(n_components=5, random_state=0).fit(X)
    assert est.embedding_.shape == (50, 2) and est.n_components == 5
    np.testing.assert_array_equal(X, before)


@pytest.mark.parametrize(("make", "X", "message"), [
    (lambda: Isomap(n_neighbors=1), np.eye(2, 3), "n_components=2 needs at least 3 samples"),
    (lambda: LSDR(n_components=3), np.random.default_rng(0).normal(size=(50, 2)),
     "n_components=3 is more than the data supports: 2 features"),
    (lambda: IKD(n_components=2, tile_size=0), np.random.default_rng(0).normal(size=(50, 4)),
     "'tile_size' parameter of IKD must be an int in the range \\[1, inf\\)"),
])
def test_more_components_than_the_data_supports(make, X, message):
    """Asked for more than the data holds, an estimator says so in fit, before any work."""
    before = X.copy()
    with pytest.raises(ValueError, match=message):
        make().fit(X)
    np.testing.assert_array_equal(X, before)


@pytest.mark.parametrize("name", [*ESTIMATORS, "IKD-geodesic", "IKD-blockwise", "IKD-dask"])
def test_one_duplicate_point_policy(name, roll):
    """Every estimator (every IKD solver, and an out-of-core input) keeps coincident points:
    one DuplicatePointsWarning naming them, and the twins get the same embedding."""
    X = roll.copy()
    X[[120, 250]] = X[7]
    solver = name.removeprefix("IKD-")
    if solver in ("geodesic", "blockwise"):
        make = lambda: IKD(n_components=2, solver=solver, random_state=0)  # noqa: E731  (a factory, as ESTIMATORS holds)
    else:
        make = ESTIMATORS[name.removesuffix("-dask")]
    data = da.from_array(X, chunks=(70, 3)) if name.endswith("-dask") else X
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        Y = make().fit_transform(data)
    duplicates = [w for w in caught if issubclass(w.category, DuplicatePointsWarning)]
    assert len(duplicates) == 1
    assert "3 points have exact duplicates (e.g. rows 7 and 120)" in str(duplicates[0].message)
    np.testing.assert_allclose(Y[[120, 250]], Y[[7, 7]], atol=1e-8)
