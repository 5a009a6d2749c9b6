"""Isomap and Landmark Isomap against scikit-learn, each other, and the cluster."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
from sklearn.base import clone
from sklearn.datasets import make_swiss_roll
from sklearn.manifold import Isomap as SkIsomap

from dr_dask.graph import DisconnectedGraphWarning, DuplicatePointsWarning
from dr_dask.linalg.align import procrustes_disparity
from dr_dask.methods.isomap import Isomap
from dr_dask.methods.landmark_isomap import LandmarkIsomap


@pytest.fixture(scope="module")
def roll2000():
    X, _ = make_swiss_roll(2000, random_state=0)
    Xnew, _ = make_swiss_roll(300, random_state=1)
    return X, Xnew


@pytest.fixture(scope="module")
def sk_fit(roll2000):
    X, _ = roll2000
    return SkIsomap(n_neighbors=10, n_components=2).fit(X)


@pytest.fixture(scope="module")
def our_fit(roll2000):
    X, _ = roll2000
    return Isomap(n_neighbors=10, n_components=2, random_state=0).fit(X)


def test_isomap_matches_sklearn(roll2000, sk_fit, our_fit):
    assert procrustes_disparity(sk_fit.embedding_, our_fit.embedding_) <= 1e-6
    np.testing.assert_allclose(our_fit.dist_matrix_, sk_fit.dist_matrix_, rtol=1e-12)
    np.testing.assert_allclose(our_fit.eigenvalues_, sk_fit.kernel_pca_.eigenvalues_, rtol=1e-8)
    np.testing.assert_allclose(our_fit.geodesic_sq_row_mean_,
                               (sk_fit.dist_matrix_**2).mean(axis=1), rtol=1e-12)
    assert our_fit.n_features_in_ == 3 and our_fit.embedding_.shape == (2000, 2)


def test_isomap_transform_matches_sklearn(roll2000, sk_fit, our_fit):
    _, Xnew = roll2000
    ref = sk_fit.transform(Xnew)
    ours = our_fit.transform(Xnew)
    assert procrustes_disparity(ref, ours) <= 1e-6
    # same axes up to sign: the 1/sqrt(lambda) scaling, not sqrt(lambda) (seed erratum)
    np.testing.assert_allclose(np.abs(ours), np.abs(ref), atol=1e-6 * np.abs(ref).max())
    lazy = our_fit.transform(da.from_array(Xnew, chunks=(100, 3)))
    assert isinstance(lazy, da.Array) and lazy.chunks[0] == (100, 100, 100)
    np.testing.assert_allclose(lazy.compute(), ours, atol=1e-10)


def test_isomap_dense_lanczos_and_store_agree(roll2000, our_fit, tmp_path):
    X, Xnew = roll2000
    X, Xnew = X[:800], Xnew[:50]
    dense = Isomap(n_neighbors=10, eigen_solver="dense").fit(X)
    lanczos = Isomap(n_neighbors=10, eigen_solver="lanczos", random_state=0).fit(X)
    stored = Isomap(n_neighbors=10, eigen_solver="lanczos", random_state=0,
                    geodesic_store=str(tmp_path / "d2.zarr"), block_size=100).fit(X)
    assert procrustes_disparity(dense.embedding_, lanczos.embedding_) < 1e-12
    np.testing.assert_allclose(stored.embedding_, lanczos.embedding_, atol=1e-8)
    assert stored.geodesic_store_.shape == (800, 800)
    np.testing.assert_allclose(stored.transform(Xnew), lanczos.transform(Xnew), atol=1e-8)
    lm = LandmarkIsomap(n_neighbors=10, n_landmarks=60, random_state=0).fit(X)
    lm_stored = LandmarkIsomap(n_neighbors=10, n_landmarks=60, random_state=0, block_size=16,
                               geodesic_store=str(tmp_path / "lx.zarr")).fit(X)
    np.testing.assert_allclose(lm_stored.embedding_, lm.embedding_, atol=1e-8)
    np.testing.assert_allclose(lm_stored.transform(Xnew), lm.transform(Xnew), atol=1e-8)
    # without a dense matrix or a store, transform runs Dijkstra from the neighbours
    lanczos.dist_matrix_ = None
    np.testing.assert_allclose(lanczos.transform(Xnew), dense.transform(Xnew), atol=1e-8)


def test_isomap_float32_rows_above_dense_size(roll2000, dr_config):
    """Above dr_dask.isomap.dist-matrix-max the squared geodesics stay on the workers in
    float32: the embedding still matches the float64 one closely and the eigensolver converges."""

    X = roll2000[0][:600]
    ref = Isomap(n_neighbors=10, eigen_solver="lanczos", random_state=0).fit(X)
    dr_config({"isomap.dist-matrix-max": 500})
    f32 = Isomap(n_neighbors=10, eigen_solver="lanczos", random_state=0).fit(X)
    assert f32.dist_matrix_ is None and ref.dist_matrix_ is not None
    assert procrustes_disparity(ref.embedding_, f32.embedding_) < 1e-9
    np.testing.assert_allclose(f32.eigenvalues_, ref.eigenvalues_, rtol=1e-6)
    assert np.all(f32.eigen_residuals_ < 1e-6)


def test_isomap_epsilon_rule_matches_sklearn(roll2000):
    X, Xnew = roll2000
    X = X[:1000]
    ref = SkIsomap(n_neighbors=None, radius=3.0).fit(X)
    ours = Isomap(n_neighbors=None, radius=3.0).fit(X)
    assert procrustes_disparity(ref.embedding_, ours.embedding_) <= 1e-6
    assert procrustes_disparity(ref.transform(Xnew[:40]), ours.transform(Xnew[:40])) <= 1e-6


def test_landmark_isomap_close_to_full_isomap():
    X, _ = make_swiss_roll(5000, random_state=0)
    Xnew, _ = make_swiss_roll(200, random_state=2)
    full = Isomap(n_neighbors=10, random_state=0).fit(X)
    lm = LandmarkIsomap(n_neighbors=10, n_landmarks=500, random_state=0).fit(X)
    assert procrustes_disparity(full.embedding_, lm.embedding_) <= 1e-2
    # landmarks are placed exactly at their MDS coordinates
    np.testing.assert_allclose(lm.embedding_[lm.landmarks_], lm.landmark_embedding_, atol=1e-8)
    assert lm.landmark_geodesics_.shape == (500, 5000)
    assert lm.landmark_geodesics_.dtype == np.float32
    assert procrustes_disparity(full.transform(Xnew), lm.transform(Xnew)) <= 1e-2
    # transform of training points reproduces their embedding
    sub = lm.transform(X[:100])
    assert procrustes_disparity(lm.embedding_[:100], sub) < 1e-3
    lazy = lm.transform(da.from_array(Xnew, chunks=(64, 3)))
    np.testing.assert_allclose(lazy.compute(), lm.transform(Xnew), atol=1e-10)
    assert set(lm.timings_) >= {"graph", "landmarks", "shortest_paths", "triangulation"}


@pytest.mark.cluster
def test_cluster_equals_threaded(cluster_client, roll2000, dr_config):

    X, Xnew = roll2000
    X = X[:1200]
    # as for T > 10,000: float32 D2 row blocks stay on the workers (in this process for a),
    # Lanczos products run there, and transform runs Dijkstra from the new points' neighbours
    # on the cluster
    dr_config({"isomap.dist-matrix-max": 500})
    a = Isomap(n_neighbors=8, eigen_solver="lanczos", random_state=0).fit(X)
    b = Isomap(n_neighbors=8, eigen_solver="lanczos", random_state=0,
               client=cluster_client).fit(X)
    assert b.dist_matrix_ is None
    np.testing.assert_allclose(b.embedding_, a.embedding_, atol=1e-8)
    np.testing.assert_allclose(b.transform(Xnew), a.transform(Xnew), atol=1e-8)
    lazy = b.transform(da.from_array(Xnew, chunks=(100, 3)))
    np.testing.assert_allclose(cluster_client.compute(lazy).result(), a.transform(Xnew),
                               atol=1e-8)
    la = LandmarkIsomap(n_neighbors=8, n_landmarks=100, random_state=0).fit(X)
    lb = LandmarkIsomap(n_neighbors=8, n_landmarks=100, random_state=0,
                        client=cluster_client).fit(X)
    np.testing.assert_array_equal(la.landmarks_, lb.landmarks_)
    np.testing.assert_allclose(lb.embedding_, la.embedding_, atol=1e-6)


def test_landmarks_beyond_the_samples_are_clamped_with_a_warning(roll2000):
    """n_landmarks above T uses every sample (as scikit-learn's Nystroem clamps n_components):
    the same fit as n_landmarks=T, and a warning that says so."""
    X = roll2000[0][:120]
    with pytest.warns(UserWarning, match="n_landmarks=500 is more than the 120 samples of X: "
                      "LandmarkIsomap uses n_landmarks=120"):
        clamped = LandmarkIsomap(random_state=0).fit(X)  # the default, 500
    every = LandmarkIsomap(n_landmarks=120, random_state=0).fit(X)
    np.testing.assert_array_equal(clamped.landmarks_, every.landmarks_)
    np.testing.assert_allclose(clamped.embedding_, every.embedding_, atol=1e-10)


def test_bad_inputs(roll2000):
    X, _ = roll2000
    X = X[:300]
    with pytest.raises(ValueError, match=r"n_neighbors=300 must be in \[1, 299\]"):
        Isomap(n_neighbors=300).fit(X)
    with pytest.raises(ValueError, match="Both n_neighbors and radius are provided"):
        Isomap(n_neighbors=5, radius=1.0).fit(X)
    with pytest.raises(ValueError, match="n_components=5 needs at least 6 landmarks"):
        LandmarkIsomap(n_landmarks=5, n_components=5).fit(X)
    with pytest.raises(ValueError, match=r"n_components=2 needs at least 3 samples .* got 2"):
        Isomap(n_neighbors=1).fit(X[:2])
    with pytest.raises(ValueError, match=r"Found array with 1 sample\(s\)"):
        Isomap().fit(X[:1])
    bad = X.copy()
    bad[17, 1] = np.nan
    match = r"Input X contains NaN\. Non-finite values in 1 row\(s\): 17"
    with pytest.raises(ValueError, match=match):
        Isomap().fit(bad)
    fitted = Isomap(n_neighbors=8).fit(X)
    with pytest.raises(ValueError, match="X has 4 features, but Isomap is expecting 3 features"):
        fitted.transform(np.zeros((2, 4)))
    with pytest.raises(ValueError, match="X has 4 features, but Isomap is expecting 3 features"):
        fitted.transform(da.zeros((2, 4)))
    with pytest.raises(Exception, match="not fitted"):
        Isomap().transform(X)


def test_duplicates_and_disconnected_graphs():
    rng = np.random.RandomState(0)
    X = rng.uniform(size=(200, 3))
    X[50] = X[51]
    with pytest.warns(DuplicatePointsWarning):
        m = Isomap(n_neighbors=6).fit(X)
    np.testing.assert_allclose(m.embedding_[50], m.embedding_[51], atol=1e-9)
    blobs = np.vstack([rng.normal(size=(80, 3)), rng.normal(size=(40, 3)) + 30])
    with pytest.raises(ValueError, match=r"2 connected components of sizes \[80, 40\]"):
        Isomap(n_neighbors=5, on_disconnected="raise").fit(blobs)
    with pytest.warns(DisconnectedGraphWarning, match=r"sizes \[80, 40\]"):
        emb = Isomap(n_neighbors=5).fit_transform(blobs)
    assert np.isfinite(emb).all()
    with pytest.raises(ValueError, match="disconnected"):
        Isomap(n_neighbors=5, on_disconnected="ignore").fit(blobs)
    with pytest.warns(DisconnectedGraphWarning):
        LandmarkIsomap(n_neighbors=5, n_landmarks=30).fit(blobs)


def test_estimator_api():
    m = Isomap(n_neighbors=7, random_state=3)
    c = clone(m)
    assert c.get_params() == m.get_params()
    X, _ = make_swiss_roll(300, random_state=0)
    assert m.fit(X) is m
    lm = LandmarkIsomap(n_landmarks=50, random_state=0)
    assert lm.fit(da.from_array(X, chunks=100)) is lm
    assert isinstance(lm.embedding_, np.ndarray) and lm.embedding_.shape == (300, 2)


def test_scikit_learn_parameters_beyond_its_test_file(roll2000, tmp_path, dr_config):
    """What scikit-learn's own test file does not reach: a metric the partitioned search cannot
    honour is refused by name; LandmarkIsomap takes the same parameters and inputs; the
    reconstruction error from a geodesic store equals the in-memory one."""
    import scipy.sparse as sp
    from sklearn.neighbors import KNeighborsTransformer

    X, Xnew = roll2000[0][:300], roll2000[1][:20]
    with pytest.raises(ValueError, match=r"metric='manhattan'.*Euclidean distances only"):
        Isomap(metric="manhattan", knn="ivf").fit(X)
    dr_config({"knn.ivf-min-rows": 100, "knn.kd-tree-max-dim": 2})
    with pytest.raises(ValueError, match=r"callable .*knn='auto'"):
        Isomap(metric=lambda a, b: np.abs(a - b).sum(), knn="auto").fit(X)
    dr_config({"knn.ivf-min-rows": 10**9, "knn.kd-tree-max-dim": 15})

    # LandmarkIsomap: a non-Euclidean metric as scikit-learn's NearestNeighbors measures it,
    # the radius rule, CSR, float32 and precomputed graphs give the dense float64 result
    kw = dict(n_landmarks=40, landmark_method="random", random_state=0)
    manhattan = LandmarkIsomap(n_neighbors=10, metric="minkowski", p=1, **kw).fit(X)
    ref = LandmarkIsomap(n_neighbors=10, metric="cityblock", **kw).fit(X)
    np.testing.assert_allclose(manhattan.embedding_, ref.embedding_, atol=1e-8)
    euclid = LandmarkIsomap(n_neighbors=10, **kw).fit(X)
    assert procrustes_disparity(manhattan.embedding_, euclid.embedding_) > 1e-4
    f32 = LandmarkIsomap(n_neighbors=10, **kw).fit(X.astype(np.float32))
    assert f32.embedding_.dtype == np.float32 and f32.transform(Xnew).dtype == np.float32
    np.testing.assert_allclose(f32.embedding_, euclid.embedding_, atol=1e-3)
    csr = LandmarkIsomap(n_neighbors=10, **kw).fit(sp.csr_matrix(X))
    np.testing.assert_allclose(csr.embedding_, euclid.embedding_, atol=1e-8)
    np.testing.assert_allclose(csr.transform(sp.csr_matrix(Xnew)), euclid.transform(Xnew),
                               atol=1e-8)
    graph = KNeighborsTransformer(n_neighbors=10, mode="distance").fit_transform(X)
    pre = LandmarkIsomap(n_neighbors=10, metric="precomputed", **kw).fit(graph)
    np.testing.assert_allclose(pre.embedding_, euclid.embedding_, atol=1e-8)
    radius = LandmarkIsomap(n_neighbors=None, radius=4.0, **kw).fit(X)
    assert radius.nbrs_.radius == 4.0 and radius.knn_recall_ is None

    # the reconstruction error read from a store equals the in-memory one; Lanczos ("arpack")
    # equals dense
    dense = Isomap(n_neighbors=10, eigen_solver="dense").fit(X)
    stored = Isomap(n_neighbors=10, eigen_solver="arpack", tol=0, random_state=0,
                    geodesic_store=str(tmp_path / "d2.zarr")).fit(X)
    assert np.isclose(stored.reconstruction_error(), dense.reconstruction_error(), rtol=1e-8)
    sk = SkIsomap(n_neighbors=10).fit(X)
    assert np.isclose(dense.reconstruction_error(), sk.reconstruction_error(), rtol=1e-8)
    np.testing.assert_allclose(dense.kernel_pca_.transform(-0.5 * dense.dist_matrix_[:5] ** 2),
                               dense.embedding_[:5], atol=1e-8)
