"""Shortest paths by row blocks over a stored graph: equal to single-process Dijkstra (ties,
several components, a long chain), in rounds bounded by the blocks, the same on a cluster of 1
or 4 worker processes and after a worker is killed in a round."""

from __future__ import annotations

import dask
import numpy as np
import pytest
import scipy.sparse as sp
from _faults import Fault, Task
from conftest import noisy_curve

from dr_dask.graph.paths import GeodesicRows
from dr_dask.graph.sssp import SearchGraph, dijkstra_rows
from dr_dask.graph.stored import StoredGraph


@pytest.fixture
def small_path_blocks(dr_config):
    # blocks of 64 nodes and 8 float64 lanes a batch: many blocks, rounds and batches
    dr_config({"graph.paths-block-nodes": 64, "graph.paths-batch-bytes": 64 * 8 * 8,
               "graph.paths-graph-share": 0})


def _stored(graph: sp.spmatrix, tmp_path, name: str = "g") -> StoredGraph:
    return StoredGraph.write(SearchGraph.of(sp.csr_matrix(graph)), str(tmp_path / name))


def _chain_with_shortcuts(T: int, seed: int = 0) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    i = np.arange(T - 1)
    a = rng.integers(0, T, T)
    b = np.clip(a + rng.integers(-30, 30, T), 0, T - 1)
    rows, cols = np.concatenate([i, a]), np.concatenate([i + 1, b])
    w = np.concatenate([rng.random(T - 1) + 0.1, rng.random(T) * 5 + 0.5])
    return sp.csr_matrix((w, (rows, cols)), shape=(T, T))


def test_equal_to_dijkstra_with_kept_columns_and_squares(small_path_blocks, tmp_path):
    g = _chain_with_shortcuts(1500)
    sources = np.array([0, 3, 700, 1499, 5, 900, 11, 12, 13, 14, 1400])  # two batches
    rows = GeodesicRows.compute(_stored(g, tmp_path), sources, dtype=np.float64,
                                columns=np.array([7, 1200]))
    assert rows.order is not None and rows.report["rounds"] and len(rows.report["rounds"]) == 2
    expected = dijkstra_rows(g, sources)
    np.testing.assert_array_equal(rows.gather(), expected)  # the same rounded sums
    np.testing.assert_array_equal(rows.columns(np.array([7, 1200])), expected[:, [7, 1200]])
    # float32 weights and rows: float32 lanes, 16 a batch, swept together inside the blocks;
    # the same sums as the whole graph's sweeps in one process
    g32 = _stored(g.astype(np.float32), tmp_path, "g3")
    many = np.arange(0, 1500, 75)
    swept = GeodesicRows.compute(g32, many, dtype=np.float32)
    assert swept.report["width"] == 16
    np.testing.assert_array_equal(
        swept.gather(), GeodesicRows.compute(g32, many, dtype=np.float32, blocks=False).gather())
    squares = GeodesicRows.compute(_stored(g, tmp_path, "g2"), sources[:3], dtype=np.float64,
                                   square=True).gather()
    np.testing.assert_allclose(squares, expected[:3] ** 2, rtol=1e-12)


def test_ties_on_a_grid_in_float32(small_path_blocks, tmp_path):
    # unit weights on a 40 x 40 grid: many shortest paths of equal length to every node
    n = 40
    grid = sp.kron(sp.eye(n), sp.diags([1.0, 1.0], [-1, 1], (n, n))) + sp.kron(
        sp.diags([1.0, 1.0], [-1, 1], (n, n)), sp.eye(n))
    g = sp.csr_matrix(grid, dtype=np.float32)
    sources = np.array([0, 820, 1599])
    got = GeodesicRows.compute(_stored(g, tmp_path), sources, dtype=np.float32).gather()
    np.testing.assert_array_equal(got, dijkstra_rows(g, sources, dtype=np.float32))
    # a graph smaller than one block (and than a column chunk of the rows)
    with dask.config.set({"dr_dask.graph.paths-block-nodes": 1 << 16}):
        one = GeodesicRows.compute(_stored(g, tmp_path, "g1"), sources, dtype=np.float32)
    assert one.report["blocks"] == 1
    np.testing.assert_array_equal(one.gather(), got)


def test_long_chain_rounds_follow_the_blocks_not_the_hops(small_path_blocks, tmp_path):
    T = 4096  # 4,095 hops, 64 blocks of 64 nodes
    i = np.arange(T - 1)
    g = sp.csr_matrix((np.full(T - 1, 0.5), (i, i + 1)), shape=(T, T))
    rows = GeodesicRows.compute(_stored(g, tmp_path), np.array([0]), dtype=np.float64)
    np.testing.assert_array_equal(rows.gather()[0], 0.5 * np.arange(T))
    # the reverse Cuthill-McKee order of a chain is the chain (from either end): one round per
    # block the wave enters; each sends one node's lane across one boundary, never back
    assert rows.report["rounds"] == [T // 64]
    assert max(rows.report["bytes"]) == 4 + 8  # its position and its lane


def test_several_components_raise_as_single_process(small_path_blocks, tmp_path):
    g = sp.block_diag([_chain_with_shortcuts(300, 1), _chain_with_shortcuts(200, 2)]).tocsr()
    sources = np.array([10, 20])
    with pytest.raises(ValueError, match="disconnected") as single:
        dijkstra_rows(g, sources)
    with pytest.raises(ValueError, match="disconnected") as blocks:
        GeodesicRows.compute(_stored(g, tmp_path), sources)
    assert str(blocks.value) == str(single.value)
    assert "source node 10 cannot reach 200 of 500 nodes" in str(blocks.value)


def _landmark_isomap(**kw):
    from dr_dask.methods.landmark_isomap import LandmarkIsomap

    return LandmarkIsomap(n_components=1, n_neighbors=8, n_landmarks=40, knn="ivf",
                          n_probe=3, random_state=0, **kw)


@pytest.mark.cluster
@pytest.mark.slow
def test_2_and_4_workers_and_a_worker_killed_in_a_round(small_path_blocks, dr_config,
                                                        tmp_path, cluster_client):
    """On 4 worker processes, a worker killed as it starts a round leaves the paths equal to
    single-process Dijkstra (its blocks' lanes are recomputed from their lineage); Landmark
    Isomap over the partitioned graph, paths by blocks, embeds the same on 4 and on the
    session's 2 (the blocks dealt to other homes)."""
    from distributed import Client, LocalCluster

    g = _chain_with_shortcuts(1500, 3)
    sources = np.array([0, 3, 700, 1499, 5, 900, 11, 12, 13])
    # the fit's paths: 4 blocks, one batch of lanes (few rounds: each costs a scheduler trip)
    fit_config = {"knn.ivf-task-rows": 300, "knn.ivf-chunk-rows": 64,
                  "graph.block-edges": 5000, "graph.paths-block-nodes": 320,
                  "graph.paths-batch-bytes": 320 * 4 * 64}
    X = noisy_curve(1200, 12, seed=4)
    with LocalCluster(n_workers=4, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, \
            Client(cluster, set_as_default=False) as client:
        fault = Fault(tmp_path / "fault", Task(12, prefix="round"))
        fault.register(client)
        rows = GeodesicRows.compute(_stored(g, tmp_path), sources, client=client,
                                    dtype=np.float64)
        assert fault.fired is not None and "round" in fault.fired["key"]
        np.testing.assert_array_equal(rows.gather(), dijkstra_rows(g, sources))
        dr_config(fit_config)
        on_4 = _landmark_isomap(client=client, scratch=str(tmp_path / "s4")).fit(X).embedding_
    on_2 = _landmark_isomap(client=cluster_client, scratch=str(tmp_path / "s2")).fit(X)
    np.testing.assert_allclose(on_4, on_2.embedding_, rtol=1e-6, atol=1e-9)


@pytest.mark.cluster
def test_each_block_stays_on_one_worker_and_counts_its_bytes(cluster_client, tmp_path):
    """A worker holds its share of the blocks, not more: the blocks are dealt to the workers
    in turn and each block's tasks run where it is, and dask counts a block at its size (as
    a few hundred bytes, the scheduler moved rounds and their blocks freely)."""
    from dask.sizeof import sizeof

    from dr_dask.graph.block_paths import _open_block, _Runner

    stored = _stored(_chain_with_shortcuts(600), tmp_path)
    block = _open_block(stored, 0, 300, 300)
    assert sizeof(block) >= block.nbytes > 0
    run = _Runner(cluster_client)
    assert len(run.homes) == 2
    where = run.map(lambda b: __import__("distributed").get_worker().address,
                    [(b,) for b in range(6)] * 3, list(range(6)) * 3)
    got = run.values(where)
    assert got == [run.homes[b % 2] for b in range(6)] * 3


def test_blocks_only_for_a_graph_a_task_could_not_hold(dr_config, tmp_path):
    """The default: the whole graph while it and its search state fit the configured share of
    a task's memory (faster, no rounds), by blocks past it; an explicit choice wins."""
    from dr_dask.graph.paths import by_blocks
    from dr_dask.runtime.cluster import thread_memory

    g = _stored(_chain_with_shortcuts(2000), tmp_path)
    whole = g.nbytes + 32 * g.n_nodes
    assert 2000 * 8 < g.nbytes < 2000 * 200
    assert not by_blocks(sp.eye(3, format="csr"))  # in memory: never by blocks
    dr_config({"graph.paths-graph-share": 1.01 * whole / thread_memory()})
    assert not by_blocks(g) and by_blocks(g, True)
    dr_config({"graph.paths-graph-share": 0.99 * whole / thread_memory()})
    assert by_blocks(g) and not by_blocks(g, False)
