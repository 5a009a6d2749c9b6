"""The kNN backends' table (dr_dask.graph.knn_backends) is what every reader of a search's name
reads: kneighbors' validation and dispatch, the estimators' ``knn`` constraint, the CLI's
``--knn`` choices. A backend added to the table alone is searched, refused a query or a metric
it does not take, and offered nowhere else unless it has a mode."""

from __future__ import annotations

import click
import numpy as np
import pytest

from dr_dask.graph import knn_backends
from dr_dask.graph.knn import KNN_CONSTRAINTS, Metric, kneighbors, knn_algorithm

#: Calls of the planted search below: (rows, k, exclude_self, its options).
CALLS: list[tuple] = []


def brute(X, k, exclude_self, *, client, query=None):
    """A search defined outside the package: every pair, by NumPy."""
    CALLS.append((len(X), k, exclude_self, query is not None))
    Q = X if query is None else query
    d = np.sqrt(((Q[:, None, :] - X[None, :, :]) ** 2).sum(-1))
    if exclude_self:
        np.fill_diagonal(d, np.inf)
    idx = np.argsort(d, axis=1, kind="stable")[:, :k]
    return np.take_along_axis(d, idx, 1), idx


def test_every_backend_loads_and_takes_only_known_options():
    for b in knn_backends.BACKENDS.values():
        assert callable(b.load()), b.name
        assert set(b.options) <= knn_backends.OPTIONS
    with pytest.raises(ValueError, match="unknown options"):
        knn_backends.Backend("x", "m:f", frozenset({"nprobe"}))


def test_the_cli_and_the_estimators_offer_the_table_s_modes():
    from dr_dask.cli import main
    from dr_dask.methods.ikd import IKD

    ctx = click.Context(main)
    embed_isomap = main.get_command(ctx, "embed").get_command(ctx, "isomap")
    (knn,) = [p for p in embed_isomap.params if p.name == "knn"]
    assert tuple(knn.type.choices) == knn_backends.MODES == ("auto", "exact", "ivf")
    assert KNN_CONSTRAINTS["knn"][0].values == set(knn_backends.MODES)
    assert IKD._parameter_constraints["knn"] == KNN_CONSTRAINTS["knn"]
    for mode in knn_backends.MODES:
        assert mode.split()[0] in knn_backends.modes_help()


def test_an_unknown_search_is_refused_naming_the_choices():
    X = np.random.default_rng(0).normal(size=(30, 3))
    with pytest.raises(ValueError, match=r"algorithm must be one of \('auto', 'exact', "):
        kneighbors(X, 3, algorithm="hnsw")
    with pytest.raises(ValueError, match=r"knn must be one of \('auto', 'exact', 'ivf'\)"):
        knn_algorithm("hnsw", 30, 3)


def test_a_backend_added_to_the_table_alone_is_searched(monkeypatch):
    X = np.random.default_rng(1).normal(size=(60, 4))
    added = knn_backends.Backend("brute", f"{__name__}:brute", frozenset({"query"}),
                                 mode="brute", help="brute")
    monkeypatch.setitem(knn_backends.BACKENDS, "brute", added)
    CALLS.clear()
    dist, idx = kneighbors(X, 5, algorithm="brute")
    ref_dist, ref_idx = kneighbors(X, 5, algorithm="exact")
    np.testing.assert_array_equal(idx, ref_idx)
    np.testing.assert_allclose(dist, ref_dist, rtol=1e-12)
    _, idx_q = kneighbors(X, 5, query=X[:7] + 0.01, algorithm="brute")
    assert CALLS == [(60, 5, True, False), (60, 5, False, True)]
    np.testing.assert_array_equal(
        idx_q, kneighbors(X, 5, query=X[:7] + 0.01, algorithm="exact")[1])
    # a mode of the table is an estimator's mode: its algorithm, a metric it cannot measure
    # refused by name
    assert knn_algorithm("brute", 60, 4) == "brute"
    with pytest.raises(ValueError, match=r"metric='manhattan'.*brute"):
        knn_algorithm("brute", 60, 4, Metric("manhattan"))
    with pytest.raises(ValueError, match=r"metric='manhattan'.*brute"):
        kneighbors(X, 5, algorithm="brute", metric=Metric("manhattan"))


def test_a_backend_without_query_refuses_one_by_name():
    X = np.random.default_rng(2).normal(size=(40, 3))
    for name, b in knn_backends.BACKENDS.items():
        if not b.takes_query:
            with pytest.raises(ValueError, match=f"algorithm={name!r} searches X among itself"):
                kneighbors(X, 3, query=X[:2], algorithm=name)
