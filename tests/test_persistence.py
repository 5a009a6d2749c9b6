"""Fitted estimators saved and loaded: the same transform in a fresh process, bit for bit; a
file of another format version refused by name; a GP-Isomap model O(n k), not O(n^2)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import dr_dask
from dr_dask import IKD, LSDR, GPIsomap, Isomap, LandmarkIsomap, ModelFormatError
from dr_dask.methods import persistence


def _roll(n: int, seed: int) -> np.ndarray:
    rng = np.random.RandomState(seed)
    t = 1.5 * np.pi * (1 + 2 * rng.rand(n))
    return np.c_[t * np.cos(t), 21 * rng.rand(n), t * np.sin(t)]


ESTIMATORS = {
    "IKD": lambda: IKD(n_components=2, random_state=0),
    "IKD-geodesic": lambda: IKD(n_components=2, solver="geodesic", n_neighbors=8,
                                random_state=0),
    "IKD-landmarks": lambda: IKD(n_components=2, n_landmarks=40, random_state=0),
    "Isomap": lambda: Isomap(n_neighbors=8, n_components=2),
    "LandmarkIsomap": lambda: LandmarkIsomap(n_neighbors=8, n_components=2, n_landmarks=40,
                                             random_state=0),
    "LSDR": lambda: LSDR(n_components=2, random_state=0),
}
#: GP-Isomap at the size whose model must stay small: 2,000 rows.
GP_ROWS = 2000


def _transform(est, Xq) -> np.ndarray:
    if isinstance(est, GPIsomap):
        emb, var = est.transform(Xq, return_variance=True)
        return np.column_stack([np.asarray(emb), np.asarray(var)])
    return np.asarray(est.transform(Xq))


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every estimator fitted, its transform of new rows, and its saved model; then one fresh
    Python process loads every model and maps the same rows."""
    d = tmp_path_factory.mktemp("models")
    X, Xq = _roll(300, 0), _roll(50, 1)
    np.save(d / "query.npy", Xq)
    before = {}
    for name, make in ESTIMATORS.items():
        est = make().fit(X)
        before[name] = _transform(est, Xq)
        est.save(d / f"{name}.model")
    gp = GPIsomap(n_components=2, random_state=0).fit(_roll(GP_ROWS, 2))
    # a fitted model holds no manifold's n x n geodesics until it maps a point
    held = [i for i, m in enumerate(gp.manifolds_) if "geodesics" in vars(m)]
    before["GPIsomap"] = _transform(gp, Xq)
    gp.save(d / "GPIsomap.model")
    script = textwrap.dedent(f"""
        import numpy as np, dr_dask
        from dr_dask import GPIsomap
        Xq = np.load({str(d / "query.npy")!r})
        for name in {[*ESTIMATORS, "GPIsomap"]!r}:
            est = dr_dask.load({str(d)!r} + "/" + name + ".model")
            if isinstance(est, GPIsomap):
                emb, var = est.transform(Xq, return_variance=True)
                out = np.column_stack([np.asarray(emb), np.asarray(var)])
            else:
                out = np.asarray(est.transform(Xq))
            np.save({str(d)!r} + "/" + name + ".after.npy", out)
    """)
    subprocess.run([sys.executable, "-c", script], check=True, timeout=600)
    after = {name: np.load(d / f"{name}.after.npy") for name in before}
    return d, before, after, gp, held


@pytest.mark.parametrize("name", [*ESTIMATORS, "GPIsomap"])
def test_transform_after_load_in_a_fresh_process_is_bit_identical(saved, name):
    _, before, after, _, _ = saved
    assert after[name].shape == before[name].shape
    np.testing.assert_array_equal(after[name], before[name])


def test_gp_isomap_model_of_2000_rows_is_small(saved):
    d, _, _, gp, held = saved
    # without the manifolds' n x n geodesics (32 MB of float64 at 2,000 rows)
    assert (d / "GPIsomap.model").stat().st_size <= 3 * 2**20
    assert len(pickle.dumps(gp)) <= 3 * 2**20
    assert held == []


def test_another_format_version_is_refused_by_name(saved, tmp_path):
    d, *_ = saved
    data = (d / "Isomap.model").read_bytes()
    head, rest = data.split(b"\n", 1)
    header, payload = rest.split(b"\n", 1)
    meta = json.loads(header)
    meta["format_version"] = persistence.FORMAT_VERSION + 1
    old = tmp_path / "future.model"
    old.write_bytes(head + b"\n" + json.dumps(meta).encode() + b"\n" + payload)
    with pytest.raises(ModelFormatError,
                       match=rf"format version {persistence.FORMAT_VERSION + 1}.*reads version "
                             rf"{persistence.FORMAT_VERSION} only"):
        dr_dask.load(old)


def test_a_file_that_is_not_a_model_is_refused(tmp_path):
    bad = tmp_path / "x.model"
    bad.write_bytes(pickle.dumps(np.zeros(3)))  # a pickle, but not a saved model
    with pytest.raises(ModelFormatError, match="not a dr_dask model"):
        dr_dask.load(bad)


def test_truncated_model_is_refused(saved, tmp_path):
    d, *_ = saved
    cut = tmp_path / "cut.model"
    data = (d / "IKD.model").read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFormatError, match="could not be read"):
        dr_dask.load(cut)


def test_save_before_fit_is_refused(tmp_path):
    from sklearn.exceptions import NotFittedError

    with pytest.raises(NotFittedError):
        Isomap().save(tmp_path / "m.model")
    assert not (tmp_path / "m.model").exists()


def test_save_and_load_through_s3(s3_bucket):
    X, Xq = _roll(200, 0), _roll(20, 1)
    est = Isomap(n_neighbors=8, n_components=2).fit(X)
    url = f"s3://{s3_bucket}/models/iso.model"
    est.save(url)
    np.testing.assert_array_equal(dr_dask.load(url).transform(Xq), est.transform(Xq))


@pytest.mark.cluster
@pytest.mark.parametrize("name", ["IKD-geodesic", "LandmarkIsomap"])
def test_a_model_fitted_on_a_cluster_saves_and_maps_the_same_without_it(name, cluster_client,
                                                                         tmp_path):
    """Fitted on the multi-process cluster, saved without its client, loaded in this process
    with none: the same transform, and the loaded model holds no client."""
    X, Xq = _roll(300, 0), _roll(50, 1)
    est = ESTIMATORS[name]().set_params(client=cluster_client).fit(X)
    before = _transform(est, Xq)
    est.save(tmp_path / "m.model")
    loaded = dr_dask.load(tmp_path / "m.model")
    assert loaded.get_params()["client"] is None
    np.testing.assert_array_equal(_transform(loaded, Xq), before)
