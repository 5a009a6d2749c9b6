"""LSDR: latent recovery on the thesis's spiral and a swiss roll, out-of-sample map, bad input."""

import numpy as np
import pytest
from scipy.stats import spearmanr

from dr_dask.datasets.toy import noisy_spiral, noisy_swiss_roll
from dr_dask.io.validation import DuplicatePointsWarning
from dr_dask.methods._lsdr_prune import prune_edges
from dr_dask.methods.lsdr import LSDR


def best_rho(E, z):
    return max(abs(spearmanr(E[:, j], z)[0]) for j in range(E.shape[1]))


@pytest.mark.parametrize("removal", ["in_place", "sweep"])
def test_spiral_recovers_angle(removal):
    X, theta = noisy_spiral(800)
    model = LSDR(n_components=1, removal=removal, random_state=0).fit(X)
    assert best_rho(model.embedding_, theta) >= 0.99
    # the default out-of-sample map (step 6) is the smoothing itself: no separate stage
    assert set(model.timings_) == {"graph", "boundary", "shortest_paths", "mds", "smoothing"}
    assert all(s >= 0 for s in model.timings_.values())
    # the graph keeps its spanning tree, so it is connected, and pruning removed cross-arm edges
    from scipy.sparse.csgraph import connected_components

    assert connected_components(model.graph_, directed=False)[0] == 1
    assert len(model.removed_edges_) > 0 and len(model.mst_edges_) == len(X) - 1
    assert 0 < len(model.skeleton_indices_) < len(X)
    # out-of-sample points (Theorem 2 estimator) land in the right place along the spiral
    Xn, theta_n = noisy_spiral(200, 5)
    assert best_rho(model.transform(Xn), theta_n) >= 0.99


def test_swiss_roll_recovers_both_coordinates():
    X, t, h = noisy_swiss_roll(1500)
    E = LSDR(n_components=2, random_state=0).fit_transform(X)
    assert best_rho(E, t) >= 0.99
    assert best_rho(E, h) >= 0.99


@pytest.mark.cluster
def test_transform_dask_keeps_row_chunks_and_reproduces_the_embedding(cluster_client):
    """transform (step 6, default) of the training points is the embedding; the Theorem 2
    interpolator reproduces it at its landmarks; dask in, dask out, same row chunks."""
    import dask.array as da

    X, _ = noisy_spiral(400, 1)
    Xd = da.from_array(X, chunks=(130, 2))
    for oos in ("nw", "interp"):
        model = LSDR(n_components=1, oos=oos, random_state=0, client=cluster_client).fit(X)
        out = model.transform(Xd)
        assert isinstance(out, da.Array) and out.chunks[0] == Xd.chunks[0]
        got = cluster_client.compute(out).result()
        np.testing.assert_allclose(got, model.transform(X))
        if oos == "nw":
            np.testing.assert_allclose(got, model.embedding_, rtol=1e-12, atol=1e-12)
        else:
            L = model.oos_landmarks_
            assert np.abs(got[L] - model.embedding_[L]).max() < 1e-2 * np.ptp(model.embedding_)


def test_single_simultaneous_pass_leaves_more_edges():
    """docs/decisions.md LSDR-F7: one simultaneous pass removes fewer edges than the fixed point."""
    X, _ = noisy_spiral(800)
    from scipy.spatial import Delaunay

    s = Delaunay(X).simplices
    e = np.unique(np.sort(np.vstack([s[:, [0, 1]], s[:, [0, 2]], s[:, [1, 2]]]), 1), axis=0)
    w = np.linalg.norm(X[e[:, 0]] - X[e[:, 1]], axis=1)
    none = np.zeros(len(e), bool)
    one, _ = prune_edges(e, w, none, len(X), 0.95, 2, "sweep", max_passes=1)
    fixed, passes = prune_edges(e, w, none, len(X), 0.95, 2, "sweep")
    assert passes > 1 and fixed.sum() < one.sum()


def test_duplicate_rows_are_kept_with_their_twins_embedding():
    """The duplicate-point policy of every estimator: kept, warned about, embedded with their
    twin (LSDR fits the distinct rows: a Delaunay tessellation of coincident points is
    degenerate)."""
    X, _ = noisy_spiral(200)
    dup = np.vstack([X, X[[3, 17]]])
    with pytest.warns(DuplicatePointsWarning, match="4 points have exact duplicates .*rows 3 "
                      "and 200"):
        fitted = LSDR(random_state=0).fit(dup)
    distinct = LSDR(random_state=0).fit(X)
    np.testing.assert_allclose(fitted.embedding_, distinct.embedding_[np.r_[:200, 3, 17]])
    np.testing.assert_array_equal(fitted.skeleton_indices_, distinct.skeleton_indices_)
    assert fitted.graph_.shape == (202, 202)
    np.testing.assert_allclose(fitted.transform(dup[-2:]), fitted.embedding_[-2:])


def test_bad_input_errors():
    X, _ = noisy_spiral(200)
    with pytest.raises(ValueError, match=r"p=8 exceeds max_delaunay_dim=6.*PCA.*graph='knn'"):
        LSDR().fit(np.random.default_rng(0).normal(size=(100, 8)))
    with pytest.raises(ValueError, match="The 'removal' parameter of LSDR must be a str among"):
        LSDR(removal="later").fit(X)
    with pytest.raises(ValueError, match="X has 3 features, but LSDR is expecting 2 features"):
        LSDR(n_components=1).fit(X).transform(np.zeros((3, 3)))


def test_knn_graph_option_handles_higher_p():
    rng = np.random.default_rng(0)
    t = rng.uniform(0, 3 * np.pi, 600)
    X = np.c_[np.cos(t), np.sin(t), t / 3, np.zeros((600, 5))] + 0.02 * rng.normal(size=(600, 8))
    E = LSDR(n_components=1, graph="knn", random_state=0).fit_transform(X)
    assert best_rho(E, t) >= 0.99
