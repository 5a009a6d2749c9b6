"""Every estimator on tiny inputs, T from 3 to 40: where the eigensolver switches paths
(dense below its size threshold, Lanczos blocks wider than T) and degenerate graphs live."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from ikd_reference import align_signs, ikd_dense

from dr_dask import IKD, LSDR, GPIsomap, Isomap, LandmarkIsomap

TS = [3, 4, 5, 7, 12, 40]


def _curve(T: int, N: int = 6, seed: int = 0) -> np.ndarray:
    """T points along a smooth curve in N dimensions (slightly noisy)."""
    t = np.linspace(0.0, 2.0, T)
    rng = np.random.default_rng(seed)
    X = np.column_stack([np.sin((k + 1) * t + k) for k in range(N)])
    return X + 0.01 * rng.normal(size=X.shape)


def _check(Z: np.ndarray, T: int, M: int) -> None:
    assert Z.shape == (T, M)
    assert np.isfinite(Z).all() and np.abs(Z).max() > 0


@pytest.mark.parametrize("T", TS)
@pytest.mark.parametrize("eigen_solver", ["auto", "lanczos"])
@pytest.mark.parametrize("reference", ["min_max", "center"])
def test_full_ikd_equals_dense_algorithm1_at_every_size(T, eigen_solver, reference):
    """The tiled solver's answer is Algorithm 1's at every T, with either eigensolver path."""
    X = _curve(T)
    Z_ref, w_ref, r_ref, evr_ref = ikd_dense(X, 1, similarity="correlation",
                                             reference=reference)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # non-positive eigenvalues at T=3
        # ragged tiles at every T (2 rows; 7 at T=40, where 2 made 400 tiles per Lanczos pass)
        est = IKD(n_components=1, reference=reference, eigen_solver=eigen_solver,
                  tile_size=2 if T < 40 else 7, tol=1e-12, random_state=0).fit(X)
    np.testing.assert_allclose(est.eigenvalues_, w_ref, rtol=1e-7, atol=1e-9)
    np.testing.assert_allclose(align_signs(est.embedding_, Z_ref), Z_ref, atol=1e-6)
    assert est.reference_index_ == r_ref
    assert est.explained_variance_ratio_ == pytest.approx(evr_ref, rel=1e-7)
    if eigen_solver == "auto":  # below the threshold "auto" is one dense solve
        assert est.eigen_passes_ == 1


IKD_VARIANTS = {
    "geodesic": lambda T: {"solver": "geodesic", "n_neighbors": min(3, T - 1)},
    "blockwise": lambda T: {"solver": "blockwise"},
    "landmark": lambda T: {"n_landmarks": min(T, 6)},
    "landmark_geodesic": lambda T: {"solver": "geodesic", "n_landmarks": min(T, 6),
                                    "n_neighbors": min(3, T - 1)},
}


@pytest.mark.parametrize("T", TS)
@pytest.mark.parametrize("variant", IKD_VARIANTS)
def test_every_ikd_solver_fits_tiny_inputs_with_the_same_attributes(T, variant):
    X = _curve(T)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # tiny graphs get bridged, tiny cliques warn
        est = IKD(n_components=1, random_state=0, **IKD_VARIANTS[variant](T)).fit(X)
    _check(est.embedding_, T, 1)
    assert est.eigenvalues_.shape == (1,)
    # each solver's own fitted state, and None for what another solver's would be
    assert 0 < est.explained_variance_ratio_ <= 1 and est.sigma2_ > 0
    assert est.reference_index_ is None  # graph and landmark solvers have no reference point
    blockwise, graph = variant == "blockwise", variant in ("geodesic", "landmark_geodesic")
    if blockwise:  # per-clique solves merged one clique at a time: no one eigenproblem
        assert est.eigen_residuals_ is None and est.eigen_passes_ is None
        assert set(np.concatenate([np.asarray(c) for c in est.cliques_])) == set(range(T))
        assert len(est.merge_log_) == len(est.cliques_) - 1
        assert 0 < est.clique_threshold_ < 1
    else:
        assert est.eigen_residuals_.shape == (1,) and est.eigen_residuals_[0] >= 0
        assert est.eigen_passes_ >= 1
        assert est.cliques_ is est.merge_log_ is est.clique_threshold_ is None
    assert (est.graph_components_ >= 1) if graph else est.graph_components_ is None
    if variant.startswith("landmark"):
        L = est.landmarks_
        assert len(L) == min(T, 6) == len(set(L.tolist())) and 0 <= L.min() <= L.max() < T
    else:
        assert est.landmarks_ is None
    assert all(s >= 0 for s in est.timings_.values()) and est.timings_
    if variant == "landmark" and T <= 6:  # every point a landmark: full IKD, MDS-centred
        ref = IKD(n_components=1, reference="center", random_state=0).fit(X).embedding_
        # a landmark's own distance is f^-1(ceil) ~ 2e-5, not 0, when it is triangulated
        np.testing.assert_allclose(align_signs(est.embedding_, ref), ref, atol=1e-5)
    elif variant != "landmark" and T == 40:  # the graph solvers recover the order on the curve
        assert abs(np.corrcoef(est.embedding_[:, 0], np.arange(T))[0, 1]) > 0.95


@pytest.mark.parametrize("T", TS)
def test_isomap_and_landmark_isomap_tiny_inputs(T):
    X = _curve(T)
    k = min(4, T - 1)
    iso = Isomap(n_neighbors=k, n_components=1).fit(X)
    _check(iso.embedding_, T, 1)
    lm = LandmarkIsomap(n_neighbors=k, n_components=1, n_landmarks=min(T, 5),
                        random_state=0).fit(X)
    _check(lm.embedding_, T, 1)
    if T == 40:  # geodesic distance along the curve is recovered up to sign and shift
        for Z in (iso.embedding_, lm.embedding_):
            assert abs(np.corrcoef(Z[:, 0], np.arange(T))[0, 1]) > 0.95


@pytest.mark.parametrize("T", TS)
def test_gp_isomap_tiny_inputs(T):
    X = _curve(T, N=3)
    # a manifold needs n_neighbors + 2 points
    est = GPIsomap(n_neighbors=min(4, T - 2), n_components=1, random_state=0).fit(X)
    _check(est.embedding_, T, 1)
    Z, var, _ = est.map_points(X[:2] + 1e-3)
    assert Z.shape == (2, 1) and np.isfinite(Z).all() and np.all(var >= 0)


@pytest.mark.parametrize("T", TS)
def test_lsdr_tiny_inputs(T):
    X = _curve(T, N=2)
    est = LSDR(n_components=1, graph="knn", n_graph_neighbors=min(4, T - 1),
               n_skeleton_neighbors=1, random_state=0)
    if T == 3:  # the ends are the boundary: one skeletal point cannot span a dimension
        with pytest.raises(ValueError, match="skeleton has 1 points, too few"):
            est.fit(X)
        return
    _check(est.fit(X).embedding_, T, 1)
