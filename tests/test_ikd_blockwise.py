"""Blockwise IKD and the clique search (Li & Wu 2024, §2.4)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.spatial.distance import cdist

from dr_dask.datasets import make_dataset
from dr_dask.graph.cliques import maximal_cliques
from dr_dask.linalg.align import procrustes_fit
from dr_dask.linalg.kernels import get_kernel
from dr_dask.methods._ikd_blockwise import merge_cliques, threshold_rule
from dr_dask.methods.ikd import IKD
from dr_dask.methods.ikd_core import InverseKernel
from dr_dask.metrics import r2_affine


def _bk_reference(A: np.ndarray) -> list[list[int]]:
    """Plain recursive Bron–Kerbosch with Tomita pivoting on Python sets."""
    nbrs = [set(np.flatnonzero(row).tolist()) for row in A]
    out: list[list[int]] = []

    def rec(R, P, X):
        if not P and not X:
            out.append(sorted(R))
            return
        u = max(sorted(P | X), key=lambda w: len(P & nbrs[w]))
        for v in sorted(P - nbrs[u]):
            rec(R | {v}, P & nbrs[v], X & nbrs[v])
            P = P - {v}
            X = X | {v}

    rec(set(), set(range(len(A))), set())
    return out


@pytest.mark.parametrize(("T", "p", "seed"),
                         [(1, 0.5, 0), (12, 0.5, 1), (40, 0.4, 2), (70, 0.3, 3)])
def test_maximal_cliques_equal_reference_bron_kerbosch(T, p, seed):
    rng = np.random.default_rng(seed)
    A = rng.random((T, T)) < p
    A = np.triu(A, 1)
    A = A | A.T
    got = maximal_cliques(A, max_cliques=10**6, stop_when_covered=False)
    ref = _bk_reference(A)
    assert sorted(map(tuple, got)) == sorted(map(tuple, ref))
    for c in got:  # cliques, and maximal
        sub = A[np.ix_(c, c)]
        assert sub.sum() == len(c) * (len(c) - 1)
        outside = np.setdiff1d(np.arange(T), c)
        assert not np.any(A[np.ix_(outside, c)].all(axis=1))


def test_maximal_cliques_cap_min_size_and_early_stop():
    rng = np.random.default_rng(0)
    Z = rng.uniform(0, 10, (300, 2))
    A = cdist(Z, Z) < 2.0
    capped = maximal_cliques(A, max_cliques=7, stop_when_covered=False)
    assert len(capped) == 7
    big = maximal_cliques(A, max_cliques=10**6, min_size=6, stop_when_covered=False)
    assert all(len(c) >= 6 for c in big)
    covering = maximal_cliques(A, max_cliques=10**6, min_size=1)
    assert np.unique(np.concatenate(covering)).size == 300
    # the search stopped with the clique that completed the cover
    assert np.unique(np.concatenate(covering[:-1])).size < 300
    with pytest.raises(ValueError, match="symmetric"):
        maximal_cliques(np.triu(A, 1))


def test_threshold_rule_of_the_authors_code():
    assert threshold_rule(50) == 0.3 and threshold_rule(100) == 0.3
    assert threshold_rule(1000) == 0.1 and threshold_rule(5000) == 0.1
    assert threshold_rule(200) == pytest.approx(0.7 - 0.2 * np.log10(200))


def _exact_problem(T=60, M=2, seed=0):
    """Noiseless SE similarities of known latents: every clique IKD is exact."""
    rng = np.random.default_rng(seed)
    Z = rng.uniform(-1.5, 1.5, (T, M))
    S = np.exp(-0.5 * cdist(Z, Z, "sqeuclidean"))
    inverse = InverseKernel(get_kernel("se"), 1.0, 1e-300, 1.0, 1.0)
    return Z, S, inverse


@pytest.mark.parametrize(
    ("cliques", "kinds"),
    [
        ([np.arange(0, 35), np.arange(30, 60)], ["align"]),  # 5 shared >= M + 1
        ([np.arange(0, 31), np.arange(29, 60)], ["bridge_shared"]),  # 2 shared < M + 1
        ([np.arange(0, 30), np.arange(30, 60)], ["bridge"]),  # disjoint
        ([np.arange(0, 40), np.arange(10, 30), np.arange(35, 60)], ["align"]),  # one subsumed
    ],
)
def test_merge_recovers_exact_latents_rigidly(cliques, kinds):
    Z, S, inverse = _exact_problem()
    res = merge_cliques(S, cliques, inverse, "min_max", 2)
    assert [e["kind"] for e in res["merge_log"]] == kinds
    fit = procrustes_fit(res["embedding"], Z, scaling=False)  # rigid: scale must be exact too
    assert fit.residual < 1e-12 * len(Z)


def test_merge_refuses_cliques_that_miss_points():
    _, S, inverse = _exact_problem()
    with pytest.raises(ValueError, match="do not cover rows \\[50, 51"):
        merge_cliques(S, [np.arange(0, 30), np.arange(25, 50)], inverse, "min_max", 2)


@pytest.fixture(scope="module")
def gp_data():
    ds = make_dataset("gp", n_samples=300, n_features=1000, n_components=3, random_state=0)
    return ds["X"].values, ds["latent"].values


@pytest.mark.parametrize("shared_points", ["keep_larger", "average", "weighted"])
def test_blockwise_recovers_gp_latents(gp_data, shared_points):
    X, Z = gp_data
    est = IKD(n_components=3, solver="blockwise", shared_points=shared_points,
              random_state=0).fit(X)
    assert r2_affine(Z, est.embedding_) >= 0.95
    covered = np.unique(np.concatenate(est.cliques_))
    assert covered.size == 300
    assert len(est.merge_log_) >= 1 and {"kind", "n_shared", "residual"} <= set(est.merge_log_[0])
    assert 0.1 <= est.clique_threshold_ < 1
    assert est.embedding_.shape == (300, 3) and est.eigenvalues_.shape == (3,)


@pytest.mark.cluster
def test_blockwise_cluster_run_equals_threaded_run(gp_data, cluster_client):
    X, _ = gp_data
    threaded = IKD(n_components=3, solver="blockwise", clique_threshold=0.3, random_state=0).fit(X)
    on_cluster = IKD(n_components=3, solver="blockwise", clique_threshold=0.3, random_state=0,
                     client=cluster_client).fit(X)
    assert len(on_cluster.cliques_) == len(threaded.cliques_)
    np.testing.assert_allclose(on_cluster.embedding_, threaded.embedding_, atol=1e-8)


@pytest.mark.parametrize(
    ("params", "match"),
    [
        (dict(clique_threshold=1.0),
         "'clique_threshold' parameter of IKD must be a float in the range \\(0, 1\\)"),
        (dict(clique_threshold=0.0),
         "'clique_threshold' parameter of IKD must be a float in the range \\(0, 1\\)"),
        (dict(clique_threshold=-0.2),
         "'clique_threshold' parameter of IKD must be a float in the range \\(0, 1\\)"),
        (dict(min_overlap=2), "min_overlap must be an integer >= 3 \\(M \\+ 1 shared"),
        (dict(max_cliques=0),
         "'max_cliques' parameter of IKD must be an int in the range \\[1, inf\\)"),
        (dict(shared_points="median"), "'shared_points' parameter of IKD must be a str among"),
        (dict(n_landmarks=10), "no landmark variant"),
    ],
)
def test_bad_blockwise_parameters(params, match):
    X = make_dataset("sinusoidal", n_samples=40, n_features=20, random_state=0)["X"].values
    with pytest.raises(ValueError, match=match):
        IKD(n_components=2, solver="blockwise", **params).fit(X)
