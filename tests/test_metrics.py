"""Metrics: sklearn agreement, blockwise == in-memory (threads and cluster), TI properties."""

import numpy as np
import pytest
from scipy.linalg import expm
from scipy.optimize import minimize
from sklearn.decomposition import PCA
from sklearn.manifold import trustworthiness as sk_trustworthiness

from dr_dask import metrics


@pytest.fixture(scope="module")
def xy():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(240, 6))
    Y = X[:, :2] + 0.3 * rng.normal(size=(240, 2))
    return X, Y


def test_r2_affine_and_knn_accuracy():
    rng = np.random.default_rng(1)
    Z = rng.normal(size=(150, 2))
    E = Z @ rng.normal(size=(2, 3)) + 4.0
    assert metrics.r2_affine(Z, E) == pytest.approx(1.0)
    assert metrics.r2_affine(Z, rng.normal(size=(150, 3))) < 0.2
    labels = (Z[:, 0] > 0).astype(int)
    assert metrics.knn_accuracy(Z, labels) > 0.9
    with pytest.raises(ValueError, match="labels has 149 entries"):
        metrics.knn_accuracy(Z, labels[:-1])


@pytest.mark.parametrize("k", [1, 5, 12])
def test_trustworthiness_matches_sklearn(xy, k):
    X, Y = xy
    expected = sk_trustworthiness(X, Y, n_neighbors=k)
    assert metrics.trustworthiness(X, Y, k) == pytest.approx(expected, abs=1e-12)
    # continuity is trustworthiness with the spaces swapped
    assert metrics.continuity(X, Y, k) == pytest.approx(sk_trustworthiness(Y, X, n_neighbors=k),
                                                        abs=1e-12)


def test_blockwise_equals_in_memory(xy):
    import dask.array as da

    X, Y = xy
    whole = metrics.neighbourhood_scores(X, Y, 7, block_rows=len(X))
    blocks = metrics.neighbourhood_scores(da.from_array(X, chunks=50), Y, 7, block_rows=33)
    assert blocks == pytest.approx(whole, rel=1e-12)
    # stress: explicit pairwise check
    from scipy.spatial.distance import pdist

    dx, dy = pdist(X), pdist(Y)
    c = dx @ dy / (dy @ dy)
    assert whole["stress"] == pytest.approx(np.sqrt(((dx - c * dy) ** 2).sum() / (dx @ dx)))
    assert whole["raw_stress"] == pytest.approx(np.sqrt(((dx - dy) ** 2).sum()))


@pytest.mark.cluster
def test_blockwise_on_cluster(xy, cluster_client):
    X, Y = xy
    local = metrics.neighbourhood_scores(X, Y, 5, block_rows=len(X))
    dist = metrics.neighbourhood_scores(X, Y, 5, block_rows=40, client=cluster_client)
    assert dist == pytest.approx(local, rel=1e-12)
    assert dist["trustworthiness"] == pytest.approx(sk_trustworthiness(X, Y, n_neighbors=5))


def test_neighbourhood_validation(xy):
    X, Y = xy
    with pytest.raises(ValueError, match="k < T/2"):
        metrics.trustworthiness(X, Y, 120)
    with pytest.raises(ValueError, match="240 rows but Y"):
        metrics.trustworthiness(X, Y[:-1], 5)


def test_isometry_is_perfect(xy):
    X, _ = xy
    R = np.linalg.qr(np.random.default_rng(2).normal(size=(6, 6)))[0]
    s = metrics.neighbourhood_scores(X, 3.0 * X @ R + 1.0, 5)
    assert s["trustworthiness"] == pytest.approx(1.0)
    assert s["continuity"] == pytest.approx(1.0)
    assert s["knn_preservation"] == pytest.approx(1.0)
    assert s["stress"] == pytest.approx(0.0, abs=1e-6)


@pytest.fixture(scope="module")
def ti_data():
    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 3)) * [3.0, 2.0, 0.5] + 7.0
    Y = np.tanh(X - 7.0) + 0.1 * rng.normal(size=X.shape)
    return X, Y


def test_ti_of_pca_is_zero(ti_data):
    import dask.array as da

    X, _ = ti_data
    Y = PCA(3).fit_transform(X)
    assert abs(metrics.trustability_index(da.from_array(X, chunks=37), Y)["ti"]) < 1e-8


def test_ti_closed_form_equals_explicit_optimisation(ti_data):
    X, Y = ti_data
    ti = metrics.trustability_index(X, Y)["ti"]
    Xc, Yc = X - X.mean(0), Y - Y.mean(0)

    def residual(theta, flip):
        S = np.zeros((3, 3))
        S[np.triu_indices(3, 1)] = theta[:3]
        P = expm(S - S.T) @ flip  # orthogonal, with or without a reflection
        return ((Yc - theta[3] * Xc @ P) ** 2).sum()  # optimal mu is the mean difference

    best = min(
        minimize(residual, np.r_[start, 0.3], args=(np.diag([1, 1, sign]),), method="BFGS",
                 options=dict(gtol=1e-10)).fun
        for sign in (1, -1) for start in np.random.default_rng(4).normal(size=(3, 3))
    )
    assert ti == pytest.approx(best, rel=1e-6)
    assert ti <= best + 1e-9
    assert ti == pytest.approx(metrics.procrustes_residual(Y, X), rel=1e-10)


def test_ti_scales_with_square_of_output_scale(ti_data):
    X, Y = ti_data
    base = metrics.trustability_index(X, Y)
    scaled = metrics.trustability_index(X, 10.0 * Y)
    assert scaled["ti"] == pytest.approx(100.0 * base["ti"], rel=1e-10)
    assert scaled["gower"] == pytest.approx(base["gower"], rel=1e-10)  # the scale-free variant
    with pytest.raises(ValueError, match="n_components=3"):
        metrics.trustability_index(X, Y[:, :2])


def test_reconstruction_residuals_uncorrelated_with_embedding(ti_data):
    X, _ = ti_data
    Y = PCA(1).fit_transform(X)
    R = X - metrics.kernel_reconstruction(X, Y)
    cov = (Y - Y.mean(0)).T @ (R - R.mean(0)) / len(X)
    assert np.abs(cov).max() < 1e-8


@pytest.mark.cluster
def test_tci_exhaustive_sampled_and_cluster(ti_data, cluster_client):
    X = ti_data[0][:30]
    full = metrics.consistency_index(PCA(2), X, method="exhaustive")
    assert full["n_candidates"] == 90 and not full["lower_bound"]
    sampled = metrics.consistency_index(PCA(2), X, method="sampled", n_candidates=20,
                                        random_state=0)
    assert sampled["lower_bound"] and sampled["tci"] <= full["tci"] + 1e-9
    again = metrics.consistency_index(PCA(2), X, method="sampled", n_candidates=20,
                                      random_state=0, client=cluster_client)
    assert again["tci"] == pytest.approx(sampled["tci"]) and again["argmax"] == sampled["argmax"]


def test_silhouette_and_latent_correlation():
    rng = np.random.default_rng(5)
    labels = np.repeat([0, 1], 100)
    E = rng.normal(size=(200, 2)) + 6.0 * labels[:, None]
    assert metrics.silhouette(E, labels) > 0.6
    assert metrics.silhouette(E, labels, max_samples=50, random_state=0) > 0.5
    z = rng.uniform(size=200)
    assert metrics.latent_correlation(z, np.c_[rng.normal(size=200), np.exp(z)]) == pytest.approx(1)
