"""On a real multi-process cluster, the graph stages and the paths by blocks ship no arrays
through the scheduler (task specs stay small, large inputs go once) and read from the store
about the bytes they use."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import zarr
from conftest import noisy_curve

from dr_dask.bench.traffic import SpecBytes, count_reads, spec_bytes
from dr_dask.graph.partitioned import partitioned_graph
from dr_dask.graph.paths import GeodesicRows
from dr_dask.io.storage import location


@pytest.mark.cluster
def test_specs_small_and_reads_sized_to_their_use(cluster_client, dr_config, tmp_path):
    T, N, k = 2000, 20, 8
    # several blocks, groups, lists and chunks at small T (the stored graph's chunks small
    # beside the path blocks, as at scale); few of each, since every task costs the scheduler
    # a round trip and the property is per task
    dr_config({"knn.ivf-task-rows": 300, "knn.ivf-chunk-rows": 64, "knn.ivf-block-rows": 512,
               "graph.block-edges": 8000, "graph.stored-chunk": 256, "graph.edge-chunk": 256,
               "graph.paths-block-nodes": 512, "graph.paths-graph-share": 0})
    X = noisy_curve(T, N, seed=7).astype(np.float32)
    zarr.open_group(str(tmp_path / "in.zarr"), mode="w").create_array("X", data=X,
                                                                       chunks=(400, N))
    Xd = da.from_zarr(str(tmp_path / "in.zarr"), component="X")
    cluster_client.register_plugin(SpecBytes())
    spec_bytes(cluster_client)
    with count_reads(cluster_client) as reads:
        pg = partitioned_graph(Xd, k, location(str(tmp_path / "g")), client=cluster_client,
                               n_lists=30, n_probe=4)
        graph_specs = spec_bytes(cluster_client)
    with count_reads(cluster_client) as path_reads:
        sources = np.arange(0, T, 100)
        rows = GeodesicRows.compute(pg.graph, sources, client=cluster_client, dtype=np.float32)
        paths_specs = spec_bytes(cluster_client)
    assert rows.report["rounds"]  # by blocks
    assert {"assign_block", "gather_groups", "group_edges", "block_rows"} <= set(graph_specs)
    assert {"open_block", "round", "write"} <= set(paths_specs)
    specs = {**graph_specs, **paths_specs}
    # inputs sent once (delayed, traverse=False): the lists' handle; the mean and centroids
    # (assignment), the blocks' label and pointer tables (connectivity)
    shared = {"InvertedLists": 2, "ndarray": 4}
    for prefix, (n, _, largest) in specs.items():
        if prefix in shared:
            assert n <= shared[prefix], (prefix, n)
        else:  # no array inlined: a task's spec is its handles and a few numbers
            assert largest < 6000, (prefix, largest)
    # per task, what does not grow with T (all specs at T=10^6: docs/scaling.md)
    tasks = sum(t[0] for t in specs.values())
    assert sum(t[1] for t in specs.values()) < 1000 * tasks

    # the lists stage reads the staging rows (and their row indices) about once
    used = T * (4 * N + 8)
    assert used <= reads["staging"][1] <= 2 * used, reads["staging"]
    # the paths read every block of the graph about once (and the row indices once)
    g = pg.graph
    graph_bytes = 8 * (g.n_nodes + 1) + 8 * 2 * pg.n_edges + 8 * g.n_nodes
    assert graph_bytes <= path_reads["graph"][1] <= 2 * graph_bytes, path_reads["graph"]
    # the connectivity reads the blocks' pointers and columns once, and each block its own
    # nodes' components and those of the ranges of later blocks its edges reach
    links_bytes = 8 * g.n_nodes + 4 * 2 * pg.n_edges
    assert links_bytes <= reads["graph"][1] <= 2 * links_bytes, reads["graph"]
    assert 8 * T <= reads["roots"][1] <= 2 * 8 * T, reads["roots"]
    # the edges' shuffle reads each staged edge (both ways of every row's k) about once
    assert reads["edges"][1] <= 2 * 12 * 2 * T * k, reads["edges"]


def hold_bytes(n_bytes, seconds):
    import time

    a = np.ones(n_bytes // 8)  # written, so resident
    time.sleep(seconds)
    return float(a[-1])


def return_one():
    return 1.0


@pytest.mark.cluster
def test_task_memory_is_each_tasks_own_rise(cluster_client):
    # what `bench scale` reports as a stage's largest task: a task holding 300 MB is seen at
    # about that, one holding nothing near zero, and a second read starts from nothing
    import dask

    from dr_dask.bench.task_memory import take_task_memory

    take_task_memory(cluster_client)
    hold = dask.delayed(hold_bytes, pure=False)
    small = dask.delayed(return_one, pure=False)
    dask.compute(hold(300 << 20, 0.3), small(), small(), scheduler=cluster_client)
    seen = take_task_memory(cluster_client)
    assert 0.9 * (300 << 20) < seen["hold_bytes"] < 1.3 * (300 << 20), seen
    assert seen["return_one"] < 20 << 20, seen
    assert take_task_memory(cluster_client) == {}
