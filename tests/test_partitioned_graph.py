"""The neighbour graph built on the workers: equal to the in-memory graph when every list is
probed, bridged as the in-memory repair bridges, stored compactly, the same on a cluster, from
S3, and after a worker is killed in any of its stages."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from _faults import Fault, Task
from conftest import noisy_curve
from scipy.sparse.csgraph import dijkstra

from dr_dask.graph import DisconnectedGraphWarning, graph_from_neighbors, kneighbors
from dr_dask.graph.components import connect_components
from dr_dask.graph.partitioned import block_spans, partitioned_graph
from dr_dask.graph.paths import GeodesicRows
from dr_dask.io.storage import location


@pytest.fixture
def small_blocks(dr_config):
    # many groups, blocks and chunks at small T: the shuffle crosses every boundary
    dr_config({"knn.ivf-task-rows": 300, "knn.ivf-chunk-rows": 64, "knn.ivf-block-rows": 512,
               "graph.block-edges": 5000})


def _build(X, k, tmp_path, **kw):
    return partitioned_graph(X, k, location(str(tmp_path / "g")), client=kw.pop("client", None),
                             **kw)


def test_every_list_probed_gives_the_exact_graph(small_blocks, tmp_path):
    X = noisy_curve(2500, 30)
    d, i = kneighbors(X, 7, algorithm="exact")
    expected = graph_from_neighbors(i, d, len(X))
    pg = _build(X, 7, tmp_path, n_lists=25, n_probe=25, sample_rows=40)
    got = pg.graph.to_csr()
    assert (got != 0).sum() == expected.nnz and pg.n_edges == expected.nnz // 2
    np.testing.assert_allclose(got.toarray(), expected.toarray(), rtol=1e-6)
    assert pg.n_components == 1
    # stored compactly: int32 columns, float32 weights (8 bytes per directed edge)
    g = pg.graph.open()
    assert g.indices.dtype == np.int32 and g.weights.dtype == np.float32
    # the sampled rows' neighbours are the exact ones, for the recall estimate
    np.testing.assert_array_equal(np.sort(pg.sample_neighbours, 1), np.sort(i[pg.sample], 1))
    # shortest paths over the stored graph equal scipy's over the in-memory one
    sources = np.array([0, 17, 2499])
    rows = GeodesicRows.compute(pg.graph, sources).gather()
    np.testing.assert_allclose(rows, dijkstra(expected, directed=False, indices=sources),
                               rtol=1e-6)
    # the staging arrays are gone: the lists, edges and blocks; the graph stays
    assert sorted(p.name for p in (tmp_path / "g").iterdir()) == ["graph"]


def test_a_block_reads_only_the_groups_that_sent_it_edges():
    # group g's edges, sorted by block, from at[g]; each block gets one span per group that
    # has edges for it, in group order, and the dense table of groups x blocks is never made
    rng = np.random.default_rng(3)
    B, G = 40, 25
    dense = rng.integers(1, 50, size=(G, B)) * (rng.random((G, B)) < 0.1)
    at = np.concatenate([[0], np.cumsum(dense.sum(axis=1) + 7)])  # slices with padding
    sent = [(np.flatnonzero(row), row[row > 0]) for row in dense]
    spans, per_block = block_spans(sent, at, B)
    within = np.concatenate([np.zeros((G, 1), np.int64), np.cumsum(dense, axis=1)], axis=1)
    for b in range(B):
        expected = [[at[g] + within[g, b], at[g] + within[g, b + 1]] for g in range(G)
                    if dense[g, b]]
        assert spans[b].tolist() == expected
    np.testing.assert_array_equal(per_block, dense.sum(axis=0))
    assert sum(map(len, spans)) == np.count_nonzero(dense)
    spans, per_block = block_spans([], at, 3)
    assert [s.shape for s in spans] == [(0, 2)] * 3 and per_block.tolist() == [0, 0, 0]


def _clusters(seed=0):
    rng = np.random.default_rng(seed)
    X = np.vstack([rng.normal(size=(800, 20)), rng.normal(size=(300, 20)) + 30,
                   rng.normal(size=(100, 20)) - 40])
    return X[rng.permutation(len(X))]


def test_disconnected_graph_bridged_as_in_memory(small_blocks, tmp_path):
    X = _clusters()
    d, i = kneighbors(X, 5, algorithm="exact")
    with pytest.warns(DisconnectedGraphWarning, match="3 connected components"):
        expected = connect_components(graph_from_neighbors(i, d, len(X)), X)
    with pytest.warns(DisconnectedGraphWarning, match=r"3 connected components of sizes "
                      r"\[800, 300, 100\]"):
        pg = _build(X, 5, tmp_path, n_lists=20, n_probe=20)
    assert pg.n_components == 3 and pg.n_edges == expected.nnz // 2
    np.testing.assert_allclose(pg.graph.to_csr().toarray(), expected.toarray(), rtol=1e-5)


def test_disconnected_graph_refused_naming_rows(small_blocks, tmp_path):
    X = _clusters()
    smallest = set(np.flatnonzero(X[:, 0] < -20).tolist())  # the 100 rows around -40
    with pytest.raises(ValueError, match=r"sizes \[800, 300, 100\]; the smallest contains "
                       r"rows \[(\d+, ){4}\d+\]") as err:
        _build(X, 5, tmp_path, n_lists=20, n_probe=20, on_disconnected="raise")
    named = {int(r) for r in str(err.value).split("rows [")[1].split("]")[0].split(", ")}
    assert named <= smallest
    with warnings.catch_warnings():
        warnings.simplefilter("error", DisconnectedGraphWarning)
        pg = _build(X, 5, tmp_path / "ignored", n_lists=20, n_probe=20, on_disconnected="ignore")
    assert pg.n_components == 3


@pytest.mark.cluster
def test_many_components_bridged_on_a_cluster_as_in_memory(small_blocks, cluster_client,
                                                            dr_config, tmp_path):
    # five clusters on a line, Borůvka over several rounds; the components are read from the
    # blocks' roots on the workers (the client holds no label per row)
    rng = np.random.default_rng(4)
    X = np.vstack([rng.normal(size=(n, 20)) + 12 * c
                   for c, n in enumerate((700, 60, 300, 25, 150))])
    X = X[rng.permutation(len(X))]
    d, i = kneighbors(X, 5, algorithm="exact")
    with pytest.warns(DisconnectedGraphWarning, match="5 connected components"):
        expected = connect_components(graph_from_neighbors(i, d, len(X)), X)
    with pytest.warns(DisconnectedGraphWarning, match=r"5 connected components of sizes "
                      r"\[700, 300, 150, 60, 25\]; the smallest contains rows \[(\d+, ){4}"):
        pg = _build(X, 5, tmp_path, client=cluster_client, n_lists=20, n_probe=20)
    assert pg.n_components == 5 and pg.n_edges == expected.nnz // 2
    np.testing.assert_allclose(pg.graph.to_csr().toarray(), expected.toarray(), rtol=1e-5)
    # more rows outside the largest component than may be bridged: refused, counted
    dr_config({"graph.bridge-max-rows": 534})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DisconnectedGraphWarning)
        with pytest.raises(ValueError, match=r"other than the largest hold 535 rows, more "
                           r"than dr_dask.graph.bridge-max-rows=534"):
            _build(X, 5, tmp_path / "refused", client=cluster_client, n_lists=20, n_probe=20)


def _landmark_isomap(**kw):
    from dr_dask.methods.landmark_isomap import LandmarkIsomap

    return LandmarkIsomap(**{"n_neighbors": 8, "n_components": 1, "n_landmarks": 60,
                             "knn": "ivf", "n_probe": 1, "random_state": 0, **kw})


@pytest.mark.cluster
def test_landmark_isomap_on_cluster_equals_threaded(small_blocks, cluster_client, tmp_path):
    X = noisy_curve(2000, 30, seed=2)
    threads = _landmark_isomap().fit(X)
    on_cluster = _landmark_isomap(client=cluster_client, scratch=str(tmp_path)).fit(X)
    assert threads.graph_ is None and threads.knn_recall_ == on_cluster.knn_recall_ < 1
    np.testing.assert_allclose(on_cluster.embedding_, threads.embedding_, rtol=1e-6,
                               atol=1e-9)
    assert list(tmp_path.iterdir()) == []  # the lists and the graph are deleted


@pytest.mark.cluster
@pytest.mark.parametrize("stage", ["group_edges", "block_rows"])
def test_worker_killed_in_the_graph_build_leaves_the_result_unchanged(small_blocks, tmp_path,
                                                                      stage):
    from distributed import Client, LocalCluster

    X = noisy_curve(2000, 20, seed=3)
    expected = _landmark_isomap().fit(X).embedding_
    fault = Fault(tmp_path / "fault", Task(2, prefix=stage))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        fault.register(client)
        got = _landmark_isomap(client=client, scratch=str(tmp_path / "scratch")).fit(X)
    assert fault.fired is not None and stage in fault.fired["key"]
    np.testing.assert_allclose(got.embedding_, expected, rtol=1e-6, atol=1e-9)


def test_landmark_isomap_reads_a_stored_input_where_it_is(small_blocks, tmp_path):
    """From a Zarr store the rows stay there (the fit keeps a lazy view, the workers read
    blocks): the same embedding and transform as from the array, and a bad row is named."""
    import dask.array as da
    import zarr

    X = noisy_curve(2000, 30, seed=5)
    zarr.open_group(str(tmp_path / "in.zarr"), mode="w").create_array("X", data=X,
                                                                        chunks=(600, 30))
    from_array = _landmark_isomap(n_probe=1000).fit(X)
    stored = _landmark_isomap(n_probe=1000).fit(f"{tmp_path}/in.zarr:X")
    assert isinstance(stored.training_data_, da.Array)
    np.testing.assert_allclose(stored.embedding_, from_array.embedding_, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(stored.transform(X[:9]), from_array.transform(X[:9]),
                               rtol=1e-9, atol=1e-12)
    X[1234, 3] = np.nan
    zarr.open_group(str(tmp_path / "bad.zarr"), mode="w").create_array("X", data=X,
                                                                         chunks=(600, 30))
    with pytest.raises(ValueError, match=r"X has NaN or infinite values in rows \[1234\]"):
        _landmark_isomap().fit(f"{tmp_path}/bad.zarr:X")


@pytest.mark.cluster
def test_landmark_ikd_reads_a_stored_input_again_above_the_budget(small_blocks, dr_config,
                                                                  cluster_client, tmp_path):
    """Landmark IKD holds a stored input's rows on the workers while they fit the in-memory
    budget and reads them from the store again above it: the same embedding either way."""
    import zarr

    from dr_dask.methods.ikd import IKD

    X = noisy_curve(2000, 30, seed=6)
    zarr.open_group(str(tmp_path / "in.zarr"), mode="w").create_array("X", data=X,
                                                                        chunks=(600, 30))

    def fit():
        return IKD(n_components=1, solver="geodesic", n_landmarks=60, n_neighbors=8,
                   knn="ivf", n_probe=1, random_state=0, client=cluster_client,
                   scratch=str(tmp_path / "scratch")).fit(f"{tmp_path}/in.zarr:X")

    held = fit()
    dr_config({"tiles.memory-bytes": 1000})  # the rows (and the L x T paths) pass it
    read_again = fit()
    assert held.knn_recall_ == read_again.knn_recall_ < 1
    np.testing.assert_allclose(read_again.embedding_, held.embedding_, rtol=1e-6, atol=1e-9)


def test_landmark_isomap_cli_from_s3_equals_local(small_blocks, dr_config, s3_bucket, tmp_path,
                                                  monkeypatch):
    """`dr-dask embed isomap --landmarks --knn ivf` from s3:// (moto) to s3://: the workers'
    lists, graph and paths by blocks go next to the input in its bucket (no local temporary
    directory can be made) and are deleted; the embedding equals the local run's."""
    dr_config({"graph.paths-graph-share": 0, "graph.paths-block-nodes": 256})
    import tempfile

    import zarr
    from click.testing import CliRunner

    from dr_dask.cli import main
    from dr_dask.io.storage import Location
    from dr_dask.runs.group import open_run

    X = noisy_curve(900, 12, seed=6)
    for url in (str(tmp_path / "in.zarr"), f"s3://{s3_bucket}/in.zarr"):
        zarr.open_group(Location(url).zarr_store(), mode="w").create_array(
            "X", data=X, chunks=(300, 12), dimension_names=("sample", "feature"))
    args = ["--scheduler", "threads", "embed", "isomap", "-n", "1", "--n-neighbors", "8",
            "--landmarks", "40", "--knn", "ivf", "--n-probe", "3", "--name", "r"]
    runs = {}
    for where, out in ((str(tmp_path), str(tmp_path / "out.zarr")),
                       (f"s3://{s3_bucket}", f"s3://{s3_bucket}/out.zarr")):
        if where.startswith("s3://"):
            monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "no-such-dir"))
        res = CliRunner().invoke(main, [*args, "--input", f"{where}/in.zarr:X", "--out", out])
        assert res.exit_code == 0, res.output
        runs[where] = np.asarray(open_run(out, "r")["embedding"][...])
    local, remote = runs.values()
    np.testing.assert_allclose(remote, local, rtol=1e-6, atol=1e-9)
    assert sorted(Location(f"s3://{s3_bucket}").listdir()) == ["in.zarr", "out.zarr"]
