"""IKD.transform: new rows land where a fit on all rows puts them, for every solver.

The data are the IKD paper's GP mapping (``dr-dask datasets make gp``): fit on 80% of the
rows, map the other 20%, and compare with the same rows of a fit on all of them (Procrustes
disparity, so the arbitrary rotation of each fit does not count).
"""

from __future__ import annotations

import pickle
import warnings

import dask
import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import connected_components, dijkstra
from sklearn.exceptions import NotFittedError
from sklearn.linear_model import LinearRegression
from sklearn.pipeline import make_pipeline

from dr_dask import IKD
from dr_dask.datasets import make_dataset
from dr_dask.graph import select_landmarks
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
    X, _, train, _ = gp
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


def _dense_geodesic_triangulation(est: IKD, Xt: np.ndarray, Xq: np.ndarray) -> np.ndarray:
    """de Silva-Tenenbaum triangulation of the new rows ``Xq`` against a geodesic IKD fit on
    ``Xt`` (correlation, sigma^2 = 1, the SE kernel), from scratch: the kNN graph of largest
    correlations with weights -log s, scipy's Dijkstra from the seeded max-min landmarks, each
    new row joined to its k most correlated training rows by edges no path can pass through."""
    def unit(A):
        A = A - A.mean(axis=1, keepdims=True)
        return A / np.linalg.norm(A, axis=1, keepdims=True)

    def weight(s):
        return -np.log(np.clip(s, est.floor, est.ceil))

    U, Q = unit(Xt), unit(Xq)
    T, n, k = len(U), len(Q), est.n_neighbors
    S = U @ U.T
    np.fill_diagonal(S, -np.inf)
    nn = np.argsort(-S, axis=1)[:, :k]
    r = np.repeat(np.arange(T), k)
    W = sp.csr_matrix((weight(S[r, nn.ravel()]), (r, nn.ravel())), shape=(T, T))
    W = W.maximum(W.T)
    assert connected_components(W)[0] == 1
    SQ = Q @ U.T
    nq = np.argsort(-SQ, axis=1)[:, :k]
    q = np.repeat(np.arange(n), k)
    # training -> new row only: directed, so no geodesic between training rows uses a new row
    E = sp.csr_matrix((weight(SQ[q, nq.ravel()]), (nq.ravel(), q)), shape=(T, n))
    G = sp.bmat([[W, E], [None, sp.csr_matrix((n, n))]], format="csr")
    L = min(T, 256)
    landmarks = select_landmarks(U, L, method="maxmin", random_state=est.random_state)
    P = dijkstra(G, directed=True, indices=landmarks)
    D = 2.0 * np.clip(P, -np.log(est.ceil), -np.log(est.floor))  # SE: f^-1(s) = -2 ln s
    D_LL = D[:, landmarks]
    D_LL = (D_LL + D_LL.T) / 2
    np.fill_diagonal(D_LL, 0.0)
    Y = est.embedding_[landmarks]
    c = Y.mean(axis=0)
    return c - 0.5 * (np.linalg.pinv(Y - c) @ (D[:, T:] - D_LL.mean(axis=1)[:, None])).T


def test_geodesic_map_is_built_at_the_first_transform_as_the_dense_triangulation(gp):
    """Geodesic IKD's fit keeps what its map needs and builds it when first asked for (fit
    and fit_transform do not pay for it): the map, from the fit or from a pickle of the fit
    taken before any transform, is the triangulation through exact geodesics, and mapping
    leaves the estimator's state as it was (scikit-learn's rule for transform)."""
    X, _, train, test = gp
    Xt, Xq = X[train[:400]], X[test[:40]]
    est = IKD(solver="geodesic", n_components=3, random_state=0).fit(Xt)
    unbuilt = pickle.dumps(est)
    state = dict(est.__dict__)
    mapped = est.transform(Xq)
    assert est.__dict__ == state
    ref = _dense_geodesic_triangulation(est, Xt, Xq)
    assert np.linalg.norm(mapped - ref) < 1e-6 * np.linalg.norm(ref)
    np.testing.assert_allclose(pickle.loads(unbuilt).transform(Xq), mapped, rtol=1e-12,
                               atol=1e-12)
    assert est.out_of_sample_ is est.out_of_sample_  # built once
    # and the built map pickles too
    np.testing.assert_allclose(pickle.loads(pickle.dumps(est)).transform(Xq), mapped,
                               rtol=1e-12, atol=1e-12)


def test_geodesic_map_landmarks_follow_the_fit_random_state_not_later_draws(gp):
    """A RandomState seed draws the map's landmarks as they stand at the end of the fit:
    what the caller draws from it between fit and transform changes nothing."""
    X, _, train, test = gp
    Xt, Xq = X[train[:300]], X[test[:20]]
    maps = []
    for draws in (0, 1000):
        rs = np.random.RandomState(0)
        est = IKD(solver="geodesic", n_components=3, random_state=rs).fit(Xt)
        rs.random_sample(draws)
        maps.append(est.transform(Xq))
    np.testing.assert_array_equal(maps[0], maps[1])


def test_geodesic_map_over_the_budget_says_so_and_builds_under_a_larger_one(gp):
    """Path lengths over the in-memory budget: transform refuses, naming the budget, before
    any work; raised, the same fit maps."""
    X, _, train, test = gp
    est = IKD(solver="geodesic", n_components=3, random_state=0).fit(X[train[:300]])
    with dask.config.set({"dr_dask.tiles.memory-bytes": 1000}):
        assert est.out_of_sample_ is None
        with pytest.raises(ValueError, match=r"dr_dask\.tiles\.memory-bytes"):
            est.transform(X[test[:5]])
    assert est.transform(X[test[:5]]).shape == (5, 3)


@pytest.mark.cluster
def test_geodesic_map_built_on_the_cluster_equals_one_built_after_a_pickle(gp, cluster_client):
    """Fitted on a LocalCluster, the map is built there at the first transform; a pickle of
    the fit taken before (no client) builds the same map with dask's threads."""
    X, _, train, test = gp
    Xt, Xq = X[train[:400]], X[test[:40]]
    est = IKD(solver="geodesic", n_components=3, random_state=0, client=cluster_client).fit(Xt)
    back = pickle.loads(pickle.dumps(est))
    np.testing.assert_allclose(back.transform(Xq), est.transform(Xq), rtol=1e-12, atol=1e-12)


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
