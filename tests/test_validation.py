"""One validation module: scikit-learn's checks for in-memory input, the store boundary for
stored input, declarative parameter constraints with scikit-learn's wording."""

import os
from numbers import Integral, Real
from typing import ClassVar

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from sklearn.base import BaseEstimator

from dr_dask.io import validation
from dr_dask.io.inputs import InputError, open_dataset
from dr_dask.io.validation import (
    DuplicatePointsWarning,
    Interval,
    Options,
    ParameterError,
    check_array_like,
    check_input,
    check_params,
    check_values,
    first_equal_rows,
    positive,
)


class _Est(BaseEstimator):
    _parameter_constraints: ClassVar[dict] = {
        "k": [positive(Integral)],
        "alpha": [Interval(Real, 0, 1, closed="neither")],
        "mode": [Options({"a", "b"}), None],
        "random_state": ["random_state"],
        "client": "no_validation",
    }

    def __init__(self, k=3, alpha=0.5, mode="a", random_state=None, client=None):
        self.k, self.alpha, self.mode = k, alpha, mode
        self.random_state, self.client = random_state, client


X = np.random.default_rng(0).normal(size=(20, 3))


@pytest.mark.parametrize("source", ["npy", "zarr", "dask", "zarr_array"])
def test_every_input_kind_sets_and_checks_n_features(tmp_path, source):
    """Paths, zarr, dask and NumPy all record n_features_in_ and are checked against it."""
    if source == "npy":
        np.save(tmp_path / "x.npy", X)
        src = str(tmp_path / "x.npy")
    elif source == "zarr":
        zarr.save_array(str(tmp_path / "x.zarr"), X)
        src = str(tmp_path / "x.zarr")
    elif source == "dask":
        src = da.from_array(X, chunks=(7, 3))
    else:
        src = zarr.array(X)
    est = _Est()
    lazy = check_input(est, src, reset=True)
    assert est.n_features_in_ == 3 and lazy.values is None and lazy.data.shape == (20, 3)
    whole = check_input(est, src, reset=False, in_memory=True)
    np.testing.assert_array_equal(whole.values, X)
    with pytest.raises(ValueError, match="X has 2 features, but _Est is expecting 3 features"):
        check_input(est, X[:, :2], reset=False)
    with pytest.raises(ValueError, match="X has 2 features, but _Est is expecting 3 features"):
        check_input(est, da.from_array(X[:, :2]), reset=False)


@pytest.mark.parametrize(("bad", "error", "message"), [
    (X + 1j, ValueError, "Complex data not supported"),
    (np.where(np.eye(20, 3) > 0, np.nan, X), ValueError, "Input X contains NaN"),
    (X[0], ValueError, "Reshape your data"),
    (np.zeros((0, 3)), ValueError, r"0 sample\(s\)"),
    (sp.csr_matrix(X), TypeError, "dense data is required"),
])
def test_in_memory_input_refused_in_scikit_learns_words(bad, error, message):
    est = _Est()
    with pytest.raises(error, match=message):
        check_input(est, bad, reset=True)
    assert not hasattr(est, "n_features_in_")


def test_stored_input_read_whole_is_checked_like_in_memory(tmp_path):
    bad = X.copy()
    bad[4, 1] = np.inf
    np.save(tmp_path / "bad.npy", bad)
    with pytest.raises(ValueError, match="Input X contains infinity"):
        check_input(_Est(), str(tmp_path / "bad.npy"), reset=True, in_memory=True)
    with pytest.raises(InputError, match="does not exist"):
        check_input(_Est(), str(tmp_path / "missing.zarr"), reset=True)
    np.save(tmp_path / "c.npy", X + 1j)
    with pytest.raises(InputError, match="must be numeric"):
        check_input(_Est(), str(tmp_path / "c.npy"), reset=True)


@pytest.mark.parametrize("make", [np.asarray, da.from_array])
def test_too_few_samples_or_features_in_scikit_learns_words(make):
    with pytest.raises(ValueError, match=r"Found array with 2 sample\(s\) \(shape=\(2, 3\)\) "
                                         "while a minimum of 3 is required by _Est"):
        check_input(_Est(), make(X[:2]), reset=True, min_samples=3)
    with pytest.raises(ValueError, match=r"Found array with 3 feature\(s\) .* minimum of 4"):
        check_input(_Est(), make(X), reset=True, min_features=4)


def test_float32_kept_ints_converted():
    est = _Est()
    assert check_input(est, X.astype(np.float32), reset=True).values.dtype == np.float32
    assert check_input(est, [[1, 2], [3, 4]], reset=True).values.dtype == np.float64
    assert check_input(est, X.astype(np.float32), reset=True,
                       dtype=np.float64).values.dtype == np.float64


@pytest.mark.parametrize(("params", "message"), [
    ({"k": 0}, r"The 'k' parameter of _Est must be an int in the range \[1, inf\). Got 0"),
    ({"k": 2.0}, "The 'k' parameter of _Est must be an int"),
    ({"k": True}, "The 'k' parameter of _Est must be an int"),
    ({"alpha": 1}, r"The 'alpha' parameter of _Est must be a float in the range \(0, 1\). Got 1"),
    ({"alpha": float("nan")}, "The 'alpha' parameter"),
    ({"mode": "c"}, (r"The 'mode' parameter of _Est must be a str among \{'a', 'b'\} or None\. "
                    r"Got 'c' instead\.")),
    ({"mode": []}, "The 'mode' parameter"),
    ({"random_state": -1}, "The 'random_state' parameter of _Est must be an int in the range"),
])
def test_parameter_constraints(params, message):
    with pytest.raises(ParameterError, match=message):
        check_params(_Est(**params))


def test_valid_parameters_pass():
    for params in ({}, {"mode": None}, {"alpha": 0.999}, {"k": np.int64(4)},
                   {"random_state": np.random.RandomState(0)}, {"client": object()}):
        check_params(_Est(**params))


@pytest.mark.parametrize(("key", "value", "expected"), [
    ("graph.paths-graph-share", "lots", "a non-negative number"),
    ("graph.paths-graph-share", float("nan"), "a non-negative number"),
    ("knn.max-probe", 2.5, "a non-negative integer"),
    ("knn.max-probe", -1, "a non-negative integer"),
    ("tiles.memory-bytes", "much", "a size"),
    ("cluster.settle-timeout", "soon", "a duration"),
])
def test_a_bad_knob_fails_the_fit_before_any_work_naming_it(key, value, expected):
    from dr_dask import Isomap

    with dask.config.set({f"dr_dask.{key}": value}):
        with pytest.raises(ValueError, match=f"dr_dask.{key} = .*{expected}"):
            Isomap(n_neighbors=3).fit(X)


def test_a_bad_knob_from_the_environment_exits_2_naming_it(tmp_path):
    import sys

    import _spawn

    env = {**os.environ, "DASK_DR_DASK__GRAPH__PATHS_GRAPH_SHARE": "lots"}
    out = _spawn.run([sys.executable, "-m", "dr_dask.cli", "evaluate",
                      str(tmp_path / "absent.zarr")], env=env, capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert "dr_dask.graph.paths-graph-share = 'lots'" in out.stderr
    assert "Traceback" not in out.stderr


def test_check_array_like_names_the_argument():
    with pytest.raises(ValueError, match="Input latent contains NaN"):
        check_array_like(np.array([[1.0, np.nan]]), "latent")
    np.testing.assert_array_equal(check_array_like(da.from_array(X), "X"), X)
    assert check_array_like([1, 2, 3], "labels", ensure_2d=False).shape == (3,)


def test_functions_check_user_arrays_in_the_same_words():
    """kNN and the metrics validate their in-memory arguments through this module."""
    from dr_dask.graph.knn import kneighbors
    from dr_dask.metrics import r2_affine

    latent = X[:, :2].copy()
    latent[5, 0] = np.nan
    with pytest.raises(ValueError, match="Input latent contains NaN"):
        r2_affine(latent, X)
    with pytest.raises(ValueError, match="Complex data not supported"):
        kneighbors(X + 1j, 3)
    with pytest.raises(ValueError, match="Reshape your data"):
        kneighbors(X, 3, query=X[0])


@pytest.mark.cluster
def test_stored_input_is_read_and_checked_on_the_estimators_cluster(tmp_path, cluster_client):
    """A Zarr path given to an estimator on a multi-process cluster: read there, checked the
    same way (a NaN row named by the store boundary, n_features_in_ set), same values."""
    path = str(tmp_path / "x.zarr")
    zarr.save_array(path, X)
    est = _Est(client=cluster_client)
    inp = check_input(est, path, reset=True, in_memory=True)
    assert est.n_features_in_ == 3
    np.testing.assert_array_equal(inp.values, X)
    bad = X.copy()
    bad[4, 1] = np.nan
    zarr.save_array(str(tmp_path / "bad.zarr"), bad)
    with pytest.raises(ValueError, match=r"contains NaN\. Non-finite values in 1 row\(s\): 4\."):
        check_input(_Est(client=cluster_client), str(tmp_path / "bad.zarr"), reset=True,
                    in_memory=True)
    with pytest.raises(ValueError, match="X has 2 features"):
        check_input(est, X[:, :2], reset=False)


@pytest.mark.cluster
@pytest.mark.parametrize("bucket_rows", [validation.DUPLICATE_BUCKET_ROWS, 50])
def test_duplicate_rows_found_in_one_pass_over_stored_data(tmp_path, monkeypatch, bucket_rows,
                                                           cluster_client):
    """check_values names repeated rows of an out-of-core input by their fingerprints: equal
    values (0.0 and -0.0 too) across chunks warn once, rows that differ in one bit do not;
    the same when the fingerprints are searched in several buckets (no task holds all)."""
    monkeypatch.setattr(validation, "DUPLICATE_BUCKET_ROWS", bucket_rows)
    X = np.random.default_rng(0).normal(size=(300, 7))
    X[0, 3] = 0.0
    X[250] = X[0]
    X[250, 3] = -0.0  # equal value, other bits
    X[40] = X[41]
    X[40, 6] = np.nextafter(X[41, 6], 1.0)  # one ulp apart: distinct
    X[[130, 290]] = X[10]  # three equal rows in three chunks
    zarr.create_array(str(tmp_path / "x.zarr"), data=X, chunks=(64, 7))
    inp = open_dataset(str(tmp_path / "x.zarr"))
    with pytest.warns(DuplicatePointsWarning, match=r"^5 points have exact duplicates \(e.g. "
                      r"rows 10 and 130\)"):
        check_values(inp)
    with pytest.warns(DuplicatePointsWarning, match=r"^5 points .* rows 10 and 130"):
        check_values(inp, client=cluster_client)  # the buckets searched on the workers
    np.testing.assert_array_equal(first_equal_rows(X)[[0, 40, 250, 130, 290]], [0, 40, 0, 10, 10])
