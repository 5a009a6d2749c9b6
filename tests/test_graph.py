"""Graph machinery: kNN, graphs, connectivity repair, shortest paths, landmarks."""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import scipy.sparse as sp
import sklearn.neighbors as skn
import zarr
from conftest import noisy_curve
from scipy.sparse.csgraph import dijkstra, shortest_path
from sklearn.datasets import make_swiss_roll

from dr_dask.graph import (
    DisconnectedGraphWarning,
    DuplicatePointsWarning,
    GeodesicRows,
    connect_components,
    geodesics_via_neighbors,
    graph_from_neighbors,
    kneighbors,
    kneighbors_graph,
    landmark_mds,
    select_landmarks,
    shortest_paths,
    triangulate,
)
from dr_dask.graph.knn import NeighbourIndex, kneighbors_local
from dr_dask.graph.landmarks import principal_axes
from dr_dask.graph.paths import all_pairs, geodesic_tiles
from dr_dask.graph.sssp import dijkstra_rows
from dr_dask.graph.stored import StoredGraph
from dr_dask.linalg.align import procrustes_disparity
from dr_dask.linalg.tiles import TileGrid, ZarrTile, strip_grid
from dr_dask.runtime.cluster import thread_memory


@pytest.fixture(scope="module")
def roll():
    X, _ = make_swiss_roll(1500, random_state=0)
    return X


def _two_blobs(n=60, gap=20.0, seed=0):
    rng = np.random.RandomState(seed)
    A = rng.normal(size=(n, 3))
    B = rng.normal(size=(n // 2, 3)) + gap
    return np.vstack([A, B])


def test_kneighbors_matches_sklearn(roll, dr_config):
    ref_d, ref_i = skn.NearestNeighbors(n_neighbors=7).fit(roll).kneighbors()
    d, i = kneighbors(roll, 7, block_size=400)  # 4 blocks: merging across blocks matters
    np.testing.assert_array_equal(i, ref_i)
    np.testing.assert_allclose(d, ref_d, rtol=0, atol=1e-12)
    # dask input, explicit query; then X in data blocks of at most query-block-rows
    Q = roll[:123] + 0.01
    ref_d, ref_i = skn.NearestNeighbors(n_neighbors=5).fit(roll).kneighbors(Q)
    d, i = kneighbors(da.from_array(roll, chunks=(500, 3)), 5, query=Q)
    np.testing.assert_array_equal(i, ref_i)
    np.testing.assert_allclose(d, ref_d, atol=1e-12)
    dr_config({"knn.query-block-rows": 90})
    d, i = kneighbors(roll, 5, query=Q)
    np.testing.assert_array_equal(i, ref_i)
    np.testing.assert_allclose(d, ref_d, atol=1e-12)


def test_kneighbors_high_dimensional_brute_force():
    X = np.random.RandomState(1).normal(size=(700, 60))  # above KD_TREE_MAX_DIM: GEMM + select
    ref_d, ref_i = skn.NearestNeighbors(n_neighbors=4, algorithm="kd_tree").fit(X).kneighbors()
    d, i = kneighbors(X, 4, block_size=200)
    np.testing.assert_array_equal(i, ref_i)
    np.testing.assert_allclose(d, ref_d, atol=1e-12)
    # new points, a data block smaller than k, and an exact duplicate (distance 0, smaller
    # index first among equal distances)
    X[5] = X[600]
    Q = np.vstack([X[600], X[:300] + 0.05])
    ref_d, ref_i = skn.NearestNeighbors(n_neighbors=6, algorithm="kd_tree").fit(X).kneighbors(Q)
    d, i = kneighbors(X, 6, query=Q, block_size=350)
    np.testing.assert_array_equal(i[1:], ref_i[1:])
    np.testing.assert_array_equal(i[0, :2], [5, 600])
    np.testing.assert_allclose(d, ref_d, atol=1e-12)
    d, i = kneighbors_local(X[:4], 6, Q[:3])  # k above the data size: all 4 rows
    assert i.shape == (3, 4) and np.all(np.sort(i, axis=1) == np.arange(4))
    X[417, 3] = np.nan
    with pytest.raises(ValueError, match=r"NaN or infinite values in rows \[417\]"):
        kneighbors(X, 4, block_size=200)


def test_float32_search_is_exact_on_near_ties():
    """The float32 GEMM of new points' search falls back to float64 where rounding could
    reorder neighbours: here 60 points on a shell whose radii differ by 1e-9 (far below float32
    resolution), 1000 away from the origin; the answer is the float64 ordering."""
    rng = np.random.RandomState(3)
    u = rng.normal(size=(60, 40))
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    rank = rng.permutation(60)
    X = 1000.0 + u * (1.0 + 1e-9 * rank)[:, None]
    X = np.vstack([X, 1000.0 + rng.normal(size=(200, 40))])  # ordinary rows around them
    Q = np.vstack([np.full((1, 40), 1000.0), X[60:90] + 0.01])
    index = NeighbourIndex(X)
    d, i = index.kneighbors(Q, 5)
    np.testing.assert_array_equal(i[0], np.argsort(rank)[:5])
    ref_d, ref_i = skn.NearestNeighbors(n_neighbors=5, algorithm="kd_tree").fit(X).kneighbors(Q)
    np.testing.assert_array_equal(i[1:], ref_i[1:])
    np.testing.assert_allclose(d, ref_d, rtol=1e-12)
    # the same index answers repeated queries; the rows are not modified
    X0 = X.copy()
    np.testing.assert_array_equal(index.kneighbors(Q[1:], 5)[1], i[1:])
    np.testing.assert_array_equal(X, X0)


def test_kneighbors_bad_input(roll):
    with pytest.raises(ValueError, match=r"n_neighbors=1500 must be in \[1, 1499\]"):
        kneighbors(roll, 1500)
    bad = roll.copy()
    bad[[3, 700]] = np.nan
    with pytest.raises(ValueError, match=r"rows \[3\]|rows \[700\]|rows \[3, 700\]"):
        kneighbors(bad, 3, block_size=800)
    with pytest.raises(ValueError, match="query has 2 features"):
        kneighbors(roll, 3, query=np.zeros((2, 2)))


def test_kneighbors_graph_matches_sklearn(roll):
    G = kneighbors_graph(roll, 6, block_size=500)
    ref = skn.kneighbors_graph(roll, 6, mode="distance")
    ref = ref.maximum(ref.T)
    assert abs(G - ref).max() < 1e-12 and G.nnz == ref.nnz
    assert abs(G - G.T).max() == 0
    Ge = kneighbors_graph(roll, None, radius=1.2, block_size=500)
    ref = skn.radius_neighbors_graph(roll, 1.2, mode="distance")
    assert Ge.nnz == ref.nnz and abs(Ge - ref).max() < 1e-12


def test_graph_from_neighbors_generic_weights():
    idx = np.array([[1, 2], [0, -1], [1, 3]])
    w = np.array([[0.5, 0.0], [0.7, np.inf], [3.0, 1.0]])
    G = graph_from_neighbors(idx, w, 5).toarray()
    assert G[0, 1] == G[1, 0] == 0.7  # listed as 0.5 and 0.7: the larger wins
    assert G[1, 2] == G[2, 1] == 3.0
    assert 0 < G[0, 2] < 1e-300 and G[2, 0] == G[0, 2]  # zero weight kept as an edge
    assert G[2, 3] == G[3, 2] == 1.0
    assert np.count_nonzero(G[1]) == 2 and G[4].sum() == 0  # padding ignored
    # one edge listed four times, both ways: merged by the maximum, never summed
    G2 = graph_from_neighbors(np.array([[1, 1], [0, 0]]), np.array([[2.0, 3.0], [1.0, 0.5]]), 2)
    assert G2.has_canonical_format and G2.nnz == 2 and G2[0, 1] == G2[1, 0] == 3.0
    with pytest.raises(ValueError, match="non-negative"):
        graph_from_neighbors(idx, -w, 4)


def test_shortest_paths_matches_scipy(roll, tmp_path):
    G = kneighbors_graph(roll, 8)
    ref = shortest_path(G, directed=False)
    np.testing.assert_allclose(shortest_paths(G, block_size=300), ref, rtol=1e-13)
    src = np.array([5, 17, 1400, 3])
    out = shortest_paths(G, src, block_size=2, out=str(tmp_path / "g.zarr"), dtype=np.float32)
    assert isinstance(out, zarr.Array) and out.shape == (4, 1500)
    np.testing.assert_allclose(zarr.open_array(str(tmp_path / "g.zarr"))[:], ref[src],
                               rtol=1e-6)
    # the columns the tasks keep as they write the rows are the stored ones, as read back
    cols = np.array([3, 1400, 17, 999])
    rows = GeodesicRows.compute(G, src, block_size=2, out=str(tmp_path / "k.zarr"),
                                dtype=np.float32, columns=cols)
    assert rows._kept is not None
    np.testing.assert_array_equal(rows.columns(cols), rows.gather()[:, cols])
    np.testing.assert_array_equal(rows.columns(cols[:2]), rows.gather()[:, cols[:2]])


def _half_exp(P: np.ndarray, scale: float) -> np.ndarray:
    return np.exp(-P / scale)


def _tile_sums(tile: np.ndarray) -> tuple:
    return tile.sum(axis=1, dtype=np.float64), tile.sum(axis=0, dtype=np.float64)


def _assert_tiles_of(D, stats, ref: np.ndarray, grid, rtol: float) -> None:
    """The upper tiles (and their stats) are those of ``ref``, a symmetric matrix, and the
    tiled products equal the dense ones."""
    for (i, j), (rsum, csum) in zip(grid.upper(), stats):
        tile = D.tiles[(i, j)]
        tile = (tile.load() if isinstance(tile, ZarrTile)
                else np.asarray(D.client.gather(tile) if D.client else tile))
        want = ref[grid.block(i), grid.block(j)]
        np.testing.assert_allclose(tile, want, rtol=rtol, atol=0)
        np.testing.assert_allclose(rsum, want.sum(axis=1), rtol=rtol)
        np.testing.assert_allclose(csum, want.sum(axis=0), rtol=rtol)
    V = np.random.default_rng(0).standard_normal((grid.size, 3))
    want = ref @ V
    tol = 1e-6 if rtol > 1e-12 else 1e-12
    np.testing.assert_allclose(D.matmat(V), want, rtol=0, atol=tol * np.abs(want).max())


@pytest.mark.parametrize("grid_of", [lambda T: TileGrid.regular(T, 200),
                                     lambda T: strip_grid(T)])
def test_geodesic_tiles_are_the_transformed_path_matrix(roll, grid_of):
    G = kneighbors_graph(roll, 8)
    P = shortest_path(G, directed=False)
    P = (P + P.T) / 2  # the tiles' diagonal blocks are symmetrised; elsewhere P is symmetric
    grid = grid_of(roll.shape[0])
    ref = np.exp(-(P * P) / 5000.0)  # no float32 underflow
    np.fill_diagonal(ref, 0.0)  # the tiles' diagonal is zero whatever the transform
    D, stats = geodesic_tiles(G, grid, _half_exp, fn_args=(5000.0,), stats_fn=_tile_sums,
                              square=True)
    _assert_tiles_of(D, stats, ref, grid, rtol=1e-12)
    # float32 storage, float64 products: the products of the rounded matrix
    D32, stats32 = geodesic_tiles(G, grid, _half_exp, fn_args=(5000.0,), stats_fn=_tile_sums,
                                  square=True, dtype=np.float32, precision=np.float64)
    assert D32.tiles[(0, 0)].dtype == np.float32
    _assert_tiles_of(D32, stats32, ref, grid, rtol=1e-6)


def test_geodesic_tiles_into_a_store_resume_strip_by_strip(roll, tmp_path):
    G = kneighbors_graph(roll, 8)
    P = shortest_path(G, directed=False)
    ref = np.exp(-(P * P) / 5000.0)
    np.fill_diagonal(ref, 0.0)
    grid = TileGrid.regular(roll.shape[0], 200)
    store = tmp_path / "D"
    D, stats = geodesic_tiles(G, grid, _half_exp, fn_args=(5000.0,), stats_fn=_tile_sums,
                              square=True, store=str(store))
    assert isinstance(D.tiles[(0, 1)], ZarrTile)
    _assert_tiles_of(D, stats, ref, grid, rtol=1e-12)
    # a crash in strip 1: tile (1, 2) never written nor marked; the rerun redoes that strip
    (store / "done" / "1_2.npz").unlink()
    zarr.open_array(str(store), mode="r+")[200:400, 400:600] = 0.0
    rows_done = []

    def counting_exp(P, scale):
        rows_done.append(P.shape[0])
        return _half_exp(P, scale)

    D, stats = geodesic_tiles(G, grid, counting_exp, fn_args=(5000.0,), stats_fn=_tile_sums,
                              square=True, store=str(store))
    assert sum(rows_done) == 200  # strip 1 alone
    _assert_tiles_of(D, stats, ref, grid, rtol=1e-12)


def test_geodesic_tiles_refuse_a_disconnected_graph(tmp_path):
    G = kneighbors_graph(_two_blobs(), 3)
    with pytest.raises(ValueError, match="disconnected"):
        geodesic_tiles(G, TileGrid.regular(90, 40), _half_exp, fn_args=(1.0,),
                       stats_fn=_tile_sums)
    with pytest.raises(ValueError, match="disconnected"):  # into a store: no tile marked done
        geodesic_tiles(G, TileGrid.regular(90, 40), _half_exp, fn_args=(1.0,),
                       stats_fn=_tile_sums, store=str(tmp_path / "D"))
    assert not (tmp_path / "D" / "done").exists()


def _random_graph(rng, T, p, zero_frac=0.0, symmetric=True):
    """Random sparse weights with explicit zero-length edges and, optionally, one direction only."""
    A = sp.random(T, T, density=p, random_state=rng, format="coo")
    w = A.data * 3
    w[rng.uniform(size=w.size) < zero_frac] = 0.0
    keep = A.row != A.col
    r, c, w = A.row[keep], A.col[keep], w[keep]
    if symmetric:
        r, c, w = np.concatenate([r, c]), np.concatenate([c, r]), np.concatenate([w, w])
    G = sp.csr_matrix((w, (r, c)), shape=(T, T))  # duplicates summed, as any caller's would be
    G.data[G.data == 0] = 0.0  # explicit zeros stay stored entries
    return G


@pytest.mark.parametrize("seed", range(6))
def test_dijkstra_rows_equals_scipy_on_random_graphs(seed):
    """The compiled kernel gives scipy's undirected distances exactly: symmetric and one-way
    inputs, explicit zero-length edges, duplicate points, float32 output, squared output."""
    rng = np.random.RandomState(seed)
    T = int(rng.randint(2, 120))
    G = _random_graph(rng, T, min(1.0, 6.0 / T), zero_frac=0.2, symmetric=seed % 2 == 0)
    G = G + sp.diags(np.arange(T - 1) * 0 + 1.0, 1, shape=(T, T))  # a path: connected
    G = G.tocsr()
    ref = dijkstra(G, directed=False)
    src = rng.permutation(T)[: max(1, T // 2)]
    np.testing.assert_array_equal(dijkstra_rows(G, src), ref[src])
    np.testing.assert_array_equal(dijkstra_rows(G, src, square=True, dtype=np.float32),
                                  (ref[src] ** 2).astype(np.float32))


def test_dijkstra_rows_past_one_gathered_block_of_nodes():
    """Rows are assembled from the lanes a block of nodes at a time: over several blocks and
    a ragged last one, in the graph's relabelled order, plain and squared, they are scipy's."""
    from dr_dask.graph.sssp import GATHER_NODES

    rng = np.random.RandomState(3)
    T = 2 * GATHER_NODES + 123
    G = (_random_graph(rng, T, 3.0 / T, zero_frac=0.0, symmetric=True)
         + sp.diags(rng.uniform(0.5, 1.5, T - 1), 1, shape=(T, T))).tocsr()
    src = rng.choice(T, 5, replace=False)
    ref = dijkstra(G, directed=False, indices=src)
    np.testing.assert_array_equal(dijkstra_rows(G, src), ref)
    np.testing.assert_array_equal(dijkstra_rows(G, src, square=True, dtype=np.float32),
                                  (ref**2).astype(np.float32))


def test_sweeps_equal_the_heap_and_give_way_to_it(roll, monkeypatch, tmp_path):
    """Sources past the first run as Bellman-Ford sweeps, 64 at a time: bit for bit the
    heap's distances, in float64 and in float32 (a stored graph's float32 weights with float32
    rows). Sweeps that outrun their budget hand this graph to the heap for good, the result
    unchanged."""
    from dr_dask.graph import sssp

    G = kneighbors_graph(roll, 8)
    ref = dijkstra(G, directed=False)
    src = np.arange(0, 1500, 15)  # 100: one heap search, then sweeps of 49 and 50 lanes
    # padded to whole cache lines (float64: 56 lanes, float32: 64), each node's from a line's
    # start; the padding lanes repeat a source and are never reported
    for dtype, width in ((np.float64, 56), (np.float32, 64)):
        lanes = sssp._lanes(len(roll), 50, dtype, whole_lines=True)
        assert lanes.shape == (len(roll), width) and lanes.ctypes.data % 64 == 0
    search = sssp.SearchGraph.of(sssp.as_csr(G))
    monkeypatch.setattr(sssp, "SWEEP_BUDGET", np.inf)  # the sweeps run whatever they cost
    # each batch comes whole (padding included, C-contiguous), its width beside it: a view of
    # its first lanes was copied whole by np.take at every gather of the rows
    batches = [(a, m, lanes.shape, lanes.flags.c_contiguous)
               for a, m, lanes in sssp.lane_batches(search, src, np.float64)]
    assert batches == [(0, 50, (len(roll), 56), True), (50, 50, (len(roll), 56), True)]
    np.testing.assert_array_equal(sssp.search_rows(search, src, False, np.float64), ref[src])
    g32 = sssp.SearchGraph(search.indptr, search.indices, search.weights.astype(np.float32),
                           search.rank)
    lanes = np.empty((len(roll), len(src)), np.float32)
    assert sssp._heap_lanes(g32.indptr, g32.indices, g32.weights, g32.rank[src],
                             lanes, 0) == (-1, 0)
    heap32 = lanes[g32.rank].T
    np.testing.assert_array_equal(sssp.search_rows(g32, src, False, np.float32), heap32)
    np.testing.assert_allclose(heap32, ref[src], rtol=1e-5)  # summed in float32
    assert not search.hint and not g32.hint
    # into a store, a column chunk at a time from the lanes: tasks of 40, chunks of 40 x 128
    store = zarr.create_array(store=str(tmp_path / "rows.zarr"), shape=(len(src), len(roll)),
                              chunks=(40, 128), dtype=np.float32, fill_value=np.nan)
    GeodesicRows.compute(G, src, block_size=40, dtype=np.float32, out=store)
    np.testing.assert_allclose(store[...], ref[src], rtol=1e-6)
    monkeypatch.setattr(sssp, "SWEEP_BUDGET", 0.0)  # the first pair of passes is over budget
    np.testing.assert_array_equal(sssp.search_rows(search, src, True, np.float64), ref[src] ** 2)
    assert search.hint == {"heap": True}
    # the heap that takes over writes into the whole batch, as the first source's does: one
    # kernel per dtype, whichever way the sweeps' race against the clock went (a column slice
    # would be typed by its contiguity, and compile again on a machine where they lost)
    assert all(sig[4].layout == "C" for sig in sssp._heap_lanes.signatures)
    assert dijkstra_rows(G, np.array([], dtype=int)).shape == (0, len(roll))


def test_dijkstra_rows_on_a_complete_graph():
    """Dense random weights: distances drop many times per node, so the heap outgrows its
    first T entries and doubles twice (a search from node 0 holds 575 entries at once; kNN
    graphs never get there)."""
    rng = np.random.RandomState(3)
    W = rng.uniform(size=(150, 150))
    G = sp.csr_matrix(np.triu(W, 1) + np.triu(W, 1).T)
    src = np.arange(0, 150, 7)
    np.testing.assert_array_equal(dijkstra_rows(G, src), dijkstra(G, directed=False)[src])


def test_dijkstra_rows_duplicate_points_and_disconnected():
    X = np.random.RandomState(1).normal(size=(80, 4))
    X[7] = X[30] = X[31]  # coincident points: zero-length edges
    with pytest.warns(DuplicatePointsWarning):
        G = kneighbors_graph(X, 4)
    np.testing.assert_array_equal(dijkstra_rows(G, np.arange(80)), dijkstra(G, directed=False))
    rng = np.random.RandomState(2)
    D = _random_graph(rng, 40, 0.0)  # no edges at all
    with pytest.raises(ValueError, match="source node 3 cannot reach 39 of 40 nodes"):
        dijkstra_rows(D, [3])
    H = sp.block_diag([G, kneighbors_graph(X[:10], 3)]).tocsr()
    ref = dijkstra(H, directed=False, indices=[0, 85])
    with pytest.raises(ValueError, match="cannot reach 10 of 90"):
        dijkstra_rows(H, [0, 85])
    assert np.isinf(ref).any()  # scipy's silent infinities, which the kernel refuses
    with pytest.raises(ValueError, match="negative or NaN"):
        dijkstra_rows(-G, [0])
    with pytest.raises(ValueError, match=r"node indices in \[0, 80\)"):
        dijkstra_rows(G, [80])


def test_shortest_paths_refuses_disconnected_graph():
    X = _two_blobs()
    G = kneighbors_graph(X, 4)
    with pytest.raises(ValueError, match=r"disconnected.*cannot reach"):
        shortest_paths(G, [0, 1])


def test_connect_components_bridge_and_raise():
    X = _two_blobs()
    G = kneighbors_graph(X, 4)
    with pytest.raises(ValueError, match=r"2 connected components of sizes \[60, 30\]"):
        connect_components(G, X, on_disconnected="raise")
    with pytest.raises(ValueError, match="without the points X"):
        connect_components(G, on_disconnected="bridge")
    with pytest.warns(DisconnectedGraphWarning, match=r"2 connected components.*\[60, 30\]"):
        H = connect_components(G, X)
    extra = (H - G).tocoo()
    assert extra.nnz == 2  # one bridge, both directions
    i, j = extra.row[0], extra.col[0]
    # the bridge is the closest pair between the blobs
    cross = np.linalg.norm(X[:60, None] - X[None, 60:], axis=2)
    assert extra.data[0] == pytest.approx(cross.min())
    assert {i < 60, j < 60} == {True, False}
    assert np.isfinite(shortest_paths(H, [0])).all()
    assert connect_components(G, on_disconnected="ignore") is not None


def test_connect_components_many_components():
    rng = np.random.RandomState(3)
    X = np.vstack([rng.normal(size=(10, 2)) * 0.1 + 5 * c for c in range(7)])
    G = kneighbors_graph(X, 3)
    with pytest.warns(DisconnectedGraphWarning, match="7 connected components"):
        H = connect_components(G, X, bridge_weight=lambda d: 2 * d)
    from scipy.sparse.csgraph import connected_components

    assert connected_components(H, directed=False)[0] == 1
    assert (H - G).nnz == 2 * 6  # a spanning tree over 7 components


def test_duplicate_points_warn_and_keep_zero_length_edges():
    X = np.random.RandomState(0).normal(size=(50, 3))
    X[10] = X[20]
    with pytest.warns(DuplicatePointsWarning, match="rows 10 and 20|rows 20 and 10"):
        G = kneighbors_graph(X, 3)
    D = shortest_paths(G, [10])
    assert D[0, 20] == pytest.approx(0.0, abs=1e-300)


def test_geodesics_via_neighbors_equals_loop():
    rng = np.random.RandomState(0)
    rows = rng.uniform(size=(6, 9))
    dist = rng.uniform(size=(4, 3))
    idx = rng.randint(0, 6, size=(4, 3))
    dist[1, 2], idx[1, 2] = np.inf, -1  # padding
    g = geodesics_via_neighbors(dist, idx, rows)
    for q in range(4):
        ref = np.min([dist[q, j] + rows[idx[q, j]] for j in range(3) if idx[q, j] >= 0], axis=0)
        np.testing.assert_allclose(g[q], ref)


def test_select_landmarks(roll):
    a = select_landmarks(roll, 50, method="random", random_state=1)
    assert len(np.unique(a)) == 50
    np.testing.assert_array_equal(a, select_landmarks(roll, 50, random_state=1))
    m = select_landmarks(roll, 30, method="maxmin", random_state=0)
    assert len(np.unique(m)) == 30
    # max-min: each new landmark is the farthest point from those before it
    d = np.linalg.norm(roll[:, None] - roll[m[:10]][None], axis=2).min(axis=1)
    assert d[m[10]] == pytest.approx(d.max())
    G = kneighbors_graph(roll, 8)
    mg = select_landmarks(G, 5, method="maxmin", random_state=0)
    assert len(np.unique(mg)) == 5
    dup = np.zeros((5, 2))
    assert len(np.unique(select_landmarks(dup, 5, method="maxmin"))) == 5
    with pytest.raises(ValueError, match=r"n_landmarks=1501 must be in \[1, 1500\]"):
        select_landmarks(roll, 1501)


def test_landmark_mds_and_triangulation_recover_euclidean_points(monkeypatch):
    from dr_dask.graph import landmarks

    rng = np.random.RandomState(0)
    P = rng.normal(size=(200, 3))
    L = P[:20]
    D2 = ((L[:, None] - L[None]) ** 2).sum(-1)
    coords, pinv, sq_mean, _lam, _res, _passes = landmark_mds(D2, 3)
    assert procrustes_disparity(L, coords) < 1e-20
    D2_LX = ((L[:, None] - P[None]) ** 2).sum(-1)
    X = triangulate(pinv, D2_LX, sq_mean)
    assert X.shape == (200, 3)
    assert procrustes_disparity(P, X) < 1e-20  # exact for Euclidean distances
    # linear in landmark rows: blockwise sums equal the whole
    parts = triangulate(pinv[:, :7], D2_LX[:7], sq_mean[:7]) + triangulate(
        pinv[:, 7:], D2_LX[7:], sq_mean[7:])
    np.testing.assert_allclose(parts, X, atol=1e-10)
    # and points a slice at a time (64 here) equal the whole
    monkeypatch.setattr(landmarks, "TRIANGULATE_COLUMNS", 64)
    D_LX = np.sqrt(D2_LX)
    np.testing.assert_array_equal(
        landmarks.triangulate_block(pinv, D_LX, sq_mean, lambda D: D.astype(np.float64) ** 2),
        triangulate(pinv, D_LX ** 2, sq_mean))
    with pytest.raises(ValueError, match="n_components=20 must be in"):
        landmark_mds(D2, 20)


def test_principal_axes_of_all_points_not_of_the_landmarks():
    """Landmarks at the data's extremes along its third axis: landmark MDS's own top two axes
    follow them, the principal axes of every triangulated point are the data's."""
    rng = np.random.RandomState(0)
    P = rng.normal(size=(2000, 3)) * [3.0, 2.0, 1.0]
    L = P[np.argsort(-np.abs(P[:, 2]))[:30]]  # |z| largest: spread mostly along z
    D2 = ((L[:, None] - L[None]) ** 2).sum(-1)
    D2_LX = ((L[:, None] - P[None]) ** 2).sum(-1)
    Pc = P - P.mean(axis=0)
    pca = Pc @ np.linalg.svd(Pc, full_matrices=False)[2][:2].T
    own = landmark_mds(D2, 2)
    assert procrustes_disparity(pca, triangulate(own.pinv, D2_LX, own.sq_mean)) > 0.1
    # three spare dimensions asked, the one with variance kept (rank 3: no zero dimension)
    mds = landmark_mds(D2, 2, n_spare=3)
    assert mds.pinv.shape == (3, 30) and mds.eigenvalues.shape == (3,)
    Y = triangulate(mds.pinv, D2_LX, mds.sq_mean)
    R = principal_axes(Y, 2)
    np.testing.assert_allclose(R.T @ R, np.eye(2), atol=1e-12)
    assert procrustes_disparity(pca, Y @ R) < 1e-20
    # the map stays one linear triangulation: new points land on the same axes
    np.testing.assert_allclose(triangulate(R.T @ mds.pinv, D2_LX, mds.sq_mean), Y @ R,
                               atol=1e-9)


@pytest.mark.cluster
def test_a_tasks_memory_comes_from_the_workers_whatever_the_clients_cache(cluster_client,
                                                                          monkeypatch):
    """The client's periodic refresh can leave it holding distributed's cluster-wide summary,
    which lists no worker; what a task may hold still comes from the workers' limits (under
    load a path task was once sized to the container's memory instead)."""
    monkeypatch.setattr(cluster_client, "scheduler_info", lambda *a, **k: {"workers": {}})
    assert thread_memory(cluster_client) == 4 * 10**9


@pytest.mark.cluster
def test_graph_on_cluster_equals_threaded(roll, cluster_client, tmp_path, monkeypatch):
    from dr_dask.graph import paths

    d0, i0 = kneighbors(roll, 6, block_size=500)
    d1, i1 = kneighbors(roll, 6, block_size=500, client=cluster_client)
    np.testing.assert_array_equal(i0, i1)
    np.testing.assert_array_equal(d0, d1)
    G = kneighbors_graph(roll, 6, client=cluster_client)
    assert abs(G - kneighbors_graph(roll, 6)).max() == 0
    src = np.arange(0, 1500, 7)
    np.testing.assert_array_equal(shortest_paths(G, src, client=cluster_client, block_size=50),
                                  shortest_paths(G, src))
    # all pairs: each task sends its block's columns from the block on, mirrored here into
    # the later rows; scipy's matrix, and each entry from one of its two sources' searches
    D = shortest_paths(G, client=cluster_client, block_size=128)
    np.testing.assert_allclose(D, shortest_path(G, directed=False), rtol=1e-13)
    own = shortest_paths(G)  # in this process: every row from its own search
    D2, bounds = all_pairs(G, client=cluster_client, square=True, block_size=128)
    assert bounds[:3] == [0, 128, 256] and bounds[-1] == 1500
    sizes = np.diff(bounds)
    col = np.arange(1500)[None, :]
    upper = col >= np.repeat(bounds[:-1], sizes)[:, None]  # the block's own columns
    later = col >= np.repeat(bounds[1:], sizes)[:, None]  # the later blocks' columns
    np.testing.assert_array_equal(D[upper], own[upper])
    np.testing.assert_array_equal(D.T[later], own[later])
    np.testing.assert_array_equal(D2, D * D)
    with pytest.raises(ValueError, match=r"disconnected.*cannot reach"):
        all_pairs(kneighbors_graph(_two_blobs(), 4), client=cluster_client)
    assert sp.issparse(G)
    # the graph opened by the tasks from a store (memory-mapped here) gives the same rows
    store = tmp_path / "graph"
    rows = GeodesicRows.compute(G, src, client=cluster_client, block_size=50,
                                graph_store=str(store))
    np.testing.assert_array_equal(rows.gather(), shortest_paths(G, src))
    opened = StoredGraph.at(str(store)).open()
    assert all(isinstance(getattr(opened, a), np.memmap) for a in ("indices", "weights"))
    # rows written to a store by the workers, with the columns their tasks keep
    kept = GeodesicRows.compute(G, src, client=cluster_client, block_size=50, dtype=np.float32,
                                out=str(tmp_path / "rows"), columns=src[::3])
    np.testing.assert_array_equal(kept.columns(src[::3]),
                                  shortest_paths(G, src)[:, src[::3]].astype(np.float32))
    # where the 512 MB task budget holds too few sources for the sweeps (T=10^7: 6), a task
    # takes as many as a quarter of its worker thread's memory holds, up to a batch of lanes
    assert thread_memory(cluster_client) == 4 * 10**9
    per_source = 2 * 8 * 1500
    monkeypatch.setattr(paths, "_TASK_BYTES", 6 * per_source)
    rows = GeodesicRows.compute(G, src, client=cluster_client, block_size=200)
    assert np.diff(rows.bounds)[0] == paths.LANES
    np.testing.assert_array_equal(rows.gather(), shortest_paths(G, src))
    assert paths._sources_per_task(1500, 16, None, one_batch=False) == paths.LANES
    # T=10^7, float32 rows in memory and float32 lanes: 1 GB of 80 MB a source; rows written
    # to a store are not held: 40 MB a source
    assert paths._sources_per_task(10**7, 8, cluster_client, one_batch=False) == 12
    assert paths._sources_per_task(10**7, 4, cluster_client, one_batch=True) == 25
    # the tiles on the workers (views of each strip, recomputable futures) equal the threaded
    grid = strip_grid(1500, cluster_client)
    assert grid.n_blocks == 4  # two equal strips per worker
    D1, s1 = geodesic_tiles(G, grid, _half_exp, fn_args=(5000.0,), stats_fn=_tile_sums,
                            square=True, client=cluster_client)
    D0, s0 = geodesic_tiles(G, grid, _half_exp, fn_args=(5000.0,), stats_fn=_tile_sums,
                            square=True)
    for ij, a, b in zip(grid.upper(), s0, s1):
        np.testing.assert_array_equal(cluster_client.gather(D1.tiles[ij]), D0.tiles[ij])
        np.testing.assert_array_equal(a[0], b[0])
    V = np.random.default_rng(1).standard_normal((1500, 4))
    np.testing.assert_allclose(D1.matmat(V), D0.matmat(V), rtol=1e-12)


@pytest.fixture
def small_cells(dr_config):
    # many small cells, so that the pruning and the cross-cell merging are exercised at small T
    import dr_dask.graph._knn_cells as cells

    dr_config({"knn.cells-leaf-size": 64, "knn.cells-per-task": 5})
    return cells


def test_cell_search_equals_exact_knn(small_cells):
    X = noisy_curve(3000, 40)
    d0, i0 = kneighbors(X, 7, algorithm="exact")
    d, i = kneighbors(X, 7, algorithm="cells")
    assert np.mean(i == i0) >= 0.999  # float32 ties aside, the same neighbours
    np.testing.assert_allclose(d, d0, rtol=1e-5)
    assert np.all(i != np.arange(3000)[:, None])
    # far from the origin (float32 cancellation unless the rows are centred); dask input
    Xo = da.from_array(X + 1e4, chunks=(700, 40))
    d, i = kneighbors(Xo, 7, algorithm="cells")
    assert np.mean(i == i0) >= 0.999
    np.testing.assert_allclose(d, d0, rtol=1e-4)


@pytest.mark.cluster
def test_cell_search_on_cluster_equals_threaded(small_cells, cluster_client):
    X = noisy_curve(2000, 30, seed=2)
    d0, i0 = kneighbors(X, 5, algorithm="cells")
    d1, i1 = kneighbors(X, 5, algorithm="cells", client=cluster_client)
    np.testing.assert_array_equal(i0, i1)
    np.testing.assert_array_equal(d0, d1)
    # dask input: the workers centre and sort the rows (uneven row blocks, split columns)
    Xd = da.from_array(X, chunks=((700, 900, 400), (10, 20))).persist()
    d2, i2 = kneighbors(Xd, 5, algorithm="cells", client=cluster_client)
    np.testing.assert_array_equal(i0, i2)
    np.testing.assert_allclose(d0, d2, rtol=1e-6)


def test_cell_search_bad_input():
    X = noisy_curve(500, 20)
    X[[33, 401], 2] = np.inf
    with pytest.raises(ValueError, match=r"NaN or infinite values in rows \[33, 401\]"):
        kneighbors(X, 3, algorithm="cells")
    with pytest.raises(ValueError, match=r"NaN or infinite values in rows \[(33|401)\]"):
        kneighbors(da.from_array(X, chunks=(100, 20)), 3, algorithm="cells")  # one block's
    with pytest.raises(ValueError, match="algorithm must be one of"):
        kneighbors(X, 3, algorithm="annoy")
    with pytest.raises(ValueError, match="give no query"):
        kneighbors(X, 3, query=X[:5], algorithm="cells")


def test_select_landmarks_maxmin_on_a_subset():
    from dr_dask.graph import landmarks as lm

    X = noisy_curve(30_000, 10)
    L = 100
    m = select_landmarks(X, L, method="maxmin", random_state=3)
    assert len(np.unique(m)) == L
    # the same rows from a dask array (only the sampled rows are read)
    np.testing.assert_array_equal(
        m, select_landmarks(da.from_array(X, chunks=(4000, 10)), L, method="maxmin",
                            random_state=3))
    # coverage of ALL points close to a full farthest-point pass over all rows
    full = lm._maxmin(X, L, np.random.RandomState(3), is_graph=False)

    def radius(idx):
        d = np.min(np.linalg.norm(X[:, None] - X[idx][None], axis=2), axis=1)
        return np.quantile(d, [0.5, 0.99])

    sub, ref = radius(m), radius(full)
    assert sub[0] <= 1.3 * ref[0] and sub[1] <= 1.3 * ref[1]
